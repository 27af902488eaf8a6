"""A global lower bound on the step time of every plan of a whole hierarchy
(docs/costmodel.md section 8, "Global bound").

The evaluator prices a node at a group as ``max`` over the two children of (the child's time
for the node + that side's communication at this split), and a step as the sum over nodes
(section 7). Dropping every re-layout between nodes (each is >= 0) leaves, per node, only
terms of the node itself: its compute at the devices, and at every split it divides with work
on both sides, its intra-layer reduction (the partial sum its type leaves, section 2) and the
link latency. The nodes then decouple, and for each node

    LB_g(d) = min( LB_L(d), LB_R(d),                                    one side does it all
                   min over choice c and share a in (0, 1) of
                   max(LB_L(d_L(c, a)) + comm_L(c, d), LB_R(d_R(c, a)) + comm_R(c, d)) )

with ``LB`` of a device its compute time at dims ``d``, is at most the node's time at group
``g`` under any plan (by induction: ``LB`` is nondecreasing in B, Di and Do, since compute and
every reduction are). The step-time bound is the sum over nodes at the root dims. Shares are
continuous:

- **Interchangeable children** (same devices and structure, same link each way): for each
  choice the best share is exactly 1/2 (with ``g`` nondecreasing, ``max(g(a), g(1 - a)) >=
  g(1/2)``), so the recursion over a homogeneous group only halves dims;
- **other splits**: shares in ``share_grid`` intervals, each priced at its ends that make the
  children smallest (``lo`` for the left, ``1 - hi`` for the right); the left term grows and
  the right term shrinks with the interval, so a bisection finds the best interval exactly.

Unlike the root-split bound (each half one device of summed throughput), this one charges each
half's own reductions: data parallelism's weight exchange at every level, a model-parallel
split's partial sums. It ignores re-layouts between nodes and, on collective arrays, the
BATCH all-reduce (an enclosing split may have paid it). Two bounds put re-layouts back:
:func:`root_dp_bound` those of the root split, :func:`pair_bound` those of one edge per node
at every level (docs/costmodel.md section 8, "Pair bound").

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.costmodel.evaluate import evaluate
    >>> from parplan.solvers.planners import make_plan
    >>> p = Problem(get_model("alexnet"), parse_array("h100:8"), batch=256)
    >>> b = hierarchy_bound(p)
    >>> 0 < b.bound_s <= evaluate(p, make_plan(p, "accpar")).step_time_s
    True
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

from parplan.costmodel.compiled import core
from parplan.costmodel.cost import (
    DEFAULT_SHARE_GRID,
    CHOICE_CODE,
    _side_tuple,
    scale_for_sides,
    side_dims,
)
from parplan.costmodel.dims import device_figures
from parplan.costmodel.layout import Layout
from parplan.costmodel.dims import ElementOp, LayerDims
from parplan.costmodel.hardware import ArrayNode, signature
from parplan.costmodel.problem import Problem
from parplan.errors import ConfigError, TableTooLarge

__all__ = [
    "GlobalBound",
    "hierarchy_bound",
    "node_bounds",
    "root_dp_bound",
    "root_continuous_bound",
    "pair_bound",
    "pinned_node_bounds",
    "excess_parts",
    "global_bound",
    "layer_excess",
    "raised_tables",
    "root_split_bound",
    "fixed_splits_bound",
    "DEFAULT_BOUND_GRID",
    "PAIR_MAX_DEVICES",
    "PAIR_BUDGET",
]

#: Wall seconds the root split's continuous search may take in :func:`global_bound` (0: none).
ROOT_SEARCH_S = 10.0
#: Share intervals per heterogeneous split (bisection: ~log2 of it evaluations per choice).
DEFAULT_BOUND_GRID = 1024
#: The most per-node bounds one problem's bound may ask for (memo hits included, all node kinds
#: together; a few seconds of the compiled recursion). An unbalanced tree dozens of levels deep
#: would otherwise run for ever; past it the bound raises TableTooLarge.
BOUND_BUDGET = 30_000_000


@dataclass(frozen=True)
class GlobalBound:
    """``bound_s``: no plan of the problem has a shorter step; ``node_s``: each node's share of it."""

    bound_s: float
    node_s: tuple[float, ...]
    share_grid: int


#: The sizes of LayerDims a split scales (a bound's memo keys hold them).
_SCALED = frozenset(("batch", "in_features", "out_features"))


def _unnamed(value):
    """A LayerDims field without the names of its element-wise ops (they name the graph layers
    they come from; the costs do not read them)."""
    if isinstance(value, tuple) and value and isinstance(value[0], ElementOp):
        return tuple(replace(op, name="") for op in value)
    return value


class _Bound:
    """Memoised ``LB_g(d)`` for one node's choices over the array's groups (docs/costmodel.md
    section 8): the recursion runs in the compiled core (``_pricing.bound_lb``) over the array's
    tree, laid out once; its memos (one per node kind) live there too."""

    def __init__(self, problem: Problem, grid: int):
        self.bpe = float(problem.bytes_per_element)
        self.collective = problem.array.collective is not None
        self.grid = int(grid)
        self.memo = None  # the core's memo of the node kind in use
        self.codes: tuple[int, ...] = ()
        self.memos: dict[tuple, object] = {}
        self.used: dict[tuple, tuple] = {}  # (dims, choices) -> (its kind's memo, codes)
        self.ids: dict[tuple, int] = {}
        self.sig: dict[int, int] = {}
        self.sides: dict[int, object] = {}
        self.trees: dict[int, tuple[object, dict[int, int]]] = {}
        #: raised_tables' tables: (table, dims, choices ids, group signature) -> (table, dims,
        #: choices, the raised table)
        self.raised: dict[tuple, tuple] = {}
        self.problem = problem
        self.tree, self.index = self._tree(problem.array)

    def _tree(self, root: ArrayNode) -> tuple[object, dict[int, int]]:
        """The core's tree of ``root`` (groups in preorder) and each group's index in it."""
        rows, index = [], {}

        def visit(g: ArrayNode) -> int:
            i = len(rows)
            index[id(g)] = i
            rows.append(None)
            sig = self.signature(g)
            if g.is_leaf:
                rows[i] = (1, 0, 0, 0, sig, 0, device_figures(g.device.as_device()), (1.0,) * 8)
                return i
            side = self._side(g)
            left, right = visit(g.left), visit(g.right)
            rows[i] = (
                0,
                left,
                right,
                int(g.interchangeable_halves),
                sig,
                int(self.collective or side.overlap),
                (1.0,) * 7,
                _side_tuple(side, True),
            )
            return i

        visit(root)
        return core.tree(tuple(rows), BOUND_BUDGET), index

    def signature(self, group: ArrayNode) -> int:
        """A small integer per structurally distinct group (the memos' keys; cheap to hash)."""
        sig = self.sig.get(id(group))
        if sig is None:
            sig = self.sig[id(group)] = self.ids.setdefault(signature(group), len(self.ids))
        return sig

    def _side(self, group: ArrayNode):
        side = self.sides.get(id(group))
        if side is None:
            side = self.sides[id(group)] = self.problem.side_spec(group)
        return side

    def where(self, group: ArrayNode) -> tuple[object, int]:
        """(the core's tree holding ``group``, its index there); a group outside the problem's
        array gets a tree of its own (same signatures, so the memos stay shared)."""
        i = self.index.get(id(group))
        if i is not None:
            return self.tree, i
        if id(group) not in self.trees:
            self.trees[id(group)] = (group, *self._tree(group))
        _, tree, index = self.trees[id(group)]
        return tree, index[id(group)]

    def twin(self) -> "_Bound":
        """A second cursor over the same memos (one per node kind) and group tables, to bound
        two nodes side by side (the pair bound)."""
        other = object.__new__(_Bound)
        other.__dict__.update(self.__dict__)
        other.memo = None
        return other

    def use(self, dims: LayerDims, choices) -> None:
        """Bound a node with ``dims`` and ``choices`` from now on. Memo keys hold a group and
        the sizes a split scales (B, Di and Do), so one memo serves every node whose other sizes
        and choices are these (repeated blocks: ResNet-152's 36 identical bottlenecks of a
        stage share theirs), at every split that asks."""
        hit = self.used.get((dims, choices))  # the same dims and choices asked again
        if hit is None:
            kind = (
                tuple(_unnamed(v) for k, v in vars(dims).items() if k not in _SCALED),
                tuple(choices),
            )
            if kind not in self.memos:
                self.memos[kind] = core.memo()
            if len(self.used) >= 1 << 16:
                self.used.clear()
            hit = self.used[(dims, choices)] = (
                self.memos[kind],
                tuple(CHOICE_CODE[c] for c in choices),
            )
        self.memo, self.codes = hit

    def comm(self, group: ArrayNode, dims: LayerDims, choice) -> tuple[float, float]:
        """Each side's seconds for the node's own reduction when both sides have work (0 for a
        BATCH / ROWS weight exchange on collective arrays or with overlap: an enclosing split
        may have paid it, or it may hide behind the work; section 4.2), as the core's
        recursion charges it."""
        tree, i = self.where(group)
        return core.bound_comm(tree, i, *dims.core_figures(), CHOICE_CODE[choice])

    def lb(self, group: ArrayNode, dims: LayerDims, choices) -> float:
        """``LB_group(dims)`` for the node kind in use (``choices`` are that kind's; with none in
        use yet, this node's)."""
        if self.memo is None:
            self.use(dims, choices)
        tree, i = self.where(group)
        try:
            return core.bound_lb(
                tree, self.memo, i, *dims.core_figures(), self.codes, self.grid, self.bpe
            )
        except OverflowError:
            raise _too_deep() from None

    def states(self, group: ArrayNode, dims: LayerDims, table) -> np.ndarray:
        """(2, states): :meth:`lb` of the part each half of ``group`` keeps in every state of
        ``table`` (side 1 at the state's lower share, side 2 at its upper one)."""
        tree, left = self.where(group.left)
        tree_r, right = self.where(group.right)
        if tree_r is not tree:  # (halves of one group live in one tree)
            raise ValueError("a group's halves are in different trees")
        out = np.empty((2, table.size))
        codes = np.array([CHOICE_CODE[c] for c in table.choices], dtype=float)
        try:
            core.bound_states(
                tree,
                self.memo,
                left,
                right,
                *dims.core_figures(),
                self.codes,
                self.grid,
                self.bpe,
                codes,
                np.ascontiguousarray(table.lo, dtype=float),
                np.ascontiguousarray(table.hi, dtype=float),
                table.has[0].astype(float),
                table.has[1].astype(float),
                out,
            )
        except OverflowError:
            raise _too_deep() from None
        return out


def _too_deep() -> TableTooLarge:
    return TableTooLarge(
        f"the per-node bound would ask for more than {BOUND_BUDGET:.3g} bounds on this array (its recursion grows "
        "exponentially with the depth of unbalanced trees); the planners go on without their look-ahead criteria"
    )


def _min_max(a, b, g: int) -> float:
    """min over k in 0..g-1 of max(a(k), b(k)), ``a`` nondecreasing and ``b`` nonincreasing in
    ``k``: a bisection for the first k with a(k) >= b(k)."""
    lo, hi = 0, g - 1
    if a(hi) < b(hi):
        return b(hi)
    while lo < hi:
        mid = (lo + hi) // 2
        if a(mid) >= b(mid):
            hi = mid
        else:
            lo = mid + 1
    return min(a(lo), b(lo - 1)) if lo > 0 else a(lo)


#: Share intervals of the pair bound's free shares (its tables have (3 x (grid + 2))^2 cells).
PAIR_GRID = 8


class _Pair:
    """Memoised ``PB_g(d_w, d_u)``: a lower bound on ``t_g(w) + t_g(u)`` for one edge ``w -> u``
    (docs/costmodel.md section 8, "Pair bound"), whatever the rest of the plan.

    At a group where ``u`` needs of ``w``'s output exactly what the group holds (the root; and
    below, as long as both were split alike), a split either

    - keeps both on one side: ``PB`` of that child;
    - splits both alike (``w`` gives rows / columns at share ``a``, ``u`` needs them at the
      same ``a``): nothing moves between them, both children again hold what they need, so
      ``t(w) + t(u) >= max over sides of (PB of the child + both nodes' own reductions)``;
    - anything else: then each node is bounded alone below (its per-node bound
      ``LB`` of its side's dims), and at this split ``w`` pays the re-layout to ``u`` (the one-split
      formulas of section 3, regions at the ends of their share intervals that make the amount
      smallest; this case also covers the other two's configurations, weakly, except both
      nodes wholly on one side).

    The value is also at least ``LB(w) + LB(u)``."""

    def __init__(
        self,
        problem: Problem,
        w: int,
        u: int,
        fraction: float,
        single: dict,
        grid: int,
        tables: dict | None = None,
    ):
        self.problem, self.w, self.u, self.fraction, self.grid = problem, w, u, fraction, grid
        nodes = problem.planning.nodes
        self.choices = (nodes[w].choices, nodes[u].choices)
        self.single = (single[w], single[u])  # the per-node bounds (their memos kept across edges)
        self.memo: dict[tuple, float] = {}
        self.tables = {} if tables is None else tables  # interval tables, shared across edges
        self.misses = 0  # (group, dims) cells evaluated: the work done

    def _table(self, group: ArrayNode, d: LayerDims, choices, sets, side):
        key = (self.single[0].signature(group), d, choices)
        if key not in self.tables:
            self.tables[key] = _interval_table(d, choices, sets, side)
        return self.tables[key]

    def lb(self, group: ArrayNode, dw: LayerDims, du: LayerDims) -> float:
        bw, bu = self.single
        key = (bw.signature(group), dw, du)
        if key in self.memo:
            return self.memo[key]
        self.misses += 1
        alone = bw.lb(group, dw, self.choices[0]) + bu.lb(group, du, self.choices[1])
        if group.is_leaf:
            self.memo[key] = alone
            return alone
        best = min(
            self.lb(group.left, dw, du),
            self.lb(group.right, dw, du),
            self._aligned(group, dw, du),
            self._apart(group, dw, du),
        )
        self.memo[key] = max(best, alone)
        return self.memo[key]

    def _aligned(self, group: ArrayNode, dw: LayerDims, du: LayerDims) -> float:
        """Both split alike at one share ``a`` in (0, 1): the best over ``a`` of the max over
        sides (each side's term is monotone in ``a``)."""
        from parplan.costmodel.layout import ports

        bw, bu = self.single
        same = group.interchangeable_halves
        best = math.inf
        for cw in self.choices[0]:
            for cu in self.choices[1]:
                layout = ports(cw).give_out
                if layout is Layout.WHOLE or ports(cu).need_in is not layout:
                    continue
                w1, w2 = bw.comm(group, dw, cw)
                u1, u2 = bu.comm(group, du, cu)
                if same:  # the best share is 1/2 (each side's term is monotone in its share)
                    best = min(
                        best,
                        self.lb(group.left, _scaled(dw, cw, 0.5, 0), _scaled(du, cu, 0.5, 0))
                        + max(w1 + u1, w2 + u2),
                    )
                    continue
                g = self.grid

                def a(k, cw=cw, cu=cu, c=w1 + u1):  # the left side at the interval's lower end
                    return (
                        self.lb(group.left, _scaled(dw, cw, k / g, 0), _scaled(du, cu, k / g, 0))
                        + c
                    )

                def b(k, cw=cw, cu=cu, c=w2 + u2):  # the right side at the interval's upper end
                    x = (k + 1) / g
                    return self.lb(group.right, _scaled(dw, cw, x, 1), _scaled(du, cu, x, 1)) + c

                best = min(best, _min_max(a, b, g))
        return best

    def _apart(self, group: ArrayNode, dw: LayerDims, du: LayerDims) -> float:
        """Split otherwise: each node bounded alone below, ``w`` paying the re-layout here."""
        import numpy as np

        from parplan.costmodel.cost import ShareMode, node_terms, share_intervals, share_points

        side = self.problem.side_spec(group)
        sets = share_intervals(share_points(side, ShareMode.FREE, self.grid))
        tw, tu = (
            self._table(group, d, c, sets, side)
            for d, c in ((dw, self.choices[0]), (du, self.choices[1]))
        )
        iw, iu = np.arange(tw.size)[:, None], np.arange(tu.size)[None, :]
        leaf_pair = bool(group.left.is_leaf and group.right.is_leaf)
        mine = node_terms(
            [tw, tu],
            side,
            # the forward once: a block's recomputation sending it again only adds (a bound)
            [(self.fraction * du.in_elements, (1,), 1.0)],
            0,
            {0: iw, 1: iu},
            None,
            leaf_pair,
        )
        theirs = node_terms([tu], side, [], 0, {0: iu}, None, leaf_pair)
        total = 0.0
        for tab, bound, choices, d, comm in (
            (tw, self.single[0], self.choices[0], dw, mine.comm),
            (tu, self.single[1], self.choices[1], du, theirs.comm),
        ):
            # each side's bound at the end of the state's share interval that leaves it least work
            kids = [
                np.array(
                    [
                        bound.lb(half, side_dims(d, c, float(x), i, bool(h)), choices)
                        for c, x, h in zip(tab.choices, ends, tab.has[i])
                    ]
                ).reshape(-1, 1)
                for i, (half, ends) in enumerate(((group.left, tab.lo), (group.right, tab.hi)))
            ]
            if tab is tu:
                kids = [k.T for k in kids]
            total = total + np.maximum(kids[0] + comm[0], kids[1] + comm[1])
        # both entirely on one side: the one-side branches of lb, in the children's frames
        both = (
            (tw.lo[:, None] == tw.hi[:, None])
            & (tu.lo[None, :] == tu.hi[None, :])
            & (tw.lo[:, None] == tu.lo[None, :])
        )
        return float(np.where(both, np.inf, total).min())


def _interval_table(d: LayerDims, choices, sets, side):
    """The state table of ``choices`` x share intervals ``sets`` for communication only: built
    at each interval's midpoint (same work flags, so the same reductions) with the interval's
    ends put back; its compute columns are unused (the bound takes the children's bounds)."""
    import numpy as np

    from parplan.costmodel.cost import StateTable

    mids = tuple((x.lo + x.hi) / 2 for x in sets)
    t = StateTable.build(d, True, choices, mids, side, None, (False, False))
    k = len(choices)
    return replace(t, lo=np.tile([x.lo for x in sets], k), hi=np.tile([x.hi for x in sets], k))


def _scaled(d: LayerDims, choice, a: float, i: int) -> LayerDims:
    """Side ``i``'s dims of a node at side-1 share ``a`` (both sides have work)."""
    return scale_for_sides(d, choice, a)[i]


def pair_gains(
    problem: Problem,
    per_node: tuple[float, ...],
    grid: int = PAIR_GRID,
    solver: _Bound | None = None,
    budget: int | None = None,
) -> dict[tuple[int, int], float]:
    """Per edge ``(w, u)``: how much :class:`_Pair` raises ``t(w) + t(u)`` above the two
    per-node bounds ``per_node`` at the root (>= 0). Edges are taken largest tensor first;
    with a ``budget``, no edge is started once that many (group, dims) cells have been
    evaluated, and the edges left out get no gain (each gain bounds its own edge, so any
    subset still gives a bound). ``solver``: per-node bounds whose memos to share."""
    pg = problem.planning
    dims = problem.root_dims()
    solver = solver or _Bound(problem, DEFAULT_BOUND_GRID)
    edges = []
    for w in range(len(pg.nodes)):
        fractions: dict[int, float] = {}
        for v, port in pg.out_edges[w]:
            fractions[v] = max(fractions.get(v, 0.0), pg.nodes[v].fractions[port])
        edges.extend((w, u, fraction) for u, fraction in fractions.items())
    edges.sort(key=lambda e: -e[2] * dims[e[1]].in_elements)
    single: dict[int, _Bound] = {}
    tables: dict = {}
    gains = {}
    work = 0
    for w, u, fraction in edges:
        if budget is not None and work >= budget:
            break
        for x in (w, u):
            if x not in single:
                single[x] = solver.twin()
                single[x].use(dims[x], pg.nodes[x].choices)
        pair = _Pair(problem, w, u, fraction, single, grid, tables)
        value = pair.lb(problem.array, dims[w], dims[u])
        work += pair.misses
        gains[(w, u)] = max(0.0, value - per_node[w] - per_node[u])
    return gains


def matching_gain(gains: dict[tuple[int, int], float]) -> float:
    """The largest sum of gains over edges no two of which share a node: for such a set ``M``,
    ``sum_v t(v) >= sum_v LB(v) + sum_(e in M) gain(e)`` (each node's time counted once)."""
    import networkx as nx

    g = nx.Graph()
    for (w, u), gain in gains.items():
        if gain > 0.0 and w != u and gain > g.get_edge_data(w, u, {"weight": 0.0})["weight"]:
            g.add_edge(w, u, weight=gain)
    return float(sum(g[w][u]["weight"] for w, u in nx.max_weight_matching(g)))


def raised_tables(
    problem: Problem,
    sp,
    options,
    relaxed: bool = False,
    solver: _Bound | None = None,
    per_node: list | None = None,
    group: ArrayNode | None = None,
):
    """The state tables of split ``sp`` (of ``group``, default the root) with each side's
    compute for a node raised to ``max`` of its compute on one summed device and the per-node
    bound of :func:`hierarchy_bound` for that half (at the share that leaves the half least
    work, for an interval state). Both are lower bounds on the half's time, so a DP over these
    tables still bounds (``relaxed``) or estimates the split better: a half is no longer
    assumed to reach its summed throughput when its own reductions would cost more than they
    save. ``per_node``: a list that receives each node's :func:`hierarchy_bound` term at
    ``group`` too, from the same memo (one pass for both). ``solver``: bounds to reuse (their
    memos stay valid across splits)."""
    from parplan.costmodel.split import split_tables

    array = group if group is not None else problem.array
    tables = split_tables(sp, options, relaxed)
    solver = solver or _Bound(problem, DEFAULT_BOUND_GRID)
    raised = []
    # alike nodes (the same table, dims and choices objects: a transformer's repeated blocks, a
    # chain's equal layers) get one raised table object, so the DP prices their factors once per
    # class (split.node_classes reads the tables' identities) as it does on the plain tables;
    # the objects are kept across splits (the solver's memo), so a split met again with other
    # floors, or at an interchangeable group, finds its factors priced (split's memo of terms)
    seen = solver.raised
    sig = solver.signature(array)
    for v, (node, t) in enumerate(zip(problem.planning.nodes, tables)):
        d = sp.dims[v]
        if per_node is not None:
            solver.use(d, node.choices)
            per_node.append(solver.lb(array, d, node.choices))
        key = (id(t), id(d), id(node.choices), sig)
        hit = seen.get(key)
        if hit is None:
            if len(seen) >= RAISED_MEMO_MAX:
                seen.clear()
            # the entry holds the table, dims and choices whose ids key it
            hit = seen[key] = (t, d, node.choices, _raised(solver, array, d, node.choices, t))
        raised.append(hit[3])
    return raised


#: Raised state tables a :class:`_Bound` keeps (:func:`raised_tables`); cleared past it.
RAISED_MEMO_MAX = 1 << 15


def root_split_bound(problem: Problem, sp, split, solver: _Bound | None = None) -> float:
    """A lower bound on the step time of every plan whose root split is ``split`` (``sp``: the
    root's :class:`~parplan.costmodel.split.SplitProblem`): the root split's time, summed over
    the nodes, with each half's compute for a node taken on one device of the half's summed
    throughput (the published recursion's view), or, with ``solver``, raised to the half's
    per-node bound (:func:`fixed_splits_bound` with the root alone planned). Both are lower
    bounds on the half's time for the node, and a side's time grows with its work. The split's
    terms are those the hierarchy prices next (:func:`split_terms`' memo)."""
    from parplan.costmodel.cost import overlap_time

    if solver is not None:
        return fixed_splits_bound(problem, {"": (sp, split)}, solver, {})
    comm, weight, work = _split_figures(sp, split)
    times = overlap_time(work, comm, weight)
    return math.fsum(np.maximum(times[:, 0], times[:, 1]).tolist())


def _split_figures(sp, split) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(comm, weight, work): each node's seconds received, weight traffic and compute on one
    device of each half's summed throughput at ``split``, (n, 2) each: the evaluator's terms
    (:func:`split_terms`, whose memo the hierarchy then meets)."""
    from parplan.costmodel.cost import terms_matrix
    from parplan.costmodel.split import split_terms

    terms = split_terms(sp, split.choices, split.shares)
    figures = terms_matrix(terms)
    work = np.array([(float(t.compute[0]), float(t.compute[1])) for t in terms]).reshape(-1, 2)
    return figures[:, 0:2], figures[:, 6:8], work


def fixed_splits_bound(problem: Problem, planned: dict, solver: _Bound, memo: dict) -> float:
    """A lower bound on the step time of every plan whose splits at the paths of ``planned``
    are these (``planned``: path -> (the group's :class:`~parplan.costmodel.split.SplitProblem`,
    its split); the root's among them, and each group's parent's): the evaluator's recursion of
    node times (docs/costmodel.md section 7) through the planned splits, with each group below
    them at its per-node bound (:meth:`_Bound.lb`) and at least its compute on one device of
    its summed throughput (the split's own terms). Every group's time for a node grows with
    its work, so each is a lower bound on that group's time in any such plan, and so is the
    sum at the root. With the root alone planned this is :func:`root_split_bound`'s raised
    bound; a criterion's splits below the root raise it to what they pay (the ``accpar``
    portfolio stops a criterion once it exceeds the best plan so far, docs/costmodel.md
    section 7). ``memo``: kept across calls while ``planned`` only grows (the planned splits'
    terms, the bounds of the groups below them, and each group's times until a split below it
    is planned)."""
    from parplan.costmodel.cost import overlap_time
    from parplan.costmodel.split import child_dims

    nodes = problem.planning.nodes
    figures, frontier, times_of = (memo.setdefault(k, {}) for k in ("split", "frontier", "times"))
    # the splits planned since the last call (``planned`` only grows): their groups' times and
    # every group's above them change
    for path in itertools.islice(planned, memo.get("seen", 0), None):
        for k in range(len(path) + 1):
            times_of.pop(path[:k], None)
    memo["seen"] = len(planned)

    def split_figures(path: str):
        hit = figures.get(path)
        if hit is None:
            sp, split = planned[path]
            hit = figures[path] = (*_split_figures(sp, split), child_dims(sp.dims, split))
        return hit

    def below(group: ArrayNode, path: str, dims) -> np.ndarray:
        """Per node, the group's per-node bound at ``dims`` (alike nodes: one bound)."""
        hit = frontier.get(path)
        if hit is None or hit[0] is not dims:
            seen: dict = {}
            out = []
            for d, node in zip(dims, nodes):
                key = (id(d), id(node.choices))
                lb = seen.get(key)
                if lb is None:
                    solver.use(d, node.choices)
                    lb = seen[key] = solver.lb(group, d, node.choices)
                out.append(lb)
            hit = frontier[path] = (dims, np.array(out))
        return hit[1]

    def times(group: ArrayNode, path: str) -> np.ndarray:
        hit = times_of.get(path)
        if hit is not None:
            return hit
        comm, weight, work, halves = split_figures(path)
        work = work.copy()
        for i, (half, side) in enumerate(((group.left, "L"), (group.right, "R"))):
            if half.is_leaf:
                continue  # a device: its compute is the split's own term
            sub = path + side
            t = times(half, sub) if sub in planned else below(half, sub, halves[i])
            work[:, i] = np.maximum(work[:, i], t)
        t = overlap_time(work, comm, weight)
        out = times_of[path] = np.maximum(t[:, 0], t[:, 1])
        return out

    return math.fsum(times(problem.array, "").tolist())


def _raised(solver: _Bound, array: ArrayNode, d: LayerDims, choices, table):
    """``table`` (a node with dims ``d`` at the split of ``array``) with each side's compute
    raised to that half's per-node bound in every state (side 1 at the state's lower share,
    side 2 at its upper one): the raise of :func:`raised_tables`."""
    solver.use(d, choices)
    lbs = solver.states(array, d, table)
    return replace(
        table,
        compute=np.maximum(table.compute, lbs),
        steps=np.maximum(table.steps, lbs[:, :, None]),
    )


def root_continuous_bound(
    problem: Problem, solver: _Bound | None = None, time_limit_s: float = ROOT_SEARCH_S
) -> float:
    """:func:`root_dp_bound` with the root split's shares searched continuously: the
    branch-and-bound of :mod:`parplan.solvers.continuous` over :func:`raised_tables`' states,
    whose proven lower bound only rises as it cuts the share intervals (docs/costmodel.md
    section 8, "Root-split bound, searched"). ``time_limit_s``: wall seconds of the search."""
    from parplan.costmodel.split import PlanOptions, SplitProblem
    from parplan.solvers.continuous import continuous_split

    sp = SplitProblem.root(problem)
    solver = solver or _Bound(problem, DEFAULT_BOUND_GRID)
    nodes = problem.planning.nodes

    def raise_(v: int, table):
        return _raised(solver, problem.array, sp.dims[v], nodes[v].choices, table)

    found = continuous_split(sp, PlanOptions(), time_limit_s=time_limit_s, raise_table=raise_)
    return found.bound_s


def root_dp_bound(problem: Problem, share_grid: int = DEFAULT_SHARE_GRID) -> float:
    """A second global bound that keeps the root split's re-layouts: the interval relaxation of
    the root split (docs/costmodel.md section 8, every re-layout between nodes priced at the
    ends of its share intervals that make it smallest) over :func:`raised_tables`. Tighter
    where a plan cannot use both halves for some layers without moving activations between
    them (the per-node bound lets each layer choose alone)."""
    return _both(problem, share_grid)[1]


def _both(
    problem: Problem,
    share_grid: int = DEFAULT_SHARE_GRID,
    solver: _Bound | None = None,
    search_s: float = 0.0,
) -> tuple[GlobalBound, float]:
    """(:func:`hierarchy_bound`, :func:`root_dp_bound`) in one pass over the nodes; with
    ``search_s`` > 0 the second is at least :func:`root_continuous_bound` (searched that long)."""
    from parplan.costmodel.split import PlanOptions, SplitProblem
    from parplan.solvers.dp import frontier_dp

    if problem.array.is_leaf:
        per_node = hierarchy_bound(problem)
        return per_node, per_node.bound_s
    _check(problem)
    sp = SplitProblem.root(problem)
    options = PlanOptions(share_grid=share_grid)
    nodes: list[float] = []
    tables = raised_tables(problem, sp, options, relaxed=True, per_node=nodes, solver=solver)
    per_node = GlobalBound(math.fsum(nodes), tuple(nodes), DEFAULT_BOUND_GRID)
    try:
        root = frontier_dp(sp, options, relaxed=True, tables=tables)[0]
    except (
        TableTooLarge
    ):  # a node read by many consumers: the per-node bound alone is still a bound
        return per_node, per_node.bound_s
    if search_s > 0:
        try:
            root = max(root, root_continuous_bound(problem, solver, search_s))
        except TableTooLarge:
            pass  # the grid relaxation's value stands
    return per_node, root


def _check(problem: Problem) -> None:
    if problem.compat is not None:
        raise ConfigError(
            f"the global bound is for parplan's own cost model (the problem uses compat "
            f"'{problem.compat}')"
        )


def hierarchy_bound(problem: Problem, share_grid: int = DEFAULT_BOUND_GRID) -> GlobalBound:
    """The global lower bound of the module doc for ``problem`` (shares anywhere in [0, 1]).
    Raises :class:`~parplan.errors.ConfigError` for a compat problem (a paper's pricing rule
    can price a reduction below parplan's, which this bound assumes)."""
    _check(problem)
    dims = problem.root_dims()
    solver = _Bound(problem, share_grid)
    nodes = []
    for v, (node, d) in enumerate(zip(problem.planning.nodes, dims)):
        solver.use(d, node.choices)
        nodes.append(solver.lb(problem.array, d, node.choices))
    total = math.fsum(nodes)
    return GlobalBound(total, tuple(nodes), share_grid)


def node_bounds(problem: Problem) -> _Bound:
    """Memoised per-node bounds ``LB_g(d)`` for any group of ``problem.array`` (for
    :func:`raised_tables` at many splits: one memo per node, kept across them)."""
    return _Bound(problem, DEFAULT_BOUND_GRID)


#: Arrays up to this many devices get the whole pair bound (:func:`pair_bound`): on 16 H100s
#: it costs 0.1-1 s per zoo CNN.
PAIR_MAX_DEVICES = 32
#: Larger arrays get it within a budget of this many (group, dims) cells, edges with the largest
#: tensors first: on tpu-v2:64,tpu-v3:64 a cell costs about 1 ms (about 1,000 per edge), so
#: about 5 s per model. LeNet, LeNet-C and CIFAR-C finish within it and their bounds rise
#: 2-5%; on the larger networks the root-split bound is the higher one anyway.
PAIR_BUDGET = 5_000


def pair_bound(
    problem: Problem,
    per_node: GlobalBound | None = None,
    solver: _Bound | None = None,
    budget: int | None = None,
) -> float:
    """The per-node bound raised by the pair bound's gains over a maximum matching of the edges
    (docs/costmodel.md section 8, "Pair bound"): re-layouts between a node and one consumer at
    every level where the two are split apart. ``budget``: see :func:`pair_gains`."""
    _check(problem)
    per_node = per_node or hierarchy_bound(problem)
    if problem.array.is_leaf:
        return per_node.bound_s
    return per_node.bound_s + matching_gain(
        pair_gains(problem, per_node.node_s, solver=solver, budget=budget)
    )


def layer_excess(node_time_s, bound: GlobalBound) -> list[float]:
    """Per node, how far its time in a plan (``node_time_s``, the evaluator's) lies above its own
    per-node bound (``bound.node_s``; 0 where it does not): where a plan's gap sits."""
    return [max(0.0, t - b) for t, b in zip(node_time_s, bound.node_s)]


def pinned_node_bounds(problem: Problem, plan, solver: _Bound | None = None) -> tuple[float, ...]:
    """Per node, its per-node bound with the node pinned to ``plan``'s states (choice and share
    at every group; docs/costmodel.md section 8, "Where a gap sits"): the recursion of ``LB``
    with no choice left, i.e. the node's own terms in the plan (compute at the devices, its own
    reductions and latency) without any transfer between layers. For every node
    ``LB(v) <= pinned(v) <= t_plan(v)``: above the per-node bound is what the plan's states
    cost in the node's own terms; above ``pinned`` what the plan pays to move data between
    layers, which any plan with those states pays too."""
    _check(problem)
    solver = solver or node_bounds(problem)
    dims = problem.root_dims()
    out = []
    for node, d in zip(problem.planning.nodes, dims):
        solver.use(d, node.choices)
        v = len(out)
        out.append(_pinned(solver, problem.array, "", d, plan, v, node.choices))
    return tuple(out)


def excess_parts(node_time_s, node_bound_s, pinned_s) -> list[tuple[float, float]]:
    """Per node, its time's excess over its per-node bound in two parts (docs/costmodel.md
    section 8, "Where a gap sits"): (what the plan's states cost in its own terms, what the plan
    pays to move data between layers), from its time in the plan (the evaluator's), its bound
    and its bound pinned to the plan (:func:`pinned_node_bounds`)."""
    return [
        (max(0.0, q - b), max(0.0, t - max(q, b)))
        for t, b, q in zip(node_time_s, node_bound_s, pinned_s)
    ]


def _pinned(solver: _Bound, group: ArrayNode, path: str, d: LayerDims, plan, v: int, choices):
    if group.is_leaf:
        return solver.lb(group, d, choices)  # a device's compute
    if path not in plan.splits:
        raise ConfigError(f"plan has no split for group '{path or 'root'}'")
    split = plan.splits[path]
    c, a = split.choices[v], float(split.shares[v])
    halves = scale_for_sides(d, c, a)
    work = [a > 0.0, a < 1.0]
    if not all(work):  # one side does it all: no reduction between them
        i = 0 if work[0] else 1
        return _pinned(
            solver, (group.left, group.right)[i], path + "LR"[i], halves[i], plan, v, choices
        )
    comm = solver.comm(group, d, c)
    return max(
        _pinned(solver, half, path + key, h, plan, v, choices) + cm
        for half, key, h, cm in zip((group.left, group.right), "LR", halves, comm)
    )


def global_bound(problem: Problem) -> GlobalBound:
    """The best of :func:`hierarchy_bound`, :func:`root_continuous_bound` (the root split's
    bound searched over continuous shares, at least :func:`root_dp_bound`) and :func:`pair_bound` (whole
    on arrays of at most :data:`PAIR_MAX_DEVICES` devices, within :data:`PAIR_BUDGET` above):
    all are lower bounds on every plan; ``node_s`` stays the per-node bound's split of its own
    total."""
    solver = None if problem.array.is_leaf else node_bounds(problem)
    per_node, root = _both(problem, solver=solver, search_s=ROOT_SEARCH_S)
    best = root
    if not problem.array.is_leaf:
        budget = None if problem.array.count <= PAIR_MAX_DEVICES else PAIR_BUDGET
        best = max(best, pair_bound(problem, per_node, solver, budget))
    if best > per_node.bound_s:
        return GlobalBound(best, per_node.node_s, per_node.share_grid)
    return per_node
