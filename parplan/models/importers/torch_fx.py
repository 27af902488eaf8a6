"""Import a PyTorch ``nn.Module`` into the layer-graph IR with torch.fx (optional: ``pip install -e ".[torch]"``).

:func:`from_torch` traces the module symbolically (``torch.fx.symbolic_trace``), runs shape
propagation on one example sample (batch 1, the module in eval mode; its training flags are
restored afterwards) and maps every node with the rules of :mod:`parplan.models.importers`. Modules
from ``torch.nn`` are leaves of the trace; your own modules are traced through.

Supported: ``nn.Conv2d``, ``nn.Linear``, ``nn.Embedding``, ``nn.BatchNorm1d/2d``,
``nn.LayerNorm``, max/avg/adaptive pooling, activations and dropout, ``nn.Flatten``,
``nn.Identity``, ``nn.MultiheadAttention`` (``batch_first=True``, self-attention) and their
functional forms (``F.relu``, ``F.conv2d``, ``F.linear``, ``F.layer_norm``, ...);
``torch.matmul`` / ``bmm`` / ``mm`` / ``@`` with a parameter operand (a Linear) or as
``q @ k^T`` and ``scores @ v``; ``F.scaled_dot_product_attention``; ``+`` / ``torch.add``;
``torch.cat``; ``flatten`` / ``view`` / ``reshape`` / ``permute`` / ``transpose``; ``mean``
over positions and ``x[:, i]``. Anything else raises :class:`~parplan.errors.GraphError`
listing every unsupported operator, its count and where it is.

Example (skipped when torch is not installed):
    >>> import torch.nn as nn  # doctest: +SKIP
    >>> net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 32 * 32, 10))
    >>> g = from_torch(net, (3, 32, 32), name="tiny")  # doctest: +SKIP
    >>> g.parameter_count() == sum(p.numel() for p in net.parameters())  # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import inspect
import io
import math
import operator
import re
from typing import Any, Callable, Sequence

from parplan.costmodel.graph import Graph
from parplan.errors import ConfigError, GraphError
from parplan.models.importers.builder import (
    BAD,
    input_shape_of,
    CONST,
    Act,
    GraphBuilder,
    Param,
    Unsupported,
    Value,
    is_data,
    stand_in,
    supported_text,
)

__all__ = ["from_torch"]

try:  # torch is an optional extra; the module imports without it and fails on use
    import torch
    import torch.fx as fx
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.fx.passes.shape_prop import ShapeProp
except ModuleNotFoundError:  # pragma: no cover - exercised only without torch
    torch = None

INSTALL_HINT = 'torch is not installed; install the optional extra with pip install -e ".[torch]" (torch==2.13.0)'

#: Tensor methods and functions that only reinterpret the layout (pass-through in the IR).
_VIEW_METHODS = frozenset(
    {
        "view",
        "reshape",
        "permute",
        "transpose",
        "contiguous",
        "flatten",
        "unsqueeze",
        "squeeze",
        "t",
        "to",
        "float",
        "half",
        "bfloat16",
        "double",
        "type",
        "type_as",
        "clone",
        "detach",
        "view_as",
        "reshape_as",
        "expand_as",
        "requires_grad_",
        "cpu",
        "cuda",
    }
)
_VIEW_ATTRS = frozenset({"T", "mT", "H", "mH"})
#: Tensor methods that return sizes or new tensors that do not depend on the values.
_CONST_METHODS = frozenset(
    {"size", "dim", "numel", "new_zeros", "new_ones", "new_full", "new_empty", "new_tensor"}
)
_ACTIVATION_METHODS = {
    "relu": "relu",
    "relu_": "relu",
    "sigmoid": "sigmoid",
    "tanh": "tanh",
    "softmax": "softmax",
    "log_softmax": "softmax",
    "gelu": "gelu",
}


def _require_torch() -> None:
    if torch is None:
        raise ConfigError(INSTALL_HINT)


def from_torch(
    module,
    input_shape: Sequence[int],
    name: str | None = None,
    *,
    integer_input: bool | None = None,
) -> Graph:
    """The layer graph of ``module`` for per-sample inputs of shape ``input_shape`` (no batch dim).

    ``input_shape`` is ``(C, H, W)`` for images, ``(features,)`` for vectors, ``(seq,)`` for
    token ids, ``(seq, hidden)`` for embedded sequences. ``integer_input`` says whether the
    input holds token ids (default: yes when it feeds an ``nn.Embedding``). ``name`` defaults to
    the module's class name. The module is not modified (its train/eval flags are restored).
    Raises :class:`~parplan.errors.GraphError` listing every unsupported operator, or naming
    the tracing / shape-propagation failure.
    """
    _require_torch()
    if not isinstance(module, nn.Module):
        raise ConfigError(f"from_torch needs a torch.nn.Module (got {type(module).__name__})")
    if input_shape is None:
        raise ConfigError("from_torch with torch.fx needs input_shape (the per-sample input shape)")
    name = name or type(module).__name__
    shape = input_shape_of(input_shape, name)
    traced = (
        module if isinstance(module, fx.GraphModule) else _trace(module, name)
    )  # never re-traced
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    if integer_input is None:
        integer_input = _feeds_embedding(traced, placeholders[0])
    example = torch.zeros((1, *shape), dtype=torch.long if integer_input else torch.float32)
    _propagate(module, traced, example, name)
    return _Converter(traced, name, integer_input).run()


def _trace(module, name: str):
    params = list(inspect.signature(module.forward).parameters.values())
    concrete: dict[str, Any] = {}
    for p in params[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is inspect.Parameter.empty:
            raise GraphError(
                f"model '{name}': forward takes more than one input ('{p.name}' has no default); "
                "wrap it in a module whose forward takes the one tensor to plan for"
            )
        concrete[p.name] = p.default
    try:
        return fx.symbolic_trace(module, concrete_args=concrete or None)
    except Exception as exc:  # fx raises TraceError, TypeError, ... for untraceable Python
        raise GraphError(
            f"model '{name}': torch.fx cannot trace it ({type(exc).__name__}: {exc}); remove data-dependent "
            "control flow from forward (or pass such flags as defaults)"
        ) from None


def _feeds_embedding(traced, placeholder) -> bool:
    for user in placeholder.users:
        if user.op == "call_module" and isinstance(traced.get_submodule(user.target), nn.Embedding):
            return True
        if user.op == "call_function" and user.target is F.embedding:
            return True
        if (
            user.op == "call_method"
            and user.target in _VIEW_METHODS
            and _feeds_embedding(traced, user)
        ):
            return True
    return False


def _propagate(module, traced, example, name: str) -> None:
    flags = {m: m.training for m in module.modules()}
    try:
        traced.eval()
        # ShapeProp prints the failing node's traceback to stderr; the error below says it all
        with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):
            ShapeProp(traced).propagate(example)
    except Exception as exc:  # the user's forward failed on the example input
        cause = exc.__cause__ or exc
        raise GraphError(
            f"model '{name}': running it on an example input of shape {tuple(example.shape)} "
            f"({example.dtype}) failed ({type(cause).__name__}: {cause}); check input_shape (per sample, "
            "without the batch dim) and integer_input"
        ) from None
    finally:
        for m, training in flags.items():
            m.training = training


def _ps(meta) -> tuple[int, ...]:
    """Per-sample shape of a tensor's metadata (the batch dim dropped)."""
    return tuple(int(d) for d in meta.shape[1:])


def _qualname(target) -> str:
    """How a user would write the operator: ``F.gelu``, ``torch.sin``, ``operator.mul``, ``Tensor.view``."""
    if isinstance(target, str):
        return f"Tensor.{target}"
    mod = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", None) or repr(target)
    if mod.startswith("torch.nn.functional"):
        return f"F.{name}"
    if mod in ("_operator", "operator"):
        return f"operator.{name}"
    if mod in ("", "torch") or mod.startswith("torch._"):
        return f"torch.{name}"
    return f"{mod}.{getattr(target, '__qualname__', name)}"


def _module_label(m) -> str:
    cls = type(m)
    if cls.__module__.startswith("torch.nn"):
        return f"nn.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


class _Converter:
    """Walks the traced graph once, mapping nodes to builder calls."""

    def __init__(self, traced, name: str, integer_input: bool) -> None:
        self.gm = traced
        self.b = GraphBuilder(name, "torch")
        self.name = name
        self.integer = integer_input
        self.values: dict[Any, Value] = {}
        self.functions = self._function_table()
        self.modules = self._module_table()
        self.b.supported = supported_text(  # what the tables dispatch (the message's list)
            {
                "modules": [
                    f"nn.{c.__name__}"
                    for cls, _ in self.modules
                    for c in (cls if isinstance(cls, tuple) else (cls,))
                ],
                "functions": [getattr(f, "__name__", str(f)) for f in self.functions],
                "tensor methods": [*_VIEW_METHODS, *_CONST_METHODS, *_ACTIVATION_METHODS],
            }
        )

    # ------------------------------------------------------------------ driver

    def run(self) -> Graph:
        first = True
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.values[node] = (
                    self.b.input(_ps(node.meta["tensor_meta"]), self.integer) if first else CONST
                )
                first = False
            elif node.op == "get_attr":
                self.values[node] = self._get_attr(node)
            elif node.op == "output":
                continue
            else:
                self.values[node] = self._call(node)
        return self.b.build(self.name)

    def _get_attr(self, node) -> Value:
        obj = self.gm
        for part in node.target.split("."):
            obj = getattr(obj, part)
        if isinstance(obj, nn.Parameter):
            return Param(id(obj), node.target, tuple(obj.shape))
        return CONST

    def _call(self, node) -> Value:
        args = fx.node.map_arg(node.args, lambda n: self.values[n])
        kwargs = fx.node.map_arg(node.kwargs, lambda n: self.values[n])
        flat: list[Value] = []
        fx.node.map_aggregate(
            (args, kwargs), lambda v: flat.append(v) if not isinstance(v, (tuple, list)) else None
        )
        if any(v is BAD for v in flat):
            return BAD
        if node.op == "call_module":
            module = self.gm.get_submodule(node.target)
            handler = self._module_handler(module)
            label, where = _module_label(module), node.target
        else:
            lookup = node.target is F.embedding and isinstance(
                self._arg(args, kwargs, 1, "weight"), Param
            )
            if not lookup and not any(is_data(v) for v in flat):
                return self._no_data(node, flat)
            handler = self._function_handler(node)
            label, where = _qualname(node.target), node.name
        if handler is None:
            self.b.unsupported(label, where)
            return self._stand_in(node, label)
        try:
            return handler(node, args, kwargs)
        except Unsupported as exc:
            self.b.unsupported(label, where, str(exc))
            return self._stand_in(node, label)

    @staticmethod
    def _stand_in(node, label: str) -> Value:
        """An activation standing in for an unsupported node's output, so that the operators
        after it are still checked and reported (the import fails anyway)."""
        meta = node.meta.get("tensor_meta")
        if hasattr(meta, "shape"):
            return stand_in(f"<{label}>", _ps(meta))
        if isinstance(meta, (tuple, list)):
            return [stand_in(f"<{label}>", _ps(m)) if hasattr(m, "shape") else BAD for m in meta]
        return BAD

    @staticmethod
    def _no_data(node, flat: list[Value]) -> Value:
        """A node that does not touch the input's data: a learned tensor if it derives from one
        (a view or slice of a parameter), else a constant (sizes, masks, position ids)."""
        params = [v for v in flat if isinstance(v, Param)]
        meta = node.meta.get("tensor_meta")
        shape_only = node.op == "call_method" and node.target in _CONST_METHODS
        if params and hasattr(meta, "shape") and not shape_only:
            return Param(params[0].key, params[0].name, tuple(int(d) for d in meta.shape))
        return CONST

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _meta(node):
        meta = node.meta.get("tensor_meta")
        if not hasattr(meta, "shape"):
            raise Unsupported("an output that is not one tensor")
        return meta

    def _in_ps(self, node, index: int = 0) -> tuple[int, ...]:
        arg = node.args[index] if index < len(node.args) else None
        if not isinstance(arg, fx.Node):
            raise Unsupported("an input that is not a tensor")
        return _ps(self._meta(arg))

    def _out_ps(self, node) -> tuple[int, ...]:
        return _ps(self._meta(node))

    @staticmethod
    def _arg(args, kwargs, index: int, key: str, default=None):
        if key in kwargs:
            return kwargs[key]
        return args[index] if len(args) > index else default

    @staticmethod
    def _label(node) -> str:
        """Layer name: the module path, or the enclosing module's path + the function's name."""
        if node.op == "call_module":
            return node.target
        stack = node.meta.get("nn_module_stack") or {}
        base = re.sub(r"_\d+$", "", node.name)
        return f"{next(reversed(stack))}.{base}" if stack else base

    # ------------------------------------------------------------------ modules

    def _module_table(self) -> list[tuple[type, Callable]]:
        acts = {
            nn.ReLU: "relu",
            nn.ReLU6: "relu6",
            nn.GELU: "gelu",
            nn.SiLU: "silu",
            nn.Sigmoid: "sigmoid",
            nn.Tanh: "tanh",
            nn.LeakyReLU: "leaky_relu",
            nn.ELU: "elu",
            nn.Hardswish: "hardswish",
            nn.Hardsigmoid: "hardsigmoid",
            nn.Mish: "mish",
            nn.Softmax: "softmax",
            nn.Softplus: "softplus",
            nn.Dropout: "dropout",
            nn.Dropout1d: "dropout",
            nn.Dropout2d: "dropout",
            nn.AlphaDropout: "dropout",
        }
        table: list[tuple[type, Callable]] = [
            (cls, lambda n, a, k, f=fn: self.b.activation(self._label(n), a[0], f))
            for cls, fn in acts.items()
        ]
        table += [
            (nn.Conv2d, self._conv_module),
            (nn.Linear, self._linear_module),
            (nn.Embedding, self._embedding_module),
            ((nn.BatchNorm1d, nn.BatchNorm2d), self._batchnorm_module),
            (nn.LayerNorm, self._layernorm_module),
            ((nn.MaxPool2d, nn.AvgPool2d), self._pool_module),
            ((nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d), self._adaptive_pool_module),
            (nn.Identity, lambda n, a, k: a[0]),
            (
                nn.Flatten,
                lambda n, a, k: self.b.reshape(n.target, a[0], self._in_ps(n), self._out_ps(n)),
            ),
            (nn.MultiheadAttention, self._mha_module),
        ]
        return table

    def _module_handler(self, module) -> Callable | None:
        for cls, handler in self.modules:
            if isinstance(module, cls):
                return handler
        return None

    def _mod(self, node):
        return self.gm.get_submodule(node.target)

    def _conv_module(self, node, args, kwargs) -> Value:
        m = self._mod(node)
        kernel = tuple(m.kernel_size)
        padding = m.padding
        if isinstance(padding, str):
            if padding == "valid":
                padding = (0, 0)
            elif all(k % 2 for k in kernel) and tuple(m.dilation) == (1, 1):
                padding = tuple(k // 2 for k in kernel)
            else:
                raise Unsupported("padding='same' with an even kernel (asymmetric padding)")
        return self.b.conv2d(
            node.target,
            args[0],
            self._in_ps(node),
            self._out_ps(node),
            m.out_channels,
            kernel,
            tuple(m.stride),
            tuple(padding),
            m.groups,
            m.bias is not None,
            tuple(m.dilation),
            key=id(m.weight),
        )

    def _linear_module(self, node, args, kwargs) -> Value:
        m = self._mod(node)
        return self.b.linear(
            node.target,
            args[0],
            self._in_ps(node),
            m.out_features,
            m.bias is not None,
            key=id(m.weight),
        )

    def _embedding_module(self, node, args, kwargs) -> Value:
        m = self._mod(node)
        return self.b.embedding(
            node.target, args[0], m.num_embeddings, m.embedding_dim, key=id(m.weight)
        )

    def _batchnorm_module(self, node, args, kwargs) -> Value:
        m = self._mod(node)
        return self.b.norm(
            node.target,
            args[0],
            "batch",
            m.num_features,
            m.affine,
            key=id(m.weight) if m.affine else None,
        )

    def _layernorm_module(self, node, args, kwargs) -> Value:
        m = self._mod(node)
        if len(m.normalized_shape) != 1:
            raise Unsupported(
                f"LayerNorm over {tuple(m.normalized_shape)} (only over the last dim)"
            )
        if m.elementwise_affine and m.bias is None:
            raise Unsupported("LayerNorm without bias (the IR counts weight and bias)")
        return self.b.norm(
            node.target,
            args[0],
            "layer",
            m.normalized_shape[0],
            m.elementwise_affine,
            key=id(m.weight) if m.elementwise_affine else None,
        )

    def _pool_module(self, node, args, kwargs) -> Value:
        m = self._mod(node)
        if getattr(m, "dilation", 1) not in (1, (1, 1)):
            raise Unsupported("dilated pooling")
        mode = "max" if isinstance(m, nn.MaxPool2d) else "avg"
        return self.b.pool(
            node.target,
            args[0],
            self._in_ps(node),
            self._out_ps(node),
            mode,
            m.kernel_size,
            m.stride,
            m.padding,
            m.ceil_mode,
        )

    def _adaptive_pool_module(self, node, args, kwargs) -> Value:
        mode = "max" if isinstance(self._mod(node), nn.AdaptiveMaxPool2d) else "avg"
        return self.b.pool(
            node.target, args[0], self._in_ps(node), self._out_ps(node), mode, adaptive=True
        )

    def _mha_module(self, node, args, kwargs) -> Value:
        m = self._mod(node)
        q = node.args[0]
        k = node.kwargs.get("key", node.args[1] if len(node.args) > 1 else None)
        v = node.kwargs.get("value", node.args[2] if len(node.args) > 2 else None)
        if not (q is k is v):
            raise Unsupported("cross-attention (query, key and value must be the same tensor)")
        if not m.batch_first:
            raise Unsupported("batch_first=False (construct it with batch_first=True)")
        if not m._qkv_same_embed_dim or m.bias_k is not None or m.add_zero_attn:
            raise Unsupported("kdim/vdim, add_bias_kv or add_zero_attn")
        ps = self._in_ps(node)
        e = m.embed_dim
        qkv = self.b.linear(
            f"{node.target}.in_proj",
            args[0],
            ps,
            3 * e,
            m.in_proj_bias is not None,
            key=id(m.in_proj_weight),
        )
        pieces = self.b.split(qkv, 3)
        attn = self.b.attention(f"{node.target}.attn", *pieces, heads=m.num_heads)
        out = self.b.linear(
            f"{node.target}.out_proj",
            attn,
            ps,
            e,
            m.out_proj.bias is not None,
            key=id(m.out_proj.weight),
        )
        return [out, CONST]

    # ------------------------------------------------------------------ functions and methods

    def _function_table(self) -> dict[Any, Callable]:
        act_fns = {
            F.relu: "relu",
            torch.relu: "relu",
            F.relu6: "relu6",
            F.gelu: "gelu",
            F.silu: "silu",
            torch.sigmoid: "sigmoid",
            F.sigmoid: "sigmoid",
            torch.tanh: "tanh",
            F.tanh: "tanh",
            F.leaky_relu: "leaky_relu",
            F.elu: "elu",
            F.hardswish: "hardswish",
            F.mish: "mish",
            F.dropout: "dropout",
            F.softmax: "softmax",
            torch.softmax: "softmax",
            F.log_softmax: "softmax",
        }
        table: dict[Any, Callable] = {
            fn: (lambda n, a, k, f=name: self.b.activation(self._label(n), a[0], f))
            for fn, name in act_fns.items()
        }
        for fn in (operator.add, operator.iadd, torch.add):
            table[fn] = lambda n, a, k: self.b.add(self._label(n), a[0], a[1])
        for fn in (
            operator.mul,
            operator.imul,
            torch.mul,
            operator.truediv,
            operator.itruediv,
            torch.div,
        ):
            table[fn] = lambda n, a, k: self.b.scale(a[0], a[1])
        for fn in (operator.matmul, torch.matmul, torch.bmm, torch.mm):
            table[fn] = lambda n, a, k: self.b.matmul(self._label(n), a[0], a[1], self._in_ps(n))
        for fn in (torch.cat, torch.concat, torch.concatenate):
            table[fn] = self._cat
        for fn in (
            torch.flatten,
            torch.reshape,
            torch.permute,
            torch.transpose,
            torch.squeeze,
            torch.unsqueeze,
            torch.t,
        ):
            table[fn] = self._view
        for fn in (torch.split, torch.chunk, torch.unbind):
            table[fn] = self._split
        for fn in (
            torch.zeros_like,
            torch.ones_like,
            torch.full_like,
            torch.empty_like,
            torch.rand_like,
        ):
            table[fn] = lambda n, a, k: CONST
        table.update(
            {
                F.linear: self._linear_fn,
                F.conv2d: self._conv_fn,
                F.embedding: self._embedding_fn,
                F.layer_norm: self._layer_norm_fn,
                F.batch_norm: self._batch_norm_fn,
                F.scaled_dot_product_attention: self._sdpa,
                F.adaptive_avg_pool2d: lambda n, a, k: self.b.pool(
                    self._label(n), a[0], self._in_ps(n), self._out_ps(n), "avg", adaptive=True
                ),
                F.adaptive_max_pool2d: lambda n, a, k: self.b.pool(
                    self._label(n), a[0], self._in_ps(n), self._out_ps(n), "max", adaptive=True
                ),
                F.max_pool2d: lambda n, a, k: self._pool_fn(n, a, k, "max"),
                F.avg_pool2d: lambda n, a, k: self._pool_fn(n, a, k, "avg"),
                torch.mean: self._mean,
                operator.getitem: self._getitem,
                getattr: self._getattr,
            }
        )
        return table

    def _function_handler(self, node) -> Callable | None:
        if node.op == "call_function":
            try:
                return self.functions.get(node.target)
            except TypeError:  # unhashable target
                return None
        method = node.target
        if method in _VIEW_METHODS:
            return self._view
        if method in _CONST_METHODS:
            return lambda n, a, k: CONST
        if method in _ACTIVATION_METHODS:
            return lambda n, a, k: self.b.activation(
                self._label(n), a[0], _ACTIVATION_METHODS[method]
            )
        return {
            "add": lambda n, a, k: self.b.add(self._label(n), a[0], a[1]),
            "add_": lambda n, a, k: self.b.add(self._label(n), a[0], a[1]),
            "mul": lambda n, a, k: self.b.scale(a[0], a[1]),
            "div": lambda n, a, k: self.b.scale(a[0], a[1]),
            "masked_fill": lambda n, a, k: self.b.scale(a[0], a[1]),
            "matmul": lambda n, a, k: self.b.matmul(self._label(n), a[0], a[1], self._in_ps(n)),
            "mean": self._mean,
            "split": self._split,
            "chunk": self._split,
            "unbind": self._split,
        }.get(method)

    def _view(self, node, args, kwargs) -> Value:
        if not isinstance(args[0], Act) and is_data(args[0]):
            return args[0]  # pieces and scores keep their role through reshapes
        return self.b.reshape(self._label(node), args[0], self._in_ps(node), self._out_ps(node))

    def _getattr(self, node, args, kwargs) -> Value:
        if args[1] in _VIEW_ATTRS:
            return self._view(node, args, kwargs)
        return CONST

    def _split(self, node, args, kwargs) -> Value:
        metas = node.meta.get("tensor_meta")
        if hasattr(metas, "shape") or not metas:
            raise Unsupported("a split whose result is not a tuple of tensors")
        shapes = {tuple(m.shape) for m in metas}
        if len(shapes) != 1:
            raise Unsupported("a split into unequal pieces")
        return self.b.split(args[0], len(metas))

    def _getitem(self, node, args, kwargs) -> Value:
        container, index = args[0], args[1]
        if isinstance(container, list):
            return container[index]
        if not isinstance(container, Act):
            if is_data(container):
                raise Unsupported("indexing q, k, v or attention scores")
            return CONST
        ps_in, ps_out = self._in_ps(node), self._out_ps(node)
        if math.prod(ps_in) == math.prod(ps_out):
            return container
        index = index if isinstance(index, tuple) else (index,)
        full = slice(None)
        if (
            len(ps_in) == 2
            and len(index) >= 2
            and index[0] == full
            and isinstance(index[1], int)
            and all(i in (full, Ellipsis) for i in index[2:])
        ):
            return self.b.reduce_positions(self._label(node), container, "picking one position")
        raise Unsupported(f"slicing {index!r} of a {ps_in} tensor (drops elements)")

    def _mean(self, node, args, kwargs) -> Value:
        x = args[0]
        if not isinstance(x, Act):
            return self.b.reduce_positions(self._label(node), x, "a mean")  # raises with the reason
        if math.prod(self._out_ps(node)) != x.shape.channels:
            raise Unsupported("a mean over the feature dim (only over all positions)")
        return self.b.reduce_positions(self._label(node), x, "a mean")

    def _cat(self, node, args, kwargs) -> Value:
        tensors = args[0]
        dim = self._arg(args, kwargs, 1, "dim", 0)
        rank = len(self._meta(node.args[0][0]).shape)
        dim = dim % rank
        feature = {2: 1, 3: 2, 4: 1}.get(rank)
        return self.b.concat(self._label(node), list(tensors), dim == feature)

    def _sdpa(self, node, args, kwargs) -> Value:
        q_ps = self._in_ps(node, 0)
        heads = q_ps[0] if len(q_ps) == 3 else 1
        return self.b.attention(self._label(node), args[0], args[1], args[2], heads)

    def _linear_fn(self, node, args, kwargs) -> Value:
        weight = self._arg(args, kwargs, 1, "weight")
        bias = self._arg(args, kwargs, 2, "bias")
        if not isinstance(weight, Param) or len(weight.shape) != 2:
            raise Unsupported("F.linear with a weight that is not a learned matrix")
        return self.b.linear(
            self._label(node),
            args[0],
            self._in_ps(node),
            weight.shape[0],
            bias is not None,
            key=weight.key,
        )

    def _conv_fn(self, node, args, kwargs) -> Value:
        weight = self._arg(args, kwargs, 1, "weight")
        if not isinstance(weight, Param):
            raise Unsupported("F.conv2d with a weight that is not a parameter")
        bias = self._arg(args, kwargs, 2, "bias")
        stride = self._arg(args, kwargs, 3, "stride", 1)
        padding = self._arg(args, kwargs, 4, "padding", 0)
        dilation = self._arg(args, kwargs, 5, "dilation", 1)
        groups = self._arg(args, kwargs, 6, "groups", 1)
        if isinstance(padding, str):
            raise Unsupported("F.conv2d with string padding")
        pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
        return self.b.conv2d(
            self._label(node),
            args[0],
            self._in_ps(node),
            self._out_ps(node),
            weight.shape[0],
            tuple(weight.shape[2:]),
            pair(stride),
            pair(padding),
            groups,
            bias is not None,
            pair(dilation),
            key=weight.key,
        )

    def _embedding_fn(self, node, args, kwargs) -> Value:
        weight = self._arg(args, kwargs, 1, "weight")
        if not isinstance(weight, Param) or len(weight.shape) != 2:
            raise Unsupported("F.embedding with a table that is not a learned matrix")
        return self.b.embedding(
            self._label(node), args[0], weight.shape[0], weight.shape[1], key=weight.key
        )

    def _layer_norm_fn(self, node, args, kwargs) -> Value:
        shape = self._arg(args, kwargs, 1, "normalized_shape")
        weight, bias = self._arg(args, kwargs, 2, "weight"), self._arg(args, kwargs, 3, "bias")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if len(shape) != 1:
            raise Unsupported(f"layer norm over {shape} (only over the last dim)")
        if (weight is None) != (bias is None):
            raise Unsupported("layer norm with a weight but no bias (or the reverse)")
        return self.b.norm(
            self._label(node),
            args[0],
            "layer",
            shape[0],
            weight is not None,
            key=weight.key if isinstance(weight, Param) else None,
        )

    def _batch_norm_fn(self, node, args, kwargs) -> Value:
        weight, bias = self._arg(args, kwargs, 3, "weight"), self._arg(args, kwargs, 4, "bias")
        if (weight is None) != (bias is None):
            raise Unsupported("batch norm with a weight but no bias (or the reverse)")
        channels = self._in_ps(node)[0]
        return self.b.norm(
            self._label(node),
            args[0],
            "batch",
            channels,
            weight is not None,
            key=weight.key if isinstance(weight, Param) else None,
        )

    def _pool_fn(self, node, args, kwargs, mode: str) -> Value:
        kernel = self._arg(args, kwargs, 1, "kernel_size")
        stride = self._arg(args, kwargs, 2, "stride") or kernel
        padding = self._arg(args, kwargs, 3, "padding", 0)
        ceil_mode = self._arg(args, kwargs, 5 if mode == "max" else 4, "ceil_mode", False)
        if mode == "max" and self._arg(args, kwargs, 4, "dilation", 1) not in (1, (1, 1)):
            raise Unsupported("dilated pooling")
        return self.b.pool(
            self._label(node),
            args[0],
            self._in_ps(node),
            self._out_ps(node),
            mode,
            kernel,
            stride,
            padding,
            bool(ceil_mode),
        )
