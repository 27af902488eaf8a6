"""The Python pricing that parplan's compiled core (parplan/costmodel/_pricing.c) replaced,
kept as a test oracle: section 3's closed forms and region algebra, and node_terms as it was,
line for line. tests/test_pricing_core.py checks the core against it bit for bit on random
instances; tests/reference_model.py is the independent model written from the docs.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations

import numpy as np

from parplan.costmodel.cost import (
    RECEIVE_EPS,
    scale_for_sides,
    RELAX_STEPS,
    NodeTerms,
    ShareSet,
    SideSpec,
    StateTable,
    allreduce_factor,
    ports,
    side_dims,
)
from parplan.costmodel.dims import (
    FORWARD_FLOPS,
    Device,
    ElementOp,
    LayerDims,
    FORWARD_OP_TRAFFIC,
    WEIGHTED_TRAFFIC,
)
from parplan.costmodel.layout import (
    LAYOUT_CODE,
    PARTIAL_TENSOR,
    Choice,
    Layout,
    PartitionType,
    Tensor,
)
from parplan.costmodel.hardware import ArrayNode, signature
from parplan.costmodel.problem import Problem

# the product's bisection helper and memo-key helpers (no cost formula in them)
from parplan.solvers.bound import _SCALED, _min_max, _unnamed
from parplan.costmodel.regions import ROOT, Rect, Region, local_frame

_SCALARS = frozenset((float, int, bool, np.float64, np.int64, np.bool_))


# ---- section 3's closed forms (formerly parplan/costmodel/layout.py) ----------------------
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
    return (
        _code(layout) if isinstance(layout, Layout) else int(layout),
        s,
        float(s > 0 if has is None else has),
    )


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


# ---- the region algebra (formerly parplan/costmodel/regions.py) -----------------------


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
            return (
                (x0, x0 + s * (x1 - x0), y0, y1) if side == 0 else (x1 - s * (x1 - x0), x1, y0, y1)
            )
        if code == 1:
            return (
                (x0, x1, y0, y0 + s * (y1 - y0)) if side == 0 else (x0, x1, y1 - s * (y1 - y0), y1)
            )
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
    if not any(
        isinstance(r[1], np.ndarray) or isinstance(r[3], np.ndarray) for r in rects
    ):  # one state
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


def forward_area(g: Rect, h: list[Rect], p: list[Rect], q: list[Rect], side: int):
    """Area side ``side`` (0 or 1) receives of a producer's output: ``g`` the producer's
    holding at the group, ``h`` its two sides' holdings, ``p``/``q`` each consumer's need on
    side 1/2."""
    if side == 0:
        return union_area(p, g) - union_area(p, h[0])
    return (
        union_area(q, g)
        - union_area(q, h[1])
        + _both_unions_area(q, p)
        - _both_unions_area(q, p, g)
    )


def backward_area(h: list[Rect], m: Rect, p: Rect, q: Rect, side: int):
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


def receive_seconds(side: "SideSpec", i: int, elements, weight_elements=0.0):
    """Seconds side ``i`` spends receiving ``elements`` at this split (docs/costmodel.md
    section 4): the link latency when it receives anything, plus the bytes at its receive
    bandwidth. With micro-batches (section 6.4) what moves per micro-batch (``elements`` less
    the per-step ``weight_elements``) pays the latency once per micro-batch, and the gradient
    exchange travels with the last one (or pays its own latencies: ZeRO-2/3 reduce-scatter per
    micro-batch). Arrays broadcast."""
    transfer = elements * (side.bytes_per_element / side.bytes_per_s[i])
    m = side.micro_batches
    if m == 1:
        return side.latency_s * (elements > RECEIVE_EPS) + transfer
    per_step = 1 if side.zero_stage < 2 else m
    count = np.maximum(
        m * (elements - weight_elements > RECEIVE_EPS), per_step * (weight_elements > RECEIVE_EPS)
    )
    return side.latency_s * count + transfer


def tensor_elements(dims: LayerDims, tensor: Tensor) -> float:
    if tensor is Tensor.WEIGHT:
        return dims.weight_elements
    if tensor is Tensor.OUTPUT:
        return dims.out_elements
    return dims.in_elements


def weight_exchange(
    size: float, ss: "ShareSet", zero_stage: int, micro_batches: int
) -> tuple[float, float]:
    """Elements each side receives per step for the gradient exchange of a weight of ``size``
    elements that a BATCH split with work on both sides replicates (docs/costmodel.md sections
    2, 6.1 and 6.4): a reduce-scatter (side 1 receives ``a size``) and an all-gather (``(1-a) size``)
    once per step at stages 0-1; at stage 2 a reduce-scatter per micro-batch; at stage 3 a
    reduce-scatter and two all-gathers of the weights per micro-batch. Interval states: each
    side's smallest amount over ``[lo, hi]``."""
    m = micro_batches
    if zero_stage <= 1:
        return size, size
    if zero_stage == 2:  # side 1: m a + (1 - a), side 2: m (1 - a) + a
        return size * (1.0 + (m - 1) * ss.lo), size * (1.0 + (m - 1) * (1.0 - ss.hi))
    return size * m * (2.0 - ss.hi), size * m * (
        1.0 + ss.lo
    )  # m (a + 2 (1 - a)), m ((1 - a) + 2 a)


# ---- compute, memory and state tables (formerly parplan/costmodel/dims.py and cost.py) ----


def roofline_seconds(
    flops: float, traffic_bytes: float, device: Device, kind: str = "gemm", kernels: int = 0
) -> float:
    """max(FLOPs / (e_kind * peak), bytes / (m * HBM bandwidth), kernels * t0): the roofline
    with a launch roof (docs/costmodel.md section 5)."""
    t = max(
        flops / (device.efficiency_of(kind) * device.flops_per_s),
        traffic_bytes / (device.memory_efficiency * device.memory_bytes_per_s),
    )
    return (
        max(t, kernels * device.kernel_overhead_s)
        if kernels and (flops > 0 or traffic_bytes > 0)
        else t
    )


def op_seconds(
    op: ElementOp,
    size: float,
    device: Device,
    bytes_per_element: float,
    micro_batches: int = 1,
    recompute: bool = False,
) -> float:
    """Training time of element-wise op ``op`` on ``size`` units of what it is counted per
    (docs/costmodel.md section 5): its roofline with a forward and a backward kernel per
    micro-batch, and its forward again under recomputation (a third of its FLOPs, half its
    traffic, one kernel per micro-batch; section 6.3)."""
    kind = op.kind or "gemm"
    t = roofline_seconds(
        size * op.flops, size * op.traffic * bytes_per_element, device, kind, 2 * micro_batches
    )
    if recompute:
        t += roofline_seconds(
            size * op.flops * FORWARD_FLOPS,
            size * op.traffic * FORWARD_OP_TRAFFIC * bytes_per_element,
            device,
            kind,
            micro_batches,
        )
    return t


def compute_seconds(self, device, bytes_per_element: float) -> float:
    """Time of one training step of this node on ``device`` (docs/costmodel.md section 5):
    a roofline for the weighted product plus one per carried op."""
    t = 0.0
    m = self.micro_batches
    if self.kernel and self.flops > 0:
        # per micro-batch the weights are read again (docs/costmodel.md section 6.4)
        once = self.active * (self.in_elements + self.out_elements) + m * self.weight_elements
        kind = "conv" if self.kernel > 1 else "gemm"
        # forward, backward and gradient products: 3 kernels per micro-batch (section 5)
        t = roofline_seconds(
            self.flops, WEIGHTED_TRAFFIC * once * bytes_per_element, device, kind, 3 * m
        )
        if self.recompute:  # forward again: 2 of the 6 FLOP units, 1 of the 3 traffic units
            t += roofline_seconds(
                self.flops * FORWARD_FLOPS, once * bytes_per_element, device, kind, m
            )
    for size, ops in ((self.out_elements, self.out_ops), (self.in_elements, self.in_ops)):
        if size > 0:
            for op in ops:
                t += op_seconds(op, size, device, bytes_per_element, m, self.recompute)
    return t


def gathered_bytes(self, bytes_per_element: float, zero: int) -> float:
    """What ZeRO stage 3 gathers of these sizes' weights while their unit runs: the weights
    less the shard kept (section 6.1)."""
    return self.weight_elements * bytes_per_element * (1.0 - self.replica) if zero >= 3 else 0.0


def memory_bytes(
    self, bytes_per_element: float, optimizer_bytes_per_param: float, zero: int = 0
) -> float:
    """Bytes a device holding these sizes keeps: weights and gradients (``bytes_per_element``
    each), optimizer state, stored activations (docs/costmodel.md section 6). With ZeRO
    stage ``zero`` (section 6.1) the optimizer state (stage >= 1), the gradients (>= 2) and the
    weights (3) of a weight replicated by BATCH splits are sharded over its replicas: a holder
    keeps ``replica`` of them."""
    w = self.weight_elements
    shard = self.replica
    per_param = (
        bytes_per_element * (shard if zero >= 3 else 1.0)
        + bytes_per_element * (shard if zero >= 2 else 1.0)
        + optimizer_bytes_per_param * (shard if zero >= 1 else 1.0)
    )
    return w * per_param + self.stored_elements * bytes_per_element


def intra_elements(dims: LayerDims, choice: Choice) -> float:
    """Elements each side receives inside a node split by ``choice`` with work on both sides
    (docs/costmodel.md section 2): the partial sum its type leaves (a join's ROWS: the gradients
    of the embedding tables it reads), plus the row statistics of its layer norms when the
    split divides its output columns."""
    tensor, statistics = _INTRA_RULES[choice._value_]
    size = tensor_elements(dims, tensor) if tensor is not None else 0.0
    if statistics:
        size = size + dims.row_exchange_elements
    return size


def _intra_rule(choice: Choice) -> tuple[Tensor | None, bool]:
    """(the full-size partial sum ``choice`` leaves, whether it divides its output columns)."""
    tensor = PARTIAL_TENSOR[choice] if isinstance(choice, PartitionType) else None
    if choice is Layout.ROWS:  # a join reading embedding tables: their gradients
        tensor = Tensor.WEIGHT
    return tensor, ports(
        choice
    ).give_out is Layout.COLS  # layer norms on divided columns: row statistics


_INTRA_RULES = {c.value: _intra_rule(c) for c in (*PartitionType, *Layout)}


def build_table(
    dims, covered, choices, shares, side, in_reduction_elements=None, above=(False, False)
) -> StateTable:
    sets = [s if isinstance(s, ShareSet) else ShareSet.point(float(s)) for s in shares]
    k = 1 if all(ss.lo == ss.hi for ss in sets) else RELAX_STEPS + 1
    rows = []
    bpe = side.bytes_per_element
    for c in choices:
        p = ports(c)
        for ss in sets:
            split = ss.has[0] and ss.has[1]
            size = intra_elements(dims, c) if split else 0.0
            if c is PartitionType.IN and split and in_reduction_elements is not None:
                size = in_reduction_elements  # (IN gives its output whole: no row statistics)
            # Both sides keep the same part of a table (OUT, WHOLE) or of the row statistics (IN,
            # WHOLE) that a split above reduced: the total reaches side 1, which forwards it.
            # At ZeRO-3 side 1 keeps the table's shard; side 2 gathers it before every forward
            # and backward (section 6.1).
            tabx = (
                dims.tables
                * dims.in_features
                * (2 * side.micro_batches if side.zero_stage >= 3 else 1)
            )
            extra = 0.0
            if split and above[0] and c in (PartitionType.OUT, Layout.WHOLE):
                extra += tabx
            if split and above[1] and c in (PartitionType.IN, Layout.WHOLE):
                extra += dims.row_exchange_elements
            # The gradient exchange of the weights a BATCH split replicates (a join's tables at
            # ROWS) is per step; everything else a node receives is per micro-batch (section 6.4).
            weighted = c is PartitionType.BATCH or (c is Layout.ROWS and size > 0)
            wsize = (
                weight_exchange(size, ss, side.zero_stage, side.micro_batches)
                if weighted and split
                else (0.0, 0.0)
            )
            asize = (0.0, 0.0) if weighted else (size, size)
            if dims.recompute and split and not weighted:
                # recomputation runs the forward again, with its exchanges inside the node: an IN
                # split's partial-sum reduction, and the forward half of the row statistics
                # (those this split divides, and those side 1 forwards; section 6.3)
                again = (size if c is PartitionType.IN else 0.0) + 0.5 * (
                    dims.row_exchange_elements if p.give_out is Layout.COLS else 0.0
                )
                forwarded = (
                    0.5 * dims.row_exchange_elements
                    if above[1] and c in (PartitionType.IN, Layout.WHOLE)
                    else 0.0
                )
                asize = (size + again, size + again + forwarded)
            x = 0.0
            if side.collective is not None and weighted:
                if split and not covered:
                    x = side.collective.allreduce_seconds(
                        side.hosts, size * bpe, min(side.bytes_per_s) / side.ports, side.latency_s
                    )
                    x *= allreduce_factor(side.zero_stage, side.micro_batches)
                wsize = (0.0, 0.0)
            # a table's total forwarded by side 1 is a weight gradient; row statistics are activations
            wextra = tabx if split and above[0] and c in (PartitionType.OUT, Layout.WHOLE) else 0.0
            low = (side_dims(dims, c, ss.lo, 0, ss.has[0]), side_dims(dims, c, ss.hi, 1, ss.has[1]))
            if k == 1:  # a point: each side's compute at its own share (the dims just built)
                steps = [[compute_seconds(low[i], side.devices[i], bpe)] for i in (0, 1)]
            else:
                grid = np.linspace(ss.lo, ss.hi, k)
                steps = [
                    [
                        compute_seconds(side_dims(dims, c, g, i, ss.has[i]), side.devices[i], bpe)
                        for g in grid
                    ]
                    for i in (0, 1)
                ]
            rows.append(
                (
                    c,
                    ss.lo,
                    ss.hi,
                    ss.has,
                    LAYOUT_CODE[p.give_out],
                    LAYOUT_CODE[p.need_in],
                    [steps[0][0], steps[1][-1]],
                    [
                        memory_bytes(d, bpe, side.optimizer_bytes_per_param, side.zero_stage)
                        for d in low
                    ],
                    [wsize[0] + asize[0], wsize[1] + asize[1] + extra],
                    x,
                    steps,
                    [wsize[0], wsize[1] + wextra],
                    [replace(d, recompute=False).stored_elements * bpe for d in low],
                    [gathered_bytes(d, bpe, side.zero_stage) for d in low],
                )
            )
    cols = list(zip(*rows))
    return StateTable(
        tuple(cols[0]),
        np.array(cols[1], dtype=float),
        np.array(cols[2], dtype=float),
        np.array(cols[3], dtype=bool).T.reshape(2, -1),
        np.array(cols[4]),
        np.array(cols[5]),
        np.array(cols[6]).T.reshape(2, -1),
        np.array(cols[7]).T.reshape(2, -1),
        np.array(cols[8]).T.reshape(2, -1),
        np.array(cols[9], dtype=float),
        np.array(cols[10], dtype=float).transpose(1, 0, 2).reshape(2, -1, k),
        np.array(cols[11]).T.reshape(2, -1),
        np.array(cols[12]).T.reshape(2, -1),
        np.array(cols[13]).T.reshape(2, -1),
    )


# ---- the per-node bound recursion (formerly parplan/solvers/bound.py's _Bound) ----------


class OracleBound:
    """Memoised ``LB_g(d)`` for one node's choices over the array's groups."""

    def __init__(self, problem: Problem, grid: int):
        self.bpe = problem.bytes_per_element
        self.collective = problem.array.collective is not None
        self.grid = grid
        self.memo: dict[tuple, float] = {}
        self.memos: dict[tuple, dict[tuple, float]] = {}
        self.sig: dict[int, int] = {}
        self.ids: dict[tuple, int] = {}
        self.devices: dict[int, object] = {}
        self.sides: dict[int, object] = {}
        self.same: dict[int, bool] = {}
        self.problem = problem

    def twin(self) -> "OracleBound":
        """A second cursor over the same memos (one per node kind) and group tables, to bound
        two nodes side by side (the pair bound)."""
        other = object.__new__(OracleBound)
        other.__dict__.update(self.__dict__)
        other.memo = {}
        return other

    def use(self, dims: LayerDims, choices) -> None:
        """Bound a node with ``dims`` and ``choices`` from now on. Memo keys hold a group and
        the sizes a split scales (B, Di and Do), so one memo serves every node whose other sizes
        and choices are these (repeated blocks: ResNet-152's 36 identical bottlenecks of a
        stage share theirs), at every split that asks."""
        kind = (
            tuple(_unnamed(v) for k, v in vars(dims).items() if k not in _SCALED),
            tuple(choices),
        )
        self.memo = self.memos.setdefault(kind, {})

    def signature(self, group: ArrayNode) -> int:
        """A small integer per structurally distinct group (cheap to hash in the memo keys)."""
        if id(group) not in self.sig:
            self.sig[id(group)] = self.ids.setdefault(signature(group), len(self.ids))
        return self.sig[id(group)]

    def comm(self, group: ArrayNode, dims: LayerDims, choice) -> tuple[float, float]:
        """Each side's seconds for the node's own reduction when both sides have work."""
        size = intra_elements(dims, choice)
        side = self.sides.get(id(group))
        if side is None:
            side = self.sides[id(group)] = self.problem.side_spec(group)
        if (self.collective or side.overlap) and choice in (PartitionType.BATCH, Layout.ROWS):
            # an enclosing split may have paid the all-reduce (covered); with overlap a weight
            # exchange may hide behind the work below it (section 4.2): 0 stays a bound
            size = 0.0
        first = receive_seconds(side, 0, size)
        return first, (
            first if side.bytes_per_s[0] == side.bytes_per_s[1] else receive_seconds(side, 1, size)
        )

    def lb(self, group: ArrayNode, dims: LayerDims, choices) -> float:
        key = (self.signature(group), dims.batch, dims.in_features, dims.out_features)
        if key in self.memo:
            return self.memo[key]
        if group.is_leaf:
            if id(group) not in self.devices:
                self.devices[id(group)] = group.device.as_device()
            self.memo[key] = compute_seconds(dims, self.devices[id(group)], self.bpe)
            return self.memo[key]
        left, right = group.left, group.right
        same = self.same.get(id(group))
        if same is None:
            same = self.same[id(group)] = group.interchangeable_halves
        # interchangeable halves do the same as each other: one side stands for both
        best = (
            self.lb(left, dims, choices)
            if same
            else min(self.lb(left, dims, choices), self.lb(right, dims, choices))
        )
        for c in choices:
            c1, c2 = self.comm(group, dims, c)
            if same:
                best = min(
                    best, self.lb(left, side_dims(dims, c, 0.5, 0, True), choices) + max(c1, c2)
                )
            else:
                best = min(best, self._bisect(left, right, dims, c, c1, c2, choices))
        self.memo[key] = best
        return best

    def _bisect(self, left, right, dims, c, c1, c2, choices) -> float:
        """min over intervals [k/G, (k+1)/G] of max(A(k), B(k)), A nondecreasing, B nonincreasing."""
        g = self.grid

        def a(k):  # the left side at the interval's lower end
            return self.lb(left, scale_for_sides(dims, c, k / g)[0], choices) + c1

        def b(k):  # the right side at the interval's upper end
            return self.lb(right, scale_for_sides(dims, c, (k + 1) / g)[1], choices) + c2

        return _min_max(a, b, g)


def floored_time(t, floor):
    """The floor of a node's time (formerly cost.floored_time, numpy)."""
    if np.ndim(floor) == 0 and not floor > 0:
        return t
    return np.maximum(t, floor) + 1e-6 * t * (np.asarray(floor) > 0)


def overlap_time(work, comm, weight):
    """A side's time for a node (formerly cost.overlap_time, numpy)."""
    return work + comm - np.minimum(weight, 2.0 / 3.0 * work)


# ---- node_terms (formerly parplan/costmodel/cost.py) -----------------------------------


def node_terms(
    tables, side: SideSpec, groups, u: int, idx, regions=None, leaf_pair: bool = True
) -> NodeTerms:
    """Time terms of node ``u`` with its state index ``idx[u]`` and each consumer's ``idx[v]``
    (integer arrays that broadcast; ``tables[v]`` the :class:`StateTable` of node ``v``;
    ``groups`` from :func:`output_groups` at the root's sizes; ``regions`` every node's
    :class:`~parplan.costmodel.regions.Region` at this group, None at the root; ``leaf_pair``:
    both sides are single devices, which pre-sum gradients). docs/costmodel.md sections 3-5."""
    t = tables[u]
    iu = idx[u]
    # every region in the node's local frame: translates price alike, to the last bit
    consumers = tuple(dict.fromkeys(v for _, vs, _ in groups for v in vs))
    reg = (
        local_frame(regions, u, consumers)
        if regions is not None
        else dict.fromkeys((u, *consumers), ROOT)
    )

    def ends(tab, i, side_):
        big, small = (tab.hi[i], tab.lo[i]) if side_ == 0 else (1.0 - tab.lo[i], 1.0 - tab.hi[i])
        return big, small

    # Each region takes the end of its share interval that makes the amount smallest (for a
    # point both ends coincide): held regions large and needed ones small forward; the
    # producer's need small and the consumers' holdings large backward (docs/costmodel.md
    # section 8). Side 2's formulas also read side 1's regions at their small ends.
    g = reg[u].rect("out")
    tensors = []
    for size, consumers, fwd in groups:
        m = [reg[v].rect("in") for v in consumers]
        if all(mv == g for mv in m):
            # the group holds exactly what its consumers need of this tensor: its own frame, where
            # every region is a prefix of a side's own share (the closed forms of layout.py)
            tensors.append((size * area(g), consumers, None, fwd))
        else:
            tensors.append((size, consumers, m, fwd))
    # each consumer's need on each side, at the small and the big end of its share (region path)
    rects = {}
    for k, (_, consumers, m, _) in enumerate(tensors):
        if m is None:
            continue
        small, big = ([], []), ([], [])
        for v in consumers:
            tv, iv = tables[v], idx[v]
            for j in (0, 1):
                b, sm = ends(tv, iv, j)
                small[j].append(child_rect(reg[v], "in", tv.need[iv], sm, j, tv.has[j][iv]))
                big[j].append(child_rect(reg[v], "in", tv.need[iv], b, j, tv.has[j][iv]))
        rects[k] = (small, big)
    if rects:
        hold = [
            child_rect(reg[u], "out", t.give[iu], ends(t, iu, j)[0], j, t.has[j][iu])
            for j in (0, 1)
        ]
        wants = [
            child_rect(reg[u], "out", t.give[iu], ends(t, iu, j)[1], j, t.has[j][iu])
            for j in (0, 1)
        ]
    received, intra, comm, weight = [], [], [], []
    for i in (0, 1):
        r = t.intra[i][iu]
        intra.append(r)
        big_u, small_u = ends(t, iu, i)
        has_u = t.has[i][iu]
        for k, (size, consumers, m, fwd) in enumerate(tensors):
            if m is None:
                needs, holds = [], []
                for v in consumers:
                    tv, iv = tables[v], idx[v]
                    big_v, small_v = ends(tv, iv, i)
                    needs.append(need_extent(tv.need[iv], small_v, tv.has[i][iv]))
                    holds.append(hold_extent(tv.need[iv], big_v, tv.has[i][iv]))
                # a block's recomputation sends its forward again (docs/costmodel.md section 6.3)
                moved = fwd * forward_received(
                    union_needs(needs), hold_extent(t.give[iu], big_u, has_u)
                )
                want = hold_extent(t.give[iu], small_u, has_u)
                if leaf_pair:
                    moved = moved + backward_received(want, intersect_holds(holds))
                else:
                    for h in holds:
                        moved = moved + backward_received(want, h)
            else:
                small, big = rects[k]
                moved = fwd * forward_area(g, hold, small[0], small[1], i)
                if leaf_pair:
                    moved = moved + backward_presummed(wants, m, big[0], big[1], i)
                else:
                    for x in range(len(m)):
                        moved = moved + backward_area(wants, m[x], big[0][x], big[1][x], i)
            r = r + size * moved
        received.append(r)
        if (
            side.overlap
        ):  # the weight traffic is its own message, run alongside the work (section 4.2)
            w = t.wintra[i][iu]
            weight.append(receive_seconds(side, i, w, w) + t.extra[iu])
            comm.append(receive_seconds(side, i, np.maximum(r - w, 0.0)) + weight[i])
        else:
            comm.append(receive_seconds(side, i, r, t.wintra[i][iu]) + t.extra[iu])
    compute = (t.compute[0][iu], t.compute[1][iu])
    steps = (t.steps[0][iu], t.steps[1][iu]) if t.steps.shape[2] > 1 else None
    return NodeTerms(
        compute,
        (comm[0], comm[1]),
        (received[0], received[1]),
        (intra[0], intra[1]),
        steps,
        (weight[0], weight[1]) if weight else (0.0, 0.0),
    )
