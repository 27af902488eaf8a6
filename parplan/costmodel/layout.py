"""Partition types, tensor layouts and the rules of the region algebra that derives every
communication amount (docs/costmodel.md, sections 2 and 3).

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

These rules are computed by the compiled core (``parplan/costmodel/_pricing.c``, the one
implementation; docs/architecture.md); this module names the types, layouts and ports.

Example (HyPar's published table at a = 1/2: BATCH -> IN moves 0.25|F| + 0.25|E| per side):
    >>> transition_table(PartitionType.BATCH, PartitionType.IN, 0.5)
    (0.5, 0.5)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class PartitionType(Enum):
    """How a weighted layer is split between two groups (named by the dimension split)."""

    # members are singletons compared by identity: hash them so, in C (Enum hashes its name
    # in Python, 8 M times on a 1,024-layer chain / h100:128)
    __hash__ = object.__hash__

    BATCH = "batch"  # Type-I, data parallelism: F, E split on B, W replicated
    IN = "in"  # Type-II, Di split: HyPar's model parallelism, OWT's FC choice
    OUT = "out"  # Type-III, Do split: the configuration AccPar adds

    @property
    def roman(self) -> str:
        return {"batch": "I", "in": "II", "out": "III"}[self.value]


class Layout(Enum):
    """Layout of one tensor on one side; also the three choices of a join (add/concat) node."""

    # members are singletons compared by identity: hash them so, in C (Enum hashes its name
    # in Python, 8 M times on a 1,024-layer chain / h100:128)
    __hash__ = object.__hash__

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


#: The axes of a node's region (docs/costmodel.md section 3: rows, input columns, output columns)
#: each choice divides between the sides: the one table the region algebra, the sides' sizes
#: (``cost.scale_for_sides``) and the executor's boxes read.
SPLIT_AXES = {
    PartitionType.BATCH: ("rows",),
    PartitionType.IN: ("ins",),
    PartitionType.OUT: ("outs",),
    Layout.ROWS: ("rows",),
    Layout.COLS: ("ins", "outs"),
    Layout.WHOLE: (),
}


def split_axes(choice: Choice) -> tuple[str, ...]:
    """:data:`SPLIT_AXES` of ``choice``; a ValueError for anything that is not a node choice."""
    try:
        return SPLIT_AXES[choice]
    except (KeyError, TypeError):
        raise ValueError(f"{choice!r} is not a node choice") from None


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


#: Integer codes of the layouts, for arrays of states (the compiled core's layout codes).
LAYOUT_CODE = {Layout.ROWS: 0, Layout.COLS: 1, Layout.WHOLE: 2}


def choice_name(choice: Choice) -> str:
    return choice.value


def parse_choice(text: str) -> Choice:
    """Inverse of :func:`choice_name`."""
    for c in (*TYPE_ORDER, *JOIN_LAYOUTS):
        if c.value == text:
            return c
    raise ValueError(f"unknown choice '{text}'")


def transition_table(
    producer: Choice, consumer: Choice, a: float, a_next: float | None = None
) -> tuple[float, float]:
    """Fractions of ``|F| = |E|`` received by (side 1, side 2) on one edge, forward plus
    backward, the producer at share ``a`` and the consumer at ``a_next`` (default ``a``),
    priced by the compiled core's closed forms (section 3).

    At ``a = a_next = 1/2`` this is HyPar's and the published AccPar code's table.
    """
    from parplan.costmodel.compiled import core as _pricing

    b = a if a_next is None else a_next
    give, need = LAYOUT_CODE[ports(producer).give_out], LAYOUT_CODE[ports(consumer).need_in]
    return _pricing.edge(give, need, float(a), float(b)), _pricing.edge(
        give, need, 1.0 - a, 1.0 - b
    )
