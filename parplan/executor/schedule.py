"""What a plan makes every device compute, hold and receive: the executable semantics of the
layout algebra (docs/executor.md). Pure numpy; :mod:`parplan.executor.worker` runs it with
torch.distributed.

Every tensor of the network is a grid of *points*: rows are samples, columns are channels
(features), and each point carries ``cell`` elements (the spatial extent; a flattened
tensor keeps its channels as columns). A plan gives every planning node, at every group of the
array, a **box**: the rows, input columns and output columns the group computes
(docs/costmodel.md section 7: BATCH narrows the rows, IN the input columns, OUT the output
columns; a join's ROWS the rows, COLS its columns, WHOLE nothing). Shares become integer
slice sizes here (``round(share * n)``); :func:`executed_plan` is the plan at those sizes,
which the evaluator prices for the comparison.

From the boxes follow, per device, the regions it needs and holds (section 2's ports), and
the messages of one training step:

- **intra-layer reductions** of a type's partial sums (IN: ``F[l+1]``, OUT: ``E[l]``, BATCH:
  ``dW``) as a hierarchical reduce-scatter then all-gather: at each split that reduces, each
  side receives, over both phases, the other side's full partial, once;
- **re-layouts** of every tensor a node sends (forward ``F``) and of the gradients its
  consumers send back (backward ``E``): each device receives every point it needs and does
  not hold from the nearest device that has it (the deepest common group; ties to the lowest
  rank), gradients of several consumers pre-summed per sending device.

A message from device ``s`` to device ``d`` crosses the split at their deepest common group;
its elements count for that split, for the side ``d`` is on, for the node it belongs to (a
re-layout belongs to the producer, as in docs/costmodel.md section 3), in phase ``intra`` or
``transition``.

Example (two devices, data parallelism: each side receives the other side's dW of conv):
    >>> from parplan.costmodel.graph import Graph, Shape, Conv2d
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.layout import PartitionType
    >>> from parplan.costmodel.problem import Plan, Problem, Split
    >>> g = Graph("one", Shape(2, 4, 4), (Conv2d("conv", ("input",), out_channels=3, kernel=3, bias=False),))
    >>> p = Problem(g, parse_array("cpu:2"), batch=4)
    >>> s = build_schedule(p, Plan({"": Split((PartitionType.BATCH,), (0.5,))}))
    >>> s.received()
    {('', 'conv', 1, 'intra'): 54, ('', 'conv', 2, 'intra'): 54}
"""

from __future__ import annotations

from dataclasses import replace, dataclass, field
from functools import cached_property

import numpy as np

from parplan.costmodel.graph import (
    INPUT,
    Activation,
    Add,
    Attention,
    Bias,
    Concat,
    Conv2d,
    Embedding,
    Flatten,
    Glu,
    Linear,
    Mul,
    Norm,
    Pool2d,
    Scale,
    Tokens,
)
from parplan.costmodel.layout import Layout, PartitionType, split_axes
from parplan.costmodel.problem import Plan, Problem, Split
from parplan.errors import ConfigError

#: Layer kinds the executor runs without a partition choice (element-wise in the model).
ELEMENTWISE = (Activation, Norm, Pool2d, Flatten, Attention, Scale, Bias, Glu, Tokens)
#: Every layer kind the executor runs (graph_frames' dispatch), with how its errors name it;
#: ``SUPPORTED`` is made from it, and a test checks every kind of the graph is here or refused.
RUNS = {
    Conv2d: "conv",
    Linear: "linear (also per position)",
    Pool2d: "pooling",
    Activation: "activations",
    Norm: "batch, layer and RMS norm",
    Scale: "learned scales",
    Bias: "learned biases",
    Tokens: "class tokens",
    Glu: "gated units",
    Attention: "attention cores",
    Flatten: "flatten",
    Embedding: "embeddings",
    Add: "add",
    Mul: "products (also per-channel gates)",
    Concat: "concat",
}
#: What the executor runs, for error messages.
SUPPORTED = ", ".join(RUNS.values())
#: Activation functions the executor runs.
FUNCTIONS = (
    "relu",
    "relu6",
    "gelu",
    "silu",
    "tanh",
    "sigmoid",
    "identity",
    "dropout",
    "stochastic_depth",
)
#: Row statistics a norm over the features reduces per position (docs/costmodel.md section 2).
ROW_STATS = {"layer": 2, "rms": 1}


@dataclass(frozen=True)
class Frame:
    """Column structure of one tensor: ``cols`` columns of ``cell`` elements per row; a
    concatenation's columns are its inputs' ``segments`` (a COLS or IN split takes the same
    fraction of each segment)."""

    cols: int
    cell: int
    segments: tuple[tuple[int, int], ...]
    #: columns that are never divided (an attention head's fused q, k, v; its output)
    unit: int = 1


@dataclass(frozen=True)
class Box:
    """What one group computes of one node: rows ``[r0, r1)``, input and output columns (index
    arrays). A join's inputs and output share its columns."""

    r0: int
    r1: int
    ins: np.ndarray
    outs: np.ndarray

    @property
    def empty(self) -> bool:
        return self.r1 <= self.r0 or len(self.ins) == 0 or len(self.outs) == 0

    def mask(self, rows: int, cols: int, which: str) -> np.ndarray:
        """Region as a (rows, cols) boolean mask: ``which`` = "in" or "out" columns; empty
        when the group has no work for the node."""
        m = np.zeros((rows, cols), dtype=bool)
        if not self.empty:
            m[self.r0 : self.r1, self.ins if which == "in" else self.outs] = True
        return m


@dataclass(frozen=True)
class Message:
    """Points of one buffer sent from device ``src`` to device ``dst``.

    ``kind``: "fwd" (assign F values), "bwd" (add pre-summed gradients; ``parts`` lists the
    (consumer, mask) pairs summed), "rs" (add a partial sum) or "ag" (assign a reduced value).
    ``tensor`` names the buffer (a layer name for F and E, ``node/out``, ``node/ein``,
    ``node/dw`` for partial sums); ``mask`` is over its (rows, cols) grid.
    """

    src: int
    dst: int
    kind: str
    tensor: str
    mask: np.ndarray
    cell: int
    split: str  # path of the split it crosses
    side: int  # 1 or 2: the side of that split ``dst`` is on
    node: str  # planning node it is charged to
    phase: str  # "intra" or "transition"
    parts: tuple[tuple[str, np.ndarray], ...] = ()

    @property
    def elements(self) -> int:
        return int(self.mask.sum()) * self.cell


@dataclass
class Schedule:
    """Everything the workers need: problem, boxes per leaf, messages in execution order."""

    problem: Problem
    plan: Plan
    leaves: tuple[str, ...]  # leaf paths, rank order
    frames: dict[str, Frame]
    boxes: dict[str, dict[str, Box]]  # group path -> node name -> box
    forward: dict[str, list[Message]]  # node -> messages after its forward product
    transitions_fwd: dict[str, list[Message]]  # node -> messages of its output re-layout
    transitions_bwd: dict[str, list[Message]]  # node -> messages of its gradient re-layout
    backward: dict[str, list[Message]]  # node -> reductions after its backward products
    executed_shares: dict[str, tuple[float, ...]]
    inexact: tuple[str, ...] = ()  # "path/node" whose segments rounded to different fractions
    owners: dict[str, np.ndarray] = field(default_factory=dict)  # loss tensor: owner rank per point
    ops_fwd: dict[str, list[Message]] = field(default_factory=dict)  # layer norm -> its statistics
    ops_bwd: dict[str, list[Message]] = field(default_factory=dict)
    #: ZeRO-3: node -> the all-gather of its weights from their shards' owners (``owners[node/w]``),
    #: exchanged before its forward product and again before its backward
    gathers: dict[str, list[Message]] = field(default_factory=dict)
    #: ZeRO-3: node -> the all-gather of the embedding tables it reads (``owners[src/table]``:
    #: per device the entries it keeps), before the lookups and again before the node's backward
    table_gathers: dict[str, list[Message]] = field(default_factory=dict)
    #: rows [lo, hi) of the micro-batch this schedule runs, and whether it is the step's last
    #: (None: the whole step; see :meth:`micro_batches`)
    window: tuple[int, int, bool] | None = None

    def micro_batches(self) -> list["Schedule"]:
        """The step as ``problem.micro_batches`` schedules run one after the other (docs/costmodel.md
        section 6.4): each computes the rows of its micro-batch, with every message over rows cut
        to them; the weight gradients accumulate, and their exchange runs once, after the last
        (at ZeRO stage 2 and 3 the reduce-scatter runs after every micro-batch)."""
        m = self.problem.micro_batches
        if m == 1 or self.window is not None:
            return [self]
        size = self.problem.batch // m
        return [_window(self, j * size, (j + 1) * size, j == m - 1) for j in range(m)]

    @cached_property
    def origin(self) -> dict[str, str]:
        """:func:`origins` of the problem's graph."""
        return origins(self.problem)

    def chain(self, node: str) -> list[str]:
        """Layers computed from ``node``'s output (element-wise in the model), in graph order."""
        return [
            n for n in self.problem.graph.analyze().order if self.origin[n] == node and n != node
        ]

    @cached_property
    def _sent_again(self) -> dict[str, frozenset[str]]:
        """Per node, the tensors whose forward re-layout its block sends again when it is
        recomputed (docs/costmodel.md section 6.3): those read by a node of the same block."""
        if not self.problem.blocks_recomputed:
            return {}
        pg = self.problem.planning
        out = {}
        for u, node in enumerate(pg.nodes):
            b = pg.blocks[u]
            if b >= 0:
                out[node.name] = frozenset(
                    pg.nodes[v].sources[p] for v, p in pg.out_edges[u] if pg.blocks[v] == b
                )
        return out

    def resent(self, node: str) -> list[Message]:
        """The forward re-layout messages of ``node``'s output that its checkpointed block sends
        again in backward, to recompute (section 6.3; none without recomputation)."""
        again = self._sent_again.get(node)
        return [m for m in self.transitions_fwd[node] if m.tensor in again] if again else []

    def messages(self):
        """Every message of one step, in execution order."""
        nodes = [n.name for n in self.problem.planning.nodes]
        for n in nodes:  # the tables' gathers run before the lookups, every node's first
            yield from self.table_gathers.get(n, ())
        for n in nodes:
            yield from self.gathers.get(n, ())
            yield from self.forward[n]
            for layer in self.chain(n):
                yield from self.ops_fwd.get(layer, ())
            yield from self.transitions_fwd[n]
        again = dict(zip(nodes, self.problem.recomputed_nodes))
        for n in reversed(nodes):
            yield from self.table_gathers.get(n, ())
            yield from self.gathers.get(n, ())
            if again[n]:  # the node's forward again, with its exchanges inside it
                yield from self.forward[n]
                for layer in self.chain(n):
                    yield from self.ops_fwd.get(layer, ())
                yield from self.resent(n)  # and its block's re-layouts
            yield from self.transitions_bwd[n]
            for layer in reversed(self.chain(n)):
                yield from self.ops_bwd.get(layer, ())
            yield from self.backward[n]

    def received(self) -> dict[tuple[str, str, int, str], int]:
        """Elements received per (split path, node, side, phase), from the messages of every
        micro-batch."""
        out: dict[tuple[str, str, int, str], int] = {}
        for part in self.micro_batches():
            for m in part.messages():
                key = (m.split, m.node, m.side, m.phase)
                out[key] = out.get(key, 0) + m.elements
        return out

    @cached_property
    def rank(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.leaves)}


#: Buffers whose grid is not over the batch's rows: weight gradients, tables' gradients,
#: gathered weights and tables.
_WEIGHT_BUFFERS = ("/dw", "/table", "/w", "/tw")


def _window(schedule: Schedule, lo: int, hi: int, last: bool) -> Schedule:
    """One micro-batch of ``schedule``: rows [lo, hi) (see :meth:`Schedule.micro_batches`)."""

    def rows(msgs):
        out = []
        for m in msgs:
            if m.tensor.endswith(_WEIGHT_BUFFERS):
                out.append(m)
                continue
            keep = np.zeros(m.mask.shape, dtype=bool)
            keep[lo:hi] = True
            mask = m.mask & keep
            if mask.any():
                out.append(replace(m, mask=mask, parts=tuple((r, p & keep) for r, p in m.parts)))
        return out

    def weights(msgs):
        """A node's reductions after its backward: rows cut; weight exchanges once per step, after
        the last micro-batch, except the reduce-scatter at ZeRO-2/3, after every one."""
        out = []
        for m in rows(msgs):
            if (
                not m.tensor.endswith(_WEIGHT_BUFFERS)
                or last
                or (
                    m.kind == "rs"
                    and m.tensor.endswith(("/dw", "/table"))
                    and schedule.problem.zero_stage >= 2
                )
            ):
                out.append(m)
        return out

    boxes = {
        leaf: {
            name: Box(max(b.r0, lo), min(b.r1, hi), b.ins, b.outs)
            if b.r0 < hi and b.r1 > lo
            else Box(lo, lo, b.ins, b.outs)
            for name, b in group.items()
        }
        for leaf, group in schedule.boxes.items()
    }
    return replace(
        schedule,
        boxes=boxes,
        window=(lo, hi, last),
        forward={k: rows(v) for k, v in schedule.forward.items()},
        transitions_fwd={k: rows(v) for k, v in schedule.transitions_fwd.items()},
        transitions_bwd={k: rows(v) for k, v in schedule.transitions_bwd.items()},
        backward={k: weights(v) for k, v in schedule.backward.items()},
        ops_fwd={k: rows(v) for k, v in schedule.ops_fwd.items()},
        ops_bwd={k: rows(v) for k, v in schedule.ops_bwd.items()},
    )


# ------------------------------------------------------------------------------------ frames


def graph_frames(problem: Problem) -> dict[str, Frame]:
    """The :class:`Frame` of the graph input and of every layer's output; a clear error for a
    layer the executor does not run."""
    graph = problem.graph
    info = graph.analyze()
    shape = graph.input_shape
    frames = {INPUT: Frame(shape.channels, shape.spatial, ((0, shape.channels),))}
    heads_of: dict[str, int] = {}
    gated: dict[str, int] = {}
    for name in info.order:
        layer = graph.layer(name)
        out = info.out_shape[name]
        srcs = [frames[s] for s in layer.inputs]
        if isinstance(layer, (Conv2d, Linear)):
            if getattr(layer, "experts", 1) != 1:
                raise ConfigError(
                    f"run: layer '{name}' is a mixture-of-experts bank; the executor runs dense layers"
                )
            if getattr(layer, "groups", 1) != 1:
                raise ConfigError(
                    f"run: layer '{name}' is a grouped convolution (groups={layer.groups}); "
                    "the executor runs groups=1 only"
                )
            if getattr(layer, "causal", False):
                raise ConfigError(
                    f"run: layer '{name}' is a causal convolution; the executor runs convolutions "
                    "padded on both sides"
                )
            frames[name] = Frame(out.channels, out.spatial, ((0, out.channels),))
        elif isinstance(layer, Embedding):
            through = [
                c
                for c in info.consumers[name]
                if not (graph.layer(c).weighted or graph.layer(c).join)
            ]
            if through:
                raise ConfigError(
                    f"run: embedding '{name}' is read through '{through[0]}' (a layer without weights); "
                    "the executor runs lookups read by weighted layers and joins directly"
                )
            frames[name] = Frame(out.channels, out.spatial, ((0, out.channels),))
        elif isinstance(layer, (Add, Mul)):
            if isinstance(layer, Mul) and Mul.per_position_gate(list(info.in_shapes[name])):
                raise ConfigError(
                    f"run: product '{name}' has a per-position gate; the executor runs products "
                    "of equal shapes and per-channel gates"
                )
            if any(f.segments != srcs[0].segments for f in srcs[1:]):
                raise ConfigError(
                    f"run: join '{name}' joins tensors with different concatenation structure; "
                    "the executor splits their columns differently"
                )
            if len(set(layer.inputs)) != len(layer.inputs):
                raise ConfigError(
                    f"run: join '{name}' reads one tensor twice; the executor needs distinct inputs"
                )
            big = max(srcs, key=lambda f: f.cell)
            frames[name] = Frame(out.channels, out.spatial, big.segments, big.unit)
        elif isinstance(layer, Concat):
            segs, off = [], 0
            for f in srcs:
                segs += [(a + off, b + off) for a, b in f.segments]
                off += f.cols
            frames[name] = Frame(out.channels, out.spatial, tuple(segs))
        elif isinstance(layer, Attention):
            if layer.bias_params or layer.window or layer.relative:
                raise ConfigError(
                    f"run: attention '{name}' has a learned bias, windows or relative position "
                    "scores; the executor runs full multi-head and grouped-query attention"
                )
            src = srcs[0]
            head = out.channels // layer.heads
            rep = layer.heads // layer.key_heads
            if src.segments != ((0, src.cols),):
                raise ConfigError(
                    f"run: attention '{name}' reads a concatenation; feed it one QKV projection"
                )
            heads_of[layer.inputs[0]] = (rep + 2) * head  # a key/value group: its q heads, k, v
            frames[name] = Frame(out.channels, out.spatial, ((0, out.channels),), rep * head)
        elif isinstance(layer, Glu):
            src = srcs[0]
            if src.segments != ((0, src.cols),) or not graph.layer(layer.inputs[0]).weighted:
                raise ConfigError(f"run: gated unit '{name}' must read a projection directly")
            gated[layer.inputs[0]] = out.channels
            frames[name] = Frame(out.channels, src.cell, ((0, out.channels),))
        elif isinstance(layer, ELEMENTWISE):
            if isinstance(layer, Activation) and layer.function.lower() not in FUNCTIONS:
                raise ConfigError(
                    f"run: activation '{name}' uses '{layer.function}'; the executor runs "
                    f"{', '.join(FUNCTIONS)}"
                )
            src = srcs[0]
            cell = out.spatial if isinstance(layer, (Pool2d, Tokens)) else src.cell
            frames[name] = Frame(src.cols, cell, src.segments, src.unit)
        else:
            raise ConfigError(
                f"run: layer '{name}' is a {type(layer).__name__}; the executor runs {SUPPORTED}"
            )
    for name, half in gated.items():  # a fused gate / up projection: a column share of each half
        if len(info.consumers[name]) != 1:
            raise ConfigError(
                f"run: gated unit input '{name}' must be read by the gated unit alone"
            )
        f = frames[name]
        frames[name] = Frame(f.cols, f.cell, ((0, half), (half, 2 * half)), f.unit)
    for name, unit in heads_of.items():  # a QKV projection is divided by whole heads
        if not graph.layer(name).weighted or len(info.consumers[name]) != 1:
            raise ConfigError(
                f"run: attention input '{name}' must be a projection read by the attention alone"
            )
        f = frames[name]
        frames[name] = Frame(f.cols, f.cell, f.segments, unit)
    return frames


def tensor_cols(
    problem: Problem, frames: dict[str, Frame], tensor: str, cols: np.ndarray
) -> np.ndarray:
    """Columns of ``tensor`` computed from its producer's output columns ``cols``: the same,
    except past an attention core, which maps whole heads of its fused input to its output."""
    graph = problem.graph
    path = []
    name = tensor
    nodes = {n.name for n in problem.planning.nodes}
    while name not in nodes and name != INPUT:
        path.append(name)
        name = graph.layer(name).inputs[0]
    for layer_name in reversed(path):
        layer = graph.layer(layer_name)
        if isinstance(layer, Glu):  # the gate half's columns are the output's
            cols = cols[cols < frames[layer_name].cols]
        if isinstance(layer, Attention):
            unit_in = frames[layer.inputs[0]].unit
            unit_out = frames[layer_name].unit
            heads = np.unique(cols // unit_in)
            if len(cols) != len(heads) * unit_in:
                raise ConfigError(f"run: attention '{layer_name}' would get part of a head")
            cols = (heads[:, None] * unit_out + np.arange(unit_out)[None, :]).ravel()
    return cols


def origins(problem: Problem) -> dict[str, str]:
    """For every layer (and the input): the planning node whose output it is computed from
    (itself for a planning node, ``input`` for layers before the first one)."""
    graph = problem.graph
    nodes = {n.name for n in problem.planning.nodes}
    out = {INPUT: INPUT}
    for name in graph.analyze().order:
        out[name] = name if name in nodes else out[graph.layer(name).inputs[0]]
    return out


# ------------------------------------------------------------------------------------- boxes


def _cut(n: int, share: float) -> int:
    """Integer size of side 1's part of ``n`` at ``share`` (round half up)."""
    return int(np.floor(share * n + 0.5))


def _split_cols(
    cols: np.ndarray, share: float, segments, unit: int = 1
) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """Side 1 takes the first ``round(share * k)`` of each segment's ``k`` columns (counted in
    groups of ``unit`` that are never divided)."""
    first, rest, fracs = [], [], []
    for a, b in segments:
        part = cols[(cols >= a) & (cols < b)]
        k = _cut(len(part) // unit, share) * unit
        first.append(part[:k])
        rest.append(part[k:])
        if len(part):
            fracs.append(k / len(part))
    return np.concatenate(first), np.concatenate(rest), fracs


def _split_box(box: Box, choice, share: float, in_frame: Frame, out_frame: Frame, is_join: bool):
    """Children boxes of ``box`` and the executed share (None if segments disagree)."""
    axes = split_axes(choice)
    if box.empty:
        return box, box, share
    if "rows" in axes:
        k = _cut(box.r1 - box.r0, share)
        return (
            Box(box.r0, box.r0 + k, box.ins, box.outs),
            Box(box.r0 + k, box.r1, box.ins, box.outs),
            k / (box.r1 - box.r0),
        )
    if not axes:  # a join's WHOLE
        empty = Box(box.r0, box.r0, box.ins, box.outs)
        if share <= 0.0:
            return empty, box, 0.0
        if share >= 1.0:
            return box, empty, 1.0
        return box, box, share
    if axes == ("outs",):
        a, b, fr = _split_cols(box.outs, share, out_frame.segments, out_frame.unit)
        return Box(box.r0, box.r1, box.ins, a), Box(box.r0, box.r1, box.ins, b), _agree(fr, share)
    a, b, fr = _split_cols(box.ins, share, in_frame.segments, in_frame.unit)  # IN, or a join's COLS
    if is_join:
        return Box(box.r0, box.r1, a, a), Box(box.r0, box.r1, b, b), _agree(fr, share)
    return Box(box.r0, box.r1, a, box.outs), Box(box.r0, box.r1, b, box.outs), _agree(fr, share)


def _agree(fracs: list[float], share: float) -> float | None:
    if not fracs:
        return share
    return fracs[0] if max(fracs) - min(fracs) < 1e-12 else None


def _layer_input(problem: Problem, name: str) -> str:
    return problem.graph.layer(name).inputs[0]


def node_boxes(problem: Problem, plan: Plan, frames: dict[str, Frame]):
    """Boxes of every node at every group (path -> node -> :class:`Box`), the executed shares
    per split, and the (path/node) whose segments rounded to different fractions."""
    nodes = problem.planning.nodes
    boxes: dict[str, dict[str, Box]] = {}
    executed: dict[str, list[float]] = {}
    inexact: list[str] = []

    def frames_of(node):
        out = frames[node.name]
        return (out if node.is_join else frames[_layer_input(problem, node.name)]), out

    root = {}
    for node in nodes:
        fin, fout = frames_of(node)
        root[node.name] = Box(0, problem.batch, np.arange(fin.cols), np.arange(fout.cols))

    def walk(group, path: str, here: dict[str, Box]) -> None:
        boxes[path] = here
        if group.is_leaf:
            return
        split = plan.splits[path]
        left, right, shares = {}, {}, []
        for v, node in enumerate(nodes):
            fin, fout = frames_of(node)
            a, b, s = _split_box(
                here[node.name], split.choices[v], split.shares[v], fin, fout, node.is_join
            )
            left[node.name], right[node.name] = a, b
            if s is None:
                inexact.append(f"{path}/{node.name}")
                s = split.shares[v]
            shares.append(float(s))
        executed[path] = shares
        walk(group.left, path + "L", left)
        walk(group.right, path + "R", right)

    walk(problem.array, "", root)
    return boxes, {p: tuple(s) for p, s in executed.items()}, tuple(inexact)


def executed_plan(schedule: Schedule) -> Plan:
    """The plan with every share replaced by the one the integer slices execute."""
    return _with_shares(schedule.plan, schedule.executed_shares)


def _with_shares(plan: Plan, shares: dict[str, tuple[float, ...]]) -> Plan:
    return Plan({p: Split(s.choices, shares[p]) for p, s in plan.splits.items()})


# ----------------------------------------------------------------------------------- regions


def _leaf_paths(group, path: str = "") -> list[str]:
    if group.is_leaf:
        return [path]
    return _leaf_paths(group.left, path + "L") + _leaf_paths(group.right, path + "R")


def _lca(a: str, b: str) -> str:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return a[:i]


def _crossing(src: str, dst: str) -> tuple[str, int]:
    g = _lca(src, dst)
    return g, 1 if dst[len(g)] == "L" else 2


@dataclass(frozen=True)
class _Reader:
    """A planning node reading a tensor: for a concat, the column offset of that input."""

    node: str
    offset: int
    is_weighted: bool


def readers_of(problem: Problem, frames) -> dict[str, list[_Reader]]:
    """Per layer output: the planning nodes that read it (in node order)."""
    graph = problem.graph
    out: dict[str, list[_Reader]] = {}
    for node in problem.planning.nodes:
        layer = graph.layer(node.name)
        off = 0
        seen = set()
        for src in layer.inputs:
            if src in seen:
                raise ConfigError(
                    f"run: layer '{node.name}' reads '{src}' twice; the executor needs distinct inputs"
                )
            seen.add(src)
            out.setdefault(src, []).append(
                _Reader(node.name, off if isinstance(layer, Concat) else 0, not node.is_join)
            )
            off += frames[src].cols
    return out


def held_mask(problem: Problem, frames: dict[str, Frame], box: Box, tensor: str) -> np.ndarray:
    """The region of ``tensor`` a device (or group) holds: its producer's rows and output
    columns, carried through the layers between them (an attention core maps heads)."""
    frame = frames[tensor]
    m = np.zeros((problem.batch, frame.cols), dtype=bool)
    if not box.empty:
        m[box.r0 : box.r1, tensor_cols(problem, frames, tensor, box.outs)] = True
    return m


def need_mask(box: Box, reader: _Reader, rows: int, frame: Frame) -> np.ndarray:
    """The region of a tensor (its ``frame``) a reader's box needs; the reader holds its
    gradient contribution on the same region."""
    m = np.zeros((rows, frame.cols), dtype=bool)
    if box.empty:
        return m
    cols = box.ins
    if reader.offset or not reader.is_weighted:
        cols = cols[(cols >= reader.offset) & (cols < reader.offset + frame.cols)] - reader.offset
    m[box.r0 : box.r1, cols] = True
    return m


# ---------------------------------------------------------------------------------- messages


def _route(tree, leaves, holders, needers):
    """Messages (src, dst, mask) that give every leaf the points it needs and does not hold,
    group by group from the root (docs/costmodel.md section 3): at a split of group ``g``,
    a side receives from the other what it needs of what ``g`` holds; points ``g`` needs and
    does not hold have arrived at ``g`` once and sit on its first side that needs them, which
    forwards them to the other side if it needs them too. An arrival into a group lands on the
    first of its sides that needs it, down to a device."""
    rank = {p: i for i, p in enumerate(leaves)}
    out = []

    def land(path, mask):
        if path in rank:
            return [(rank[path], mask)] if mask.any() else []
        first = mask & needers[path + "L"]
        return land(path + "L", first) + land(path + "R", mask & ~first)

    def held_by(path, mask):
        """(leaf, part) of ``mask`` taken from the first leaves under ``path`` that hold it."""
        got = []
        for leaf in leaves:
            if leaf.startswith(path) and mask.any():
                take = mask & holders[leaf]
                if take.any():
                    got.append((rank[leaf], take))
                    mask = mask & ~take
        if mask.any():
            raise AssertionError(f"group '{path}' holds no copy of part of a tensor it sends")
        return got

    def walk(group, path):
        if group.is_leaf:
            return
        a, b = path + "L", path + "R"
        g = holders[path]
        for side, (mine, other) in enumerate(((a, b), (b, a)), start=1):
            wanted = needers[mine] & g & ~holders[mine]
            for src, part in held_by(other, wanted):
                for dst, piece in land(mine, part):
                    out.append((src, dst, piece, path, side))
        forwarded = needers[b] & needers[a] & ~g
        for src, part in land(a, forwarded):
            for dst, piece in land(b, part):
                out.append((src, dst, piece, path, 2))
        walk(group.left, a)
        walk(group.right, b)

    walk(tree, "")
    return out


def _transitions(problem, leaves, boxes, frames, readers, origin):
    """Forward and backward re-layout messages of every tensor read by a planning node."""
    fwd: dict[str, list[Message]] = {n.name: [] for n in problem.planning.nodes}
    bwd: dict[str, list[Message]] = {n.name: [] for n in problem.planning.nodes}
    rows = problem.batch
    order = {n: i for i, n in enumerate(_layer_order(problem))}
    paths = list(boxes)
    leaf_pair = {p: (p + "L") in leaves and (p + "R") in leaves for p in paths}
    for tensor in sorted(readers, key=lambda t: order.get(t, -1)):
        producer = origin[tensor]
        if producer == INPUT:
            continue  # data loading is not priced (docs/costmodel.md section 3)
        frame = frames[tensor]
        rs = readers[tensor]
        hold = {p: held_mask(problem, frames, boxes[p][producer], tensor) for p in paths}
        need = {p: [need_mask(boxes[p][r.node], r, rows, frame) for r in rs] for p in paths}
        union = {p: np.logical_or.reduce(need[p]) for p in paths}
        for src, dst, mask, split, side in _route(problem.array, list(leaves), hold, union):
            fwd[producer].append(
                Message(
                    src, dst, "fwd", tensor, mask, frame.cell, split, side, producer, "transition"
                )
            )
        merged: dict[tuple, list] = {}
        for j, r in enumerate(rs):
            holders = {p: need[p][j] for p in paths}
            for src, dst, mask, split, side in _route(problem.array, list(leaves), holders, hold):
                # two single devices pre-sum the consumers' gradients: one value per point
                key = (src, dst, split, side) if leaf_pair[split] else (src, dst, split, side, j)
                merged.setdefault(key, []).append((r.node, mask))
        for key, parts in sorted(
            merged.items(), key=lambda kv: len(kv[0][2])
        ):  # from the root down
            src, dst, split, side = key[:4]
            union_mask = np.logical_or.reduce([m for _, m in parts])
            bwd[producer].append(
                Message(
                    src,
                    dst,
                    "bwd",
                    tensor,
                    union_mask,
                    frame.cell,
                    split,
                    side,
                    producer,
                    "transition",
                    tuple(parts),
                )
            )
    return fwd, bwd


def _layer_order(problem: Problem) -> list[str]:
    return [INPUT, *problem.graph.analyze().order]


def _reduction(
    problem,
    plan,
    leaves,
    boxes,
    node_index,
    name,
    reduced,
    region,
    shape,
    cell,
    tensor,
    replicating=(),
    owners_out: dict | None = None,
):
    """Hierarchical reduce-scatter and all-gather of a partial sum: ``region(box)`` is a leaf's
    (rows, cols) mask of the reduced tensor, ``reduced`` the choices that leave partials on
    both sides. Where a split in ``replicating`` gives both sides the same part after a split
    above has reduced it, the total reaches side 1 and side 1 forwards it to side 2.
    ``owners_out``: receives the rank that holds each point's total after the reduce-scatter
    (key ``tensor``; -1 where no device needs the point)."""
    rank = {p: i for i, p in enumerate(leaves)}
    rs: list[Message] = []
    ag: list[Message] = []

    def owners(group, path: str, above: bool) -> tuple[np.ndarray, list]:
        """(owner rank per point or -1, the all-gather steps below) after reduce-scatter."""
        if group.is_leaf:
            own = np.full(shape, -1)
            own[region(boxes[path][name])] = rank[path]
            return own, []
        split = plan.splits[path]
        both = not boxes[path + "L"][name].empty and not boxes[path + "R"][name].empty
        cut = split.choices[node_index] in reduced and both
        o1, steps1 = owners(group.left, path + "L", above or cut)
        o2, steps2 = owners(group.right, path + "R", above or cut)
        if not cut:
            own = np.where(o1 >= 0, o1, o2)
            if above and both and split.choices[node_index] in replicating:
                shared = (o1 >= 0) & (o2 >= 0)

                def forward(m=shared, a=o1, b=o2):
                    _pairs(ag, m, a, b, "ag", tensor, cell, leaves, name)

                return own, [forward] + steps1 + steps2
            return own, steps1 + steps2
        pts = np.flatnonzero(o1.ravel() >= 0)
        k = _cut(len(pts), split.shares[node_index])
        first = np.zeros(shape, dtype=bool)
        first.ravel()[pts[:k]] = True
        second = (o1 >= 0) & ~first
        own = np.where(first, o1, o2)
        for m, senders, receivers in ((first, o2, o1), (second, o1, o2)):
            _pairs(rs, m, senders, receivers, "rs", tensor, cell, leaves, name)

        def gather(m1=first, m2=second, a=o1, b=o2):
            _pairs(ag, m1, a, b, "ag", tensor, cell, leaves, name)
            _pairs(ag, m2, b, a, "ag", tensor, cell, leaves, name)

        return own, [gather] + steps1 + steps2

    own, steps = owners(problem.array, "", False)
    if owners_out is not None:
        owners_out[tensor] = own
    for step in steps:  # parent splits before their children: pre-order
        step()
    return rs + ag


def _pairs(out: list, mask, senders, receivers, kind, tensor, cell, leaves, name) -> None:
    """One message per (sender, receiver) pair over the points of ``mask``."""
    if not mask.any():
        return
    s, r = senders[mask], receivers[mask]
    for a, b in sorted(set(zip(s.tolist(), r.tolist()))):
        m = mask & (senders == a) & (receivers == b)
        g, side = _crossing(leaves[a], leaves[b])
        out.append(Message(a, b, kind, tensor, m, cell, g, side, name, "intra"))


def build_schedule(problem: Problem, plan: Plan) -> Schedule:
    """Boxes, regions and messages of one training step of ``plan`` (see the module doc)."""
    from parplan.costmodel.evaluate import check_plan

    check_plan(problem, plan)
    if problem.array.collective is not None:
        raise ConfigError(
            "run: arrays with an all-reduce collective (@ALG:TOPO) are not executed; "
            "drop the @... suffix to run the plan with the split-by-split exchanges"
        )
    frames = graph_frames(problem)
    origin = origins(problem)
    leaves = tuple(_leaf_paths(problem.array))
    boxes, executed, inexact = node_boxes(problem, plan, frames)
    readers = readers_of(problem, frames)
    exec_plan = _with_shares(plan, executed)
    fwd_t, bwd_t = _transitions(problem, list(leaves), boxes, frames, readers, origin)
    forward: dict[str, list[Message]] = {}
    backward: dict[str, list[Message]] = {}
    gathers: dict[str, list[Message]] = {}
    shards: dict[str, np.ndarray] = {}
    graph = problem.graph
    for v, node in enumerate(problem.planning.nodes):
        forward[node.name], backward[node.name] = [], []
        if node.is_join:
            continue
        layer = graph.layer(node.name)
        fin, fout = frames[layer.inputs[0]], frames[node.name]
        rows = problem.batch
        wcell = weight_cell(layer, fin)
        forward[node.name] = _reduction(
            problem,
            exec_plan,
            list(leaves),
            boxes,
            v,
            node.name,
            (PartitionType.IN,),
            lambda b: b.mask(rows, fout.cols, "out"),
            (rows, fout.cols),
            fout.cell,
            f"{node.name}/out",
        )
        ein = _reduction(
            problem,
            exec_plan,
            list(leaves),
            boxes,
            v,
            node.name,
            (PartitionType.OUT,),
            lambda b: b.mask(rows, fin.cols, "in"),
            (rows, fin.cols),
            fin.cell,
            f"{node.name}/ein",
        )
        dw = _reduction(
            problem,
            exec_plan,
            list(leaves),
            boxes,
            v,
            node.name,
            (PartitionType.BATCH,),
            lambda b: _weight_mask(b, fin.cols, fout.cols),
            (fin.cols, fout.cols),
            wcell,
            f"{node.name}/dw",
            owners_out=shards,
        )
        if problem.zero_stage >= 3:
            # ZeRO-3 (docs/costmodel.md section 6.1): each device keeps the shard of the weights whose
            # gradient total the reduce-scatter leaves it, and updates only that; the all-gather
            # carries the weights instead, before forward and again before backward
            gathers[node.name] = [replace(m, tensor=f"{node.name}/w") for m in dw if m.kind == "ag"]
            dw = [m for m in dw if m.kind == "rs"]
        backward[node.name] = ein + dw
    ops_fwd, ops_bwd = _norm_statistics(problem, exec_plan, list(leaves), boxes, frames, origin)
    table_gathers: dict[str, list[Message]] = {}
    kept: dict[str, np.ndarray] = {}  # ZeRO-3: per table, the entries each device keeps
    for v, node in enumerate(problem.planning.nodes):
        tables = _table_gradients(problem, exec_plan, list(leaves), boxes, frames, origin, v, kept)
        if problem.zero_stage >= 3:
            # ZeRO-3 on a table (section 6.1): each device keeps the shard whose gradient total
            # the reduce-scatter leaves it; every all-gather (and a total forwarded to a side
            # holding the same columns) brings the table's weights instead, before the lookups
            # and again before backward
            table_gathers[node.name] = [
                replace(m, tensor=m.tensor.replace("/table", "/tw"))
                for m in tables
                if m.kind == "ag"
            ]
            tables = [m for m in tables if m.kind == "rs"]
        backward[node.name] += tables
    last = graph.analyze().order[-1]
    return Schedule(
        problem,
        plan,
        leaves,
        frames,
        boxes,
        forward,
        fwd_t,
        bwd_t,
        backward,
        executed,
        inexact,
        {
            "loss": _loss_owners(problem, boxes, leaves, frames, origin[last], last),
            **{
                f"{name}/w": own
                for name, own in ((t.rsplit("/", 1)[0], o) for t, o in shards.items())
            },
            **kept,
        },
        ops_fwd,
        ops_bwd,
        gathers,
        table_gathers=table_gathers,
    )


def weight_cell(layer, fin: Frame) -> int:
    """Elements per (input column, output column) of a weight: the kernel of a convolution, the
    spatial extent a flattened input carries into a linear layer, 1 for a per-position one."""
    if isinstance(layer, Conv2d):
        return layer.kernel_elements()
    return 1 if layer.per_position else fin.cell


#: Choices whose held output is divided by columns (a row statistic over columns needs both parts).
COLUMN_CUTS = (PartitionType.OUT, Layout.COLS)
#: Choices that divide rows (a gradient summed over rows has a partial on each side).
ROW_CUTS = (PartitionType.BATCH, Layout.ROWS)


def _norm_statistics(problem, plan, leaves, boxes, frames, origin):
    """For every layer / RMS norm: its row statistics (sum and sum of squares forward, sums of
    the gradient and of gradient x normalised value backward; RMS norm: the sum of squares and
    the sum of gradient x normalised value) are reduced across every split that divides its
    producer's output columns (docs/costmodel.md section 2)."""
    fwd: dict[str, list[Message]] = {}
    bwd: dict[str, list[Message]] = {}
    index = {n.name: v for v, n in enumerate(problem.planning.nodes)}
    rows = problem.batch
    for name in problem.graph.analyze().order:
        layer = problem.graph.layer(name)
        if not (isinstance(layer, Norm) and layer.kind in ROW_STATS) or origin[name] == INPUT:
            continue
        producer = origin[name]
        cell = ROW_STATS[layer.kind] * frames[name].cell

        def region(b):
            m = np.zeros((rows, 1), dtype=bool)
            if not b.empty:
                m[b.r0 : b.r1] = True
            return m

        for phase, out in (("stats", fwd), ("bstats", bwd)):
            out[name] = _reduction(
                problem,
                plan,
                leaves,
                boxes,
                index[producer],
                producer,
                COLUMN_CUTS,
                region,
                (rows, 1),
                cell,
                f"{name}/{phase}",
                (PartitionType.IN, Layout.WHOLE),
            )
    return fwd, bwd


def _table_gradients(problem, plan, leaves, boxes, frames, origin, v, owners_out=None):
    """Embedding tables read by node ``v``: their gradients, partial on each side of a split
    that divides rows, are reduced there (the table is ``num x columns``). ``owners_out``
    receives, per table (key ``src/table``), a ``(devices, num, columns)`` mask of the entries
    each device keeps under ZeRO-3: those it reads, less those the all-gather (or a total
    forwarded inside a group) brings it."""
    graph = problem.graph
    node = problem.planning.nodes[v]
    out = []
    for src in graph.layer(node.name).inputs:
        layer = graph.layer(src) if src != INPUT else None
        if not isinstance(layer, Embedding):
            continue
        readers = [n.name for n in problem.planning.nodes if src in graph.layer(n.name).inputs]
        if readers != [node.name]:
            raise ConfigError(f"run: embedding '{src}' must be read by one layer")
        cols = frames[src].cols

        def region(b, c=cols, off=_offset(graph, frames, node.name, src), n=layer.num):
            m = np.zeros((n, c), dtype=bool)
            if not b.empty:
                mine = b.ins[(b.ins >= off) & (b.ins < off + c)] - off
                m[:, mine] = True
            return m

        msgs = _reduction(
            problem,
            plan,
            leaves,
            boxes,
            v,
            node.name,
            ROW_CUTS,
            region,
            (layer.num, cols),
            1,
            f"{src}/table",
            (PartitionType.OUT, Layout.WHOLE),
        )
        if owners_out is not None:
            keep = np.stack([region(boxes[leaf][node.name]) for leaf in leaves])
            for m in msgs:
                if m.kind == "ag":
                    keep[m.dst] &= ~m.mask
            owners_out[f"{src}/table"] = keep
        out += msgs
    return out


def _offset(graph, frames, reader: str, src: str) -> int:
    layer = graph.layer(reader)
    if not isinstance(layer, Concat):
        return 0
    off = 0
    for s in layer.inputs:
        if s == src:
            return off
        off += frames[s].cols
    return off


def _weight_mask(box: Box, cin: int, cout: int) -> np.ndarray:
    m = np.zeros((cin, cout), dtype=bool)
    if not box.empty:
        m[np.ix_(box.ins, box.outs)] = True
    return m


def _loss_owners(problem, boxes, leaves, frames, producer, last) -> np.ndarray:
    """For the network's output: the lowest rank holding each point (it adds that point's
    loss; every holder computes the point's gradient itself)."""
    own = np.full((problem.batch, frames[last].cols), -1)
    for i, p in enumerate(leaves):
        m = held_mask(problem, frames, boxes[p][producer], last) & (own < 0)
        own[m] = i
    return own


__all__ = [
    "Box",
    "Frame",
    "Message",
    "Schedule",
    "build_schedule",
    "executed_plan",
    "graph_frames",
    "held_mask",
    "need_mask",
    "node_boxes",
    "origins",
    "readers_of",
    "tensor_cols",
    "weight_cell",
]
