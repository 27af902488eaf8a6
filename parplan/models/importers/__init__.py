"""Importers: real models (PyTorch via torch.fx, ONNX) into the layer-graph IR.

- :func:`from_torch` (:mod:`parplan.models.importers.torch_fx`, needs ``pip install -e ".[torch]"``)
  traces an ``nn.Module`` with torch.fx and an example per-sample input shape.
- :func:`from_onnx` (:mod:`parplan.models.importers.onnx_import`, needs ``pip install -e ".[onnx]"``)
  reads an ``.onnx`` file or ``onnx.ModelProto``.

Both frontends translate their operators into calls on one :class:`GraphBuilder`
(:mod:`~parplan.models.importers.builder`), which owns the mapping rules so that the two agree:

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
  the graph is then a :class:`~parplan.costmodel.graph.TiedGraph`.

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

from parplan.models.importers.builder import (
    Act,
    GraphBuilder,
    Param,
    Unsupported,
    input_shape_of,
)
from parplan.models.importers.api import from_onnx, from_torch, register_module, register_op
from parplan.models.importers.external import EXTERNAL_SUFFIXES, load_external

__all__ = [
    "Act",
    "EXTERNAL_SUFFIXES",
    "GraphBuilder",
    "Param",
    "Unsupported",
    "from_onnx",
    "from_torch",
    "input_shape_of",
    "load_external",
    "register_module",
    "register_op",
]
