"""Models from public libraries by name: Hugging Face configurations and torchvision models
(docs/importers.md). Nothing is downloaded: a Hugging Face model is built from its library's
default configuration for the model type (``gpt2`` is GPT-2 small, ``llama`` a Llama-2-7B-size
model, ...) with your overrides, weights on the ``meta`` device, and captured with torch.export.

Specs (``parplan plan --model ...``):

- ``hf:<model type>[,key=value,...]``: e.g. ``hf:gpt2``, ``hf:llama,num_hidden_layers=2``,
  ``hf:mistral,seq=4096``; ``seq`` is the sequence length (default: the model's positions,
  at most 2048); the other keys override the configuration. Needs the ``[hf]`` extra.
- ``hf:path/to/config.json[,key=value,...]`` (or the folder holding it): a real checkpoint's
  configuration (its ``model_type`` and every setting it gives), e.g. Llama-3-8B's; a hub id
  (``meta-llama/...``) needs the network and is refused with that advice.
- ``tv:<name>[,image=N]``: a torchvision classification model, e.g. ``tv:resnet50``,
  ``tv:vit_b_16``, on ``N x N`` images (default: the size torchvision evaluates the model's
  weights at, :func:`native_image`: 224 for most, 299 for Inception V3, 256 for Swin V2);
  needs the ``[vision]`` extra.

Example (skipped without transformers):
    >>> g = load_hub("hf:gpt2,n_layer=2,seq=128")  # doctest: +SKIP
    >>> g.name, g.input_shape  # doctest: +SKIP
    ('hf:gpt2', Shape(channels=1, height=128, width=1))
"""

from __future__ import annotations

import contextlib
import sys
import warnings

from parplan.costmodel.graph import Graph
from parplan.errors import ConfigError, GraphError

__all__ = [
    "DEFAULT_IMAGE",
    "HUB_PREFIXES",
    "hf_model",
    "import_torchvision",
    "load_hub",
    "image_size",
    "native_image",
    "torchvision_model",
]

#: Spec prefixes :func:`load_hub` reads.
HUB_PREFIXES = ("hf:", "tv:")

#: Encoder-only model types: the base model (with its pooler), not a causal LM head.
ENCODERS = frozenset(
    {
        "bert",
        "roberta",
        "xlm-roberta",
        "albert",
        "distilbert",
        "electra",
        "deberta",
        "deberta-v2",
        "mpnet",
        "camembert",
        "ernie",
    }
)

#: Longest default sequence of a Hugging Face model (its own maximum may be far larger).
DEFAULT_MAX_SEQ = 2048


def load_hub(spec: str) -> Graph | None:
    """The graph of a ``hf:`` or ``tv:`` spec, or ``None`` if ``spec`` is neither."""
    text = str(spec).strip()
    prefix = text[:3].lower()
    if prefix not in HUB_PREFIXES:
        return None
    name, options = _parse(text[3:], text)
    try:
        import torch  # noqa: F401  (the libraries build their models with it)
    except ImportError:
        extra = "hf" if prefix == "hf:" else "vision"
        raise ConfigError(
            f"model '{text}' is built with torch, which is not installed: "
            f'pip install -e ".[{extra}]"'
        ) from None
    from parplan.models.importers.api import from_torch

    if prefix == "hf:":
        seq = options.pop("seq", None)
        model, seq = hf_model(name, options, seq)
        encoder = " (encoder)" if _encoder_only(model) else ""
        shape, integer = _input_of(model, seq)
        if _position_limit(model.config) is None and shape == (seq,) and seq > PROBE_SEQ:
            _probe(model, name, encoder, seq, integer)
        graph = from_torch(model, shape, name=f"hf:{name}{encoder}", integer_input=integer)
        _check_all_parameters_used(graph, model, text)
        return graph
    image = options.pop("image", None)
    if options:
        raise ConfigError(
            f"model '{text}': torchvision models take only image=<size> (got {', '.join(options)})"
        )
    image = native_image(name) if image is None else image_size(text, image)
    model = torchvision_model(name, image=image)
    return from_torch(model, (3, image, image), name=f"tv:{name}")


#: Positions at which a model without a position limit is imported first (:func:`_probe`).
PROBE_SEQ = 16


def _position_limit(config) -> int | None:
    """The most positions a Hugging Face configuration takes, or None where it names none (a
    recurrent model such as Mamba)."""
    return next(
        (
            getattr(config, k)
            for k in ("max_position_embeddings", "n_positions", "n_ctx")
            if isinstance(getattr(config, k, None), int)
        ),
        None,
    )


def _probe(model, name: str, encoder: str, seq: int, integer: bool) -> None:
    """Import ``model`` at :data:`PROBE_SEQ` positions first. A model without a position limit
    may step through its positions in Python (Mamba's selective scan: one traced step per
    position and layer, so 2,048 positions took more than 5 minutes to trace); what the importer
    cannot map then fails in seconds, not after that trace. The error says where it was found."""
    from parplan.models.importers.api import from_torch

    try:
        from_torch(model, (PROBE_SEQ,), name=f"hf:{name}{encoder}", integer_input=integer)
    except GraphError as exc:
        raise GraphError(
            f"{exc} (found in a first import at seq={PROBE_SEQ}: the model names no position "
            f"limit and may trace one step per position, so the {seq} positions asked for were "
            "not traced)"
        ) from None


def _input_of(model, seq: int) -> tuple[tuple[int, ...], bool]:
    """(per-sample input shape, integer?) of a Hugging Face model: token ids of ``seq``
    positions, or a speech encoder's mel features (Whisper: bins x twice its positions)."""
    import inspect

    first = next(iter(inspect.signature(model.forward).parameters), "")
    config = getattr(model, "config", None)
    if first == "input_features" and hasattr(config, "num_mel_bins"):
        return (int(config.num_mel_bins), 2 * int(config.max_source_positions)), False
    return (seq,), True


def _encoder_only(model) -> bool:
    """Whether ``model`` is the encoder of an encoder-decoder model (what :func:`hf_model`
    builds for one: the IR has no cross-attention)."""
    return type(model).__name__.endswith(("Encoder", "EncoderModel"))


def _check_all_parameters_used(graph: Graph, model, text: str) -> None:
    """A graph that plans fewer parameters than the model holds is a wrong answer (the others
    still take memory and optimizer state): refuse it, naming what the forward never read
    (e.g. a decoder's cross-attention when no encoder feeds it)."""
    total = sum(p.numel() for p in model.parameters())
    planned = graph.parameter_count()
    if planned >= total:
        return
    raise ConfigError(
        f"model '{text}': its forward reads {planned:,} of the model's {total:,} parameters, so "
        "a plan would leave the rest out (a decoder's cross-attention without its encoder, an "
        "unused head); parplan does not plan part of a model"
    )


def parse_spec(spec: str) -> tuple[str, str, dict]:
    """(``"hf:"`` or ``"tv:"``, name, options) of a hub spec such as ``hf:llama,hidden_size=64,seq=128``
    (option values as numbers or booleans where they read as such)."""
    text = str(spec).strip()
    prefix = text[:3].lower()
    if prefix not in HUB_PREFIXES:
        raise ConfigError(f"model '{text}': expected hf:<model type> or tv:<name>")
    return (prefix, *_parse(text[3:], text))


def _parse(body: str, text: str) -> tuple[str, dict]:
    parts = [p.strip() for p in body.split(",") if p.strip()]
    if not parts:
        raise ConfigError(
            f"model '{text}': name a model after the prefix, e.g. hf:gpt2 or tv:resnet50"
        )
    options = {}
    for part in parts[1:]:
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"model '{text}': options are key=value (got '{part}')")
        options[key.strip()] = _value(value.strip())
    return parts[0], options


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def import_torchvision():
    """``import torchvision``, also where its compiled operators do not match the installed torch
    (a CUDA build of torchvision next to torch's CPU build: the models are plain Python, only
    detection operators such as ``nms`` need the extension, and those are left unregistered)."""
    try:
        import torchvision
    except ModuleNotFoundError:
        raise ConfigError(
            'torchvision is not installed; install the optional extra with pip install -e ".[vision]"'
        ) from None
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
        import torch.library

        for key in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[key]
        register = torch.library.register_fake
        torch.library.register_fake = lambda *a, **k: lambda f: f
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import torchvision
        finally:
            torch.library.register_fake = register
    return torchvision


def image_size(text: str, value) -> int:
    """``image=`` of spec ``text`` as a number of pixels (a clear error for anything else)."""
    try:
        size = int(str(value))
    except ValueError:
        size = 0
    if size <= 0:
        raise ConfigError(
            f"model '{text}': image must be a whole number of pixels > 0 (got {value!r})"
        )
    return size


#: Image size of a torchvision model without published weights to say its own.
DEFAULT_IMAGE = 224


def native_image(name: str) -> int:
    """The image size torchvision evaluates model ``name``'s default weights at (their
    transform's crop: 299 for Inception V3, 256 for Swin V2, whose 8 x 8 windows tile it and
    not 224), :data:`DEFAULT_IMAGE` for a model without weights."""
    tv = import_torchvision()
    try:
        weights = tv.models.get_model_weights(name).DEFAULT
        return int(weights.transforms.keywords["crop_size"])
    except (ValueError, AttributeError, KeyError, TypeError):
        return DEFAULT_IMAGE


def torchvision_model(name: str, device: str = "meta", image: int | None = None):
    """A torchvision model by name, random weights on ``device`` (``meta``: nothing allocated).
    ``image``: the image size it will read, where its builder fixes one (a vision transformer's
    position table: ViT-H/14's weights are for 518 pixels, its builder without them for 224)."""
    import torch

    tv = import_torchvision()
    try:
        builder = tv.models.get_model_builder(name)
    except ValueError:
        names = ", ".join(sorted(tv.models.list_models(tv.models))[:12])
        raise ConfigError(f"torchvision has no model '{name}' (e.g. {names}, ...)") from None
    sized = {}
    if image is not None and "image_size" in _builder_options(builder):
        sized = {"image_size": int(image)}
    try:
        with torch.device(device):
            return builder(weights=None, **sized)
    except (NotImplementedError, RuntimeError):
        # a few builders compute sizes from tensors' values (regnet): build those on the CPU,
        # and where the caller asked for no values (meta) without drawing the initial weights
        # (RegNet-Y-128GF: 9.2 s of random numbers for 644 M parameters the importer never reads)
        if device != "meta":
            return builder(weights=None, **sized)
        with _weights_not_drawn():
            return builder(weights=None, **sized)


def _builder_options(builder) -> set[str]:
    """The keyword options a torchvision builder passes on to its model class (``**kwargs``:
    the class's own parameters)."""
    import inspect

    model_class = inspect.signature(builder).return_annotation
    if isinstance(model_class, str):  # a postponed annotation
        model_class = getattr(inspect.getmodule(builder), model_class, None)
    try:
        return set(inspect.signature(model_class).parameters)
    except (TypeError, ValueError):
        return set()


@contextlib.contextmanager
def _weights_not_drawn():
    """``torch.nn.init``'s in-place initialisers as no-ops: tensors keep what they were
    allocated with (their shapes are all a graph import reads)."""
    import torch.nn.init as init

    names = [n for n in dir(init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(init, n) for n in names}
    try:
        for n in names:
            setattr(init, n, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for n, f in saved.items():
            setattr(init, n, f)


def _local_config(spec: str) -> tuple[str, dict] | None:
    """(model type, settings) of a local ``config.json`` (the file, or a folder holding one), or
    None when ``spec`` names no such file."""
    import json
    from pathlib import Path

    path = Path(spec)
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.suffix.lower() != ".json":
        return None
    if not path.is_file():
        raise ConfigError(f"model 'hf:{spec}': no such file")
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model 'hf:{spec}': not a JSON configuration ({exc})") from None
    if not isinstance(settings, dict) or not isinstance(settings.get("model_type"), str):
        raise ConfigError(
            f"model 'hf:{spec}': a Hugging Face config.json names its \"model_type\" (this one does not)"
        )
    settings = dict(settings)
    model_type = settings.pop("model_type")
    for key in ("architectures", "transformers_version", "_name_or_path", "torch_dtype"):
        settings.pop(key, None)  # records of the checkpoint, not the architecture
    return model_type, settings


def _read_by_model(config, key: str) -> bool:
    """Whether the library's modeling code of ``config``'s model reads ``key`` from its
    configuration though the configuration class does not declare it (DeBERTa's
    ``position_buckets``: ``getattr(config, "position_buckets", -1)``); a key it does not read
    is a typo and stays refused."""
    import importlib
    import inspect
    import re

    name = type(config).__module__.replace(".configuration_", ".modeling_")
    try:
        source = inspect.getsource(importlib.import_module(name))
    except (ImportError, OSError, TypeError):
        return False
    word = re.escape(key)  # a whole name: "hidden" is not read by reading "hidden_size"
    return re.search(rf"""config, ["']{word}["']|config\.{word}\b""", source) is not None


def hf_model(
    model_type: str, overrides: dict | None = None, seq: int | None = None, device: str = "meta"
):
    """(model, seq): a Hugging Face model of ``model_type`` from its default configuration with
    ``overrides``, weights on ``device`` (``meta``: nothing allocated); a causal LM where the
    type is a decoder (its head included), else the base model (BERT-like encoders with their
    pooler; encoder-decoder models such as T5 and BART: the encoder, since the IR has no
    cross-attention)."""
    import torch

    if "torchvision" not in sys.modules:
        try:
            import_torchvision()  # transformers imports it when installed: make that import work
        except ConfigError:
            pass
    try:
        import transformers
    except ModuleNotFoundError:
        raise ConfigError(
            'transformers is not installed; install the optional extra with pip install -e ".[hf]"'
        ) from None
    local = _local_config(model_type)
    if (
        local is not None
    ):  # a checkpoint's own config.json: its model type and every setting it gives
        model_type, settings = local
    elif "/" in model_type:
        raise ConfigError(
            f"model 'hf:{model_type}': a Hugging Face hub id needs the network, which parplan does "
            "not use; download the model's config.json and give its path: hf:path/to/config.json"
        )
    else:
        settings = {}
    try:
        config = transformers.AutoConfig.for_model(model_type, **settings)
    except ValueError:
        raise ConfigError(
            f"transformers has no model type '{model_type}' (e.g. gpt2, bert, llama, mistral, "
            "mixtral, t5, qwen2)"
        ) from None
    for key, value in (overrides or {}).items():
        if not hasattr(config, key) and not _read_by_model(config, key):
            raise ConfigError(f"model 'hf:{model_type}': its configuration has no '{key}'")
        setattr(config, key, value)
    limit = _position_limit(config)
    positions = DEFAULT_MAX_SEQ if limit is None else limit
    seq = int(seq) if seq is not None else min(positions, DEFAULT_MAX_SEQ)
    if seq <= 0:
        raise ConfigError(f"model 'hf:{model_type}': seq must be positive (got {seq})")
    try:
        with torch.device(device), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if model_type == "t5":
                return transformers.T5EncoderModel(config), seq
            if getattr(config, "is_encoder_decoder", False):
                # the IR has no cross-attention: the encoder (BART, Marian, ...), as for T5
                return transformers.AutoModel.from_config(config).get_encoder(), seq
            if model_type in ENCODERS:
                return transformers.AutoModel.from_config(config), seq
            try:
                return transformers.AutoModelForCausalLM.from_config(config), seq
            except ValueError:
                return transformers.AutoModel.from_config(config), seq
    except Exception as exc:  # the library rejects this configuration; say so in one line
        raise ConfigError(
            f"model 'hf:{model_type}': transformers cannot build it with these options "
            f"({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); "
            "check the overrides (e.g. token ids such as pad_token_id must fit vocab_size)"
        ) from None
