"""One split as a planning problem, and its price (docs/costmodel.md sections 3-8).

:class:`PlanOptions` are a planner's settings (objective, share mode, allowed choices, share
grid); :class:`SplitProblem` is one split to plan (the planning graph, every node's sizes at
this level, the two sides, the sibling floors). The DP, the MIP and brute force all minimise
:func:`price_split` over the same states; :func:`node_factor` gives the cost table of one
node over its factor's scope (the node and its consumers).

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> sp = SplitProblem.root(Problem(get_model("lenet"), parse_array("h100:2"), batch=64))
    >>> opts = PlanOptions(share_grid=4)
    >>> tables = split_tables(sp, opts)
    >>> tables[0].size  # 3 types x 3 shares inside (0, 1), and one state each for 0 and 1
    11
    >>> scope, values = node_factor(sp, tables, 0, opts)
    >>> scope, values.shape
    ((0, 1), (11, 11))
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from parplan.costmodel.cost import (
    clear_scaled,
    compat_rules,
    DEFAULT_SHARE_GRID,
    NodeTerms,
    Objective,
    ShareMode,
    SideSpec,
    StateTable,
    cuts_below,
    floored_time,
    node_terms,
    node_value,
    node_values,
    output_groups,
    share_intervals,
    scale_for_sides,
    share_points,
)
from parplan.costmodel.dims import HashedTuple, LayerDims, by_identity, clear_compute
from parplan.costmodel.layout import Choice
from parplan.costmodel.planning import PlanNode, PlanningGraph
from parplan.costmodel.regions import ROOT, Region, child_region, clear_regions, framed
from parplan.errors import ConfigError, TableTooLarge

#: Largest share grid a planner accepts (states per node grow as 3 x grid).
MAX_SHARE_GRID = 1024
#: Largest cost table of one node (its states times its consumers' states).
MAX_FACTOR_CELLS = 2 * 10**7


def all_choices(node: PlanNode) -> tuple[Choice, ...]:
    """Every choice of a node (three types, or three join layouts)."""
    return node.choices


@dataclass(frozen=True)
class PlanOptions:
    """Planner settings: objective, share mode, which choices each node may take, and the share
    grid (free shares are multiples of ``1/share_grid``, plus the proportional share)."""

    objective: Objective = Objective.TIME
    shares: ShareMode = ShareMode.FREE
    allowed: Callable[[PlanNode], tuple[Choice, ...]] = field(default=all_choices)
    share_grid: int = DEFAULT_SHARE_GRID
    #: Seconds added per unit of memory a state keeps, as a fraction of its side's capacity
    #: (summed over both sides; docs/costmodel.md section 6.2): the Lagrangian price with which
    #: :mod:`parplan.solvers.fit` steers a planner towards plans that fit. 0: memory is free.
    memory_price: float = 0.0

    def __post_init__(self):
        if self.objective is Objective.COMMUNICATION and self.shares is ShareMode.FREE:
            raise ConfigError(
                "objective 'communication' needs fixed shares (free shares would put all work on one "
                "side to move nothing): use shares 'half' or 'proportional'"
            )
        g = self.share_grid
        if (
            isinstance(g, bool)
            or not isinstance(g, (int, np.integer))
            or not 1 <= g <= MAX_SHARE_GRID
        ):
            raise ConfigError(f"share_grid must be an integer in [1, {MAX_SHARE_GRID}] (got {g!r})")
        m = self.memory_price
        if (
            isinstance(m, bool)
            or not isinstance(m, (int, float, np.number))
            or not 0.0 <= m < float("inf")
        ):
            raise ConfigError(f"memory_price must be a finite number >= 0 (got {m!r})")

    def choices(self, node: PlanNode) -> tuple[Choice, ...]:
        allowed = tuple(self.allowed(node))
        if not allowed:
            raise ConfigError(f"node '{node.name}': the planner allows no choice for it")
        return allowed


def child_dims(dims: tuple[LayerDims, ...], split) -> tuple[tuple[LayerDims, ...], ...]:
    """The dims left to each side by ``split`` (each dims object, choice and share looked up
    once: a transformer's repeated blocks below the root are the same objects). Remembered by
    the identities of ``dims`` and the split's tuples (:func:`~parplan.costmodel.dims.
    by_identity`): the evaluator re-pricing a planned split gets the planner's very tuples."""

    def make():
        seen: dict = {}
        pairs = []
        for d, c, a in zip(dims, split.choices, split.shares):
            key = (id(d), c, a)
            pair = seen.get(key)
            if pair is None:
                pair = seen[key] = scale_for_sides(d, c, a)
            pairs.append(pair)
        return HashedTuple(p[0] for p in pairs), HashedTuple(p[1] for p in pairs)

    return by_identity(_CHILD_DIMS, (dims, split.choices, split.shares), len(dims), make)


#: The identity memos (:func:`~parplan.costmodel.dims.by_identity`) of :func:`child_dims`,
#: :meth:`SplitProblem.child_cuts` and :meth:`SplitProblem.child_regions`.
_CHILD_DIMS: dict = {}
_CHILD_CUTS: dict = {}
_CHILD_REGIONS: dict = {}


@dataclass(frozen=True)
class SplitProblem:
    """One split to plan: the planning graph, every node's dims at this level, the cost view."""

    planning: PlanningGraph
    dims: tuple[LayerDims, ...]
    side: SideSpec
    path: str = ""
    #: Per-node time (s) below which this split gains nothing: the sibling group's time for the
    #: node at the parent split (a node's time there is the max over both groups). None = 0.
    floor_s: tuple[float, ...] | None = None
    #: Per node: an enclosing split chose BATCH and paid the all-reduce (collective arrays only).
    covered: tuple[bool, ...] | None = None
    #: Per node: its region at this group (docs/costmodel.md section 3); None at the root.
    regions: tuple[Region, ...] | None = None
    #: Every node's dims at the root (tensor sizes of the region algebra); None: ``dims``.
    root_dims: tuple[LayerDims, ...] | None = None
    #: Both sides are single devices (they pre-sum gradients of several consumers).
    leaf_pair: bool = True
    #: Per node: a split above divided its rows / output columns with work on both sides
    #: (:func:`~parplan.costmodel.cost.cuts_below`); None at the root.
    above: tuple[tuple[bool, bool], ...] | None = None

    def cuts(self, v: int) -> tuple[bool, bool]:
        return self.above[v] if self.above is not None else (False, False)

    def child_cuts(self, split) -> tuple[tuple[bool, bool], ...]:
        """``above`` for the children of ``split`` (remembered as :meth:`child_regions` is)."""
        n = len(self.dims)
        above = self.above if self.above is not None else ((False, False),) * n
        return by_identity(
            _CHILD_CUTS,
            (self.above, split.choices, split.shares),  # the choices' identity fixes n
            n,
            lambda: HashedTuple(cuts_below(above, split)),
        )

    @classmethod
    def root(cls, problem) -> "SplitProblem":
        a = problem.array
        return cls(
            problem.planning,
            problem.root_dims(),
            problem.side_spec(a),
            "",
            leaf_pair=bool(a.left.is_leaf and a.right.is_leaf),
        )

    def child_regions(self, split, only=None) -> tuple[tuple[Region, ...], tuple[Region, ...]]:
        """Every node's region on each side of ``split`` (with ``only``: those nodes'; the
        others keep their region here, unused). Remembered for whole splits by the identity of
        the regions and the split's tuples, so the evaluator, re-pricing a plan, gets the very
        tuples its planner got (and the memos keyed on them hit by identity)."""
        n = len(self.dims)
        regs = self.regions if self.regions is not None else (ROOT,) * n

        def make():
            return tuple(
                HashedTuple(
                    child_region(r, c, a, side) if only is None or v in only else r
                    for v, (r, c, a) in enumerate(zip(regs, split.choices, split.shares))
                )
                for side in (0, 1)
            )

        if only is not None:
            return make()
        args = (self.regions, split.choices, split.shares)  # the choices' identity fixes n
        return by_identity(_CHILD_REGIONS, args, n, make)

    def is_covered(self, v: int) -> bool:
        return bool(self.covered[v]) if self.covered is not None else False

    def floor(self, v: int, options: PlanOptions) -> float:
        if self.floor_s is None or options.objective is not Objective.TIME:
            return 0.0
        return float(self.floor_s[v])

    @property
    def frames(self) -> tuple[tuple[Region, ...] | None, bool]:
        """(regions, leaf_pair) the costs use. Under ``compat="accpar-code"`` every split is
        priced in its own frame (each node's region at this group taken as the whole
        tensor) and every side pre-sums gradients, as the published AccPar code prices a level
        (docs/costmodel.md section 9)."""
        if "accpar-code" in compat_rules(self.side.compat):
            return None, True
        return self.regions, self.leaf_pair

    def groups(self, u: int):
        """The tensors ``u`` sends, at the root's sizes (areas are fractions of the root's;
        under ``compat="accpar-code"`` at this group's sizes, in its own frame)."""
        return _sent(self, u)[1]


def split_tables(sp: SplitProblem, options: PlanOptions, relaxed: bool = False) -> list[StateTable]:
    """Every node's states (allowed choices x share points, less exact equivalents:
    :attr:`StateTable.distinct`) with their per-state terms.

    ``relaxed``: the states are the intervals between the points instead (and the points 0
    and 1), priced by their minima: a plan over them costs at most what any plan with shares
    anywhere in those intervals costs (docs/costmodel.md section 8)."""
    shares = share_points(sp.side, options.shares, options.share_grid)
    if relaxed:
        shares = share_intervals(shares)
    one: dict = {}  # one tuple object per set of choices: _tables' classes read ids
    choices = [one.setdefault(c, c) for c in map(options.choices, sp.planning.nodes)]
    tables = _tables(sp, choices, [shares] * len(sp.dims))
    if compat_rules(sp.side.compat):  # the papers' rules price a split at its own terms
        return tables
    return [t.distinct for t in tables]


def _tables(sp: SplitProblem, choices, shares, nodes=None) -> list:
    """Each node's :meth:`StateTable.build` (of ``nodes``; None for the others) at this split:
    nodes with the same dims object and the same states (repeated blocks, below the root) get
    the table found for the first without rebuilding the memo's key (for a whole split, the
    classes are found in one numpy pass over those objects' identities)."""
    hypar = "hypar" in compat_rules(sp.side.compat)
    n = len(sp.dims)
    if nodes is None and not hypar and n >= NUMPY_CLASSES:  # a whole split's classes at once
        ids = lambda xs: np.fromiter(map(id, xs), dtype=np.int64, count=n)  # noqa: E731
        cols = [ids(sp.dims), ids(choices), ids(shares)]
        if sp.covered is not None:
            cols.append(np.asarray(sp.covered, dtype=np.int64))
        if sp.above is not None:
            cols.append(np.array([2 * a + b for a, b in sp.above], dtype=np.int64))
        first, inverse = _row_classes(np.stack(cols, axis=1))
        built = [
            StateTable.build(
                sp.dims[v], sp.is_covered(v), choices[v], shares[v], sp.side, None, sp.cuts(v)
            )
            for v in first.tolist()
        ]
        return [built[c] for c in inverse.tolist()]
    seen: dict = {}
    out: list = [None] * n
    for v in range(n) if nodes is None else nodes:
        covered, cuts = sp.is_covered(v), sp.cuts(v)
        reduction = compat_reduction_elements(sp, v) if hypar else None
        key = (id(sp.dims[v]), covered, id(choices[v]), id(shares[v]), reduction, cuts)
        table = seen.get(key)
        if table is None:
            table = seen[key] = StateTable.build(
                sp.dims[v], covered, choices[v], shares[v], sp.side, reduction, cuts
            )
        out[v] = table
    return out


def compat_reduction_elements(sp: SplitProblem, v: int) -> float | None:
    """Under ``compat="hypar"``: the size of node ``v``'s output as its consumers read it (after
    any pooling; the largest tensor it sends), which HyPar prices an IN reduction at. None
    otherwise, and for a node without consumers."""
    if "hypar" not in compat_rules(sp.side.compat):
        return None
    sizes = [size for size, _, _ in output_groups(sp.planning, sp.dims, v)]
    return max(sizes) if sizes else None


def factor_scope(planning: PlanningGraph, u: int) -> tuple[int, ...]:
    """Node ``u`` and its distinct consumers, in index order: what ``u``'s cost depends on."""
    return (u,) + tuple(sorted(set(planning.succs[u])))


#: (id of the planning graph, id of the dims its tensor sizes come from) -> (graph, dims, per
#: node: None or (scope, the tensors it sends, its consumers, the memo key's part of them), and
#: :func:`_layout`'s arrays under "layout").
#: What a node sends depends only on the graph and those dims, which every split of a problem
#: shares (the root's); the entry holds both objects, so their ids stay theirs.
_SENT: OrderedDict = OrderedDict()
_SENT_MAX = 16


def _sent(sp: SplitProblem, u: int):
    """(``u``'s factor scope, the tensors it sends (:func:`output_groups`), its consumers, the
    memo key's part of them), computed once per graph and dims (and the list of them kept on
    ``sp`` too: the DP asks for every node of a split several times)."""
    entry = sp.__dict__.get("_sent")
    if entry is None:
        own = sp.root_dims is None or "accpar-code" in compat_rules(sp.side.compat)
        dims = sp.dims if own else sp.root_dims
        key = (id(sp.planning), id(dims))
        entry = _SENT.get(key)
        if entry is None:
            entry = _SENT[key] = (sp.planning, dims, [None] * len(sp.planning.nodes), {})
            if len(_SENT) > _SENT_MAX:
                _SENT.popitem(last=False)
        object.__setattr__(sp, "_sent", entry)  # not a field: equality and hash ignore it
    dims, per_node = entry[1], entry[2]
    if per_node[u] is None:
        scope = factor_scope(sp.planning, u)
        groups = output_groups(sp.planning, dims, u)
        place = {w: i for i, w in enumerate(scope)}
        per_node[u] = (
            scope,
            groups,
            tuple(dict.fromkeys(v for _, vs, _ in groups for v in vs)),
            tuple((size, tuple(place[v] for v in vs), fwd) for size, vs, fwd in groups),
        )
    return per_node[u]


def check_factor_size(
    sp: SplitProblem, tables, u: int, options: PlanOptions, max_cells: float = MAX_FACTOR_CELLS
) -> None:
    """Raise :class:`TableTooLarge` if node ``u``'s factor (:func:`node_factor`) would have
    more than ``max_cells`` cells (at most :data:`MAX_FACTOR_CELLS`). Planners check every
    node before pricing any, so a split that cannot be planned prices nothing."""
    scope = _sent(sp, u)[0]
    cells = 1.0
    for w in scope:
        cells *= tables[w].size
    limit = min(max_cells, MAX_FACTOR_CELLS)
    if cells > limit:
        raise TableTooLarge(
            f"graph '{sp.planning.name}': node '{sp.planning.nodes[u].name}' feeds {len(scope) - 1} consumers, and "
            f"its cost table would have {cells:.3g} cells (limit {limit:.3g}); use a coarser --share-grid "
            f"(now {options.share_grid})"
        )


def node_factor(
    sp: SplitProblem,
    tables,
    u: int,
    options: PlanOptions,
    max_cells: float = MAX_FACTOR_CELLS,
    checked: bool = False,
) -> tuple[tuple[int, ...], np.ndarray]:
    """(scope, table): node ``u``'s objective value for every state of every node in its scope
    (:class:`TableTooLarge` above ``max_cells``, at most :data:`MAX_FACTOR_CELLS`; ``checked``:
    the caller has already run :func:`check_factor_size`)."""
    scope, raw, floor = floorless_factor(sp, tables, u, options, max_cells, checked)
    return scope, floored_time(raw, floor)


def floorless_factor(
    sp: SplitProblem,
    tables,
    u: int,
    options: PlanOptions,
    max_cells: float = MAX_FACTOR_CELLS,
    checked: bool = False,
) -> tuple[tuple[int, ...], np.ndarray, float]:
    """(scope, values, floor): :func:`node_factor` is ``(scope, floored_time(values, floor))``.
    The DP floors the values as it reads them (``_pricing.eliminate``'s floors), so a node's
    memoised values are not copied per split; under a memory price they are floored and priced
    here (floor 0). :func:`split_factors` gives every node's, each class of alike nodes priced
    once."""
    scope, groups = _sent(sp, u)[:2]
    k = len(scope)
    if not checked:
        check_factor_size(sp, tables, u, options, max_cells)
    frame, key = _memo_key(sp, tables, u, options.objective)
    raw = _MEMO.get(key)
    if raw is None:
        raw = node_values(tables, sp.side, groups, u, None, frame, sp.frames[1], options.objective)
        raw.setflags(write=False)  # shared through the memo
        _remember(key, raw, raw.size, [tables[w] for w in scope])
    else:
        raw = raw[0]
    floor = sp.floor(u, options)
    if options.memory_price > 0.0:  # a unary term on u's own states (u is the scope's first axis)
        price = memory_price(sp, tables, u, options).reshape((-1,) + (1,) * (k - 1))
        return scope, floored_time(raw, floor) + price, 0.0
    return scope, raw, floor


def own_values(sp: SplitProblem, tables, options: PlanOptions) -> list[np.ndarray]:
    """Per node, per state of its table: its factor's value (:func:`floorless_factor`, floored,
    memory price included) with nothing sent to its consumers, i.e. its compute and its own
    reductions at this split. Every received amount is >= 0 and a node's value grows with what
    it receives (docs/costmodel.md section 4), so this is at most its factor's value in every
    cell where it has that state: the lower bound the DP prunes states with
    (:func:`parplan.solvers.dp.min_states`). Nodes with the same table share one pricing."""
    out = []
    for u in range(len(tables)):
        value = floored_time(own_raw(sp, tables, u, options), sp.floor(u, options))
        if options.memory_price > 0.0:
            value = value + memory_price(sp, tables, u, options)
        out.append(np.asarray(value, dtype=float).reshape(-1))
    return out


def own_raw(sp: SplitProblem, tables, u: int, options: PlanOptions) -> np.ndarray:
    """Node ``u``'s :func:`own_values` before the split's floor and memory price, memoised with
    its table (what it reads: the table, the sides, leaf_pair and the objective)."""
    t = tables[u]
    key = (sp.side, sp.frames[1], options.objective)
    own = t.own_memo.get(key)
    if own is None:
        own = t.own_memo[key] = node_values(
            tables, sp.side, (), u, {u: np.arange(t.size)}, None, key[1], key[2]
        )
        own.setflags(write=False)
    return own


def updated_factor(
    sp: SplitProblem,
    tables,
    u: int,
    options: PlanOptions,
    keys,
    previous=None,
    max_cells: float = MAX_FACTOR_CELLS,
) -> tuple[tuple[int, ...], np.ndarray, tuple]:
    """(scope, values, what ``previous`` takes next time): :func:`floorless_factor`'s values of
    node ``u`` where the state tables change a few states at a time (the continuous search cuts
    intervals). ``keys[w]`` names node ``w``'s states in its table's order; ``previous``, the
    last call's third item, holds the values of the states then, and only cells with a state
    not named there are priced (every cell's value reads only its own states: the same numbers,
    bit for bit, as pricing the whole table). No memory price: :func:`floorless_factor` adds
    one to floored values, and the continuous search has none."""
    if options.memory_price > 0.0:
        raise ConfigError("updated_factor prices no memory term")
    scope, groups = _sent(sp, u)[:2]
    check_factor_size(sp, tables, u, options, max_cells)
    frame = _memo_key(sp, tables, u, options.objective)[0]
    now = tuple(tuple(keys[w]) for w in scope)
    shape = tuple(len(k) for k in now)
    if any(len(k) != tables[w].size for k, w in zip(now, scope)):
        raise ValueError("keys do not match the state tables")
    k = len(scope)

    def priced(sel) -> np.ndarray:
        idx = {
            w: s.reshape([-1 if j == i else 1 for j in range(k)])
            for i, (w, s) in enumerate(zip(scope, sel))
        }
        return node_values(tables, sp.side, groups, u, idx, frame, sp.frames[1], options.objective)

    if previous is None:
        raw = priced([np.arange(n) for n in shape])
        return scope, raw, (now, raw)
    before, old_raw = previous
    at = []
    for was, names in zip(before, now):
        place = {name: i for i, name in enumerate(was)}
        at.append(np.array([place.get(name, -1) for name in names], dtype=np.int64))
    kept = [np.flatnonzero(a >= 0) for a in at]
    fresh = [np.flatnonzero(a < 0) for a in at]
    raw = np.empty(shape)
    if all(len(x) for x in kept):
        raw[np.ix_(*kept)] = old_raw[np.ix_(*[a[x] for a, x in zip(at, kept)])]
    for j in range(k):  # the cells whose first new state is member j's: each priced once
        sel = [kept[i] if i < j else fresh[j] if i == j else np.arange(shape[i]) for i in range(k)]
        if all(len(x) for x in sel):
            raw[np.ix_(*sel)] = priced(sel)
    return scope, raw, (now, raw)


def memory_price(sp: SplitProblem, tables, u: int, options: PlanOptions) -> np.ndarray:
    """Per state of node ``u``, the memory price ``mu (m_1 / C_1 + m_2 / C_2)`` of
    docs/costmodel.md section 6.2 (step 3). What a recomputed block holds again is a largest
    over blocks (section 6.3), not a sum over nodes: it is priced as the blocks' average, so the
    price stays a unary term (the memory search re-checks every plan it keeps); so is what
    ZeRO-3 gathers, a largest over units (section 6.1), as the units' average."""
    t, cap = tables[u], sp.side.capacity_bytes
    mem = t.memory
    if sp.dims[u].recompute and sp.dims[u].checkpoint >= 0:
        mem = t.memory + t.activations / sp.planning.block_count
    if sp.side.zero_stage >= 3:
        mem = mem + t.gathered / len(set(sp.planning.units))
    return options.memory_price * (mem[0] / cap[0] + mem[1] / cap[1])


#: Floats the memo of node terms may hold (8 bytes each: at most 128 MB); the oldest go first; 0
#: turns it off. The portfolio prices the same splits again member after member: a residual
#: block's fork is a 51^3-cell table at share grid 16, and at 4 M floats resnet50 / ``h100:8``
#: re-priced most of them (1.70 s CPU; 16 M: 1.42 s, 96 MB more).
MEMO_MAX_CELLS = 16_000_000
#: key -> (value, the state tables it was priced on: kept alive, so their ids in keys stay theirs)
_MEMO: OrderedDict = OrderedDict()
_MEMO_CELLS = [0]


def _memo_key(sp: SplitProblem, tables, u: int, what) -> tuple[dict | None, tuple]:
    """(``u``'s regions in its local frame, the memo key of its terms). A node's terms read only
    its own and its consumers' state tables, their regions, the tensors ``u`` sends and the
    split's sides; the key names the nodes by their place in ``scope``, so translated sibling
    groups and repeated blocks (same tables, same relative regions) share one entry."""
    regions, leaf_pair = sp.frames
    scope, _, consumers, sent = _sent(sp, u)
    boxes = framed(tuple(regions[w] for w in scope)) if regions is not None else None
    key = (what, tuple(id(tables[w]) for w in scope), boxes, sent, sp.side, leaf_pair)
    return None if boxes is None else dict(zip(scope, boxes)), key


def _seen_key(sp: SplitProblem, tables, u: int) -> tuple:
    """What node ``u``'s terms read at split ``sp`` as objects: its scope's state tables and
    regions by identity (built through memos, so the nodes of repeated blocks get the same
    objects) and the tensors it sends. Within one split, with the tables alive, equal keys mean
    equal :func:`_memo_key` keys (the side, the frames' rule and what is priced are the split's
    and the caller's): the per-split shortcut past that key, which hashes every box, dims and
    side (on Llama-3-70B / ``h100:512``, 2.2 M keys)."""
    scope, _, _, sent = _sent(sp, u)
    regions = sp.frames[0]
    return (
        tuple(id(tables[w]) for w in scope),
        None if regions is None else tuple(id(regions[w]) for w in scope),
        sent,
    )


#: Nodes from which a split's classes (:func:`node_classes`, the state tables') are found by
#: one numpy pass over identities rather than a key per node (VGG-11's 20-node splits: the
#: keys are cheaper; Llama-3-70B's 481: numpy is).
NUMPY_CLASSES = 64


def _layout(sp: SplitProblem) -> tuple[np.ndarray, np.ndarray, tuple]:
    """(every node's factor scope as a row of node indices padded with -1, a code per node for
    the tensors it sends (equal codes: equal :func:`_sent` memo parts), each node's scope as a
    tuple), once per graph and dims (:func:`_sent`'s entry)."""
    n = len(sp.planning.nodes)
    if n == 0:  # a stage of nothing but graph-level layers
        return np.zeros((0, 1), dtype=np.int64), np.zeros(0, dtype=np.int64), ()
    _sent(sp, 0)
    entry = sp.__dict__["_sent"]
    got = entry[3].get("layout")
    if got is None:
        per = [_sent(sp, u) for u in range(n)]
        width = max(len(x[0]) for x in per)
        scopes = np.full((n, width), -1, dtype=np.int64)
        codes: dict = {}
        sent = np.empty(n, dtype=np.int64)
        for u, x in enumerate(per):
            scopes[u, : len(x[0])] = x[0]
            sent[u] = codes.setdefault(x[3], len(codes))
        got = entry[3]["layout"] = (scopes, sent, tuple(x[0] for x in per))
    return got


def node_classes(sp: SplitProblem, tables) -> tuple[np.ndarray, np.ndarray]:
    """(one node of each class, each node's class): nodes whose terms read the same objects at
    this split (:func:`_seen_key`, for every node at once: the state tables and regions of
    their scopes by identity, and the tensors they send), so they have the same terms. A
    transformer's layers below the root are a few classes of hundreds of nodes (Llama-3-70B on
    ``h100:512``: 2,000 DPs of 481 nodes each)."""
    n = len(tables)
    if n < NUMPY_CLASSES:  # a key per node costs less than numpy's calls here
        seen: dict = {}
        first, inverse = [], []
        for u in range(n):
            c = seen.setdefault(_seen_key(sp, tables, u), len(seen))
            if c == len(first):  # a new class: u is its first node
                first.append(u)
            inverse.append(c)
        return np.array(first, dtype=np.int64), np.array(inverse, dtype=np.int64)
    scopes, sent = _layout(sp)[:2]
    ids = [np.append(np.fromiter(map(id, tables), dtype=np.int64, count=n), 0)[scopes]]
    regions = sp.frames[0]
    if regions is not None:
        ids.append(np.append(np.fromiter(map(id, regions), dtype=np.int64, count=n), 0)[scopes])
    keys = np.concatenate([*ids, sent[:, None]], axis=1)
    return _row_classes(keys)


def _row_classes(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(one row of each class of equal rows, each row's class) of an int64 matrix. Rows are
    hashed to one uint64 each and the hashes sorted (``np.unique`` over rows sorts a
    structured view, several times slower on a transformer's splits); the classes are then
    checked row by row, and a collision falls back to ``np.unique`` over the rows."""
    x = keys.astype(np.uint64)
    # splitmix64's finaliser per entry, each column weighted by its own odd constant
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    weights = (
        _ROW_WEIGHTS[: x.shape[1]] if x.shape[1] <= _ROW_WEIGHTS.size else _weights(x.shape[1])
    )
    h = (x * weights).sum(axis=1, dtype=np.uint64)
    _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if not np.array_equal(keys[first][inverse], keys):  # a collision: exact classes instead
        _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
    return first, inverse


def _weights(m: int) -> np.ndarray:
    """``m`` odd 64-bit weights, independent draws of a fixed seed (weights 1, 3, 5, 7 times
    one constant would make rows (1, 0, 0, 1) and (0, 1, 1, 0) collide)."""
    return np.random.default_rng(0x5EED).integers(0, 2**63, size=m, dtype=np.uint64) * np.uint64(
        2
    ) + np.uint64(1)


#: :func:`_row_classes`' weights of the first 64 columns (wider rows draw their own).
_ROW_WEIGHTS = _weights(64)


def factor_cells(sp: SplitProblem, tables) -> np.ndarray:
    """Per node, the cells of its factor (:func:`node_factor`) over ``tables``' states (or
    over as many states per node as ``tables`` holds numbers)."""
    scopes = _layout(sp)[0]
    sizes = [t if isinstance(t, (int, np.integer)) else t.size for t in tables]
    return np.append(np.array(sizes, dtype=float), 1.0)[scopes].prod(axis=1)


def split_factors(
    sp: SplitProblem, tables, options: PlanOptions, max_cells: float = MAX_FACTOR_CELLS
) -> list[tuple[tuple[int, ...], np.ndarray, float]]:
    """:func:`floorless_factor` of every node (sizes checked first: a split too large prices
    nothing), each class of :func:`node_classes` priced once."""
    sizes = factor_cells(sp, tables)
    limit = min(max_cells, MAX_FACTOR_CELLS)
    if (sizes > limit).any():
        check_factor_size(sp, tables, int(np.flatnonzero(sizes > limit)[0]), options, max_cells)
    if options.memory_price > 0.0:  # floored and priced per node (floorless_factor)
        return [
            floorless_factor(sp, tables, u, options, max_cells, True) for u in range(len(tables))
        ]
    first, inverse = node_classes(sp, tables)
    raw = [floorless_factor(sp, tables, int(u), options, max_cells, True)[1] for u in first]
    floors = (
        [0.0] * len(tables)
        if sp.floor_s is None or options.objective is not Objective.TIME
        else [float(f) for f in sp.floor_s]
    )
    return [(x, raw[c], f) for x, c, f in zip(_layout(sp)[2], inverse.tolist(), floors)]


def clear_memo() -> None:
    """Forget every memoised node term, scaled dims, child dims, regions and cuts, translation
    test and compute time (a benchmark's cold start; plans do not depend on it)."""
    _MEMO.clear()
    _MEMO_CELLS[0] = 0
    _SPLIT_MEMO.clear()
    _SENT.clear()
    _CHILD_REGIONS.clear()
    _CHILD_DIMS.clear()
    _CHILD_CUTS.clear()
    clear_regions()
    clear_scaled()
    clear_compute()


def _remember(key, value, cells: int, tables) -> None:
    """Keep ``value`` under ``key`` (with the tables it was priced on), dropping the oldest
    entries beyond :data:`MEMO_MAX_CELLS` (0: keep nothing)."""
    if MEMO_MAX_CELLS <= 0:
        return
    _MEMO[key] = (value, tables)
    _MEMO_CELLS[0] += cells
    while _MEMO_CELLS[0] > MEMO_MAX_CELLS and len(_MEMO) > 1:
        _, old = _MEMO.popitem(last=False)  # O(1): a dict would rescan its deleted slots every time
        _MEMO_CELLS[0] -= int(np.size(old[0])) if not isinstance(old[0], NodeTerms) else 8


#: Splits whose every node's terms :func:`split_terms` keeps (the oldest go first; 0 turns it
#: off). The hierarchy prices each split it plans, and the evaluator prices the same splits
#: again for every candidate plan that holds them (on llama3-70b / ``h100:64`` the memory search
#: evaluates 70 plans: 59 s of node-by-node pricing, nearly all of it repeated).
SPLIT_MEMO_MAX = 512
#: key -> (the planning graph, every node's terms)
_SPLIT_MEMO: OrderedDict = OrderedDict()


def split_terms(sp: SplitProblem, choices, shares, nodes=None) -> list[NodeTerms | None]:
    """Every node's time terms at one assignment of states (the evaluator's view); with
    ``nodes``, only theirs (None for the others): a node's terms read its own and its
    consumers' states. Whole splits are remembered (:data:`SPLIT_MEMO_MAX`): the terms read
    only what the key holds (``floor_s`` and ``path`` do not enter them)."""
    if nodes is None and SPLIT_MEMO_MAX > 0:
        key = HashedTuple(
            (
                id(sp.planning),
                sp.dims,
                sp.side,
                sp.covered,
                sp.regions,
                sp.root_dims,
                sp.leaf_pair,
                sp.above,
                tuple(choices),
                tuple(shares),
            )
        )
        hit = _SPLIT_MEMO.get(key)
        if hit is not None and hit[0] is sp.planning:
            _SPLIT_MEMO.move_to_end(key)
            return list(hit[1])
        out = _split_terms(sp, choices, shares, None)
        _SPLIT_MEMO[key] = (sp.planning, tuple(out))
        while len(_SPLIT_MEMO) > SPLIT_MEMO_MAX:
            _SPLIT_MEMO.popitem(last=False)
        return out
    return _split_terms(sp, choices, shares, nodes)


def _split_terms(sp: SplitProblem, choices, shares, nodes) -> list[NodeTerms | None]:
    n = len(choices)
    wanted = None if nodes is None else sorted(nodes)
    needed = None if nodes is None else set(wanted).union(*(sp.planning.succs[u] for u in wanted))
    one_choice: dict = {}  # one tuple object per choice and per share: _tables' keys read ids
    tables = _tables(
        sp,
        [one_choice.setdefault(c, (c,)) for c in choices],
        [one_choice.setdefault(("share", a), (a,)) for a in shares],
        needed,
    )
    zero = {v: _ZERO for v in range(n)}

    def terms(u: int) -> NodeTerms:
        scope, groups = _sent(sp, u)[:2]
        frame, key = _memo_key(sp, tables, u, "terms")
        hit = _MEMO.get(key)
        if hit is not None:
            return hit[0]
        got = node_terms(tables, sp.side, groups, u, zero, frame, sp.frames[1])
        _remember(key, got, 8, [tables[w] for w in scope])
        return got

    if nodes is None:  # each class of alike nodes priced once (node_classes)
        first, inverse = node_classes(sp, tables)
        found = [terms(int(u)) for u in first]
        return [found[c] for c in inverse.tolist()]
    out: list[NodeTerms | None] = [None] * n
    seen: dict = {}  # the terms found in this call (_seen_key: repeated blocks' nodes share them)
    for u in wanted:
        fast = _seen_key(sp, tables, u)
        out[u] = seen.get(fast)
        if out[u] is None:
            out[u] = seen[fast] = terms(u)
    return out


_ZERO = np.zeros((), dtype=int)


def price_split(sp: SplitProblem, split, options: PlanOptions) -> float:
    """The true one-split objective of ``split``: what the DP, the MIP and brute force minimise."""
    terms = split_terms(sp, split.choices, split.shares)
    return float(
        sum(
            float(node_value(t, options.objective, sp.floor(u, options)))
            for u, t in enumerate(terms)
        )
    )


__all__ = [
    "child_dims",
    "MAX_SHARE_GRID",
    "MEMO_MAX_CELLS",
    "SPLIT_MEMO_MAX",
    "clear_memo",
    "PlanOptions",
    "SplitProblem",
    "all_choices",
    "check_factor_size",
    "factor_cells",
    "factor_scope",
    "memory_price",
    "floorless_factor",
    "node_classes",
    "split_factors",
    "node_factor",
    "own_raw",
    "own_values",
    "price_split",
    "split_tables",
    "split_terms",
    "updated_factor",
]
