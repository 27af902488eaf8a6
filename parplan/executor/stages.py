"""Pipeline plans on the reference executor (docs/executor.md "Pipeline plans").

A :class:`~parplan.costmodel.stages.PipelinePlan` runs as one :class:`Schedule` per stage (its
sub-problem on its group, ranks local to the group) and, per cut, the routes of the crossing
tensor (docs/costmodel.md section 11):

- **across the cut, one copy each way per micro-batch**: each point of the tensor goes once
  from the first device of the earlier group that holds it to the first device of the later
  group that needs it (its *landing* device, section 3's rule for an arrival into a group), and
  its gradient comes back once, landing device to sender;
- **inside the groups**, split by split (section 11 "Moves inside the groups at a cut",
  :func:`~parplan.costmodel.stages.boundary_moves`): from the top down, the points both halves
  of a split need go from where they landed in the first half to where they land in the
  second (``input``); from the bottom up, each half's sum of the copies of the input's gradient
  that count (per reader, the first device's that needs the point) goes back the same way
  (``input-gradient``); from the top down, the returned gradient of the earlier stage's output
  goes to the second half where both halves hold the point (``output-gradient``). With the
  tensor divided by rows on both sides (data parallel stages) nothing moves inside.

The micro-batches run in the plan's schedule: 1F1B (each stage ``p - s - 1`` forwards ahead,
then one forward and one backward in turn, then the backwards left) or GPipe (every forward,
then every backward), with a flush: the weight gradients are exchanged after a stage's last
backward, as in section 6.4.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from parplan.costmodel.graph import INPUT, Embedding, TiedGraph
from parplan.costmodel.problem import Problem
from parplan.costmodel.stages import PipelinePlan, check_pipeline, cut_tensor, stage_problem
from parplan.errors import ConfigError
from parplan.executor.schedule import (
    Schedule,
    _leaf_paths,
    build_schedule,
    graph_frames,
    held_mask,
    need_mask,
    readers_of,
)


@dataclass(frozen=True)
class Route:
    """Points of a cut tensor (a ``(rows, cols)`` mask) moved from global rank ``src`` to
    ``dst``; the receiver counts them under ``key``: ``("cut", c, kind, split, side)`` with
    ``kind`` "forward" or "backward" across the cut (split "", side 0) or one of
    :class:`~parplan.costmodel.stages.BoundaryMove`'s kinds inside a group (``split`` the global
    path of the split it crosses, ``side`` the receiving side, 1 or 2)."""

    src: int
    dst: int
    mask: np.ndarray
    key: tuple


@dataclass(frozen=True)
class CutRoutes:
    """The routes of the tensor crossing from stage ``s`` to ``s + 1``, in the order they run:
    forward across the cut then ``fan_out`` inside the later group (before its forward);
    ``gather`` inside the later group (after its backward) then ``back`` across; ``fan_back``
    inside the earlier group (before its backward). ``tensor`` is its name in the earlier
    stage's graph (the later stage reads it as its input); ``cell`` its elements per (row,
    column)."""

    tensor: str
    cell: int
    forward: tuple[Route, ...]
    fan_out: tuple[Route, ...]
    gather: tuple[Route, ...]
    back: tuple[Route, ...]
    fan_back: tuple[Route, ...]
    #: per global rank of the later group, per reader of its input: the points whose gradient
    #: that device's copy is the one summed (the first device needing the point for the reader)
    owners: dict


@dataclass
class PipelineSchedule:
    """Everything the workers of a pipeline run need: one schedule per stage (ranks local to
    its group), each stage's first global rank map, the cuts' routes, and the order in which
    each stage runs its micro-batches' forwards ("F", j) and backwards ("B", j)."""

    problem: Problem
    plan: PipelinePlan
    leaves: tuple[str, ...]  # global leaf paths, rank order
    stages: tuple[Schedule, ...]
    ranks: tuple[tuple[int, ...], ...]  # per stage: global rank of each local rank
    cuts: tuple[CutRoutes, ...]
    order: tuple[tuple[tuple[str, int], ...], ...]

    def received(self) -> dict[tuple, int]:
        """Elements every message of one step brings, per key: each stage's
        (:meth:`Schedule.received`, its split paths made global) and each cut's routes."""
        out: dict[tuple, int] = {}
        for st, sched in zip(self.plan.stages, self.stages):
            for (split, *rest), n in sched.received().items():
                out[(st.group + split, *rest)] = n
        for cut in self.cuts:
            for routes in (cut.forward, cut.fan_out, cut.gather, cut.back, cut.fan_back):
                for r in routes:
                    # every micro-batch's rows of the mask, i.e. all of it over the step
                    out[r.key] = out.get(r.key, 0) + int(r.mask.sum()) * cut.cell
        return out

    def stage_of(self, rank: int) -> int | None:
        """The stage whose group holds global ``rank`` (None: an idle device)."""
        for s, ranks in enumerate(self.ranks):
            if rank in ranks:
                return s
        return None


def micro_batch_order(schedule: str, stage: int, stages: int, micro_batches: int):
    """The order of stage ``stage``'s forwards and backwards under ``schedule`` (section 11)."""
    m = micro_batches
    if schedule == "gpipe":
        return tuple([("F", j) for j in range(m)] + [("B", j) for j in range(m)])
    ahead = min(stages - stage - 1, m)
    out = [("F", j) for j in range(ahead)]
    for j in range(m - ahead):
        out += [("F", ahead + j), ("B", j)]
    out += [("B", j) for j in range(m - ahead, m)]
    return tuple(out)


def _check_runnable(problem: Problem, plan: PipelinePlan) -> None:
    graph = problem.graph
    order = graph.analyze().order
    if isinstance(graph, TiedGraph) and graph.tied:
        pos = {n: k for k, n in enumerate(order)}
        for name, owner in graph.tied:
            a = [s for s, st in enumerate(plan.stages) if st.first <= pos[owner] <= st.last]
            b = [s for s, st in enumerate(plan.stages) if st.first <= pos[name] <= st.last]
            if a != b:
                raise ConfigError(
                    f"run: '{name}' shares its weights with '{owner}' in another stage; the executor "
                    "does not run weights tied across stages"
                )
    for s, st in enumerate(plan.stages[:-1]):
        t = cut_tensor(graph, st.last)
        if t != order[st.last]:
            raise ConfigError(
                f"run: stage {s} ends after '{order[st.last]}' but passes on '{t}'; the executor runs "
                "cuts whose tensor is the stage's last layer's output"
            )
    for s, st in enumerate(plan.stages[1:], start=1):
        sub = stage_problem(problem, st.first, st.last, st.group)
        nodes = {n.name for n in sub.planning.nodes}
        for name in sub.graph.analyze().order:
            layer = sub.graph.layer(name)
            if INPUT in layer.inputs and name not in nodes:
                kind = "an embedding table" if isinstance(layer, Embedding) else "layer"
                raise ConfigError(
                    f"run: stage {s} reads its input through {kind} '{name}' before any weighted "
                    "layer or join; the executor runs stages whose input feeds weighted layers or "
                    "joins directly (a stage of a pre-norm transformer starts with its norm)"
                )


def _grouped(by_leaf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per group path (leaves included): the union of its leaves' masks."""
    out: dict[str, np.ndarray] = {}
    for leaf, m in by_leaf.items():
        for k in range(len(leaf) + 1):
            out[leaf[:k]] = out[leaf[:k]] | m if leaf[:k] in out else m.copy()
    return out


def _land(group: dict[str, np.ndarray], path: str, mask: np.ndarray):
    """(leaf, part): each point of ``mask`` on the first side under ``path`` whose mask has
    it, down to a device (section 3's landing rule)."""
    if not mask.any():
        return []
    if path + "L" not in group:
        return [(path, mask)]
    first = mask & group[path + "L"]
    return _land(group, path + "L", first) + _land(group, path + "R", mask & ~first)


def _tree(path: str, lands: dict, moved, into: int):
    """(src leaf, dst leaf, mask, split, side) at every split under ``path``: the points
    ``moved(split)`` go from the device of one half where they sit to the device of the other
    where they land (both by ``_land`` over ``lands``): into side 2 from the top down (forwarding
    a value that arrived on side 1) or into side 1 from the bottom up (a sum of side 2's)."""
    if path + "L" not in lands:
        return []
    left, right = path + "L", path + "R"
    src, dst = (left, right) if into == 2 else (right, left)
    here = []
    for a, part in _land(lands, src, moved(path)):
        for b, piece in _land(lands, dst, part):
            here.append((a, b, piece, path, into))
    below = _tree(left, lands, moved, into) + _tree(right, lands, moved, into)
    return here + below if into == 2 else below + here


def _cut_routes(
    problem: Problem,
    c: int,
    a: Schedule,
    b: Schedule,
    ga: str,
    gb: str,
    ranks_a,
    ranks_b,
    tensor: str,
) -> CutRoutes:
    """Section 11's moves of cut ``c`` between stage schedules ``a`` and ``b`` on groups at
    paths ``ga`` and ``gb`` (global ranks ``ranks_a``, ``ranks_b``)."""
    frame_a, frame_b = a.frames[tensor], b.frames[INPUT]
    if frame_a.cols != frame_b.cols or frame_a.cell != frame_b.cell:
        raise ConfigError(
            f"run: the tensor '{tensor}' is laid out differently on the two sides of its cut"
        )
    producer = a.origin[tensor]
    held = {
        leaf: held_mask(a.problem, a.frames, a.boxes[leaf][producer], tensor) for leaf in a.leaves
    }
    readers = readers_of(b.problem, b.frames).get(INPUT, [])
    rows, cols = problem.batch, frame_b.cols
    per = {
        r.node: {leaf: need_mask(b.boxes[leaf][r.node], r, rows, frame_b) for leaf in b.leaves}
        for r in readers
    }
    need = {leaf: np.logical_or.reduce([per[r.node][leaf] for r in readers]) for leaf in b.leaves}
    # the one copy of each reader's gradient of a point that is summed: the first device's
    # that needs the point for that reader (a reader's gradient is whole where it is needed)
    owners: dict[int, dict[str, np.ndarray]] = {}
    for r in readers:
        seen = np.zeros((rows, cols), dtype=bool)
        for leaf, rank in zip(b.leaves, ranks_b):
            owners.setdefault(rank, {})[r.node] = per[r.node][leaf] & ~seen
            seen |= per[r.node][leaf]
    owned = _grouped(
        {
            leaf: np.logical_or.reduce(list(owners[rank].values()))
            for leaf, rank in zip(b.leaves, ranks_b)
        }
    )
    ra, rb = dict(zip(a.leaves, ranks_a)), dict(zip(b.leaves, ranks_b))
    held_g, need_g = _grouped(held), _grouped(need)
    forward, back = [], []
    for bleaf, part in _land(need_g, "", need_g[""]):
        for aleaf, piece in _land(held_g, "", part):
            forward.append(Route(ra[aleaf], rb[bleaf], piece, ("cut", c, "forward", "", 0)))
            back.append(Route(rb[bleaf], ra[aleaf], piece, ("cut", c, "backward", "", 0)))

    def inside(moves, ranks, prefix, kind):
        return tuple(
            Route(ranks[x], ranks[y], m, ("cut", c, kind, prefix + split, side))
            for x, y, m, split, side in moves
        )

    both = lambda g: lambda p: g[p + "L"] & g[p + "R"]  # noqa: E731
    return CutRoutes(
        tensor,
        frame_a.cell,
        tuple(forward),
        inside(_tree("", need_g, both(need_g), 2), rb, gb, "input"),
        inside(
            _tree("", need_g, lambda p: need_g[p + "L"] & owned[p + "R"], 1),
            rb,
            gb,
            "input-gradient",
        ),
        tuple(back),
        inside(_tree("", held_g, both(held_g), 2), ra, ga, "output-gradient"),
        owners,
    )


def build_pipeline_schedule(problem: Problem, plan: PipelinePlan) -> PipelineSchedule:
    """Stage schedules, cut routes and micro-batch orders of one step of ``plan``."""
    check_pipeline(problem, plan)
    graph_frames(problem)
    _check_runnable(problem, plan)
    leaves = tuple(_leaf_paths(problem.array))
    rank = {p: i for i, p in enumerate(leaves)}
    stages, ranks = [], []
    for st in plan.stages:
        sched = build_schedule(stage_problem(problem, st.first, st.last, st.group), st.plan)
        stages.append(sched)
        ranks.append(tuple(rank[st.group + leaf] for leaf in sched.leaves))
    graph = problem.graph
    cuts = tuple(
        _cut_routes(
            problem,
            s,
            stages[s],
            stages[s + 1],
            st.group,
            plan.stages[s + 1].group,
            ranks[s],
            ranks[s + 1],
            cut_tensor(graph, st.last),
        )
        for s, st in enumerate(plan.stages[:-1])
    )
    p, m = len(plan.stages), problem.micro_batches
    order = tuple(micro_batch_order(plan.schedule, s, p, m) for s in range(p))
    return PipelineSchedule(problem, plan, leaves, tuple(stages), tuple(ranks), cuts, order)


__all__ = [
    "CutRoutes",
    "PipelineSchedule",
    "Route",
    "build_pipeline_schedule",
    "micro_batch_order",
]
