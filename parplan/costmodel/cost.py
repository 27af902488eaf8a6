"""Costs of one node at one split: communication per side, the two side times, the best share
(SPEC sections 2-5). Every planner and the evaluator price through these functions.

For node ``v`` with choice ``c``, side-1 share ``a`` and predecessor choices ``c_u``, side ``i``
receives ``intra_i(c) * |T_c| + sum_u transition_i(c_u, c) * |edge u->v|`` elements, and

    T_1 = a * FLOPs / C_1       + [L] + bytes(comm_1) / BW
    T_2 = (1 - a) * FLOPs / C_2 + [L] + bytes(comm_2) / BW,     node time = max(T_1, T_2).

The latency ``L`` is paid by a node that exchanges anything in this configuration (every
weighted layer does; a join only if a re-layout reaches it).

Example (one layer, no predecessor, two equal devices):
    >>> from parplan.costmodel.dims import LayerDims
    >>> from parplan.costmodel.layout import PartitionType
    >>> d = LayerDims(batch=8, in_features=64, out_features=64, in_spatial=1, out_spatial=1, kernel=1)
    >>> side = SideSpec(flops_per_s=(1e9, 1e9), bytes_per_s=1e9, latency_s=0.0, bytes_per_element=2)
    >>> e1, e2 = node_comm(d, PartitionType.BATCH, (), ())
    >>> e1.at(0.5), e2.at(0.5)
    (4096.0, 4096.0)
    >>> a, t = best_share(d.flops, e1, e2, True, side)
    >>> a, round(t * 1e6, 3)
    (0.5, 106.496)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

from parplan.costmodel.collective import Collective
from parplan.costmodel.dims import LayerDims
from parplan.costmodel.layout import (
    Choice,
    Layout,
    PartitionType,
    ShareExpr,
    Tensor,
    ZERO,
    intra,
    transition,
)

#: Relative tolerance used to compare times (ties, balance points).
REL_TOL = 1e-12
#: Weight of a node's own time when it sits under a floor (see :func:`floored_time`).
FLOOR_TIE_WEIGHT = 1e-6


def floored_time(t: float, floor: float) -> float:
    """Cost of a node time ``t`` at a split whose sibling sets ``floor`` (SPEC 5: the node's
    time at the parent is the max over both groups): ``max(t, floor)``, plus a tiny weight on
    ``t`` itself so that configurations under the floor are not all tied (the faster one wins,
    which leaves slack for the levels below). No floor, no change.
    """
    return max(t, floor) + FLOOR_TIE_WEIGHT * t if floor > 0 else t


class Objective(Enum):
    """What a planner minimises (SPEC section 4)."""

    TIME = "time"  # step time: compute + communication, AccPar
    COMMUNICATION = "communication"  # elements moved, HyPar and the published AccPar code


class ShareMode(Enum):
    """How the side-1 share of every node is chosen."""

    FREE = "free"  # continuous, optimised per node (AccPar's flexible ratio)
    HALF = "half"  # 1/2 (homogeneous baselines, HyPar)
    PROPORTIONAL = "proportional"  # C_1 / (C_1 + C_2)


@dataclass(frozen=True)
class SideSpec:
    """What one split looks like to the cost model: side throughputs, the link, element size."""

    flops_per_s: tuple[float, float]
    bytes_per_s: float
    latency_s: float
    bytes_per_element: float
    #: Price BATCH gradient exchange with this all-reduce (see collective.py); None = SPEC 2.
    collective: Collective | None = None
    hosts: int = 2  # devices in the group being split

    def fixed_share(self, mode: ShareMode) -> float:
        if mode is ShareMode.HALF:
            return 0.5
        if mode is ShareMode.PROPORTIONAL:
            c1, c2 = self.flops_per_s
            return c1 / (c1 + c2)
        raise ValueError("free shares are optimised, not fixed")


def tensor_elements(dims: LayerDims, tensor: Tensor) -> float:
    if tensor is Tensor.WEIGHT:
        return dims.weight_elements
    if tensor is Tensor.OUTPUT:
        return dims.out_elements
    return dims.in_elements


@lru_cache(maxsize=1 << 18)
def node_comm(
    dims: LayerDims,
    choice: Choice,
    pred_choices: tuple[Choice, ...],
    fractions: tuple[float, ...],
) -> tuple[ShareExpr, ShareExpr]:
    """Elements received by (side 1, side 2) for a node, as functions of its side-1 share."""
    tensor, (i1, i2) = intra(choice)
    size = tensor_elements(dims, tensor) if tensor is not None else 0.0
    # accumulate coefficients as floats: this is the planners' innermost loop
    a0, a1, aq = i1.c0 * size, i1.c1 * size, i1.q * size
    b0, b1, bq = i2.c0 * size, i2.c1 * size, i2.q * size
    for pc, frac in zip(pred_choices, fractions):
        t1, t2 = transition(pc, choice)
        edge = dims.in_elements * frac
        a0, a1, aq = a0 + t1.c0 * edge, a1 + t1.c1 * edge, aq + t1.q * edge
        b0, b1, bq = b0 + t2.c0 * edge, b1 + t2.c1 * edge, bq + t2.q * edge
    return ShareExpr(a0, a1, aq), ShareExpr(b0, b1, bq)


def intra_elements(dims: LayerDims, choice: Choice, a: float) -> tuple[float, float]:
    """Intra-layer elements received by (side 1, side 2) at share ``a`` (SPEC 2)."""
    tensor, (i1, i2) = intra(choice)
    if tensor is None:
        return 0.0, 0.0
    size = tensor_elements(dims, tensor)
    return i1.at(a) * size, i2.at(a) * size


def side_times(flops: float, e1: ShareExpr, e2: ShareExpr, exchanges: bool, side: SideSpec, a: float,
               extra_s: float = 0.0):
    """(T_1, T_2) at side-1 share ``a``; ``extra_s`` is a share-independent time on both sides."""
    c1, c2 = side.flops_per_s
    lat = side.latency_s if exchanges else 0.0
    k = side.bytes_per_element / side.bytes_per_s
    t1 = a * flops / c1 + lat + k * e1.at(a) + extra_s
    t2 = (1.0 - a) * flops / c2 + lat + k * e2.at(a) + extra_s
    return t1, t2


def node_terms(
    dims: LayerDims, choice: Choice, pred_choices: tuple[Choice, ...], fractions: tuple[float, ...],
    side: SideSpec, covered: bool = False,
) -> tuple[ShareExpr, ShareExpr, bool, float]:
    """(elements side 1, elements side 2, pays latency, extra seconds) of a node's time.

    Without a collective this is :func:`node_comm` and no extra time. With one, a BATCH node's
    gradient exchange leaves the link terms: it costs one all-reduce over the group's devices
    (``extra``), or nothing if ``covered`` (an enclosing split of this node was BATCH and paid
    for the whole region; see :mod:`parplan.costmodel.collective`).
    """
    e1, e2 = node_comm(dims, choice, pred_choices, fractions)
    if side.collective is None or choice is not PartitionType.BATCH:
        return e1, e2, exchanges(e1, e2, choice), 0.0
    w = dims.weight_elements
    e1, e2 = e1 + ShareExpr(-w), e2 + ShareExpr(-w)
    extra = 0.0 if covered else side.collective.allreduce_seconds(
        side.hosts, w * side.bytes_per_element, side.bytes_per_s, side.latency_s)
    return e1, e2, not (e1.is_zero and e2.is_zero), extra


def covered_below(covered: tuple[bool, ...], split, has_collective: bool) -> tuple[bool, ...]:
    """Which nodes the children of a split see as covered by an enclosing BATCH all-reduce."""
    if not has_collective:
        return covered
    return tuple(cv or c is PartitionType.BATCH for cv, c in zip(covered, split.choices))


def comm_seconds(
    dims: LayerDims, choice: Choice, pred_choices: tuple[Choice, ...], fractions: tuple[float, ...],
    side: SideSpec, a: float, covered: bool = False,
) -> tuple[float, float]:
    """Communication part (latency + transfer) of (T_1, T_2) for a node at share ``a``."""
    e1, e2, ex, extra = node_terms(dims, choice, pred_choices, fractions, side, covered)
    return side_times(0.0, e1, e2, ex, side, a, extra)


def split_time(flops: float, e1: ShareExpr, e2: ShareExpr, exchanges: bool, side: SideSpec, a: float,
               extra_s: float = 0.0) -> float:
    """max(T_1, T_2) at side-1 share ``a``."""
    return max(side_times(flops, e1, e2, exchanges, side, a, extra_s))


def share_candidates(flops: float, e1: ShareExpr, e2: ShareExpr, side: SideSpec) -> tuple[float, ...]:
    """Shares among which the best one lies: 0, 1 and the balance point of the linear parts.

    The quadratic term ``q*a(1-a)`` is the same on both sides, so
    ``max(T_1, T_2) = q*a(1-a) + max(lin_1(a), lin_2(a))``: on each side of the point where the
    linear parts cross the function is concave, hence minimised at a piece's end.
    """
    c1, c2 = side.flops_per_s
    k = side.bytes_per_element / side.bytes_per_s
    # lin_1(a) - lin_2(a) = s*a + r
    s = flops / c1 + flops / c2 + k * (e1.c1 - e2.c1)
    r = k * (e1.c0 - e2.c0) - flops / c2
    out = [0.0, 1.0]
    if s != 0.0:
        cross = -r / s
        if 0.0 < cross < 1.0:
            out.insert(1, cross)
    return tuple(out)


def best_share(flops: float, e1: ShareExpr, e2: ShareExpr, exchanges: bool, side: SideSpec,
               extra_s: float = 0.0) -> tuple[float, float]:
    """(share, time) minimising max(T_1, T_2) over a in [0, 1] (exact, see :func:`share_candidates`).

    Ties prefer the balance point, then a = 0, then a = 1.
    """
    if abs(e1.q - e2.q) > REL_TOL * max(1.0, abs(e1.q)):
        raise ValueError("quadratic communication terms differ between sides")  # cannot happen (layout.py)
    cands = share_candidates(flops, e1, e2, side)
    order = (cands[1:-1] + cands[:1] + cands[-1:]) if len(cands) == 3 else cands
    best_a, best_t = order[0], split_time(flops, e1, e2, exchanges, side, order[0], extra_s)
    for a in order[1:]:
        t = split_time(flops, e1, e2, exchanges, side, a, extra_s)
        if t < best_t * (1.0 - REL_TOL):
            best_a, best_t = a, t
    return best_a, best_t


def scale_for_sides(dims: LayerDims, choice: Choice, a: float) -> tuple[LayerDims, LayerDims]:
    """Dims each side is left with (SPEC 5): BATCH/ROWS scale B, IN scales Di, OUT scales Do,
    COLS scales the channels of a join; WHOLE leaves the join whole on both sides."""
    b = 1.0 - a
    if choice in (PartitionType.BATCH, Layout.ROWS):
        return dims.scaled(batch=a), dims.scaled(batch=b)
    if choice is PartitionType.IN:
        return dims.scaled(in_features=a), dims.scaled(in_features=b)
    if choice is PartitionType.OUT:
        return dims.scaled(out_features=a), dims.scaled(out_features=b)
    if choice is Layout.COLS:
        return dims.scaled(in_features=a, out_features=a), dims.scaled(in_features=b, out_features=b)
    return dims, dims


def exchanges(e1: ShareExpr, e2: ShareExpr, choice: Choice) -> bool:
    """Whether the node pays the link latency in this configuration."""
    return isinstance(choice, PartitionType) or not (e1.is_zero and e2.is_zero)


__all__ = [
    "Objective",
    "ShareMode",
    "SideSpec",
    "ZERO",
    "best_share",
    "comm_seconds",
    "intra_elements",
    "covered_below",
    "node_cost",
    "node_memory",
    "node_terms",
    "exchanges",
    "floored_time",
    "node_comm",
    "scale_for_sides",
    "share_candidates",
    "side_times",
    "split_time",
    "tensor_elements",
]


def node_memory(dims: LayerDims, choice: Choice) -> tuple[ShareExpr, ShareExpr]:
    """Elements held by (side 1, side 2) for a node: weights + gradients + the stored input
    activation (needed by the gradient product), as functions of the side-1 share ``a``.

    It equals ``2 * |W| + |F[l]|`` of the dims :func:`scale_for_sides` leaves each side, so a
    device's memory is this sum over nodes at the leaves. Joins hold nothing of their own.
    """
    if not isinstance(choice, PartitionType):
        return ZERO, ZERO
    w, x = dims.weight_elements, dims.in_elements
    if choice is PartitionType.BATCH:
        return ShareExpr(2 * w, x), ShareExpr(2 * w + x, -x)
    if choice is PartitionType.IN:
        return ShareExpr(0.0, 2 * w + x), ShareExpr(2 * w + x, -(2 * w + x))
    return ShareExpr(x, 2 * w), ShareExpr(2 * w + x, -2 * w)


@lru_cache(maxsize=1 << 18)
def node_cost(
    dims: LayerDims,
    choice: Choice,
    pred_choices: tuple[Choice, ...],
    fractions: tuple[float, ...],
    side: SideSpec,
    objective: Objective,
    shares: ShareMode,
    covered: bool = False,
) -> tuple[float, float]:
    """(share, value) of one node in one configuration: the share a planner uses and what it costs.

    ``objective`` TIME: value = max(T_1, T_2) seconds, with the best share if ``shares`` is FREE.
    ``objective`` COMMUNICATION: value = elements received by both sides at the fixed share.
    ``covered``: see :func:`node_terms` (only matters with a collective on the array).
    """
    if objective is Objective.COMMUNICATION:
        e1, e2 = node_comm(dims, choice, pred_choices, fractions)
        a = side.fixed_share(shares)
        return a, e1.at(a) + e2.at(a)
    e1, e2, ex, extra = node_terms(dims, choice, pred_choices, fractions, side, covered)
    if shares is ShareMode.FREE:
        return best_share(dims.flops, e1, e2, ex, side, extra)
    a = side.fixed_share(shares)
    return a, split_time(dims.flops, e1, e2, ex, side, a, extra)
