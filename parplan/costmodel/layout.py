"""Partition types, tensor layouts and the region algebra that derives every communication
amount (docs/costmodel.md, sections 2 and 3).

A split divides a layer between side 1 (share ``a``) and side 2 (share ``1 - a``). Seen from
one side with its *own* share ``s`` (``a`` for side 1, ``1 - a`` for side 2), a tensor of one
layer is a unit square (rows = batch, columns = features) and a layout is the part of it the
side holds or needs:

- ROWS at ``s``: the first ``s`` of the rows, ``rect(s, 1)``;
- COLS at ``s``: the first ``s`` of the columns, ``rect(1, s)``;
- WHOLE at ``s``: everything if the side has work (``s > 0``), else nothing.

(Side 2's rows are the last ``1 - a``; mirroring both axes makes them a prefix too, so one
formula serves both sides.) Every region is an origin-anchored rectangle ``rect(X, Y)``; a
union of needs is an L-shape ``rect(x, 1) | rect(1, y)``; an intersection of holdings is a
rectangle. A side *receives* the area it needs and does not hold:

- forward (F), a producer's output to all consumers reading the same tensor: the union of
  their needs minus what the side holds (what is sent once is paid once);
- backward (E), the consumers' gradients to the producer: what the producer needs minus what
  *every* consumer's gradient already has on this side (the other side pre-sums the rest);
- intra-layer reduction of a type's partial sum: the other side's full partial, if both sides
  have work (``0 < a < 1``).

Example (HyPar's published table at a = 1/2: BATCH -> IN moves 0.25|F| + 0.25|E| per side):
    >>> f = forward_received(need_extent(Layout.COLS, 0.5), hold_extent(Layout.ROWS, 0.5))
    >>> e = backward_received(hold_extent(Layout.ROWS, 0.5), hold_extent(Layout.COLS, 0.5))
    >>> float(f), float(e)
    (0.25, 0.25)
    >>> float(forward_received(need_extent(Layout.ROWS, 0.75), hold_extent(Layout.ROWS, 0.5)))
    0.25
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np


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


#: Choices of a join node (it keeps its inputs' and output's layout equal).
JOIN_LAYOUTS = (Layout.ROWS, Layout.COLS, Layout.WHOLE)
#: Deterministic tie-break order (docs/costmodel.md section 3): BATCH, then IN, then OUT.
TYPE_ORDER = (PartitionType.BATCH, PartitionType.IN, PartitionType.OUT)

Choice = PartitionType | Layout


@dataclass(frozen=True)
class Ports:
    """Layouts at a node's two boundaries. F and E share a layout at each port."""

    need_in: Layout  # layout of F[l] it needs; it holds E[l] in the same layout
    give_out: Layout  # layout of F[l+1] it holds; it needs E[l+1] in the same layout


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


#: The tensor each type leaves as a full-size partial sum (docs/costmodel.md section 2).
PARTIAL_TENSOR = {
    PartitionType.BATCH: Tensor.WEIGHT,
    PartitionType.IN: Tensor.OUTPUT,
    PartitionType.OUT: Tensor.INPUT,
}


# ----------------------------------------------------------------------------------------------
# Regions. Every function takes numpy arrays (or floats) and broadcasts.
# ----------------------------------------------------------------------------------------------


#: Integer codes of the layouts, for arrays of states.
LAYOUT_CODE = {Layout.ROWS: 0, Layout.COLS: 1, Layout.WHOLE: 2}


def _code(layout):
    return LAYOUT_CODE[layout] if isinstance(layout, Layout) else np.asarray(layout)


def _scalar(layout, s, has) -> tuple[int, float, float] | None:
    """(code, share, has) as plain numbers when one state is asked for, else None."""
    if type(s) not in _SCALARS or not (has is None or type(has) in _SCALARS):
        if np.ndim(s) or (has is not None and np.ndim(has)):
            return None
    if type(layout) not in _SCALARS and not isinstance(layout, Layout) and np.ndim(layout):
        return None
    s = float(s)
    return _code(layout) if isinstance(layout, Layout) else int(layout), s, float(s > 0 if has is None else has)


#: Types :func:`_scalar` recognises without asking numpy (the evaluator's one-state path).
_SCALARS = frozenset((float, int, bool, np.float64, np.int64, np.bool_))


def hold_extent(layout, s, has=None):
    """(X, Y) of ``rect(X, Y)``: the region of a tensor a side with own share ``s`` holds in
    ``layout`` (a :class:`Layout` or an array of :data:`LAYOUT_CODE` codes). ``has``: whether
    the side has work (default ``s > 0``; a relaxation passes it apart from ``s``)."""
    one = _scalar(layout, s, has)
    if one is not None:
        code, s, h = one
        return (s, 1.0) if code == 0 else ((1.0, s) if code == 1 else (h, h))
    code, s = _code(layout), np.asarray(s, dtype=float)
    has = (s > 0).astype(float) if has is None else np.asarray(has, dtype=float)
    x = np.where(code == 0, s, np.where(code == 1, 1.0, has))
    y = np.where(code == 0, 1.0, np.where(code == 1, s, has))
    return x, y


def need_extent(layout, s, has=None):
    """(x, y) of the L-shape ``rect(x, 1) | rect(1, y)`` a side with own share ``s`` needs in
    ``layout``. Unions of needs are element-wise maxima of these pairs."""
    one = _scalar(layout, s, has)
    if one is not None:
        code, s, h = one
        return (s, 0.0) if code == 0 else ((0.0, s) if code == 1 else (h, h))
    code, s = _code(layout), np.asarray(s, dtype=float)
    has = (s > 0).astype(float) if has is None else np.asarray(has, dtype=float)
    x = np.where(code == 0, s, np.where(code == 1, 0.0, has))
    y = np.where(code == 0, 0.0, np.where(code == 1, s, has))
    return x, y


def union_needs(needs):
    """Union of L-shapes given as (x, y) pairs (broadcasting)."""
    xs, ys = zip(*needs)
    return _reduce(np.maximum, xs), _reduce(np.maximum, ys)


def intersect_holds(holds):
    """Intersection of origin-anchored rectangles given as (X, Y) pairs (broadcasting)."""
    xs, ys = zip(*holds)
    return _reduce(np.minimum, xs), _reduce(np.minimum, ys)


def _reduce(op, arrays):
    out = arrays[0]
    for a in arrays[1:]:
        out = op(out, a)
    return out


def forward_received(need, hold):
    """Area of the L-shape ``need`` = (x, y) outside the rectangle ``hold`` = (X, Y)."""
    x, y = need
    hx, hy = hold
    mx, my = np.minimum(x, hx), np.minimum(y, hy)
    return (x + y - x * y) - (mx * hy + hx * my - mx * my)


def backward_received(need, hold):
    """Area of the rectangle ``need`` = (X, Y) outside the rectangle ``hold`` = (X', Y')."""
    x, y = need
    hx, hy = hold
    return x * y - np.minimum(x, hx) * np.minimum(y, hy)


def choice_name(choice: Choice) -> str:
    return choice.value


def parse_choice(text: str) -> Choice:
    """Inverse of :func:`choice_name`."""
    for c in (*TYPE_ORDER, *JOIN_LAYOUTS):
        if c.value == text:
            return c
    raise ValueError(f"unknown choice '{text}'")


def transition_table(producer: Choice, consumer: Choice, a: float, a_next: float | None = None) -> tuple[float, float]:
    """Fractions of ``|F| = |E|`` received by (side 1, side 2) on one edge, forward plus
    backward, the producer at share ``a`` and the consumer at ``a_next`` (default ``a``).

    At ``a = a_next = 1/2`` this is HyPar's and the published AccPar code's table.
    """
    b = a if a_next is None else a_next
    out = []
    for s_p, s_c in ((a, b), (1.0 - a, 1.0 - b)):
        give, need = ports(producer).give_out, ports(consumer).need_in
        f = forward_received(need_extent(need, s_c), hold_extent(give, s_p))
        e = backward_received(hold_extent(give, s_p), hold_extent(need, s_c))
        out.append(float(f + e))
    return out[0], out[1]
