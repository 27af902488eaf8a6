"""Partition types, tensor layouts and the layout algebra that derives every communication amount
(SPEC sections 2-3).

A split divides a layer between side 1 (share ``a``) and side 2 (share ``1 - a``). Each tensor
on each side is in one :class:`Layout`: ROWS (split on the batch), COLS (split on features),
WHOLE, or PARTIAL (a full-size partial sum). :func:`conversion` says what a side receives to
turn one layout into another; the intra-layer reductions and the inter-layer re-layout table
both follow from it.

Amounts are :class:`ShareExpr` in the side-1 share ``a``: ``c0 + c1*a + q*a*(1-a)`` times
the tensor size. The quadratic coefficient is always the same on both sides (rows <-> columns
moves ``a(1-a)|T|`` each way), which the share optimiser relies on.

Example (HyPar's published table at a = 1/2, in units of |F| = |E| = A):
    >>> e1, _ = transition(PartitionType.BATCH, PartitionType.IN)
    >>> e1.at(0.5)
    0.5
    >>> transition(PartitionType.IN, PartitionType.OUT)[0].at(0.5)
    0.0
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import cache


class PartitionType(Enum):
    """How a weighted layer is split between two groups (named by the dimension split)."""

    BATCH = "batch"  # Type-I, data parallelism: F, E split on B, W replicated
    IN = "in"  # Type-II, Di split: HyPar's model parallelism, OWT's FC choice
    OUT = "out"  # Type-III, Do split: the configuration AccPar adds

    @property
    def roman(self) -> str:
        return {"batch": "I", "in": "II", "out": "III"}[self.value]


class Layout(Enum):
    """Layout of one tensor on one side; also the three choices of a join (add/concat) node."""

    ROWS = "rows"
    COLS = "cols"
    WHOLE = "whole"
    PARTIAL = "partial"


#: Choices of a join node (it keeps its inputs' and output's layout equal).
JOIN_LAYOUTS = (Layout.ROWS, Layout.COLS, Layout.WHOLE)
#: Deterministic tie-break order (SPEC section 3): BATCH, then IN, then OUT.
TYPE_ORDER = (PartitionType.BATCH, PartitionType.IN, PartitionType.OUT)

Choice = PartitionType | Layout


@dataclass(frozen=True)
class ShareExpr:
    """Amount ``c0 + c1*a + q*a*(1-a)`` as a function of the side-1 share ``a``."""

    c0: float = 0.0
    c1: float = 0.0
    q: float = 0.0

    def at(self, a: float) -> float:
        return self.c0 + self.c1 * a + self.q * a * (1.0 - a)

    def __add__(self, other: "ShareExpr") -> "ShareExpr":
        return ShareExpr(self.c0 + other.c0, self.c1 + other.c1, self.q + other.q)

    def __mul__(self, k: float) -> "ShareExpr":
        return ShareExpr(self.c0 * k, self.c1 * k, self.q * k)

    __rmul__ = __mul__

    @property
    def is_zero(self) -> bool:
        return self.c0 == 0.0 and self.c1 == 0.0 and self.q == 0.0


ZERO = ShareExpr()
_SPLIT = (Layout.ROWS, Layout.COLS)


def conversion(src: Layout, dst: Layout) -> tuple[ShareExpr, ShareExpr]:
    """Fraction of a tensor that (side 1, side 2) receive to go from layout ``src`` to ``dst``.

    Side 1 holds share ``a``, side 2 share ``1 - a``; both sides use the same share.
    rows <-> cols: each side misses the other's part of its own slice, ``a(1-a)``;
    split -> whole: the other side's part; partial -> whole: the other side's full partial;
    partial -> split: the other side's partial of one's own slice; whole -> anything: nothing.
    """
    if dst is Layout.PARTIAL:
        raise ValueError("no layout converts into a partial sum")
    if src is dst or src is Layout.WHOLE:
        return ZERO, ZERO
    if dst is Layout.WHOLE:
        if src is Layout.PARTIAL:
            return ShareExpr(1.0), ShareExpr(1.0)
        return ShareExpr(1.0, -1.0), ShareExpr(0.0, 1.0)  # (1-a) and a
    if src is Layout.PARTIAL:  # reduce-scatter into one's own slice
        return ShareExpr(0.0, 1.0), ShareExpr(1.0, -1.0)
    return ShareExpr(q=1.0), ShareExpr(q=1.0)  # rows <-> cols


@dataclass(frozen=True)
class Ports:
    """Layouts at a node's two boundaries. F and E share a layout at each port (SPEC 3)."""

    need_in: Layout  # layout of F[l] it needs; it gives E[l] in the same layout
    give_out: Layout  # layout of F[l+1] it gives; it needs E[l+1] in the same layout


_PORTS = {
    PartitionType.BATCH: Ports(Layout.ROWS, Layout.ROWS),
    PartitionType.IN: Ports(Layout.COLS, Layout.WHOLE),  # F[l+1] whole after its reduction
    PartitionType.OUT: Ports(Layout.WHOLE, Layout.COLS),  # E[l] whole after its reduction
}


def ports(choice: Choice) -> Ports:
    """Boundary layouts of a weighted layer's type or a join's layout."""
    if isinstance(choice, PartitionType):
        return _PORTS[choice]
    if choice in JOIN_LAYOUTS:
        return Ports(choice, choice)
    raise ValueError(f"{choice!r} is not a node choice")


class Tensor(Enum):
    """Which tensor a type reduces inside the layer (the intra-layer communication)."""

    WEIGHT = "W"  # dW, |W|
    OUTPUT = "F_out"  # F[l+1], |F[l+1]|
    INPUT = "E_in"  # E[l], |E[l]|


#: The tensor each type leaves as a full-size partial sum (SPEC section 2).
PARTIAL_TENSOR = {
    PartitionType.BATCH: Tensor.WEIGHT,
    PartitionType.IN: Tensor.OUTPUT,
    PartitionType.OUT: Tensor.INPUT,
}


@cache
def intra(choice: Choice) -> tuple[Tensor | None, tuple[ShareExpr, ShareExpr]]:
    """The reduced tensor and the fractions of it each side receives (PARTIAL -> WHOLE)."""
    if not isinstance(choice, PartitionType):
        return None, (ZERO, ZERO)
    return PARTIAL_TENSOR[choice], conversion(Layout.PARTIAL, Layout.WHOLE)


@cache
def transition(producer: Choice, consumer: Choice) -> tuple[ShareExpr, ShareExpr]:
    """Fractions of A = |F[l]| = |E[l]| received by (side 1, side 2) on a boundary.

    Forward, F goes from the producer's output layout to the consumer's input layout;
    backward, E goes from the consumer's input layout to the producer's output layout.
    """
    give, need = ports(producer).give_out, ports(consumer).need_in
    f1, f2 = conversion(give, need)
    e1, e2 = conversion(need, give)
    return f1 + e1, f2 + e2


def choice_name(choice: Choice) -> str:
    return choice.value


def parse_choice(text: str) -> Choice:
    """Inverse of :func:`choice_name`."""
    for c in (*TYPE_ORDER, *JOIN_LAYOUTS):
        if c.value == text:
            return c
    raise ValueError(f"unknown choice '{text}'")
