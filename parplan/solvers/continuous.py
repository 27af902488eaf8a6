"""Exact continuous shares on one split: spatial branch-and-bound over share intervals
(docs/costmodel.md section 8, "Continuous shares, exact").

The grid DP (:mod:`parplan.solvers.dp`) is exact for shares on a grid; the interval relaxation
(``split_tables(relaxed=True)``) prices a node's state on a share *interval* by a lower bound of
its cost anywhere in it, so the DP over interval states bounds every plan with shares anywhere
in ``[0, 1]``. This module closes the two: each node starts with the intervals of a coarse grid
per choice (and the points 0 and 1); each round

1. runs the DP over every node's (choice, interval) states: the least value is a **lower
   bound** on the split's continuous optimum, and the argmin names one state per node;
2. runs the DP over a few **points** per node, all of the argmin's choice: the ends and middle
   of its interval, the ends of its neighbours' (producers' and consumers') intervals and of
   every argmin interval within one width of its own (so a producer and its consumer can meet
   at one share, which a re-layout and its latency need) and the incumbent's share: every such
   plan is a real plan, so the least is an **upper bound** (the incumbent), priced by the same
   cost model;
3. drops every state whose min-marginal (the least bound with the node in that state) exceeds
   the incumbent: an interval's price only rises as it and its neighbours' are cut;
4. cuts every interval of the argmin in :data:`PIECES`.

Every term of a node's cost is monotone in each share (section 8), so an interval's price tends
to its points' as it shrinks and the bounds meet; the search stops when the incumbent is within
``tol`` of the bound (proven optimal to that gap), at its time limit, or when the argmin's
intervals cannot be cut (a bracket). The pricing is the cost model's own, in the compiled
core: this is a search over its states, not a second formulation.

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.costmodel.split import PlanOptions, SplitProblem
    >>> p = Problem(get_model("lenet"), parse_array("tpu-v2:1,tpu-v3:1"), batch=512)
    >>> r = continuous_split(SplitProblem.root(p), PlanOptions())
    >>> r.proven and r.bound_s <= r.value_s <= r.grid_value_s
    True
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from parplan.costmodel.cost import (
    Objective,
    ShareMode,
    ShareSet,
    StateTable,
    share_intervals,
    share_points,
)
from parplan.costmodel.problem import Plan, Problem, Split
from parplan.costmodel.split import (
    PlanOptions,
    SplitProblem,
    compat_reduction_elements,
    price_split,
    split_tables,
    updated_factor,
)
from parplan.errors import ConfigError, TableTooLarge
from parplan.solvers.dp import MAX_CELLS, frontier_dp, min_states
from parplan.solvers.hierarchy import plan_top_down

__all__ = [
    "ContinuousResult",
    "continuous_split",
    "continuous_plan",
    "CONTINUOUS_TOL",
    "START_GRID",
    "PIECES",
]

#: Relative gap under which the incumbent counts as the continuous optimum.
CONTINUOUS_TOL = 1e-6
#: Intervals per choice the search starts from (the grid DP's own grid warm-starts the incumbent).
START_GRID = 8
#: A state is dropped when its least objective exceeds the incumbent's by this (relative) margin.
PRUNE_TOL = 1e-12
#: Pieces a picked interval is cut into each round.
PIECES = 4
#: Intervals narrower than this are not cut again (a bracket is reported instead).
MIN_WIDTH = 1e-13


@dataclass(frozen=True)
class ContinuousResult:
    """The best split found with shares anywhere in [0, 1] and what is proven about it.

    ``value_s``: its objective (the DP's sum of the cost model's terms at its states, which is
    :func:`price_split`'s price; tests check it against the independent reference);
    ``bound_s``: no split with any shares does better; ``proven``: within ``tol`` of the bound;
    ``grid_value_s``: the grid DP's optimum it started from (None when it was given a start);
    ``stop``: "optimal", "time limit", "table size" or "bracket" (intervals too narrow to cut)."""

    split: Split
    value_s: float
    bound_s: float
    proven: bool
    rounds: int
    states: int
    seconds: float
    stop: str
    grid_value_s: float | None = None

    @property
    def gap(self) -> float:
        """(value - bound) / value: how far above the continuous optimum the split can be."""
        return 0.0 if self.value_s <= 0 else max(0.0, (self.value_s - self.bound_s) / self.value_s)


def continuous_split(
    sp: SplitProblem,
    options: PlanOptions,
    tol: float = CONTINUOUS_TOL,
    time_limit_s: float = 60.0,
    start: Split | None = None,
    max_cells: int = MAX_CELLS,
    progress: Callable[[str], None] | None = None,
    raise_table: Callable[[int, StateTable], StateTable] | None = None,
) -> ContinuousResult:
    """The split's optimum over continuous shares, proven to ``tol`` (relative) where the search
    closes within ``time_limit_s`` (wall seconds) and ``max_cells`` per DP table; otherwise the best
    split found and a proven bracket. ``start``: an incumbent (default: the grid DP's optimum at
    ``options.share_grid``). Free shares and the time objective only; a memory price has no
    continuous form here (:class:`ConfigError`).

    ``raise_table(v, table)``: node ``v``'s state table with each side's compute raised to a
    lower bound of that half's time (:func:`parplan.solvers.bound.raised_tables`): the search
    then bounds every plan of a whole hierarchy through its root split, and ``value_s`` is the
    raised model's least value found at points, not a plan's price (``start`` is ignored)."""
    if options.shares is not ShareMode.FREE or options.objective is not Objective.TIME:
        raise ConfigError("continuous shares need free shares and the time objective")
    if options.memory_price:
        raise ConfigError("continuous shares are searched without a memory price (no memory limit)")
    if not 0.0 <= tol < 1.0:
        raise ConfigError(f"tol must be in [0, 1) (got {tol!r})")
    started = time.perf_counter()
    grid_value = None
    n = len(sp.planning.nodes)
    if raise_table is not None:
        grid = [raise_table(v, t) for v, t in enumerate(split_tables(sp, options))]
        grid_value, best = frontier_dp(sp, options, max_cells, tables=grid)
        best_value = grid_value
    elif start is None:
        grid_value, best = frontier_dp(sp, options, max_cells)
        best_value = grid_value
    else:
        best, best_value = start, price_split(sp, start, options)
    producers: list[set[int]] = [set() for _ in range(n)]
    for w in range(n):
        for v in sp.planning.succs[w]:
            producers[v].add(w)
    near = [{v} | set(sp.planning.succs[v]) | producers[v] for v in range(n)]
    first = share_intervals(share_points(sp.side, ShareMode.FREE, START_GRID))
    states = [[(c, s) for c in options.choices(node) for s in first] for node in sp.planning.nodes]
    bound, rounds, stop = 0.0, 0, "time limit"
    # each node's factor as last priced: a round prices only the cells of its new states
    previous: list = [None] * n
    while True:
        rounds += 1
        tables = [_table(sp, options, v, states[v], raise_table) for v in range(n)]
        states = [flat for _, flat in tables]
        marginals: list = []
        try:
            plain = [t for t, _ in tables]
            factors = []
            for u in range(n):
                scope, values, previous[u] = updated_factor(
                    sp, plain, u, options, states, previous[u], max_cells
                )
                factors.append((scope, values, sp.floor(u, options)))
            low, arg = min_states(sp, options, plain, max_cells, marginals, factors)
        except TableTooLarge:
            stop = "table size"
            break
        bound = max(bound, low)
        picked = [states[v][arg[v]] for v in range(n)]
        candidates = [
            _table(
                sp,
                options,
                v,
                [(picked[v][0], ShareSet.point(x)) for x in _candidates(v, picked, near, best)],
                raise_table,
            )
            for v in range(n)
        ]
        try:
            value, point = min_states(sp, options, [t for t, _ in candidates], max_cells)
        except TableTooLarge:
            stop = "table size"
            break
        if value < best_value:
            flat = [candidates[v][1][point[v]] for v in range(n)]
            best = Split(tuple(c for c, _ in flat), tuple(s.lo for _, s in flat))
            best_value = value  # the DP's sum of the model's own terms: the split's price
        if progress is not None and rounds % 10 == 0:
            progress(
                f"continuous shares: round {rounds}, {best_value * 1e3:.6g} ms, bound "
                f"{bound * 1e3:.6g} ms"
            )
        if best_value - bound <= tol * best_value:
            stop = "optimal"
            break
        if time.perf_counter() - started > time_limit_s:
            break
        # a state whose every plan costs more than the incumbent is dropped for good (its
        # intervals' prices only rise as they and their neighbours' are cut)
        for v in range(n):
            keep = marginals[v] <= best_value * (1 + PRUNE_TOL)
            states[v] = [st for st, k in zip(states[v], keep) if k]
        wide = False
        for v in range(n):
            c, s = picked[v]
            if s.hi - s.lo > MIN_WIDTH:
                cuts = [s.lo + (s.hi - s.lo) * j / PIECES for j in range(PIECES)] + [s.hi]
                i = states[v].index(picked[v])
                states[v][i : i + 1] = [(c, ShareSet(a, b, s.has)) for a, b in zip(cuts, cuts[1:])]
                wide = True
        if not wide:
            stop = "bracket"
            break
    bound = min(bound, best_value)
    return ContinuousResult(
        split=best,
        value_s=best_value,
        bound_s=bound,
        proven=stop == "optimal",
        rounds=rounds,
        states=sum(len(s) for s in states),
        seconds=time.perf_counter() - started,
        stop=stop,
        grid_value_s=grid_value,
    )


def continuous_plan(
    problem: Problem,
    options: PlanOptions | None = None,
    time_limit_s: float = 60.0,
    progress: Callable[[str], None] | None = None,
) -> tuple[Plan, dict[str, dict]]:
    """(plan, per split path its value_s, bound_s, gap, stop and grid_value_s): the published
    top-down recursion (each half priced as one device at the split above it), every split
    solved with continuous shares by :func:`continuous_split` (``time_limit_s`` per split)."""
    options = PlanOptions() if options is None else options
    found: dict[int, ContinuousResult] = {}

    def plan_split(sp: SplitProblem) -> Split:
        r = continuous_split(sp, options, time_limit_s=time_limit_s, progress=progress)
        found[id(r.split)] = r
        return r.split

    plan = plan_top_down(problem, plan_split, "accpar-continuous", progress)
    info = {
        path: {
            "value_s": r.value_s,
            "bound_s": r.bound_s,
            "gap": r.gap,
            "stop": r.stop,
            "grid_value_s": r.grid_value_s,
        }
        for path, split in plan.splits.items()
        for r in [found[id(split)]]
    }
    proven = sum(r["stop"] == "optimal" for r in info.values())
    summary = f"{proven} of {len(info)} splits proven within {CONTINUOUS_TOL:g}"
    return Plan(plan.splits, plan.planner, {**plan.info, "continuous shares": summary}), info


def _candidates(v: int, picked, near, best: Split) -> list[float]:
    """The points node ``v`` may take in the upper-bound DP: the ends and middle of its picked
    interval, its neighbours' interval ends, every picked interval's ends within one width of
    its own, and the incumbent's share."""
    c, s = picked[v]
    xs = {s.lo, s.hi, 0.5 * (s.lo + s.hi)}
    for w in near[v]:
        xs.update((picked[w][1].lo, picked[w][1].hi))
    width = s.hi - s.lo
    for _, t in picked:  # a run of touching intervals over many nodes (a residual stream)
        xs.update(x for x in (t.lo, t.hi) if s.lo - width <= x <= s.hi + width)
    if best.choices[v] == c:
        xs.add(float(best.shares[v]))
    return sorted(xs)


def _table(
    sp: SplitProblem, options: PlanOptions, v: int, states, raise_table=None
) -> tuple[StateTable, list]:
    """Node ``v``'s state table over ``states`` ((choice, ShareSet) pairs), one priced table per
    choice merged (then raised, with ``raise_table``), and the states in its order."""
    by_choice: dict = {}
    for c, s in states:
        by_choice.setdefault(c, []).append(s)
    parts = [
        StateTable.build(
            sp.dims[v],
            sp.is_covered(v),
            (c,),
            tuple(sets),
            sp.side,
            compat_reduction_elements(sp, v),
            sp.cuts(v),
        )
        for c, sets in by_choice.items()
    ]
    flat = [(c, s) for c, sets in by_choice.items() for s in sets]
    table = parts[0] if len(parts) == 1 else StateTable.merged(parts)
    return (table if raise_table is None else raise_table(v, table)), flat
