"""Models read from a spec an importer understands: ``.onnx`` files, ``file.py:factory``,
``hf:`` and ``tv:`` library models (:func:`load_external`, the hook of ``parplan --model``).
"""

from __future__ import annotations

from pathlib import Path

from parplan.costmodel.graph import Graph
from parplan.errors import ConfigError
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
    from parplan.models.importers.hub import load_hub

    hub = load_hub(spec)  # hf:<type>, tv:<name>
    if hub is not None:
        return hub
    text = str(spec)
    path_text = text.rpartition(":")[0] if ".py:" in text else text
    path = Path(path_text)
    if path.suffix.lower() == ".onnx" and ".py:" not in text:
        if not path.is_file():
            raise ConfigError(f"ONNX model '{path}': no such file")
        return from_onnx(path, name=path.stem)
    made = _factory_result(text)
    if made is None:
        return None
    result, path, factory = made
    if isinstance(result, Graph):
        return result
    # Named after the file and the factory: 'models.py:build' is 'models.build', not 'build'.
    return from_torch(result[0], result[1], name=f"{path.stem}.{factory}")


def is_module_spec(spec: str) -> bool:
    """Whether ``spec`` names a PyTorch module (``file.py:factory``, ``hf:``, ``tv:``).

    Example:
        >>> is_module_spec("hf:llama"), is_module_spec("examples/m.py:build"), is_module_spec("vgg16")
        (True, True, False)
    """
    text = str(spec).strip()
    return text[:3].lower() in ("hf:", "tv:") or ".py:" in text


def absolute_spec(spec: str) -> str:
    """``spec`` with the file it names (``file.py:factory``, ``hf:path/config.json``) made
    absolute, so that it reads the same from another folder (a training script's run).

    Example:
        >>> absolute_spec("hf:llama,hidden_size=64"), absolute_spec("vgg16")
        ('hf:llama,hidden_size=64', 'vgg16')
    """
    text = str(spec).strip()
    if ".py:" in text:
        path, _, factory = text.rpartition(":")
        return f"{Path(path).resolve()}:{factory}" if Path(path).is_file() else text
    if text[:3].lower() == "hf:":
        first, sep, rest = text[3:].partition(",")
        if first.endswith(".json") or Path(first).is_dir():
            return f"{text[:3]}{Path(first).resolve()}{sep}{rest}"
    return text


def module_of(spec: str):
    """``(module, input_shape, token_ids)`` of a model spec that names a PyTorch module
    (``file.py:factory``, ``hf:``, ``tv:``), its weights allocated on the CPU and initialised from
    torch's random state; a :class:`ConfigError` for a spec without one (built-in models and
    ``.onnx`` files are graphs). For the training scripts of :mod:`parplan.executor.script`."""
    from parplan.models.importers.api import _takes_ids
    from parplan.models.importers.hub import (
        HUB_PREFIXES,
        hf_model,
        image_size,
        native_image,
        parse_spec,
        torchvision_model,
    )

    text = str(spec).strip()
    if text[:3].lower() in HUB_PREFIXES:
        prefix, name, options = parse_spec(text)
        if prefix == "hf:":
            seq = options.pop("seq", None)
            model, seq = hf_model(name, options, seq, device="cpu")
            return model, (seq,), _takes_ids(model, (seq,))
        image = image_size(text, options["image"]) if "image" in options else native_image(name)
        return torchvision_model(name, device="cpu", image=image), (3, image, image), False
    made = _factory_result(text)
    if made is None or isinstance(made[0], Graph):
        raise ConfigError(
            f"model '{text}' is not a PyTorch module (a file.py:factory returning (module, "
            "input_shape), hf:<type> or tv:<name>): there is nothing for torch to run"
        )
    (model, shape), _, _ = made
    shape = tuple(int(x) for x in shape)
    return model, shape, _takes_ids(model, shape)


def _factory_result(text: str):
    """``(what factory() returned, path, factory)`` for ``path/models.py:factory`` (a Graph or
    an ``(nn.Module, input_shape)`` pair), or None when ``text`` names no Python file."""
    path_text, factory = text, ""
    if ".py:" in text:
        path_text, _, factory = text.rpartition(":")
    path = Path(path_text)
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
    if isinstance(result, Graph) or (isinstance(result, tuple) and len(result) == 2):
        return result, path, factory
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
