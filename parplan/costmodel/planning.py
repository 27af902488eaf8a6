"""The planning graph: the nodes that carry a partition choice and the edges that carry tensors.

Weighted layers (conv, linear) are nodes with a :class:`PartitionType`; joins (add, concat)
are nodes with a :class:`Layout`. Every other layer (activation, pooling, norm, flatten)
passes its input's layout through and is folded into the edge it sits on; its cost travels
with the node whose output it reads, as an element-wise op (docs/costmodel.md sections 1
and 5). An edge ``u -> v`` carries the tensor that ``v`` reads from ``u``: its size is
``fraction * in_elements`` of ``v`` (fraction < 1 only for one input of a concat).

Example:
    >>> from parplan.costmodel.graph import Graph, Shape, Conv2d, Activation, Add
    >>> g = Graph("res", Shape(8, 4, 4), (
    ...     Conv2d("a", ("input",), out_channels=8, kernel=3, padding=1),
    ...     Conv2d("b", ("a",), out_channels=8, kernel=3, padding=1),
    ...     Add("sum", ("a", "b")),
    ...     Activation("relu", ("sum",)),
    ...     Conv2d("c", ("relu",), out_channels=4, kernel=1),
    ... ))
    >>> pg = planning_graph(g)
    >>> [n.name for n in pg.nodes], [n.preds for n in pg.nodes]
    (['a', 'b', 'sum', 'c'], [(), (0,), (0, 1), (2,)])
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import cached_property

from parplan.costmodel.dims import ElementOp, LayerDims, element_op, layer_dims
from parplan.costmodel.graph import INPUT, Graph, Linear
from parplan.costmodel.layout import JOIN_LAYOUTS, TYPE_ORDER, Choice, Layout


@dataclass(frozen=True)
class PlanNode:
    """A node of the planning graph.

    ``dims`` are per-sample (batch 1) and carry the element-wise ops that follow the node (and,
    for a node reading the graph input through such ops, those). ``preds`` index earlier
    nodes; ``fractions[i]`` is the share of this node's input tensor that comes from
    ``preds[i]``; ``sources[i]`` names the graph layer whose output that is (consumers of one
    node that read the same layer's output read the same tensor). ``absorbed`` lists the
    pass-through layers folded into this node's input edges.
    """

    name: str
    is_join: bool
    is_fc: bool
    dims: LayerDims
    preds: tuple[int, ...]
    fractions: tuple[float, ...]
    absorbed: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    #: The share of this node's input that is the graph's input (not from an earlier node): 1 for
    #: a first layer, 1 per input of an add that reads it.
    graph_input: float = 0.0
    #: A join's layouts when not all three: ROWS and WHOLE for a join that keeps its columns
    #: together (:meth:`parplan.costmodel.graph.Layer.keeps_columns`: a product with a
    #: per-position gate, Mamba's selective scan).
    layouts: tuple[Choice, ...] | None = None

    @property
    def choices(self) -> tuple[Choice, ...]:
        if self.layouts is not None:
            return self.layouts
        return JOIN_LAYOUTS if self.is_join else TYPE_ORDER


@dataclass(frozen=True)
class PlanningGraph:
    """Nodes in topological order; ``succs`` derived from ``preds``."""

    name: str
    nodes: tuple[PlanNode, ...]

    @cached_property
    def succs(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in self.nodes]
        for v, node in enumerate(self.nodes):
            for u in node.preds:
                out[u].append(v)
        return tuple(tuple(s) for s in out)

    @cached_property
    def out_edges(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """Per node ``u``: its out-edges as (consumer ``v``, position of ``u`` in ``v.preds``)."""
        out: list[list[tuple[int, int]]] = [[] for _ in self.nodes]
        for v, node in enumerate(self.nodes):
            for p, u in enumerate(node.preds):
                out[u].append((v, p))
        return tuple(tuple(e) for e in out)

    @property
    def is_chain(self) -> bool:
        """Every node has at most one predecessor and one successor."""
        return all(len(n.preds) <= 1 for n in self.nodes) and all(len(s) <= 1 for s in self.succs)

    @cached_property
    def blocks(self) -> tuple[int, ...]:
        """Per node, the index of its block (-1: none): a transformer layer or a residual
        block, read from the names (docs/costmodel.md section 6.3). A node belongs to the
        block its name names by its first numbered module (``model.layers.3.mlp.down`` ->
        ``model.layers.3``, ``layer1.0.conv2`` -> ``layer1.0``; else a module like ``h3`` in
        ``h3.attn``); a block has at least two nodes."""
        keys = [block_name(n.name) for n in self.nodes]
        count: dict[str, int] = {}
        for k in keys:
            if k is not None:
                count[k] = count.get(k, 0) + 1
        ids: dict[str, int] = {}
        return tuple(
            ids.setdefault(k, len(ids)) if k is not None and count[k] >= 2 else -1 for k in keys
        )

    @cached_property
    def block_count(self) -> int:
        return max(self.blocks, default=-1) + 1

    @cached_property
    def units(self) -> tuple[int, ...]:
        """Per node, its ZeRO-3 / FSDP unit (docs/costmodel.md section 6.1): its block, with the
        nodes outside blocks one more unit (FSDP wrapping every block, then the model, as
        torchtitan and parplan's training scripts do); in a model without blocks every node is
        its own unit (wrapped per layer)."""
        if not self.block_count:
            return tuple(range(len(self.nodes)))
        return tuple(b if b >= 0 else self.block_count for b in self.blocks)

    @cached_property
    def checkpoints(self) -> tuple[float, ...]:
        """Per node, what block checkpointing keeps of its input, as a fraction of it (-1 for a
        node outside every block: section 6.3's per-layer rule): what enters a block from each
        earlier node outside it (or from the graph's input), once per block, at its first reader
        there (a norm carried after that node is recomputed from it, as PyTorch recomputes a
        block from its one input)."""
        blocks = self.blocks
        seen: set[tuple[int, int]] = set()
        out = []
        for v, node in enumerate(self.nodes):
            b = blocks[v]
            if b < 0:
                out.append(-1.0)
                continue
            kept = 0.0
            for u, f in zip(node.preds, node.fractions):
                if blocks[u] != b and (b, u) not in seen:
                    seen.add((b, u))
                    kept += f
            if node.graph_input and (b, -1) not in seen:
                seen.add((b, -1))
                kept += node.graph_input
            out.append(kept)
        return tuple(out)

    def index(self, name: str) -> int:
        for i, n in enumerate(self.nodes):
            if n.name == name:
                return i
        raise KeyError(name)


_NUMBERED = re.compile(r"[A-Za-z_]+\d+")


def block_name(name: str) -> str | None:
    """The block a layer named ``name`` belongs to (see :attr:`PlanningGraph.blocks`): its
    name up to its first numbered module that is not the last part, or None."""
    parts = name.split(".")
    for test in (str.isdigit, _NUMBERED.fullmatch):
        for i, part in enumerate(parts[:-1]):
            if test(part):
                return ".".join(parts[: i + 1])
    return None


def planning_graph(graph: Graph) -> PlanningGraph:
    """Build (and cache on the graph) the planning graph of ``graph``."""
    cache = graph._cache  # noqa: SLF001 - the graph owns a cache for derived views
    if "planning" not in cache:
        cache["planning"] = _build(graph)
    return cache["planning"]


def _per_element(graph: Graph, names: list[str], size: float) -> tuple[ElementOp, ...]:
    """The element-wise ops ``names`` per element of a tensor of ``size`` elements per sample."""
    out = []
    for name in names:
        op = element_op(graph, name)
        if op.flops or op.traffic or op.stored or op.row_exchange:
            out.append(
                ElementOp(
                    op.name,
                    op.flops / size,
                    op.traffic / size,
                    op.stored / size,
                    op.row_exchange,
                    op.kind,
                )
            )
    return tuple(out)


def _build(graph: Graph) -> PlanningGraph:
    info = graph.analyze()
    index: dict[str, int] = {}
    # For every layer: which planning nodes its output comes from, as (node, fraction of channels).
    source: dict[str, tuple[tuple[int, float], ...]] = {INPUT: ()}
    absorbed_into: dict[str, list[str]] = {}
    # pass-through layers hanging after each node, and those hanging after the graph input
    after: dict[int | None, list[str]] = {None: []}
    origin: dict[str, int | None] = {INPUT: None}
    nodes: list[PlanNode] = []
    for name in info.order:
        layer = graph.layer(name)
        if layer.weighted or layer.join:
            preds: list[int] = []
            fractions: list[float] = []
            sources: list[str] = []
            total = info.out_shape[name].elements if layer.join else None
            from_input = 0.0
            for src, shape in zip(layer.inputs, info.in_shapes[name]):
                # a join input's share of the join's tensor: 1 for an add or a product, the
                # channel share for a concat, 1 / positions for a broadcast per-channel gate
                share = shape.elements / total if total else 1.0
                if not source[src]:
                    from_input += share
                for u, f in source[src]:
                    preds.append(u)
                    fractions.append(f * share)
                    sources.append(src)
            merged: dict[int, float] = {}
            first_source: dict[int, str] = {}
            for u, f, src in zip(preds, fractions, sources):
                merged[u] = merged.get(u, 0.0) + f
                first_source.setdefault(u, src)
            absorbed = []
            for src in layer.inputs:
                absorbed.extend(absorbed_into.get(src, []))
            index[name] = len(nodes)
            dims = layer_dims(graph, name, 1)
            pre = [a for a in dict.fromkeys(absorbed) if origin[a] is None]
            if pre:
                dims = replace(dims, in_ops=_per_element(graph, pre, dims.in_elements))
            nodes.append(
                PlanNode(
                    name=name,
                    is_join=layer.join,
                    is_fc=isinstance(layer, Linear),
                    dims=dims,
                    preds=tuple(merged),
                    fractions=tuple(merged.values()),
                    absorbed=tuple(dict.fromkeys(absorbed)),
                    sources=tuple(first_source[u] for u in merged),
                    graph_input=from_input,
                    layouts=(
                        (Layout.ROWS, Layout.WHOLE)
                        if layer.join and layer.keeps_columns(list(info.in_shapes[name]))
                        else None
                    ),
                )
            )
            source[name] = ((index[name], 1.0),)
            absorbed_into[name] = []
            origin[name] = index[name]
            after[index[name]] = [name] if layer.join else []
        else:
            (src,) = layer.inputs
            source[name] = source[src]
            absorbed_into[name] = [*absorbed_into.get(src, []), name]
            origin[name] = origin[src]
            after[origin[name]].append(name)
    final = []
    for v, node in enumerate(nodes):
        ops = _per_element(graph, after[v], node.dims.out_elements)
        final.append(replace(node, dims=replace(node.dims, out_ops=ops)) if ops else node)
    return PlanningGraph(graph.name, tuple(final))
