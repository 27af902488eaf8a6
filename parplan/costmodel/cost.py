"""Costs of one split (docs/costmodel.md, sections 2-7). Every planner, the MIP and the
evaluator price through :func:`node_terms`; nothing else derives a cost.

A split of a group divides every planning node between side 1 (share ``a``) and side 2
(share ``1 - a``). A node's *state* is its choice (a type, or a join's layout) and its share.
Node ``u``'s time at the split is ``max(T_1, T_2)`` with

    T_i = compute_i(u) + L * [R_i > 0] + R_i * bytes_per_element / BW_i  (+ all-reduce time)

where ``compute_i`` is the roofline time of the part of ``u`` side ``i`` keeps (its own
product and the element-wise ops that travel with it), ``BW_i`` the bandwidth at which side
``i`` receives, and ``R_i`` the elements side ``i`` receives for ``u``: its intra-layer
reduction plus the re-layout of ``u``'s output to all its consumers and of their gradients
back (:mod:`parplan.costmodel.layout`). A node's cost therefore depends on its own state and
its consumers' states: the *factor* of ``u`` has scope ``(u, consumers of u)``.

Shares live on a grid (:func:`share_points`): ``{0, 1/G, ..., 1}`` plus the proportional
share for free shares, one point for fixed shares. Planners are exact on that grid; a
relaxation over the intervals between the points (:func:`share_intervals`, whose costs are
minima over each interval) bounds what continuous shares could gain.

Example (one layer, no neighbours, two equal devices):
    >>> from parplan.costmodel.dims import Device, LayerDims, device_figures
    >>> from parplan.costmodel.layout import PartitionType
    >>> d = LayerDims(batch=8, in_features=64, out_features=64, in_spatial=1, out_spatial=1, kernel=1)
    >>> dev = Device(1e9, 1e12)
    >>> side = SideSpec((dev, dev), (1e9, 1e9), latency_s=0.0, bytes_per_element=2)
    >>> t = StateTable.build(d, False, (PartitionType.BATCH,), (0.5,), side)
    >>> float(t.intra[0][0]), float(t.compute[0][0]) * 1e6
    (4096.0, 98.304)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from parplan.costmodel.collective import Collective
from parplan.costmodel.dims import (
    Device,
    LayerDims,
    cached_hash,
    device_figures,
    state_without_hash,
)
from parplan.costmodel.compiled import core as _pricing
from parplan.costmodel.layout import LAYOUT_CODE, Choice, Layout, PartitionType, ports, split_axes
from parplan.costmodel.regions import local_frame, rect_area
from parplan.errors import TableTooLarge

#: Relative tolerance used to compare times (ties).
REL_TOL = 1e-12
#: Weight of a node's own time when it sits under a floor (see :func:`floored_time`).
FLOOR_TIE_WEIGHT = 1e-6
#: Default share grid: shares are multiples of 1/16 (plus the proportional share).
DEFAULT_SHARE_GRID = 16
#: Default optimizer state, bytes per parameter: Adam's two moments and an fp32 master copy.
DEFAULT_OPTIMIZER_BYTES = 12.0
#: A side receiving fewer elements than this pays no latency (float noise of the area formulas).
RECEIVE_EPS = 1e-9
#: Sub-intervals on which a relaxation's interval state bounds the compute part of max(T_1, T_2).
RELAX_STEPS = 8
#: The compiled core's choice codes (``_pricing.c``'s ``C_*``): the types, then the join layouts.
CHOICE_CODE = {
    PartitionType.BATCH: 0,
    PartitionType.IN: 1,
    PartitionType.OUT: 2,
    Layout.ROWS: 3,
    Layout.COLS: 4,
    Layout.WHOLE: 5,
}
#: Consumers of one tensor the region algebra takes (``_pricing.c``'s ``MAXC``: inclusion-exclusion
#: over their subsets).
REGION_MAX_CONSUMERS = 24
#: Columns of ``_pricing.states``' output the table reads apart (``S_SIZE``, ``S_WEIGHTED``).
_S_SIZE, _S_WEIGHTED = 8, 10


def floored_time(t, floor: float):
    """Cost of a node time ``t`` at a split whose sibling sets ``floor`` (a node's time at the
    parent is the max over both groups): ``max(t, floor)``, plus a tiny weight on ``t`` itself
    so that configurations under the floor are not all tied. No floor, no change. ``t`` a
    number or an array, ``floor`` a number; priced by the compiled core."""
    if not floor > 0:
        return t
    a = np.asarray(t, dtype=float, order="C")
    out = np.empty_like(a)
    _pricing.floored(a, float(floor), out)
    return out


class Objective(Enum):
    """What a planner minimises (docs/costmodel.md section 7)."""

    # members are singletons compared by identity: hash them so, in C (Enum hashes its name
    # in Python, 8 M times on a 1,024-layer chain / h100:128)
    __hash__ = object.__hash__

    TIME = "time"  # step time: compute + communication, AccPar
    COMMUNICATION = "communication"  # elements moved, HyPar and the published AccPar code


class ShareMode(Enum):
    """How the side-1 share of every node is chosen."""

    # members are singletons compared by identity: hash them so, in C (Enum hashes its name
    # in Python, 8 M times on a 1,024-layer chain / h100:128)
    __hash__ = object.__hash__

    FREE = "free"  # on the share grid, optimised per node (AccPar's flexible ratio)
    HALF = "half"  # 1/2 (homogeneous baselines, HyPar)
    PROPORTIONAL = "proportional"  # C_1 / (C_1 + C_2)


#: Published planners' pricing rules (docs/costmodel.md section 9) and what each changes; a
#: problem's ``compat`` names one, or several joined by "+".
COMPAT_RULES = {
    "hypar": "IN reductions priced at the size the next layer reads (after pooling), as HyPar",
    "accpar-code": "every split priced in its own frame, groups pre-summing gradients, "
    "as the published AccPar code (and the papers' per-level accounting)",
}


def compat_rules(compat: str | None) -> frozenset[str]:
    """The rules a ``compat`` value names: ``None`` none, ``"hypar+accpar-code"`` both; an
    unknown rule is a ValueError naming the known ones.

    Example:
        >>> sorted(compat_rules("hypar+accpar-code")), compat_rules(None)
        (['accpar-code', 'hypar'], frozenset())
    """
    if compat is None:
        return frozenset()
    rules = frozenset(str(compat).split("+"))
    unknown = sorted(rules - set(COMPAT_RULES))
    if unknown:
        raise ValueError(
            f"compat must name rules among {', '.join(COMPAT_RULES)}, joined by '+' "
            f"(got {compat!r})"
        )
    return rules


@dataclass(frozen=True)
class SideSpec:
    """What one split looks like to the cost model: the two halves as devices, the bandwidth
    at which each side receives, the link latency, the element size."""

    __hash__ = cached_hash
    __getstate__ = state_without_hash

    devices: tuple[Device, Device]
    bytes_per_s: tuple[float, float]
    latency_s: float
    bytes_per_element: float
    #: Price BATCH gradient exchange with this all-reduce (see collective.py); None = section 2.
    collective: Collective | None = None
    hosts: int = 2  # devices in the group being split
    optimizer_bytes_per_param: float = DEFAULT_OPTIMIZER_BYTES
    #: A published planner's rules instead of parplan's where they differ (docs/costmodel.md
    #: section 9; :func:`compat_rules`): "hypar" prices an IN split's partial-sum reduction at
    #: the size the next layer reads (after pooling), as the HyPar paper does; "accpar-code"
    #: prices every split in its own frame; "hypar+accpar-code" both. None = parplan's model.
    compat: str | None = None
    #: ZeRO stage (docs/costmodel.md section 6.1): memory of replicated weights sharded; stage 3
    #: also gathers the weights of a BATCH split in forward and backward.
    zero_stage: int = 0
    #: Each side's memory, summed over its devices (bytes): what a memory price divides by
    #: (:attr:`parplan.costmodel.split.PlanOptions.memory_price`; docs/costmodel.md section 6.2).
    capacity_bytes: tuple[float, float] = (float("inf"), float("inf"))
    #: Micro-batches per step (gradient accumulation, docs/costmodel.md section 6.4).
    micro_batches: int = 1
    #: Ports of the link between the sides (``bytes_per_s`` counts them all; docs/costmodel.md
    #: section 4): an all-reduce's topology is built of single ports.
    ports: int = 1
    #: Weight traffic (gradient exchange, ZeRO-3 gathers) runs while the side computes
    #: (docs/costmodel.md section 4.2); False: after it, the papers' setting.
    overlap: bool = False

    @property
    def flops_per_s(self) -> tuple[float, float]:
        """Achieved FLOP/s of the two sides."""
        return tuple(d.flops_per_s * d.efficiency for d in self.devices)

    def proportional_share(self) -> float:
        c1, c2 = self.flops_per_s
        return c1 / (c1 + c2)

    def fixed_share(self, mode: ShareMode) -> float:
        if mode is ShareMode.HALF:
            return 0.5
        if mode is ShareMode.PROPORTIONAL:
            return self.proportional_share()
        raise ValueError("free shares are optimised, not fixed")


def share_points(
    side: SideSpec, mode: ShareMode, grid: int = DEFAULT_SHARE_GRID
) -> tuple[float, ...]:
    """The shares a node may take: ``{0, 1/grid, ..., 1}`` and the proportional share (free),
    or the one fixed share."""
    if mode is not ShareMode.FREE:
        return (side.fixed_share(mode),)
    pts = {j / grid for j in range(grid + 1)}
    prop = side.proportional_share()
    if all(abs(prop - p) > 1e-12 for p in pts):
        pts.add(prop)
    return tuple(sorted(pts))


def zero_dims(dims: LayerDims) -> LayerDims:
    """What a side with no share of a node holds: nothing."""
    return dims.scaled(0.0, 0.0, 0.0)


def scale_for_sides(dims: LayerDims, choice: Choice, a: float) -> tuple[LayerDims, LayerDims]:
    """Dims each side is left with: BATCH/ROWS scale B, IN scales Di, OUT scales Do, COLS
    scales a join's channels, WHOLE leaves a join whole; a side with share 0 keeps nothing.
    Remembered (:data:`_SCALED`): equal dims split alike give the same objects, so the memos
    keyed on them compare by identity and hash once (a chain's or a transformer's repeated
    layers, the portfolio's members meeting the same splits)."""
    key = (dims, choice, a)
    hit = _SCALED.get(key)
    if hit is None:
        if len(_SCALED) >= _SCALED_MAX:
            _SCALED.clear()
            _INTERNED.clear()
        left, right = _one_side(dims, choice, a), _one_side(dims, choice, 1.0 - a)
        hit = _SCALED[key] = (_INTERNED.setdefault(left, left), _INTERNED.setdefault(right, right))
    return hit


#: (dims, choice, share) -> both sides' dims (:func:`scale_for_sides`), at most _SCALED_MAX.
_SCALED: dict = {}
_SCALED_MAX = 1 << 16
#: One object per distinct scaled dims: equal dims reached by different splits (a chain's
#: repeated layers, sibling groups, the portfolio's members) are then one object, and the
#: memos' lookups and the planners' comparisons of dims tuples stop at identity instead of
#: comparing 17 fields (``LayerDims.__eq__``, 11% of a 1,024-layer chain's planning before).
#: Cleared with ``_SCALED``. (Equal dims may differ in their element-wise ops' names, which
#: no cost reads: the kept object's names stand for all.)
_INTERNED: dict = {}


def clear_scaled() -> None:
    """Forget the remembered sides' dims (:func:`scale_for_sides`; a benchmark's cold start)."""
    _SCALED.clear()
    _INTERNED.clear()


def _one_side(dims: LayerDims, choice: Choice, s: float) -> LayerDims:
    """Dims a side with share ``s`` of a node split by ``choice`` keeps."""
    axes = split_axes(choice)
    if s <= 0.0:
        return zero_dims(dims)
    if not axes:
        return dims
    return dims.scaled(**{_DIMS_OF_AXIS[ax]: s for ax in axes})


#: The size a divided region axis scales (section 3's rows / input columns / output columns).
_DIMS_OF_AXIS = {"rows": "batch", "ins": "in_features", "outs": "out_features"}


def receive_seconds(
    side: "SideSpec", i: int, elements: float, weight_elements: float = 0.0
) -> float:
    """Seconds side ``i`` spends receiving ``elements`` at this split (docs/costmodel.md
    section 4): the link latency when it receives anything, plus the bytes at its receive
    bandwidth. With micro-batches (section 6.4) what moves per micro-batch (``elements`` less
    the per-step ``weight_elements``) pays the latency once per micro-batch, and the gradient
    exchange travels with the last one (or pays its own latencies: ZeRO-2/3 reduce-scatter per
    micro-batch). Priced by the compiled core (the rule :func:`node_terms` applies per cell)."""
    return _pricing.receive(_side_tuple(side, True), i, float(elements), float(weight_elements))


def allreduce_factor(zero_stage: int, micro_batches: int) -> float:
    """A BATCH split's gradient exchange on a collective array, in all-reduces (reduce-scatter
    and all-gather each half of one): 1 at stages 0-1, ``(m + 1) / 2`` at stage 2, ``1.5 m`` at
    stage 3 (the exchanges ``_pricing.states`` charges per side; docs/costmodel.md sections 6.1, 6.4)."""
    if zero_stage <= 1:
        return 1.0
    if zero_stage == 2:
        return (micro_batches + 1) / 2.0
    return 1.5 * micro_batches


def intra_elements(dims: LayerDims, choice: Choice) -> float:
    """Elements each side receives inside a node split by ``choice`` with work on both sides
    (docs/costmodel.md section 2): the partial sum its type leaves (a join's ROWS: the gradients
    of the embedding tables it reads), plus the row statistics of its layer norms when the
    split divides its output columns. Priced by the compiled core."""
    return _pricing.intra(*dims.core_figures(), CHOICE_CODE[choice])


@dataclass(frozen=True)
class ShareSet:
    """Where a node's share may lie in one state: ``[lo, hi]``, and whether each side has work
    (``has[0]``: a > 0, ``has[1]``: a < 1). A grid point has ``lo == hi``; a relaxation's
    interval between two points has ``lo < hi`` (docs/costmodel.md section 8)."""

    lo: float
    hi: float
    has: tuple[bool, bool]

    @classmethod
    def point(cls, a: float) -> "ShareSet":
        return cls(a, a, (a > 0.0, a < 1.0))


def share_intervals(points: tuple[float, ...]) -> tuple[ShareSet, ...]:
    """The points 0 and 1 (if present) and the closed intervals between consecutive points,
    with the work flags of their interior: every share in [0, 1] lies in one of them."""
    out = [ShareSet.point(p) for p in points if p in (0.0, 1.0)]
    out += [ShareSet(lo, hi, (True, True)) for lo, hi in zip(points, points[1:])]
    if len(points) == 1 and 0.0 < points[0] < 1.0:
        out.append(ShareSet.point(points[0]))
    return tuple(out)


#: Subsets of one state table kept by :meth:`StateTable.subset` (each is a few states; the
#: oldest set is dropped whole past it).
SUBSETS_MAX = 64


@dataclass(frozen=True)
class StateTable:
    """Per state of one node at one split (arrays over states): choice, share range, work
    flags, port layouts, compute seconds and memory bytes per side, intra-layer elements
    received per side, and the all-reduce seconds of a BATCH gradient exchange on collective
    arrays. For interval states the per-side figures are their minima over the interval
    (compute_1 and memory_1 at ``lo``, side 2's at ``hi``), so every term is a lower bound."""

    choices: tuple[Choice, ...]
    lo: np.ndarray
    hi: np.ndarray
    has: np.ndarray  # (2, S) bool
    give: np.ndarray
    need: np.ndarray
    compute: np.ndarray  # (2, S) seconds
    memory: np.ndarray  # (2, S) bytes
    intra: np.ndarray  # (2, S) elements
    extra: np.ndarray  # (S,) seconds, on both sides
    #: (2, S, K): each side's compute at K shares evenly from lo to hi (K = 1 for points)
    steps: np.ndarray
    #: (2, S) elements: the part of ``intra`` that is a per-step weight-gradient exchange (BATCH's
    #: reduce-scatter and all-gather, ZeRO-3's gathers, tables' gradients); the rest moves once
    #: per micro-batch (docs/costmodel.md section 6.4)
    wintra: np.ndarray
    #: (2, S) bytes: every activation each side's part would keep with nothing recomputed (what
    #: a checkpointed block holds again during its backward; docs/costmodel.md section 6.3)
    activations: np.ndarray
    #: (2, S) bytes: what ZeRO stage 3 gathers of each side's part's weights while its unit runs
    #: (its weights less its shard; 0 below stage 3; docs/costmodel.md section 6.1)
    gathered: np.ndarray

    @property
    def size(self) -> int:
        return len(self.choices)

    @functools.cached_property
    def packed(self) -> np.ndarray:
        """The fields the compiled core reads, float64 ``(NF, S)`` (``_pricing.c``'s ``F_*``): lo,
        hi, work flags, give and need layouts, intra and per-step intra elements, extra seconds."""
        return np.ascontiguousarray(
            np.vstack(
                [
                    self.lo,
                    self.hi,
                    self.has[0],
                    self.has[1],
                    self.give,
                    self.need,
                    self.intra[0],
                    self.intra[1],
                    self.wintra[0],
                    self.wintra[1],
                    self.extra,
                ]
            ),
            dtype=float,
        )

    @property
    def shares(self) -> np.ndarray:
        """The share of each (point) state."""
        return self.lo

    def take(self, states) -> "StateTable":
        """The table of ``states`` (indices, in the order given)."""
        idx = np.asarray(states, dtype=np.int64)
        fields = {"choices": tuple(self.choices[i] for i in idx.tolist())}
        for name in _STATE_ARRAYS:
            value = getattr(self, name)
            # states on axis 1 of (side, state[, sub-share]) arrays; fancy indexing copies
            part = fields[name] = value[:, idx] if value.ndim > 1 else value[idx]
            part.setflags(write=False)
        out = type(self)(**fields)
        if "packed" in self.__dict__:  # the core's columns are per state too
            out.__dict__["packed"] = np.ascontiguousarray(self.packed[:, idx])
        return out

    @functools.cached_property
    def _subsets(self) -> dict:
        return {}

    @functools.cached_property
    def own_memo(self) -> dict:
        """(sides, leaf pair, objective) -> the node's values over these states with nothing
        sent (:func:`parplan.costmodel.split.own_raw`' memo, kept with the table)."""
        return {}

    def subset(self, states: np.ndarray) -> "StateTable":
        """:meth:`take` of ``states`` (increasing indices), one object per table and states (the
        memos of node terms key tables by identity: the same states of the same table, asked
        again for another split or planner, find their terms priced)."""
        key = np.asarray(states, dtype=np.int64).tobytes()
        hit = self._subsets.get(key)
        if hit is None:
            if len(self._subsets) >= SUBSETS_MAX:
                self._subsets.clear()
            hit = self._subsets[key] = self.take(states)
        return hit

    @functools.cached_property
    def distinct(self) -> "StateTable":
        """The table without the states that are another's exact equivalent (the first of each
        kind is kept, so ties resolve as on the whole table; docs/costmodel.md section 8,
        "Equivalent states"): a state that runs the node on one side (a share of 0 or 1) is
        the same plan under every choice (section 2: the node is not split), and a join kept
        WHOLE at a share point with work on both sides holds and computes all of it on each,
        whatever the share (an interval from 0 or to 1 prices a side's compute at that end: not
        merged)."""
        keep, kinds = [], set()
        for s, c in enumerate(self.choices):
            h0, h1 = bool(self.has[0][s]), bool(self.has[1][s])
            if h0 != h1:
                kind = ("one side", h0)
            elif c is Layout.WHOLE and h0 and self.lo[s] == self.hi[s]:
                kind = ("whole",)
            else:
                keep.append(s)
                continue
            if kind not in kinds:
                kinds.add(kind)
                keep.append(s)
        return self if len(keep) == self.size else self.take(keep)

    @classmethod
    def merged(cls, tables: "Sequence[StateTable]") -> "StateTable":
        """One node's tables side by side: their states in order (say one table per choice, each
        with its own share intervals). A point table's compute at sub-shares is its compute, so
        it is repeated to the intervals' sub-share count where the two mix."""
        k = max(t.steps.shape[2] for t in tables)
        fields = {}
        for f in dataclasses.fields(cls):
            values = [getattr(t, f.name) for t in tables]
            if f.name == "choices":
                fields[f.name] = tuple(c for v in values for c in v)
            elif f.name == "steps":
                wide = [np.broadcast_to(v, v.shape[:2] + (k,)) for v in values]
                fields[f.name] = np.ascontiguousarray(np.concatenate(wide, axis=1))
            else:
                fields[f.name] = np.ascontiguousarray(np.concatenate(values, axis=-1))
        return cls(**fields)

    @classmethod
    def build(
        cls,
        dims: LayerDims,
        covered: bool,
        choices: tuple[Choice, ...],
        shares,
        side: SideSpec,
        in_reduction_elements: float | None = None,
        above: tuple[bool, bool] = (False, False),
    ) -> "StateTable":
        """The states ``choices x shares`` (choice-major) of a node with ``dims``; ``shares`` are
        floats (points) or :class:`ShareSet`. ``in_reduction_elements`` replaces the size of an
        IN split's partial-sum reduction (the layer's output) where a compat rule says so.
        ``above``: a split above divided the node's rows / output columns with work on both
        sides (its embedding tables' / layer norms' partials were reduced there)."""
        return _cached_table(
            dims, covered, tuple(choices), tuple(shares), side, in_reduction_elements, tuple(above)
        )

    @classmethod
    def _build(
        cls, dims, covered, choices, shares, side, in_reduction_elements, above
    ) -> "StateTable":
        """The table, priced by the compiled core (``_pricing.states``: sections 2, 5, 6, 6.3 and
        6.4), and on collective arrays the all-reduce of a BATCH gradient exchange here."""
        sets = [s if isinstance(s, ShareSet) else ShareSet.point(float(s)) for s in shares]
        k = 1 if all(ss.lo == ss.hi for ss in sets) else RELAX_STEPS + 1
        n = len(choices) * len(sets)
        code = np.repeat([CHOICE_CODE[c] for c in choices], len(sets)).astype(float)
        lo = np.tile([ss.lo for ss in sets], len(choices)).astype(float)
        hi = np.tile([ss.hi for ss in sets], len(choices)).astype(float)
        has = np.tile(np.array([ss.has for ss in sets], dtype=bool).T, len(choices)).reshape(2, n)
        out = np.empty((n, _pricing.NS + 2 * k))
        red = float("nan") if in_reduction_elements is None else float(in_reduction_elements)
        params = (
            float(side.bytes_per_element),
            float(side.optimizer_bytes_per_param),
            float(side.zero_stage),
            float(side.micro_batches),
            float(side.collective is not None),
            red,
            float(above[0]),
            float(above[1]),
            float(k),
        )
        _pricing.states(
            *dims.core_figures(),
            code,
            lo,
            hi,
            has[0].astype(float),
            has[1].astype(float),
            (device_figures(side.devices[0]), device_figures(side.devices[1])),
            params,
            out,
        )
        extra = np.zeros(n)
        if (
            side.collective is not None
        ):  # a BATCH split's gradient all-reduce (collective.py), once here
            bw = min(side.bytes_per_s) / side.ports
            for s in np.flatnonzero(out[:, _S_WEIGHTED] * has[0] * has[1]) if not covered else ():
                x = side.collective.allreduce_seconds(
                    side.hosts, out[s, _S_SIZE] * side.bytes_per_element, bw, side.latency_s
                )
                extra[s] = x * allreduce_factor(side.zero_stage, side.micro_batches)
        give = np.repeat([LAYOUT_CODE[ports(c).give_out] for c in choices], len(sets))
        need = np.repeat([LAYOUT_CODE[ports(c).need_in] for c in choices], len(sets))
        ns = _pricing.NS
        steps = np.ascontiguousarray(np.stack([out[:, ns : ns + k], out[:, ns + k :]]))
        pair = lambda a, b: np.ascontiguousarray(out[:, [a, b]].T)  # noqa: E731
        return cls(
            tuple(c for c in choices for _ in sets),
            lo,
            hi,
            has,
            give,
            need,
            pair(0, 1),
            pair(2, 3),
            pair(4, 5),
            extra,
            steps,
            pair(6, 7),
            pair(11, 12),
            pair(13, 14),
        )


#: The :class:`StateTable` fields that are arrays over its states.
_STATE_ARRAYS = tuple(f.name for f in dataclasses.fields(StateTable) if f.name != "choices")


@functools.lru_cache(maxsize=1 << 14)
def _cached_table(dims, covered, choices, shares, side, in_reduction_elements, above) -> StateTable:
    """:meth:`StateTable.build`, memoised: planners build the same tables again and again (the
    ``accpar`` portfolio plans the same splits under several criteria). The arrays are made
    read-only, so a shared table cannot be changed by one of its users."""
    table = StateTable._build(dims, covered, choices, shares, side, in_reduction_elements, above)
    for value in vars(table).values():
        if isinstance(value, np.ndarray):
            value.setflags(write=False)
    return table


def side_dims(dims: LayerDims, choice: Choice, a: float, side: int, has: bool) -> LayerDims:
    """Dims side ``side`` keeps at share ``a`` (zero without work): one side of
    :func:`scale_for_sides`."""
    if not has:
        return zero_dims(dims)
    return _one_side(dims, choice, a if side == 0 else 1.0 - a)


@dataclass(frozen=True)
class NodeTerms:
    """A node's time terms at given states (arrays broadcast over the factor's scope)."""

    compute: tuple[np.ndarray, np.ndarray]  # seconds per side
    comm: tuple[np.ndarray, np.ndarray]  # seconds per side: latency + transfer + all-reduce
    received: tuple[np.ndarray, np.ndarray]  # elements per side
    intra: tuple[np.ndarray, np.ndarray]  # elements per side, part of received
    steps: tuple[np.ndarray, np.ndarray] | None = None  # compute at sub-shares (relaxation only)
    #: seconds per side: the part of ``comm`` that overlaps the side's work (section 4.2); 0
    #: without overlap
    weight: tuple[np.ndarray, np.ndarray] | tuple[float, float] = (0.0, 0.0)

    def times(self) -> tuple[np.ndarray, np.ndarray]:
        return (
            overlap_time(self.compute[0], self.comm[0], self.weight[0]),
            overlap_time(self.compute[1], self.comm[1], self.weight[1]),
        )


def terms_matrix(terms) -> np.ndarray:
    """Each node's figures as one row: (comm_1, comm_2, intra_1, intra_2, received_1,
    received_2, weight_1, weight_2), an (n, 8) float array. Nodes that share one
    :class:`NodeTerms` object (a class of alike nodes, ``split.node_classes``) are read once."""
    index: dict[int, int] = {}
    rows = [index.setdefault(id(t), len(index)) for t in terms]
    once = list({id(t): t for t in terms}.values())  # in the order of ``index``
    table = np.array(
        [
            (t.comm[0], t.comm[1], t.intra[0], t.intra[1])
            + (t.received[0], t.received[1], t.weight[0], t.weight[1])
            for t in once
        ],
        dtype=float,
    ).reshape(len(once), 8)
    return table[rows]


#: The part of a node's work its weight traffic can hide behind (docs/costmodel.md section
#: 4.2): the backward, whose backward and gradient products are 4 of a training step's 6 FLOP
#: units; gradients exist only once it has started.
OVERLAP_WINDOW = 2.0 / 3.0


def overlap_time(work, comm, weight):
    """A side's time for a node (docs/costmodel.md section 4.2): its work (compute, or the time
    of the group below), then what it receives, except that up to ``weight`` seconds of that
    run during the backward part of the work: ``work + comm - min(weight, OVERLAP_WINDOW *
    work)``. Nondecreasing in ``work``, so a lower bound on the work gives one on the time.
    Numbers or arrays (broadcast); priced by the compiled core."""
    if not (np.ndim(work) or np.ndim(comm) or np.ndim(weight)):
        return _pricing.overlap(float(work), float(comm), float(weight))
    w, c, g = (
        np.ascontiguousarray(x, dtype=float) for x in np.broadcast_arrays(work, comm, weight)
    )
    out = np.empty(w.shape)
    _pricing.overlap(w, c, g, out)
    return out


def output_groups(
    planning, dims: tuple[LayerDims, ...], u: int
) -> list[tuple[float, tuple[int, ...], float]]:
    """The tensors node ``u`` sends: (elements at ``dims``, consumers reading it, times its
    forward part moves). Consumers that read the same graph layer's output read one tensor.
    Under recomputation a tensor that a checkpointed block sends to a consumer inside itself
    moves forward twice: its backward recomputes the block from its checkpoints, re-layouts
    included (docs/costmodel.md section 6.3)."""
    groups: dict[str, tuple[float, list[int]]] = {}
    for v, p in planning.out_edges[u]:
        node = planning.nodes[v]
        size = node.fractions[p] * dims[v].in_elements
        key = node.sources[p] if node.sources else f"#{v}"
        groups.setdefault(key, (size, []))[1].append(v)
    # a node in a checkpointed block has a checkpoint part >= 0 (-1: per-layer or none)
    block = planning.blocks[u] if dims[u].recompute and dims[u].checkpoint >= 0 else -1
    return [
        (
            size,
            tuple(dict.fromkeys(vs)),
            2.0 if block >= 0 and any(planning.blocks[v] == block for v in vs) else 1.0,
        )
        for size, vs in groups.values()
    ]


def node_terms(
    tables, side: SideSpec, groups, u: int, idx, regions=None, leaf_pair: bool = True
) -> NodeTerms:
    """Time terms of node ``u`` with its state index ``idx[u]`` and each consumer's ``idx[v]``
    (integer arrays that broadcast; ``tables[v]`` the :class:`StateTable` of node ``v``;
    ``groups`` from :func:`output_groups` at the root's sizes; ``regions`` every node's
    :class:`~parplan.costmodel.regions.Region` at this group, None at the root; ``leaf_pair``:
    both sides are single devices, which pre-sum gradients). docs/costmodel.md sections 3-5.

    The amounts and seconds are priced by the compiled core (``_pricing.relayout``, the one
    implementation of sections 3, 4, 4.2 and 6.4's receive terms); this function lays the data
    out for it. Each region takes the end of its share interval that makes the amount
    smallest (section 8), so interval states give lower bounds."""
    t = tables[u]
    args, shape = _core_args(tables, side, groups, u, idx, regions, leaf_pair)
    out = np.empty((6, math.prod(shape)))
    _pricing.relayout(*args, out)
    out = out.reshape((6, *shape))
    iu = idx[u]
    compute = (t.compute[0][iu], t.compute[1][iu])
    steps = (t.steps[0][iu], t.steps[1][iu]) if t.steps.shape[2] > 1 else None
    weight = (out[4], out[5]) if side.overlap else (0.0, 0.0)
    return NodeTerms(
        compute, (out[2], out[3]), (out[0], out[1]), (t.intra[0][iu], t.intra[1][iu]), steps, weight
    )


def node_values(
    tables,
    side: SideSpec,
    groups,
    u: int,
    idx,
    regions=None,
    leaf_pair: bool = True,
    objective: "Objective" = None,
    spec: tuple | None = None,
) -> np.ndarray:
    """``node_value(node_terms(...), objective)`` without a floor, in one pass of the compiled
    core over the grid (what the planners' factor tables hold; nothing but the values is
    stored). Same arguments as :func:`node_terms`; the array has the index grid's shape.
    ``spec``: :func:`core_spec` of these arguments, made once by a caller that prices one
    node at many index grids (the local search). ``idx=None``: the whole grid of the scope's
    states, member ``j`` on axis ``j`` (a factor table)."""
    args, shape = _core_args(tables, side, groups, u, idx, regions, leaf_pair, spec)
    return _values(args, shape, tables[u].steps, objective)


def _values(args: tuple, shape: tuple, steps: np.ndarray, objective) -> np.ndarray:
    """``_pricing.values`` over the grid ``shape`` (``args``: :func:`_core_args`' arguments;
    ``steps``: the producer's table's; ``objective`` None is the time)."""
    out = np.empty(math.prod(shape))
    _pricing.values(
        *args,
        steps if steps.flags.c_contiguous else np.ascontiguousarray(steps),
        0 if objective is None or objective is Objective.TIME else 1,
        out,
    )
    return out.reshape(shape)


def line_values(spec: tuple, steps: np.ndarray, states, axis: int, n: int, objective) -> np.ndarray:
    """:func:`node_values` along one line: the scope's member ``axis`` in each of its ``n``
    states, every other member ``j`` in state ``states[j]`` (the local search's question, asked
    tens of thousands of times; ``spec``: :func:`core_spec`'s, ``steps`` the node's table's)."""
    _, (packed, tensors, side_t) = spec
    try:
        ix = [_POINTS[s] for s in states]
    except IndexError:
        _grow_points(max(max(states), 0))
        ix = [_POINTS[s] for s in states]
    ix[axis] = _line(n)
    key = (len(states), axis, n > 1)
    strides = _STRIDES.get(key)
    if strides is None:
        strides = _STRIDES[key] = tuple(1 if j == axis and n > 1 else 0 for j in range(len(states)))
    return _values((packed, tuple(ix), strides, (n,), tensors, side_t), (n,), steps, objective)


@functools.lru_cache(maxsize=4096)
def _line(n: int) -> np.ndarray:
    """The states 0 .. n-1 (read-only: shared)."""
    a = np.arange(n, dtype=np.int64)
    a.setflags(write=False)
    return a


#: State ``s`` as a 0-d index array, at ``_POINTS[s]`` (read-only: shared by every line; a
#: list, read by index, because a line of a scope of dozens of members reads one per member).
_POINTS: list[np.ndarray] = []
#: (members, axis, whether the line has more than one state) -> the line's strides.
_STRIDES: dict[tuple[int, int, bool], tuple[int, ...]] = {}


def _grow_points(s: int) -> None:
    """Make ``_POINTS`` hold states ``0 .. s`` (a state index of -1 reads the last one: the
    caller replaces it)."""
    for x in range(len(_POINTS), s + 1):
        a = np.array(x, dtype=np.int64)
        a.setflags(write=False)
        _POINTS.append(a)


def core_spec(tables, side: SideSpec, groups, u: int, regions, leaf_pair: bool) -> tuple:
    """(scope, the compiled core's arguments that do not depend on the index grid: the scope's
    packed state tables, the tensors' spec, the side) of node ``u``'s terms."""
    consumers = tuple(dict.fromkeys(v for _, vs, _ in groups for v in vs))
    scope = (u, *consumers)
    place = {w: j for j, w in enumerate(scope)}
    # every region in the node's local frame: translates price alike, to the last bit
    spec = [float(len(groups))]
    if regions is None:
        for size, vs, fwd in groups:
            spec += [size, 0.0, fwd, len(vs), *(place[v] for v in vs)]
    else:
        reg = local_frame(regions, u, consumers)
        g = reg[u].rect("out")
        for size, vs, fwd in groups:
            m = [reg[v].rect("in") for v in vs]
            if all(mv == g for mv in m):
                # the group holds exactly what its consumers need of this tensor: its own frame, where
                # every region is a prefix of a side's own share (the closed forms of section 3)
                spec += [size * rect_area(g), 0.0, fwd, len(vs), *(place[v] for v in vs)]
            else:
                if len(vs) > REGION_MAX_CONSUMERS:
                    raise TableTooLarge(
                        f"a tensor read by {len(vs)} consumers where they need other parts of it than its producer "
                        f"holds: its areas take 2^{len(vs)} terms per state (limit {REGION_MAX_CONSUMERS} consumers)"
                    )
                spec += [
                    size,
                    1.0,
                    fwd,
                    len(vs),
                    *(place[v] for v in vs),
                    *g,
                    *(x for mv in m for x in mv),
                ]
    return scope, (
        tuple(tables[w].packed for w in scope),
        np.array(spec, dtype=float),
        _side_tuple(side, leaf_pair),
    )


def _core_args(
    tables, side: SideSpec, groups, u: int, idx, regions, leaf_pair: bool, spec=None
) -> tuple[tuple, tuple]:
    """(the compiled core's arguments but the output, the index grid's shape) for node ``u``'s
    terms (see :func:`node_terms`; ``spec``: :func:`core_spec`'s, made already)."""
    scope, (packed, tensors, side_t) = (
        spec if spec is not None else core_spec(tables, side, groups, u, regions, leaf_pair)
    )
    if idx is None:  # the whole grid, member j on axis j: a factor table
        sizes = tuple(tables[w].size for w in scope)
        return (packed, *_full_grid(sizes), sizes, tensors, side_t), sizes
    ix = [idx[w] for w in scope]
    if all(type(i) is np.ndarray and i.ndim <= 1 and i.dtype == np.int64 for i in ix):
        # points and lines of one length (the local search's calls): the general case's strides
        lines = {len(i) for i in ix if i.ndim}
        if len(lines) <= 1 and all(i.flags.c_contiguous for i in ix):
            shape = tuple(lines)  # one stride per member and grid dimension (none for a point)
            strides = [1 if i.ndim and len(i) > 1 else 0 for i in ix] if shape else []
            return (packed, tuple(ix), tuple(strides), shape, tensors, side_t), shape
    shape = np.broadcast_shapes(*(np.shape(i) for i in ix)) if any(np.ndim(i) for i in ix) else ()
    nd = len(shape)
    indices, strides = [], []
    for i in ix:
        a = np.asarray(i, dtype=np.int64, order="C")
        pad = (1,) * (nd - a.ndim) + a.shape
        indices.append(a)
        strides += [0 if n == 1 else s // 8 for n, s in zip(pad, (0,) * (nd - a.ndim) + a.strides)]
    return (packed, tuple(indices), tuple(strides), tuple(shape), tensors, side_t), tuple(shape)


@functools.lru_cache(maxsize=4096)
def _full_grid(sizes: tuple[int, ...]) -> tuple[tuple[np.ndarray, ...], tuple[int, ...]]:
    """The core's indices and strides of the whole grid over members of ``sizes`` states, member
    ``j`` on axis ``j`` (what :func:`_core_args` derives from ``arange`` index arrays, made once
    per sizes)."""
    k = len(sizes)
    strides = tuple(1 if d == j and sizes[j] > 1 else 0 for j in range(k) for d in range(k))
    return tuple(_line(n) for n in sizes), strides


def _side_tuple(side: SideSpec, leaf_pair: bool) -> tuple[float, ...]:
    """The split's figures the core reads (``_pricing.relayout``'s ``side``)."""
    return (
        float(side.bytes_per_element),
        float(side.bytes_per_s[0]),
        float(side.bytes_per_s[1]),
        float(side.latency_s),
        float(side.micro_batches),
        float(side.zero_stage),
        float(side.overlap),
        float(leaf_pair),
    )


def node_value(terms: NodeTerms, objective: Objective, floor: float = 0.0):
    """A node's contribution to a planner's objective: ``max(T_1, T_2)`` floored (time) or the
    elements both sides receive (communication)."""
    if objective is Objective.COMMUNICATION:
        return terms.received[0] + terms.received[1]
    if terms.steps is not None:
        # an interval state: side 1's compute grows and side 2's shrinks with the share, so on
        # each sub-interval max(T_1, T_2) >= max(T_1 at its start, T_2 at its end)
        s1, s2 = terms.steps
        c1, c2 = np.asarray(terms.comm[0])[..., None], np.asarray(terms.comm[1])[..., None]
        w1, w2 = np.asarray(terms.weight[0])[..., None], np.asarray(terms.weight[1])[..., None]
        t = np.maximum(overlap_time(s1[..., :-1], c1, w1), overlap_time(s2[..., 1:], c2, w2)).min(
            axis=-1
        )
        return floored_time(t, floor)
    t1, t2 = terms.times()
    return floored_time(np.maximum(t1, t2), floor)


def cuts_below(above, split) -> tuple[tuple[bool, bool], ...]:
    """Per node, for the children of ``split``: whether this split or one above divided its rows
    / its output columns with work on both sides (see :meth:`StateTable.build`)."""
    out = []
    for cut, c, a in zip(above, split.choices, split.shares):
        if 0.0 < a < 1.0:
            flags = _CUTS.get(c)
            if flags is None:
                flags = _CUTS[c] = ("rows" in split_axes(c), ports(c).give_out is Layout.COLS)
            cut = _CUT_PAIRS[(cut[0] or flags[0], cut[1] or flags[1])]
        out.append(cut)
    return tuple(out)


#: Per choice: (whether it divides rows, whether it gives out columns), :func:`cuts_below`'s.
_CUTS: dict = {}
#: The four (rows, cols) pairs as one object each (tuples of them compare by identity).
_CUT_PAIRS = {(r, c): (r, c) for r in (False, True) for c in (False, True)}


def covered_below(covered: tuple[bool, ...], split, has_collective: bool) -> tuple[bool, ...]:
    """Which nodes the children of a split see as covered by an enclosing BATCH all-reduce: one
    priced at this split, where BATCH (or a join's ROWS) gives both sides work (docs/costmodel.md
    section 2). A share of 0 or 1 runs the node on one side and prices no all-reduce here, so
    it covers nothing below."""
    if not has_collective:
        return covered
    return tuple(
        cv or (0.0 < a < 1.0 and "rows" in split_axes(c))
        for cv, c, a in zip(covered, split.choices, split.shares)
    )


__all__ = [
    "DEFAULT_OPTIMIZER_BYTES",
    "DEFAULT_SHARE_GRID",
    "FLOOR_TIE_WEIGHT",
    "NodeTerms",
    "Objective",
    "REL_TOL",
    "ShareMode",
    "allreduce_factor",
    "SideSpec",
    "StateTable",
    "covered_below",
    "cuts_below",
    "floored_time",
    "intra_elements",
    "receive_seconds",
    "overlap_time",
    "terms_matrix",
    "OVERLAP_WINDOW",
    "ShareSet",
    "side_dims",
    "share_intervals",
    "node_terms",
    "node_values",
    "line_values",
    "node_value",
    "output_groups",
    "clear_scaled",
    "scale_for_sides",
    "share_points",
    "zero_dims",
]
