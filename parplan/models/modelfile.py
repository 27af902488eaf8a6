"""Networks described without code: model files (TOML / JSON) and layer tables (CSV / text).

**Model files** (``.toml``, ``.json``) describe any layer DAG. Top-level keys: ``name``
(default: the file's stem), ``input = [C, H, W]`` (or ``[C]`` for a feature vector),
optional ``description`` (ignored) and a list of layers, ``[[layer]]`` in TOML (``"layer"``
or ``"layers"`` in JSON). Every layer has a ``name``, a ``type`` and optionally ``inputs``
(a list of layer names, ``"input"`` = graph input; default: the previous layer, or
``"input"`` for the first one), plus the attributes of its type:

=================================  =========================================================
type (aliases)                     attributes (defaults as in :mod:`parplan.costmodel.graph`)
=================================  =========================================================
conv (conv2d)                      out_channels, kernel, stride, padding, groups, bias
linear (fc)                        out_features, bias
pool (maxpool, avgpool)            mode ("max"/"avg"), kernel, stride, padding, ceil_mode,
                                   output_size (adaptive pooling)
act (relu, dropout, tanh, gelu,    function
sigmoid)
norm (batchnorm, layernorm)        kind ("batch"/"layer"), affine
flatten, add, concat               (none)
=================================  =========================================================

``kernel``, ``stride``, ``padding`` and ``output_size`` take an int or ``[h, w]``; they are
stored as ``(h, w)`` tuples. An alias fixes one attribute (``maxpool`` means ``mode =
"max"``). Mistakes in the description raise :class:`~parplan.errors.GraphError` naming the
layer, the key and the valid ones; an unreadable file raises
:class:`~parplan.errors.ConfigError`. Example (``examples/tiny_resnet.toml`` is a full one):

    >>> g = loads_model_toml('''
    ... name = "tiny"
    ... input = [3, 32, 32]
    ... [[layer]]
    ... name = "conv1"
    ... type = "conv"
    ... out_channels = 8
    ... kernel = 3
    ... padding = 1
    ... [[layer]]
    ... name = "relu1"
    ... type = "relu"
    ... [[layer]]
    ... name = "add"
    ... type = "add"
    ... inputs = ["conv1", "relu1"]
    ... ''')
    >>> g.layer("conv1").kernel, g.layer("add").inputs
    ((3, 3), ('conv1', 'relu1'))
    >>> g.analyze().out_shape["add"]
    Shape(channels=8, height=32, width=32)

**Layer tables** (``.csv``, or a whitespace-separated ``.txt``) are the form the AccPar and
HyPar papers list networks in: one row per weighted layer of a chain, columns
``name, type, in_channels, out_channels, in_h, in_w, out_h, out_w, kernel`` (type ``conv``
or ``fc``; kernel = square kernel size; fc rows use 1 for kernel and sizes). A header row
(first field ``name``) is optional and may reorder the columns; ``#`` starts a comment.
:func:`load_layer_table` rebuilds a chain graph:

- a conv row becomes a :class:`Conv2d` whose stride is the one closest to in/out and whose
  padding is the smallest (at most kernel // 2) that maps ``in_h x in_w`` to ``out_h x out_w``;
- where a row's input size is smaller than the previous output, a max :class:`Pool2d`
  (named ``<previous>.pool``) bridges them: stride = in // out, window stride + 1
  (overlapping, as AlexNet) when that fits, else the stride (as VGG);
- an fc row after a conv gets a :class:`Flatten` (``<row>.flatten``). Its in_channels is
  either C*H*W of the previous output with in_h = in_w = 1, or C with in_h x in_w the
  (possibly pooled) spatial size; C*h*w with in_h = in_w = 1 also pools to h x w first.

Rows that do not chain (channel mismatch, a size that no stride/padding or pooling
produces) raise :class:`~parplan.errors.GraphError` naming the row:

    >>> t = load_layer_table('''
    ... name, type, in_channels, out_channels, in_h, in_w, out_h, out_w, kernel
    ... conv1, conv, 3,  64, 224, 224, 55, 55, 11
    ... conv2, conv, 64, 192, 27, 27,  27, 27, 5
    ... fc1,   fc,   6912, 10, 1, 1,    1,  1,  1
    ... ''')
    >>> [layer.name for layer in t.layers]
    ['conv1', 'conv1.pool', 'conv2', 'conv2.pool', 'fc1.flatten', 'fc1']
    >>> t.layer("conv1").stride, t.layer("conv1").padding, t.layer("conv1.pool").kernel
    ((4, 4), (2, 2), (3, 3))
    >>> t.analyze().out_shape["conv2.pool"]
    Shape(channels=192, height=6, width=6)

:func:`load_model` accepts either a zoo name (:mod:`parplan.models.zoo`) or a path to any of these
files.
"""

from __future__ import annotations

import csv
import dataclasses
import difflib
import io
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from parplan.models import zoo
from parplan.costmodel.graph import (
    INPUT,
    MAX_EXTENT,
    Activation,
    Add,
    Concat,
    Conv2d,
    Flatten,
    Slice,
    Graph,
    Layer,
    Linear,
    Norm,
    Pool2d,
    Resize,
    Shape,
)
from parplan.errors import ConfigError, GraphError
from parplan.readers import parse_json, parse_toml, read_text

__all__ = [
    "LAYER_TYPES",
    "MODEL_FILE_SUFFIXES",
    "TABLE_COLUMNS",
    "dumps_model_toml",
    "graph_from_dict",
    "graph_to_dict",
    "load_layer_table",
    "load_model",
    "load_model_file",
    "loads_model_toml",
    "save_model_file",
]

#: Suffixes :func:`load_model_file` and :func:`load_model` accept.
MODEL_FILE_SUFFIXES = (".toml", ".json", ".csv", ".txt")

#: Type name (lower case) -> (layer class, attribute the alias fixes).
LAYER_TYPES: dict[str, tuple[type[Layer], dict[str, str]]] = {
    "conv": (Conv2d, {}),
    "conv2d": (Conv2d, {}),
    "linear": (Linear, {}),
    "fc": (Linear, {}),
    "pool": (Pool2d, {}),
    "maxpool": (Pool2d, {"mode": "max"}),
    "avgpool": (Pool2d, {"mode": "avg"}),
    "act": (Activation, {}),
    "relu": (Activation, {"function": "relu"}),
    "dropout": (Activation, {"function": "dropout"}),
    "tanh": (Activation, {"function": "tanh"}),
    "gelu": (Activation, {"function": "gelu"}),
    "sigmoid": (Activation, {"function": "sigmoid"}),
    "norm": (Norm, {}),
    "batchnorm": (Norm, {"kind": "batch"}),
    "layernorm": (Norm, {"kind": "layer"}),
    "flatten": (Flatten, {}),
    "slice": (Slice, {}),
    "add": (Add, {}),
    "concat": (Concat, {}),
}

#: Canonical type name written by :func:`graph_to_dict`.
_CANONICAL_TYPE: dict[type[Layer], str] = {
    Conv2d: "conv",
    Linear: "linear",
    Pool2d: "pool",
    Activation: "act",
    Norm: "norm",
    Flatten: "flatten",
    Slice: "slice",
    Add: "add",
    Concat: "concat",
}

_PAIR_ATTRS = {"kernel", "stride", "padding", "output_size"}
_INT_ATTRS = {"out_channels", "out_features", "groups", "start", "stop"}
_BOOL_ATTRS = {"bias", "ceil_mode", "affine", "causal"}
_STR_ATTRS = {"mode", "function", "kind"}
_LAYER_KEYS = ("name", "type", "inputs")
_TOP_KEYS = ("name", "input", "layer", "layers", "description")


def _attrs_of(cls: type[Layer]) -> tuple[str, ...]:
    """Init attributes of a layer class besides name and inputs."""
    return tuple(
        f.name for f in dataclasses.fields(cls) if f.init and f.name not in ("name", "inputs")
    )


def _hint(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


# --------------------------------------------------------------------------- model files


def graph_from_dict(
    data: Mapping[str, Any], *, default_name: str = "model", source: str = "model"
) -> Graph:
    """Build and check a :class:`Graph` from a parsed model description (see the module doc).

    ``source`` prefixes every error message (e.g. the file path). Raises
    :class:`~parplan.errors.GraphError` for a bad description or a graph that does not analyze.

    Example:
        >>> g = graph_from_dict({"input": [784], "layer": [{"name": "fc", "type": "fc", "out_features": 10}]})
        >>> g.parameter_count()
        7850
        >>> graph_from_dict({"input": [784], "layer": [{"name": "fc", "type": "fc", "outfeatures": 10}]})
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        parplan.errors.GraphError: model: layer 'fc': unknown key 'outfeatures' for type 'fc' (did you mean ...
    """
    if not isinstance(data, Mapping):
        raise GraphError(
            f"{source}: a model description must be a table/object (got {type(data).__name__})"
        )
    for key in data:
        if key not in _TOP_KEYS:
            raise GraphError(
                f"{source}: unknown top-level key '{key}'{_hint(key, _TOP_KEYS)}; valid keys: {', '.join(_TOP_KEYS)}"
            )
    if "layer" in data and "layers" in data:
        raise GraphError(
            f"{source}: give the layer list once, as 'layer' or as 'layers' (got both)"
        )
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise GraphError(f"{source}: 'name' must be a non-empty string (got {name!r})")
    input_shape = _input_shape(data.get("input"), source)
    raw_layers = data.get("layer", data.get("layers"))
    if not isinstance(raw_layers, list) or not raw_layers:
        raise GraphError(
            f"{source}: needs a non-empty list of layers ('[[layer]]' tables in TOML, \"layer\": [...] in JSON)"
        )
    layers = []
    previous = INPUT
    for index, raw in enumerate(raw_layers):
        layer = _layer_from_dict(raw, previous, index, source)
        layers.append(layer)
        previous = layer.name
    graph = Graph(name, input_shape, tuple(layers))
    try:
        graph.analyze()
    except GraphError as exc:
        raise GraphError(f"{source}: {exc}") from None
    return graph


def _input_shape(value: Any, source: str) -> Shape:
    ok = (
        isinstance(value, list)
        and len(value) in (1, 3)
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    )
    if not ok:
        raise GraphError(
            f"{source}: 'input' must be [C, H, W] (or [C]) of positive ints (got {value!r})"
        )
    return Shape(*value)


def _layer_from_dict(raw: Any, previous: str, index: int, source: str) -> Layer:
    if not isinstance(raw, Mapping):
        raise GraphError(f"{source}: layer #{index + 1} must be a table/object (got {raw!r})")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise GraphError(
            f"{source}: layer #{index + 1} needs a non-empty string 'name' (got {name!r})"
        )
    where = f"{source}: layer '{name}'"
    kind = raw.get("type")
    if not isinstance(kind, str) or kind.lower() not in LAYER_TYPES:
        shown = f"'{kind}'" if isinstance(kind, str) else repr(kind)
        hint = _hint(kind.lower(), LAYER_TYPES) if isinstance(kind, str) else ""
        what = "missing 'type'" if kind is None else f"unknown type {shown}{hint}"
        raise GraphError(f"{where}: {what}; valid types: {', '.join(LAYER_TYPES)}")
    cls, fixed = LAYER_TYPES[kind.lower()]
    valid = _attrs_of(cls)
    attrs: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _LAYER_KEYS:
            continue
        if key not in valid:
            keys = ", ".join(_LAYER_KEYS + valid)
            raise GraphError(
                f"{where}: unknown key '{key}' for type '{kind}'{_hint(key, valid)}; valid keys: {keys}"
            )
        attrs[key] = _attr_value(where, key, value)
    for key, value in fixed.items():
        if key in attrs and attrs[key] != value:
            raise GraphError(
                f"{where}: type '{kind}' means {key} = '{value}' (got '{attrs[key]}'); "
                f"use type '{_CANONICAL_TYPE[cls]}' with {key} = '{attrs[key]}'"
            )
        attrs[key] = value
    inputs = raw.get("inputs", [previous])
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs or not all(isinstance(i, str) for i in inputs):
        raise GraphError(
            f"{where}: 'inputs' must be a non-empty list of layer names (got {inputs!r})"
        )
    return cls(name, tuple(inputs), **attrs)


def _attr_value(where: str, key: str, value: Any) -> Any:
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if key in _PAIR_ATTRS:
        if is_int(value):
            return (value, value)
        if isinstance(value, list) and len(value) == 2 and all(is_int(v) for v in value):
            return tuple(value)
        raise GraphError(f"{where}: {key} must be an int or a pair [h, w] of ints (got {value!r})")
    if key in _INT_ATTRS and not is_int(value):
        raise GraphError(f"{where}: {key} must be an int (got {value!r})")
    if key in _BOOL_ATTRS and not isinstance(value, bool):
        raise GraphError(f"{where}: {key} must be true or false (got {value!r})")
    if key in _STR_ATTRS and not isinstance(value, str):
        raise GraphError(f"{where}: {key} must be a string (got {value!r})")
    return value


def graph_to_dict(graph: Graph) -> dict[str, Any]:
    """The model description of ``graph`` (inverse of :func:`graph_from_dict`).

    Attributes equal to the layer's default and ``inputs`` equal to "the previous layer" are
    left out; tuples become lists, so the result is JSON- and TOML-ready.

    Example:
        >>> d = graph_to_dict(zoo.lenet_c())
        >>> d["input"], d["layer"][0]
        ([1, 28, 28], {'name': 'conv1', 'type': 'conv', 'out_channels': 20, 'kernel': [5, 5]})
        >>> graph_from_dict(d) == zoo.lenet_c()
        True
    """
    s = graph.input_shape
    layers = []
    previous = INPUT
    for layer in graph.layers:
        entry: dict[str, Any] = {"name": layer.name, "type": _CANONICAL_TYPE[type(layer)]}
        if layer.inputs != (previous,):
            entry["inputs"] = list(layer.inputs)
        for f in dataclasses.fields(layer):
            if not f.init or f.name in ("name", "inputs"):
                continue
            value = getattr(layer, f.name)
            if value != f.default:
                entry[f.name] = list(value) if isinstance(value, tuple) else value
        layers.append(entry)
        previous = layer.name
    return {"name": graph.name, "input": [s.channels, s.height, s.width], "layer": layers}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def dumps_model_toml(graph: Graph) -> str:
    """``graph`` as model-file TOML text (read back by :func:`loads_model_toml`).

    Example:
        >>> print(dumps_model_toml(zoo.sfc()).splitlines()[:6])
        ['name = "sfc"', 'input = [1, 28, 28]', '', '[[layer]]', 'name = "flatten"', 'type = "flatten"']
    """
    d = graph_to_dict(graph)
    lines = [f"name = {_toml_value(d['name'])}", f"input = {_toml_value(d['input'])}"]
    for entry in d["layer"]:
        lines += ["", "[[layer]]"] + [f"{k} = {_toml_value(v)}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"


def loads_model_toml(text: str, *, source: str = "model") -> Graph:
    """Parse model-file TOML text; ``source`` names it in error messages."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    return graph_from_dict(data, source=source)


def save_model_file(graph: Graph, path: str | Path) -> Path:
    """Write ``graph`` as a ``.toml`` or ``.json`` model file; returns the path."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".toml":
        path.write_text(dumps_model_toml(graph), encoding="utf-8")
    elif suffix == ".json":
        path.write_text(json.dumps(graph_to_dict(graph), indent=2) + "\n", encoding="utf-8")
    else:
        raise ConfigError(
            f"cannot write model file '{path}': suffix must be .toml or .json (got '{suffix}')"
        )
    return path


def load_model_file(path: str | Path) -> Graph:
    """Load a model file, dispatching on its suffix.

    ``.toml`` / ``.json``: a model description (see the module doc); the graph's name defaults
    to the file's stem. ``.csv`` / ``.txt``: a layer table (:func:`load_layer_table`).
    Raises :class:`~parplan.errors.ConfigError` for a missing file, another suffix or a syntax
    error, :class:`~parplan.errors.GraphError` for a bad description; messages start with the path.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in MODEL_FILE_SUFFIXES:
        raise ConfigError(
            f"model file '{path}': unsupported suffix '{suffix}'; use one of {', '.join(MODEL_FILE_SUFFIXES)}"
        )
    if not path.exists():
        raise ConfigError(f"model file '{path}': no such file")
    if suffix in (".csv", ".txt"):
        return load_layer_table(path)
    source = f"model file '{path}'"
    text = read_text(path, "model file")
    data = parse_toml(text, source) if suffix == ".toml" else parse_json(text, source)
    return graph_from_dict(data, default_name=path.stem, source=source)


# --------------------------------------------------------------------------- layer tables

#: Column order of a layer table without a header row.
TABLE_COLUMNS = (
    "name",
    "type",
    "in_channels",
    "out_channels",
    "in_h",
    "in_w",
    "out_h",
    "out_w",
    "kernel",
)
#: Optional columns (a header row must name them): ``link`` (``chain``, the default, or
#: ``resize``) and ``shortcut`` (an earlier row's name, or empty / ``-``).
OPTIONAL_COLUMNS = ("link", "shortcut")
_LINKS = ("chain", "resize")
_TABLE_TYPES = {"conv": "conv", "conv2d": "conv", "fc": "fc", "linear": "fc"}


@dataclass(frozen=True)
class _Row:
    """One weighted layer of a layer table; ``where`` names it in error messages."""

    where: str
    name: str
    kind: str
    in_channels: int
    out_channels: int
    in_h: int
    in_w: int
    out_h: int
    out_w: int
    kernel: int
    link: str = "chain"
    shortcut: str | None = None


def _read_text(path_or_text: str | Path) -> tuple[str, str, str]:
    """(text, source for messages, default graph name)."""
    if isinstance(path_or_text, Path):
        if not path_or_text.exists():
            raise ConfigError(f"layer table '{path_or_text}': no such file")
        return (
            read_text(path_or_text, "layer table"),
            f"layer table '{path_or_text}'",
            path_or_text.stem,
        )
    text = str(path_or_text)
    if "\n" not in text and Path(text).is_file():
        return _read_text(Path(text))
    if "\n" in text or "," in text or len(text.split()) >= len(TABLE_COLUMNS):
        return text, "layer table", "layer_table"
    raise ConfigError(f"layer table '{text}': no such file (pass a path or the table's text)")


def _parse_rows(text: str, source: str) -> list[_Row]:
    lines = [
        (i, line.split("#", 1)[0].strip()) for i, line in enumerate(text.splitlines(), start=1)
    ]
    lines = [(i, line) for i, line in lines if line]
    comma = any("," in line for _, line in lines)
    fields_per_line = []
    for lineno, line in lines:
        if comma:
            fields = [f.strip() for f in next(csv.reader(io.StringIO(line)))]
        else:
            fields = line.split()
        fields_per_line.append((lineno, fields))
    columns = TABLE_COLUMNS
    if fields_per_line and fields_per_line[0][1] and fields_per_line[0][1][0].lower() == "name":
        lineno, header = fields_per_line.pop(0)
        header = [h.lower() for h in header]
        required = [h for h in header if h not in OPTIONAL_COLUMNS]
        if sorted(required) != sorted(TABLE_COLUMNS) or len(set(header)) != len(header):
            raise GraphError(
                f"{source}: header (line {lineno}) must name the columns {', '.join(TABLE_COLUMNS)} "
                f"once each, optionally also {' and '.join(OPTIONAL_COLUMNS)} (got {', '.join(header)})"
            )
        columns = tuple(header)
    if not fields_per_line:
        raise GraphError(f"{source}: has no rows; columns are {', '.join(TABLE_COLUMNS)}")
    rows = []
    for number, (lineno, fields) in enumerate(fields_per_line, start=1):
        name = (
            fields[columns.index("name")]
            if len(fields) == len(columns)
            else (fields[0] if fields else "?")
        )
        where = f"{source}: row {number} '{name}' (line {lineno})"
        if len(fields) != len(columns):
            raise GraphError(
                f"{where}: expected {len(columns)} fields ({', '.join(columns)}), got {len(fields)}"
            )
        value = dict(zip(columns, fields))
        kind = value["type"].lower()
        if kind not in _TABLE_TYPES:
            raise GraphError(f"{where}: type must be conv or fc (got '{value['type']}')")
        numbers = {}
        for key in TABLE_COLUMNS[2:]:
            try:
                numbers[key] = int(value[key])
            except ValueError:
                raise GraphError(
                    f"{where}: {key} must be a positive int (got '{value[key]}')"
                ) from None
            if not 0 < numbers[key] <= MAX_EXTENT:
                raise GraphError(
                    f"{where}: {key} must be an int in [1, {MAX_EXTENT:,}] (got {numbers[key]})"
                )
        link = value.get("link", "").lower() or "chain"
        if link not in _LINKS:
            raise GraphError(f"{where}: link must be chain or resize (got '{value['link']}')")
        shortcut = value.get("shortcut", "")
        rows.append(
            _Row(
                where,
                name,
                _TABLE_TYPES[kind],
                **numbers,
                link=link,
                shortcut=None if shortcut in ("", "-") else shortcut,
            )
        )
    return rows


def _conv_geometry(n_in: int, n_out: int, kernel: int) -> tuple[int, int] | None:
    """(stride, padding) mapping n_in to n_out: stride closest to n_in/n_out, then least padding."""
    for stride in sorted(range(1, n_in + 1), key=lambda s: (abs(s - n_in / n_out), s)):
        for padding in range(kernel // 2 + 1):
            if (
                n_in + 2 * padding >= kernel
                and (n_in + 2 * padding - kernel) // stride + 1 == n_out
            ):
                return stride, padding
    return None


def _pool_geometry(n_in: int, n_out: int) -> tuple[int, int]:
    """(window, stride) of an unpadded floor-mode pool mapping n_in to n_out (n_in >= n_out)."""
    stride = n_in // n_out
    # (n_in - k) // stride + 1 == n_out holds exactly for k in [k_min, k_max].
    k_min, k_max = n_in - n_out * stride + 1, n_in - (n_out - 1) * stride
    for k in (stride + 1, stride):
        if k_min <= k <= k_max:
            return k, stride
    return (k_min if k_min > stride else k_max), stride


class _TableBuilder:
    """Turns table rows into a chain of layers, tracking the current output shape."""

    def __init__(self, first: _Row) -> None:
        self.shape = Shape(first.in_channels, first.in_h, first.in_w)
        self.layers: list[Layer] = []
        self.last = INPUT
        self.last_row: _Row | None = None
        #: per row: the tensor its layer reads, and that tensor's shape (a shortcut's source)
        self.reads: dict[str, tuple[str, Shape]] = {}

    def add(self, layer: Layer, shape: Shape) -> None:
        self.layers.append(layer)
        self.last = layer.name
        self.shape = shape

    def pool_to(self, row: _Row, h: int, w: int) -> None:
        s = self.shape
        if (h, w) == (s.height, s.width):
            return
        if h > s.height or w > s.width:
            raise GraphError(
                f"{row.where}: input size {h}x{w} is larger than the previous output {s.height}x{s.width}; "
                "only pooling is inserted between rows, and it cannot enlarge"
            )
        (kh, sh), (kw, sw) = _pool_geometry(s.height, h), _pool_geometry(s.width, w)
        # Rows start at the graph input's size, so a bridge always follows a row's layer.
        self.add(
            Pool2d(f"{self.last}.pool", (self.last,), mode="max", kernel=(kh, kw), stride=(sh, sw)),
            Shape(s.channels, h, w),
        )

    def resize_to(self, row: _Row) -> None:
        """``link=resize``: a :class:`Resize` adapter to the row's input shape where it differs."""
        want = Shape(row.in_channels, row.in_h, row.in_w)
        if row.link == "resize" and self.shape != want:
            self.add(
                Resize(f"{row.name}.resize", (self.last,), want.channels, want.height, want.width),
                want,
            )

    def join_shortcut(self, row: _Row) -> None:
        """``shortcut=<row>``: the row reads the sum of the main path and what ``<row>`` read
        (a residual block's input), adapted to the row's input shape when ``link=resize``; then
        records what this row reads."""
        if row.shortcut is not None:
            if row.shortcut not in self.reads:
                raise GraphError(f"{row.where}: shortcut '{row.shortcut}' names no earlier row")
            src, shape = self.reads[row.shortcut]
            if shape != self.shape:
                if row.link != "resize":
                    raise GraphError(
                        f"{row.where}: the shortcut from '{row.shortcut}' carries {shape.channels}x{shape.height}x"
                        f"{shape.width}, the row reads {self.shape.channels}x{self.shape.height}x{self.shape.width}; "
                        "give link=resize to adapt it"
                    )
                s = self.shape
                src = f"{row.name}.shortcut"
                self.layers.append(
                    Resize(src, (self.reads[row.shortcut][0],), s.channels, s.height, s.width)
                )
            self.add(Add(f"{row.name}.add", (self.last, src)), self.shape)
        self.reads[row.name] = (self.last, self.shape)

    def conv(self, row: _Row) -> None:
        self.resize_to(row)
        self._check_channels(row, self.shape.channels)
        self.pool_to(row, row.in_h, row.in_w)
        self.join_shortcut(row)
        geometry = [
            _conv_geometry(n_in, n_out, row.kernel)
            for n_in, n_out in ((row.in_h, row.out_h), (row.in_w, row.out_w))
        ]
        if None in geometry:
            raise GraphError(
                f"{row.where}: a {row.kernel}x{row.kernel} convolution cannot map {row.in_h}x{row.in_w} to "
                f"{row.out_h}x{row.out_w} with stride >= 1 and padding <= {row.kernel // 2}; check the sizes"
            )
        (sh, ph), (sw, pw) = geometry
        layer = Conv2d(
            row.name,
            (self.last,),
            out_channels=row.out_channels,
            kernel=(row.kernel, row.kernel),
            stride=(sh, sw),
            padding=(ph, pw),
        )
        self.add(layer, Shape(row.out_channels, row.out_h, row.out_w))
        self.last_row = row

    def fc(self, row: _Row) -> None:
        self.resize_to(row)
        full_kernel = row.kernel == 1 or row.kernel == row.in_h == row.in_w
        if (row.out_h, row.out_w) != (1, 1) or not full_kernel:
            raise GraphError(
                f"{row.where}: fc rows have out_h = out_w = 1 and kernel 1 (or kernel = in_h = in_w) "
                f"(got out {row.out_h}x{row.out_w}, kernel {row.kernel})"
            )
        s = self.shape
        if (row.in_h, row.in_w) != (1, 1) or s.spatial == 1:
            self._check_channels(row, s.channels)
            self.pool_to(row, row.in_h, row.in_w)
        elif row.in_channels != s.elements:
            h, w = self._pooled_size(row)
            self.pool_to(row, h, w)
        after_conv = self.last_row is not None and self.last_row.kind == "conv"
        if after_conv or self.shape.spatial != 1:
            self.add(Flatten(f"{row.name}.flatten", (self.last,)), Shape(self.shape.elements))
        self.join_shortcut(row)
        self.add(
            Linear(row.name, (self.last,), out_features=row.out_channels), Shape(row.out_channels)
        )
        self.last_row = row

    def _pooled_size(self, row: _Row) -> tuple[int, int]:
        """(h, w) with C*h*w == in_channels and the aspect ratio of the previous output."""
        s = self.shape
        q, rest = divmod(row.in_channels, s.channels)
        fits = [
            (h, q // h)
            for h in range(1, s.height + 1)
            if not rest and q % h == 0 and q // h <= s.width and h * s.width == (q // h) * s.height
        ]
        if len(fits) != 1:
            prev = f"'{self.last_row.name}'" if self.last_row else "the input"
            raise GraphError(
                f"{row.where}: in_channels {row.in_channels} does not match the output of {prev}, "
                f"{s.channels}x{s.height}x{s.width}: give {s.elements} (= {s.channels}*{s.height}*{s.width}) "
                f"with in_h = in_w = 1, {s.channels}*h*w for a pooled size h x w of the same aspect ratio, "
                f"or in_channels {s.channels} with the spatial size as in_h x in_w"
            )
        return fits[0]

    def _check_channels(self, row: _Row, channels: int) -> None:
        if row.in_channels != channels:
            prev = (
                f"the previous row '{self.last_row.name}' out_channels"
                if self.last_row
                else "the input channels"
            )
            raise GraphError(
                f"{row.where}: in_channels {row.in_channels} does not match {prev} {channels}"
            )


def load_layer_table(path_or_text: str | Path, *, name: str | None = None) -> Graph:
    """Build a chain :class:`Graph` from a layer table (format: see the module doc).

    ``path_or_text`` is a :class:`~pathlib.Path`, a path string of an existing file, or the
    table's text (any string with a newline or a comma). The graph input is the first row's
    ``in_channels x in_h x in_w``; its name is ``name``, else the file's stem, else
    ``"layer_table"``. Conv rows get bias (as the tables carry no bias column). Raises
    :class:`~parplan.errors.GraphError` naming the row for rows that do not chain.

    Example:
        >>> g = load_layer_table("c1 conv 1 20 28 28 24 24 5\\nf1 fc 11520 10 1 1 1 1 1\\n")
        >>> g.parameter_count()
        115730
    """
    text, source, default_name = _read_text(path_or_text)
    rows = _parse_rows(text, source)
    builder = _TableBuilder(rows[0])
    for row in rows:
        if row.kind == "conv":
            builder.conv(row)
        else:
            builder.fc(row)
    graph = Graph(
        name or default_name,
        Shape(rows[0].in_channels, rows[0].in_h, rows[0].in_w),
        tuple(builder.layers),
    )
    try:
        graph.analyze()
    except GraphError as exc:
        raise GraphError(f"{source}: {exc}") from None
    return graph


# --------------------------------------------------------------------------- dispatch


def load_model(spec: str | Path) -> Graph:
    """A zoo model by name (case-insensitive) or a model file / layer table by path.

    Raises :class:`~parplan.errors.ConfigError` listing the zoo names and the accepted file
    suffixes when ``spec`` is neither.

    Example:
        >>> load_model("AlexNet").name
        'alexnet'
        >>> load_model("resnet-5O")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        parplan.errors.ConfigError: unknown model 'resnet-5O' ...; or give the path of an existing model file ...
    """
    if not isinstance(spec, (str, Path)):
        raise ConfigError(
            f"model must be a zoo name or a path (got {type(spec).__name__} {spec!r:.60})"
        )
    if isinstance(spec, str) and zoo.canonical_name(spec) in zoo.MODELS:
        return zoo.get_model(spec)
    from parplan.models import importers  # imported on use: built-in models need none of it

    external = importers.load_external(spec)  # .onnx files, file.py:factory (torch or Graph)
    if external is not None:
        return external
    path = Path(spec)
    if path.is_file() and path.suffix.lower() in MODEL_FILE_SUFFIXES:
        return load_model_file(path)
    reason = zoo.unknown_model_message(str(spec))
    if path.is_file():
        reason = f"model file '{path}' has unsupported suffix '{path.suffix}'; valid zoo names: {', '.join(zoo.MODELS)}"
    elif path.suffix.lower() in MODEL_FILE_SUFFIXES:
        reason = f"model file '{path}': no such file; valid zoo names: {', '.join(zoo.MODELS)}"
    raise ConfigError(
        f"{reason}; or give the path of an existing model file ({', '.join(MODEL_FILE_SUFFIXES)}, .onnx) "
        "or file.py:factory"
    )
