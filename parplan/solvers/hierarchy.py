"""Top-down recursive planning over the array's hierarchy (docs/costmodel.md section 7).

The root split is planned with each half priced as one device of summed throughput; each half
then plans its own sub-problem on the layer sizes its share leaves it, down to the devices.
Any one-split planner (DP, exact, baseline rule) plugs in as ``plan_split``.

A layer's time at a split is the max over its two groups (docs/costmodel.md section 7), so a group gains nothing
by speeding up a layer on which its sibling is slower. Each group is therefore planned against
per-layer *floors* (``SplitProblem.floor_s``): the sibling's time for that layer plus the
sibling's communication, less its own. The group expected to be slower is planned first
(against its sibling's single-device estimate), the other against the first one's actual
times. Interchangeable siblings (same structure, same sizes) share one plan.

Example:
    >>> from parplan.models.zoo import get_model
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

import numpy as np

from parplan.costmodel.cost import (
    OVERLAP_WINDOW,
    covered_below,
    overlap_time,
    terms_matrix,
    compat_rules,
)
from parplan.costmodel.dims import LayerDims
from parplan.costmodel.hardware import ArrayNode, signature
from parplan.costmodel.problem import Plan, Problem, Split
from parplan.costmodel.regions import translates
from parplan.costmodel.split import SplitProblem, child_dims, split_terms


def _child_floor(floor, comm, weight):
    """The time a half's node may take without its side's time exceeding ``floor``: the
    inverse of :func:`~parplan.costmodel.cost.overlap_time` (0 where the side's own traffic
    already reaches ``floor``)."""
    past_window = (
        floor - comm + weight
    )  # work beyond weight / OVERLAP_WINDOW: all the weight hidden
    inside = (floor - comm) / (1.0 - OVERLAP_WINDOW)  # work within it: a part of the weight hidden
    return np.where(
        floor < comm, 0.0, np.where(past_window * OVERLAP_WINDOW >= weight, past_window, inside)
    )


def plan_top_down(
    problem: Problem,
    plan_split: Callable[[SplitProblem], Split],
    planner: str,
    progress: Callable[[str], None] | None = None,
    use_floors: bool = True,
) -> Plan:
    """Plan every split of ``problem.array`` top-down with ``plan_split``.

    ``use_floors=False`` plans every group on its own (the plain recursion of the papers).
    """
    pg = problem.planning
    splits: dict[str, Split] = {}
    sigs: dict[int, tuple] = {}
    done = [0]

    def sig(group: ArrayNode) -> tuple:
        if id(group) not in sigs:
            sigs[id(group)] = signature(group)
        return sigs[id(group)]

    def assign(path: str, group: ArrayNode, subtree: dict[str, Split]) -> None:
        """Copy a planned subtree (keys relative to its root) under ``path``."""
        for rel, split in subtree.items():
            splits[path + rel] = split

    has_collective = problem.array.collective is not None
    bpe = problem.bytes_per_element

    root_dims = problem.root_dims()

    def rec(
        group: ArrayNode,
        dims: tuple[LayerDims, ...],
        floor: np.ndarray,
        covered: tuple[bool, ...],
        path: str,
        regions,
        above=None,
    ) -> tuple[np.ndarray, dict[str, Split]]:
        """Plan ``group``; return its per-node times and its splits keyed relative to it."""
        if group.is_leaf:
            device = group.device.as_device()
            return np.array(LayerDims.compute_times(dims, device, bpe)), {}
        side = problem.side_spec(group)
        floor_arg = tuple(floor) if use_floors and floor.any() else None
        sp = SplitProblem(
            pg,
            dims,
            side,
            path,
            floor_arg,
            covered if has_collective else None,
            regions,
            root_dims,
            bool(group.left.is_leaf and group.right.is_leaf),
            above,
        )
        split = plan_split(sp)
        below = covered_below(covered, split, has_collective)
        done[0] += 1
        if progress is not None and done[0] % 16 == 1:
            progress(f"planned {done[0]} splits ({group.count}-device group)")
        left, right = child_dims(dims, split)
        reg_left, reg_right = sp.child_regions(split)
        cuts = sp.child_cuts(split)
        terms = split_terms(sp, split.choices, split.shares)
        figures = terms_matrix(terms)
        comm, weight = figures[:, 0:2], figures[:, 6:8]
        est = [
            np.array(LayerDims.compute_times(ds, h.as_device, bpe))
            for h, ds in ((group.left, left), (group.right, right))
        ]
        halves = [(group.left, left, "L", reg_left), (group.right, right, "R", reg_right)]
        out: dict[str, Split] = {"": split}
        same_frames = "accpar-code" in compat_rules(problem.compat) or translates(
            pg.succs, reg_left, reg_right
        )
        if sig(group.left) == sig(group.right) and left == right and same_frames:
            f = _child_floor(floor, comm[:, 0], weight[:, 0]) if use_floors else floor * 0
            t, sub = rec(group.left, left, f, below, path + "L", reg_left, cuts)
            for key in ("L", "R"):
                out.update({key + k: v for k, v in sub.items()})
            times = np.maximum(
                overlap_time(t, comm[:, 0], weight[:, 0]), overlap_time(t, comm[:, 1], weight[:, 1])
            )
            return np.maximum(times, floor) if use_floors else times, out
        # plan the half expected to be slower first
        first = (
            0
            if overlap_time(est[0], comm[:, 0], weight[:, 0]).sum()
            >= overlap_time(est[1], comm[:, 1], weight[:, 1]).sum()
            else 1
        )
        second = 1 - first
        actual: list[np.ndarray | None] = [None, None]
        for i, other_time in ((first, est[second]), (second, None)):
            j = 1 - i
            sibling = other_time if other_time is not None else actual[j]
            f = (
                _child_floor(
                    np.maximum(floor, overlap_time(sibling, comm[:, j], weight[:, j])),
                    comm[:, i],
                    weight[:, i],
                )
                if use_floors
                else floor * 0
            )
            h, ds, key, regs = halves[i]
            actual[i], sub = rec(h, ds, f, below, path + key, regs, cuts)
            out.update({key + k: v for k, v in sub.items()})
        times = np.maximum(
            overlap_time(actual[0], comm[:, 0], weight[:, 0]),
            overlap_time(actual[1], comm[:, 1], weight[:, 1]),
        )
        return times, out

    _, tree = rec(
        problem.array,
        problem.root_dims(),
        np.zeros(len(pg.nodes)),
        (False,) * len(pg.nodes),
        "",
        None,
    )
    assign("", problem.array, tree)
    return Plan(splits, planner=planner)
