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
:mod:`parplan.costmodel.layout`. Areas are computed exactly by inclusion-exclusion over
boxes; every formula is monotone in each region (more held, less received; more needed, more
received), so a relaxation may take each region at the end of its share interval that
minimises the amount and obtain a lower bound (docs/costmodel.md section 8).

Example (a lower split: the group holds rows 0-1/2 of the producer's output and its consumer
needs every row here; both split their rows in half. Side 1 needs rows 0-1/2 and holds 0-1/4:
it receives 1/4 from side 2. Side 2 needs rows 1/2-1, none of which the group holds: they
arrive from outside the group, straight to side 2, and are charged at the split above):
    >>> import numpy as np
    >>> g, m = Region((0.0, 0.5)), Region((0.0, 1.0))
    >>> h = [child_rect(g, "out", 0, 0.5, s, True) for s in (0, 1)]
    >>> p, q = (child_rect(m, "in", 0, 0.5, s, True) for s in (0, 1))
    >>> [float(forward_received(g.rect("out"), h, [p], [q], s)) for s in (0, 1)]
    [0.25, 0.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np

Rect = tuple  # (x0, x1, y0, y1): arrays or floats, rows x columns


@dataclass(frozen=True)
class Region:
    """A node's box at a group: intervals of root rows, input columns and output columns."""

    rows: tuple[float, float] = (0.0, 1.0)
    ins: tuple[float, float] = (0.0, 1.0)
    outs: tuple[float, float] = (0.0, 1.0)

    @property
    def empty(self) -> bool:
        return not (self.rows[1] > self.rows[0] and self.ins[1] > self.ins[0] and self.outs[1] > self.outs[0])

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
    vector, and so do the boxes any split below cuts from them (docs/costmodel.md section 8)."""
    def size(r, ax):
        lo, hi = getattr(r, ax)
        return hi - lo

    def shift(x, y, ax):
        return round(getattr(y, ax)[0] - getattr(x, ax)[0], 12)

    for x, y in zip(a, b):
        if x.empty != y.empty or any(abs(size(x, ax) - size(y, ax)) > 1e-12 for ax in ("rows", "ins", "outs")):
            return False
    full = [not x.empty for x in a]
    if len({shift(x, y, "rows") for x, y, f in zip(a, b, full) if f}) > 1:
        return False
    return all(shift(a[u], b[u], "outs") == shift(a[v], b[v], "ins")
               for u, vs in enumerate(succs) for v in vs if full[u] and full[v])


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
    full = [w for w in scope if not regions[w].empty]
    if not full:
        return {w: regions[w] for w in scope}
    dr = min(regions[w].rows[0] for w in full)
    dc = min(regions[w].outs[0] if w == producer else regions[w].ins[0] for w in full)
    if dr == 0.0 and dc == 0.0:
        return {w: regions[w] for w in scope}

    def moved(w: int) -> Region:
        r = regions[w]
        if r.empty:
            return r
        rows = (r.rows[0] - dr, r.rows[1] - dr)
        if w == producer:
            return Region(rows, r.ins, (r.outs[0] - dc, r.outs[1] - dc))
        return Region(rows, (r.ins[0] - dc, r.ins[1] - dc), r.outs)

    return {w: moved(w) for w in scope}


def _part(lo: float, hi: float, s: float, side: int) -> tuple[float, float]:
    w = hi - lo
    return (lo, lo + s * w) if side == 0 else (hi - s * w, hi)


def child_region(region: Region, choice, share: float, side: int) -> Region:
    """Side ``side``'s (0 or 1) region of a node split by ``choice`` at side-1 ``share``."""
    from parplan.costmodel.layout import Layout, PartitionType

    s = share if side == 0 else 1.0 - share
    if s <= 0.0 or region.empty:
        return EMPTY
    if choice in (PartitionType.BATCH, Layout.ROWS):
        return Region(_part(*region.rows, s, side), region.ins, region.outs)
    if choice is PartitionType.IN:
        return Region(region.rows, _part(*region.ins, s, side), region.outs)
    if choice is PartitionType.OUT:
        return Region(region.rows, region.ins, _part(*region.outs, s, side))
    if choice is Layout.COLS:
        return Region(region.rows, _part(*region.ins, s, side), _part(*region.outs, s, side))
    return region


def child_rect(region: Region, port: str, code, s, side: int, has) -> Rect:
    """The rectangle a side keeps of a node's port at a split, for arrays of states: ``code``
    the port's layout code (0 rows, 1 columns, 2 whole), ``s`` the side's own share, ``has``
    whether it has work."""
    x0, x1, y0, y1 = region.rect(port)
    if np.ndim(code) == 0 and np.ndim(s) == 0 and np.ndim(has) == 0:  # one state: plain floats
        if not has:
            return (x0, x0, y0, y1)
        s, code = float(s), int(code)
        if code == 0:
            return (x0, x0 + s * (x1 - x0), y0, y1) if side == 0 else (x1 - s * (x1 - x0), x1, y0, y1)
        if code == 1:
            return (x0, x1, y0, y0 + s * (y1 - y0)) if side == 0 else (x0, x1, y1 - s * (y1 - y0), y1)
        return (x0, x1, y0, y1)
    code, s, has = np.asarray(code), np.asarray(s, dtype=float), np.asarray(has, dtype=bool)
    if side == 0:
        nx0, nx1 = x0 + 0 * s, np.where(code == 0, x0 + s * (x1 - x0), x1)
        ny0, ny1 = y0 + 0 * s, np.where(code == 1, y0 + s * (y1 - y0), y1)
    else:
        nx0, nx1 = np.where(code == 0, x1 - s * (x1 - x0), x0), x1 + 0 * s
        ny0, ny1 = np.where(code == 1, y1 - s * (y1 - y0), y0), y1 + 0 * s
    nx1 = np.where(has, nx1, nx0)
    return nx0, nx1, ny0, ny1


def area(*rects: Rect):
    """Area of the intersection of rectangles (broadcasting)."""
    if not any(isinstance(r[1], np.ndarray) or isinstance(r[3], np.ndarray) for r in rects):  # one state
        x0, x1, y0, y1 = rects[0]
        for r in rects[1:]:
            x0, x1, y0, y1 = max(x0, r[0]), min(x1, r[1]), max(y0, r[2]), min(y1, r[3])
        return max(x1 - x0, 0.0) * max(y1 - y0, 0.0)
    x0, x1, y0, y1 = rects[0]
    for r in rects[1:]:
        x0, x1 = np.maximum(x0, r[0]), np.minimum(x1, r[1])
        y0, y1 = np.maximum(y0, r[2]), np.minimum(y1, r[3])
    return np.maximum(x1 - x0, 0.0) * np.maximum(y1 - y0, 0.0)


def union_area(rects: list[Rect], *within: Rect):
    """Area of ``(union of rects) & within...`` by inclusion-exclusion."""
    total = 0.0
    for k in range(1, len(rects) + 1):
        sign = 1.0 if k % 2 else -1.0
        for sub in combinations(rects, k):
            total = total + sign * area(*sub, *within)
    return total


def _both_unions_area(a: list[Rect], b: list[Rect], *within: Rect):
    """Area of ``(union a) & (union b) & within...``."""
    total = 0.0
    for i in range(1, len(a) + 1):
        for sa in combinations(a, i):
            for j in range(1, len(b) + 1):
                for sb in combinations(b, j):
                    sign = 1.0 if (i + j) % 2 == 0 else -1.0
                    total = total + sign * area(*sa, *sb, *within)
    return total


def _minus_area(base: list[Rect], minus: list[Rect]):
    """Area of ``(intersection of base) - (union of minus)``."""
    return area(*base) - (union_area(minus, *base) if minus else 0.0)


def forward_received(g: Rect, h: list[Rect], p: list[Rect], q: list[Rect], side: int):
    """Area side ``side`` (0 or 1) receives of a producer's output: ``g`` the producer's
    holding at the group, ``h`` its two sides' holdings, ``p``/``q`` each consumer's need on
    side 1/2."""
    if side == 0:
        return union_area(p, g) - union_area(p, h[0])
    return union_area(q, g) - union_area(q, h[1]) + _both_unions_area(q, p) - _both_unions_area(q, p, g)


def backward_received(h: list[Rect], m: Rect, p: Rect, q: Rect, side: int):
    """Area side ``side`` receives of one consumer's gradient (``m``, ``p``, ``q`` its regions
    at the group and on the sides), for a producer needing ``h`` on the sides."""
    if side == 0:
        return area(h[0], m) - area(h[0], p)
    return area(h[1], m) + area(h[1], h[0]) - area(h[1], h[0], m) - area(h[1], q)


def backward_presummed(h: list[Rect], m: list[Rect], p: list[Rect], q: list[Rect], side: int):
    """Area side ``side`` receives when the sender is one device, which pre-sums the
    contributions of every consumer to a point: one value per point."""
    n = len(m)
    total = 0.0
    for k in range(1, n + 1):
        sign = 1.0 if k % 2 else -1.0
        for s in combinations(range(n), k):
            if side == 0:  # h0 & M_v - P_v for every v in s
                total = total + sign * _minus_area([h[0], *(m[v] for v in s)], [p[v] for v in s])
                continue
            # h1 & [(M_v - Q_v) | (h0 - M_v)] for every v in s: disjoint by which v are inside M_v
            for j in range(len(s) + 1):
                for inside in combinations(s, j):
                    outside = [v for v in s if v not in inside]
                    base = [h[1], *(m[v] for v in inside)] + ([h[0]] if outside else [])
                    minus = [q[v] for v in inside] + [m[v] for v in outside]
                    total = total + sign * _minus_area(base, minus)
    return total


__all__ = ["EMPTY", "ROOT", "Region", "area", "backward_presummed", "backward_received", "child_rect", "translates",
           "child_region", "forward_received", "local_frame", "union_area"]
