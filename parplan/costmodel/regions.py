"""Where every node's part of a tensor lies at every group, and what each side of a split
receives (docs/costmodel.md section 3). The reference executor (:mod:`parplan.executor`) moves
exactly these amounts.

A tensor is the unit square: rows are the root batch, columns its columns (for a
concatenation, the same fraction of every input's columns). A node's **region** at a group is
a box: an interval of rows, of input columns and of output columns; the root's is everything.
A split divides one axis of it (BATCH / ROWS: the rows, IN: the input columns, OUT: the output
columns, COLS: both column axes of a join, WHOLE: none): side 1 takes the first part at its
share, side 2 the rest; a side without work keeps nothing. A producer *holds* ``rows x
output columns`` of its output; a consumer *needs* ``rows x input columns`` of its input (and
holds its gradient there).

At a split of group ``g`` into sides 1 and 2, for one tensor with producer regions ``G`` (at g),
``H1``, ``H2`` (the sides) and each consumer's ``M`` (at g), ``P`` (side 1), ``Q`` (side 2):

- **forward** (one copy per point, whatever the number of consumers): points a group needs
  and does not hold arrive once and *land* on its first side that needs them (side 1 if it
  does); so side 1 receives ``U1 & G - H1`` (from side 2), side 2 receives
  ``(U2 - H2) & (G | U1)`` (from side 1, including arrivals that landed there), with ``U1``,
  ``U2`` the unions of the consumers' needs on each side;
- **backward**, per consumer (gradients of different consumers travel apart, as separate
  tensors, when a side is a group of devices): the same rule with holders and needers
  swapped: side 1 receives ``H1 & M - P``, side 2 ``(H2 - Q) & (M | H1)``. Between two single
  devices the contributions of all consumers to a point are pre-summed: one value per point.

At the root every region is the whole square and these reduce to the one-split formulas of
section 3. This module holds the regions; their areas (exactly, by inclusion-exclusion over
boxes) are computed by the compiled core, ``parplan/costmodel/_pricing.c``, the one
implementation of these rules (tests/pricing_oracle.py keeps the Python it replaced). Every
formula is monotone in each region (more held, less received; more needed, more received), so
a relaxation may take each region at the end of its share interval that minimises the amount
and obtain a lower bound (docs/costmodel.md section 8).

Example (a lower split: the group holds rows 0-1/2 of a node's output; a BATCH split at 1/2
leaves side 1 rows 0-1/4 and side 2 rows 1/4-1/2):
    >>> from parplan.costmodel.layout import PartitionType
    >>> g = Region((0.0, 0.5))
    >>> [child_region(g, PartitionType.BATCH, 0.5, s).rows for s in (0, 1)]
    [(0.0, 0.25), (0.25, 0.5)]
"""

from __future__ import annotations

import functools

from dataclasses import dataclass

from parplan.costmodel.dims import by_identity

Rect = tuple  # (x0, x1, y0, y1): arrays or floats, rows x columns


@dataclass(frozen=True)
class Region:
    """A node's box at a group: intervals of root rows, input columns and output columns."""

    rows: tuple[float, float] = (0.0, 1.0)
    ins: tuple[float, float] = (0.0, 1.0)
    outs: tuple[float, float] = (0.0, 1.0)

    @functools.cached_property
    def empty(self) -> bool:
        return not (
            self.rows[1] > self.rows[0]
            and self.ins[1] > self.ins[0]
            and self.outs[1] > self.outs[0]
        )

    def __hash__(self) -> int:
        """The fields' hash, computed once: regions key the memo of node terms (floats only, so
        the same in every process)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.rows, self.ins, self.outs))
            self.__dict__["_hash"] = h
        return h

    def rect(self, port: str) -> Rect:
        """``port`` = "in" (rows x input columns) or "out" (rows x output columns)."""
        if self.empty:
            return (0.0, 0.0, 0.0, 0.0)
        return (*self.rows, *(self.ins if port == "in" else self.outs))


ROOT = Region()
EMPTY = Region((0.0, 0.0))


def translates(succs, a, b) -> bool:
    """Whether the regions ``b`` (one per node) are ``a`` moved so that every area of section 3
    is the same: equal sizes, one offset for the rows of every node, and for every edge
    ``u -> v`` (``succs[u]`` holds ``v``) the same offset for ``u``'s output columns and ``v``'s
    input columns (they are one tensor's columns). Every box of a tensor then moves by one
    vector, and so do the boxes any split below cuts from them (docs/costmodel.md section 8).
    Remembered by the arguments' identities (a plan's evaluator asks of the tuples its planner
    asked of: ``SplitProblem.child_regions`` gives it the same ones)."""
    return by_identity(_TRANSLATES, (succs, a, b), len(a), lambda: _translates(succs, a, b))


#: translates' answers by its arguments' identities (:func:`~parplan.costmodel.dims.by_identity`).
_TRANSLATES: dict = {}


def clear_regions() -> None:
    """Forget the remembered translation tests and interned boxes (a benchmark's cold start)."""
    _TRANSLATES.clear()
    _INTERNED.clear()
    child_region.cache_clear()


def _translates(succs, a, b) -> bool:
    rows = None
    full = []
    for x, y in zip(a, b):
        if x is y:  # the same box: equal sizes, moved by 0
            shift = 0.0
        else:
            if x.empty != y.empty:
                return False
            for (x0, x1), (y0, y1) in ((x.rows, y.rows), (x.ins, y.ins), (x.outs, y.outs)):
                if abs((x1 - x0) - (y1 - y0)) > 1e-12:
                    return False
            shift = round(y.rows[0] - x.rows[0], 12)
        full.append(not x.empty)
        if full[-1]:
            if rows is None:
                rows = shift
            elif shift != rows:
                return False
    for u, vs in enumerate(succs):
        if not full[u]:
            continue
        out = round(b[u].outs[0] - a[u].outs[0], 12)
        for v in vs:
            if full[v] and round(b[v].ins[0] - a[v].ins[0], 12) != out:
                return False
    return True


def local_frame(regions, producer: int, consumers) -> dict[int, Region]:
    """The regions one node's terms read, ``producer``'s (its output port) and its
    ``consumers``' (their input ports), moved together so that the smallest row start and the
    smallest column start of the non-empty ones are 0 (the other axes stay).

    Every amount of this module depends only on where the boxes lie relative to one another,
    so a translate of a problem has the same amounts. Pricing every problem in its own local
    frame makes translates that land on the same frame (always, for shares such as 1/2 whose
    boundaries are exact in binary) give the same floats too, so a planner prices such sibling
    groups once (docs/costmodel.md section 3). Moving a frame already local changes nothing."""
    scope = (producer, *consumers)
    return dict(zip(scope, framed(tuple(regions[w] for w in scope))))


@functools.lru_cache(maxsize=1 << 16)
def framed(boxes: tuple[Region, ...]) -> tuple[Region, ...]:
    """:func:`local_frame` of the boxes of one scope, the producer's first (remembered: the DP
    asks for every node's frame at every split, most of them repeats; equal boxes come back as
    one object, whose hash is then computed once)."""
    full = [r for r in boxes if not r.empty]
    if not full:
        return boxes
    dr = min(r.rows[0] for r in full)
    dc = min(r.outs[0] if j == 0 else r.ins[0] for j, r in enumerate(boxes) if not r.empty)
    if dr == 0.0 and dc == 0.0:
        return boxes

    def moved(j: int, r: Region) -> Region:
        if r.empty:
            return r
        rows = (r.rows[0] - dr, r.rows[1] - dr)
        if j == 0:
            return Region(rows, r.ins, (r.outs[0] - dc, r.outs[1] - dc))
        return Region(rows, (r.ins[0] - dc, r.ins[1] - dc), r.outs)

    return tuple(moved(j, r) for j, r in enumerate(boxes))


def _part(lo: float, hi: float, s: float, side: int) -> tuple[float, float]:
    w = hi - lo
    return (lo, lo + s * w) if side == 0 else (hi - s * w, hi)


@functools.lru_cache(maxsize=1 << 18)
def child_region(region: Region, choice, share: float, side: int) -> Region:
    """Side ``side``'s (0 or 1) region of a node split by ``choice`` at side-1 ``share``
    (memoised: the planners and the evaluator ask for the same few boxes again and again; the
    arguments are immutable)."""
    from parplan.costmodel.layout import split_axes

    axes = split_axes(choice)
    s = share if side == 0 else 1.0 - share
    if s <= 0.0 or region.empty:
        return EMPTY
    if not axes:
        return region
    box = Region(
        *(
            _part(*getattr(region, ax), s, side) if ax in axes else getattr(region, ax)
            for ax in ("rows", "ins", "outs")
        )
    )
    if len(_INTERNED) >= 1 << 18:
        _INTERNED.clear()
    return _INTERNED.setdefault(box, box)


#: One object per distinct box :func:`child_region` returns: equal boxes cut by different
#: splits are then one object, and tuples of them (the memos' keys, ``translates``) compare by
#: identity instead of by their fields.
_INTERNED: dict = {}


def rect_area(r: Rect) -> float:
    """Area of one box ``(x0, x1, y0, y1)`` (0 if empty)."""
    return max(r[1] - r[0], 0.0) * max(r[3] - r[2], 0.0)


__all__ = [
    "EMPTY",
    "clear_regions",
    "ROOT",
    "Region",
    "child_region",
    "framed",
    "local_frame",
    "rect_area",
    "translates",
]
