"""The importers' entry points for PyTorch and ONNX models (docs/importers.md): they import
their frontend on use (torch and onnx are optional extras).
"""

from __future__ import annotations

from parplan.errors import GraphError
from parplan.models.importers.builder import input_shape_of


def from_torch(
    model, input_shape=None, name=None, *, integer_input=None, capture="auto", kwargs=None
):
    """The layer graph of a PyTorch model (docs/importers.md). Needs the ``[torch]`` extra.

    ``model`` is an ``nn.Module`` (captured here), a ``torch.export.ExportedProgram`` or a
    ``torch.fx.GraphModule`` (used as is, never re-traced). ``input_shape`` is the per-sample
    input shape, without the batch dim: ``(C, H, W)`` for images, ``(seq,)`` for token ids,
    ``(seq, hidden)`` for embedded sequences; ``integer_input`` says the input holds token ids
    (default: a 1-D input of a model with an embedding, or a Hugging Face model whose main
    input is ``input_ids``). ``kwargs`` are passed to the forward call (Hugging Face models get
    ``use_cache=False``).

    ``capture``: ``"export"`` (torch.export on fake tensors; parameters may be on the ``meta``
    device), ``"fx"`` (torch.fx symbolic tracing and one example forward), or ``"auto"``
    (export, and fx if export cannot capture the model). Raises
    :class:`~parplan.errors.GraphError` listing every unsupported operator at its module path,
    or saying where in the model capture failed.
    """
    from parplan.models.importers import torch_export
    from parplan.models.importers.torch_fx import from_torch as from_fx

    torch_export.check_torch()
    import torch

    if isinstance(model, torch.export.ExportedProgram):
        return torch_export.from_exported(model, name or "model", integer_input)
    if isinstance(model, torch.fx.GraphModule) and torch_export.is_aten_graph(model):
        return torch_export.from_exported(model, name or type(model).__name__, integer_input)
    if isinstance(model, torch.fx.GraphModule) or capture == "fx":
        return from_fx(model, input_shape, name=name, integer_input=integer_input)
    from parplan.errors import ConfigError

    if capture not in ("auto", "export"):
        raise ConfigError(f"capture must be 'auto', 'export' or 'fx' (got {capture!r})")
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(
            f"from_torch needs a torch.nn.Module, an ExportedProgram or a GraphModule "
            f"(got {type(model).__name__})"
        )
    name = name or type(model).__name__
    shape = input_shape_of(input_shape, name)
    if integer_input is None:
        integer_input = _takes_ids(model, shape)
    call = dict(kwargs or {})
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", None) is not None and "use_cache" not in call:
        call["use_cache"] = False  # the planned step is training: no key/value cache
    try:
        program = torch_export.capture(model, shape, name, integer_input, call)
    except GraphError as exported:
        if capture == "export" or call:
            raise
        try:
            return from_fx(model, shape, name=name, integer_input=integer_input)
        except GraphError as traced:
            raise GraphError(
                f"{exported}. The torch.fx fallback failed too: "
                f"{str(traced).removeprefix(f'model {name!r}: ')}. Make the forward "
                "exportable (no data-dependent Python control flow), or capture the model "
                "yourself and pass the ExportedProgram"
            ) from None
    return torch_export.from_exported(program, name, integer_input, module=model)


def _takes_ids(model, shape: tuple[int, ...]) -> bool:
    """Token ids: a Hugging Face model whose main input is ``input_ids``, or a 1-D input of a
    model with an embedding table."""
    import torch

    main = getattr(model, "main_input_name", None)
    if main is not None:
        return main == "input_ids"
    return len(shape) == 1 and any(isinstance(m, torch.nn.Embedding) for m in model.modules())


def register_op(name, handler):
    """See :func:`parplan.models.importers.torch_export.register_op` (custom operators)."""
    from parplan.models.importers.torch_export import register_op as impl

    impl(name, handler)


def register_module(cls, handler):
    """See :func:`parplan.models.importers.torch_export.register_module` (custom module classes)."""
    from parplan.models.importers.torch_export import register_module as impl

    impl(cls, handler)


def from_onnx(path_or_model, name=None, **kwargs):
    """See :func:`parplan.models.importers.onnx_import.from_onnx` (imported lazily: onnx is optional)."""
    from parplan.models.importers.onnx_import import from_onnx as impl

    return impl(path_or_model, name=name, **kwargs)
