"""Importers: real models (PyTorch via torch.fx, ONNX) into the layer-graph IR.

- :func:`from_torch` (:mod:`parplan.importers.torch_fx`, needs ``pip install -e ".[torch]"``)
  traces an ``nn.Module`` with torch.fx and an example per-sample input shape.
- :func:`from_onnx` (:mod:`parplan.importers.onnx_import`, needs ``pip install -e ".[onnx]"``)
  reads an ``.onnx`` file or ``onnx.ModelProto``.

Both frontends translate their operators into calls on one :class:`GraphBuilder`, defined
here, which owns the mapping rules so that the two agree:

- the batch is the leading tensor dimension and is dropped; a per-sample tensor ``(C, H, W)``
  is ``Shape(C, H, W)``, ``(C,)`` is ``Shape(C)``, a sequence ``(S, D)`` is ``Shape(D, S, 1)``
  and token ids ``(S,)`` (an integer input) are ``Shape(1, S, 1)``: the sequence sits in the
  spatial slot, so a token-wise projection's batch in the cost model is batch x sequence;
- a matrix product with a parameter operand is a :class:`Linear` (``per_position`` on
  sequences); a learned 1-D tensor added straight after it becomes that layer's bias;
- attention: a fused projection split into three equal pieces, or three separate
  projections (joined by a :class:`Concat`), feeding scaled dot-product attention (the fused
  op, or ``softmax(q @ k^T * scale [+ mask]) @ v`` spelled out) is an :class:`Attention`;
- reshapes, permutes and transposes that keep the per-sample element count pass the IR tensor
  through; one that makes a feature vector out of a (C, H, W) tensor is a :class:`Flatten`;
  scaling by a constant and adding a constant (masks) pass through as well;
- an embedding lookup on the token input, or on positions computed from the input's size
  (``arange``, ``zeros_like``: position and token-type ids), is an :class:`Embedding` that
  reads the graph input;
- picking one position (``x[:, 0]``) or averaging over the sequence or the spatial extent is
  an adaptive average :class:`Pool2d` to 1 x 1 (same shapes and cost);
- a weight matrix used by two layers (a tied LM head, a module called twice) is counted once:
  the graph is then a :class:`~parplan.transformers.TiedGraph`.

Anything else is collected, and the import fails with one
:class:`~parplan.errors.GraphError` that lists every unsupported operator with its count and
where it occurs.

Example (the builder on its own; the frontends drive it the same way):
    >>> b = GraphBuilder("mlp", "test")
    >>> x = b.input((784,), integer=False)
    >>> h = b.linear("fc1", x, (784,), 256, bias=True)
    >>> h = b.activation("relu", h, "relu")
    >>> g = b.build()
    >>> g.parameter_count(), [layer.name for layer in g.layers]
    (200960, ['fc1', 'relu'])
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Hashable, Sequence

from parplan.costmodel.graph import (
    INPUT,
    Activation,
    Add,
    Attention,
    Concat,
    Conv2d,
    Embedding,
    Flatten,
    Graph,
    Linear,
    Norm,
    Pool2d,
    Shape,
)
from parplan.errors import GraphError

__all__ = ["EXTERNAL_SUFFIXES", "GraphBuilder", "Unsupported", "from_onnx", "from_torch", "load_external"]


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Act:
    """An activation held by IR layer ``src`` (or the graph input) with IR shape ``shape``.

    ``linear`` names the bias-free Linear it comes straight from (a bias add may fold into it);
    ``base`` the activation it is an element-wise function of (``x * f(x)`` is a gated activation).
    """

    src: str
    shape: Shape
    linear: str | None = None
    base: str | None = None


@dataclass(frozen=True)
class Piece:
    """Piece ``index`` of ``count`` equal pieces of activation ``act`` (e.g. q, k, v of a fused qkv)."""

    act: Act
    index: int
    count: int


@dataclass(frozen=True)
class Scores:
    """Attention scores ``q @ k^T`` (scaled, masked, softmaxed) awaiting their product with ``v``."""

    q: Act | Piece
    k: Act | Piece
    heads: int


@dataclass(frozen=True)
class Param:
    """A learned tensor (a parameter, or a view of one) of full shape ``shape``; ``key`` identifies it."""

    key: Hashable
    name: str
    shape: tuple[int, ...]


class _Const:
    """A tensor that does not depend on the input's values (masks, positions, sizes, numbers)."""

    def __repr__(self) -> str:
        return "CONST"


CONST = _Const()
#: The value of a node whose inputs include an unsupported operator's non-tensor output.
BAD = object()

Value = Act | Piece | Scores | Param | _Const | object


class Unsupported(Exception):
    """Raised by a builder rule: this use of a (known) operator cannot be expressed in the IR."""


def is_data(value: Value) -> bool:
    """True for values that carry the input's data (activations, pieces, scores)."""
    return isinstance(value, (Act, Piece, Scores))


def stand_in(label: str, ps: Sequence[int]) -> Act:
    """A placeholder activation for the output of an unsupported operator (see the frontends)."""
    try:
        shape = ir_shape(ps)
    except Unsupported:
        shape = Shape(max(1, math.prod(ps)))
    return Act(label, shape)


def _shape_text(ps: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in ps) + ")"


def ir_shape(ps: Sequence[int], integer: bool = False) -> Shape:
    """The IR :class:`Shape` of a per-sample tensor shape (see the module doc).

    Example:
        >>> ir_shape((3, 224, 224)), ir_shape((128, 768)), ir_shape((128,), integer=True)
        (Shape(channels=3, height=224, width=224), Shape(channels=768, height=128, width=1), Shape(channels=1, height=128, width=1))
    """
    ps = tuple(int(d) for d in ps)
    if integer and len(ps) == 1:
        return Shape(1, ps[0], 1)
    if len(ps) == 0:
        return Shape(1)
    if len(ps) == 1:
        return Shape(ps[0])
    if len(ps) == 2:
        return Shape(ps[1], ps[0], 1)
    if len(ps) == 3:
        return Shape(*ps)
    raise Unsupported(f"a per-sample tensor of rank {len(ps)} {_shape_text(ps)} (the IR holds at most C x H x W)")


# --------------------------------------------------------------------------- builder


class GraphBuilder:
    """Builds a :class:`Graph` from semantic operator calls; collects what it cannot express.

    ``model`` names the graph; ``frontend`` is used in messages ("torch", "onnx"). Every
    method returns the output :data:`Value`; methods raise :class:`Unsupported` for a use of
    an operator the IR cannot express (the frontend records it with :meth:`unsupported` and
    goes on, so that one error lists all problems).
    """

    def __init__(self, model: str, frontend: str) -> None:
        self.model = model
        self.frontend = frontend
        self.input_shape: Shape | None = None
        self.token_input = False
        self._layers: dict[str, list] = {}  # name -> [cls, inputs, attrs]
        self._owners: dict[Hashable, str] = {}
        self._tied: list[tuple[str, str]] = []
        self._expected: dict[str, int] = {}
        self._flattened: dict[str, Act] = {}
        self._problems: Counter[tuple[str, str]] = Counter()
        self._where: dict[tuple[str, str], list[str]] = {}

    # ------------------------------------------------------------------ bookkeeping

    def unsupported(self, op: str, where: str, reason: str | None = None) -> None:
        """Record an unsupported operator ``op`` at node ``where`` (with an optional reason)."""
        key = (op, reason or "")
        self._problems[key] += 1
        self._where.setdefault(key, []).append(where)

    @property
    def problems(self) -> dict[tuple[str, str], int]:
        """(operator, reason) -> count of what could not be mapped so far."""
        return dict(self._problems)

    def _unique(self, base: str) -> str:
        base = base or "layer"
        name, k = base, 1
        while name in self._layers or name == INPUT:
            name = f"{base}.{k}"
            k += 1
        return name

    def _emit(self, cls, name: str, inputs: tuple[str, ...], expected: int | None = None, **attrs) -> str:
        name = self._unique(name)
        self._layers[name] = [cls, inputs, attrs]
        if expected is not None:
            self._expected[name] = expected
        return name

    def _own(self, layer: str, key: Hashable | None) -> None:
        """Record that ``layer``'s weight matrix is parameter ``key``; a reuse is a tie."""
        if key is None:
            return
        if key in self._owners:
            self._tied.append((layer, self._owners[key]))
        else:
            self._owners[key] = layer

    @staticmethod
    def _act(value: Value, what: str) -> Act:
        if isinstance(value, Act):
            return value
        if isinstance(value, Piece):
            raise Unsupported(f"{what} on one piece of a split tensor (only q, k, v of attention may be pieces)")
        if isinstance(value, Scores):
            raise Unsupported(f"{what} on attention scores (only scale, mask, softmax, dropout and @ v may follow q @ k^T)")
        raise Unsupported(f"{what} on a constant or learned tensor instead of an activation")

    # ------------------------------------------------------------------ graph input

    def input(self, ps: Sequence[int], integer: bool) -> Act:
        """The graph input: per-sample shape ``ps``; ``integer`` for token ids."""
        shape = ir_shape(ps, integer=integer)
        self.input_shape = shape
        self.token_input = integer and len(ps) == 1
        return Act(INPUT, shape)

    # ------------------------------------------------------------------ weighted layers

    def linear(self, name: str, x: Value, ps_in: Sequence[int], out_features: int, bias: bool,
               key: Hashable | None = None) -> Act:
        """A matrix product over the last dimension of ``x`` (per-sample shape ``ps_in``)."""
        act = self._act(x, "a linear layer")
        ps_in = tuple(ps_in)
        di = ps_in[-1] if ps_in else 1
        rows = math.prod(ps_in[:-1]) if len(ps_in) > 1 else 1
        if len(ps_in) <= 1:
            act = self._as_vector(name, act, di)
            per_position = False
        else:
            if act.shape.channels != di or act.shape.spatial != rows:
                raise Unsupported(
                    f"linear over the last dim ({di}) of a {_shape_text(ps_in)} tensor whose IR features are "
                    f"{act.shape.channels} x {act.shape.spatial} positions: a permute moved the feature dim"
                )
            per_position = True
        layer = self._emit(Linear, name, (act.src,), expected=out_features * rows, out_features=int(out_features),
                           bias=bool(bias), per_position=per_position)
        self._own(layer, key)
        out = Shape(int(out_features), act.shape.height, act.shape.width) if per_position else Shape(int(out_features))
        return Act(layer, out, linear=None if bias else layer)

    def _as_vector(self, name: str, act: Act, di: int) -> Act:
        if act.shape.elements != di:
            raise Unsupported(f"linear with {di} inputs on a tensor of {act.shape.elements} elements per sample")
        if act.shape.spatial == 1:
            return act
        if act.src not in self._flattened:
            flat = self._emit(Flatten, f"{name}.flatten", (act.src,), expected=di)
            self._flattened[act.src] = Act(flat, Shape(di))
        return self._flattened[act.src]

    def conv2d(self, name: str, x: Value, ps_in: Sequence[int], ps_out: Sequence[int], out_channels: int,
               kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int], groups: int,
               bias: bool, dilation: tuple[int, int] = (1, 1), key: Hashable | None = None) -> Act:
        """A 2-D convolution on a (C, H, W) activation."""
        act = self._act(x, "a convolution")
        if tuple(dilation) != (1, 1):
            raise Unsupported(f"dilation {tuple(dilation)}; the IR has undilated convolutions only")
        self._check_chw(act, ps_in, "a convolution")
        layer = self._emit(Conv2d, name, (act.src,), expected=math.prod(ps_out), out_channels=int(out_channels),
                           kernel=_pair(kernel), stride=_pair(stride), padding=_pair(padding), groups=int(groups),
                           bias=bool(bias))
        self._own(layer, key)
        return Act(layer, ir_shape(ps_out))

    def _check_chw(self, act: Act, ps_in: Sequence[int], what: str) -> None:
        ps_in = tuple(ps_in)
        if len(ps_in) != 3 or Shape(*ps_in) != act.shape:
            raise Unsupported(
                f"{what} reads a {_shape_text(ps_in)} tensor that the IR holds as "
                f"{act.shape.channels}x{act.shape.height}x{act.shape.width} (reshaped into an image)"
            )

    def embedding(self, name: str, x: Value, num: int, dim: int,
                  key: Hashable | None = None) -> Act:
        """A table lookup of ``num`` x ``dim``: on the token input, or on positions (a constant)."""
        if isinstance(x, Act):
            if x.shape.channels != 1:
                raise Unsupported(f"embedding of a tensor with {x.shape.channels} features (token ids have 1)")
            ids = x
        elif x is CONST:
            # position / token-type ids computed from the input's size: look them up on the input
            if not self.token_input or self.input_shape is None:
                raise Unsupported("embedding of computed ids in a model whose input is not token ids")
            ids = Act(INPUT, self.input_shape)
        else:
            ids = self._act(x, "an embedding")
        layer = self._emit(Embedding, name, (ids.src,), expected=ids.shape.spatial * int(dim), num=int(num),
                           dim=int(dim))
        self._own(layer, key)
        return Act(layer, Shape(int(dim), ids.shape.height, ids.shape.width))

    # ------------------------------------------------------------------ shape-keeping layers

    def norm(self, name: str, x: Value, kind: str, channels: int, affine: bool = True,
             key: Hashable | None = None) -> Act:
        """Batch norm over channels, or layer norm over the last (feature) dim of size ``channels``."""
        act = self._act(x, f"{kind} norm")
        if act.shape.channels != channels:
            raise Unsupported(
                f"{kind} norm over {channels} features of a tensor the IR holds with {act.shape.channels} features"
            )
        layer = self._emit(Norm, name, (act.src,), expected=act.shape.elements, kind=kind, affine=bool(affine))
        self._own(layer, key)
        return Act(layer, act.shape)

    def activation(self, name: str, x: Value, function: str) -> Value:
        """An element-wise function; on attention scores (softmax, dropout) it passes through."""
        if isinstance(x, Scores):
            return x
        act = self._act(x, function)
        layer = self._emit(Activation, name, (act.src,), expected=act.shape.elements, function=function)
        return Act(layer, act.shape, base=act.base or act.src)

    def pool(self, name: str, x: Value, ps_in: Sequence[int], ps_out: Sequence[int], mode: str,
             kernel=None, stride=None, padding=(0, 0), ceil_mode: bool = False, adaptive: bool = False) -> Act:
        """Max / average pooling of a (C, H, W) activation (``adaptive``: to ``ps_out``'s size)."""
        act = self._act(x, f"{mode} pooling")
        self._check_chw(act, ps_in, f"{mode} pooling")
        if adaptive:
            attrs = {"output_size": (int(ps_out[-2]), int(ps_out[-1]))}
        else:
            kernel = _pair(kernel)
            attrs = {"kernel": kernel, "stride": _pair(stride if stride is not None else kernel),
                     "padding": _pair(padding), "ceil_mode": bool(ceil_mode)}
        layer = self._emit(Pool2d, name, (act.src,), expected=math.prod(ps_out), mode=mode, **attrs)
        return Act(layer, Shape(act.shape.channels, int(ps_out[-2]), int(ps_out[-1])))

    def reduce_positions(self, name: str, x: Value, what: str) -> Act:
        """Average over (or pick one of) all positions: an adaptive average pool to 1 x 1."""
        act = self._act(x, what)
        layer = self._emit(Pool2d, name, (act.src,), expected=act.shape.channels, mode="avg", output_size=(1, 1))
        return Act(layer, Shape(act.shape.channels))

    # ------------------------------------------------------------------ joins and reshapes

    def add(self, name: str, a: Value, b: Value) -> Value:
        """``a + b``: a residual join, a folded bias, or a pass-through add of a constant."""
        if a is CONST or b is CONST or not (is_data(a) or is_data(b)):
            data = b if a is CONST else a
            return data if is_data(data) or data is CONST else CONST
        if isinstance(a, Param) or isinstance(b, Param):
            act, param = (a, b) if isinstance(b, Param) else (b, a)
            act = self._act(act, "a bias add")
            if act.linear is not None and math.prod(param.shape) == act.shape.channels:
                self._layers[act.linear][2]["bias"] = True
                return Act(act.src, act.shape)
            if (self.token_input and math.prod(param.shape) == act.shape.elements
                    and act.shape.spatial == self.input_shape.spatial):
                # a learned per-position table (or an exporter's folded position lookup)
                table = self.embedding(name + ".positions", CONST, act.shape.spatial, act.shape.channels,
                                       key=param.key)
                return self.add(name, act, table)
            raise Unsupported(
                f"add of the learned tensor '{param.name}' {_shape_text(param.shape)} to an activation "
                "(only a bias right after a matrix product, or a per-position table on a token input)"
            )
        if isinstance(a, Scores) or isinstance(b, Scores):
            raise Unsupported("add of an activation to attention scores")
        xa, xb = self._act(a, "an add"), self._act(b, "an add")
        if xa.shape != xb.shape:
            raise Unsupported(
                f"broadcasting add of {xa.shape.channels}x{xa.shape.height}x{xa.shape.width} and "
                f"{xb.shape.channels}x{xb.shape.height}x{xb.shape.width}"
            )
        layer = self._emit(Add, name, (xa.src, xb.src), expected=xa.shape.elements)
        return Act(layer, xa.shape)

    def scale(self, x: Value, factor: Value) -> Value:
        """``x * c`` or ``x / c`` with a constant: passes through (an element-wise product of two
        activations is not expressible)."""
        if isinstance(x, (Param, _Const)) and is_data(factor):
            x, factor = factor, x
        if not is_data(x):
            return CONST
        if isinstance(x, Act) and isinstance(factor, Act):
            gate, other = (factor, x) if factor.base is not None and factor.base in (x.src, x.base) else (x, factor)
            if gate.base is not None and gate.base in (other.src, other.base) and gate.src in self._layers:
                # x * f(x): a gated activation spelled out (GELU's erf form, SiLU as x * sigmoid(x))
                attrs = self._layers[gate.src][2]
                attrs["function"] = _GATED.get(attrs["function"], attrs["function"])
                return Act(gate.src, gate.shape, base=gate.base)
        if is_data(factor) or isinstance(factor, Param):
            raise Unsupported("element-wise product of two tensors (gating); the IR has no such layer")
        return x

    def concat(self, name: str, xs: Sequence[Value], feature_axis: bool) -> Act:
        """Concatenation along the feature dimension (``feature_axis``)."""
        if not feature_axis:
            raise Unsupported("concatenation along a dim other than the feature dim")
        acts = [self._act(x, "a concatenation") for x in xs]
        if len(acts) == 1:
            return acts[0]
        first = acts[0].shape
        layer = self._emit(Concat, name, tuple(a.src for a in acts),
                           expected=sum(a.shape.elements for a in acts))
        return Act(layer, Shape(sum(a.shape.channels for a in acts), first.height, first.width))

    def reshape(self, name: str, x: Value, ps_in: Sequence[int], ps_out: Sequence[int]) -> Value:
        """view / reshape / permute / transpose / flatten: pass-through, or a Flatten to a vector."""
        if isinstance(x, (Param, _Const)) or not is_data(x):
            return x
        if math.prod(ps_in) != math.prod(ps_out):
            raise Unsupported(
                f"reshape from {_shape_text(ps_in)} to {_shape_text(ps_out)} per sample (changes the element "
                "count; the leading dim must stay the batch)"
            )
        if isinstance(x, Act) and len(ps_out) == 1 and x.shape.spatial > 1:
            if x.src not in self._flattened:
                flat = self._emit(Flatten, name, (x.src,), expected=x.shape.elements)
                self._flattened[x.src] = Act(flat, Shape(x.shape.elements))
            return self._flattened[x.src]
        return x

    def split(self, x: Value, count: int) -> list[Value]:
        """Split into ``count`` equal pieces (e.g. q, k, v of a fused projection)."""
        if not is_data(x):
            return [x] * count
        act = self._act(x, "a split")
        return [Piece(act, i, count) for i in range(count)]

    # ------------------------------------------------------------------ products and attention

    def matmul(self, name: str, a: Value, b: Value, ps_a: Sequence[int], bias: bool = False) -> Value:
        """``a @ b``: a Linear (``b`` learned, shape (Di, Do)), ``q @ k^T`` or ``scores @ v``."""
        if isinstance(b, Param):
            if len(b.shape) != 2:
                raise Unsupported(f"product with the learned tensor '{b.name}' of rank {len(b.shape)} (need a matrix)")
            return self.linear(name, a, ps_a, b.shape[1], bias=bias, key=b.key)
        if isinstance(a, Param):
            raise Unsupported(f"product with the learned tensor '{a.name}' on the left")
        if not (is_data(a) and is_data(b)):
            return CONST if not (is_data(a) or is_data(b)) else self._matmul_const(a, b)
        if isinstance(a, Scores):
            return self.attention(name, a.q, a.k, b, a.heads)
        if isinstance(b, Scores):
            raise Unsupported("attention scores on the right of a product")
        ps_a = tuple(ps_a)
        heads = ps_a[0] if len(ps_a) == 3 else 1
        return Scores(a, b, heads)

    @staticmethod
    def _matmul_const(a: Value, b: Value) -> Value:
        raise Unsupported("product of an activation with a constant tensor")

    def attention(self, name: str, q: Value, k: Value, v: Value, heads: int) -> Act:
        """Scaled dot-product attention on q, k, v: pieces of one fused projection, or three activations."""
        parts = (q, k, v)
        if all(isinstance(p, Piece) for p in parts):
            same = len({p.act for p in parts}) == 1 and parts[0].count == 3
            if not same or [p.index for p in parts] != [0, 1, 2]:
                raise Unsupported("attention on q, k, v that are not the three pieces, in order, of one projection")
            fused = parts[0].act
        elif all(isinstance(p, Act) for p in parts):
            shapes = {p.shape for p in parts}
            if len(shapes) != 1:
                raise Unsupported("attention on q, k, v of different shapes (cross-attention)")
            fused = self.concat(f"{name}.qkv", parts, feature_axis=True)
        else:
            raise Unsupported("attention on a mix of pieces and separate tensors")
        if fused.shape.channels % (3 * heads):
            raise Unsupported(f"attention with {heads} heads on {fused.shape.channels // 3} features")
        layer = self._emit(Attention, name, (fused.src,), expected=fused.shape.elements // 3, heads=int(heads))
        return Act(layer, Shape(fused.shape.channels // 3, fused.shape.height, fused.shape.width))

    # ------------------------------------------------------------------ result

    def build(self, name: str | None = None) -> Graph:
        """The finished graph; raises :class:`GraphError` listing every unsupported operator."""
        from parplan.transformers import TiedGraph

        name = name or self.model
        if self._problems:
            items = sorted(self._problems.items(), key=lambda kv: (-kv[1], kv[0]))
            parts = []
            for (op, reason), count in items:
                where = self._where[(op, reason)]
                shown = ", ".join(where[:3]) + (", ..." if len(where) > 3 else "")
                parts.append(f"{op} x{count} at {shown}" + (f" ({reason})" if reason else ""))
            raise GraphError(
                f"model '{name}': {sum(self._problems.values())} operator(s) the {self.frontend} importer cannot "
                f"map to the layer graph: " + "; ".join(parts) + ". Supported: " + SUPPORTED[self.frontend]
            )
        if self.input_shape is None:
            raise GraphError(f"model '{name}': has no input")
        if not self._layers:
            raise GraphError(f"model '{name}': has no layers the planner can use")
        layers = tuple(cls(n, inputs, **attrs) for n, (cls, inputs, attrs) in self._layers.items())
        tied = tuple(self._tied)
        graph = (TiedGraph(name, self.input_shape, layers, tied=tied) if tied
                 else Graph(name, self.input_shape, layers))
        try:
            info = graph.analyze()
        except GraphError as exc:
            raise GraphError(f"model '{name}' imported from {self.frontend}: {exc}") from None
        for layer, expected in self._expected.items():
            got = info.out_shape[layer].elements
            if got != expected:
                raise GraphError(
                    f"model '{name}': layer '{layer}' has {got} elements per sample in the layer graph but "
                    f"{expected} in the {self.frontend} model; its operator uses an option the importer "
                    "does not model"
                )
        return graph


#: x * f(x) written out: the activation it spells.
_GATED = {"erf": "gelu", "sigmoid": "silu"}


def _pair(value) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    a, b = value
    return int(a), int(b)


#: What each frontend maps (for the error message).
SUPPORTED = {
    "torch": (
        "nn.Conv2d, nn.Linear, nn.Embedding, nn.BatchNorm1d/2d, nn.LayerNorm, nn.MaxPool2d/AvgPool2d/"
        "AdaptiveAvgPool2d/AdaptiveMaxPool2d, activations (ReLU, GELU, SiLU, Tanh, Sigmoid, Softmax, "
        "Dropout, ...), nn.Flatten, nn.Identity, nn.MultiheadAttention (batch_first, self-attention), "
        "F.* equivalents, matmul/bmm/mm/F.linear with a parameter, F.scaled_dot_product_attention or "
        "softmax(q @ k^T) @ v, add, cat, flatten/view/reshape/permute/transpose, mean, x[:, i]"
    ),
    "onnx": (
        "Conv, Gemm, MatMul (with an initializer, or q @ k^T / scores @ v), Relu, Gelu, Sigmoid, Tanh, "
        "LeakyRelu, Softmax, Dropout, BatchNormalization, LayerNormalization, MaxPool, AveragePool, "
        "GlobalAveragePool, GlobalMaxPool, Add, Mul/Div by a constant, Concat, Flatten, Reshape, Transpose, "
        "Squeeze, Unsqueeze, Split, Gather (embedding), ReduceMean, Identity, Cast and shape arithmetic"
    ),
}


#: File suffixes :func:`load_external` reads.
EXTERNAL_SUFFIXES = (".onnx", ".py")


def load_external(spec) -> Graph | None:
    """A model an importer reads from ``spec``, or ``None`` if ``spec`` is not one.

    - ``path/model.onnx``: :func:`from_onnx` (graph named after the file);
    - ``path/models.py:factory``: imports the file and calls ``factory()``, which returns a
      :class:`Graph` or an ``(nn.Module, input_shape)`` pair (then :func:`from_torch`, named
      ``<file stem>.<factory>``).

    This is the hook of :func:`parplan.modelfile.load_model` for ``parplan plan --model``.

    Example:
        >>> load_external("resnet50") is None
        True
    """
    from pathlib import Path

    from parplan.errors import ConfigError

    text = str(spec)
    path_text, factory = text, ""
    if ".py:" in text:
        path_text, _, factory = text.rpartition(":")
    path = Path(path_text)
    if path.suffix.lower() == ".onnx" and not factory:
        if not path.is_file():
            raise ConfigError(f"ONNX model '{path}': no such file")
        return from_onnx(path, name=path.stem)
    if path.suffix.lower() != ".py":
        return None
    if not factory.isidentifier():
        raise ConfigError(f"model '{text}': name the factory function after the file, e.g. '{path}:build_model'")
    if not path.is_file():
        raise ConfigError(f"model '{text}': no such file '{path}'")
    import importlib.util

    module_spec = importlib.util.spec_from_file_location(f"parplan_user_model_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)  # the user's own file, named on the command line
    build = getattr(module, factory, None)
    if not callable(build):
        raise ConfigError(f"model '{text}': '{path}' has no function '{factory}'")
    result = build()
    if isinstance(result, Graph):
        return result
    if isinstance(result, tuple) and len(result) == 2:
        # Named after the file and the factory: 'models.py:build' is 'models.build', not 'build'.
        return from_torch(result[0], result[1], name=f"{path.stem}.{factory}")
    raise ConfigError(
        f"model '{text}': {factory}() must return a parplan Graph or an (nn.Module, input_shape) pair "
        f"(got {type(result).__name__})"
    )


def from_torch(module, input_shape, name=None, **kwargs):
    """See :func:`parplan.importers.torch_fx.from_torch` (imported lazily: torch is optional)."""
    from parplan.importers.torch_fx import from_torch as impl

    return impl(module, input_shape, name=name, **kwargs)


def from_onnx(path_or_model, name=None, **kwargs):
    """See :func:`parplan.importers.onnx_import.from_onnx` (imported lazily: onnx is optional)."""
    from parplan.importers.onnx_import import from_onnx as impl

    return impl(path_or_model, name=name, **kwargs)
