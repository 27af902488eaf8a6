"""Models read from a spec an importer understands: ``.onnx`` files, ``file.py:factory``,
``hf:`` and ``tv:`` library models (:func:`load_external`, the hook of ``parplan --model``).
"""

from __future__ import annotations

from parplan.costmodel.graph import Graph
from parplan.models.importers.api import from_onnx, from_torch


#: File suffixes :func:`load_external` reads.
EXTERNAL_SUFFIXES = (".onnx", ".py")


def load_external(spec) -> Graph | None:
    """A model an importer reads from ``spec``, or ``None`` if ``spec`` is not one.

    - ``path/model.onnx``: :func:`from_onnx` (graph named after the file);
    - ``hf:<model type>[,key=value...]`` / ``tv:<name>``: a Hugging Face or torchvision model
      built from its library (:mod:`parplan.models.importers.hub`);
    - ``path/models.py:factory``: imports the file and calls ``factory()``, which returns a
      :class:`Graph` or an ``(nn.Module, input_shape)`` pair (then :func:`from_torch`, named
      ``<file stem>.<factory>``).

    This is the hook of :func:`parplan.models.modelfile.load_model` for ``parplan plan --model``.

    Example:
        >>> load_external("resnet50") is None
        True
    """
    from pathlib import Path

    from parplan.errors import ConfigError
    from parplan.models.importers.hub import load_hub

    hub = load_hub(spec)  # hf:<type>, tv:<name>
    if hub is not None:
        return hub
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
        raise ConfigError(
            f"model '{text}': name the factory function after the file, e.g. '{path}:build_model'"
        )
    if not path.is_file():
        raise ConfigError(f"model '{text}': no such file '{path}'")
    import importlib.util

    module_spec = importlib.util.spec_from_file_location(f"parplan_user_model_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)  # the user's own file, named on the command line
    except Exception as exc:  # the user's code: one line saying what and where, no traceback
        raise ConfigError(
            f"model '{text}': importing '{path}' failed: {_user_error(exc)}"
        ) from None
    build = getattr(module, factory, None)
    if not callable(build):
        raise ConfigError(f"model '{text}': '{path}' has no function '{factory}'")
    try:
        result = build()
    except Exception as exc:
        raise ConfigError(f"model '{text}': {factory}() raised {_user_error(exc)}") from None
    if isinstance(result, Graph):
        return result
    if isinstance(result, tuple) and len(result) == 2:
        # Named after the file and the factory: 'models.py:build' is 'models.build', not 'build'.
        return from_torch(result[0], result[1], name=f"{path.stem}.{factory}")
    raise ConfigError(
        f"model '{text}': {factory}() must return a parplan Graph or an (nn.Module, input_shape) pair "
        f"(got {type(result).__name__})"
    )


def _user_error(exc: BaseException) -> str:
    """One line for an error raised by a user's model file: its type, message and line."""
    import traceback

    if isinstance(exc, ImportError) and (exc.name or "").split(".")[0] in (
        "torch",
        "torchvision",
        "transformers",
    ):
        return f'it imports {exc.name}, which is not installed (pip install -e ".[torch]")'
    if isinstance(exc, SyntaxError):
        return f"SyntaxError at line {exc.lineno}: {exc.msg}"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (line {frames[-1].lineno} of {frames[-1].filename})" if frames else ""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}{where}"
