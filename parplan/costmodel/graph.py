"""Layer-graph IR: a DNN as a DAG of layers with per-sample tensor shapes (docs/costmodel.md section 1).

A :class:`Graph` holds an input shape and layers that name their inputs; ``"input"`` is the
graph input. :meth:`Graph.analyze` checks the graph (unknown inputs, cycles, shape rules,
non-positive sizes) and infers every layer's input and output shape.

Example:
    >>> g = Graph("tiny", Shape(3, 32, 32), (
    ...     Conv2d("conv1", ("input",), out_channels=16, kernel=(3, 3), padding=(1, 1)),
    ...     Activation("relu1", ("conv1",)),
    ...     Flatten("flat", ("relu1",)),
    ...     Linear("fc", ("flat",), out_features=10),
    ... ))
    >>> info = g.analyze()
    >>> info.out_shape["conv1"]
    Shape(channels=16, height=32, width=32)
    >>> g.parameter_count()
    164298
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, Mapping


from parplan.errors import GraphError

INPUT = "input"


@dataclass(frozen=True)
class Shape:
    """Per-sample tensor shape: channels (features) x height x width. An FC vector is (C, 1, 1)."""

    channels: int
    height: int = 1
    width: int = 1

    @property
    def spatial(self) -> int:
        """Height x width (1 for feature vectors)."""
        return self.height * self.width

    @property
    def elements(self) -> int:
        """Elements per sample."""
        return self.channels * self.height * self.width


def _pair(value, what: str, layer: str) -> tuple[int, int]:
    if isinstance(value, int):
        value = (value, value)
    try:
        a, b = (int(v) for v in value)
    except (TypeError, ValueError):
        raise GraphError(
            f"layer '{layer}': {what} must be an int or a pair of ints (got {value!r})"
        ) from None
    return a, b


#: Largest channel count, feature count or spatial extent a layer may have (2^31 - 1): far
#: beyond any real network, and the products of sizes stay exact in float64.
MAX_EXTENT = 2**31 - 1


def _positive(layer: str, what: str, value: int) -> None:
    if value <= 0:
        raise GraphError(f"layer '{layer}': {what} must be > 0 (got {value})")
    if value > MAX_EXTENT:
        raise GraphError(f"layer '{layer}': {what} must be at most {MAX_EXTENT:,} (got {value:,})")


@dataclass(frozen=True)
class Layer:
    """Base of every layer: a unique name and the names of its inputs (``"input"`` = graph input)."""

    name: str
    inputs: tuple[str, ...]

    #: Weighted layers (conv, linear) get a partition choice; the others pass layouts through.
    weighted: ClassVar[bool] = False
    #: Join layers combine several inputs (add, concat).
    join: ClassVar[bool] = False

    def infer(self, in_shapes: list[Shape]) -> Shape:  # pragma: no cover - abstract
        raise NotImplementedError

    def weight_elements(self, in_shapes: list[Shape]) -> int:
        """Trainable parameters (weights and biases) of the layer."""
        return 0

    def training_cost(self, in_shapes: list[Shape], out_shape: Shape) -> tuple[float, float, float]:
        """(FLOPs, HBM traffic elements, stored activation elements) of one training step, per
        sample, of a layer without a partition choice (docs/costmodel.md section 5).

        Default, an element-wise layer: forward reads its inputs and writes its output, backward
        reads the output gradient and writes the input gradients, so the traffic is
        ``2 * (inputs + output)``; it stores its input for the backward pass.
        """
        ins = sum(s.elements for s in in_shapes)
        return 0.0, 2.0 * (ins + out_shape.elements), float(ins)

    def keeps_columns(self, in_shapes: list[Shape]) -> bool:
        """Whether a join never divides its columns: its layouts are ROWS and WHOLE only
        (``PlanNode.layouts``; docs/costmodel.md section 1)."""
        return False

    def _single(self, in_shapes: list[Shape]) -> Shape:
        if len(in_shapes) != 1:
            raise GraphError(
                f"layer '{self.name}': {type(self).__name__} takes exactly 1 input (got {len(in_shapes)})"
            )
        return in_shapes[0]


@dataclass(frozen=True)
class Conv2d(Layer):
    """2-D convolution. ``kernel``, ``stride``, ``padding`` are (h, w) pairs or ints.

    ``causal``: the height axis is padded before its first row only (``padding[0]`` rows) and
    not after its last: a causal 1-D convolution over positions, whose output at position ``t``
    reads positions ``t - k + 1 .. t`` (Mamba's, written in PyTorch as a convolution padded on
    both sides whose output is cropped back to the input's length)."""

    out_channels: int = 0
    kernel: tuple[int, int] | int = (3, 3)
    stride: tuple[int, int] | int = (1, 1)
    padding: tuple[int, int] | int = (0, 0)
    groups: int = 1
    bias: bool = True
    causal: bool = False
    weighted: ClassVar[bool] = True

    def infer(self, in_shapes: list[Shape]) -> Shape:
        x = self._single(in_shapes)
        _positive(self.name, "out_channels", self.out_channels)
        _positive(self.name, "groups", self.groups)
        kh, kw = _pair(self.kernel, "kernel", self.name)
        sh, sw = _pair(self.stride, "stride", self.name)
        ph, pw = _pair(self.padding, "padding", self.name)
        for what, v in (("kernel", kh), ("kernel", kw), ("stride", sh), ("stride", sw)):
            _positive(self.name, what, v)
        if ph < 0 or pw < 0:
            raise GraphError(f"layer '{self.name}': padding must be >= 0 (got {(ph, pw)})")
        if x.channels % self.groups or self.out_channels % self.groups:
            raise GraphError(
                f"layer '{self.name}': in_channels ({x.channels}) and out_channels ({self.out_channels}) "
                f"must be divisible by groups ({self.groups})"
            )
        h = (x.height + (1 if self.causal else 2) * ph - kh) // sh + 1
        w = (x.width + 2 * pw - kw) // sw + 1
        if h <= 0 or w <= 0:
            raise GraphError(
                f"layer '{self.name}': kernel {(kh, kw)} does not fit input {x.height}x{x.width} "
                f"with padding {(ph, pw)} (output would be {h}x{w})"
            )
        return Shape(self.out_channels, h, w)

    def kernel_elements(self) -> int:
        kh, kw = _pair(self.kernel, "kernel", self.name)
        return kh * kw

    def weight_elements(self, in_shapes: list[Shape]) -> int:
        w = in_shapes[0].channels * self.out_channels * self.kernel_elements() // self.groups
        return w + (self.out_channels if self.bias else 0)


@dataclass(frozen=True)
class Linear(Layer):
    """Fully connected layer on a feature vector (input shape (C, 1, 1); flatten first)."""

    out_features: int = 0
    bias: bool = True
    #: Apply the same weights at every position (a token-wise projection, as nn.Linear on
    #: [batch, seq, hidden]): the input may be (C, S, 1) and the output is (out_features, S, 1).
    per_position: bool = False
    #: A mixture-of-experts bank: ``experts`` weight matrices, each token routed to ``top_k`` of
    #: them; priced with balanced routing, each expert seeing top_k / experts of the tokens
    #: (docs/costmodel.md section 1).
    experts: int = 1
    top_k: int = 1
    #: The model's modules this layer stands for, by path, where the importer fused several
    #: projections into one (q, k, v; gate and up); empty: the layer is its own module. Read by
    #: ``parplan export`` (placements per module); no cost depends on it.
    fuses: tuple[str, ...] = ()
    weighted: ClassVar[bool] = True
    groups: ClassVar[int] = 1

    def infer(self, in_shapes: list[Shape]) -> Shape:
        x = self._single(in_shapes)
        _positive(self.name, "out_features", self.out_features)
        _positive(self.name, "experts", self.experts)
        _positive(self.name, "top_k", self.top_k)
        if self.top_k > self.experts:
            raise GraphError(
                f"layer '{self.name}': top_k ({self.top_k}) exceeds experts ({self.experts})"
            )
        if self.per_position:
            return Shape(self.out_features, x.height, x.width)
        if x.spatial != 1:
            raise GraphError(
                f"layer '{self.name}': Linear needs a feature vector, got {x.channels}x{x.height}x{x.width}; "
                "add a Flatten layer before it"
            )
        return Shape(self.out_features)

    def kernel_elements(self) -> int:
        return 1

    def weight_elements(self, in_shapes: list[Shape]) -> int:
        return self.experts * (
            in_shapes[0].channels * self.out_features + (self.out_features if self.bias else 0)
        )


@dataclass(frozen=True)
class Pool2d(Layer):
    """Max or average pooling. ``output_size`` set means adaptive pooling to that size."""

    mode: str = "max"
    kernel: tuple[int, int] | int = (2, 2)
    stride: tuple[int, int] | int | None = None
    padding: tuple[int, int] | int = (0, 0)
    ceil_mode: bool = False
    output_size: tuple[int, int] | int | None = None

    def infer(self, in_shapes: list[Shape]) -> Shape:
        x = self._single(in_shapes)
        if self.mode not in ("max", "avg"):
            raise GraphError(
                f"layer '{self.name}': pooling mode must be 'max' or 'avg' (got {self.mode!r})"
            )
        if self.output_size is not None:
            oh, ow = _pair(self.output_size, "output_size", self.name)
            _positive(self.name, "output_size", min(oh, ow))
            return Shape(x.channels, oh, ow)
        kh, kw = _pair(self.kernel, "kernel", self.name)
        sh, sw = _pair(self.stride if self.stride is not None else (kh, kw), "stride", self.name)
        ph, pw = _pair(self.padding, "padding", self.name)
        for what, v in (("kernel", kh), ("kernel", kw), ("stride", sh), ("stride", sw)):
            _positive(self.name, what, v)
        rnd = math.ceil if self.ceil_mode else math.floor
        h = int(rnd((x.height + 2 * ph - kh) / sh)) + 1
        w = int(rnd((x.width + 2 * pw - kw) / sw)) + 1
        if h <= 0 or w <= 0:
            raise GraphError(
                f"layer '{self.name}': pooling window {(kh, kw)} does not fit input {x.height}x{x.width}"
            )
        return Shape(x.channels, h, w)


@dataclass(frozen=True)
class Activation(Layer):
    """Element-wise activation (ReLU, GELU, ...) or dropout: shape unchanged."""

    function: str = "relu"

    def infer(self, in_shapes: list[Shape]) -> Shape:
        return self._single(in_shapes)

    def training_cost(self, in_shapes: list[Shape], out_shape: Shape) -> tuple[float, float, float]:
        if self.function.lower() in IDENTITY_FUNCTIONS:
            return 0.0, 0.0, 0.0
        return super().training_cost(in_shapes, out_shape)


#: Activation functions that are the identity in a training step's cost (dropout is a mask
#: multiply fused into its neighbour; stochastic depth likewise).
IDENTITY_FUNCTIONS = frozenset({"identity", "dropout", "stochastic_depth"})


@dataclass(frozen=True)
class Norm(Layer):
    """Batch, layer or RMS normalisation over the channels (features).

    Batch and layer norm have 2 x channels affine parameters (scale and shift), RMS norm
    (``x / sqrt(mean(x^2) + eps) * w``, Llama, T5) has one scale per channel. Layer and RMS
    norm compute per-position statistics over the features (docs/costmodel.md section 2).
    """

    kind: str = "batch"
    affine: bool = True

    def infer(self, in_shapes: list[Shape]) -> Shape:
        if self.kind not in NORM_KINDS:
            raise GraphError(
                f"layer '{self.name}': norm kind must be one of {', '.join(NORM_KINDS)} "
                f"(got {self.kind!r})"
            )
        return self._single(in_shapes)

    def weight_elements(self, in_shapes: list[Shape]) -> int:
        if not self.affine:
            return 0
        return (1 if self.kind == "rms" else 2) * in_shapes[0].channels


#: Norm kinds: statistics over the batch (per channel), or over the features (per position).
NORM_KINDS = ("batch", "layer", "rms")


@dataclass(frozen=True)
class Scale(Layer):
    """Element-wise product with a learned per-channel vector (layer scale, a norm's weight
    spelled out): ``channels`` parameters, shape unchanged; its backward reads the input."""

    def infer(self, in_shapes: list[Shape]) -> Shape:
        return self._single(in_shapes)

    def weight_elements(self, in_shapes: list[Shape]) -> int:
        return in_shapes[0].channels


@dataclass(frozen=True)
class Bias(Layer):
    """Sum with a learned tensor: one value per channel, or (``full``) one per element of a
    sample, e.g. ViT's learned position table. Its backward needs none of its inputs."""

    full: bool = False

    def infer(self, in_shapes: list[Shape]) -> Shape:
        return self._single(in_shapes)

    def weight_elements(self, in_shapes: list[Shape]) -> int:
        x = in_shapes[0]
        return x.elements if self.full else x.channels

    def training_cost(self, in_shapes: list[Shape], out_shape: Shape) -> tuple[float, float, float]:
        _, traffic, _ = super().training_cost(in_shapes, out_shape)
        return 0.0, traffic, 0.0


@dataclass(frozen=True)
class Glu(Layer):
    """Gated linear unit on a fused projection: ``function(first half) * second half``,
    (2C, H, W) -> (C, H, W) (a fused gate/up projection of SwiGLU experts). Its backward reads
    its input."""

    function: str = "silu"

    def infer(self, in_shapes: list[Shape]) -> Shape:
        x = self._single(in_shapes)
        if x.channels % 2:
            raise GraphError(
                f"layer '{self.name}': a gated unit needs an even channel count (got {x.channels})"
            )
        return Shape(x.channels // 2, x.height, x.width)


@dataclass(frozen=True)
class Resize(Layer):
    """A table adapter: maps its input to ``channels x height x width`` whatever the input's
    shape. It is not a network op; it lets a paper's layer table whose rows do not chain (the
    published AccPar code's ResNets: no downsampling shortcuts, an FC reading 2048 features
    after a 512 x 7 x 7 map) be a graph whose every layer has the sizes the table gives
    (docs/costmodel.md section 9). Priced as a copy: it reads its input and writes its output
    (forward and backward); nothing is stored or computed. The executor does not run it."""

    channels: int = 0
    height: int = 1
    width: int = 1

    def infer(self, in_shapes: list[Shape]) -> Shape:
        self._single(in_shapes)
        for what in ("channels", "height", "width"):
            _positive(self.name, what, getattr(self, what))
        return Shape(self.channels, self.height, self.width)

    def training_cost(self, in_shapes: list[Shape], out_shape: Shape) -> tuple[float, float, float]:
        _, traffic, _ = super().training_cost(in_shapes, out_shape)
        return 0.0, traffic, 0.0


@dataclass(frozen=True)
class PatchMerge(Layer):
    """Space to depth: each ``block x block`` patch of positions becomes one position with
    ``block^2`` times the channels, (C, H, W) -> (b^2 C, H/b, W/b) (Swin's patch merging before
    its reduction layer). A copy: nothing is stored, nothing computed."""

    block: int = 2

    def infer(self, in_shapes: list[Shape]) -> Shape:
        x = self._single(in_shapes)
        _positive(self.name, "block", self.block)
        if x.height % self.block or x.width % self.block:
            raise GraphError(
                f"layer '{self.name}': a {x.height}x{x.width} input is not whole {self.block}x"
                f"{self.block} patches"
            )
        return Shape(x.channels * self.block**2, x.height // self.block, x.width // self.block)

    def training_cost(self, in_shapes: list[Shape], out_shape: Shape) -> tuple[float, float, float]:
        _, traffic, _ = super().training_cost(in_shapes, out_shape)
        return 0.0, traffic, 0.0


@dataclass(frozen=True)
class Tokens(Layer):
    """Prepends ``count`` learned tokens to the positions (ViT's class token): a (C, H, W)
    input becomes the sequence (C, count + H*W, 1); ``count x channels`` parameters."""

    count: int = 1

    def infer(self, in_shapes: list[Shape]) -> Shape:
        x = self._single(in_shapes)
        _positive(self.name, "count", self.count)
        return Shape(x.channels, x.spatial + self.count, 1)

    def weight_elements(self, in_shapes: list[Shape]) -> int:
        return self.count * in_shapes[0].channels

    def training_cost(self, in_shapes: list[Shape], out_shape: Shape) -> tuple[float, float, float]:
        _, traffic, _ = super().training_cost(in_shapes, out_shape)
        return 0.0, traffic, 0.0  # a copy: nothing is stored


@dataclass(frozen=True)
class Flatten(Layer):
    """Flattens (C, H, W) into a (C*H*W, 1, 1) feature vector."""

    def infer(self, in_shapes: list[Shape]) -> Shape:
        return Shape(self._single(in_shapes).elements)

    def training_cost(self, in_shapes: list[Shape], out_shape: Shape) -> tuple[float, float, float]:
        return 0.0, 0.0, 0.0  # a view: nothing is read or written


@dataclass(frozen=True)
class Slice(Layer):
    """Channels ``[start, stop)`` of its input (``x.chunk(2, dim=1)``'s pieces: ShuffleNet V2's
    halves). A view: nothing is read, written or stored. Its readers read it as a tensor of its
    own size, laid over the producer's columns as a concat's inputs are: side 1 of a producer
    at column share ``s`` holds ``s`` of every slice (docs/costmodel.md section 3)."""

    start: int = 0
    stop: int = 0

    def infer(self, in_shapes: list[Shape]) -> Shape:
        x = self._single(in_shapes)
        if not 0 <= self.start < self.stop <= x.channels:
            raise GraphError(
                f"layer '{self.name}': channels [{self.start}, {self.stop}) are not a part of its "
                f"input's {x.channels}"
            )
        return Shape(self.stop - self.start, x.height, x.width)

    def training_cost(self, in_shapes: list[Shape], out_shape: Shape) -> tuple[float, float, float]:
        return 0.0, 0.0, 0.0  # a view


@dataclass(frozen=True)
class Embedding(Layer):
    """Token (or position) embedding: token ids (1, S, 1) -> (dim, S, 1); ``num`` x ``dim`` weights.

    A table lookup, not a matrix product: it carries parameters but no partition choice.
    """

    num: int = 0
    dim: int = 0

    def infer(self, in_shapes: list[Shape]) -> Shape:
        x = self._single(in_shapes)
        _positive(self.name, "num", self.num)
        _positive(self.name, "dim", self.dim)
        return Shape(self.dim, x.height, x.width)

    def weight_elements(self, in_shapes: list[Shape]) -> int:
        return self.num * self.dim

    def training_cost(self, in_shapes: list[Shape], out_shape: Shape) -> tuple[float, float, float]:
        return 0.0, 2.0 * out_shape.elements, 0.0  # gather rows forward, scatter-add backward


@dataclass(frozen=True)
class Attention(Layer):
    """Scaled dot-product attention core on fused Q, K, V: ((h + 2 h_kv) d, S, 1) -> (h d, S, 1).

    softmax(Q K^T / sqrt(d)) V over ``heads`` query heads of size ``d``; ``kv_heads`` key/value
    heads (0: as many as query heads; fewer is grouped-query attention, each K/V head serving
    ``heads / kv_heads`` query heads). Activation x activation products, so no weights and no
    partition choice (its layout passes through, heads split with columns).
    """

    heads: int = 1
    kv_heads: int = 0
    #: Positions each query attends to, in blocks of this many (0: the whole sequence); Swin's
    #: window attention over 7 x 7 windows has window 49.
    window: int = 0
    #: Rotary position embedding applied to q and k inside the core (Llama's RoPE): element-wise.
    rotary: bool = False
    #: Entries of a learned attention bias added to the scores (T5's relative position
    #: buckets x heads): parameters only; looking them up costs nothing worth pricing.
    bias_params: int = 0
    #: An RMS norm per head on q and k before RoPE (Qwen3, Gemma 3): one scale per head
    #: feature for q and one for k (2 d parameters); element-wise, statistics within a head,
    #: so a split of whole heads exchanges nothing (docs/costmodel.md section 1).
    qk_norm: bool = False
    #: Cosine attention (Swin V2): q and k L2-normalised per head (no weights), the scores
    #: scaled by a learned logit scale per query head (``heads`` parameters) instead of
    #: ``1 / sqrt(d)``; element-wise inside the core, as a q/k norm is.
    cosine: bool = False
    #: Relative position scores added to the scores (DeBERTa's disentangled attention): each
    #: of ``relative_terms`` terms (content-to-position: q against learned position keys;
    #: position-to-content: k against position queries) scores every position against
    #: ``relative`` relative positions, then gathers one per key. Learned position embeddings
    #: (``bias_params``, projected by the q and k weights once per step) are parameters only.
    relative: int = 0
    relative_terms: int = 0

    @property
    def key_heads(self) -> int:
        """Key/value heads (``heads`` unless grouped-query attention)."""
        return self.kv_heads or self.heads

    def infer(self, in_shapes: list[Shape]) -> Shape:
        x = self._single(in_shapes)
        _positive(self.name, "heads", self.heads)
        if self.kv_heads < 0 or self.heads % self.key_heads:
            raise GraphError(
                f"layer '{self.name}': kv_heads ({self.kv_heads}) must divide heads ({self.heads})"
            )
        parts = self.heads + 2 * self.key_heads
        if x.channels % parts:
            raise GraphError(
                f"layer '{self.name}': input channels ({x.channels}) must be (heads + 2 kv_heads) x head size "
                f"= {parts} x d; feed it the fused Q, K, V projection"
            )
        if self.window < 0 or self.window and x.spatial % self.window:
            raise GraphError(
                f"layer '{self.name}': window ({self.window}) must divide the {x.spatial} positions"
            )
        return Shape(x.channels // parts * self.heads, x.height, x.width)

    def weight_elements(self, in_shapes: list[Shape]) -> int:
        head = in_shapes[0].channels // (self.heads + 2 * self.key_heads)
        return (
            self.bias_params
            + (2 * head if self.qk_norm else 0)
            + (self.heads if self.cosine else 0)
        )

    def attention_flops(self, in_shapes: list[Shape], batch: float) -> float:
        """FLOPs of one training step of the two attention products (QK^T and AV): per query
        head, 2 S^2 d each forward and twice that backward; with relative position scores, each
        term's product with the position keys (or queries), 2 S R d forward per head."""
        x = in_shapes[0]
        hidden = x.channels // (self.heads + 2 * self.key_heads) * self.heads
        keys = min(self.window, x.spatial) if self.window else x.spatial
        relative = self.relative * self.relative_terms  # position scores per query
        return 3 * 2 * batch * x.spatial * hidden * (2 * keys + relative)

    def training_cost(self, in_shapes: list[Shape], out_shape: Shape) -> tuple[float, float, float]:
        """QK^T and AV (forward, and twice that backward); a fused kernel reads Q, K, V and
        writes the output (and the reverse backward), storing its input. Rotary embeddings
        read and write q and k once forward and once backward; so does a q/k norm, and so do
        cosine attention's L2 norms."""
        _, traffic, stored = super().training_cost(in_shapes, out_shape)
        x = in_shapes[0]
        qk = x.elements // (self.heads + 2 * self.key_heads) * (self.heads + self.key_heads)
        traffic += 4.0 * qk * (int(self.rotary) + int(self.qk_norm) + int(self.cosine))
        return self.attention_flops(in_shapes, 1.0), traffic, stored


@dataclass(frozen=True)
class Add(Layer):
    """Element-wise sum of >= 2 inputs of equal shape (residual join)."""

    join: ClassVar[bool] = True

    def training_cost(self, in_shapes: list[Shape], out_shape: Shape) -> tuple[float, float, float]:
        _, traffic, _ = super().training_cost(in_shapes, out_shape)
        return 0.0, traffic, 0.0  # the backward pass needs none of its inputs

    def infer(self, in_shapes: list[Shape]) -> Shape:
        if len(in_shapes) < 2:
            raise GraphError(f"layer '{self.name}': Add needs >= 2 inputs (got {len(in_shapes)})")
        first = in_shapes[0]
        for name, s in zip(self.inputs[1:], in_shapes[1:]):
            if s != first:
                raise GraphError(
                    f"layer '{self.name}': Add inputs must have equal shapes; '{self.inputs[0]}' is "
                    f"{_fmt(first)} but '{name}' is {_fmt(s)}"
                )
        return first


@dataclass(frozen=True)
class Mul(Layer):
    """Element-wise product of two inputs (a gate: SwiGLU's ``act(gate) * up``, SE's channel
    gate): equal shapes, or one a per-channel vector (C, 1, 1) broadcast over the other's
    positions, or a per-position gate (1, H, W) broadcast over the other's channels (Qwen2-MoE's
    shared-expert gate). A join: its inputs meet in one layout; its backward reads both inputs.
    With a per-position gate it is never split by columns (:meth:`per_position_gate`)."""

    join: ClassVar[bool] = True

    def training_cost(self, in_shapes: list[Shape], out_shape: Shape) -> tuple[float, float, float]:
        """Forward reads both inputs and writes the output; backward reads the output gradient
        and both inputs and writes both input gradients; both inputs are stored."""
        ins = sum(s.elements for s in in_shapes)
        return 0.0, 3.0 * ins + 2.0 * out_shape.elements, float(ins)

    def infer(self, in_shapes: list[Shape]) -> Shape:
        if len(in_shapes) != 2:
            raise GraphError(
                f"layer '{self.name}': Mul takes exactly 2 inputs (got {len(in_shapes)})"
            )
        a, b = in_shapes
        big, small = (a, b) if a.elements >= b.elements else (b, a)
        if small != big and small not in (Shape(big.channels), Shape(1, big.height, big.width)):
            raise GraphError(
                f"layer '{self.name}': Mul inputs must have equal shapes or one must be a per-channel "
                f"gate ({big.channels}x1x1) or a per-position gate (1x{big.height}x{big.width}); "
                f"'{self.inputs[0]}' is {_fmt(a)} and '{self.inputs[1]}' is {_fmt(b)}"
            )
        return big

    def keeps_columns(self, in_shapes: list[Shape]) -> bool:
        return self.per_position_gate(in_shapes)

    @staticmethod
    def per_position_gate(in_shapes: list[Shape]) -> bool:
        """Whether one input is one value per position broadcast over the other's channels: the
        join then keeps every column together (its layouts are ROWS and WHOLE): a split of the
        columns would need the gate whole on both sides and its gradient summed over them,
        which no layout of section 3 prices (docs/costmodel.md section 1)."""
        a, b = in_shapes
        big, small = (a, b) if a.elements >= b.elements else (b, a)
        return small != big and small.channels == 1 and small == Shape(1, big.height, big.width)


@dataclass(frozen=True)
class Scan(Layer):
    """Mamba's selective scan (S6) with its skip and gate, as one fused kernel runs it:
    inputs ``x``, ``dt`` (I, L), ``B``, ``C`` (N, L) and optionally the gate ``z`` (I, L);
    output (I, L). Per channel ``i`` and position ``t`` a state of ``N = state`` values runs
    ``h = exp(dt A) h + dt B x`` and the output is ``C . h + D x``, times ``silu(z)``.

    Parameters: ``A`` (I x N), with ``skip`` the skip ``D`` (I), with ``dt_bias`` the time
    step's bias (I; ``dt``'s projection adds it inside the kernel). ``B`` and ``C`` are shared
    by every channel, so the join keeps every column together (:meth:`keeps_columns`: ROWS
    and WHOLE only), as a product with a per-position gate does (docs/costmodel.md section 1).
    """

    state: int = 16
    skip: bool = True
    dt_bias: bool = True
    join: ClassVar[bool] = True

    def infer(self, in_shapes: list[Shape]) -> Shape:
        if len(in_shapes) not in (4, 5):
            raise GraphError(
                f"layer '{self.name}': Scan takes x, dt, B, C and optionally the gate z "
                f"(got {len(in_shapes)} inputs)"
            )
        _positive(self.name, "state", self.state)
        x, dt, b, c = in_shapes[:4]
        wide = [("x", x), ("dt", dt)] + ([("z", in_shapes[4])] if len(in_shapes) == 5 else [])
        for what, s in wide:
            if s != x:
                raise GraphError(
                    f"layer '{self.name}': Scan's {what} is {_fmt(s)} but x is {_fmt(x)}"
                )
        want = Shape(self.state, x.height, x.width)
        for what, s in (("B", b), ("C", c)):
            if s != want:
                raise GraphError(
                    f"layer '{self.name}': Scan's {what} is {_fmt(s)}; with state {self.state} "
                    f"and x {_fmt(x)} it must be {_fmt(want)}"
                )
        return x

    def weight_elements(self, in_shapes: list[Shape]) -> int:
        channels = in_shapes[0].channels
        return channels * self.state + channels * (int(self.skip) + int(self.dt_bias))

    def training_cost(self, in_shapes: list[Shape], out_shape: Shape) -> tuple[float, float, float]:
        """Per channel, position and state value, forward: the discretisation (``dt A``,
        ``dt B x``: 3 products), the state update (2) and the output ``C . h`` (2); per channel
        and position the skip (2) and the gate (1); backward twice that. The fused kernel reads
        its inputs and writes the output, and backward reads the inputs again with the output
        gradient and writes their gradients (a product's traffic); it stores its inputs and
        recomputes the states (docs/costmodel.md section 1)."""
        x = in_shapes[0]
        per_position = 7.0 * self.state + 2.0 * int(self.skip) + float(len(in_shapes) == 5)
        ins = sum(s.elements for s in in_shapes)
        return 3.0 * per_position * x.elements, 3.0 * ins + 2.0 * out_shape.elements, float(ins)

    def keeps_columns(self, in_shapes: list[Shape]) -> bool:
        return True


@dataclass(frozen=True)
class Concat(Layer):
    """Concatenation of >= 2 inputs along channels (equal spatial sizes)."""

    join: ClassVar[bool] = True

    def training_cost(self, in_shapes: list[Shape], out_shape: Shape) -> tuple[float, float, float]:
        _, traffic, _ = super().training_cost(in_shapes, out_shape)
        return 0.0, traffic, 0.0  # the backward pass needs none of its inputs

    def infer(self, in_shapes: list[Shape]) -> Shape:
        if len(in_shapes) < 2:
            raise GraphError(
                f"layer '{self.name}': Concat needs >= 2 inputs (got {len(in_shapes)})"
            )
        first = in_shapes[0]
        for name, s in zip(self.inputs[1:], in_shapes[1:]):
            if (s.height, s.width) != (first.height, first.width):
                raise GraphError(
                    f"layer '{self.name}': Concat inputs must have equal spatial sizes; '{self.inputs[0]}' is "
                    f"{_fmt(first)} but '{name}' is {_fmt(s)}"
                )
        return Shape(sum(s.channels for s in in_shapes), first.height, first.width)


def _fmt(s: Shape) -> str:
    return f"{s.channels}x{s.height}x{s.width}"


@dataclass(frozen=True)
class GraphInfo:
    """Result of :meth:`Graph.analyze`: topological order and inferred shapes per layer."""

    order: tuple[str, ...]
    in_shapes: Mapping[str, tuple[Shape, ...]]
    out_shape: Mapping[str, Shape]
    consumers: Mapping[str, tuple[str, ...]]


def _layer_order(graph: str, layers) -> tuple[str, ...]:
    """The layers in topological order, ties broken by their position in the list (the
    lexicographic topological order); a cycle is a :class:`GraphError` that names it. Uses the
    standard library's :mod:`graphlib` (networkx took a fifth of the CLI's start-up)."""
    import graphlib
    import heapq

    position = {layer.name: i for i, layer in enumerate(layers)}
    sorter = graphlib.TopologicalSorter(
        {layer.name: [s for s in layer.inputs if s != INPUT] for layer in layers}
    )
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        cycle = list(exc.args[1])  # [u, v, ..., u] along the data flow: u feeds v
        raise GraphError(
            f"layer '{cycle[0]}': graph '{graph}' has a cycle: {' -> '.join(cycle)}"
        ) from None
    ready: list[tuple[int, str]] = []
    order: list[str] = []
    while sorter.is_active():
        for name in sorter.get_ready():
            heapq.heappush(ready, (position[name], name))
        _, name = heapq.heappop(ready)
        order.append(name)
        sorter.done(name)
    return tuple(order)


@dataclass(frozen=True)
class Graph:
    """A DNN layer graph: a name, a per-sample input shape and layers (any order, a DAG)."""

    name: str
    input_shape: Shape
    layers: tuple[Layer, ...]
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __reduce__(self):
        # the cache holds derived views (some read-only mappings); a copy rebuilds them
        return (Graph, (self.name, self.input_shape, self.layers))

    def layer(self, name: str) -> Layer:
        """The layer called ``name`` (a dict lookup; the index is built once per graph)."""
        index = self._cache.get("by_name")
        if index is None:
            index = self._cache["by_name"] = {}
            for layer in self.layers:
                index.setdefault(
                    layer.name, layer
                )  # the first wins, as a scan would; analyze rejects duplicates
        try:
            return index[name]
        except (KeyError, TypeError):
            raise GraphError(f"graph '{self.name}': no layer named '{name}'") from None

    def analyze(self) -> GraphInfo:
        """Validate the graph and infer shapes. Raises :class:`GraphError` naming the bad layer."""
        if "info" not in self._cache:
            self._cache["info"] = self._analyze()
        return self._cache["info"]

    def _analyze(self) -> GraphInfo:
        s = self.input_shape
        for what, v in (("channels", s.channels), ("height", s.height), ("width", s.width)):
            if v <= 0 or v > MAX_EXTENT:
                raise GraphError(
                    f"graph '{self.name}': input {what} must be in [1, {MAX_EXTENT:,}] (got {v})"
                )
        if not self.layers:
            raise GraphError(f"graph '{self.name}': has no layers")
        by_name: dict[str, Layer] = {}
        for layer in self.layers:
            if not isinstance(layer.name, str) or not layer.name:
                raise GraphError(
                    f"graph '{self.name}': every layer needs a non-empty name (got {layer.name!r})"
                )
            if layer.name == INPUT:
                raise GraphError(f"graph '{self.name}': '{INPUT}' is reserved for the graph input")
            if layer.name in by_name:
                raise GraphError(f"graph '{self.name}': duplicate layer name '{layer.name}'")
            by_name[layer.name] = layer
        for layer in self.layers:
            if not layer.inputs:
                raise GraphError(
                    f"layer '{layer.name}': has no inputs (use '{INPUT}' for the graph input)"
                )
            for src in layer.inputs:
                if src != INPUT and src not in by_name:
                    raise GraphError(
                        f"layer '{layer.name}': unknown input '{src}' (not a layer of graph '{self.name}' "
                        f"nor '{INPUT}')"
                    )
        order = _layer_order(self.name, self.layers)
        out_shape: dict[str, Shape] = {INPUT: self.input_shape}
        in_shapes: dict[str, tuple[Shape, ...]] = {}
        for name in order:
            layer = by_name[name]
            shapes = [out_shape[src] for src in layer.inputs]
            out_shape[name] = layer.infer(shapes)
            in_shapes[name] = tuple(shapes)
        del out_shape[INPUT]
        consumers: dict[str, list[str]] = {name: [] for name in order}
        consumers[INPUT] = []
        for name in order:
            for src in by_name[name].inputs:
                consumers[src].append(name)
        return GraphInfo(
            order=order,
            in_shapes=MappingProxyType(in_shapes),
            out_shape=MappingProxyType(out_shape),
            consumers=MappingProxyType({k: tuple(v) for k, v in consumers.items()}),
        )

    def parameter_count(self) -> int:
        """Trainable parameters of the whole graph."""
        info = self.analyze()
        return sum(self.layer(n).weight_elements(list(info.in_shapes[n])) for n in info.order)

    def weighted_layers(self) -> tuple[str, ...]:
        """Names of the weighted (conv, linear) layers in topological order."""
        info = self.analyze()
        return tuple(n for n in info.order if self.layer(n).weighted)


@dataclass(frozen=True)
class TiedGraph(Graph):
    """A :class:`Graph` in which some layers reuse another layer's weights.

    ``tied`` holds ``(layer, owner)`` pairs. A layer of the owner's type (a module called
    twice) shares all its parameters with the owner; a :class:`Linear` tied to another kind of
    layer (GPT-2's LM head and the token :class:`Embedding`) shares its ``Di x Do`` matrix,
    not its bias. The cost model prices every layer as usual (the head's products and
    gradient exist whether or not its matrix is shared); only :meth:`parameter_count` counts a
    shared tensor once, at its owner.

    Example:
        >>> g = TiedGraph("lm", Shape(1, 8, 1), (
        ...     Embedding("wte", (INPUT,), num=100, dim=16),
        ...     Linear("head", ("wte",), out_features=100, bias=False, per_position=True),
        ... ), tied=(("head", "wte"),))
        >>> g.parameter_count()
        1600
    """

    tied: tuple[tuple[str, str], ...] = ()

    def __reduce__(self):
        # as Graph's, keeping the ties (a plain Graph would count shared weights twice)
        return (TiedGraph, (self.name, self.input_shape, self.layers, self.tied))

    def parameter_count(self) -> int:
        """Trainable parameters, a shared tensor counted once (at its owner)."""
        return super().parameter_count() - sum(
            self._shared(name, owner) for name, owner in self.tied
        )

    def _shared(self, name: str, owner: str) -> int:
        info = self.analyze()
        layer, source = self.layer(name), self.layer(owner)
        mine = layer.weight_elements(list(info.in_shapes[name]))
        theirs = source.weight_elements(list(info.in_shapes[owner]))
        if isinstance(layer, Linear) and isinstance(source, Linear) and layer.bias != source.bias:
            # a matrix reused by a product with its own (or no) bias: the matrix is shared
            mine -= layer.out_features if layer.bias else 0
            theirs -= source.out_features if source.bias else 0
        elif type(layer) is not type(source):
            if not isinstance(layer, Linear):
                raise GraphError(
                    f"layer '{name}': a {type(layer).__name__} can share weights only with a layer of its own "
                    f"type ('{owner}' is a {type(source).__name__})"
                )
            mine -= layer.out_features if layer.bias else 0
            theirs -= source.out_features if isinstance(source, Linear) and source.bias else 0
        if mine != theirs:
            raise GraphError(
                f"layer '{name}': tied to '{owner}' but has {mine} shared weights where '{owner}' has {theirs}; "
                "a tied layer must reuse exactly its owner's matrix"
            )
        return mine
