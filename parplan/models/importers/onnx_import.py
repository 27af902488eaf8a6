"""Import an ONNX model into the layer-graph IR (optional: ``pip install -e ".[onnx]"``).

:func:`from_onnx` reads an ``.onnx`` file (or an ``onnx.ModelProto``), fixes the batch
dimension of its one data input to 1, runs ONNX shape inference and maps every node with the
rules of :mod:`parplan.models.importers`. Weights are initializers (or ``Constant`` outputs are
treated as constants); the data input is the one graph input that is not an initializer.

Supported: ``Conv`` (2-D, symmetric padding), ``Gemm``, ``MatMul`` with an initializer (a
Linear; a following ``Add`` of a 1-D initializer is its bias) or between activations
(``q @ k^T`` and ``scores @ v`` of attention), ``Relu``, ``Gelu``, ``Sigmoid``, ``Tanh``,
``LeakyRelu``, ``Elu``, ``Softmax``, ``Dropout``, ``BatchNormalization``,
``LayerNormalization``, ``MaxPool``, ``AveragePool``, ``GlobalAveragePool``,
``GlobalMaxPool``, ``Add``, ``Sub``, ``Mul`` (by a constant, a learned per-channel vector, or
a product of two tensors: a gate), ``Div`` by a constant, ``Clip`` (ReLU6), RMS norm
(``RMSNormalization``, or ``Pow`` / ``ReduceMean`` / ``Sqrt`` / ``Div`` as torch.onnx.export
spells it), ``Where`` (masks), ``Concat``,
``Flatten``, ``Reshape``, ``Transpose``, ``Squeeze``, ``Unsqueeze``, ``Identity``, ``Cast``,
``Split`` (q, k, v), ``Gather`` (an embedding lookup, or picking one position),
``ReduceMean`` over positions, and shape arithmetic on constants (``Shape``, ``Range``, ...).
Anything else raises :class:`~parplan.errors.GraphError` listing every unsupported operator.

Example (skipped when onnx is not installed):
    >>> import onnx, onnx.helper as oh  # doctest: +SKIP
    >>> x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 16])
    >>> w = oh.make_tensor("w", onnx.TensorProto.FLOAT, [16, 4], [0.0] * 64)
    >>> g = oh.make_graph([oh.make_node("MatMul", ["x", "w"], ["y"], name="fc")], "g", [x],
    ...                   [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 4])], [w])
    >>> from_onnx(oh.make_model(g)).parameter_count()  # doctest: +SKIP
    64
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from typing import Any, Callable

from parplan.costmodel.graph import Graph
from parplan.errors import ConfigError, GraphError
from parplan.models.importers.builder import (
    BAD,
    CONST,
    GraphBuilder,
    Param,
    RowStat,
    Unsupported,
    Value,
    is_data,
    stand_in,
    supported_text,
)

__all__ = ["from_onnx"]

try:  # onnx is an optional extra
    import onnx
    from onnx import TensorProto, helper, numpy_helper, shape_inference
except ModuleNotFoundError:  # pragma: no cover - exercised only without onnx
    onnx = None

INSTALL_HINT = 'onnx is not installed; install the optional extra with pip install -e ".[onnx]"'

_ACTIVATIONS = {
    "Relu": "relu",
    "Gelu": "gelu",
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
    "LeakyRelu": "leaky_relu",
    "Elu": "elu",
    "Softmax": "softmax",
    "LogSoftmax": "softmax",
    "Dropout": "dropout",
    "HardSwish": "hardswish",
    "HardSigmoid": "hardsigmoid",
    "Erf": "erf",
}
_VIEWS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Cast", "Flatten"})
#: Operators whose output depends only on the shape of their data input, not its values.
_SHAPE_OPS = frozenset({"Shape", "Size", "ConstantOfShape", "EyeLike"})


def from_onnx(path_or_model, name: str | None = None, *, input_shape=None) -> Graph:
    """The layer graph of an ONNX model (a path or an ``onnx.ModelProto``).

    ``input_shape`` (per sample, without the batch dim) replaces the data input's shape when
    it has symbolic dimensions other than the batch. ``name`` defaults to the graph's name
    (or the file's stem). Raises :class:`~parplan.errors.GraphError` listing every
    unsupported operator, :class:`~parplan.errors.ConfigError` for an unreadable file.
    """
    if onnx is None:
        raise ConfigError(INSTALL_HINT)
    model, default_name = _load(path_or_model)
    name = name or default_name
    model = _fix_input(model, name, input_shape)
    try:
        model = shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:  # onnx raises InferenceError / ValidationError subclasses
        raise GraphError(
            f"model '{name}': ONNX shape inference failed ({type(exc).__name__}: {exc})"
        ) from None
    return _Converter(model, name).run()


def _load(path_or_model) -> tuple[Any, str]:
    if isinstance(path_or_model, onnx.ModelProto):
        return path_or_model, path_or_model.graph.name or "onnx_model"
    path = Path(path_or_model)
    if not path.is_file():
        raise ConfigError(f"ONNX model '{path}': no such file")
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # protobuf DecodeError and friends
        raise ConfigError(
            f"ONNX model '{path}': cannot read it ({type(exc).__name__}: {exc})"
        ) from None
    return model, path.stem


def _data_inputs(graph) -> list:
    inits = {t.name for t in graph.initializer}
    return [v for v in graph.input if v.name not in inits]


def _fix_input(model, name: str, input_shape):
    """A copy of ``model`` whose one data input has batch 1 and concrete per-sample sizes."""
    inputs = _data_inputs(model.graph)
    if len(inputs) != 1:
        names = ", ".join(v.name for v in inputs) or "none"
        raise GraphError(
            f"model '{name}': needs exactly one data input (not an initializer); has {names}"
        )
    value = inputs[0]
    dims = value.type.tensor_type.shape.dim
    if len(dims) < 1:
        raise GraphError(
            f"model '{name}': input '{value.name}' has no shape; give its rank with a batch dim"
        )
    if input_shape is not None:
        per_sample = [int(d) for d in input_shape]
    else:
        per_sample = []
        for i, d in enumerate(dims[1:], start=1):
            if not d.HasField("dim_value") or d.dim_value <= 0:
                raise GraphError(
                    f"model '{name}': input '{value.name}' dim {i} is symbolic ('{d.dim_param}'); pass "
                    "input_shape (per sample, without the batch dim)"
                )
            per_sample.append(int(d.dim_value))
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    target = next(v for v in fixed.graph.input if v.name == value.name)
    elem = target.type.tensor_type.elem_type
    target.CopyFrom(helper.make_tensor_value_info(value.name, elem, [1, *per_sample]))
    # stale intermediate shapes (e.g. a symbolic batch) would clash with the fixed input
    del fixed.graph.value_info[:]
    return fixed


class _Converter:
    """Walks the (topologically sorted) ONNX nodes once, mapping them to builder calls."""

    def __init__(self, model, name: str) -> None:
        self.graph = model.graph
        self.name = name
        self.b = GraphBuilder(name, "onnx")
        self.values: dict[str, Value] = {}
        self.shapes: dict[str, tuple[int, ...] | None] = {}
        for v in (*self.graph.input, *self.graph.value_info, *self.graph.output):
            dims = v.type.tensor_type.shape.dim
            known = all(d.HasField("dim_value") for d in dims) and v.type.tensor_type.HasField(
                "shape"
            )
            self.shapes[v.name] = tuple(int(d.dim_value) for d in dims) if known else None
        self.handlers = self._handlers()
        self.b.supported = supported_text({"operators": self.handlers})  # what it dispatches
        self.inits = {t.name: t for t in self.graph.initializer}
        self.tables: list[str] = []  # initializers read as embedding tables
        self.tainted: set[str] = set()  # outputs computed from an unsupported node's stand-in
        self.consts: dict[str, Any] = {}  # values of Constant nodes (scalars, axes)

    def run(self) -> Graph:
        for init in self.graph.initializer:
            self.values[init.name] = Param(init.name, init.name, tuple(int(d) for d in init.dims))
        (data,) = _data_inputs(self.graph)
        elem = data.type.tensor_type.elem_type
        integer = elem in (
            TensorProto.INT64,
            TensorProto.INT32,
            TensorProto.INT16,
            TensorProto.INT8,
            TensorProto.UINT8,
        )
        self.values[data.name] = self.b.input(self.shapes[data.name][1:], integer)
        for i, node in enumerate(self.graph.node):
            self._node(i, node)
        return self.b.build(self.name)

    # ------------------------------------------------------------------ driver

    def _node(self, i: int, node) -> None:
        label = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        where = node.name or f"{node.op_type}_{i}"
        layer_name = where.lstrip("/")
        missing = [n for n in node.input if n and n not in self.values]
        if missing:
            raise GraphError(
                f"model '{self.name}': node '{where}' reads {', '.join(repr(n) for n in missing)}, which no "
                "earlier node, initializer or input produces; the graph is not topologically sorted or is incomplete"
            )
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value" and attr.t is not None:
                    self.consts[node.output[0]] = numpy_helper.to_array(attr.t)
        ins = [self.values[n] if n else None for n in node.input]
        if any(v is BAD for v in ins):
            self._set(node, [BAD] * len(node.output))
            return
        lookup = node.op_type == "Gather" and isinstance(
            ins[0], Param
        )  # positions: a table read by constants
        if not lookup and not any(is_data(v) for v in ins if v is not None):
            self._set(node, [self._no_data(node, ins)] * len(node.output))
            return
        handler = self.handlers.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        # a node reading what an unsupported one produced is not a root cause: not reported
        tainted = any(n in self.tainted for n in node.input)
        if handler is None:
            self.b.unsupported(label, where, repeat=tainted)  # downstream: a repeat at most
            self.tainted.update(node.output)
            self._set(node, self._stand_ins(node, label))
            return
        try:
            out = handler(layer_name, node, ins)
        except Unsupported as exc:
            self.b.unsupported(label, where, str(exc), repeat=tainted)
            self.tainted.update(node.output)
            out = self._stand_ins(node, label)
        if tainted:
            self.tainted.update(node.output)
        self._set(node, out if isinstance(out, list) else [out] + [CONST] * (len(node.output) - 1))

    def _set(self, node, outs: list) -> None:
        for name, value in zip(node.output, outs):
            if name:
                self.values[name] = value

    def _stand_ins(self, node, label: str) -> list:
        out = []
        for name in node.output:
            shape = self.shapes.get(name)
            out.append(stand_in(f"<{label}>", shape[1:]) if shape else BAD)
        return out

    def _no_data(self, node, ins: list) -> Value:
        """A node that does not touch the input's data: a learned tensor if it derives from one."""
        params = [v for v in ins if isinstance(v, Param)]
        shape = self.shapes.get(node.output[0]) if node.output else None
        if params and shape is not None and node.op_type not in _SHAPE_OPS:
            return Param(params[0].key, params[0].name, shape)
        return CONST

    # ------------------------------------------------------------------ helpers

    def _ps(self, name: str) -> tuple[int, ...]:
        shape = self.shapes.get(name)
        if shape is None:
            raise Unsupported(f"the shape of '{name}' is unknown after shape inference")
        return shape[1:]

    def _rank(self, name: str) -> int:
        return len(self._ps(name)) + 1

    @staticmethod
    def _attrs(node) -> dict[str, Any]:
        return {a.name: helper.get_attribute_value(a) for a in node.attribute}

    @staticmethod
    def _symmetric(pads, what: str) -> tuple[int, int]:
        pads = list(pads or [0, 0, 0, 0])
        if len(pads) != 4 or pads[:2] != pads[2:]:
            raise Unsupported(f"asymmetric {what} padding {pads}")
        return int(pads[0]), int(pads[1])

    def _auto_pad(self, attrs, kernel, what: str) -> tuple[int, int]:
        mode = attrs.get("auto_pad", b"NOTSET")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode in ("NOTSET", ""):
            return self._symmetric(attrs.get("pads"), what)
        if mode == "VALID":
            return (0, 0)
        if all(k % 2 for k in kernel) and list(attrs.get("strides", [1, 1])) == [1, 1]:
            return (kernel[0] // 2, kernel[1] // 2)
        raise Unsupported(f"auto_pad {mode} with an even kernel or a stride (asymmetric padding)")

    # ------------------------------------------------------------------ handlers

    def _handlers(self) -> dict[str, Callable]:
        b = self.b
        table: dict[str, Callable] = {
            op: (lambda n, node, ins, f=fn: b.activation(n, ins[0], f))
            for op, fn in _ACTIVATIONS.items()
        }
        table.update(
            {
                "Conv": self._conv,
                "Gemm": self._gemm,
                "MatMul": lambda n, node, ins: b.matmul(
                    n, ins[0], self._retie(ins[1]), self._ps(node.input[0])
                ),
                "BatchNormalization": self._batchnorm,
                "LayerNormalization": self._layernorm,
                "MaxPool": lambda n, node, ins: self._pool(n, node, ins, "max"),
                "AveragePool": lambda n, node, ins: self._pool(n, node, ins, "avg"),
                "GlobalAveragePool": lambda n, node, ins: b.pool(
                    n,
                    ins[0],
                    self._ps(node.input[0]),
                    self._ps(node.output[0]),
                    "avg",
                    adaptive=True,
                ),
                "GlobalMaxPool": lambda n, node, ins: b.pool(
                    n,
                    ins[0],
                    self._ps(node.input[0]),
                    self._ps(node.output[0]),
                    "max",
                    adaptive=True,
                ),
                "Add": lambda n, node, ins: b.add(n, ins[0], ins[1]),
                "Sub": lambda n, node, ins: b.add(n, ins[0], ins[1]),
                "Mul": lambda n, node, ins: b.mul(n, ins[0], ins[1]),
                "Div": self._div,
                "Pow": lambda n, node, ins: b.derive(ins[0]),
                "Neg": lambda n, node, ins: b.derive(ins[0]),
                "Sqrt": lambda n, node, ins: b.activation(n, ins[0], "sqrt"),
                "Reciprocal": lambda n, node, ins: b.activation(n, ins[0], "reciprocal"),
                "Clip": self._clip,
                "SimplifiedLayerNormalization": self._rmsnorm,
                "RMSNormalization": self._rmsnorm,
                "Where": self._where,
                "Concat": self._concat,
                "Split": self._split,
                "Gather": self._gather,
                "ReduceMean": self._reduce_mean,
            }
        )
        for op in _VIEWS:
            table[op] = lambda n, node, ins: b.reshape(
                n, ins[0], self._ps(node.input[0]), self._ps(node.output[0])
            )
        for op in _SHAPE_OPS:
            table[op] = lambda n, node, ins: CONST
        return table

    def _retie(self, weight: Value) -> Value:
        """A product weight that is the transpose of an embedding table (a tied LM head whose
        transpose the exporter folded into a copy) takes the table's identity."""
        if not isinstance(weight, Param) or len(weight.shape) != 2 or weight.key in self.tables:
            return weight
        init = self.inits.get(weight.key)
        if init is None or list(init.dims) != list(weight.shape):
            return weight
        for table in self.tables:
            if list(self.inits[table].dims) == list(weight.shape)[::-1]:
                if np.array_equal(
                    numpy_helper.to_array(init).T, numpy_helper.to_array(self.inits[table])
                ):
                    return Param(table, weight.name, weight.shape)
        return weight

    def _conv(self, name: str, node, ins: list) -> Value:
        weight = ins[1]
        if not isinstance(weight, Param) or len(weight.shape) != 4:
            raise Unsupported(
                "a Conv whose weight is not a 4-D initializer (only 2-D convolutions)"
            )
        attrs = self._attrs(node)
        kernel = tuple(attrs.get("kernel_shape", weight.shape[2:]))
        padding = self._auto_pad(attrs, kernel, "Conv")
        return self.b.conv2d(
            name,
            ins[0],
            self._ps(node.input[0]),
            self._ps(node.output[0]),
            weight.shape[0],
            kernel,
            tuple(attrs.get("strides", (1, 1))),
            padding,
            int(attrs.get("group", 1)),
            len(ins) > 2 and ins[2] is not None,
            tuple(attrs.get("dilations", (1, 1))),
            key=weight.key,
        )

    def _gemm(self, name: str, node, ins: list) -> Value:
        attrs = self._attrs(node)
        weight = ins[1]
        if attrs.get("transA", 0):
            raise Unsupported("Gemm with transA=1")
        if not isinstance(weight, Param) or len(weight.shape) != 2:
            raise Unsupported("Gemm whose B is not a 2-D initializer")
        out = weight.shape[0] if attrs.get("transB", 0) else weight.shape[1]
        bias = len(ins) > 2 and ins[2] is not None
        return self.b.linear(name, ins[0], self._ps(node.input[0]), out, bias, key=weight.key)

    def _batchnorm(self, name: str, node, ins: list) -> Value:
        scale = ins[1]
        if not isinstance(scale, Param):
            raise Unsupported("BatchNormalization whose scale is not an initializer")
        # no key: exporters merge equal initializers (fresh norms all start at ones), not a tie
        return self.b.norm(name, ins[0], "batch", scale.shape[0], True)

    def _layernorm(self, name: str, node, ins: list) -> Value:
        attrs = self._attrs(node)
        rank = self._rank(node.input[0])
        if int(attrs.get("axis", -1)) % rank != rank - 1:
            raise Unsupported("LayerNormalization over more than the last axis")
        scale = ins[1]
        if not isinstance(scale, Param) or len(ins) < 3 or ins[2] is None:
            raise Unsupported(
                "LayerNormalization without initializer scale and bias (the IR counts both)"
            )
        return self.b.norm(name, ins[0], "layer", scale.shape[0], True)

    def _pool(self, name: str, node, ins: list, mode: str) -> Value:
        attrs = self._attrs(node)
        kernel = tuple(attrs["kernel_shape"])
        if len(kernel) != 2:
            raise Unsupported(f"{len(kernel)}-D pooling")
        if any(d != 1 for d in attrs.get("dilations", (1, 1))):
            raise Unsupported("dilated pooling")
        padding = self._auto_pad(attrs, kernel, "pooling")
        return self.b.pool(
            name,
            ins[0],
            self._ps(node.input[0]),
            self._ps(node.output[0]),
            mode,
            kernel,
            tuple(attrs.get("strides", (1, 1))),
            padding,
            bool(attrs.get("ceil_mode", 0)),
        )

    def _where(self, name: str, node, ins: list) -> Value:
        data = [v for v in ins[1:] if is_data(v)]
        if len(data) != 1:
            raise Unsupported("Where choosing between two activations")
        return data[0]

    def _concat(self, name: str, node, ins: list) -> Value:
        rank = self._rank(node.input[0])
        axis = int(self._attrs(node)["axis"]) % rank
        return self.b.concat(name, ins, axis == {2: 1, 3: 2, 4: 1}.get(rank))

    def _split(self, name: str, node, ins: list) -> list:
        shapes = {self.shapes.get(o) for o in node.output}
        if len(shapes) != 1 or None in shapes:
            raise Unsupported("a Split into unequal (or unknown) pieces")
        return self.b.split(ins[0], len(node.output))

    def _gather(self, name: str, node, ins: list) -> Value:
        data, indices = ins[0], ins[1]
        axis = int(self._attrs(node).get("axis", 0))
        if isinstance(data, Param):
            if axis != 0 or len(data.shape) != 2:
                raise Unsupported(
                    "Gather from an initializer that is not an embedding table (axis 0 of a matrix)"
                )
            if data.key in self.inits:
                self.tables.append(data.key)
            return self.b.embedding(name, indices, data.shape[0], data.shape[1], key=data.key)
        ps_in, ps_out = self._ps(node.input[0]), self._ps(node.output[0])
        if (
            indices is CONST
            and len(ps_in) == 2
            and axis % (len(ps_in) + 1) == 1
            and len(ps_out) == 1
        ):
            return self.b.reduce_positions(name, data, "picking one position")
        raise Unsupported("Gather from an activation other than picking one position")

    def _div(self, name: str, node, ins: list) -> Value:
        """``x / c`` (a constant: passes), ``x / sqrt(mean(x^2) + eps)`` (an RMS norm)."""
        x, d = ins[0], ins[1]
        if isinstance(d, RowStat):
            return self.b.mul(name, x, d)
        if is_data(d):
            raise Unsupported("division by a tensor")
        return self.b.mul(name, x, CONST)

    def _clip(self, name: str, node, ins: list) -> Value:
        bounds = [self._constant(i) for i in node.input[1:3]] if len(node.input) > 1 else []
        attrs = self._attrs(node)
        low = bounds[0] if bounds else attrs.get("min")
        high = bounds[1] if len(bounds) > 1 else attrs.get("max")
        return self.b.activation(name, ins[0], "relu6" if (low, high) == (0.0, 6.0) else "clip")

    def _array(self, name: str):
        """The value of an initializer or a Constant node's output (None if neither)."""
        if not name:
            return None
        init = self.inits.get(name)
        if init is not None:
            return numpy_helper.to_array(init)
        return self.consts.get(name)

    def _constant(self, name: str):
        """The scalar value of an initializer or Constant output (None if not a known scalar)."""
        value = self._array(name)
        return (
            float(np.asarray(value).reshape(()))
            if value is not None and np.asarray(value).size == 1
            else None
        )

    def _axes(self, node):
        """A reduction's axes: the attribute (opset < 18) or the constant second input."""
        axes = self._attrs(node).get("axes")
        if axes is None and len(node.input) > 1:
            value = self._array(node.input[1])
            axes = None if value is None else [int(a) for a in np.asarray(value).reshape(-1)]
        return None if axes is None else list(axes)

    def _rmsnorm(self, name: str, node, ins: list) -> Value:
        scale = ins[1] if len(ins) > 1 else None
        channels = self._ps(node.input[0])[-1]
        return self.b.norm(
            name,
            ins[0],
            "rms",
            channels,
            isinstance(scale, Param),
            key=scale.key if isinstance(scale, Param) else None,
        )

    def _reduce_mean(self, name: str, node, ins: list) -> Value:
        x = ins[0]
        axes = self._axes(node)
        rank = len(self.shapes.get(node.input[0]) or ())
        keep = self._attrs(node).get("keepdims", 1)
        if rank and axes is not None and [a % rank for a in axes] == [rank - 1] and keep:
            return self.b.row_statistic(x)  # over the features, per position (an RMS norm's)
        out = math.prod(self._ps(node.output[0]))
        if getattr(x, "shape", None) is None or out != x.shape.channels:
            raise Unsupported("ReduceMean over the feature dim (only over all positions)")
        return self.b.reduce_positions(name, x, "a mean")
