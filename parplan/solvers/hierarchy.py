"""Top-down recursive planning over the array's hierarchy (SPEC section 5).

The root split is planned with each half priced as one device of summed throughput; each half
then plans its own sub-problem on the layer sizes its share leaves it, down to the devices.
Any one-split planner (DP, exact, baseline rule) plugs in as ``plan_split``. Identical
sub-problems (same sub-array structure, same dims) are planned once.

Example:
    >>> from parplan.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.solvers.dp import PlanOptions, solve_split
    >>> p = Problem(get_model("alexnet"), parse_array("h100:8"), batch=128)
    >>> plan = plan_top_down(p, lambda sp: solve_split(sp, PlanOptions()), "accpar")
    >>> sorted(plan.splits)
    ['', 'L', 'LL', 'LR', 'R', 'RL', 'RR']
"""

from __future__ import annotations

from typing import Callable

from parplan.costmodel.cost import scale_for_sides
from parplan.costmodel.dims import LayerDims
from parplan.costmodel.hardware import ArrayNode
from parplan.costmodel.problem import Plan, Problem, Split
from parplan.solvers.dp import SplitProblem


def signature(group: ArrayNode) -> tuple:
    """Structural key of a sub-array: equal keys mean interchangeable groups."""
    if group.is_leaf:
        return (group.device.name, group.device.flops_per_s)
    return (group.link.bytes_per_s, group.link.latency_s, signature(group.left), signature(group.right))


def child_dims(dims: tuple[LayerDims, ...], split: Split) -> tuple[tuple[LayerDims, ...], tuple[LayerDims, ...]]:
    """The dims left to each side by a split."""
    pairs = [scale_for_sides(d, c, a) for d, c, a in zip(dims, split.choices, split.shares)]
    return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)


def plan_top_down(
    problem: Problem,
    plan_split: Callable[[SplitProblem], Split],
    planner: str,
    progress: Callable[[str], None] | None = None,
) -> Plan:
    """Plan every split of ``problem.array`` top-down with ``plan_split``."""
    splits: dict[str, Split] = {}
    memo: dict[tuple, Split] = {}
    sigs: dict[int, tuple] = {}

    def sig(group: ArrayNode) -> tuple:
        if id(group) not in sigs:
            sigs[id(group)] = signature(group)
        return sigs[id(group)]

    def rec(group: ArrayNode, path: str, dims: tuple[LayerDims, ...]) -> None:
        if group.is_leaf:
            return
        key = (sig(group), dims)
        if key not in memo:
            if progress is not None:
                progress(f"planning split '{path or 'root'}' ({group.count} devices)")
            memo[key] = plan_split(SplitProblem(problem.planning, dims, problem.side_spec(group), path))
        split = memo[key]
        splits[path] = split
        left, right = child_dims(dims, split)
        rec(group.left, path + "L", left)
        rec(group.right, path + "R", right)

    rec(problem.array, "", problem.root_dims())
    return Plan(splits, planner=planner)
