"""Pipeline stages over partitioned groups: the plan space and its price (docs/costmodel.md section 11).

A :class:`PipelinePlan` cuts the layer graph into contiguous *stages* at single-tensor cuts
(:func:`cut_points`: positions in the graph's topological order after which exactly one tensor
crosses), runs stage ``s`` on the group of the array at path ``stages[s].group`` (a subtree of
the bisection tree), and partitions each stage inside its group with an ordinary
:class:`~parplan.costmodel.problem.Plan` of the stage's own sub-problem
(:func:`stage_problem`: the segment graph on the group's sub-array, with the problem's
settings). The step runs ``problem.micro_batches`` micro-batches through the stages with a
synchronous schedule (``1f1b`` or ``gpipe``) and a flush, so the weights stay consistent as in
Megatron-LM, torchtitan and GPipe.

:func:`evaluate_pipeline` prices it with the one evaluator: each stage's step time ``T_s`` is
the evaluator's price of its plan on its sub-problem (its ``m`` micro-batches one after the
other and its gradient exchange, as section 6.4 prices micro-batches); per micro-batch a stage
takes ``t_s = T_s / m``, and a cut moves the crossing tensor of one micro-batch forward and its
gradient back (:func:`cut_seconds`). The step is (section 11)::

    T = sum_s t_s + sum_c x_c + (m - 1) * max(max_s t_s, max_c x_c)

(fill and drain, then the slowest stage or link once per further micro-batch). One stage is
the partition model itself: ``T = m t_1 = T_1``. Memory per device is its stage's state plus
the activations of the micro-batches in flight: ``min(m, p - s)`` under 1F1B, ``m`` under GPipe.

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> g = get_model("gpt2")
    >>> cuts = cut_points(g)
    >>> len(cuts) > 4, segment(g, cuts[2] + 1, cuts[4]).input_shape == g.analyze().out_shape[cut_tensor(g, cuts[2])]
    (True, True)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence

from parplan.costmodel.cost import SideSpec, receive_seconds
from parplan.costmodel.evaluate import Evaluation, evaluate
from parplan.costmodel.graph import INPUT, Graph, TiedGraph
from parplan.costmodel.hardware import ArrayNode, signature
from parplan.costmodel.problem import Plan, Problem
from parplan.costmodel.regions import ROOT, Region, child_region
from parplan.errors import ConfigError

#: Synchronous pipeline schedules (section 11) -> the micro-batches whose activations stage
#: ``s`` (0 first) of ``p`` holds at its peak with ``m`` micro-batches. Both flush once per step:
#: 1F1B starts a micro-batch's backward once the last stage has it; GPipe runs every forward first.
SCHEDULES = {
    "1f1b": lambda s, p, m: min(m, p - s),
    "gpipe": lambda s, p, m: m,
}


def cut_points(graph: Graph) -> tuple[int, ...]:
    """Positions ``k`` of ``graph.analyze().order`` after which exactly one tensor (a layer's
    output, not the graph input) crosses to later layers: where a stage may end (cached)."""
    cached = graph._cache.get("cut_points")  # noqa: SLF001 - the graph owns a cache for derived views
    if cached is not None:
        return cached
    order = graph.analyze().order
    pos = {name: k for k, name in enumerate(order)}
    last_use: dict[str, int] = {}
    for name in order:
        for src in graph.layer(name).inputs:
            last_use[src] = max(last_use.get(src, -1), pos[name])
    out = []
    live: set[str] = set()
    for k, name in enumerate(order[:-1]):
        live.add(name)
        live = {s for s in live if last_use.get(s, -1) > k}
        if len(live) == 1 and last_use.get(INPUT, -1) <= k:
            out.append(k)
    result = tuple(out)
    graph._cache["cut_points"] = result  # noqa: SLF001
    return result


def cut_tensor(graph: Graph, k: int) -> str:
    """The one layer whose output crosses the cut after position ``k`` (a cut point)."""
    order = graph.analyze().order
    later = {src for name in order[k + 1 :] for src in graph.layer(name).inputs}
    crossing = [name for name in order[: k + 1] if name in later]
    if len(crossing) != 1 or INPUT in later:
        raise ConfigError(
            f"graph '{graph.name}': no single tensor crosses after layer '{order[k]}' "
            "(a stage may end only at a cut point)"
        )
    return crossing[0]


def even_ends(graph: Graph, stages: int) -> tuple[int, ...]:
    """The last positions of ``stages`` stages dividing the layers as evenly as the cut points
    allow (Megatron-LM divides a transformer's layers evenly), each at the cut nearest its share
    with a cut left for every stage after it."""
    order = graph.analyze().order
    cuts = cut_points(graph)
    if not 1 <= stages <= len(cuts) + 1:
        raise ConfigError(
            f"graph '{graph.name}': {stages} stages, but it has {len(cuts) + 1} pieces between its "
            "cut points"
        )
    ends, lo = [], 0
    for k in range(1, stages):
        target = k * len(order) / stages - 1
        i = min(range(lo, len(cuts) - (stages - 1 - k)), key=lambda j: abs(cuts[j] - target))
        ends.append(cuts[i])
        lo = i + 1
    return (*ends, len(order) - 1)


def segment(graph: Graph, first: int, last: int) -> Graph:
    """The layers at positions ``first..last`` of the topological order as a graph of their own:
    the tensor crossing into position ``first`` becomes its input (cached per graph)."""
    key = ("segment", first, last)
    cached = graph._cache.get(key)  # noqa: SLF001
    if cached is not None:
        return cached
    info = graph.analyze()
    order = info.order
    if not 0 <= first <= last < len(order):
        raise ConfigError(
            f"graph '{graph.name}': no segment {first}..{last} of its {len(order)} layers"
        )
    if first == 0:
        if last == len(order) - 1:
            return graph
        src, shape = None, graph.input_shape
    else:
        src = cut_tensor(graph, first - 1)
        shape = info.out_shape[src]
    layers = tuple(
        dataclasses.replace(
            graph.layer(n), inputs=tuple(INPUT if s == src else s for s in graph.layer(n).inputs)
        )
        for n in order[first : last + 1]
    )
    names = {layer.name for layer in layers}
    tied = tuple((a, b) for a, b in getattr(graph, "tied", ()) if a in names and b in names)
    name = f"{graph.name}[{order[first]}..{order[last]}]"
    out = TiedGraph(name, shape, layers, tied=tied) if tied else Graph(name, shape, layers)
    graph._cache[key] = out  # noqa: SLF001
    return out


def groups_at(array: ArrayNode, depth: int) -> tuple[str, ...]:
    """Paths of the array's groups at ``depth`` of its tree, left to right (a leaf above that
    depth stands for itself): the stages' groups of a pipeline of that depth."""
    out: list[str] = []

    def walk(node: ArrayNode, path: str) -> None:
        if node.is_leaf or len(path) == depth:
            out.append(path)
            return
        walk(node.left, path + "L")
        walk(node.right, path + "R")

    walk(array, "")
    return tuple(out)


def group_array(array: ArrayNode, path: str) -> ArrayNode:
    """The sub-array at ``path`` as an array of its own (the root's collective kept)."""
    group = array.at(path)
    if array.collective is not None and group.collective is None and not group.is_leaf:
        group = dataclasses.replace(group, collective=array.collective)
    return group


@dataclass(frozen=True)
class Stage:
    """Layers ``first..last`` (positions in the graph's topological order) on the group at
    array path ``group``, partitioned there by ``plan`` (a plan of :func:`stage_problem`)."""

    first: int
    last: int
    group: str
    plan: Plan


@dataclass(frozen=True)
class PipelinePlan:
    """Stages in pipeline order, the schedule, and who made it. The micro-batches, ZeRO stage
    and recomputation are the problem's (``Problem.micro_batches`` and so on)."""

    stages: tuple[Stage, ...]
    schedule: str = "1f1b"
    planner: str = ""
    info: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "info", MappingProxyType(dict(self.info)))
        if self.schedule not in SCHEDULES:
            raise ConfigError(
                f"schedule must be one of {', '.join(SCHEDULES)} (got {self.schedule!r})"
            )

    def __reduce__(self):
        return (PipelinePlan, (self.stages, self.schedule, self.planner, dict(self.info)))


def stage_problem(problem: Problem, first: int, last: int, group: str) -> Problem:
    """The sub-problem of one stage: its segment graph on its group, every setting kept."""
    return dataclasses.replace(
        problem, graph=segment(problem.graph, first, last), array=group_array(problem.array, group)
    )


def in_flight(schedule: str, stage: int, stages: int, micro_batches: int) -> int:
    """Micro-batches whose activations stage ``stage`` (0 first) of ``stages`` holds at its peak
    under ``schedule`` (:data:`SCHEDULES`): ``stages - stage`` under 1F1B, every micro-batch under
    GPipe; never more than ``micro_batches``."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"schedule must be one of {', '.join(SCHEDULES)} (got {schedule!r})")
    return SCHEDULES[schedule](stage, stages, micro_batches)


def stage_link(array: ArrayNode, a: str, b: str) -> tuple[float, float, float]:
    """(bytes/s at which group ``a`` receives from ``b``, the reverse, latency): the link of their
    lowest common group, on ``min(ports, |a|, |b|)`` ports (each device of the smaller group
    sends its own piece, section 4.1)."""
    lca = 0
    while lca < min(len(a), len(b)) and a[lca] == b[lca]:
        lca += 1
    if lca == len(a) or lca == len(b):
        raise ConfigError(f"stage groups '{a or 'root'}' and '{b or 'root'}' overlap")
    top = array.at(a[:lca])
    ports = min(top.link.ports, array.at(a).count, array.at(b).count)
    left, right = (bw / top.link.ports * ports for bw in top.link.side_bytes_per_s)
    receive_a, receive_b = (left, right) if a[lca] == "L" else (right, left)
    return receive_a, receive_b, top.link.latency_s


def _between(problem: Problem, a: str, b: str) -> SideSpec:
    """Groups ``a`` and ``b`` as the two sides of section 4's receive time (one message each way)."""
    receive_a, receive_b, latency = stage_link(problem.array, a, b)
    return SideSpec(
        devices=(problem.array.at(a).as_device, problem.array.at(b).as_device),
        bytes_per_s=(receive_a, receive_b),
        latency_s=latency,
        bytes_per_element=problem.bytes_per_element,
    )


def cut_seconds(
    problem: Problem, a: str, b: str, elements_per_sample: float, micro_batches: int
) -> float:
    """One micro-batch across the cut from group ``a`` to group ``b``: its activation into ``b``
    and its gradient back into ``a``, each one message priced by section 4's receive time (the
    link's latency, the bytes at the receiving group's rate; section 11)."""
    side = _between(problem, a, b)
    elements = _per_micro_batch(problem, elements_per_sample, micro_batches)
    return receive_seconds(side, 1, elements) + receive_seconds(side, 0, elements)


def _per_micro_batch(problem: Problem, elements_per_sample: float, micro_batches: int) -> float:
    return elements_per_sample * problem.batch / micro_batches


def cut_elements(problem: Problem, plan: PipelinePlan) -> tuple[float, ...]:
    """Per cut of ``plan``: the elements of one micro-batch's crossing tensor, the amount each
    message of :func:`cut_seconds` carries (section 11)."""
    graph = problem.graph
    info = graph.analyze()
    return tuple(
        _per_micro_batch(
            problem, info.out_shape[cut_tensor(graph, st.last)].elements, problem.micro_batches
        )
        for st in plan.stages[:-1]
    )


@dataclass(frozen=True)
class BoundaryMove:
    """Elements moved inside a stage's group at a cut, over the step (section 11 "Moves inside
    the groups"): at split ``split`` (a path inside the group), side ``side`` (1 or 2) receives
    them; ``kind`` is ``"input"`` (the arrived input forwarded to the second side that needs it),
    ``"input-gradient"`` (the second side's summed gradient of the input, to the first) or
    ``"output-gradient"`` (the arrived gradient of the stage's output, forwarded to the second
    side that holds it)."""

    split: str
    side: int
    kind: str
    elements: float


def _node_regions(sub: Problem, plan: Plan, nodes) -> dict[str, dict[int, Region]]:
    """The regions (section 3) of planning nodes ``nodes`` at every group of ``sub``'s array,
    by path."""
    out: dict[str, dict[int, Region]] = {}

    def walk(group: ArrayNode, path: str, regions: dict[int, Region]) -> None:
        out[path] = regions
        if group.is_leaf:
            return
        split = plan.splits[path]
        for side, child in ((0, group.left), (1, group.right)):
            walk(
                child,
                path + "LR"[side],
                {
                    v: child_region(r, split.choices[v], split.shares[v], side)
                    for v, r in regions.items()
                },
            )

    walk(sub.array, "", dict.fromkeys(nodes, ROOT))
    return out


def _area(pred, *box_lists: Sequence[tuple]) -> float:
    """Area of the points where ``pred(inside)`` holds, ``inside[i]`` telling whether a point
    lies in one of the boxes ``(r0, r1, c0, c1)`` of ``box_lists[i]`` (a grid of every edge)."""
    lists = [[x for x in boxes if x[1] > x[0] and x[3] > x[2]] for boxes in box_lists]
    rows = sorted({v for boxes in lists for x in boxes for v in x[:2]})
    cols = sorted({v for boxes in lists for x in boxes for v in x[2:]})
    total = 0.0
    for r0, r1 in zip(rows, rows[1:]):
        for c0, c1 in zip(cols, cols[1:]):
            inside = [
                any(x[0] <= r0 and r1 <= x[1] and x[2] <= c0 and c1 <= x[3] for x in boxes)
                for boxes in lists
            ]
            if pred(inside):
                total += (r1 - r0) * (c1 - c0)
    return total


def input_readers(sub: Problem) -> tuple[int, ...]:
    """Planning nodes of ``sub`` that read its graph input (directly or through element-wise
    layers, which travel with them; section 1)."""
    graph, nodes = sub.graph, sub.planning.nodes
    names = {n.name: v for v, n in enumerate(nodes)}
    origin = {INPUT: INPUT}
    for name in graph.analyze().order:
        origin[name] = name if name in names else origin[graph.layer(name).inputs[0]]
    return tuple(
        v
        for v, n in enumerate(nodes)
        if any(origin[s] == INPUT for s in graph.layer(n.name).inputs)
    )


def output_producer(sub: Problem) -> int | None:
    """The planning node whose output (or an element-wise layer after it) is ``sub``'s last
    layer's output: what holds the tensor a stage passes on (None: no node before it)."""
    graph, nodes = sub.graph, sub.planning.nodes
    names = {n.name: v for v, n in enumerate(nodes)}
    name = graph.analyze().order[-1]
    while name not in names:
        if name == INPUT:
            return None
        name = graph.layer(name).inputs[0]
    return names[name]


def boundary_moves(
    sub: Problem, plan: Plan, arrives: bool, passes_on: bool
) -> tuple[BoundaryMove, ...]:
    """The moves inside a stage's group at its cuts (section 11), over the step.

    Its input arrives once (``arrives``: not the first stage), each point on the first device
    that needs it; at every split the second side receives from the first what both need
    (``"input"``). Its input's gradient is summed back onto those devices: each reader's
    gradient of a point is whole wherever the reader needs the point, and the copy summed is the
    first such device's, so at every split the first side receives, for the points it needs,
    the sum of the copies the second side holds (``"input-gradient"``). The gradient of what it
    passes on (``passes_on``: not the last stage) arrives once, on the first device holding each
    point, and at every split the second side receives what both hold (``"output-gradient"``).
    """
    graph = sub.graph
    info = graph.analyze()
    readers = input_readers(sub) if arrives else ()
    producer = output_producer(sub) if passes_on else None
    if not readers and producer is None:
        return ()
    regions = _node_regions(sub, plan, {*readers, *(() if producer is None else (producer,))})
    e_in = graph.input_shape.elements * sub.batch
    e_out = info.out_shape[info.order[-1]].elements * sub.batch
    out = []

    def walk(group: ArrayNode, path: str, before: tuple) -> None:
        """``before``: per reader, the boxes it needs on the devices before this group."""
        if group.is_leaf:
            return
        left, right = regions[path + "L"], regions[path + "R"]
        k = len(readers)
        if readers:
            need_l = [[left[v].rect("in")] for v in readers]
            need_r = [[right[v].rect("in")] for v in readers]
            both = _area(lambda x: any(x[:k]) and any(x[k:]), *need_l, *need_r)
            if both > 0:
                out.append(BoundaryMove(path, 2, "input", both * e_in))
            # side 2's copies summed: needed there, not on side 1 nor before this group
            back = _area(
                lambda x: any(x[:k]) and any(x[k + i] and not x[2 * k + i] for i in range(k)),
                *need_l,
                *need_r,
                *[[*need_l[i], *before[i]] for i in range(k)],
            )
            if back > 0:
                out.append(BoundaryMove(path, 1, "input-gradient", back * e_in))
        if producer is not None:
            both = _area(all, [left[producer].rect("out")], [right[producer].rect("out")])
            if both > 0:
                out.append(BoundaryMove(path, 2, "output-gradient", both * e_out))
        walk(group.left, path + "L", before)
        walk(
            group.right,
            path + "R",
            tuple((*b, left[v].rect("in")) for b, v in zip(before, readers)),
        )

    walk(sub.array, "", tuple(() for _ in readers))
    return tuple(out)


def boundary_seconds(sub: Problem, moves: Sequence[BoundaryMove]) -> float:
    """The time of a stage's moves inside its group (section 11): per kind, each split's slower
    side, then the slower of its two halves' own moves (the halves move at once); the three
    kinds one after the other (the input before the forward, its gradient after the backward,
    the output's gradient before it)."""
    at: dict[tuple[str, str], list[float]] = {}
    for mv in moves:
        side = sub.side_spec(sub.array.at(mv.split))
        t = receive_seconds(side, mv.side - 1, mv.elements)
        at.setdefault((mv.kind, mv.split), []).append(t)

    def tree(kind: str, group: ArrayNode, path: str) -> float:
        if group.is_leaf:
            return 0.0
        here = max(at.get((kind, path), [0.0]))
        return here + max(tree(kind, group.left, path + "L"), tree(kind, group.right, path + "R"))

    kinds = {mv.kind for mv in moves}
    return sum(tree(kind, sub.array, "") for kind in sorted(kinds))


def stage_seconds(sub: Problem, ev: Evaluation, moves: Sequence[BoundaryMove]) -> float:
    """A stage's time ``T_s`` for the step (section 11): the evaluator's price of its plan on
    its sub-problem (``ev``) and its moves inside its group at its cuts (:func:`boundary_moves`)."""
    return ev.step_time_s + (boundary_seconds(sub, moves) if moves else 0.0)


def pipeline_seconds(
    stage_seconds: Sequence[float], transfer_s: Sequence[float], micro_batches: int
) -> float:
    """A synchronous pipeline's step (section 11): ``stage_seconds`` are each stage's time for the
    whole step (its ``m`` micro-batches), ``transfer_s`` each cut's per micro-batch."""
    return pipeline_step([t / micro_batches for t in stage_seconds], transfer_s, micro_batches)


def pipeline_step(
    micro_seconds: Sequence[float], transfer_s: Sequence[float], micro_batches: int
) -> float:
    """The step from each stage's time per micro-batch and each cut's transfer (section 11):
    ``sum t + sum x + (m - 1) max(t, x)``; the stage-cut DP and MIP price their cuts with it."""
    per = [float(t) for t in micro_seconds] + [float(x) for x in transfer_s]
    return sum(per) + (micro_batches - 1) * max(per)


@dataclass(frozen=True)
class PipelineEvaluation:
    """The price of a :class:`PipelinePlan`: the step, each stage's step time on its group
    (its micro-batches and gradient exchange, and its moves at its cuts), each cut's transfer per micro-batch, the
    exchange of weights tied across stages, and every device's memory (global leaf paths)."""

    step_time_s: float
    stage_time_s: tuple[float, ...]
    transfer_s: tuple[float, ...]
    tied_sync_s: float
    device_memory_bytes: Mapping[str, float]
    stage_evaluations: tuple[Evaluation, ...]
    micro_batches: int
    #: per stage, its moves inside its group at its cuts (:func:`boundary_moves`), in its time
    boundary_moves: tuple[tuple[BoundaryMove, ...], ...] = ()

    @property
    def peak_memory_bytes(self) -> float:
        return max(self.device_memory_bytes.values())

    @property
    def bubble_fraction(self) -> float:
        """Share of the step the slowest stage is idle (fill and drain)."""
        busiest = max(self.stage_time_s)
        return max(0.0, 1.0 - busiest / self.step_time_s) if self.step_time_s > 0 else 0.0

    def __repr__(self) -> str:
        return (
            f"PipelineEvaluation(step_time_s={self.step_time_s:.6g}, stages={len(self.stage_time_s)}, "
            f"micro_batches={self.micro_batches}, peak_memory_bytes={self.peak_memory_bytes:.6g})"
        )


def check_pipeline(problem: Problem, plan: PipelinePlan) -> None:
    """Raise :class:`ConfigError` unless ``plan``'s stages cover the graph in order, end at cut
    points, and sit on disjoint groups of the array."""
    if not isinstance(plan, PipelinePlan):
        raise ConfigError(f"expected a PipelinePlan (got {type(plan).__name__})")
    if not plan.stages:
        raise ConfigError("a pipeline plan needs at least one stage")
    n = len(problem.graph.analyze().order)
    cuts = set(cut_points(problem.graph))
    at = 0
    for s, stage in enumerate(plan.stages):
        if stage.first != at or stage.last < stage.first:
            raise ConfigError(
                f"stage {s} covers layers {stage.first}..{stage.last}; expected it to start at {at}"
            )
        if stage.last != n - 1 and stage.last not in cuts:
            raise ConfigError(
                f"stage {s} ends after layer '{problem.graph.analyze().order[stage.last]}', "
                "where more than one tensor crosses; stages end at cut points"
            )
        at = stage.last + 1
        problem.array.at(stage.group)  # a ConfigError naming the path if there is no such group
    if at != n:
        raise ConfigError(f"the stages cover layers 0..{at - 1} of {n}")
    paths = [stage.group for stage in plan.stages]
    for i, a in enumerate(paths):
        for b in paths[i + 1 :]:
            if a.startswith(b) or b.startswith(a):
                raise ConfigError(f"stage groups '{a or 'root'}' and '{b or 'root'}' overlap")


def structure(graph: Graph) -> tuple:
    """A key equal for graphs of the same layers in the same order wired the same way, whatever
    their names (a transformer's stages of equal blocks): they price alike on equal groups."""
    order = graph.analyze().order
    pos = {name: k for k, name in enumerate(order)}
    out: list = [graph.input_shape]
    for name in order:
        layer = graph.layer(name)
        fields = tuple(
            (f.name, getattr(layer, f.name))
            for f in dataclasses.fields(layer)
            if f.name not in ("name", "inputs", "fuses")  # names, not structure
        )
        out.append((type(layer).__name__, fields, tuple(pos.get(src, -1) for src in layer.inputs)))
    return tuple(out)


def stage_evaluation(sub: Problem, plan: Plan, memo: dict | None = None) -> Evaluation:
    """:func:`evaluate` of a stage's plan on its sub-problem, with per-node memory; ``memo``
    shares it between stages of the same :func:`structure` on equal groups at the same settings
    (its rows then name the first such stage's layers: the times and memory are the same)."""
    if memo is None:
        return evaluate(sub, plan, node_memory=True)
    key = (
        structure(sub.graph),
        signature(sub.array),
        sub.array.collective,
        tuple(sorted(plan.splits.items())),
        sub.batch,
        sub.bytes_per_element,
        sub.optimizer_bytes_per_param,
        sub.compat,
        sub.zero_stage,
        sub.recompute,
        sub.checkpoint,
        sub.micro_batches,
        sub.overlap,
    )
    if key not in memo:
        memo[key] = evaluate(sub, plan, node_memory=True)
    return memo[key]


def held_memory(evaluation: Evaluation, held: int) -> dict[str, float]:
    """Each device's need (leaf path in the stage's group) when the stage holds ``held``
    micro-batches in flight: its state plus ``held`` times one micro-batch's activations
    (section 11; ``evaluation`` from :func:`stage_evaluation`), and what it holds for a while:
    with recomputation the largest checkpointed block's activations again, of the one
    micro-batch in its backward (section 6.3), and at ZeRO-3 the largest unit's gathered
    weights (section 6.1)."""
    return {
        path: float(state.sum() + held * activations.sum() + again)
        for path, (state, activations, again) in evaluation.node_memory.items()
    }


def evaluate_pipeline(
    problem: Problem, plan: PipelinePlan, memo: dict | None = None
) -> PipelineEvaluation:
    """Price ``plan`` on ``problem`` (section 11); each stage by :func:`evaluate` on its
    sub-problem (``memo``: see :func:`stage_evaluation`)."""
    check_pipeline(problem, plan)
    graph, m, p = problem.graph, problem.micro_batches, len(plan.stages)
    info = graph.analyze()
    times, evaluations, memory, moves = [], [], {}, []
    for s, stage in enumerate(plan.stages):
        sub = stage_problem(problem, stage.first, stage.last, stage.group)
        ev = stage_evaluation(sub, stage.plan, memo)
        evaluations.append(ev)
        moves.append(boundary_moves(sub, stage.plan, s > 0, s < p - 1))
        times.append(stage_seconds(sub, ev, moves[-1]))
        held = held_memory(ev, in_flight(plan.schedule, s, p, m))
        memory.update((stage.group + path, need) for path, need in held.items())
    transfers = [
        cut_seconds(
            problem, a.group, b.group, info.out_shape[cut_tensor(graph, a.last)].elements, m
        )
        for a, b in zip(plan.stages, plan.stages[1:])
    ]
    tied = tied_sync_seconds(problem, plan)
    step = pipeline_seconds(times, transfers, m) + tied
    return PipelineEvaluation(
        step,
        tuple(times),
        tuple(transfers),
        tied,
        MappingProxyType(memory),
        tuple(evaluations),
        m,
        tuple(moves),
    )


def tied_sync_seconds(problem: Problem, plan: PipelinePlan) -> float:
    """Weights tied across stages (an LM head sharing the embedding table): the two stages sum
    their gradients once per step, after the flush, each receiving the other's (section 11)."""
    graph = problem.graph
    if not isinstance(graph, TiedGraph) or not graph.tied:
        return 0.0
    order = graph.analyze().order
    pos = {name: k for k, name in enumerate(order)}

    def stage_of(name: str) -> int:
        return next(s for s, st in enumerate(plan.stages) if st.first <= pos[name] <= st.last)

    total = 0.0
    for name, owner in graph.tied:
        a, b = stage_of(owner), stage_of(name)
        if a == b:
            continue
        elements = graph._shared(name, owner)  # noqa: SLF001 - the graph's own count of the shared matrix
        side = _between(problem, plan.stages[a].group, plan.stages[b].group)
        total += max(receive_seconds(side, 0, elements), receive_seconds(side, 1, elements))
    return total


def whole_model_stage(problem: Problem, plan: Plan) -> PipelinePlan:
    """The one-stage pipeline of a partition plan (its price is the partition model's)."""
    return PipelinePlan(
        (Stage(0, len(problem.graph.analyze().order) - 1, "", plan),), planner=plan.planner
    )
