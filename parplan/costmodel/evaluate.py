"""The one evaluator: prices any plan on any problem (docs/costmodel.md sections 4-7).

For every split (inner array node) and planning node: each side's time is the time of its
child group for that node (recursively; a device's is its roofline compute time for the part
it keeps) plus that side's communication at this split (latency if it receives anything, the
elements it receives over its bandwidth, an all-reduce on collective arrays). The node's time
at the split is the max over the two sides; the step time is the root's sum over nodes.
Memory is summed per device over the parts it keeps.

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.layout import PartitionType
    >>> from parplan.costmodel.problem import Plan, Split
    >>> p = Problem(get_model("vgg11"), parse_array("h100:2"), batch=32)
    >>> n = len(p.planning.nodes)
    >>> dp = Plan({"": Split((PartitionType.BATCH,) * n, (0.5,) * n)})
    >>> ev = evaluate(p, dp)
    >>> ev.step_time_s > 0, ev.communication_elements == 2 * sum(d.weight_elements for d in p.root_dims())
    (True, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import repeat
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

import numpy as np

from parplan.costmodel.cost import (
    Objective,
    covered_below,
    overlap_time,
    terms_matrix,
    scale_for_sides,
    compat_rules,
)
from parplan.costmodel.dims import LayerDims
from parplan.costmodel.hardware import ArrayNode, signature
from parplan.costmodel.problem import Plan, Problem
from parplan.costmodel.regions import translates
from parplan.costmodel.split import PlanOptions, SplitProblem, child_dims, split_terms
from parplan.errors import ConfigError

if TYPE_CHECKING:  # pandas is imported on demand (breakdown): pricing a plan does not need it
    import pandas as pd

_COLUMNS = [
    "level",
    "depth",
    "node",
    "choice",
    "share",
    "child_s_1",
    "child_s_2",
    "intra_elements_1",
    "intra_elements_2",
    "transition_elements_1",
    "transition_elements_2",
    "comm_s_1",
    "comm_s_2",
    "time_s",
]


@dataclass(frozen=True)
class Evaluation:
    """Price of a plan: step time, per-node root times, communication, per-split rows."""

    step_time_s: float
    node_time_s: tuple[float, ...]
    communication_elements: float
    communication_bytes: float
    rows: tuple[tuple, ...]
    leaf_compute_s: tuple[float, ...]  # per node: the slowest device's compute time
    device_memory_bytes: Mapping[str, float]
    #: With ``evaluate(..., node_memory=True)``: per device (leaf path), per planning node, the
    #: bytes that do not depend on the batch (weights, gradients, optimizer state) and the stored
    #: activations of one micro-batch, and what it holds for a while (:func:`transient_bytes`: a
    #: recomputed block's activations, one micro-batch's; ZeRO-3's gathered weights); their sum
    #: is ``device_memory_bytes``.
    node_memory: Mapping[str, tuple[np.ndarray, np.ndarray, float]] | None = None

    def __repr__(self) -> str:
        """One line; ``rows`` and ``breakdown`` hold the details."""
        return (
            f"Evaluation(step_time_s={self.step_time_s:.6g}, nodes={len(self.node_time_s)}, "
            f"communication_bytes={self.communication_bytes:.6g}, devices={len(self.device_memory_bytes)}, "
            f"peak_memory_bytes={self.peak_memory_bytes:.6g})"
        )

    @cached_property
    def breakdown(self) -> pd.DataFrame:
        """One row per (split, node): shares, child times, elements received, times (a pandas
        frame, built on demand: pricing a plan does not import pandas)."""
        import pandas as pd

        return pd.DataFrame(list(self.rows), columns=_COLUMNS)

    def group_node_times(self) -> dict[tuple[str, str], float]:
        """(split path, node name) -> the node's time at that group (``time_s``)."""
        path, node, time = (_COLUMNS.index(c) for c in ("level", "node", "time_s"))
        return {(row[path], row[node]): float(row[time]) for row in self.rows}

    @property
    def peak_memory_bytes(self) -> float:
        """Largest per-device memory need (weights, gradients, optimizer state, activations)."""
        return max(self.device_memory_bytes.values())

    def level_communication(self) -> pd.Series:
        """Elements received (both sides) per split path."""
        b = self.breakdown
        total = (
            b.intra_elements_1
            + b.intra_elements_2
            + b.transition_elements_1
            + b.transition_elements_2
        )
        return total.groupby(b.level, sort=False).sum()


def memory_overruns(
    problem: Problem, evaluation: Evaluation, limit_bytes: float | None = None
) -> list[tuple[str, str, float, float]]:
    """Devices whose memory need exceeds their capacity: ``(leaf path, device kind, need
    bytes, capacity bytes)``, largest overrun first. ``limit_bytes`` is one capacity for every
    device; None means each device's own memory (docs/costmodel.md section 6)."""
    out = []

    def walk(group, path: str) -> None:
        if group.is_leaf:
            need = evaluation.device_memory_bytes.get(path, 0.0)
            cap = group.device.memory_bytes if limit_bytes is None else float(limit_bytes)
            if need > cap:
                out.append((path, group.device.name, need, cap))
            return
        walk(group.left, path + "L")
        walk(group.right, path + "R")

    walk(problem.array, "")
    return sorted(out, key=lambda r: r[3] - r[2])


def check_plan(problem: Problem, plan: Plan) -> None:
    """Raise :class:`ConfigError` if ``plan`` does not fit ``problem`` (node count, choices)."""
    if not isinstance(problem, Problem):
        raise ConfigError(f"evaluate: problem must be a Problem (got {type(problem).__name__})")
    if not isinstance(plan, Plan):
        raise ConfigError(
            f"evaluate: plan must be a Plan (got {type(plan).__name__}); "
            "plans come from parplan.plan, parplan.solve or parplan.load_plan"
        )
    pg = problem.planning
    n = len(pg.nodes)
    seen: set[int] = set()  # a split shared by several groups (interchangeable halves) once
    for path, split in plan.splits.items():
        if id(split) in seen:
            continue
        seen.add(id(split))
        if len(split.choices) != n:
            raise ConfigError(
                f"plan split '{path or 'root'}' has {len(split.choices)} choices but model "
                f"'{pg.name}' has {n} planning nodes"
            )
        for v, c in enumerate(split.choices):
            valid = pg.nodes[v].choices
            if c not in valid:
                raise ConfigError(
                    f"plan split '{path or 'root'}': node '{pg.nodes[v].name}' cannot take choice "
                    f"{getattr(c, 'value', c)!r}; valid: {[x.value for x in valid]}"
                )


def evaluate(
    problem: Problem,
    plan: Plan,
    node_memory: bool = False,
    rows: bool = True,
    memory: bool = True,
) -> Evaluation:
    """Price ``plan`` on ``problem``. Raises :class:`ConfigError` if the plan does not fit it.
    ``node_memory``: also split each device's memory by node into state and activations
    (``Evaluation.node_memory``; the pipeline model reads it, docs/costmodel.md section 11).
    ``rows=False``: without the per-split rows (``Evaluation.rows`` empty; every other figure
    the same, to the last bit): what a search that compares plans by their times and memory
    needs (on llama3-70b / ``h100:512`` the rows are 245,000 tuples per plan). ``memory=False``:
    without the devices' memory (``Evaluation.device_memory_bytes`` empty; the times the same):
    what a search that compares plans by their times alone needs (the ``accpar`` portfolio)."""
    check_plan(problem, plan)
    if node_memory and not memory:
        raise ValueError("node_memory needs memory")
    n = len(problem.planning.nodes)
    table: list = [] if rows else _CommOnly()
    leaf_compute = np.zeros(n)
    used: dict[str, float] | None = {} if memory else None
    detail: dict | None = {} if node_memory else None
    times = _eval(
        problem,
        problem.array,
        "",
        0,
        problem.root_dims(),
        plan,
        table,
        leaf_compute,
        used,
        (False,) * n,
        None,
        None,
        detail=detail,
    )
    comm = float(sum(table) if not rows else sum(r[7] + r[8] + r[9] + r[10] for r in table))
    return Evaluation(
        step_time_s=float(times.sum()),
        node_time_s=tuple(float(t) for t in times),
        communication_elements=comm,
        communication_bytes=comm * problem.bytes_per_element,
        rows=tuple(table) if rows else (),
        leaf_compute_s=tuple(float(t) for t in leaf_compute),
        device_memory_bytes=MappingProxyType(used or {}),
        node_memory=None if detail is None else MappingProxyType(detail),
    )


def device_memory(problem: Problem, plan: Plan) -> dict[str, float]:
    """Every device's memory need under ``plan``: :func:`evaluate`'s ``device_memory_bytes``,
    the same numbers (the same sizes per side, the same formula at the leaves) without pricing
    any time. A memory search filters settings with it before it prices them."""
    check_plan(problem, plan)
    out: dict[str, float] = {}

    def walk(group: ArrayNode, path: str, dims: tuple[LayerDims, ...]) -> None:
        if group.is_leaf:
            out[path] = sum(_leaf_memory(problem, dims)) + transient_bytes(problem, dims)
            return
        if path not in plan.splits:
            raise ConfigError(
                f"plan has no split for group '{path or 'root'}' of array {problem.array.describe()}"
            )
        split = plan.splits[path]
        left, right = child_dims(dims, split)
        start = len(out)
        walk(group.left, path + "L", left)
        if (
            left == right
            and signature(group.left) == signature(group.right)
            and _same_below(plan, path)
        ):
            _copy_half(
                path, [], 0, out, start, None
            )  # sizes alike below: the same memory under the right's paths
        else:
            walk(group.right, path + "R", right)

    walk(problem.array, "", problem.root_dims())
    return out


def node_times(problem: Problem, plan: Plan, nodes) -> dict[int, float]:
    """The root times of ``nodes`` (planning-node indices) under ``plan``: what
    :func:`evaluate` gives them, computed for them alone. A node's time reads its own states and
    its consumers' (its re-layouts), so a change to node ``v``'s states changes the times of
    ``v`` and of its producers only; a local search prices a move by re-pricing those."""
    check_plan(problem, plan)
    n = len(problem.planning.nodes)
    subset = frozenset(int(v) for v in nodes)
    needed = subset.union(*(problem.planning.succs[v] for v in subset))
    times = _eval(
        problem,
        problem.array,
        "",
        0,
        problem.root_dims(),
        plan,
        [],
        np.zeros(n),
        {},
        (False,) * n,
        None,
        None,
        subset,
        needed,
    )
    return {v: float(times[v]) for v in subset}


def _eval(
    problem: Problem,
    group: ArrayNode,
    path: str,
    depth: int,
    dims: tuple[LayerDims, ...],
    plan: Plan,
    rows: list,
    leaf_compute: np.ndarray,
    memory: dict | None,
    covered: tuple[bool, ...],
    regions,
    above,
    nodes: frozenset | None = None,
    needed: frozenset | None = None,
    detail: dict | None = None,
) -> np.ndarray:
    """Every node's time at ``group`` (with ``nodes``: theirs, zeros elsewhere, and no memory;
    ``needed``: ``nodes`` and their consumers, whose sizes and regions their terms read)."""
    pg = problem.planning
    bpe = problem.bytes_per_element
    if group.is_leaf:
        device = group.device.as_device()
        t = np.array(
            [
                d.compute_seconds(device, bpe) if nodes is None or v in nodes else 0.0
                for v, d in enumerate(dims)
            ]
        )
        np.maximum(leaf_compute, t, out=leaf_compute)
        if nodes is None and memory is not None:
            each = _leaf_memory(problem, dims)
            again = transient_bytes(problem, dims)
            memory[path] = sum(each) + again
            if detail is not None:
                opt, zero = problem.optimizer_bytes_per_param, problem.zero_stage
                state = np.array([d.state_bytes(bpe, opt, zero) for d in dims])
                detail[path] = (state, np.array(each) - state, again)
        return t
    if path not in plan.splits:
        raise ConfigError(
            f"plan has no split for group '{path or 'root'}' of array {problem.array.describe()} "
            f"(it has {sorted(plan.splits)}); was it made for another array?"
        )
    split = plan.splits[path]
    has_collective = problem.array.collective is not None
    sp = SplitProblem(
        pg,
        dims,
        problem.side_spec(group),
        path,
        None,
        covered if has_collective else None,
        regions,
        problem.root_dims(),
        bool(group.left.is_leaf and group.right.is_leaf),
        above,
    )
    terms = split_terms(sp, split.choices, split.shares, nodes)
    if needed is None:
        dims_left, dims_right = child_dims(dims, split)
    else:
        pairs = [
            scale_for_sides(d, c, a) if v in needed else (d, d)
            for v, (d, c, a) in enumerate(zip(dims, split.choices, split.shares))
        ]
        dims_left, dims_right = tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    below = covered_below(covered, split, has_collective)
    left, right = sp.child_regions(split, needed)
    cuts = sp.child_cuts(split)
    rows_from, memory_from = len(rows), len(memory or ())
    t_left = _eval(
        problem,
        group.left,
        path + "L",
        depth + 1,
        dims_left,
        plan,
        rows,
        leaf_compute,
        memory,
        below,
        left,
        cuts,
        nodes,
        needed,
        detail,
    )
    if _interchangeable(problem, group, path, plan, dims_left, dims_right, left, right):
        # the right half is the left one moved: the same times, rows and memory under its own paths
        t_right = t_left
        _copy_half(path, rows, rows_from, memory, memory_from, detail)
    else:
        t_right = _eval(
            problem,
            group.right,
            path + "R",
            depth + 1,
            dims_right,
            plan,
            rows,
            leaf_compute,
            memory,
            below,
            right,
            cuts,
            nodes,
            needed,
            detail,
        )
    out = np.zeros(len(dims))
    keep = list(range(len(dims))) if nodes is None else sorted(nodes)
    if not keep:
        return out
    # every node's figures at once: (comm, intra, received, weight) per side
    s1, s2, i1, i2, r1, r2, w1, w2 = terms_matrix([terms[v] for v in keep]).T
    tl, tr = t_left[keep], t_right[keep]
    times = np.maximum(overlap_time(tl, s1, w1), overlap_time(tr, s2, w2))
    out[keep] = times
    if isinstance(rows, _CommOnly):  # a row's four amounts, summed as evaluate sums a row's
        rows.extend(
            a + b + c + d
            for a, b, c, d in zip(i1.tolist(), i2.tolist(), (r1 - i1).tolist(), (r2 - i2).tolist())
        )
        return out
    rows.extend(
        zip(
            repeat(path),
            repeat(depth),
            [pg.nodes[v].name for v in keep],
            [split.choices[v].value for v in keep],
            [split.shares[v] for v in keep],
            tl.tolist(),
            tr.tolist(),
            i1.tolist(),
            i2.tolist(),
            (r1 - i1).tolist(),
            (r2 - i2).tolist(),
            s1.tolist(),
            s2.tolist(),
            times.tolist(),
        )
    )
    return out


def _interchangeable(
    problem: Problem, group: ArrayNode, path: str, plan: Plan, dims_left, dims_right, left, right
) -> bool:
    """Whether a split's two halves price alike: interchangeable groups (equal signatures), the
    same sizes, regions that translate into each other (docs/costmodel.md section 3: every
    amount depends only on where the boxes lie relative to one another) and the same plan below
    each. The planners give such halves one plan (:mod:`parplan.solvers.hierarchy`); pricing
    one of them for both makes a 512-device plan cost its distinct groups, not its 1,023."""
    if dims_left != dims_right or signature(group.left) != signature(group.right):
        return False
    if "accpar-code" not in compat_rules(problem.compat) and not translates(
        problem.planning.succs, left, right
    ):
        return False
    return _same_below(plan, path)


def _same_below(plan: Plan, path: str) -> bool:
    """Whether the splits below ``path``'s right half are those below its left half."""
    n = len(path) + 1
    return all(
        plan.splits.get(path + "R" + key[n:]) == split
        for key, split in plan.splits.items()
        if key.startswith(path + "L")
    )


def _leaf_memory(problem: Problem, dims: tuple[LayerDims, ...]) -> list[float]:
    """Each node's memory on one device that keeps ``dims`` of it (docs/costmodel.md section 6)."""
    bpe, opt, zero = (
        problem.bytes_per_element,
        problem.optimizer_bytes_per_param,
        problem.zero_stage,
    )
    return [d.memory_bytes(bpe, opt, zero) for d in dims]


def transient_bytes(problem: Problem, dims: tuple[LayerDims, ...]) -> float:
    """What a device holds for a while besides its state and stored activations: a recomputed
    block's activations (section 6.3) plus ZeRO-3's gathered weights (section 6.1)."""
    return recomputed_block_bytes(problem, dims) + gathered_unit_bytes(problem, dims)


def gathered_unit_bytes(problem: Problem, dims: tuple[LayerDims, ...]) -> float:
    """At ZeRO stage 3, the largest over the FSDP units (``PlanningGraph.units``) of what the
    device gathers of their weights while the unit runs (its parts' weights less its shards,
    docs/costmodel.md section 6.1); 0 below stage 3."""
    if problem.zero_stage < 3:
        return 0.0
    per: dict[int, float] = {}
    bpe = problem.bytes_per_element
    for u, d in zip(problem.planning.units, dims):
        per[u] = per.get(u, 0.0) + d.gathered_bytes(bpe, 3)
    return max(per.values(), default=0.0)


def recomputed_block_bytes(problem: Problem, dims: tuple[LayerDims, ...]) -> float:
    """What a device holds again while a checkpointed block's backward runs (docs/costmodel.md
    section 6.3): with block checkpointing, the largest over the blocks of every activation of the
    block's nodes its ``dims`` keep, one micro-batch's; 0 without recomputation or blocks."""
    if not problem.blocks_recomputed:
        return 0.0
    blocks = problem.planning.blocks
    per: dict[int, float] = {}
    bpe = problem.bytes_per_element
    for b, d in zip(blocks, dims):
        if b >= 0:
            per[b] = per.get(b, 0.0) + d.activation_bytes(bpe)
    return max(per.values(), default=0.0)


class _CommOnly(list):
    """What :func:`evaluate` keeps of the rows when it need not return them: each row's
    communication (elements received and moved in, both sides), in the rows' order."""


def _copy_half(
    path: str,
    rows: list,
    rows_from: int,
    memory: dict | None,
    memory_from: int,
    detail: dict | None,
) -> None:
    """Repeat what the left half of ``path``'s split added (``rows[rows_from:]``, the memory
    entries after the first ``memory_from``) for the right half, under its paths."""
    n = len(path) + 1
    right = path + "R"
    if isinstance(rows, _CommOnly):
        rows.extend(rows[rows_from:])
    else:
        rows.extend((right + r[0][n:], *r[1:]) for r in rows[rows_from:])
    for key in list(memory or ())[memory_from:]:
        memory[right + key[n:]] = memory[key]
        if detail is not None:
            detail[right + key[n:]] = detail[key]


def price_of(ev: Evaluation, options: PlanOptions) -> float:
    """An evaluation in a planner's objective: the step time, or the elements moved."""
    return (
        ev.communication_elements
        if options.objective is Objective.COMMUNICATION
        else ev.step_time_s
    )
