"""Per-layer sizes, FLOPs, memory traffic and memory in the three-matrix-product view
(docs/costmodel.md, sections 1 and 5).

Every weighted layer is a fully connected layer with batch ``B``, input features ``Di`` and
output features ``Do``; convolutions keep their spatial extent as a size multiplier only.
One training step of a layer runs forward, backward and gradient products:
``FLOPs = 3 * 2 * B * Do * Hout*Wout * Di * kh*kw / groups``.

The layers without a partition choice that follow a planning node (activations, norms,
pooling, attention cores, ...) are carried with it as *element-wise ops*: per element of the
node's output, each op's training FLOPs and HBM traffic (elements read + written), and the
activation elements it stores for the backward pass. Layers between the graph input and a
node are carried per element of the node's input. They run on whatever part of that tensor a
device holds, so they scale with the node's sizes at every level.

Example:
    >>> d = LayerDims(batch=4, in_features=3, out_features=8, in_spatial=32 * 32, out_spatial=32 * 32, kernel=9)
    >>> d.flops == 3 * 2 * 4 * 8 * 1024 * 3 * 9
    True
    >>> d.weight_elements, d.in_elements, d.out_elements
    (216.0, 12288, 32768)
    >>> zero = d.scaled(0.0, 0.0, 0.0)
    >>> zero.flops, zero.weight_elements, zero.in_elements
    (0.0, 0.0, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable

from parplan.costmodel.compiled import core
from parplan.costmodel.graph import INPUT, Attention, Embedding, Graph, Norm

#: HBM traffic of one training step of a weighted layer, in units of (|F_in| + |W| + |F_out|):
#: forward reads F_in and W and writes F_out; backward reads E_out and W and writes E_in;
#: the gradient product reads F_in and E_out and writes dW.
WEIGHTED_TRAFFIC = 3.0


#: The forward's part of a product's training FLOPs (forward, backward and gradient products
#: are equal) and of an element-wise op's (an attention core's QK^T and AV; docs/costmodel.md
#: section 6.3).
FORWARD_FLOPS = 1.0 / 3.0
#: The forward's part of an element-wise op's HBM traffic: it reads the inputs and writes the
#: output, and backward moves as much again (section 1's traffic rule).
FORWARD_OP_TRAFFIC = 0.5

#: Row statistics a norm over the features exchanges per position when a split divides the
#: columns (docs/costmodel.md section 2): layer norm sends mean and variance forward and two
#: sums backward; RMS norm one sum of squares forward and one sum backward.
ROW_STATISTICS = {"layer": 4.0, "rms": 2.0}


def cached_hash(self) -> int:
    """A frozen dataclass's hash of its fields, computed once: the memos of the cost model key
    on :class:`LayerDims` and :class:`~parplan.costmodel.cost.SideSpec`, hashed millions of
    times in a planning run. Equal objects hash equal, as the generated hash would."""
    h = self.__dict__.get("_hash")
    if h is None:
        h = hash(tuple(getattr(self, f.name) for f in fields(self) if f.compare))  # as __eq__
        object.__setattr__(self, "_hash", h)
    return h


class HashedTuple(tuple):
    """A tuple that hashes its items once, the first time it is hashed: a split's dims, regions
    and cuts (hundreds of items each) and the memo keys holding them are hashed again and again.
    Equal to the plain tuple and hashing as it does; pickled as a plain tuple's items (a hash
    can hold str hashes, which differ between processes)."""

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            self._hash = h = tuple.__hash__(self)
            return h

    def __reduce__(self):
        return (type(self), (tuple(self),))


#: The most node entries (calls x nodes) one :func:`by_identity` memo keeps; it is cleared past
#: it (a 4,096-layer chain's splits hold 8,192 nodes each: about 1,950 of them).
IDENTITY_MAX_ITEMS = 16_000_000


def by_identity(memo: dict, args: tuple, nodes: int, make: Callable[[], object]) -> object:
    """``make()``, remembered in ``memo`` by the identities of ``args``: a split's child dims,
    regions and cuts and the halves' translation test, asked again of the very tuples the
    planner made (the evaluator re-pricing a planned split), are found without a pass over
    their ``nodes`` items. The entry holds ``args``, so their ids stay theirs."""
    key = tuple(map(id, args))
    hit = memo.get(key)
    if hit is not None and all(x is y for x, y in zip(hit[0], args)):
        return hit[1]
    out = make()
    if (len(memo) + 1) * max(nodes, 1) > IDENTITY_MAX_ITEMS:
        memo.clear()
    memo[key] = (args, out)
    return out


def state_without_hash(self) -> dict:
    """Pickled state without the cached hash (str hashes differ between processes)."""
    state = dict(self.__dict__)
    state.pop("_hash", None)
    return state


@dataclass(frozen=True)
class ElementOp:
    """An op without a partition choice, per element of the tensor it is attached to:
    training FLOPs, HBM traffic (elements) and stored activation elements.

    ``name`` says which op it is (reports, the exported script) and takes no part in equality
    or hashing: the same op in two blocks prices the same, so repeated blocks share their state
    tables and memoised terms (a transformer's blocks are priced once, not once per block)."""

    # hashed once: every new LayerDims (a split scales dims hundreds of thousands of times on a
    # long chain) hashes its ops' tuples when it first keys a memo
    __hash__ = cached_hash
    __getstate__ = state_without_hash

    name: str = field(compare=False)
    flops: float = 0.0
    traffic: float = 0.0
    stored: float = 0.0
    #: Elements per sample (row) exchanged with the other side when a split divides the
    #: tensor's columns: a layer norm's row statistics, 2 forward and 2 backward per position.
    row_exchange: float = 0.0
    #: Which efficiency its FLOPs run at (docs/costmodel.md section 5): "attention" for an
    #: attention core's products, "" for every other op.
    kind: str = ""


@dataclass(frozen=True)
class Device:
    """What the time formula needs of a device (or of a group priced as one device); the
    efficiencies and the per-kernel overhead are docs/costmodel.md section 5's, measured by
    ``parplan calibrate`` (defaults: the papers' peak roofline)."""

    flops_per_s: float  # peak FLOP/s
    memory_bytes_per_s: float  # HBM bandwidth
    efficiency: float = 1.0  # achieved fraction of peak FLOP/s for matrix products
    #: Achieved fraction of peak on convolutions with a spatial kernel (kh * kw > 1) and on
    #: attention cores; None: ``efficiency``.
    conv_efficiency: float | None = None
    attention_efficiency: float | None = None
    memory_efficiency: float = 1.0  # achieved fraction of HBM bandwidth
    kernel_overhead_s: float = 0.0  # shortest time of a kernel: the host's issue time (launch roof)

    def efficiency_of(self, kind: str) -> float:
        """The achieved fraction of peak for FLOPs of ``kind`` ("gemm", "conv", "attention")."""
        if kind == "conv" and self.conv_efficiency is not None:
            return self.conv_efficiency
        if kind == "attention" and self.attention_efficiency is not None:
            return self.attention_efficiency
        return self.efficiency


#: The compiled core's codes of an efficiency kind (``_pricing.c``'s ``K_*``).
KIND_CODE = {"gemm": 0, "conv": 1, "attention": 2}


def roofline_seconds(
    flops: float, traffic_bytes: float, device: Device, kind: str = "gemm", kernels: int = 0
) -> float:
    """max(FLOPs / (e_kind * peak), bytes / (m * HBM bandwidth), kernels * t0): the roofline
    with a launch roof (docs/costmodel.md section 5), priced by the compiled core."""
    return core.roofline(
        float(flops), float(traffic_bytes), device_figures(device), KIND_CODE[kind], int(kernels)
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
    traffic, one kernel per micro-batch; section 6.3). Priced by the compiled core, as a layer
    of ``size`` units that carries only ``op``."""
    dims = (
        float(size),
        1.0,
        1.0,
        1.0,
        1.0,
        0.0,
        1.0,
        0.0,
        1.0,
        1.0,
        1.0,
        float(recompute),
        float(micro_batches),
        -1.0,
    )
    return core.compute(
        dims, _ops_figures((op,)), (), device_figures(device), float(bytes_per_element)
    )


_DEVICES: dict[int, tuple[Device, tuple[float, ...]]] = {}
_OPS: dict[int, tuple[tuple, tuple[float, ...]]] = {}
#: (dims, device figures, bytes per element) -> LayerDims.compute_seconds: the hierarchy and the
#: evaluator price each node's compute on both halves of every split, most of them repeats.
_COMPUTE: dict = {}


def clear_compute() -> None:
    """Forget the remembered compute times (:meth:`LayerDims.compute_seconds`)."""
    _COMPUTE.clear()


def device_figures(device: Device) -> tuple[float, ...]:
    """What the compiled core reads of a device (7 floats; efficiencies of None as NaN),
    remembered per device object."""
    hit = _DEVICES.get(id(device))
    if hit is not None and hit[0] is device:
        return hit[1]
    nan = float("nan")
    figures = (
        float(device.flops_per_s),
        float(device.memory_bytes_per_s),
        float(device.efficiency),
        nan if device.conv_efficiency is None else float(device.conv_efficiency),
        nan if device.attention_efficiency is None else float(device.attention_efficiency),
        float(device.memory_efficiency),
        float(device.kernel_overhead_s),
    )
    if len(_DEVICES) > 4096:
        _DEVICES.clear()
    _DEVICES[id(device)] = (device, figures)
    return figures


def _ops_figures(ops: tuple) -> tuple[float, ...]:
    """What the compiled core reads of element-wise ops (5 floats each), remembered per tuple."""
    if not ops:
        return ()
    hit = _OPS.get(id(ops))
    if hit is not None and hit[0] is ops:
        return hit[1]
    figures = tuple(
        float(x)
        for op in ops
        for x in (
            op.flops,
            op.traffic,
            op.stored,
            op.row_exchange,
            KIND_CODE.get(op.kind or "gemm", 0),
        )
    )
    if len(_OPS) > 65536:
        _OPS.clear()
    _OPS[id(ops)] = (ops, figures)
    return figures


@dataclass(frozen=True)
class LayerDims:
    """Sizes of one layer (or one join) at one level of the hierarchy; floats because shares scale them.

    For a join (add/concat) ``kernel`` is 0: no weights, no FLOPs, and ``in_features`` ==
    ``out_features`` == its channels. ``out_ops`` / ``in_ops`` are the element-wise ops carried
    per output / input element (see the module docstring).
    """

    __hash__ = cached_hash
    __getstate__ = state_without_hash

    batch: float
    in_features: float
    out_features: float
    in_spatial: int
    out_spatial: int
    kernel: int
    groups: int = 1
    out_ops: tuple[ElementOp, ...] = ()
    in_ops: tuple[ElementOp, ...] = ()
    #: Entries of the embedding tables this node reads directly (each ``entries x Di``).
    tables: float = 0.0
    #: A mixture-of-experts bank: weight matrices, and experts each token is routed to (its
    #: products and stored input count that many times; docs/costmodel.md section 1).
    experts: int = 1
    active: int = 1
    #: The share of the global batch these sizes hold (1 at the root; every BATCH / ROWS cut
    #: multiplies it by the side's share): the fraction of a replicated weight's ZeRO shards a
    #: holder keeps (docs/costmodel.md section 6.1).
    replica: float = 1.0
    #: Activation recomputation (docs/costmodel.md section 6.3): only the weighted product's input
    #: is stored (the checkpoint), and the node's forward runs again in backward.
    recompute: bool = False
    #: Under recomputation, the activation elements kept as checkpoints, as a fraction of the
    #: input: -1 for section 6.3's per-layer rule (a weighted product's input, a join nothing);
    #: with block checkpointing, the part of the node's input that comes from outside its block
    #: (0 inside it).
    checkpoint: float = -1.0
    #: Micro-batches per step (gradient accumulation, docs/costmodel.md section 6.4): activations
    #: are held for one micro-batch at a time, and the weights are read once per micro-batch.
    micro_batches: int = 1

    @property
    def flops(self) -> float:
        """FLOPs of forward + backward + gradient of the weighted product (0 for a join)."""
        return (
            6.0
            * self.active
            * self.batch
            * self.out_features
            * self.out_spatial
            * self.in_features
            * self.kernel
            / self.groups
        )

    @property
    def op_flops(self) -> float:
        """Training FLOPs of the carried element-wise ops (attention cores)."""
        return self.out_elements * sum(op.flops for op in self.out_ops) + self.in_elements * sum(
            op.flops for op in self.in_ops
        )

    @property
    def total_flops(self) -> float:
        return self.flops + self.op_flops

    @property
    def weight_elements(self) -> float:
        """|W| = |dW| = Di * Do * kh*kw / groups, plus the embedding tables the node reads
        (``tables * Di``; biases and norm parameters are not counted)."""
        return (
            self.experts * self.in_features * self.out_features * self.kernel / self.groups
            + self.tables * self.in_features
        )

    @property
    def row_exchange_elements(self) -> float:
        """Elements each side receives when a split divides this node's output columns: the
        row statistics of its layer norms (docs/costmodel.md section 2)."""
        return self.batch * sum(op.row_exchange for op in self.out_ops)

    @property
    def in_elements(self) -> float:
        """|F[l]| = |E[l]| = B * Di * Hin*Win."""
        return self.batch * self.in_features * self.in_spatial

    @property
    def out_elements(self) -> float:
        """|F[l+1]| = |E[l+1]| = B * Do * Hout*Wout."""
        return self.batch * self.out_features * self.out_spatial

    @property
    def stored_elements(self) -> float:
        """Activation elements kept for the backward pass: a weighted layer's input (the gradient
        product needs it) plus what the carried ops store."""
        m = self.micro_batches
        if self.recompute and self.checkpoint >= 0:  # block checkpointing: what enters the block
            return self.checkpoint * self.in_elements / m
        if self.recompute:  # the checkpoint: the product's input, before any dispatch to experts
            return self.in_elements / m if self.kernel else 0.0
        own = self.active * self.in_elements if self.kernel else 0.0
        return (
            own
            + self.out_elements * sum(op.stored for op in self.out_ops)
            + self.in_elements * sum(op.stored for op in self.in_ops)
        ) / m

    def compute_seconds(self, device: Device, bytes_per_element: float) -> float:
        """Time of one training step of this node on ``device`` (docs/costmodel.md section 5):
        a roofline for the weighted product (forward, backward and gradient products: 3 kernels
        per micro-batch, the weights read again per micro-batch; section 6.4) plus one per
        carried op, and the forward again under recomputation (section 6.3). Priced by the
        compiled core."""
        key = (self, device_figures(device), bytes_per_element)
        hit = _COMPUTE.get(key)
        if hit is None:
            hit = _COMPUTE[key] = core.compute(
                *self.core_figures(), key[1], float(bytes_per_element)
            )
            if len(_COMPUTE) > 1 << 16:
                _COMPUTE.clear()
        return hit

    @staticmethod
    def compute_times(dims, device: Device, bytes_per_element: float) -> list[float]:
        """:meth:`compute_seconds` of every dims in ``dims`` (a split's nodes): the same dims
        object (repeated blocks' below the root) is looked up once."""
        seen: dict[int, float] = {}
        out = []
        for d in dims:
            t = seen.get(id(d))
            if t is None:
                t = seen[id(d)] = d.compute_seconds(device, bytes_per_element)
            out.append(t)
        return out

    def memory_bytes(
        self, bytes_per_element: float, optimizer_bytes_per_param: float, zero: int = 0
    ) -> float:
        """Bytes a device holding these sizes keeps: weights and gradients (``bytes_per_element``
        each), optimizer state, stored activations (docs/costmodel.md section 6). With ZeRO
        stage ``zero`` (section 6.1) the optimizer state (stage >= 1), the gradients (>= 2) and the
        weights (3) of a weight replicated by BATCH splits are sharded over its replicas: a holder
        keeps ``replica`` of them. Priced by the compiled core."""
        return core.memory(
            *self.core_figures(),
            float(bytes_per_element),
            float(optimizer_bytes_per_param),
            int(zero),
        )

    def gathered_bytes(self, bytes_per_element: float, zero: int = 0) -> float:
        """Bytes ZeRO stage ``zero`` gathers of these sizes' weights while their unit runs: at
        stage 3 the weights less the shard kept (``(1 - replica)`` of them, in
        ``bytes_per_element``); 0 below (docs/costmodel.md section 6.1). Priced by the compiled
        core."""
        return core.gathered(*self.core_figures(), float(bytes_per_element), int(zero))

    def activation_bytes(self, bytes_per_element: float) -> float:
        """Bytes of every activation backward needs of one micro-batch, none recomputed (what a
        checkpointed block holds again while its backward runs; docs/costmodel.md section 6.3).
        Priced by the compiled core."""
        return core.activations(*self.core_figures()) * float(bytes_per_element)

    def state_bytes(
        self, bytes_per_element: float, optimizer_bytes_per_param: float, zero: int = 0
    ) -> float:
        """The part of :meth:`memory_bytes` that does not depend on the batch: weights, gradients
        and optimizer state (section 6); the rest is stored activations, held per micro-batch in
        flight (a pipeline stage holds several, docs/costmodel.md section 11)."""
        sizes, out_ops, in_ops = self.core_figures()
        return core.memory(
            (0.0,) + sizes[1:],
            out_ops,
            in_ops,
            float(bytes_per_element),
            float(optimizer_bytes_per_param),
            int(zero),
        )

    def core_figures(self) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
        """(sizes, carried output ops, carried input ops) as the compiled core reads them."""
        return (
            (
                float(self.batch),
                float(self.in_features),
                float(self.out_features),
                float(self.in_spatial),
                float(self.out_spatial),
                float(self.kernel),
                float(self.groups),
                float(self.tables),
                float(self.experts),
                float(self.active),
                float(self.replica),
                float(self.recompute),
                float(self.micro_batches),
                float(self.checkpoint),
            ),
            _ops_figures(self.out_ops),
            _ops_figures(self.in_ops),
        )

    def scaled(
        self, batch: float = 1.0, in_features: float = 1.0, out_features: float = 1.0
    ) -> "LayerDims":
        """A copy with B, Di, Do multiplied by the given factors. (Built without the frozen
        dataclass's ``__init__``, which costs twice as much: planners and bounds scale dims
        millions of times. The instance dict holds exactly the fields: no cached properties.)"""
        new = object.__new__(LayerDims)
        fields = new.__dict__
        fields.update(self.__dict__)
        fields.pop("_hash", None)  # the copy's own fields hash anew (cached_hash)
        fields["batch"] = self.batch * batch
        fields["replica"] = self.replica * batch
        fields["in_features"] = self.in_features * in_features
        fields["out_features"] = self.out_features * out_features
        return new


@dataclass(frozen=True)
class LayerProfile:
    """Whole-layer figures of one layer of a graph at a batch size (every layer, weighted or not)."""

    name: str
    op: str
    flops: float
    weight_elements: int
    in_elements: float
    out_elements: float


def element_op(graph: Graph, name: str) -> ElementOp:
    """Per-sample training FLOPs, traffic and stored elements of a layer without a partition
    choice (the layer's own rule, see :meth:`parplan.costmodel.graph.Layer.training_cost`)."""
    info = graph.analyze()
    layer = graph.layer(name)
    flops, traffic, stored = layer.training_cost(list(info.in_shapes[name]), info.out_shape[name])
    exchange = (
        ROW_STATISTICS.get(layer.kind, 0.0) * info.out_shape[name].spatial
        if isinstance(layer, Norm)
        else 0.0
    )
    kind = "attention" if isinstance(layer, Attention) else ""
    return ElementOp(name, float(flops), float(traffic), float(stored), exchange, kind)


def lookups_read(graph: Graph, name: str) -> tuple[str, ...]:
    """The embedding lookups layer ``name`` reads: directly, or through layers without weights
    and without several inputs (Llama's token embedding reaches its first q/k/v projection
    through an RMS norm, and its first residual add directly: both readers' table gradients
    are partial sums to reduce; docs/costmodel.md section 2)."""
    out = []
    for src in graph.layer(name).inputs:
        while src != INPUT:
            layer = graph.layer(src)
            if isinstance(layer, Embedding):
                out.append(src)
                break
            if layer.weighted or layer.join:
                break
            src = layer.inputs[0]
    return tuple(dict.fromkeys(out))


def layer_dims(graph: Graph, name: str, batch: float) -> LayerDims:
    """The :class:`LayerDims` of a weighted or join layer of ``graph`` at ``batch`` (no ops)."""
    info = graph.analyze()
    layer = graph.layer(name)
    x, y = info.in_shapes[name][0], info.out_shape[name]
    tables = float(sum(graph.layer(s).num for s in lookups_read(graph, name)))
    if layer.weighted:
        return LayerDims(
            batch,
            x.channels,
            y.channels,
            x.spatial,
            y.spatial,
            layer.kernel_elements(),
            layer.groups,
            tables=tables,
            experts=getattr(layer, "experts", 1),
            active=getattr(layer, "top_k", 1),
        )
    return LayerDims(batch, y.channels, y.channels, y.spatial, y.spatial, 0, tables=tables)


def layer_profiles(graph: Graph, batch: float) -> list[LayerProfile]:
    """Per-layer training FLOPs, parameters and activation sizes in topological order.

    Weighted layers count their three products; other layers their own rule (attention cores
    count QK^T and AV; element-wise layers 0).
    """
    info = graph.analyze()
    out = []
    for name in info.order:
        layer = graph.layer(name)
        ins = list(info.in_shapes[name])
        if layer.weighted:
            flops = layer_dims(graph, name, batch).flops
        else:
            flops = batch * layer.training_cost(ins, info.out_shape[name])[0]
        out.append(
            LayerProfile(
                name=name,
                op=type(layer).__name__,
                flops=flops,
                weight_elements=layer.weight_elements(ins),
                in_elements=batch * sum(s.elements for s in ins),
                out_elements=batch * info.out_shape[name].elements,
            )
        )
    return out


__all__ = [
    "HashedTuple",
    "IDENTITY_MAX_ITEMS",
    "by_identity",
    "Device",
    "ElementOp",
    "INPUT",
    "LayerDims",
    "LayerProfile",
    "WEIGHTED_TRAFFIC",
    "element_op",
    "lookups_read",
    "layer_dims",
    "layer_profiles",
    "roofline_seconds",
    "op_seconds",
    "device_figures",
    "clear_compute",
    "KIND_CODE",
]
