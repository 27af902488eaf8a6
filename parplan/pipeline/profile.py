"""Per-layer profiles for the pipeline planner: PipeDream ``graph.txt`` files and zoo graphs.

A :class:`PipelineProfile` is a list of :class:`ProfiledLayer` in topological order, each with
forward and backward seconds per minibatch, output activation bytes and parameter bytes, plus
the edges between layers. The planner only cuts between consecutive layers of that order; a
branching model (ResNet, even PipeDream's VGG-16 with its ``Size`` side node) is thereby
*linearized*, and a cut carries every tensor that crosses it (:meth:`PipelineProfile.cut_bytes`).

PipeDream's profile format (``profiler/*/profiles/MODEL/graph.txt`` of msr-fiddle/pipedream):
one node per line ``nodeID -- description -- forward_compute_time=<ms>,
backward_compute_time=<ms>, activation_size=<bytes>, parameter_size=<bytes>`` (a node with
several outputs lists ``activation_size=[a; b; c]``, summed here) and one edge per line
``<TAB>src -- dst``. Times are milliseconds and are converted to seconds.

Example:
    >>> text = '''node1 -- Input -- forward_compute_time=1.0, backward_compute_time=0.0,\\
    ...  activation_size=8.0, parameter_size=0.0
    ... node2 -- Linear(2, 2) -- forward_compute_time=2.0, backward_compute_time=4.0,\\
    ...  activation_size=8.0, parameter_size=24.0
    ... \\tnode1 -- node2'''
    >>> p = parse_profile(text, source="tiny")
    >>> [layer.name for layer in p.layers], p.layers[1].compute_seconds
    (['node1', 'node2'], 0.006)
    >>> p.cut_bytes()
    (8.0,)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import networkx as nx

from parplan.costmodel.dims import Device, element_op, layer_dims, layer_profiles, op_seconds
from parplan.costmodel.graph import INPUT, Graph
from parplan.errors import ConfigError, GraphError
from parplan.readers import read_text

__all__ = [
    "ProfiledLayer",
    "PipelineProfile",
    "parse_profile",
    "read_profile",
    "profile_from_graph",
]

_NODE = re.compile(r"^(?P<id>\S+) -- (?P<desc>.*) -- (?P<fields>forward_compute_time=.*)$")
_EDGE = re.compile(r"^(?P<src>\S+) -- (?P<dst>\S+)$")
_FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")


@dataclass(frozen=True)
class ProfiledLayer:
    """One layer (profile node): per-minibatch seconds and sizes in bytes.

    ``activation_bytes`` is the layer's output (sent forward to a consumer on another stage,
    its gradient comes back); ``parameter_bytes`` its weights (all-reduced across replicas,
    stashed once per in-flight minibatch).
    """

    name: str
    description: str
    forward_seconds: float
    backward_seconds: float
    activation_bytes: float
    parameter_bytes: float

    @property
    def compute_seconds(self) -> float:
        """Forward + backward seconds of one minibatch on one device."""
        return self.forward_seconds + self.backward_seconds


@dataclass(frozen=True)
class PipelineProfile:
    """Layers in topological order and the edges (by name) between them.

    ``source`` says where the numbers come from (a file, or a zoo graph at a batch on a
    device); ``notes`` carries caveats that the planner repeats in its output.
    """

    name: str
    layers: tuple[ProfiledLayer, ...]
    edges: tuple[tuple[str, str], ...]
    source: str = ""
    notes: tuple[str, ...] = ()
    #: Node names in the order the profile file declares them (PipeDream's own code starts its
    #: antichains at the first source in that order); empty: the layers' order.
    declared: tuple[str, ...] = ()

    @property
    def is_chain(self) -> bool:
        """True when every edge joins consecutive layers (no branching to linearize)."""
        pos = {layer.name: i for i, layer in enumerate(self.layers)}
        return (
            all(pos[v] == pos[u] + 1 for u, v in self.edges)
            and len(self.edges) == len(self.layers) - 1
        )

    def cut_bytes(self) -> tuple[float, ...]:
        """Bytes crossing the cut after each position ``s`` (``len(layers) - 1`` values).

        The cut after ``s`` carries the output of every layer at a position ``<= s`` that has a
        consumer at a position ``> s`` (counted once even with several consumers). On a chain
        this is the activation of layer ``s``.
        """
        n = len(self.layers)
        pos = {layer.name: i for i, layer in enumerate(self.layers)}
        last_use = list(range(n))
        for u, v in self.edges:
            last_use[pos[u]] = max(last_use[pos[u]], pos[v])
        diff = [0.0] * (n + 1)
        for i, layer in enumerate(self.layers):
            # Layer i's output crosses the cuts after i, i+1, ..., last_use[i]-1.
            if last_use[i] > i:
                diff[i] += layer.activation_bytes
                diff[last_use[i]] -= layer.activation_bytes
        out, running = [], 0.0
        for s in range(n - 1):
            running += diff[s]
            out.append(running)
        return tuple(out)

    @property
    def total_compute_seconds(self) -> float:
        """Forward + backward seconds of one minibatch of the whole model on one device."""
        return math.fsum(layer.compute_seconds for layer in self.layers)

    @property
    def total_parameter_bytes(self) -> float:
        return math.fsum(layer.parameter_bytes for layer in self.layers)


def _natural_key(name: str) -> tuple[str, int, str]:
    m = re.match(r"^(\D*)(\d+)(.*)$", name)
    return (m.group(1), int(m.group(2)), m.group(3)) if m else (name, -1, "")


def _number(source: str, lineno: int, field: str, text: str) -> float:
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        parts = [p for p in re.split(r"[;,]", text[1:-1]) if p.strip()]
        if not parts:
            raise GraphError(
                f"profile '{source}' line {lineno}: {field} is an empty list; give a number of bytes"
            )
        return math.fsum(_number(source, lineno, field, p) for p in parts)
    try:
        value = float(text)
    except ValueError:
        raise GraphError(
            f"profile '{source}' line {lineno}: {field} must be a number (got {text!r})"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise GraphError(
            f"profile '{source}' line {lineno}: {field} must be a finite number >= 0 (got {text})"
        )
    return value


def _parse_fields(source: str, lineno: int, text: str) -> dict[str, float]:
    # Split on commas outside brackets: activation_size=[a; b] may hold separators.
    parts, depth, cur = [], 0, []
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    values: dict[str, float] = {}
    for part in parts:
        key, sep, val = part.strip().partition("=")
        if not sep:
            raise GraphError(
                f"profile '{source}' line {lineno}: expected 'key=value', got {part.strip()!r}"
            )
        if key not in _FIELDS:
            raise GraphError(
                f"profile '{source}' line {lineno}: unknown field {key!r}; valid fields: {', '.join(_FIELDS)}"
            )
        values[key] = _number(source, lineno, key, val)
    missing = [f for f in _FIELDS if f not in values]
    if missing:
        raise GraphError(f"profile '{source}' line {lineno}: missing {', '.join(missing)}")
    return values


def parse_profile(text: str, source: str = "<string>", name: str | None = None) -> PipelineProfile:
    """Parse a PipeDream ``graph.txt`` into a :class:`PipelineProfile` (times in seconds).

    Nodes are ordered topologically, ties broken by the node id's number (``node2`` before
    ``node10``). Raises :class:`~parplan.errors.GraphError` naming the file and line of a
    malformed line, an edge to an undeclared node, a duplicate node or a cycle.
    """
    nodes: dict[str, ProfiledLayer] = {}
    node_line: dict[str, int] = {}
    edges: list[tuple[str, str, int]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if raw[0] in " \t":
            m = _EDGE.match(raw.strip())
            if not m:
                raise GraphError(
                    f"profile '{source}' line {lineno}: an indented line must be an edge '<TAB>src -- dst' "
                    f"(got {raw.strip()!r})"
                )
            edges.append((m.group("src"), m.group("dst"), lineno))
            continue
        m = _NODE.match(raw.rstrip())
        if not m:
            raise GraphError(
                f"profile '{source}' line {lineno}: expected 'nodeID -- description -- "
                f"forward_compute_time=<ms>, backward_compute_time=<ms>, activation_size=<bytes>, "
                f"parameter_size=<bytes>' (got {raw.strip()[:80]!r})"
            )
        node_id = m.group("id")
        if node_id in nodes:
            raise GraphError(
                f"profile '{source}' line {lineno}: node '{node_id}' is already declared on line {node_line[node_id]}"
            )
        f = _parse_fields(source, lineno, m.group("fields"))
        nodes[node_id] = ProfiledLayer(
            name=node_id,
            description=m.group("desc").strip(),
            forward_seconds=f["forward_compute_time"] / 1e3,
            backward_seconds=f["backward_compute_time"] / 1e3,
            activation_bytes=f["activation_size"],
            parameter_bytes=f["parameter_size"],
        )
        node_line[node_id] = lineno
    if not nodes:
        raise GraphError(f"profile '{source}': no node lines found; is this a PipeDream graph.txt?")
    dag = nx.DiGraph()
    dag.add_nodes_from(nodes)
    for src, dst, lineno in edges:
        for end in (src, dst):
            if end not in nodes:
                raise GraphError(
                    f"profile '{source}' line {lineno}: edge {src} -- {dst} names undeclared node '{end}'; "
                    "declare it with a node line"
                )
        if src == dst:
            raise GraphError(
                f"profile '{source}' line {lineno}: edge {src} -- {dst} is a self-loop"
            )
        dag.add_edge(src, dst)
    try:
        cycle = nx.find_cycle(dag)
    except nx.NetworkXNoCycle:
        cycle = None
    if cycle:
        names = " -> ".join([e[0] for e in cycle] + [cycle[0][0]])
        raise GraphError(
            f"profile '{source}': the edges form a cycle {names}; a profile must be a DAG"
        )
    order = list(nx.lexicographical_topological_sort(dag, key=_natural_key))
    pos = {n: i for i, n in enumerate(order)}
    layers = tuple(nodes[n] for n in order)
    profile = PipelineProfile(
        name=name or source,
        layers=layers,
        edges=tuple(sorted(dag.edges, key=lambda e: (pos[e[0]], pos[e[1]]))),
        source=f"PipeDream profile {source} (measured times)",
        declared=tuple(nodes),
    )
    if not profile.is_chain:
        profile = _with_note(profile, _LINEARIZED)
    return profile


_LINEARIZED = (
    "branching model linearized in topological order: stages are contiguous in that order and a cut "
    "carries every tensor crossing it"
)


def _with_note(profile: PipelineProfile, note: str) -> PipelineProfile:
    return replace(profile, notes=profile.notes + (note,))


def read_profile(path: str | Path) -> PipelineProfile:
    """Read a PipeDream ``graph.txt`` file (see :func:`parse_profile`)."""
    p = Path(path)
    text = read_text(p, "profile file", hint="give the path of a PipeDream graph.txt")
    name = p.parent.name if p.name == "graph.txt" else p.name.split(".")[0]
    return parse_profile(text, source=str(path), name=name)


def profile_from_graph(
    graph: Graph, batch: int, device: float | Device, bytes_per_element: float = 2.0
) -> PipelineProfile:
    """Profile of a layer graph at ``batch`` on ``device`` (docs/costmodel.md section 5).

    ``device`` is a cost-model :class:`~parplan.costmodel.dims.Device` (peak FLOP/s, HBM
    bandwidth, efficiency; ``Machine.device`` of an array), or a plain peak FLOP/s figure.
    Per layer, compute seconds are the cost model's own roofline
    (:meth:`~parplan.costmodel.dims.LayerDims.compute_seconds` for a weighted layer,
    :func:`~parplan.costmodel.dims.op_seconds` of a layer without weights, its roofline with its
    kernels' launch roof), split 1/3 forward (one of the three products) and 2/3 backward;
    with a plain FLOP/s figure, FLOPs over it (layers without weights then cost nothing but
    attention's products). Activation bytes = output elements x ``bytes_per_element``;
    parameter bytes = weight elements x ``bytes_per_element``.

    Example:
        >>> from parplan.costmodel.graph import Graph, Linear, Shape
        >>> g = Graph("fc2", Shape(4), (Linear("a", ("input",), out_features=8),
        ...                             Linear("b", ("a",), out_features=2)))
        >>> p = profile_from_graph(g, batch=2, device=1e3)
        >>> [round(layer.compute_seconds, 3) for layer in p.layers], p.cut_bytes()
        ([0.384, 0.192], (32.0,))
    """
    if not batch > 0:
        raise ConfigError(f"batch must be > 0 (got {batch})")
    if not isinstance(device, Device):
        if not (isinstance(device, (int, float)) and device > 0):
            raise ConfigError(f"device throughput must be > 0 FLOP/s (got {device})")
        device = Device(float(device), math.inf)
    if not bytes_per_element > 0:
        raise ConfigError(f"bytes_per_element must be > 0 (got {bytes_per_element})")
    layers = []
    for prof in layer_profiles(graph, batch):
        layer = graph.layer(prof.name)
        if layer.weighted:
            seconds = layer_dims(graph, prof.name, batch).compute_seconds(device, bytes_per_element)
        else:  # the op as section 5 prices it where it rides with a planning node, per sample x batch
            seconds = op_seconds(element_op(graph, prof.name), batch, device, bytes_per_element)
        layers.append(
            ProfiledLayer(
                name=prof.name,
                description=prof.op,
                forward_seconds=seconds / 3.0,
                backward_seconds=seconds * 2.0 / 3.0,
                activation_bytes=prof.out_elements * bytes_per_element,
                parameter_bytes=prof.weight_elements * bytes_per_element,
            )
        )
    edges = tuple(
        (src, layer.name) for layer in graph.layers for src in layer.inputs if src != INPUT
    )
    pos = {layer.name: i for i, layer in enumerate(layers)}
    profile = PipelineProfile(
        name=graph.name,
        layers=tuple(layers),
        edges=tuple(sorted(edges, key=lambda e: (pos[e[0]], pos[e[1]]))),
        source=f"cost model: graph '{graph.name}' at batch {batch}, {device.flops_per_s / 1e12:g} TFLOP/s per device"
        + (
            f" (efficiency {device.efficiency:g}, HBM {device.memory_bytes_per_s / 1e9:g} GB/s)"
            if math.isfinite(device.memory_bytes_per_s)
            else ""
        )
        + f", {bytes_per_element:g} bytes per element",
    )
    if not profile.is_chain:
        profile = _with_note(profile, _LINEARIZED)
    return profile
