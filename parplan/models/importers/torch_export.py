"""Import a model captured by torch.export into the layer-graph IR (docs/importers.md).

:func:`from_exported` walks an ``ExportedProgram`` (the ATen-level graph torch.export
produces, with fake-tensor shapes on every node) and maps each operator with the rules of
:class:`parplan.models.importers.GraphBuilder`. :func:`capture` runs torch.export on a module with
example inputs of a given per-sample shape; it works on the ``meta`` device (a 70B-parameter
configuration is described without allocating its weights). :func:`parplan.models.importers.from_torch`
uses both, with torch.fx as the fallback.

Batch: the example inputs have batch :data:`BATCH`; a tensor whose leading dim is ``k x
BATCH`` holds ``k`` rows per sample (a reshape that merged batch and sequence, as GPT-2's
``Conv1D`` does before ``addmm``).

Layer names are module paths (``model.layers.3.self_attn.q_proj``; a function inside a module
is ``<module path>.<op>``), and so are the places an unsupported operator is reported at.
Only root causes are reported: an operator that reads the stand-in output of an unsupported
one counts only as another occurrence of a problem already found (the same blocker in the next
block), never as a new one.

Extension: :func:`register_op` maps a custom operator (``"mylib::fused_mlp"``) and
:func:`register_module` a module class to a function that describes it with builder calls.
"""

from __future__ import annotations

import math
import operator
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from parplan.costmodel.graph import Graph
from parplan.errors import ConfigError, GraphError
from parplan.models.importers.kernels import SCAN_OP, as_operators
from parplan.models.importers.builder import (
    BAD,
    CONST,
    Act,
    Dispatched,
    GraphBuilder,
    Half,
    combined_param,
    supported_text,
    Param,
    Piece,
    Relative,
    RowStat,
    Scores,
    Stacked,
    Unsupported,
    Value,
    _pair,
    is_data,
    stand_in,
)

__all__ = ["BATCH", "Call", "capture", "from_exported", "register_module", "register_op"]

try:  # torch is an optional extra
    import torch
except ModuleNotFoundError:  # pragma: no cover - exercised only without torch
    torch = None

#: Batch size of the example inputs given to torch.export: a prime that no model size is a
#: multiple of in practice, so that the batch dim can be found in any tensor (a transpose may
#: move it, a reshape may merge it with heads or positions); tensors are fake, so it costs nothing.
BATCH = 97


def _user_shape(shape) -> str:
    """A tensor's shape as the user knows it: the example batch (:data:`BATCH`, or ``k`` times it
    where batch and sequence were merged) written as ``batch``."""
    dims = [int(d) for d in shape]
    if dims and dims[0] % BATCH == 0:
        k = dims[0] // BATCH
        head = "batch" if k == 1 else f"{k} x batch"
        return "(" + ", ".join([head, *map(str, dims[1:])]) + ")"
    return str(tuple(dims))


#: Operators that only reinterpret a tensor (pass-through in the IR, a learned tensor stays one).
VIEWS = frozenset(
    {
        "aten.view",
        "aten.reshape",
        "aten._unsafe_view",
        "aten.permute",
        "aten.transpose",
        "aten.t",
        "aten.contiguous",
        "aten.clone",
        "aten.alias",
        "aten.detach",
        "aten.unsqueeze",
        "aten.squeeze",
        "aten.flatten",
        "aten.unflatten",
        "aten.expand",
        "aten.broadcast_to",
        "aten.to",
        "aten._to_copy",
        "aten.type_as",
        "aten.lift_fresh_copy",
        "aten.view_as",
        "aten.reshape_as",
        "aten.expand_as",
        "aten.movedim",
        "aten.swapaxes",
        "aten.mT",
        "aten.numpy_T",
        "aten.roll",
    }
)
#: Element-wise functions with a name (an Activation layer; on scores, statistics or halves
#: they pass through).
ACTIVATIONS = {
    "aten.relu": "relu",
    "aten.relu_": "relu",
    "aten.gelu": "gelu",
    "aten.gelu_": "gelu",
    "aten.silu": "silu",
    "aten.silu_": "silu",
    "aten.sigmoid": "sigmoid",
    "aten.sigmoid_": "sigmoid",
    "aten.tanh": "tanh",
    "aten.tanh_": "tanh",
    "aten.hardtanh": "relu6",
    "aten.hardtanh_": "relu6",
    "aten.relu6": "relu6",
    "aten.hardswish": "hardswish",
    "aten.hardswish_": "hardswish",
    "aten.hardsigmoid": "hardsigmoid",
    "aten.hardsigmoid_": "hardsigmoid",
    "aten.leaky_relu": "leaky_relu",
    "aten.leaky_relu_": "leaky_relu",
    "aten.elu": "elu",
    "aten.elu_": "elu",
    "aten.mish": "mish",
    "aten.softplus": "softplus",
    "aten.softmax": "softmax",
    "aten._softmax": "softmax",
    "aten.log_softmax": "softmax",
    "aten._log_softmax": "softmax",
    "aten.dropout": "dropout",
    "aten.dropout_": "dropout",
    "aten.native_dropout": "dropout",
    "aten.feature_dropout": "dropout",
    "aten.erf": "erf",
    "aten.clamp": "clip",
    "aten.clamp_": "clip",
    "aten.clamp_min": "relu",
    "aten.clamp_min_": "relu",
    "aten.rsqrt": "rsqrt",
    "aten.sqrt": "sqrt",
    "aten.reciprocal": "reciprocal",
    "aten.exp": "exp",
    "aten.log": "log",
    "aten.abs": "abs",
    "aten.sin": "sin",
    "aten.cos": "cos",
}
#: Element-wise maps without a name of their own (completed by a pattern: GELU, RMS norm, RoPE).
DERIVED = frozenset({"aten.pow", "aten.neg", "aten.square"})
#: Operators with no effect on the planned graph.
IGNORED = frozenset(
    {
        "aten._assert_tensor_metadata",
        "aten._assert_scalar",
        "aten.sym_constrain_range_for_size",
        "aten._assert_async",
        "aten.sym_size",
        "aten.sym_numel",
    }
)

#: Operators whose result is a constant for planning even on data: comparisons, masks and
#: integer arithmetic on token ids, attention weights averaged for inspection.
CONSTANT_RESULT = frozenset(
    {
        "aten.eq",
        "aten.ne",
        "aten.lt",
        "aten.le",
        "aten.gt",
        "aten.ge",
        "aten.logical_and",
        "aten.logical_or",
        "aten.logical_not",
        "aten.__and__",
        "aten.__or__",
        "aten.bitwise_and",
        "aten.bitwise_or",
        "aten.bitwise_not",
        "aten.argmax",
        "aten.argmin",
        "aten.cumsum",
        "aten.isnan",
        "aten.isinf",
    }
)


def _first(value) -> int:
    """An int, or the one element of a list (as ATen passes a 1-D convolution's stride)."""
    return value if isinstance(value, int) else list(value)[0]


#: Why operators without a handler have none, for the error message (issue 36: "reported
#: without a reason").
NO_HANDLER_REASONS = {
    "aten.conv3d": "a 3-D convolution: the IR's convolutions are 2-D",
    "aten.conv_transpose2d": "a transposed convolution: not in the IR",
    "aten.group_norm": "group normalisation: the IR has batch, layer and RMS norms",
    "aten.sort": "sorting: its result depends on the values, which planning does not know",
    "aten.gather": "a gather by computed indices: its result depends on the values",
}

#: Views that transpose a learned matrix (its shape is reversed, its elements stay).
_TRANSPOSES = frozenset({"aten.t", "aten.numpy_T", "aten.mT", "aten.transpose", "aten.swapaxes"})

#: Operators whose effect is on their input, not their result (an unread result still counts).
_IN_PLACE = frozenset(
    {"aten.add_", "aten.mul_", "aten.div_", "aten.bernoulli_", "aten.copy_", "aten.index_put_"}
)

#: Operators that take dispatched tokens as such (the rest apply to each copy).
DISPATCH_AWARE = frozenset(
    {"aten.index", "aten.sum", "transformers.grouped_mm_fallback", "aten._grouped_mm", "getitem"}
)

#: Operators whose result depends on a tensor's shape only.
SHAPE_ONLY = frozenset(
    {
        "aten.new_zeros",
        "aten.new_ones",
        "aten.new_full",
        "aten.new_empty",
        "aten.zeros_like",
        "aten.ones_like",
        "aten.full_like",
        "aten.empty_like",
        "aten.rand_like",
        "aten.randn_like",
        "aten.sym_size",
        "aten.sym_numel",
        "aten.size",
    }
)

_OPS: dict[str, Callable] = {}
_MODULES: dict[type, Callable] = {}


@dataclass
class Call:
    """What a registered handler gets: the builder, the values of the call's tensor inputs
    (activations are :class:`~parplan.models.importers.Act`, weights :class:`~parplan.models.importers.Param`),
    their per-sample shapes, the output's per-sample shape, a layer name, and the module (for
    :func:`register_module`) or the operator's arguments (for :func:`register_op`)."""

    builder: GraphBuilder
    inputs: list[Value]
    in_shapes: list[tuple[int, ...] | None]
    out_shape: tuple[int, ...] | None
    name: str
    module: Any = None
    args: tuple = ()


def register_op(name: str, handler: Callable[[Call], Value]) -> None:
    """Map the custom operator ``name`` (``"mylib::fused_mlp"`` or ``"mylib.fused_mlp"``) to
    ``handler(call) -> value``; the handler describes it with ``call.builder`` methods.

    Example (a custom op that is a linear layer of its weight argument):
        >>> register_op("mylib::proj", lambda c: c.builder.linear(c.name, c.inputs[0], c.in_shapes[0],
        ...             c.inputs[1].shape[0], bias=False, key=c.inputs[1].key))
        >>> "mylib.proj" in registered()
        True
        >>> unregister("mylib::proj")
    """
    _OPS[name.replace("::", ".")] = handler


def register_module(cls: type, handler: Callable[[Call], Value]) -> None:
    """Map every instance of module class ``cls`` to ``handler(call) -> value``: the module's
    operators are replaced by what the handler builds from ``call.inputs`` (the tensors that
    enter the module) and ``call.module`` (its parameters: ``call.builder`` needs the
    parameter's identity as ``key``; use ``id(param)`` or the name as below)."""
    _MODULES[cls] = handler


def unregister(target) -> None:
    """Remove a handler registered with :func:`register_op` or :func:`register_module`."""
    if isinstance(target, str):
        _OPS.pop(target.replace("::", "."), None)
    else:
        _MODULES.pop(target, None)


def registered() -> list[str]:
    """Names of the registered operators and module classes."""
    return sorted([*_OPS, *(c.__qualname__ for c in _MODULES)])


# --------------------------------------------------------------------------- capture


def capture(
    module, input_shape: Sequence[int], name: str, integer_input: bool, kwargs: dict | None = None
):
    """``torch.export.export`` of ``module`` on an example batch of :data:`BATCH` samples of
    ``input_shape`` (token ids when ``integer_input``), on the device of its parameters
    (``meta`` works). Raises :class:`GraphError` saying where in the model capture failed."""
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    dtype = torch.long if integer_input else torch.float32
    example = torch.zeros((BATCH, *input_shape), dtype=dtype, device=device)
    flags = {m: m.training for m in module.modules()}
    try:
        module.eval()  # dropout and stochastic depth are identities in the planned step's cost
        with as_operators():  # a library's Python-loop kernels as one operator each
            return torch.export.export(module, (example,), dict(kwargs or {}), strict=False)
    except Exception as exc:  # torch.export raises many types; all mean "cannot capture"
        raise GraphError(
            f"model '{name}': torch.export cannot capture it: {_where(exc)}"
            f"{type(exc).__name__}: {_first_line(exc)} (check input_shape: per sample, without the "
            f"batch dim, {tuple(input_shape)} here; and integer_input: {integer_input}"
            + (
                f"; {BATCH} in torch's shapes is the example batch the importer traces with)"
                if str(BATCH) in _first_line(exc)
                else ")"
            )
        ) from None
    finally:
        for m, training in flags.items():
            m.training = training


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""


def _where(exc: BaseException) -> str:
    """'at file:line in function: ' of the innermost frame outside torch and parplan."""
    torch_dir = os.path.dirname(torch.__file__)
    own = os.path.dirname(os.path.abspath(sys.modules["parplan"].__file__))
    frames = traceback.extract_tb(exc.__traceback__)
    cause = exc.__cause__ or exc.__context__
    if cause is not None:
        frames += traceback.extract_tb(cause.__traceback__)
    user = [
        f for f in frames if not f.filename.startswith((torch_dir, own)) and "<" not in f.filename
    ]
    if not user:
        return ""
    f = user[-1]
    return f"at {f.filename}:{f.lineno} in {f.name} (`{(f.line or '').strip()}`): "


# --------------------------------------------------------------------------- conversion


def from_exported(program, name: str, integer_input: bool | None = None, module=None) -> Graph:
    """The layer graph of an ``ExportedProgram`` (its first tensor input is the planned input)
    or of an ATen-level ``GraphModule`` (``program.module()``, or one with fake-tensor ``val``
    metadata from another capture), used as is. ``module``: the captured ``nn.Module``, whose
    submodules registered handlers (:func:`register_module`) receive."""
    if isinstance(program, torch.fx.GraphModule):
        return _Converter(program.graph, {}, lambda: program, name, integer_input, module).run()
    specs = {}
    for spec in program.graph_signature.input_specs:
        if hasattr(spec.arg, "name"):
            specs[spec.arg.name] = (spec.kind.name, spec.target)
    converter = _Converter(program.graph, specs, program.module, name, integer_input, module)
    converter.constants = dict(getattr(program, "constants", {}) or {})  # lifted index tensors
    return converter.run()


def is_aten_graph(gm) -> bool:
    """True if a GraphModule holds ATen operators with shape metadata (captured by torch.export)."""
    return any(
        n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and "val" in n.meta
        for n in gm.graph.nodes
    )


def _packet(target) -> str:
    """``aten.conv2d`` for ``aten.conv2d.default``; ``getitem`` for operator.getitem."""
    if target is operator.getitem:
        return "getitem"
    text = str(target)
    if text.count(".") >= 2:
        return text.rsplit(".", 1)[0]
    return getattr(target, "__name__", text)


class _Converter:
    def __init__(
        self, graph, specs: dict, root: Callable, name: str, integer_input: bool | None, module=None
    ) -> None:
        self.graph = graph
        self.module = module
        self.specs = specs
        self.root = root
        self.name = name
        self.b = GraphBuilder(name, "torch")
        self.values: dict[Any, Value] = {}
        self.integer = integer_input
        self.batch: int | None = None
        self.tainted: set = set()
        self.groups = self._module_groups()
        self.handlers = self._table()
        self.constants: dict = {}  # an ExportedProgram's lifted tensors (index constants)
        self._claimed: dict = {}  # per-head view -> heads a leading slice took
        self._crops: set = set()  # slices that crop a causal convolution (see _causal_crop)
        # the message lists what the tables below dispatch, so it cannot drift from them
        self.b.supported = supported_text(
            {
                "operators": [*self.handlers, *_OPS],
                "element-wise": [*ACTIVATIONS, *DERIVED],
                "views": VIEWS,
                "constants": [*CONSTANT_RESULT, *SHAPE_ONLY],
            }
        )

    # ------------------------------------------------------------------ driver

    def run(self) -> Graph:
        first = True
        skip: set = set()
        for node in self.graph.nodes:
            if node in skip:
                continue
            if node.op == "placeholder":
                self.values[node] = self._placeholder(
                    node, self.specs.get(node.name, ("USER_INPUT", None)), first
                )
                if isinstance(self.values[node], Act):
                    first = False
            elif node.op == "call_function":
                group = self.groups.get(node)
                if group is not None:
                    skip |= self._module(group)
                    continue
                self.values[node] = self._call(node)
            elif node.op == "get_attr":
                self.values[node] = self._get_attr(node)
        if first:
            raise GraphError(f"model '{self.name}': the captured program has no tensor input")
        return self.b.build(self.name)

    def _get_attr(self, node) -> Value:
        obj = self.root()
        try:
            for part in node.target.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            return CONST
        if isinstance(obj, torch.nn.Parameter):
            return Param(node.target, node.target, tuple(obj.shape))
        return CONST

    def _placeholder(self, node, spec, first: bool) -> Value:
        kind, target = spec
        val = node.meta.get("val")
        if kind == "PARAMETER":
            return Param(target, target, tuple(int(d) for d in val.shape))
        if kind != "USER_INPUT" or not first or not hasattr(val, "shape") or val.dim() == 0:
            return CONST
        self.batch = int(val.shape[0])
        integer = self.integer
        if integer is None:
            integer = not val.dtype.is_floating_point
        return self.b.input(tuple(int(d) for d in val.shape[1:]), integer)

    def _call(self, node) -> Value:
        args = self._map(node.args)
        kwargs = self._map(node.kwargs)
        flat = _flatten((args, kwargs))
        if any(v is BAD for v in flat):
            return BAD
        op = _packet(node.target)
        if op in IGNORED:
            return CONST
        if not node.users and op not in _IN_PLACE:
            return CONST  # dead: nothing reads it (BART selects a feature only for its shape)
        custom = _OPS.get(op)
        lookup = op == "aten.embedding" and isinstance(args[0], Param)  # also of computed positions
        if custom is None and not lookup and not any(is_data(v) for v in flat):
            return self._no_data(node, op, flat)
        handler = (lambda n, a, k: custom(self._call_of(n, a))) if custom else self.handlers.get(op)
        if handler is None and (op in SHAPE_ONLY or op in CONSTANT_RESULT):
            handler = lambda n, a, k: CONST  # noqa: E731
        if handler is None and op in ACTIVATIONS:
            handler = self._activation
        if handler is None and op in DERIVED:
            handler = lambda n, a, k: self.b.derive(a[0])  # noqa: E731
        if handler is None and op in VIEWS:
            handler = self._view
        ks = {v.k for v in flat if isinstance(v, Dispatched)}
        if ks and handler is not None and op not in DISPATCH_AWARE:
            # an op on dispatched tokens applies to each copy: unwrap, run, wrap again
            inner, k = handler, ks.pop()

            def handler(n, a, kw, inner=inner, k=k):
                out = inner(n, _undispatch(a), _undispatch(kw))
                return _dispatch(out, k)

        # an operator reading what an unsupported one produced is not a root cause: not reported
        tainted = any(a in self.tainted for a in node.all_input_nodes)
        if tainted:
            self.tainted.add(node)
        if handler is None:
            # a node downstream of an unsupported one is counted only as a repeat of a problem
            # already found (the same blocker in every block), never as a new root cause
            self.b.unsupported(op, self._place(node), NO_HANDLER_REASONS.get(op), repeat=tainted)
            self.tainted.add(node)
            return self._stand_in(node, op)
        try:
            return handler(node, args, kwargs)
        except Unsupported as exc:
            self.b.unsupported(op, self._place(node), str(exc), repeat=tainted)
            self.tainted.add(node)
            return self._stand_in(node, op)

    def _map(self, value):
        if isinstance(value, (list, tuple)):
            return type(value)(self._map(v) for v in value)
        if isinstance(value, dict):
            return {k: self._map(v) for k, v in value.items()}
        if isinstance(value, torch.fx.Node):
            return self.values.get(value, CONST)
        return value

    def _no_data(self, node, op: str, flat: list) -> Value:
        """A node that does not touch the input's data: a learned tensor if it is a view of one
        (expand, unsqueeze, ...: the parameter's own shape is kept), else a constant."""
        params = [v for v in flat if isinstance(v, Param)]
        out_shape = tuple(int(d) for d in getattr(node.meta.get("val"), "shape", ()))
        if (
            params
            and op in _TRANSPOSES
            and len(params[0].shape) == 2
            and out_shape == tuple(reversed(params[0].shape))
        ):
            p = params[0]  # a transposed weight matrix (Falcon's x @ W.T): the same tensor
            return Param(p.key, p.name, out_shape)
        if params and op not in SHAPE_ONLY:
            # a view, slice, masking or cast of a learned tensor is that tensor; an operator on
            # several (Swin V2's position-bias MLP on a constant table) counts each once
            return combined_param(params, out_shape)
        if isinstance(node.meta.get("val"), (tuple, list)):
            return [CONST] * len(node.meta["val"])
        return CONST

    def _stand_in(self, node, label: str) -> Value:
        val = node.meta.get("val")
        if hasattr(val, "shape"):
            return stand_in(f"<{label}>", self._ps(val) or (1,))
        if isinstance(val, (tuple, list)):
            return [
                stand_in(f"<{label}>", self._ps(v) or (1,)) if hasattr(v, "shape") else BAD
                for v in val
            ]
        return BAD

    # ------------------------------------------------------------------ shapes and names

    def _ps(self, val) -> tuple[int, ...] | None:
        """Per-sample shape of a tensor value: the batch factor taken out of the first dim that
        holds it (the leading one, or one a transpose moved it to, or one it was merged into);
        None if no dim holds it."""
        shape = tuple(int(d) for d in val.shape)
        if self.batch is None:
            return None
        for i, d in enumerate(shape):
            if d % self.batch == 0:
                rest = d // self.batch
                return shape[:i] + ((rest,) if rest > 1 else ()) + shape[i + 1 :]
        return None

    def ps(self, arg) -> tuple[int, ...]:
        val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        ps = self._ps(val) if hasattr(val, "shape") else None
        if ps is None:
            raise Unsupported("a tensor whose leading dim is not the batch")
        return ps

    def out_ps(self, node) -> tuple[int, ...]:
        return self.ps(node)

    @staticmethod
    def _path(node) -> str:
        stack = node.meta.get("nn_module_stack") or {}
        if not stack:
            return ""
        return list(stack.values())[-1][0]

    def _label(self, node, own: bool = False) -> str:
        """The module's path for a weighted op or an op of a ``torch.nn`` layer (``layer1.0.conv1``,
        ``maxpool``), else ``<path>.<op>`` (``layer1.0.add``)."""
        stack = node.meta.get("nn_module_stack") or {}
        path, cls = list(stack.values())[-1] if stack else ("", "")
        name = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
        if path and (own or name.startswith("torch.nn.modules.")):
            return path
        op = _packet(node.target).rsplit(".", 1)[-1].strip("_")
        return f"{path}.{op}" if path else op

    def _weight_label(self, node, weight) -> str:
        """:meth:`_label` of a weighted op, or the path of the submodule that holds ``weight``
        where a module applies a submodule's weight itself (Mamba's mixer calls ``F.conv1d`` on
        ``self.conv1d.weight`` and multiplies by ``self.dt_proj.weight``)."""
        path = self._label(node, own=True)
        owner = str(weight.name).rsplit(".", 1)[0]
        return owner if path and owner.startswith(path + ".") else path

    def _place(self, node) -> str:
        path = self._path(node)
        return path or "top level"

    # ------------------------------------------------------------------ registered modules

    def _module_groups(self) -> dict:
        """First node of each call of a registered module class -> (path, module, nodes)."""
        if not _MODULES:
            return {}
        out: dict = {}
        seen: dict[str, tuple[type, list]] = {}
        for node in self.graph.nodes:
            if node.op != "call_function":
                continue
            for path, cls in (node.meta.get("nn_module_stack") or {}).values():
                klass = _resolve(cls)
                if klass in _MODULES:
                    seen.setdefault(path, (klass, []))[1].append(node)
                    break
        for path, (klass, nodes) in seen.items():
            module = None
            if self.module is not None:
                try:
                    module = self.module.get_submodule(path)
                except AttributeError:
                    pass
            out[nodes[0]] = (path, klass, module, nodes)
        return out

    def _module(self, group) -> set:
        path, klass, module, nodes = group
        inside = set(nodes)
        inputs = []
        for n in nodes:
            for a in n.all_input_nodes:
                if a not in inside and a not in inputs and is_data(self.values.get(a)):
                    inputs.append(a)
        outs = [n for n in nodes if any(u not in inside for u in n.users)]
        handler = _MODULES[klass]
        call = Call(
            self.b,
            [self.values[a] for a in inputs],
            [self._ps(a.meta["val"]) for a in inputs],
            self._ps(outs[-1].meta["val"]) if outs else None,
            path,
            module=module,
        )
        try:
            value = handler(call)
        except Unsupported as exc:
            self.b.unsupported(klass.__name__, path, str(exc))
            value = self._stand_in(outs[-1], klass.__name__) if outs else BAD
        for n in outs:
            self.values[n] = value
        return inside

    def _call_of(self, node, args) -> Call:
        tensors = [a for a in node.args if isinstance(a, torch.fx.Node)]
        val = node.meta.get("val")
        return Call(
            self.b,
            [self.values.get(a, CONST) for a in tensors],
            [
                self._ps(a.meta["val"]) if hasattr(a.meta.get("val"), "shape") else None
                for a in tensors
            ],
            self._ps(val) if hasattr(val, "shape") else None,
            self._label(node, own=True),
            args=tuple(args),
        )

    # ------------------------------------------------------------------ operators

    def _table(self) -> dict[str, Callable]:
        b = self.b
        return {
            "aten.conv1d": self._conv,
            "aten.conv2d": self._conv,
            "aten.convolution": self._conv,
            "aten.linear": self._linear,
            "aten.addmm": self._addmm,
            "aten.mm": self._matmul,
            "aten.bmm": self._matmul,
            "aten.baddbmm": self._baddbmm,
            "aten.matmul": self._matmul,
            "aten.einsum": self._einsum,
            "aten.embedding": self._embedding,
            "aten.batch_norm": self._batch_norm,
            "aten._native_batch_norm_legit_no_training": self._batch_norm,
            "aten._native_batch_norm_legit_functional": self._batch_norm,
            "aten.layer_norm": self._layer_norm,
            "aten.rms_norm": self._rms_norm,
            "aten.add": self._add,
            "aten.add_": self._add,
            "aten.sub": self._add,
            "aten.mul": lambda n, a, k: b.mul(self._label(n), a[0], a[1]),
            "aten.mul_": lambda n, a, k: b.mul(self._label(n), a[0], a[1]),
            "aten.div": self._div,
            "aten.div_": self._div,
            "aten.masked_fill": lambda n, a, k: a[0],
            "aten.where": self._where_op,
            "aten.mean": self._mean,
            "aten.linalg_vector_norm": self._vector_norm,
            "aten.cat": self._cat,
            "aten.concat": self._cat,
            "aten.select": self._select,
            "aten.slice": self._slice,
            "aten.split": self._split,
            "aten.split_with_sizes": self._split,
            "aten.chunk": self._split,
            "aten.unbind": self._unbind,
            "getitem": self._getitem,
            "aten.scaled_dot_product_attention": self._sdpa,
            "aten.max_pool2d": lambda n, a, k: self._pool(n, a, "max"),
            "aten.max_pool2d_with_indices": lambda n, a, k: [self._pool(n, a, "max"), CONST],
            "aten.avg_pool2d": lambda n, a, k: self._pool(n, a, "avg"),
            "aten.adaptive_avg_pool2d": lambda n, a, k: self._adaptive(n, a, "avg"),
            "aten.adaptive_max_pool2d": lambda n, a, k: [self._adaptive(n, a, "max"), CONST],
            "aten.pad": self._pad,
            "aten.constant_pad_nd": self._pad,
            "aten.index": self._index,
            "aten.sum": self._sum,
            "aten.topk": lambda n, a, k: [CONST, CONST],  # the router's choices
            "transformers.grouped_mm_fallback": self._grouped_mm,
            "aten._grouped_mm": self._grouped_mm,
            "aten.bernoulli": lambda n, a, k: CONST,
            "aten.bernoulli_": lambda n, a, k: a[0],  # a dropout mask drawn in place
            SCAN_OP: self._scan,
            "aten.gather": self._gather,
        }

    def _activation(self, node, args, kwargs) -> Value:
        op = _packet(node.target)
        function = ACTIVATIONS[op]
        if op == "aten.hardtanh" or op == "aten.hardtanh_":
            low, high = list(args[1:3]) + [-1.0, 1.0][len(args[1:3]) :]
            function = "relu6" if (low, high) == (0.0, 6.0) else "clip"
        return self.b.activation(self._label(node), args[0], function)

    def _view(self, node, args, kwargs) -> Value:
        x = args[0]
        op = _packet(node.target)
        if isinstance(x, (Act, Piece)) and op == "aten.expand":
            n_in = math.prod(node.args[0].meta["val"].shape)
            n_out = math.prod(node.meta["val"].shape)
            if n_out > n_in:
                return self.b.repeat(x, n_out // n_in)
        if (
            isinstance(x, Act)
            and op in ("aten.unflatten", "aten.view", "aten.reshape")
            and self._stacks(node)
        ):
            return self.b.stack(x, 3)
        if not isinstance(x, Act):
            return x
        ps_in, ps_out = self._ps(node.args[0].meta["val"]), self._ps(node.meta["val"])
        if ps_in is None or ps_out is None:
            return x  # a tensor without the batch (a position table): its view is the same tensor
        return self.b.reshape(self._label(node), x, ps_in, ps_out)

    @staticmethod
    def _stacks(node) -> bool:
        """Splits the last dim into (3, E) and a select / unbind along that 3 follows
        (a fused QKV projection taken apart, as nn.MultiheadAttention does)."""
        before, after = node.args[0].meta["val"].shape, node.meta["val"].shape
        k = len(before) - 1
        if (
            len(after) <= k + 1
            or tuple(after[:k]) != tuple(before[:k])
            or after[k] != 3
            or 3 * math.prod(after[k + 1 :]) != before[-1]
        ):
            return False
        todo, seen = [node], set()
        while todo:
            n = todo.pop()
            for user in n.users:
                if user in seen:
                    continue
                seen.add(user)
                op = _packet(user.target) if user.op == "call_function" else ""
                if op in ("aten.select", "aten.unbind"):
                    return True
                if op in VIEWS:
                    todo.append(user)
        return False

    def _gather(self, node, args, kwargs) -> Value:
        """Relative position scores gathered per query and key by a constant index (DeBERTa);
        other gathers are refused."""
        if isinstance(args[0], Relative) and not is_data(args[2] if len(args) > 2 else None):
            return args[0]
        raise Unsupported("a gather (the importer maps relative position scores only)")

    def _scan(self, node, args, kwargs) -> Value:
        """Mamba's selective scan (:mod:`parplan.models.importers.kernels`'s operator)."""
        x, dt, a, b, c, d, z, dt_bias = (list(args) + [None] * 8)[:8]
        softplus = args[8] if len(args) > 8 else kwargs.get("delta_softplus", False)
        if not softplus:
            raise Unsupported("a selective scan without the softplus of its time step")
        return self.b.scan(self._label(node), x, dt, b, c, z, a, d, dt_bias)

    def _causal_crop(self, node, padding: int, kernel: int, stride: int, dilation: int):
        """The slice that crops a 1-D convolution's output back to its input's length, when the
        convolution pads ``kernel - 1`` positions on both sides and only that slice reads it (a
        causal convolution: PyTorch's way to write Mamba's), else None."""
        users = list(node.users)
        if (
            len(users) != 1
            or stride != 1
            or dilation != 1
            or kernel < 2
            or padding != kernel - 1
            or _packet(users[0].target) != "aten.slice"
        ):
            return None
        crop = users[0]
        length = int(node.args[0].meta["val"].shape[-1])
        rank = len(node.meta["val"].shape)
        dim, start, end, step = (list(crop.args[1:]) + [0, None, None, 1][len(crop.args) - 1 :])[:4]
        if dim % rank != rank - 1 or (start or 0) != 0 or end != length or step != 1:
            return None
        return crop

    def _conv(self, node, args, kwargs) -> Value:
        x, weight = args[0], args[1]
        bias = args[2] if len(args) > 2 else None
        if not isinstance(weight, Param):
            raise Unsupported("a convolution whose weight is not a parameter")
        rest = list(args[3:])
        if _packet(node.target) == "aten.convolution":
            stride, padding, dilation, transposed, _, groups = rest[:6]
            if transposed:
                raise Unsupported("a transposed convolution")
        else:
            stride, padding, dilation, groups = (rest + [1, 0, 1, 1][len(rest) :])[:4]
        if isinstance(padding, str):
            raise Unsupported("string padding")
        if len(weight.shape) == 3:  # (out, in / groups, k): over (channels, length)
            one = [int(_first(v)) for v in (stride, padding, dilation)]
            crop = self._causal_crop(node, one[1], int(weight.shape[2]), one[0], one[2])
            if crop is not None:
                self._crops.add(crop)
            return self.b.conv1d(
                self._weight_label(node, weight),
                x,
                self.ps(node.args[0]),
                self.ps(crop) if crop is not None else self.out_ps(node),
                weight.shape[0],
                weight.shape[2],
                *one[:2],
                int(groups),
                bias is not None,
                one[2],
                key=weight.key,
                causal=crop is not None,
            )
        if len(weight.shape) != 4:
            raise Unsupported(
                f"a {len(weight.shape) - 2}-D convolution (the IR has 2-D convolutions)"
            )
        return self.b.conv2d(
            self._label(node, own=True),
            x,
            self.ps(node.args[0]),
            self.out_ps(node),
            weight.shape[0],
            tuple(weight.shape[2:]),
            _pair(stride),
            _pair(padding),
            int(groups),
            bias is not None,
            _pair(dilation),
            key=weight.key,
        )

    def _linear(self, node, args, kwargs) -> Value:
        x, weight = args[0], args[1]
        bias = args[2] if len(args) > 2 else kwargs.get("bias")
        if not isinstance(weight, Param) or len(weight.shape) != 2:
            raise Unsupported("a linear layer whose weight is not a learned matrix")
        return self.b.linear(
            self._label(node, own=True),
            x,
            self.ps(node.args[0]),
            weight.shape[0],
            bias is not None,
            key=weight.key,
            bias_key=bias.key if isinstance(bias, Param) else None,
        )

    def _addmm(self, node, args, kwargs) -> Value:
        bias, x, weight = args[0], args[1], args[2]
        if not isinstance(weight, Param) or len(weight.shape) != 2:
            return self._matmul(node, args[1:], kwargs)
        return self.b.linear(
            self._label(node, own=True),
            x,
            self.ps(node.args[1]),
            weight.shape[1],
            isinstance(bias, Param),
            key=weight.key,
            bias_key=bias.key if isinstance(bias, Param) else None,
        )

    def _matmul(self, node, args, kwargs) -> Value:
        a, w = args[0], args[1]
        if isinstance(w, Param) and len(w.shape) == 2:
            return self.b.linear(
                self._label(node), a, self.ps(node.args[0]), w.shape[1], False, key=w.key
            )
        if isinstance(a, Param) and len(a.shape) == 2 and isinstance(w, (Act, Piece)):
            ps = self.ps(node.args[1])
            if len(ps) == 2 and ps[0] == a.shape[1] and ps[1] != a.shape[1]:
                # W @ x of a (batch, features, positions) x: a linear layer of W (out, in)
                # whose output is (batch, out, positions) (Mamba's time-step projection)
                return self.b.linear(
                    self._weight_label(node, a), w, (ps[1], ps[0]), a.shape[0], False, key=a.key
                )
        ps = self.ps(node.args[0]) if is_data(a) else ()
        return self.b.matmul(self._label(node), a, w, ps)

    def _einsum(self, node, args, kwargs) -> Value:
        """A batched product written as einsum (MaxViT's attention): ``...ik,...jk->...ij`` is
        ``a @ b^T`` (attention scores, as ``q @ k.transpose(-1, -2)``) and ``...ij,...jk->...ik``
        on scores is ``scores @ v``; other equations are refused."""
        equation, operands = str(args[0]).replace(" ", ""), list(args[1])
        lhs, _, out = equation.partition("->")
        subs = lhs.split(",")
        if len(subs) != 2 or len(operands) != 2:
            raise Unsupported(
                f"einsum '{args[0]}' of {len(subs)} operand(s) (the importer maps two)"
            )
        a_sub, b_sub = subs
        batch = a_sub[:-2]
        shaped = len(a_sub) == len(b_sub) == len(out) >= 2 and b_sub[:-2] == out[:-2] == batch
        i, k = a_sub[-2:] if len(a_sub) >= 2 else ("", "")
        j = out[-1:] if out else ""
        a, b = operands
        ps_a = self.ps(node.args[1][0])
        if shaped and b_sub[-2:] == j + k and out[-2:] == i + j and i != j:
            return self.b.matmul(self._label(node), a, b, ps_a)  # a @ b^T: scores
        if shaped and b_sub[-2:] == k + j and out[-2:] == i + j and isinstance(a, Scores):
            return self.b.matmul(self._label(node), a, b, ps_a)  # scores @ v
        raise Unsupported(
            f"einsum '{args[0]}': the importer maps attention's two batched products "
            "(...id,...jd->...ij, then ...ij,...jd->...id on the scores)"
        )

    def _baddbmm(self, node, args, kwargs) -> Value:
        """``beta * bias + alpha * (a @ b)``: the product, plus a bias that depends on positions
        only (Bloom's ALiBi scores); a bias computed from the data is not modelled."""
        bias, a, b = args[0], args[1], args[2]
        if is_data(bias):
            raise Unsupported("a batched product plus a tensor computed from the data")
        return self.b.matmul(self._label(node), a, b, self.ps(node.args[1]) if is_data(a) else ())

    def _embedding(self, node, args, kwargs) -> Value:
        weight, ids = args[0], args[1]
        if not isinstance(weight, Param) or len(weight.shape) != 2:
            raise Unsupported("an embedding whose table is not a learned matrix")
        if not is_data(ids):
            seq = self.b.input_shape.spatial if self.b.input_shape is not None else 0
            if math.prod(node.meta["val"].shape) not in (
                seq * weight.shape[1],
                self.batch * seq * weight.shape[1],
            ):
                return weight  # a learned tensor looked up by constant indices (a relative attention bias)
        return self.b.embedding(
            self._label(node, own=True), ids, weight.shape[0], weight.shape[1], key=weight.key
        )

    def _batch_norm(self, node, args, kwargs) -> Value:
        weight, bias = args[1], args[2]
        if (weight is None) != (bias is None):
            raise Unsupported("batch norm with a weight but no bias (or the reverse)")
        out = self.b.norm(
            self._label(node, own=True),
            args[0],
            "batch",
            self.ps(node.args[0])[0],
            weight is not None,
            key=weight.key if isinstance(weight, Param) else None,
        )
        if isinstance(node.meta.get("val"), (tuple, list)):
            return [out] + [CONST] * (len(node.meta["val"]) - 1)
        return out

    def _layer_norm(self, node, args, kwargs) -> Value:
        shape = args[1]
        weight = args[2] if len(args) > 2 else None
        bias = args[3] if len(args) > 3 else None
        if len(shape) != 1:
            raise Unsupported(f"layer norm over {_user_shape(shape)} (only over the last dim)")
        if (weight is None) != (bias is None):
            raise Unsupported("layer norm with a weight but no bias (the IR counts both)")
        return self.b.norm(
            self._label(node, own=True),
            args[0],
            "layer",
            int(shape[0]),
            weight is not None,
            key=weight.key if isinstance(weight, Param) else None,
        )

    def _rms_norm(self, node, args, kwargs) -> Value:
        shape = args[1]
        weight = args[2] if len(args) > 2 else None
        if len(shape) != 1:
            raise Unsupported(f"RMS norm over {_user_shape(shape)} (only over the last dim)")
        return self.b.norm(
            self._label(node, own=True),
            args[0],
            "rms",
            int(shape[0]),
            weight is not None,
            key=weight.key if isinstance(weight, Param) else None,
        )

    def _add(self, node, args, kwargs) -> Value:
        a, c = args[0], args[1]
        return self.b.add(self._label(node), a, c)

    def _div(self, node, args, kwargs) -> Value:
        a, c = args[0], args[1]
        if isinstance(c, RowStat):
            return self.b.mul(self._label(node), a, c)
        if is_data(c):
            raise Unsupported("division by a tensor")
        return self.b.mul(self._label(node), a, CONST)

    def _where_op(self, node, args, kwargs) -> Value:
        data = [v for v in args[1:] if is_data(v)]
        if len(data) == 1 and not is_data(args[0]):
            return data[0]  # masking with a constant
        raise Unsupported("where() choosing between two tensors")

    def _mean(self, node, args, kwargs) -> Value:
        x = args[0]
        dims = args[1] if len(args) > 1 else None
        rank = node.args[0].meta["val"].dim()
        dims = (
            [d % rank for d in (dims if isinstance(dims, (list, tuple)) else [dims])]
            if dims is not None
            else []
        )
        keep = len(args) > 2 and bool(args[2])
        if isinstance(x, Scores):
            return CONST  # attention weights averaged over heads: returned for inspection only
        if dims == [rank - 1] and keep:  # over the features (or a head's), per position
            features = int(node.args[0].meta["val"].shape[-1])
            return self.b.row_statistic(x, features if rank == 4 else None)
        act = self.b._act(x, "a mean")  # noqa: SLF001 - the builder's check, with its message
        if math.prod(self.out_ps(node)) != act.shape.channels:
            raise Unsupported(
                "a mean over the feature dim (only over all positions, or per position with keepdim)"
            )
        return self.b.reduce_positions(self._label(node), act, "a mean")

    def _vector_norm(self, node, args, kwargs) -> Value:
        """The L2 norm over the features (or a head's) per position, kept as a dim: a per-position
        statistic, as RMS's mean of squares is; ``x`` divided by it (``F.normalize``: cosine
        attention's q and k in Swin V2) is a norm without affine weights."""
        x = args[0]
        order = args[1] if len(args) > 1 else kwargs.get("ord", 2)
        dims = args[2] if len(args) > 2 else kwargs.get("dim")
        keep = bool(args[3]) if len(args) > 3 else bool(kwargs.get("keepdim", False))
        rank = node.args[0].meta["val"].dim()
        dims = [d % rank for d in (dims if isinstance(dims, (list, tuple)) else [dims])]
        if order != 2 or dims != [rank - 1] or not keep:
            raise Unsupported(
                f"a vector norm of order {order} over dims {dims} (the importer maps the L2 norm "
                "over the last dim, kept, as F.normalize takes it)"
            )
        features = int(node.args[0].meta["val"].shape[-1])
        if isinstance(x, Piece):
            # per head on q or k of a fused projection (Swin V2's cosine attention): dividing
            # the piece by it normalises it (attention() then wants q and k both normalised)
            if rank != 4 or x.span is not None or x.rotary:
                raise Unsupported(
                    "an L2 norm of one piece of a fused projection other than per head on q or k"
                )
            return RowStat(x, features)
        return self.b.row_statistic(x, features if rank == 4 else None)

    def _cat(self, node, args, kwargs) -> Value:
        tensors = list(args[0])
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        rank = node.meta["val"].dim()
        dim %= rank
        params = [t for t in tensors if isinstance(t, Param)]
        data = [t for t in tensors if is_data(t)]
        if (
            params
            and len(data) == 1
            and len(tensors) == 2
            and isinstance(tensors[0], Param)
            and rank == 3
            and dim == 1
        ):
            # a learned class token before the sequence
            count = self.ps(node)[0] - self.ps(node.args[0][1])[0]
            return self.b.tokens(self._label(node), tensors[0], data[0], count)
        # the feature axis: where each input's size is its IR channel count
        feature = True
        for value, arg in zip(tensors, node.args[0]):
            if isinstance(value, Piece) and value.features:  # a part of a tensor's features
                start, stop = value.channels
                if int(arg.meta["val"].shape[dim]) != stop - start:
                    feature = False
                    break
                continue
            base = value if isinstance(value, Act) else getattr(value, "base", None)
            if not isinstance(base, Act) or int(arg.meta["val"].shape[dim]) != base.shape.channels:
                feature = isinstance(value, Half)
                break
        return self.b.concat(self._label(node), tensors, feature)

    def _select(self, node, args, kwargs) -> Value:
        x, dim, index = args[0], args[1], args[2]
        if isinstance(x, Stacked):
            return self.b.pick(x, int(index))
        rank = node.args[0].meta["val"].dim()
        if isinstance(x, Act) and rank == 3 and dim % rank == 1:
            return self.b.reduce_positions(self._label(node), x, "picking one position")
        size = int(node.args[0].meta["val"].shape[dim % rank])
        if isinstance(x, Act) and rank == 5 and dim % rank == 3 and size == 3:
            # (batch, seq, heads, 3, head_dim) of a fused projection: q, k or v, per head (Bloom)
            return self.b.pick(self.b.stack(x, 3), int(index))
        raise Unsupported(
            f"selecting index {index} of dim {dim} of a rank-{rank} tensor (drops elements)"
        )

    def _slice(self, node, args, kwargs) -> Value:
        x = args[0]
        if node in self._crops:
            return x  # a causal convolution's crop: its output is already the input's length
        dim = args[1] if len(args) > 1 else 0
        start = args[2] if len(args) > 2 else None
        end = args[3] if len(args) > 3 else None
        step = args[4] if len(args) > 4 else 1
        shape = node.args[0].meta["val"].shape
        dim %= len(shape)
        size = int(shape[dim])
        start = 0 if start is None else int(start) % size if int(start) < 0 else int(start)
        end = (
            size
            if end is None or int(end) >= size
            else int(end) % size
            if int(end) < 0
            else int(end)
        )
        if start == 0 and end >= size and step == 1:
            return x  # the whole tensor
        if len(shape) == 3 and dim == 2 and step == 1 and isinstance(x, Act):
            return self.b.feature_slice(x, start, end)  # q, k, v of a fused projection by index
        if (
            len(shape) == 4
            and dim == 2
            and step == 1
            and isinstance(x, Act)
            and size * int(shape[3]) == x.shape.channels
        ):  # heads of a (batch, seq, heads, d) view of a fused projection (Falcon's q)
            if start == 0:
                self._claimed[node.args[0]] = end  # the heads after it go to the indexes
            return self.b.feature_slice(x, start * int(shape[3]), end * int(shape[3]))
        if (
            len(shape) == 5
            and dim == 3
            and step == 1
            and start == 0
            and end == size - 2
            and isinstance(x, Act)
            and int(shape[2]) * size * int(shape[4]) == x.shape.channels
        ):  # q of a (batch, seq, groups, heads per group + 2, d) view (Falcon's new decoder)
            return self._grouped_piece(node.args[0], x, shape, "q")
        if (
            dim == len(shape) - 1
            and step == 1
            and len(shape) >= 3
            and isinstance(x, (Act, Half, Piece))
        ):
            return self.b.half(
                x
            )  # parts of the head dim: RoPE's halves, or the rotated part of partial rotary
        if (
            0 < dim < len(shape) - 1
            and step == 2
            and start in (0, 1)
            and size % 2 == 0
            and len(shape) == 4
        ):
            return self.b.stride2(x)  # every other row / column of a channels-last image
        raise Unsupported(
            f"slicing [{start}:{end}:{step}] of dim {dim} of a {_user_shape(shape)} tensor (drops elements)"
        )

    def _split(self, node, args, kwargs) -> Value:
        vals = node.meta.get("val")
        if not isinstance(vals, (tuple, list)):
            raise Unsupported("a split whose result is not a list of tensors")
        x, shape = args[0], node.args[0].meta["val"].shape
        if len({tuple(v.shape) for v in vals}) != 1:
            dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
            if _feature_dim(node.args[0], x) != dim % len(shape):
                raise Unsupported("a split into unequal pieces along a dim other than the features")
            sizes = [int(v.shape[dim % len(shape)]) for v in vals]
            return self.b.split_sizes(x, sizes)  # Mamba's time step, B and C
        if _packet(node.target) == "aten.unbind":
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        else:
            dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
        dim %= len(shape)
        return self.b.split(x, len(vals), features=dim == _feature_dim(node.args[0], x))

    def _unbind(self, node, args, kwargs) -> Value:
        x = args[0]
        vals = node.meta.get("val")
        if isinstance(x, Stacked):
            return [self.b.pick(x, i) for i in range(len(vals))]
        return self._split(node, args, kwargs)

    def _getitem(self, node, args, kwargs) -> Value:
        container, index = args[0], args[1]
        if isinstance(container, (list, tuple)):
            return container[index]
        return container if not is_data(container) else BAD

    def _sdpa(self, node, args, kwargs) -> Value:
        q_ps = self.ps(node.args[0])
        if len(q_ps) != 3:
            raise Unsupported("attention on q that is not (batch, heads, seq, head_dim)")
        q, k, v = (
            args[0],
            args[1],
            args[2],
        )  # with enable_gqa, k and v have fewer heads: read off their sizes
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        return self.b.attention(
            self._label(node),
            q,
            k,
            v,
            heads=int(q_ps[0]),
            bias=mask if isinstance(mask, Param) else None,
        )

    def _pool(self, node, args, mode: str) -> Value:
        kernel = args[1]
        stride = args[2] if len(args) > 2 and args[2] else kernel
        padding = args[3] if len(args) > 3 else 0
        if mode == "max":
            dilation = args[4] if len(args) > 4 else 1
            ceil = args[5] if len(args) > 5 else False
            if _pair(dilation) != (1, 1):
                raise Unsupported("dilated pooling")
        else:
            ceil = args[4] if len(args) > 4 else False
        return self.b.pool(
            self._label(node),
            args[0],
            self.ps(node.args[0]),
            self._pool_out(node),
            mode,
            _pair(kernel),
            _pair(stride),
            _pair(padding),
            bool(ceil),
        )

    def _index(self, node, args, kwargs) -> Value:
        """Rows of a tensor picked by computed indices: the router's dispatch of tokens to their
        experts (k copies of each), or a permutation of dispatched tokens."""
        x, indices = args[0], args[1]
        rank = node.args[0].meta["val"].dim()
        heads = self._head_index(node, x, rank)
        if heads is not None:  # k or v picked out of a per-head view of a fused projection
            return heads
        if (
            isinstance(x, Act)
            and rank == 3
            and len(indices) == 2
            and not any(is_data(i) for i in indices)
            and node.meta["val"].dim() == 2
        ):
            # x[arange(batch), position]: one position per sample, chosen from the token ids
            # (CLIP's pooling at the end-of-text token): priced as x[:, 0]
            return self.b.reduce_positions(self._label(node), x, "picking one position")
        if any(is_data(i) for i in indices) or len([i for i in indices if i is not None]) != 1:
            raise Unsupported("indexing by data-dependent or several index tensors")
        rows_in, rows_out = int(node.args[0].meta["val"].shape[0]), int(node.meta["val"].shape[0])
        if rows_out % rows_in or indices[0] is None:
            raise Unsupported("indexing that drops rows")
        k = rows_out // rows_in
        if isinstance(x, Dispatched):
            return Dispatched(x.value, x.k * k)
        self.b._act(x, "an index")  # noqa: SLF001 - the builder's check, with its message
        return Dispatched(x, k) if k > 1 else x

    def _grouped_piece(self, view, x: Act, shape, which: str) -> Value:
        """q, k or v of a projection viewed as (batch, seq, G groups, r + 2, d): per group r
        query heads, then its key and its value (Falcon's new decoder architecture, q, k and v
        interleaved per key/value group). The projection's features are a permutation of
        [q | k | v] with G key/value heads, which is how the IR reads them: the same products
        and parameters, and an OUT split of the module's rows in whole groups (the heads of each
        of q, k and v split evenly, as torch's ColwiseParallel on it does)."""
        groups, slots, d = int(shape[2]), int(shape[3]), int(shape[4])
        q = groups * (slots - 2) * d
        span = {
            "q": (0, q),
            "k": (q, q + groups * d),
            "v": (q + groups * d, q + 2 * groups * d),
        }[which]
        self._claimed[view] = {"q": "k", "k": "v", "v": None}[which]
        return self.b.feature_slice(x, *span)

    def _head_index(self, node, x, rank: int):
        """``x[:, :, [h]]`` of a (batch, seq, heads, d) view of a projection's output, with a
        constant index of consecutive heads (Falcon's multi-query k and v): those heads'
        features, a piece of the projection; None if the indexing is not that."""
        index = node.args[1]
        if (
            isinstance(x, Act)
            and rank == 5
            and isinstance(index, (list, tuple))
            and len(index) == 4
            and all(i is None for i in index[:3])
            and isinstance(self._claimed.get(node.args[0]), str)
            and int(node.meta["val"].shape[3]) == 1
        ):  # k, then v, of a grouped view whose q was sliced first (Falcon's new decoder)
            shape = node.args[0].meta["val"].shape
            return self._grouped_piece(node.args[0], x, shape, self._claimed[node.args[0]])
        if not (
            isinstance(x, Act)
            and rank == 4
            and isinstance(index, (list, tuple))
            and len(index) == 3
            and index[0] is None
            and index[1] is None
            and isinstance(index[2], torch.fx.Node)
        ):
            return None
        shape = node.args[0].meta["val"].shape
        heads, d = int(shape[2]), int(shape[3])
        count = int(node.meta["val"].shape[2])
        if heads * d != x.shape.channels:
            return None
        spec = self.specs.get(index[2].name, (None, None))
        value = self.constants.get(spec[1]) if spec[0] == "CONSTANT_TENSOR" else None
        if value is not None and not value.is_meta:
            picked = [int(h) % heads for h in value.reshape(-1).tolist()]
            first = picked[0]
            if picked != list(range(first, first + len(picked))):
                return None
        else:
            # a model built on the meta device holds no index values: the heads a leading slice
            # of this view left over, in the order the indexes read them (Falcon: q = [:-2],
            # then k, then v)
            first = self._claimed.get(node.args[0])
            if first is None or first + count > heads:
                return None
        self._claimed[node.args[0]] = first + count
        return self.b.feature_slice(x, first * d, (first + count) * d)

    def _sum(self, node, args, kwargs) -> Value:
        x, dims = args[0], args[1] if len(args) > 1 else None
        shape = node.args[0].meta["val"].shape
        if (
            isinstance(x, Dispatched)
            and isinstance(dims, (list, tuple))
            and len(dims) == 1
            and int(shape[dims[0]]) == x.k
        ):
            return x.value  # the weighted copies summed: the experts combined
        raise Unsupported(
            f"a sum over dims {dims} of a {_user_shape(shape)} tensor (the importer maps a sum "
            "only where it combines a mixture of experts' copies of each token)"
        )

    def _grouped_mm(self, node, args, kwargs) -> Value:
        x, weight = args[0], args[1]
        if not isinstance(weight, Param) or len(weight.shape) != 3:
            raise Unsupported(
                "a grouped product whose weight is not a learned (experts, in, out) tensor"
            )
        return self.b.expert_linear(
            self._label(node), x, int(node.meta["val"].shape[-1]), weight.shape[0], key=weight.key
        )

    def _pad(self, node, args, kwargs) -> Value:
        pads = args[1]
        if any(int(p) for p in pads):
            raise Unsupported(
                f"padding by {tuple(pads)} (only a zero pad, e.g. to a window multiple already met: "
                "give a windowed model an image size its windows tile, as the size of its weights "
                "does, tv:'s default)"
            )
        return args[0]

    def _pool_out(self, node):
        val = node.meta["val"]
        return self._ps(val[0] if isinstance(val, (tuple, list)) else val)

    def _adaptive(self, node, args, mode: str) -> Value:
        return self.b.pool(
            self._label(node),
            args[0],
            self.ps(node.args[0]),
            self._pool_out(node),
            mode,
            adaptive=True,
        )


def _feature_dim(node, x) -> int | None:
    """The dim of ``node``'s tensor that holds activation ``x``'s features (IR channels), or
    None: dim 1 of (batch, C) and (batch, C, H, W); of (batch, S, E) and (batch, E, L) (a
    sequence's features transposed before a 1-D convolution: Mamba) the one of the feature
    count's size, and where both are, the contiguous one (a projection's features are)."""
    if not isinstance(x, Act):
        return None
    val = node.meta["val"]
    shape = tuple(int(d) for d in val.shape)
    if len(shape) in (2, 4):
        return 1 if shape[1] == x.shape.channels else None
    if len(shape) != 3:
        return None
    sized = [d for d in (1, 2) if shape[d] == x.shape.channels]
    if len(sized) == 2:
        sized = [d for d in sized if val.stride()[d] == 1]
    return sized[0] if len(sized) == 1 else None


def _undispatch(value):
    if isinstance(value, Dispatched):
        return value.value
    if isinstance(value, (list, tuple)):
        return type(value)(_undispatch(v) for v in value)
    if isinstance(value, dict):
        return {k: _undispatch(v) for k, v in value.items()}
    return value


def _dispatch(value, k: int):
    if isinstance(value, (list, tuple)):
        return type(value)(_dispatch(v, k) for v in value)
    return Dispatched(value, k) if is_data(value) else value


def _flatten(value) -> list:
    out: list = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        else:
            out.append(v)
    return out


def _resolve(cls) -> type | None:
    """The class an ``nn_module_stack`` entry names (a type, or its qualified name)."""
    if isinstance(cls, type):
        return cls
    for klass in _MODULES:
        if f"{klass.__module__}.{klass.__qualname__}" == str(cls) or klass.__qualname__ == str(cls):
            return klass
    return None


def check_torch() -> None:
    if torch is None:
        raise ConfigError(
            'torch is not installed; install the optional extra with pip install -e ".[torch]"'
        )
