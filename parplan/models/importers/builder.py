"""The importers' shared machinery: the IR values the frontends pass around and the one
:class:`GraphBuilder` that owns the mapping rules (docs/importers.md; the package docstring
of :mod:`parplan.models.importers` lists them). The frontends (``torch_export``, ``torch_fx``,
``onnx_import``) import from here, never from the package, so that nothing imports in a circle.

Example:
    >>> b = GraphBuilder("mlp", "test")
    >>> x = b.input((784,), integer=False)
    >>> h = b.linear("fc1", x, (784,), 256, bias=True)
    >>> b.build().parameter_count()
    200960
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Hashable, Sequence

from parplan.costmodel.graph import (
    INPUT,
    Activation,
    Add,
    Attention,
    Bias,
    Concat,
    Conv2d,
    Embedding,
    Flatten,
    Glu,
    Graph,
    Linear,
    Mul,
    Norm,
    PatchMerge,
    Pool2d,
    Scan,
    Slice,
    Scale,
    Shape,
    TiedGraph,
    Tokens,
)
from parplan.errors import GraphError

__all__ = ["GraphBuilder", "Unsupported", "input_shape_of", "supported_text"]


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
    """Piece ``index`` of ``count`` equal pieces of activation ``act`` (e.g. q, k, v of a fused qkv),
    or with ``span`` the features ``[start, end)`` of ``act`` (Phi-3 slices q, k, v of unequal
    sizes out of its projection by index); ``rotary``: RoPE applied to it (rotary position
    embedding on q and k pieces of the model's own fused projection: GPT-NeoX, Phi-3);
    ``normed``: L2-normalised per head (cosine attention's q and k: Swin V2); ``features``: the
    pieces divide the features (IR channels), not another dim. Read by anything but attention
    (or a gated unit), a piece of the features is a :class:`Slice` of ``act``."""

    act: Act
    index: int
    count: int
    rotary: bool = False
    span: tuple[int, int] | None = None
    normed: bool = False
    features: bool = True

    @property
    def channels(self) -> tuple[int, int]:
        """The features ``[start, stop)`` of ``act`` this piece is."""
        if self.span is not None:
            return self.span
        width = self.act.shape.channels // self.count
        return self.index * width, (self.index + 1) * width

    def same_piece(self, other) -> bool:
        """Whether ``other`` is this piece, rotated or not."""
        return isinstance(other, Piece) and (other.act, other.index, other.count, other.span) == (
            self.act,
            self.index,
            self.count,
            self.span,
        )


@dataclass(frozen=True)
class Scores:
    """Attention scores ``q @ k^T`` (scaled, masked, softmaxed) awaiting their product with ``v``;
    ``scale``: a learned logit scale they were multiplied by (cosine attention's, one per head)."""

    q: Act | Piece
    k: Act | Piece
    heads: int
    bias: "Param | None" = None
    window: int = 0
    scale: "Param | None" = None
    relative: "Relative | None" = None


@dataclass(frozen=True)
class Relative:
    """Relative position scores awaiting their sum with the content scores (DeBERTa's
    disentangled attention): per term, q or k (``sides``) against learned position keys or
    queries of ``span`` relative positions (content-to-position, position-to-content), then
    gathered per query and key; ``param``: the learned tensors the position keys and queries
    are computed from (the relative embeddings, their norm and the q/k projections)."""

    sides: tuple
    span: int
    param: "Param"


@dataclass(frozen=True)
class Derived:
    """An element-wise function of activation ``base`` not yet materialised as a layer (``x ** 2``,
    ``x + c * x ** 3``): it becomes an activation when a named function is applied to it, or
    a row statistic when averaged over the features."""

    base: Act


@dataclass(frozen=True)
class RowStat:
    """A per-position statistic of activation ``base`` over its features (``mean(x ** 2, -1)``
    and functions of it): multiplying ``base`` by it is an RMS norm. ``group``: features per
    statistic when it is taken per head (Qwen3's q/k norms), 0 for all features. With a
    :class:`Piece` as ``base``: its L2 norm per head (``F.normalize``), for cosine attention."""

    base: "Act | Piece"
    group: int = 0


@dataclass(frozen=True)
class Half:
    """Part of activation ``base`` (or of a piece of a fused projection) along the head
    dimension (RoPE's ``x[..., :d/2]``, negated); ``whole``: the parts concatenated back
    (``rotate_half(x)``), an element-wise map of ``base``."""

    base: "Act | Piece"
    whole: bool = False


@dataclass(frozen=True)
class Gated:
    """``function`` applied to the first of two pieces of a fused projection: times the second
    piece it is a gated linear unit (:class:`Glu`)."""

    act: Act
    function: str


@dataclass(frozen=True)
class Dispatched:
    """Mixture-of-experts dispatch: the tokens of ``value`` each copied to ``k`` experts (an
    index by the router's choices); summing the ``k`` copies combines them again."""

    value: "Value"
    k: int


@dataclass(frozen=True)
class Strided:
    """Every other position of activation ``base`` along ``count`` spatial dims (Swin's
    ``x[:, 0::2, 1::2, :]``); four such quarters concatenated on the features merge patches."""

    base: Act
    count: int = 1


@dataclass(frozen=True)
class Repeated:
    """Activation ``act`` with each head repeated ``factor`` times (grouped-query attention's
    ``repeat_kv``: expand + reshape)."""

    act: Act
    factor: int


@dataclass(frozen=True)
class Stacked:
    """Activation ``act`` viewed as ``count`` stacked equal pieces (``unflatten(-1, (3, E))`` of a
    fused QKV projection); selecting along the stacking dim gives a :class:`Piece`."""

    act: Act
    count: int


@dataclass(frozen=True)
class Param:
    """A learned tensor (a parameter, or a view of one) of full shape ``shape``; ``key`` identifies it.
    ``parts``: for a tensor computed from several learned ones without the input's data (Swin
    V2's position-bias MLP run on a constant table), each one's key and element count."""

    key: Hashable
    name: str
    shape: tuple[int, ...]
    parts: tuple[tuple[Hashable, int], ...] = ()

    @property
    def sources(self) -> tuple[tuple[Hashable, int], ...]:
        """(key, elements) of every learned tensor this one is computed from (itself if none)."""
        return self.parts or ((self.key, math.prod(self.shape)),)


def combined_param(params: Sequence[Param], shape: tuple[int, ...]) -> Param:
    """The value of an operator on learned tensors only (and constants), of shape ``shape``: one
    :class:`Param` that counts every distinct source once."""
    sources = tuple(dict((k, n) for p in params for k, n in p.sources).items())
    if len(sources) == 1:
        return params[0]
    return Param(("computed",) + tuple(k for k, _ in sources), params[0].name, shape, sources)


class _Const:
    """A tensor that does not depend on the input's values (masks, positions, sizes, numbers)."""

    def __repr__(self) -> str:
        return "CONST"


CONST = _Const()
#: The value of a node whose inputs include an unsupported operator's non-tensor output.
BAD = object()

Value = (
    Act
    | Piece
    | Scores
    | Relative
    | Derived
    | RowStat
    | Half
    | Gated
    | Dispatched
    | Strided
    | Repeated
    | Stacked
    | Param
    | _Const
    | object
)


class Unsupported(Exception):
    """Raised by a builder rule: this use of a (known) operator cannot be expressed in the IR."""


def is_data(value: Value) -> bool:
    """True for values that carry the input's data (activations and the partial forms above)."""
    return isinstance(
        value,
        (
            Act,
            Piece,
            Scores,
            Relative,
            Derived,
            RowStat,
            Half,
            Gated,
            Dispatched,
            Strided,
            Repeated,
            Stacked,
        ),
    )


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
        >>> ir_shape((3, 224, 224))
        Shape(channels=3, height=224, width=224)
        >>> ir_shape((128, 768)), ir_shape((128,), integer=True)
        (Shape(channels=768, height=128, width=1), Shape(channels=1, height=128, width=1))
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
    raise Unsupported(
        f"a per-sample tensor of rank {len(ps)} {_shape_text(ps)} (the IR holds at most C x H x W)"
    )


# --------------------------------------------------------------------------- builder


class GraphBuilder:
    """Builds a :class:`Graph` from semantic operator calls; collects what it cannot express.

    ``model`` names the graph; ``frontend`` is used in messages ("torch", "onnx");
    ``supported`` is what the frontend maps, from its dispatch tables (:func:`supported_text`),
    shown after the operators it could not map. Every
    method returns the output :data:`Value`; methods raise :class:`Unsupported` for a use of
    an operator the IR cannot express (the frontend records it with :meth:`unsupported` and
    goes on, so that one error lists all problems).
    """

    def __init__(self, model: str, frontend: str, supported: str = "") -> None:
        self.model = model
        self.frontend = frontend
        self.supported = supported
        self.input_shape: Shape | None = None
        self.token_input = False
        self._layers: dict[str, list] = {}  # name -> [cls, inputs, attrs]
        self._owners: dict[Hashable, str] = {}
        self._tied: list[tuple[str, str]] = []
        self._expected: dict[str, int] = {}
        self._flattened: dict[str, Act] = {}
        self._slices: dict[tuple[str, int, int], Act] = {}
        self._problems: Counter[tuple[str, str]] = Counter()
        self._where: dict[tuple[str, str], list[str]] = {}

    # ------------------------------------------------------------------ bookkeeping

    def unsupported(
        self, op: str, where: str, reason: str | None = None, repeat: bool = False
    ) -> None:
        """Record an unsupported operator ``op`` at node ``where`` (with an optional reason).
        ``repeat``: the node reads what an unsupported one produced, so it is counted only as
        another occurrence of a problem already recorded (the same blocker in every block)."""
        key = (op, reason or "")
        if repeat and key not in self._problems:
            return
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

    def _emit(
        self, cls, name: str, inputs: tuple[str, ...], expected: int | None = None, **attrs
    ) -> str:
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

    def _act(self, value: Value, what: str) -> Act:
        if isinstance(value, Act):
            return value
        if (
            isinstance(value, Piece)
            and value.features
            and not (value.rotary or value.normed)
            and (value.span is not None or value.act.shape.channels % value.count == 0)
        ):
            return self._slice(value)
        if isinstance(value, Repeated):
            raise Unsupported(
                f"{what} on repeated heads (only attention may read repeat_kv's output)"
            )
        if isinstance(value, (Piece, Stacked)):
            raise Unsupported(
                f"{what} on one piece of a split tensor: a piece is a slice of the features "
                "only when the split divides (batch, C, H, W)'s channels or the last dim of "
                "(batch, S, E); rotated or normalised q and k only attention may read"
            )
        if isinstance(value, Scores):
            raise Unsupported(
                f"{what} on attention scores (only scale, mask, softmax, dropout and @ v may follow q @ k^T)"
            )
        if isinstance(value, Dispatched):
            raise Unsupported(
                f"{what} on tokens dispatched to experts (only expert products, element-wise "
                "functions and the weighted sum of the copies may follow the dispatch)"
            )
        if isinstance(value, (Derived, RowStat, Half, Strided, Gated)):
            raise Unsupported(
                f"{what} on an unfinished element-wise expression (a power, a per-position "
                "statistic or half of the head dim) that matches no known pattern (GELU, RMS norm, RoPE)"
            )
        raise Unsupported(f"{what} on a constant or learned tensor instead of an activation")

    def _slice(self, piece: Piece) -> Act:
        """The :class:`Slice` layer of ``piece`` (one per part of an activation)."""
        start, stop = piece.channels
        key = (piece.act.src, start, stop)
        if key not in self._slices:
            shape = piece.act.shape
            layer = self._emit(
                Slice,
                f"{piece.act.src}.slice{piece.index}",
                (piece.act.src,),
                expected=(stop - start) * shape.spatial,
                start=start,
                stop=stop,
            )
            self._slices[key] = Act(layer, Shape(stop - start, shape.height, shape.width))
        return self._slices[key]

    # ------------------------------------------------------------------ graph input

    def input(self, ps: Sequence[int], integer: bool) -> Act:
        """The graph input: per-sample shape ``ps``; ``integer`` for token ids."""
        shape = ir_shape(ps, integer=integer)
        self.input_shape = shape
        self.token_input = integer and len(ps) == 1
        return Act(INPUT, shape)

    # ------------------------------------------------------------------ weighted layers

    def linear(
        self,
        name: str,
        x: Value,
        ps_in: Sequence[int],
        out_features: int,
        bias: bool,
        key: Hashable | None = None,
        bias_key: Hashable | None = None,
    ) -> Act:
        """A matrix product over the last dimension of ``x`` (per-sample shape ``ps_in``);
        ``bias_key``: the learned bias's identity (counted here, also where a computation on
        learned tensors only reads it again: DeBERTa's position keys)."""
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
        layer = self._emit(
            Linear,
            name,
            (act.src,),
            expected=out_features * rows,
            out_features=int(out_features),
            bias=bool(bias),
            per_position=per_position,
        )
        self._own(layer, key)
        if bias_key is not None:
            self._owners.setdefault(bias_key, layer)
        out = (
            Shape(int(out_features), act.shape.height, act.shape.width)
            if per_position
            else Shape(int(out_features))
        )
        return Act(layer, out, linear=None if bias else layer)

    def _as_vector(self, name: str, act: Act, di: int) -> Act:
        if act.shape.elements != di:
            raise Unsupported(
                f"linear with {di} inputs on a tensor of {act.shape.elements} elements per sample"
            )
        if act.shape.spatial == 1:
            return act
        if act.src not in self._flattened:
            flat = self._emit(Flatten, f"{name}.flatten", (act.src,), expected=di)
            self._flattened[act.src] = Act(flat, Shape(di))
        return self._flattened[act.src]

    def conv2d(
        self,
        name: str,
        x: Value,
        ps_in: Sequence[int],
        ps_out: Sequence[int],
        out_channels: int,
        kernel: tuple[int, int],
        stride: tuple[int, int],
        padding: tuple[int, int],
        groups: int,
        bias: bool,
        dilation: tuple[int, int] = (1, 1),
        key: Hashable | None = None,
        causal: bool = False,
    ) -> Act:
        """A 2-D convolution on a (C, H, W) activation (``causal``: padded before the first row
        only, :class:`~parplan.costmodel.graph.Conv2d`'s ``causal``)."""
        act = self._act(x, "a convolution")
        if tuple(dilation) != (1, 1):
            raise Unsupported(f"dilation {tuple(dilation)}; the IR has undilated convolutions only")
        self._check_chw(act, ps_in, "a convolution")
        layer = self._emit(
            Conv2d,
            name,
            (act.src,),
            expected=math.prod(ps_out),
            out_channels=int(out_channels),
            kernel=_pair(kernel),
            stride=_pair(stride),
            padding=_pair(padding),
            groups=int(groups),
            bias=bool(bias),
            **({"causal": True} if causal else {}),
        )
        self._own(layer, key)
        return Act(layer, ir_shape(ps_out))

    def conv1d(
        self,
        name: str,
        x: Value,
        ps_in: Sequence[int],
        ps_out: Sequence[int],
        out_channels: int,
        kernel: int,
        stride: int,
        padding: int,
        groups: int,
        bias: bool,
        dilation: int = 1,
        key: Hashable | None = None,
        causal: bool = False,
    ) -> Act:
        """A 1-D convolution on a (C, L) activation: the IR's 2-D convolution over (C, L, 1)
        with a (k, 1) kernel. A sequence of L positions with C features is (C, L, 1) in the IR
        too, so a convolution's output read as (positions, features) after a transpose
        (Whisper's encoder) or a sequence transposed into one (Mamba's mixer) needs no
        reshaping. The graph input, when a 1-D convolution reads it before any other layer
        does, is taken as (C, L)."""
        act = self._act(x, "a 1-D convolution")
        c, length = (int(d) for d in ps_in)
        want = Shape(c, length, 1)
        first = not any(INPUT in inputs for _, inputs, _ in self._layers.values())
        if act.shape != want and act.src == INPUT and first:
            self.input_shape = want  # the input is the convolution's (channels, length)
            act = Act(INPUT, want)
        c_out, l_out = (int(d) for d in ps_out)
        return self.conv2d(
            name,
            act,
            (c, length, 1),
            (c_out, l_out, 1),
            out_channels,
            (int(kernel), 1),
            (int(stride), 1),
            (int(padding), 0),
            groups,
            bias,
            (int(dilation), 1),
            key,
            causal,
        )

    def _check_chw(self, act: Act, ps_in: Sequence[int], what: str) -> None:
        ps_in = tuple(ps_in)
        if len(ps_in) != 3 or Shape(*ps_in) != act.shape:
            raise Unsupported(
                f"{what} reads a {_shape_text(ps_in)} tensor that the IR holds as "
                f"{act.shape.channels}x{act.shape.height}x{act.shape.width} (reshaped into an image)"
            )

    def embedding(
        self, name: str, x: Value, num: int, dim: int, key: Hashable | None = None
    ) -> Act:
        """A table lookup of ``num`` x ``dim``: on the token input, or on positions (a constant)."""
        if isinstance(x, Act):
            if x.shape.channels != 1:
                raise Unsupported(
                    f"embedding of a tensor with {x.shape.channels} features (token ids have 1)"
                )
            ids = x
        elif x is CONST:
            # position / token-type ids computed from the input's size: look them up on the input
            if not self.token_input or self.input_shape is None:
                raise Unsupported(
                    "embedding of computed ids in a model whose input is not token ids"
                )
            ids = Act(INPUT, self.input_shape)
        else:
            ids = self._act(x, "an embedding")
        layer = self._emit(
            Embedding,
            name,
            (ids.src,),
            expected=ids.shape.spatial * int(dim),
            num=int(num),
            dim=int(dim),
        )
        self._own(layer, key)
        return Act(layer, Shape(int(dim), ids.shape.height, ids.shape.width))

    # ------------------------------------------------------------------ shape-keeping layers

    def norm(
        self,
        name: str,
        x: Value,
        kind: str,
        channels: int,
        affine: bool = True,
        key: Hashable | None = None,
    ) -> Act:
        """Batch norm over channels, or layer / RMS norm over the last (feature) dim of size ``channels``."""
        act = self._act(x, f"{kind} norm")
        if act.shape.channels != channels:
            raise Unsupported(
                f"{kind} norm over {channels} features of a tensor the IR holds with {act.shape.channels} features"
            )
        layer = self._emit(
            Norm, name, (act.src,), expected=act.shape.elements, kind=kind, affine=bool(affine)
        )
        self._own(layer, key)
        return Act(layer, act.shape)

    def activation(self, name: str, x: Value, function: str) -> Value:
        """An element-wise function; on attention scores (softmax, dropout) it passes through."""
        if isinstance(x, (Scores, RowStat, Half)) or x is CONST:
            return x  # softmax of scores, rsqrt of a statistic, a negated half
        if isinstance(x, Derived):
            x = Act(x.base.src, x.base.shape, base=x.base.base)
        if isinstance(x, Piece) and x.count == 2 and x.index == 0:
            return Gated(x.act, function)  # act(gate) of a fused gate / up projection
        act = self._act(x, function)
        layer = self._emit(
            Activation, name, (act.src,), expected=act.shape.elements, function=function
        )
        return Act(layer, act.shape, base=act.base or act.src)

    def derive(self, x: Value) -> Value:
        """An element-wise function without a name of its own (``x ** 2``, ``-x``): kept pending
        until a pattern (GELU's tanh form, RMS norm, RoPE) completes it."""
        if isinstance(x, Act):
            return Derived(x)
        return x

    def pool(
        self,
        name: str,
        x: Value,
        ps_in: Sequence[int],
        ps_out: Sequence[int],
        mode: str,
        kernel=None,
        stride=None,
        padding=(0, 0),
        ceil_mode: bool = False,
        adaptive: bool = False,
    ) -> Act:
        """Max / average pooling of a (C, H, W) activation (``adaptive``: to ``ps_out``'s size)."""
        act = self._act(x, f"{mode} pooling")
        self._check_chw(act, ps_in, f"{mode} pooling")
        if adaptive:
            attrs = {"output_size": (int(ps_out[-2]), int(ps_out[-1]))}
        else:
            kernel = _pair(kernel)
            attrs = {
                "kernel": kernel,
                "stride": _pair(stride if stride is not None else kernel),
                "padding": _pair(padding),
                "ceil_mode": bool(ceil_mode),
            }
        layer = self._emit(Pool2d, name, (act.src,), expected=math.prod(ps_out), mode=mode, **attrs)
        return Act(layer, Shape(act.shape.channels, int(ps_out[-2]), int(ps_out[-1])))

    def reduce_positions(self, name: str, x: Value, what: str) -> Act:
        """Average over (or pick one of) all positions: an adaptive average pool to 1 x 1."""
        act = self._act(x, what)
        layer = self._emit(
            Pool2d, name, (act.src,), expected=act.shape.channels, mode="avg", output_size=(1, 1)
        )
        return Act(layer, Shape(act.shape.channels))

    # ------------------------------------------------------------------ joins and reshapes

    def add(self, name: str, a: Value, b: Value) -> Value:
        """``a + b``: a residual join, a folded bias, or a pass-through add of a constant."""
        a, b = _valued(a), _valued(b)
        if a is CONST or b is CONST or not (is_data(a) or is_data(b)):
            data = b if a is CONST else a
            return data if is_data(data) or data is CONST or isinstance(data, Param) else CONST
        if isinstance(a, Relative) and isinstance(b, Relative):
            if a.span != b.span:
                raise Unsupported("relative position scores over different spans added")
            return Relative(a.sides + b.sides, a.span, combined_param([a.param, b.param], ()))
        if isinstance(a, Scores) or isinstance(b, Scores):
            scores, other = (a, b) if isinstance(a, Scores) else (b, a)
            if isinstance(
                other, Param
            ):  # a learned attention bias (T5, Swin): its table counts once
                return replace(scores, bias=scores.bias or other)
            if isinstance(other, Relative) and scores.relative is None:
                return replace(scores, relative=other)  # DeBERTa's disentangled attention
            raise Unsupported("add of an activation to attention scores")
        if isinstance(a, Param) or isinstance(b, Param):
            act, param = (a, b) if isinstance(b, Param) else (b, a)
            act = self._act(act, "a bias add")
            size = math.prod(param.shape)
            if act.linear is not None and size == act.shape.channels:
                self._layers[act.linear][2]["bias"] = True
                self._owners.setdefault(param.key, act.linear)  # read again, it counts once
                return Act(act.src, act.shape)
            if (
                self.token_input
                and size == act.shape.elements
                and act.shape.spatial == self.input_shape.spatial
            ):
                # a learned per-position table (or an exporter's folded position lookup)
                table = self.embedding(
                    name + ".positions", CONST, act.shape.spatial, act.shape.channels, key=param.key
                )
                return self.add(name, act, table)
            if size in (act.shape.channels, act.shape.elements) and param.key not in self._owners:
                # a learned bias per channel, or a table per element (ViT's position embedding)
                layer = self._emit(
                    Bias,
                    name,
                    (act.src,),
                    expected=act.shape.elements,
                    full=size != act.shape.channels,
                )
                self._owners[param.key] = layer
                return Act(layer, act.shape)
            raise Unsupported(
                f"add of the learned tensor '{param.name}' {_shape_text(param.shape)} to an activation "
                "(only a bias per channel, a table per position, or a bias right after a matrix product)"
            )
        pending = self._complete(a, b)
        if pending is not None:
            if isinstance(pending, tuple):  # ("rope", x): x * cos + rotate_half(x) * sin
                x = pending[1]
                if isinstance(x, Piece):  # q or k of a fused projection: the attention rotates it
                    return Piece(x.act, x.index, x.count, rotary=True, span=x.span)
                layer = self._emit(
                    Activation, name, (x.src,), expected=x.shape.elements, function="rope"
                )
                return Act(layer, x.shape, base=x.src)
            return pending
        xa, xb = self._act(a, "an add"), self._act(b, "an add")
        if xa.shape != xb.shape:
            raise Unsupported(
                f"broadcasting add of {xa.shape.channels}x{xa.shape.height}x{xa.shape.width} and "
                f"{xb.shape.channels}x{xb.shape.height}x{xb.shape.width}"
            )
        layer = self._emit(Add, name, (xa.src, xb.src), expected=xa.shape.elements)
        return Act(layer, xa.shape)

    def _complete(self, a: Value, b: Value):
        """``x + f(x)`` of a pending expression: Derived (GELU's inner sum), or "rope" for
        ``x * cos + rotate_half(x) * sin``; None if ``a + b`` is not such a sum."""
        for x, other in ((a, b), (b, a)):
            if (
                isinstance(x, Act)
                and isinstance(other, Derived)
                and getattr(other.base, "src", None) == x.src
            ):
                return other
            if isinstance(x, Piece) and isinstance(other, Half) and other.whole:
                if x.same_piece(other.base):
                    return ("rope", x)
            if (
                isinstance(x, Half)
                and isinstance(x.base, Piece)
                and not x.whole
                and isinstance(other, Half)
                and other.whole
                and x.base.same_piece(other.base)
            ):
                return ("rope", x.base)  # partial rotary on a piece (GPT-NeoX)
            if (
                isinstance(x, Act)
                and isinstance(other, Half)
                and other.whole
                and getattr(other.base, "src", None) == x.src
            ):
                return ("rope", x)
            if (
                isinstance(x, Half)
                and not x.whole
                and isinstance(other, Half)
                and other.whole
                and getattr(other.base, "src", 0) == getattr(x.base, "src", 1)
            ):
                return (
                    "rope",
                    x.base,
                )  # partial rotary (GPT-NeoX): priced as RoPE on the whole head dim
        return None

    def scale(self, x: Value, factor: Value, name: str = "mul") -> Value:
        """``x * c`` or ``x / c`` with a constant passes through; see :meth:`mul` for the rest."""
        return self.mul(name, x, factor)

    def mul(self, name: str, a: Value, b: Value) -> Value:
        """``a * b``: by a constant (passes through), by a learned per-channel vector (a
        :class:`Scale`, or an RMS norm's weight), by a per-position statistic of itself (an RMS
        norm), ``x * f(x)`` (a gated activation spelled out), else a :class:`Mul` of two
        activations (equal shapes or a per-channel gate)."""
        a, b = _valued(a), _valued(b)
        if (isinstance(a, (Param, _Const)) or not is_data(a)) and is_data(b):
            a, b = b, a
        if not is_data(a):
            return a if isinstance(a, Param) and b is CONST else CONST
        if b is CONST or b is BAD or not isinstance(b, (Act, Param, RowStat, Derived)):
            if b is CONST or not is_data(b):
                return a  # scaling by a constant (or a mask) keeps the value and its role
        if isinstance(a, Scores) and isinstance(b, Param):
            if a.scale is not None:
                raise Unsupported("attention scores scaled by two learned tensors")
            return replace(a, scale=b)  # cosine attention's logit scale (see attention())
        if isinstance(b, Param):
            return self._learned_scale(name, a, b)
        if isinstance(a, RowStat) and isinstance(b, Piece):
            a, b = b, a
        if isinstance(a, Piece) and isinstance(b, RowStat) and isinstance(b.base, Piece):
            if not a.same_piece(b.base) or a.normed:
                raise Unsupported("a piece of a projection divided by another piece's norm")
            return replace(a, normed=True)  # F.normalize per head (cosine attention)
        if isinstance(b, Gated):
            a, b = b, a
        if isinstance(a, Gated):
            if not (isinstance(b, Piece) and b.act == a.act and b.count == 2 and b.index == 1):
                raise Unsupported(
                    "a gate of one projection's first half times something but its second half"
                )
            layer = self._emit(
                Glu, name, (a.act.src,), expected=a.act.shape.elements // 2, function=a.function
            )
            return Act(
                layer, Shape(a.act.shape.channels // 2, a.act.shape.height, a.act.shape.width)
            )
        if isinstance(a, RowStat) and isinstance(b, (Act, Piece)):
            a, b = b, a
        if isinstance(a, Piece) and a.span is not None and isinstance(b, RowStat):
            a = self._act(a, "a norm")  # a slice normalised by its own statistic (above)
        if isinstance(a, Act) and isinstance(b, RowStat):
            if b.base.src != a.src:
                raise Unsupported(
                    "product of an activation with another tensor's per-position statistic"
                )
            per_head = {"head_dim": b.group} if b.group else {}  # folded into attention later
            layer = self._emit(
                Norm,
                name,
                (a.src,),
                expected=a.shape.elements,
                kind="rms",
                affine=False,
                **per_head,
            )
            return Act(layer, a.shape)
        if isinstance(a, Derived) or isinstance(b, Derived):
            d, other = (a, b) if isinstance(a, Derived) else (b, a)
            if other is CONST:
                return d
            raise Unsupported("product of an unfinished element-wise expression with a tensor")
        x, y = self._act(a, "a product"), self._act(b, "a product")
        gate, other = (y, x) if y.base is not None and y.base in (x.src, x.base) else (x, y)
        if (
            gate.base is not None
            and gate.base in (other.src, other.base)
            and gate.src in self._layers
        ):
            # x * f(x): a gated activation spelled out (GELU's erf / tanh form, SiLU as x * sigmoid(x))
            attrs = self._layers[gate.src][2]
            attrs["function"] = _GATED.get(attrs["function"], attrs["function"])
            return Act(gate.src, gate.shape, base=gate.base)
        big, small = (x, y) if x.shape.elements >= y.shape.elements else (y, x)
        b = big.shape
        if small.shape not in (b, Shape(b.channels), Shape(1, b.height, b.width)):
            raise Unsupported(
                f"element-wise product of {b.channels}x{b.height}x{b.width} and "
                f"{small.shape.channels}x{small.shape.height}x{small.shape.width} (equal shapes, a "
                "per-channel gate or a per-position gate)"
            )
        layer = self._emit(Mul, name, (x.src, y.src), expected=big.shape.elements)
        return Act(layer, big.shape)

    def _learned_scale(self, name: str, x: Value, param: Param) -> Value:
        act = self._act(x, "a product with a learned tensor")
        entry = self._layers.get(act.src)
        if (
            entry is not None
            and entry[0] is Norm
            and entry[2].get("head_dim") == math.prod(param.shape)
            and not entry[2]["affine"]
        ):
            entry[2]["affine"] = True  # the per-head RMS norm's scale, shared by the heads
            self._own(act.src, param.key)
            return act
        if math.prod(param.shape) != act.shape.channels:
            raise Unsupported(
                f"product with the learned tensor '{param.name}' {_shape_text(param.shape)} "
                f"(only one value per channel, {act.shape.channels})"
            )
        entry = self._layers.get(act.src)
        if (
            entry is not None
            and entry[0] is Norm
            and entry[2]["kind"] == "rms"
            and not entry[2]["affine"]
        ):
            entry[2]["affine"] = True  # the RMS norm's weight
            self._own(act.src, param.key)
            return act
        if param.key in self._owners:
            raise Unsupported(f"the learned vector '{param.name}' used twice")
        layer = self._emit(Scale, name, (act.src,), expected=act.shape.elements)
        self._own(layer, param.key)
        return Act(layer, act.shape)

    def row_statistic(self, x: Value, features: int | None = None) -> Value:
        """A mean over the features of ``x ** 2`` (or of ``x``): a per-position statistic;
        ``features``: how many it averages (fewer than the activation's: one per head)."""
        base = x.base if isinstance(x, Derived) else x
        if isinstance(base, Piece) and base.span is not None and not (base.rotary or base.normed):
            base = self._act(base, "a norm")  # of a slice (FalconMamba's norms of dt, B and C)
        if isinstance(base, Act):
            group = features if features and features < base.shape.channels else 0
            if group and base.shape.channels % group:
                raise Unsupported(
                    f"a mean over {features} of {base.shape.channels} features (not whole heads)"
                )
            return RowStat(base, group)
        if isinstance(x, RowStat):
            return x
        raise Unsupported("a mean over the features of a value that is not an activation")

    def half(self, x: Value) -> Value:
        """Part of ``x`` along the head dim (RoPE's slices)."""
        if isinstance(x, (Act, Piece)):
            return Half(x)
        if isinstance(x, Half):
            return x
        raise Unsupported("a slice of the head dim of a value that is not an activation")

    def stride2(self, x: Value) -> Value:
        """Every other position of ``x`` along one spatial dim."""
        if isinstance(x, Strided):
            return Strided(x.base, x.count + 1)
        return Strided(self._act(x, "a strided slice"))

    def expert_linear(
        self, name: str, x: Value, out_features: int, experts: int, key: Hashable | None = None
    ) -> Value:
        """A mixture-of-experts bank (``experts`` matrices) on dispatched tokens."""
        if not isinstance(x, Dispatched) or not isinstance(x.value, Act):
            raise Unsupported("an expert product on tokens that were not dispatched by a router")
        act = x.value
        if experts < x.k:
            raise Unsupported(f"tokens routed to {x.k} of {experts} experts")
        layer = self._emit(
            Linear,
            name,
            (act.src,),
            expected=out_features * act.shape.spatial,
            out_features=int(out_features),
            bias=False,
            per_position=True,
            experts=int(experts),
            top_k=int(x.k),
        )
        self._own(layer, key)
        return Dispatched(
            Act(layer, Shape(int(out_features), act.shape.height, act.shape.width)), x.k
        )

    def repeat(self, x: Value, factor: int) -> Value:
        """Each head of ``x`` repeated ``factor`` times (grouped-query attention's repeat_kv)."""
        if isinstance(x, Repeated):
            return Repeated(x.act, x.factor * factor)
        if isinstance(x, Piece) and x.span is not None:
            return Repeated(x, factor)  # k or v sliced out of a fused projection
        return Repeated(self._act(x, "repeating heads"), factor)

    def feature_slice(self, x: Value, start: int, end: int) -> Value:
        """Features ``[start, end)`` of the output of a projection (q, k or v sliced out of a fused
        one by index); the attention reading all three checks that they tile it."""
        act = self._act(x, "a slice of the features")
        entry = self._layers.get(act.src)
        if entry is None or entry[0] is not Linear:
            raise Unsupported(
                f"slicing features [{start}:{end}] of a value that is not a projection's output "
                "(only q, k, v of a fused projection may be sliced)"
            )
        return Piece(act, 0, 0, span=(int(start), int(end)))

    def stack(self, x: Value, count: int) -> Value:
        """``x`` viewed as ``count`` stacked pieces along a new dim (unflatten of a fused QKV)."""
        return Stacked(self._act(x, "unflattening the features"), count)

    def pick(self, x: Value, index: int) -> Value:
        """Piece ``index`` of a stacked value."""
        if isinstance(x, Stacked):
            return Piece(x.act, index, x.count)
        raise Unsupported("selecting along a dim of a value that is not a stack of pieces")

    def tokens(self, name: str, param: Param, x: Value, count: int) -> Act:
        """Learned tokens (a class token) prepended to the positions of ``x``."""
        act = self._act(x, "prepending tokens")
        if math.prod(param.shape) != count * act.shape.channels:
            raise Unsupported(
                f"prepending the learned tensor '{param.name}' {_shape_text(param.shape)} "
                f"to a sequence of {act.shape.channels} features"
            )
        layer = self._emit(
            Tokens,
            name,
            (act.src,),
            expected=(act.shape.spatial + count) * act.shape.channels,
            count=int(count),
        )
        self._own(layer, param.key)
        return Act(layer, Shape(act.shape.channels, act.shape.spatial + count, 1))

    def concat(self, name: str, xs: Sequence[Value], feature_axis: bool) -> Act:
        """Concatenation along the feature dimension (``feature_axis``)."""
        if all(isinstance(x, Half) for x in xs) and len({x.base for x in xs}) == 1:
            return Half(xs[0].base, whole=True)  # rotate_half(x): the halves swapped
        pieces = [x for x in xs if isinstance(x, Piece) and x.rotary]
        if len(pieces) == 1 and all(
            x is pieces[0] or isinstance(x, Half) and pieces[0].same_piece(x.base) for x in xs
        ):
            return pieces[0]  # a piece's rotated part of the head dim back with the rest
        rotated = [x for x in xs if isinstance(x, Act) and x.base is not None]
        if len(rotated) == 1 and all(
            x is rotated[0]
            or isinstance(x, Half)
            and getattr(x.base, "src", None) == rotated[0].base
            for x in xs
        ):
            return rotated[
                0
            ]  # the rotated part of the head dim back with the part that passes through
        if (
            feature_axis
            and len(xs) == 4
            and all(isinstance(x, Strided) and x.count == 2 for x in xs)
            and len({x.base for x in xs}) == 1
        ):
            base = xs[0].base  # the four quarters of every 2 x 2 patch side by side: patch merging
            layer = self._emit(PatchMerge, name, (base.src,), expected=base.shape.elements, block=2)
            return Act(
                layer, Shape(4 * base.shape.channels, base.shape.height // 2, base.shape.width // 2)
            )
        if not feature_axis:
            raise Unsupported("concatenation along a dim other than the feature dim")
        acts = [self._act(x, "a concatenation") for x in xs]
        if len(acts) == 1:
            return acts[0]
        first = acts[0].shape
        layer = self._emit(
            Concat, name, tuple(a.src for a in acts), expected=sum(a.shape.elements for a in acts)
        )
        return Act(layer, Shape(sum(a.shape.channels for a in acts), first.height, first.width))

    def reshape(self, name: str, x: Value, ps_in: Sequence[int], ps_out: Sequence[int]) -> Value:
        """view / reshape / permute / transpose / flatten: pass-through, or a Flatten to a vector."""
        if isinstance(x, (Param, _Const)) or not is_data(x):
            return x
        if not isinstance(x, Act) or tuple(ps_in) == tuple(ps_out):
            return x  # pieces, stacks, repeated heads and pending expressions keep their role
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

    def split(self, x: Value, count: int, features: bool = False) -> list[Value]:
        """Split into ``count`` equal pieces (e.g. q, k, v of a fused projection, or the halves
        of ShuffleNet V2's channels); ``features``: the frontend found the split to be along the
        features (IR channels), so a piece read by anything but attention is a :class:`Slice`."""
        if not is_data(x):
            return [x] * count
        act = self._act(x, "a split")
        return [Piece(act, i, count, features=features) for i in range(count)]

    def split_sizes(self, x: Value, sizes: Sequence[int]) -> list[Value]:
        """The features of ``x`` split into consecutive pieces of ``sizes`` (Mamba's projection
        into its time step, B and C): each a :class:`Slice` where read."""
        act = self._act(x, "a split")
        if sum(sizes) != act.shape.channels:
            raise Unsupported(
                f"a split into {list(sizes)} features of a value with {act.shape.channels}"
            )
        bounds = [0]
        for n in sizes:
            bounds.append(bounds[-1] + int(n))
        return [
            Piece(act, i, len(sizes), span=(bounds[i], bounds[i + 1])) for i in range(len(sizes))
        ]

    def scan(
        self,
        name: str,
        x: Value,
        dt: Value,
        b: Value,
        c: Value,
        z: Value | None,
        a: Value,
        d: Value | None,
        dt_bias: Value | None,
    ) -> Act:
        """Mamba's selective scan (:class:`Scan`): ``x``, ``dt`` (I, L), ``b``, ``c`` (N, L),
        the gate ``z`` (I, L) or None; ``a`` the learned (I, N) matrix (``-exp(A_log)``),
        ``d`` the learned skip and ``dt_bias`` the time step's learned bias (or None)."""
        if not isinstance(a, Param) or len(a.shape) != 2:
            raise Unsupported("a selective scan whose A is not a learned (channels, state) matrix")
        for what, p in (("D", d), ("the time step's bias", dt_bias)):
            if p is not None and not (isinstance(p, Param) and len(p.shape) == 1):
                raise Unsupported(f"a selective scan whose {what} is not a learned vector")
        ins = [x, dt, b, c] + ([z] if z is not None else [])
        acts = [self._act(v, "a selective scan") for v in ins]
        layer = self._emit(
            Scan,
            name,
            tuple(v.src for v in acts),
            expected=acts[0].shape.elements,
            state=int(a.shape[1]),
            skip=d is not None,
            dt_bias=dt_bias is not None,
        )
        for p in (a, d, dt_bias):
            if p is not None:
                for key, _ in p.sources:
                    self._own(layer, key)
        return Act(layer, acts[0].shape)

    # ------------------------------------------------------------------ products and attention

    def matmul(
        self, name: str, a: Value, b: Value, ps_a: Sequence[int], bias: bool = False
    ) -> Value:
        """``a @ b``: a Linear (``b`` learned, shape (Di, Do)), ``q @ k^T`` or ``scores @ v``."""
        if isinstance(b, Param) and len(b.shape) == 3 and isinstance(a, (Act, Piece)):
            # q (or k) per head against learned position keys (or queries) of the relative
            # positions, (batch x heads, d, 2 k): DeBERTa's content-to-position scores
            return Relative((a,), int(b.shape[-1]), b)
        if isinstance(b, Param):
            if len(b.shape) != 2:
                raise Unsupported(
                    f"product with the learned tensor '{b.name}' of rank {len(b.shape)} (need a matrix)"
                )
            return self.linear(name, a, ps_a, b.shape[1], bias=bias, key=b.key)
        if isinstance(a, Param):
            raise Unsupported(f"product with the learned tensor '{a.name}' on the left")
        if not (is_data(a) and is_data(b)):
            return CONST if not (is_data(a) or is_data(b)) else self._matmul_const(a, b)
        if isinstance(a, Scores):
            return self.attention(
                name,
                a.q,
                a.k,
                b,
                a.heads,
                bias=a.bias,
                window=a.window,
                scale=a.scale,
                relative=a.relative,
            )
        if isinstance(b, Scores):
            raise Unsupported("attention scores on the right of a product")
        ps_a = tuple(ps_a)
        heads = ps_a[-3] if len(ps_a) >= 3 else 1
        # (windows, heads, window positions, d): attention within windows of ps_a[-2] positions
        window = ps_a[-2] if len(ps_a) >= 4 and ps_a[0] > 1 else 0
        return Scores(a, b, heads, window=window)

    @staticmethod
    def _matmul_const(a: Value, b: Value) -> Value:
        raise Unsupported("product of an activation with a constant tensor")

    def attention(
        self,
        name: str,
        q: Value,
        k: Value,
        v: Value,
        heads: int,
        bias: "Param | None" = None,
        window: int = 0,
        scale: "Param | None" = None,
        relative: Relative | None = None,
    ) -> Act:
        """Scaled dot-product attention on q, k, v: pieces of one fused projection, or three
        activations; k and v may have fewer heads (grouped-query attention, repeated or not).
        Cosine attention (Swin V2): q and k pieces L2-normalised per head, the scores times a
        learned ``scale`` per head. ``relative``: relative position scores of q and k added
        to the scores (DeBERTa)."""
        parts = (q, k, v)
        if isinstance(k, Repeated) and isinstance(v, Repeated) and k.factor == v.factor:
            parts = (q, k.act, v.act)
        elif isinstance(k, Repeated) or isinstance(v, Repeated):
            raise Unsupported("attention with only one of k, v repeated")
        if all(isinstance(p, Piece) and p.span is not None for p in parts):
            fused = parts[0].act
            (a0, a1), (b0, b1), (c0, c1) = (p.span for p in parts)
            if (
                len({p.act for p in parts}) != 1
                or (a0, a1, b1, c1) != (0, b0, c0, fused.shape.channels)
                or b1 - b0 != c1 - c0
                or heads * (b1 - b0) % a1
            ):
                raise Unsupported(
                    "attention on q, k, v slices that are not one projection's features in order "
                    "(q, then k and v of equal sizes)"
                )
            kv_heads = heads * (b1 - b0) // a1
            rotary = parts[0].rotary or parts[1].rotary
        elif all(isinstance(p, Piece) for p in parts):
            same = len({p.act for p in parts}) == 1 and parts[0].count == 3
            if not same or [p.index for p in parts] != [0, 1, 2]:
                raise Unsupported(
                    "attention on q, k, v that are not the three pieces, in order, of one projection"
                )
            fused, kv_heads = parts[0].act, heads
            rotary = parts[0].rotary or parts[1].rotary
        elif all(isinstance(p, Act) for p in parts):
            qa, ka, va = parts
            if ka.shape != va.shape or (qa.shape.height, qa.shape.width) != (
                ka.shape.height,
                ka.shape.width,
            ):
                raise Unsupported("attention on q, k, v of different lengths (cross-attention)")
            if (
                heads * ka.shape.channels % qa.shape.channels
                or qa.shape.channels % ka.shape.channels
            ):
                raise Unsupported(
                    f"attention with {heads} query heads on q of {qa.shape.channels} and k of "
                    f"{ka.shape.channels} features"
                )
            kv_heads = heads * ka.shape.channels // qa.shape.channels
            fused = self.concat(f"{name}.qkv", parts, feature_axis=True)
        else:
            raise Unsupported("attention on a mix of pieces and separate tensors")
        total = heads + 2 * kv_heads
        if fused.shape.channels % total:
            raise Unsupported(
                f"attention with {heads} heads ({kv_heads} key/value heads) on "
                f"{fused.shape.channels} fused features"
            )
        hidden = fused.shape.channels // total * heads
        attrs = {"heads": int(heads)}
        if isinstance(parts[0], Piece) and rotary:
            attrs["rotary"] = True
        normed = [isinstance(p, Piece) and p.normed for p in parts]
        if any(normed) or scale is not None:
            if normed != [True, True, False] or scale is None:
                raise Unsupported(
                    "attention with L2-normalised q or k or learned score scales, but not "
                    "cosine attention (q and k normalised, the scores times a learned scale)"
                )
            if sum(n for _, n in scale.sources) != heads:
                raise Unsupported(
                    f"cosine attention whose learned logit scale has "
                    f"{sum(n for _, n in scale.sources)} values for {heads} heads"
                )
            attrs["cosine"] = True
        if kv_heads != heads:
            attrs["kv_heads"] = int(kv_heads)
        if window and window < fused.shape.spatial:
            attrs["window"] = int(window)
        if relative is not None:
            if any(side not in (q, k) for side in relative.sides):
                raise Unsupported("relative position scores of a tensor that is neither q nor k")
            attrs["relative"] = int(relative.span)
            attrs["relative_terms"] = len(relative.sides)
            bias = combined_param([bias, relative.param], ()) if bias else relative.param
        # a learned bias (or the learned tensors it is computed from) shared by layers counts once
        fresh = [(key, n) for key, n in bias.sources if key not in self._owners] if bias else []
        if fresh:
            attrs["bias_params"] = sum(n for _, n in fresh)
        scales = list(scale.sources) if scale is not None else []
        if any(key in self._owners for key, _ in scales):
            raise Unsupported("a logit scale shared by several attention layers")
        layer = self._emit(
            Attention, name, (fused.src,), expected=hidden * fused.shape.spatial, **attrs
        )
        for key, _ in fresh + scales:
            self._owners[key] = layer
        return Act(layer, Shape(hidden, fused.shape.height, fused.shape.width))

    # ------------------------------------------------------------------ result

    def _fuse_gates(self) -> None:
        """``f(x @ W_gate) * (x @ W_up)`` (SwiGLU, GeGLU) with both projections read only there
        becomes one fused projection and a :class:`Glu`, as Megatron-LM fuses them: the same
        parameters and FLOPs, one partition choice for the pair."""
        users = _consumers(self._layers)
        tied = {name for pair in self._tied for name in pair}
        for name, (cls, inputs, attrs) in list(self._layers.items()):
            if cls is not Mul or len(inputs) != 2:
                continue
            found = None
            for gate_act, up in (inputs, inputs[::-1]):
                entry = self._layers.get(gate_act)
                if entry is None or entry[0] is not Activation or users.get(gate_act) != [name]:
                    continue
                gate = entry[1][0]
                pair = [self._layers.get(gate), self._layers.get(up)]
                if (
                    all(
                        e is not None
                        and e[0] is Linear
                        and e[2].get("per_position")
                        and e[2].get("experts", 1) == 1
                        for e in pair
                    )
                    and users.get(gate) == [gate_act]
                    and users.get(up) == [name]
                    and pair[0][1] == pair[1][1]
                    and pair[0][2]["out_features"] == pair[1][2]["out_features"]
                    and pair[0][2]["bias"] == pair[1][2]["bias"]
                    and not {gate, up} & tied
                ):
                    found = (gate_act, gate, up, entry[2]["function"])
                    break
            if found is None:
                continue
            gate_act, gate, up, function = found
            g = self._layers[gate]
            width = g[2]["out_features"]
            fused = self._unique(f"{name.rsplit('.', 1)[0]}.gate_up")
            expected = self._expected.get(gate, 0) * 2
            order = list(self._layers)
            at = order.index(gate)
            self._layers[fused] = [
                Linear,
                g[1],
                {
                    "out_features": 2 * width,
                    "bias": g[2]["bias"],
                    "per_position": True,
                    "fuses": (gate, up),
                },
            ]
            self._expected[fused] = expected
            self._layers[name] = [Glu, (fused,), {"function": function}]
            for gone in (gate_act, gate, up):
                self._layers.pop(gone)
                self._expected.pop(gone, None)
            order = [k for k in order if k in self._layers]
            order.insert(min(at, len(order)), fused)
            self._layers = {k: self._layers[k] for k in order}

    def _fuse_projections(self) -> None:
        """Separate q, k, v projections of one input, read only by an attention core (through
        RoPE on q and k), become one fused projection as in the zoo's transformers: the same
        parameters and FLOPs, one partition choice for the three (as Megatron-LM splits them),
        and a planning graph whose fan-out the exact DP handles (docs/importers.md)."""
        users = _consumers(self._layers)
        tied = {name for pair in self._tied for name in pair}
        for name, (cls, inputs, attrs) in list(self._layers.items()):
            if cls is not Attention or self._layers.get(inputs[0], [None])[0] is not Concat:
                continue
            concat = inputs[0]
            parts = self._layers[concat][1]
            if len(parts) != 3 or users.get(concat) != [name]:
                continue
            chain = []
            for part in parts:
                # back from the concat: RoPE, then a per-head RMS norm (Qwen3), then the projection
                node, reader, gone = part, concat, []
                for wrapper in ("rope", "head_norm"):
                    cls_p, ins_p, attrs_p = self._layers[node]
                    found = (
                        cls_p is Activation and attrs_p.get("function") == "rope"
                        if wrapper == "rope"
                        else cls_p is Norm and bool(attrs_p.get("head_dim"))
                    )
                    if found and users.get(node) == [reader]:
                        gone.append((wrapper, node))
                        reader, node = node, ins_p[0]
                proj = node
                if (
                    self._layers.get(proj, [None])[0] is not Linear
                    or users.get(proj) != [reader]
                    or not self._layers[proj][2].get("per_position")
                    or proj in tied
                    or self._layers[proj][2].get("experts", 1) != 1
                ):
                    break
                chain.append((proj, dict(gone)))
            else:
                projs = [p for p, _ in chain]
                sources = {self._layers[p][1] for p in projs}
                biases = {self._layers[p][2]["bias"] for p in projs}
                rotary = ["rope" in g for _, g in chain]
                normed = ["head_norm" in g for _, g in chain]
                if (
                    len(sources) != 1
                    or len(biases) != 1
                    or rotary not in ([False] * 3, [True, True, False])
                    or normed not in ([False] * 3, [True, True, False])
                    or normed[0]
                    and not all(
                        g["head_norm"] and self._layers[g["head_norm"]][2]["affine"]
                        for _, g in chain[:2]
                    )
                ):
                    continue
                out = sum(self._layers[p][2]["out_features"] for p in projs)
                fused = self._unique(f"{name.rsplit('.', 1)[0]}.qkv")
                first = projs[0]
                self._layers[fused] = [
                    Linear,
                    self._layers[first][1],
                    {
                        "out_features": out,
                        "bias": biases.pop(),
                        "per_position": True,
                        "fuses": tuple(projs),
                    },
                ]
                self._expected[fused] = (
                    self._expected.get(first, 0)
                    // max(1, self._layers[first][2]["out_features"])
                    * out
                )
                for p, wrappers in chain:
                    for gone in (p, *wrappers.values()):
                        self._layers.pop(gone, None)
                        self._expected.pop(gone, None)
                self._layers.pop(concat)
                self._expected.pop(concat, None)
                attrs = dict(attrs, rotary=True) if rotary[0] else attrs
                attrs = dict(attrs, qk_norm=True) if normed[0] else attrs
                self._layers[name] = [Attention, (fused,), attrs]
                # keep the topological position: the fused projection goes where q was
                order = list(self._layers)
                order.remove(fused)
                order.insert(order.index(name), fused)
                self._layers = {k: self._layers[k] for k in order}

    def build(self, name: str | None = None) -> Graph:
        """The finished graph; raises :class:`GraphError` listing every unsupported operator."""
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
                f"map to the layer graph: "
                + "; ".join(parts)
                + ". Supported "
                + (self.supported or "operators: see docs/importers.md")
                + "; register_op / register_module add your own"
            )
        if self.input_shape is None:
            raise GraphError(f"model '{name}': has no input")
        if not self._layers:
            raise GraphError(f"model '{name}': has no layers the planner can use")
        self._fuse_projections()
        self._fuse_gates()
        for layer, (cls, _, attrs) in self._layers.items():
            if cls is Norm and attrs.get("head_dim"):
                raise GraphError(
                    f"model '{name}': layer '{layer}' is an RMS norm per head (over "
                    f"{attrs['head_dim']} features at a time) that is not on q and k right before "
                    "attention with a learned scale each; the IR's norms are over all features"
                )
        layers = tuple(cls(n, inputs, **attrs) for n, (cls, inputs, attrs) in self._layers.items())
        tied = tuple(self._tied)
        graph = (
            TiedGraph(name, self.input_shape, layers, tied=tied)
            if tied
            else Graph(name, self.input_shape, layers)
        )
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


def _valued(v: Value) -> Value:
    """Numbers (scalars of the traced program) are constants."""
    return CONST if v is None or isinstance(v, (int, float, bool, complex)) else v


def _consumers(layers: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, (_, inputs, _) in layers.items():
        for src in inputs:
            out.setdefault(src, []).append(name)
    return out


#: x * f(x) written out: the activation it spells.
_GATED = {"erf": "gelu", "tanh": "gelu", "sigmoid": "silu"}


def _pair(value) -> tuple[int, int]:
    """(h, w) of an int, a pair, or a one-element list (as ATen passes a square kernel)."""
    if isinstance(value, int):
        return (value, value)
    value = list(value)
    if len(value) == 1:
        return int(value[0]), int(value[0])
    a, b = value
    return int(a), int(b)


def supported_text(groups) -> str:
    """What a frontend maps, for its error message, from its dispatch tables: ``groups`` maps a
    title to operator names (ATen's ``aten.`` prefix and the in-place ``_`` variants folded).

    Example:
        >>> supported_text({"layers": ["aten.linear", "aten.add_", "aten.add"], "views": ["Reshape"]})
        'layers: add, linear; views: Reshape'
    """
    parts = []
    for title, names in groups.items():
        shown = sorted({_short_op(str(n)) for n in names}, key=str.lower)
        if shown:
            parts.append(f"{title}: {', '.join(shown)}")
    return "; ".join(parts)


def _short_op(name: str) -> str:
    name = name.removeprefix("aten.")
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def input_shape_of(input_shape, name: str) -> tuple[int, ...]:
    """``input_shape`` as a tuple of positive ints (a per-sample shape), or a ConfigError."""
    from parplan.errors import ConfigError

    try:
        shape = tuple(int(d) for d in input_shape)
    except (TypeError, ValueError):
        raise ConfigError(
            f"model '{name}': input_shape must be a tuple of ints without the batch dim "
            f"(got {input_shape!r})"
        ) from None
    if not shape or min(shape) <= 0:
        raise ConfigError(
            f"model '{name}': input_shape must be positive sizes without the batch dim (got {shape})"
        )
    return shape
