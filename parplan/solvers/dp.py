"""Exact dynamic programming over one split: min-sum variable elimination over the nodes'
states (docs/costmodel.md section 8).

A node's state is its choice and its share on the grid; node ``u``'s cost depends on its own
state and its consumers' states (:func:`parplan.costmodel.split.node_factor`). The DP
eliminates nodes one at a time (greedy: the one whose elimination makes the smallest table,
ties to the lowest index, so a chain is walked front to back as the classic layer-wise DP):
it adds the tables that mention the node, minimises over its states and keeps the argmin for
the way back. It is exact for the states it is given, on any DAG; its cost grows with the
largest table, ``states ^ (tables' joint scope)``. Graphs whose tables exceed ``max_cells``
raise :class:`~parplan.errors.TableTooLarge`; :func:`local_search` then plans the split
without a table (a fallback that always returns a plan, with no optimality claim).

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> p = Problem(get_model("vgg16"), parse_array("tpu-v2:1,tpu-v3:1"), batch=64)
    >>> split = solve_split(SplitProblem.root(p), PlanOptions())
    >>> len(split.choices) == len(p.planning.nodes)
    True
"""

from __future__ import annotations

import functools
import heapq
import math
from dataclasses import replace

import numpy as np

from parplan.costmodel.compiled import core as _pricing
from parplan.costmodel.cost import (
    REL_TOL,
    ShareMode,
    core_spec,
    floored_time,
    line_values,
    share_points,
)
from parplan.costmodel.layout import PartitionType
from parplan.costmodel.problem import Split
from parplan.costmodel.split import (
    MAX_FACTOR_CELLS,
    PlanOptions,
    SplitProblem,
    all_choices,
    check_factor_size,
    factor_cells,
    factor_scope,
    memory_price,
    split_factors,
    node_factor,
    own_raw,
    own_values,
    split_tables,
)
from parplan.errors import TableTooLarge

#: Largest table (cells) the DP builds.
MAX_CELLS = 3 * 10**7
#: Cells of a split's largest factor from which the DP first drops the states that no optimal
#: assignment has (:func:`live_states`): a node read by two consumers (47^3 cells at share grid
#: 16). A chain's two-node factors are cheap to eliminate, and priced once per class of alike
#: nodes: there the check cost more than it saved (a 1,024-layer chain on ``h100:128``: +19%).
PRUNE_MIN_CELLS = 50_000
#: States per node (its cheapest by :func:`~parplan.costmodel.split.own_values`) of the small DP
#: whose optimum is :func:`live_states`' upper bound.
PRUNE_CANDIDATES = 3
#: :func:`live_states` keeps the whole tables unless its states have at most this fraction of
#: their factors' cells (new tables are priced afresh, where the memo of node terms holds the
#: whole ones' values from the portfolio's earlier members).
PRUNE_KEEP = 0.5
#: Relative margin of :func:`live_states`: a state goes only if its bound exceeds the upper
#: bound by more than float rounding of the sums could.
PRUNE_TOL = 1e-9


def solve_split(sp: SplitProblem, options: PlanOptions, max_cells: int = MAX_CELLS) -> Split:
    """Optimal choices and shares for one split under ``options`` (exact on the share grid).
    Where every node has one state (OWT's rule on a network without joins, data parallelism
    at fixed shares) that state is the split: nothing is priced."""
    tables = split_tables(sp, options)
    if all(t.size == 1 for t in tables) or _first_states_free(sp, options, tables):
        return Split(tuple(t.choices[0] for t in tables), tuple(float(t.shares[0]) for t in tables))
    return frontier_dp(sp, options, max_cells, tables=tables)[1]


def _first_states_free(sp: SplitProblem, options: PlanOptions, tables) -> bool:
    """Whether every node's factor is 0 (before its floor) with every node in its first state:
    then that assignment is optimal (every factor is >= 0 and a floor only raises it), and the
    DP returns it (on the way back each node's first state reaches the least value, and ties go
    to the lowest state). A group with no work (every node on the other side of a split above:
    AlexNet / ``h100:128`` plans 54 of its 123 splits at such groups) prices nothing else.
    Checked on each node's own value first (cheap, memoised per table), then on its factor's
    first cell. Not under a memory price (a unary term the check would have to read too)."""
    if options.memory_price > 0.0:
        return False
    if any(own_raw(sp, tables, u, options)[0] != 0.0 for u in range(len(tables))):
        return False
    first = [t.subset(np.zeros(1, dtype=np.int64)) for t in tables]
    return all(float(f[1].reshape(-1)[0]) == 0.0 for f in split_factors(sp, first, options))


def continuous_bound(sp: SplitProblem, options: PlanOptions, max_cells: int = MAX_CELLS) -> float:
    """A lower bound on the split's objective over *continuous* shares in [0, 1] (the grid
    relaxation of :func:`frontier_dp`); with fixed shares, the exact optimum."""
    return frontier_dp(sp, options, max_cells, relaxed=True)[0]


def elimination_order(scopes: list[tuple[int, ...]], n: int) -> list[int]:
    """Greedy min-degree order: repeatedly the node whose neighbourhood (in the graph joining
    every two nodes that share a table) is smallest, ties to the lowest index. A heap with
    lazy deletion keeps it ``O(E log n)`` on the long chains of today's models; remembered
    (every split of a graph has the same scopes: Llama-3-70B on 512 devices runs 2,000 DPs)."""
    return list(_order(tuple(scopes), n))


@functools.lru_cache(maxsize=64)
def _order(scopes: tuple[tuple[int, ...], ...], n: int) -> tuple[int, ...]:
    adj: list[set[int]] = [set() for _ in range(n)]
    for scope in scopes:
        for a in scope:
            adj[a].update(b for b in scope if b != a)
    heap = [(len(adj[v]), v) for v in range(n)]
    heapq.heapify(heap)
    done = [False] * n
    order = []
    while heap:
        deg, v = heapq.heappop(heap)
        if done[v] or deg != len(adj[v]):
            continue  # eliminated, or an entry from before its degree changed
        order.append(v)
        done[v] = True
        for a in adj[v]:
            adj[a].update(b for b in adj[v] if b != a)
            adj[a].discard(v)
            heapq.heappush(heap, (len(adj[a]), a))
    return tuple(order)


def frontier_dp(
    sp: SplitProblem,
    options: PlanOptions,
    max_cells: int = MAX_CELLS,
    relaxed: bool = False,
    tables=None,
) -> tuple[float, Split]:
    """(optimal objective, split). Ties go to the lowest state: the earliest choice in BATCH,
    IN, OUT order (join layouts: rows, cols, whole), then the smallest share.

    ``relaxed``: optimise over share intervals priced by their minima instead (see
    :func:`~parplan.costmodel.split.split_tables`); the value is then a lower bound on every
    plan with any shares in [0, 1], and the split holds each interval's lower end.
    ``tables``: the nodes' state tables to use instead of :func:`split_tables`' (a bound that
    raises each side's compute to a better lower bound, :mod:`parplan.solvers.bound`)."""
    tables = split_tables(sp, options, relaxed) if tables is None else tables
    value, state = min_states(sp, options, tables, max_cells)
    choices = tuple(tables[v].choices[state[v]] for v in range(len(state)))
    shares = tuple(float(tables[v].shares[state[v]]) for v in range(len(state)))
    return value, Split(choices, shares)


def min_states(
    sp: SplitProblem,
    options: PlanOptions,
    tables,
    max_cells: int = MAX_CELLS,
    marginals: list | None = None,
    factors: list | None = None,
    prune: bool = True,
) -> tuple[float, list[int]]:
    """(the least objective over the nodes' states ``tables``, each node's state index there):
    the elimination behind :func:`frontier_dp`, for any state tables (points, intervals, or a
    mix per node, as :mod:`parplan.solvers.continuous` refines them). Without ``marginals``
    and ``factors``, the states no optimal assignment has are dropped first (``prune``;
    :func:`live_states`).

    ``marginals``: a list that receives, per node, the least objective with the node in each of
    its states (min-marginals: a backward pass over the elimination's cliques, each clique's
    sum plus what lies outside it; the outside of a message is its consumer's clique minus the
    message, minimised over the rest). ``factors``: per node ``(scope, values, floor)`` as
    :func:`~parplan.costmodel.split.floorless_factor` gives them, priced by the caller (the
    continuous search updates them state by state: ``split.updated_factor``)."""
    if prune and marginals is None and factors is None:
        kept = live_states(sp, options, tables, max_cells)
        if kept is not None:
            sub = [t if k is None else t.subset(k) for t, k in zip(tables, kept)]
            value, state = min_states(sp, options, sub, max_cells, prune=False)
            return value, [s if k is None else int(k[s]) for s, k in zip(state, kept)]
    n = len(sp.planning.nodes)
    # (scope, values, floor) per node: the elimination floors a node's values as it reads them
    # (the min-marginals' backward pass reads the tables themselves: floored here)
    if factors is not None:
        for u in range(n):  # every size first: a split too large for the DP prices nothing
            check_factor_size(sp, tables, u, options, max_cells)
        factors = [
            (s, v, f) if marginals is None else (s, floored_time(v, f), 0.0) for s, v, f in factors
        ]
    elif marginals is None:  # sizes checked first, each class of alike nodes priced once
        factors = split_factors(sp, tables, options, max_cells)
    else:
        for u in range(n):
            check_factor_size(sp, tables, u, options, max_cells)
        factors = [
            (*node_factor(sp, tables, u, options, max_cells, checked=True), 0.0) for u in range(n)
        ]
    order = elimination_order([f[0] for f in factors], n)
    if marginals is None:  # the whole elimination in the compiled core (_pricing.solve)
        got = _pricing.solve(
            tuple(f[0] for f in factors),
            tuple(np.ascontiguousarray(f[1], dtype=float) for f in factors),
            tuple(float(f[2]) for f in factors),
            tuple(t.size for t in tables),
            tuple(order),
            float(max_cells),
        )
        if got[0] is None:
            _too_large(sp, options, got[1], got[2], max_cells)
        return got
    # the live tables by id (ids grow with insertion, so sorted ids keep the tables' order, which
    # fixes the order of the sums) and, per node, the ids of the live tables that mention it
    live: dict[int, tuple[tuple[int, ...], np.ndarray, float]] = dict(enumerate(factors))
    mentions: list[set[int]] = [set() for _ in range(n)]
    for i, f in live.items():
        for w in f[0]:
            mentions[w].add(i)
    records = []
    cliques: list = []
    constant = 0.0
    for v in order:
        gone, mentions[v] = mentions[v], set()
        mine = [live.pop(i) for i in sorted(gone)]
        for w in {w for f in mine for w in f[0]} - {v}:
            mentions[w] -= gone
        scope = tuple(sorted({w for f in mine for w in f[0]}))
        shape = tuple(tables[w].size for w in scope)
        cells = math.prod(shape)
        if cells > max_cells:
            _too_large(sp, options, v, cells, max_cells)
        axis = scope.index(v)
        rest = scope[:axis] + scope[axis + 1 :]
        best, arg = eliminate(mine, scope, shape, axis)
        records.append((v, rest, arg))
        if rest:
            i = len(factors) + len(records)
            live[i] = (rest, best, 0.0)
            for w in rest:
                mentions[w].add(i)
        else:
            i = None
            constant += float(best.reshape(()))
        if marginals is not None:
            cliques.append((v, scope, [f[:2] for f in mine], sorted(gone), i, best))
    value = constant + sum(float(f[1].sum()) for f in live.values() if not f[0])
    state = [0] * n
    for v, rest, arg in reversed(records):
        state[v] = int(arg[tuple(state[w] for w in rest)]) if rest else int(arg)
    if marginals is not None:
        marginals[:] = _min_marginals(cliques, n, len(factors), constant)
    return value, state


def live_states(
    sp: SplitProblem,
    options: PlanOptions,
    tables,
    max_cells: int = MAX_CELLS,
    force: bool = False,
    upper: float | None = None,
) -> list[np.ndarray | None] | None:
    """Per node, the indices of the states an optimal assignment may have (None: all of them),
    or None where nothing is dropped or the split's factors are small
    (:data:`PRUNE_MIN_CELLS`; docs/costmodel.md section 8, "States no optimum has").

    The objective is the sum of the nodes' factors, and each factor is at least its node's
    :func:`~parplan.costmodel.split.own_values` at its state: so every assignment with node
    ``u`` in state ``s`` costs at least ``own_u(s) + sum over w != u of min own_w``. A small DP
    over each node's :data:`PRUNE_CANDIDATES` cheapest states gives an assignment, whose value
    ``U`` is at least the optimum; a state whose bound exceeds ``U`` is in no optimal
    assignment, and dropping it changes neither the optimum nor the assignment the DP returns
    (every step of the elimination on the way back chooses among states of optimal
    assignments, in the same order). On ResNet-50 / ``h100:8`` the root split keeps a third of
    its states and an eighth of its factors' cells. ``force``: whatever the factors' size and
    however few go (the exact MIP's columns, :func:`parplan.solvers.exact.solve_split_exact`);
    ``upper``: the value of an assignment known already, instead of the small DP's."""
    per_node = factor_cells(sp, tables)
    if not len(per_node) or (per_node.max() < PRUNE_MIN_CELLS and not force):
        return None
    cells = per_node.sum()
    limit = min(max_cells, MAX_FACTOR_CELLS)
    if factor_cells(sp, [min(t.size, PRUNE_CANDIDATES) for t in tables]).max() > limit:
        return None  # even the small DP is too large (DenseNet's concats): the DP raises
    own = own_values(sp, tables, options)
    low = [float(x.min()) if x.size else 0.0 for x in own]
    if not all(math.isfinite(x) for x in low):
        return None
    if upper is None:
        picks = [np.sort(np.argsort(x, kind="stable")[:PRUNE_CANDIDATES]) for x in own]
        small = [t if len(p) == t.size else t.subset(p) for t, p in zip(tables, picks)]
        upper = min_states(sp, options, small, max_cells, prune=False)[0]
    if not math.isfinite(upper):
        return None
    slack = upper - math.fsum(low) + PRUNE_TOL * abs(upper)
    kept: list[np.ndarray | None] = []
    counts = []
    for x, m in zip(own, low):
        live = np.flatnonzero(x - m <= slack)
        kept.append(None if len(live) == len(x) else live)
        counts.append(len(live))
    if all(k is None for k in kept):
        return None
    if not force and factor_cells(sp, counts).sum() > PRUNE_KEEP * cells:
        return None  # too few dropped to be worth new tables (the memo knows the whole ones)
    return kept


def _too_large(sp: SplitProblem, options: PlanOptions, v: int, cells: float, max_cells) -> None:
    raise TableTooLarge(
        f"graph '{sp.planning.name}': the DP needs a table of {cells:.3g} cells at node "
        f"'{sp.planning.nodes[v].name}' (limit {max_cells:.3g}); use a coarser --share-grid "
        f"(now {options.share_grid}) or the exact solver (parplan solve)"
    )


def _spread(scope_of: tuple[int, ...], table: np.ndarray, scope: tuple[int, ...]) -> np.ndarray:
    """``table`` over ``scope_of`` (any order) as an array broadcastable over sorted ``scope``."""
    order = sorted(range(len(scope_of)), key=lambda j: scope_of[j])
    t = np.transpose(np.asarray(table, dtype=float), order) if order else np.asarray(table, float)
    mine = {w: t.shape[k] for k, w in enumerate(sorted(scope_of))}
    return t.reshape([mine.get(w, 1) for w in scope])


def _min_marginals(cliques, n: int, n_factors: int, constant: float) -> list[np.ndarray]:
    """Per node, the least objective with the node in each state (see :func:`min_states`).
    Cliques in reverse elimination order: a clique's full table is the sum of its tables plus
    its outside (for the last clique of a connected part: the other parts' minima; else the
    outside of the message it made); each message it consumed gets as outside that total
    less the message, minimised over the axes the message does not span."""
    outside: dict[int, np.ndarray] = {}
    out: list[np.ndarray] = [np.zeros(0)] * n
    for v, scope, mine, ids, i, best in reversed(cliques):
        total = np.zeros([1] * len(scope))
        for s, t in mine:
            total = total + _spread(s, t, scope)
        if i is None:
            total = total + (constant - float(np.asarray(best).reshape(())))
        else:
            total = total + _spread(tuple(w for w in scope if w != v), outside.pop(i), scope)
        axis = scope.index(v)
        others = tuple(k for k in range(len(scope)) if k != axis)
        out[v] = total.min(axis=others) if others else total
        for (s, t), j in zip(mine, ids):
            if j >= n_factors:  # a message from an earlier clique
                drop = tuple(k for k, w in enumerate(scope) if w not in s)
                diff = total - _spread(s, t, scope)
                outside[j] = diff.min(axis=drop) if drop else diff
    return out


def eliminate(
    mine, scope: tuple[int, ...], shape: tuple[int, ...], axis: int
) -> tuple[np.ndarray, np.ndarray]:
    """(min over ``scope[axis]`` of the sum of the tables ``mine``, the first state within
    :data:`~parplan.costmodel.cost.REL_TOL` of it), over the grid ``shape`` of ``scope`` less
    that axis: one elimination step, by the compiled core (the min-marginals' pass; the DP's
    own steps run in ``_pricing.solve``). Each table ``(s, array, ...)`` spans its sorted scope
    ``s``, a subset of ``scope``."""
    arrays, strides = [], []
    for s, table, *_ in mine:
        a = np.ascontiguousarray(table, dtype=float)
        own = {w: st // 8 for w, st in zip(s, a.strides)}
        arrays.append(a)
        strides += [own[w] if w in own and a.shape[s.index(w)] > 1 else 0 for w in scope]
    rest = shape[:axis] + shape[axis + 1 :]
    best, arg = np.empty(rest), np.empty(rest, dtype=np.int64)
    _pricing.eliminate(tuple(arrays), tuple(strides), tuple(shape), axis, best, arg)
    return best, arg


#: Sweeps of :func:`local_search` over all nodes (each sweep can only lower the objective).
MAX_SWEEPS = 50
#: Largest table (cells) of the coarser-grid DP that starts a fallback's local search. The start
#: only seeds the search, so it is kept cheap: on GoogLeNet / ``h100:8`` a limit of
#: :data:`MAX_CELLS` put the start on a grid of 8 with 1.4e7-cell tables (3-5 s per split, 72 of
#: the plan's 83 s); at this limit it is the grid of 4.
FALLBACK_MAX_CELLS = 2 * 10**6


def fallback_split(
    sp: SplitProblem, options: PlanOptions, max_cells: int = FALLBACK_MAX_CELLS
) -> tuple[float, Split, str]:
    """(objective, split, how) for a split whose DP tables are too large (a node read by many
    consumers: Llama's residual stream feeding q, k, v and the next add; DenseNet's concats).

    The exact DP on the finest coarser share grid (half, a quarter, ... of the points) whose
    tables stay within ``max_cells`` gives a start; :func:`local_search` on the requested grid
    improves it. No optimality is claimed on the requested grid."""
    start, how = None, "local search from data parallelism"
    found = (
        finest_grid_dp(sp, options, options.share_grid // 2, max_cells)
        if options.shares is ShareMode.FREE
        else None
    )
    if found is not None:
        (_, start), grid = found
        how = f"exact DP on a share grid of {grid}, then local search on {options.share_grid}"
    value, split = local_search(sp, options, start)
    return value, split, how


def finest_grid_dp(
    sp: SplitProblem, options: PlanOptions, grid: int, max_cells: int, tables=None, last: int = 2
) -> tuple[tuple[float, Split], int] | None:
    """(:func:`frontier_dp`'s result, the grid) on the finest share grid from ``grid`` down
    (halving, to ``last``) whose tables stay within ``max_cells``; None if none does (with shares
    not free the grid changes nothing: one try). ``tables``: the options of a grid -> the state
    tables to use (default :func:`split_tables`')."""
    while grid >= last:
        o = replace(options, share_grid=grid)
        try:
            return frontier_dp(sp, o, max_cells, tables=None if tables is None else tables(o)), grid
        except TableTooLarge:
            if options.shares is not ShareMode.FREE:
                return None
            grid //= 2
    return None


def local_search(
    sp: SplitProblem, options: PlanOptions, start: Split | None = None
) -> tuple[float, Split]:
    """(objective, split) by coordinate descent over the nodes' states: no table is built.

    From ``start`` (default: data parallelism, every node's first choice at the proportional
    share) it repeatedly gives each node, in order, its best state with all others fixed,
    until a sweep changes nothing; each step evaluates only the factors that mention the node.
    The result is a local optimum, priced exactly like any plan."""
    n = len(sp.planning.nodes)
    tables = split_tables(sp, options)
    mode = ShareMode.PROPORTIONAL if options.shares is ShareMode.FREE else options.shares
    prop = share_points(sp.side, mode, 1)[0]
    state = []
    for v, t in enumerate(tables):
        choice = start.choices[v] if start is not None else t.choices[0]
        share = start.shares[v] if start is not None else prop
        same = [i for i in range(t.size) if t.choices[i] == choice] or list(range(t.size))
        state.append(min(same, key=lambda i: abs(float(t.shares[i]) - share)))
    scopes = [factor_scope(sp.planning, u) for u in range(n)]
    touching: list[list[int]] = [[] for _ in range(n)]  # v -> the factors mentioning it, in order
    for u, scope in enumerate(scopes):
        for w in scope:
            touching[w].append(u)
    axes = [{w: j for j, w in enumerate(scope)} for scope in scopes]  # u -> member -> its axis

    seen: dict[tuple, np.ndarray] = {}  # (u, v, *the scope's states) -> factor(u, v)
    specs: dict[int, tuple] = {}  # u -> cost.core_spec of its terms

    def factor(u: int, v: int) -> np.ndarray:
        """Factor ``u`` for every state of node ``v`` (the others at their current state):
        what :func:`~parplan.costmodel.split.node_factor` holds along that line (remembered:
        a sweep that changes little asks for the same lines again)."""
        states = [state[w] for w in scopes[u]]
        axis = axes[u][v]
        states[axis] = -1  # the line's own state is not part of the key
        key = (u, v, *states)
        hit = seen.get(key)
        if hit is not None:
            return hit
        if u not in specs:  # what does not depend on the states, once per node
            specs[u] = core_spec(tables, sp.side, sp.groups(u), u, *sp.frames)
        raw = line_values(
            specs[u], tables[u].steps, states, axis, tables[v].size, options.objective
        )
        value = floored_time(raw, sp.floor(u, options))
        if options.memory_price > 0.0:  # the memory price is a term of u's own state (node_factor)
            price = memory_price(sp, tables, u, options)
            value = value + (price if u == v else price[state[u]])
        seen[key] = value
        return value

    for _ in range(MAX_SWEEPS):
        changed = False
        for v in range(n):
            total = sum(factor(u, v) for u in touching[v])
            best = int(np.argmin(total))
            if total[best] < total[state[v]] - REL_TOL * abs(total[state[v]]):
                state[v], changed = best, True
        if not changed:
            break
    value = sum(float(factor(u, u)[state[u]]) for u in range(n))
    choices = tuple(tables[v].choices[state[v]] for v in range(n))
    shares = tuple(float(tables[v].shares[state[v]]) for v in range(n))
    return value, Split(choices, shares)


__all__ = [
    "FALLBACK_MAX_CELLS",
    "MAX_CELLS",
    "finest_grid_dp",
    "continuous_bound",
    "fallback_split",
    "local_search",
    "PlanOptions",
    "SplitProblem",
    "all_choices",
    "elimination_order",
    "frontier_dp",
    "live_states",
    "min_states",
    "PRUNE_MIN_CELLS",
    "solve_split",
    "PartitionType",
]
