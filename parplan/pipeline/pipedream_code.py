"""PipeDream's released optimizer, formula for formula (``--cost-model pipedream-code``).

parplan's pipeline planner (:mod:`parplan.pipeline.planner`) implements the PipeDream paper's
recurrences. The optimizer PipeDream released (msr-fiddle/pipedream,
``optimizer/optimizer_graph_hierarchical.py``, commit 7db6a1c) differs from the paper; this
module reproduces it, so that its decisions can be compared with parplan's
(docs/pipeline.md, "The released optimizer"):

- **States are antichains.** Input nodes (descriptions starting ``Input``) are zeroed and
  removed, then sinks named ``__getitem__``; the DP runs over PipeDream's antichain DAG
  (from the first remaining source in file order: augment an antichain with the predecessors
  that feed outside it, advance one node at a time), not over a linearisation. A state's
  compute, activations and parameters are those of every node up to and including its
  antichain; a cut after it carries its augmented antichain's activations.
- **Stage time** ``(compute + 4 (m-1) / m x W / B) / m`` (a sum, not the paper's max),
  with the first stage of a range also dividing the sync by the machines of the level below.
- **Transfers** ``2 a / (B m')`` on the input and (but for the last) output of every stage after
  the first, only when an activation compression ratio is given (then divided by it).
- **Levels.** A level's table over every range replaces the compute of the level above;
  the top level keeps only ranges from the start. Ties keep the earliest candidate (the
  single stage, then predecessor states in index order, then fewer replicas); the released
  code's order among predecessors depends on Python's hash seed, so where plans tie its
  splits vary from run to run while its time does not (``tests/test_pipedream_code.py``).
- **Data parallelism** under the same formulas: per level, ``(T + 4 (m-1) / m x W / B / m_below) / m``.

Not reproduced: the optimizer's ``--use_memory_constraint``, ``--use_fewer_machines`` and
``--straight_pipeline`` switches (off by default there).

Example (PipeDream's VGG-16 profile on 4 machines at the optimizer's default 1 GB/s; the
optimizer prints the same stages, 0.175733 s per minibatch and 3.32x over data parallelism):
    >>> from parplan.pipeline.profile import read_profile
    >>> plan = code_plan(read_profile(PROFILES / "vgg16.graph.txt"), [4], [1e9])
    >>> [(s.start, s.end, s.replicas) for s in plan.levels[0]], round(plan.seconds, 6)
    ([(0, 15, 3), (15, 40, 1)], 0.175733)
    >>> round(plan.speedup_vs_data_parallel, 2)
    3.32
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import networkx as nx

from parplan.errors import ConfigError
from parplan.pipeline.plans import LevelPlan, PipelineResult, Stage
from parplan.pipeline.profile import PipelineProfile

#: PipeDream's published profiles (AlexNet, VGG-16, ResNet-18/50, GNMT), shipped with parplan.
PROFILES = Path(__file__).resolve().parents[1] / "data" / "pipedream"

__all__ = [
    "PROFILES",
    "CodeStates",
    "CodeStage",
    "CodePlan",
    "code_states",
    "code_plan",
    "code_price",
    "code_price_sets",
    "code_data_parallel",
    "to_level_plan",
    "SideBySide",
    "side_by_side",
    "side_by_side_table",
]


# ----------------------------------------------------------------------------------- antichains


@dataclass(frozen=True)
class CodeStates:
    """The optimizer's states: antichains in a topological order of its antichain DAG.

    ``members[i]`` are the nodes up to and including state ``i``'s antichain; ``compute_s``,
    ``parameter_bytes`` and ``activation_bytes`` are their sums; ``output_bytes[i]`` the
    activations of its augmented antichain; ``preds[i]`` every state before ``i`` in the DAG
    (ascending). ``removed`` are the profile nodes the optimizer drops (inputs, ``__getitem__``
    sinks); ``compute`` etc. give every remaining node's own values."""

    name: str
    antichains: tuple[frozenset[str], ...]
    members: tuple[frozenset[str], ...]
    compute_s: tuple[float, ...]
    activation_bytes: tuple[float, ...]
    parameter_bytes: tuple[float, ...]
    output_bytes: tuple[float, ...]
    preds: tuple[tuple[int, ...], ...]
    removed: tuple[str, ...]
    compute: dict
    parameters: dict

    @property
    def n(self) -> int:
        return len(self.antichains)

    @cached_property
    def pred_sets(self) -> tuple[frozenset[int], ...]:
        return tuple(frozenset(p) for p in self.preds)


class _Dag:
    """PipeDream's antichain rules on the profile graph (names; successor lists in file order)."""

    def __init__(self, nodes: list[str], edges: list[tuple[str, str]]):
        self.g = nx.DiGraph()
        self.g.add_nodes_from(nodes)
        self.g.add_edges_from(edges)
        self.succ = {v: [t for _, t in self.g.out_edges(v)] for v in nodes}
        self._anc: dict[str, frozenset[str]] = {}
        self._desc: dict[str, frozenset[str]] = {}

    def ancestors(self, v: str) -> frozenset[str]:
        if v not in self._anc:
            self._anc[v] = frozenset(nx.ancestors(self.g, v))
        return self._anc[v]

    def descendants(self, v: str) -> frozenset[str]:
        if v not in self._desc:
            self._desc[v] = frozenset(nx.descendants(self.g, v))
        return self._desc[v]

    def augment(self, antichain: list[str]) -> list[str]:
        """The antichain plus every predecessor of one of its nodes that feeds a node outside
        that node's predecessors (other than the node itself)."""
        extra = []
        for a in antichain:
            pa = self.ancestors(a)
            for p in sorted(pa):
                if p not in extra and any(t not in pa and t != a for t in self.succ[p]):
                    extra.append(p)
        return extra + [a for a in antichain if a not in extra]

    def deaugment(self, nodes: list[str]) -> list[str]:
        """Drops every node that has a successor in the list."""
        keep = [x for x in nodes if not any(y in self.descendants(x) for y in nodes)]
        return list(dict.fromkeys(keep))

    def next_antichains(self, antichain: list[str]) -> list[list[str]]:
        aug, inside = self.augment(antichain), set(antichain)
        out = []
        for x in aug:
            for t in self.succ[x]:
                if t in inside or any(y in self.descendants(t) for y in aug):
                    continue
                out.append(self.deaugment([t if y == x else y for y in aug]))
        return out


def _optimizer_graph(
    profile: PipelineProfile,
) -> tuple[list[str], list[tuple[str, str]], tuple[str, ...]]:
    """(nodes in file order, edges, removed nodes) after the optimizer's clean-up: sources
    named ``Input...`` removed (their time zeroed), then sinks named ``__getitem__...``."""
    layers = {layer.name: layer for layer in profile.layers}
    order = [n for n in (profile.declared or tuple(layers)) if n in layers]
    edges = list(profile.edges)
    has_in = {v for _, v in edges}
    inputs = [n for n in order if n not in has_in and layers[n].description.startswith("Input")]
    kept = [n for n in order if n not in inputs]
    edges = [(u, v) for u, v in edges if u in kept and v in kept]
    has_out = {u for u, _ in edges}
    sinks = [
        n for n in kept if n not in has_out and layers[n].description.startswith("__getitem__")
    ]
    kept = [n for n in kept if n not in sinks]
    edges = [(u, v) for u, v in edges if u in kept and v in kept]
    if not kept:
        raise ConfigError(
            f"profile '{profile.name}': nothing is left after removing its Input nodes"
        )
    return kept, edges, tuple(inputs) + tuple(sinks)


def _antichain_dag(dag: _Dag, first: str) -> tuple[list[list[str]], list[int], nx.DiGraph]:
    """(augmented antichain per state, a topological order of the states, the state DAG),
    breadth first from the antichain ``[first]``."""
    start = [first]
    keys = {frozenset(start): 0}
    augmented = [dag.augment(start)]
    states = nx.DiGraph()
    states.add_node(0)
    queue, expanded = deque([start]), set()
    while queue:
        antichain = queue.popleft()
        key = frozenset(antichain)
        if key in expanded:
            continue
        expanded.add(key)
        for nxt in dag.next_antichains(antichain):
            nk = frozenset(nxt)
            if nk not in keys:
                keys[nk] = len(keys)
                augmented.append(dag.augment(nxt))
            states.add_edge(keys[key], keys[nk])
            queue.append(nxt)
    return augmented, list(nx.lexicographical_topological_sort(states)), states


def code_states(profile: PipelineProfile) -> CodeStates:
    """The optimizer's antichain states of ``profile`` (see the module doc)."""
    layers = {layer.name: layer for layer in profile.layers}
    kept, edges, removed = _optimizer_graph(profile)
    dag = _Dag(kept, edges)
    augmented, order, states = _antichain_dag(dag, next(n for n in kept if not dag.g.in_degree(n)))
    index = {s: i for i, s in enumerate(order)}
    topo = [
        x.name for x in profile.layers if x.name in dag.g
    ]  # names in the profile's order, for reports
    compute = {n: layers[n].compute_seconds for n in topo}
    params = {n: layers[n].parameter_bytes for n in topo}
    members, c, a, w, o, preds = [], [], [], [], [], []
    for s in order:
        aug = augmented[s]
        m = frozenset(aug).union(*(dag.ancestors(x) for x in aug))
        members.append(m)
        # correctly rounded sums: independent of the sets' (hash) order
        c.append(math.fsum(compute[x] for x in m))
        a.append(math.fsum(layers[x].activation_bytes for x in m))
        w.append(math.fsum(params[x] for x in m))
        o.append(math.fsum(layers[x].activation_bytes for x in aug))
        preds.append(tuple(sorted(index[p] for p in nx.ancestors(states, s))))
    return CodeStates(
        profile.name,
        tuple(frozenset(augmented[s]) for s in order),
        tuple(members),
        tuple(c),
        tuple(a),
        tuple(w),
        tuple(o),
        tuple(preds),
        removed,
        compute,
        params,
    )


# ----------------------------------------------------------------------------------- the DP


@dataclass(frozen=True)
class CodeStage:
    """States ``start .. end - 1`` (the optimizer's printed range) on ``replicas`` machines."""

    start: int
    end: int
    replicas: int


@dataclass(frozen=True)
class CodePlan:
    """The optimizer's result: ``levels[0]`` the top level's stages, ``levels[k]`` the stages of
    level ``k`` below inside each stage above (in pipeline order); times in seconds."""

    states: CodeStates
    machines: tuple[int, ...]
    bandwidths: tuple[float, ...]
    compression: float | None
    levels: tuple[tuple[CodeStage, ...], ...]
    seconds: float
    data_parallel_seconds: float

    @property
    def single_seconds(self) -> float:
        return self.states.compute_s[-1]

    @property
    def speedup_vs_single(self) -> float:
        return self.single_seconds / self.seconds

    @property
    def speedup_vs_data_parallel(self) -> float:
        return self.data_parallel_seconds / self.seconds


def _ranges(values: tuple[float, ...]) -> list[list[float | None]]:
    """Row 0: the prefix values; row i > 0: values[j] - values[i - 1] for j >= i (else None)."""
    n = len(values)
    rows = [list(values)]
    for i in range(1, n + 1):
        rows.append([values[j] - values[i - 1] if j >= i else None for j in range(n)])
    return rows


def _table(
    st: CodeStates,
    compute,
    machines: int,
    within: int,
    bw: float,
    final: bool,
    compression: float | None,
):
    """One level's table: ``A[i][j][m]`` = (seconds, split (k, machines left) or None, replicas)
    for the range after state ``i - 1`` up to ``j`` on ``m + 1`` machines."""
    n = st.n
    params = _ranges(st.parameter_bytes)
    out = st.output_bytes
    A = [[[(None, None, None)] * machines for _ in range(n)] for _ in range(n + 1)]
    for i in range(n + 1):
        for j in range(i, n):
            c = compute[i][j]
            if c is None:
                continue
            w = params[i][j]
            A[i][j] = [
                ((c + 4.0 * m * w / (bw * (m + 1)) / within) / (m + 1), None, m + 1)
                for m in range(machines)
            ]
    for i in range(1 if final else n + 1):
        before = st.pred_sets[i - 1] if i else frozenset()
        for m in range(1, machines):
            for j in range(i + 1, n):
                best, split, used = A[i][j][m]
                out_j = 2.0 * out[j] if j < n - 1 else None
                for k in st.preds[j]:
                    if i and k in before:
                        continue
                    last_c = compute[k + 1][j]
                    if last_c is None:
                        continue
                    last_w = params[k + 1][j]
                    for mp in range(1, m + 1):
                        prev = A[i][k][m - mp][0]
                        if prev is None:
                            continue
                        t = max(prev, (last_c + 4.0 * (mp - 1) * last_w / (bw * mp)) / mp)
                        if compression is not None:
                            t = max(t, 2.0 * out[k] / (bw * mp) / compression)
                            if out_j is not None:
                                t = max(t, out_j / (bw * mp) / compression)
                        if best is None or best > t:
                            best, split, used = t, (k, m - mp), mp
                A[i][j][m] = (best, split, used)
    return A


def _analyze(A, start: int, end: int, machines: int) -> list[CodeStage]:
    """The stages of range ``start .. end - 1`` on ``machines`` machines, in pipeline order."""
    meta = A[start][end - 1][machines - 1]
    stages, stop = [], end
    while meta[1] is not None:
        k, rest = meta[1]
        stages.append(CodeStage(k + 1, stop, meta[2]))
        stop = k + 1
        meta = A[start][k][rest]
    stages.append(CodeStage(start, stop, meta[2]))
    return stages[::-1]


def _check_machine(machines, bandwidths, compression) -> tuple[tuple[int, ...], tuple[float, ...]]:
    machines, bandwidths = tuple(machines), tuple(bandwidths)
    if not machines or len(machines) != len(bandwidths):
        raise ConfigError(
            f"pipedream-code: give one bandwidth per level (got {len(machines)} levels, "
            f"{len(bandwidths)} bandwidths)"
        )
    if any(isinstance(m, bool) or int(m) != m or m < 1 for m in machines):
        raise ConfigError(
            f"pipedream-code: machines per level must be integers >= 1 (got {list(machines)})"
        )
    if any(not b > 0 for b in bandwidths):
        raise ConfigError(
            f"pipedream-code: bandwidths must be > 0 bytes/s (got {list(bandwidths)})"
        )
    if compression is not None and not compression > 0:
        raise ConfigError(
            f"pipedream-code: the activation compression ratio must be > 0 (got {compression})"
        )
    return tuple(int(m) for m in machines), tuple(float(b) for b in bandwidths)


def code_data_parallel(states: CodeStates, machines, bandwidths) -> float:
    """Data parallelism under the optimizer's formulas (its printed baseline)."""
    t, within = states.compute_s[-1], 1
    w = states.parameter_bytes[-1]
    for m, bw in zip(machines, bandwidths):
        t = (t + 4.0 * (m - 1) * w / (bw * m) / within) / m
        within = m
    return t


def code_plan(
    profile: PipelineProfile,
    machines,
    bandwidths,
    compression: float | None = None,
    states: CodeStates | None = None,
) -> CodePlan:
    """The optimizer's plan of ``profile`` on ``machines[k]`` machines per level (lowest first,
    as its ``-n``) joined by ``bandwidths[k]`` bytes/s (its ``-b``; its default is 1e9)."""
    machines, bandwidths = _check_machine(machines, bandwidths, compression)
    st = states or code_states(profile)
    compute = _ranges(st.compute_s)
    tables, within = [], 1
    for level, (m, bw) in enumerate(zip(machines, bandwidths)):
        A = _table(st, compute, m, within, bw, level == len(machines) - 1, compression)
        tables.append(A)
        within = m
        compute = [[A[i][j][-1][0] for j in range(st.n)] for i in range(st.n + 1)]
    levels, ranges = [], [(0, st.n)]
    for A, m in zip(reversed(tables), reversed(machines)):
        stages = [s for start, end in ranges for s in _analyze(A, start, end, m)]
        levels.append(tuple(stages))
        ranges = [(s.start, s.end) for s in stages]
    seconds = tables[-1][0][st.n - 1][machines[-1] - 1][0]
    return CodePlan(
        st,
        machines,
        bandwidths,
        compression,
        tuple(levels),
        seconds,
        code_data_parallel(st, machines, bandwidths),
    )


# ----------------------------------------------------------------------------------- pricing


def _stage_seconds(
    compute: float, weight_bytes: float, replicas: int, bw: float, divide_sync: int
) -> float:
    """The optimizer's stage time: ``(compute + 4 (r-1)/r x W / B / divide_sync) / r`` (the first
    stage of a range divides its sync by the machines below; later stages by 1)."""
    return (
        compute + 4.0 * (replicas - 1) * weight_bytes / (bw * replicas) / divide_sync
    ) / replicas


def code_price(
    states: CodeStates, machines, bandwidths, levels, compression: float | None = None
) -> float:
    """Seconds per minibatch of a nested plan given as the optimizer prints it (``levels[0]``
    the top level's stages, each deeper level's stages inside the ranges above), priced by the
    optimizer's formulas: an independent check of :func:`code_plan` on any plan."""
    machines, bandwidths = _check_machine(machines, bandwidths, compression)
    n = states.n
    c0 = states.compute_s

    def compute(level: int, start: int, end: int) -> float:
        if level == len(machines) - 1:  # the lowest level: the states' compute
            return c0[end - 1] - (c0[start - 1] if start else 0.0)
        inner = [s for s in levels[level + 1] if start <= s.start and s.end <= end]
        return price(level + 1, inner)

    def price(level: int, stages) -> float:
        k = len(machines) - 1 - level  # index into machines / bandwidths (lowest first)
        bw, within = bandwidths[k], machines[k - 1] if k else 1
        worst = 0.0
        for idx, s in enumerate(stages):
            c = compute(level, s.start, s.end)
            w = states.parameter_bytes[s.end - 1] - (
                states.parameter_bytes[s.start - 1] if s.start else 0.0
            )
            r = s.replicas
            t = _stage_seconds(c, w, r, bw, within if idx == 0 else 1)
            if idx and compression is not None:
                t = max(t, 2.0 * states.output_bytes[s.start - 1] / (bw * r) / compression)
                if s.end - 1 < n - 1:
                    t = max(t, 2.0 * states.output_bytes[s.end - 1] / (bw * r) / compression)
            worst = max(worst, t)
        return worst

    return price(0, levels[0])


def code_price_sets(
    states: CodeStates, machines, bandwidths, plan: LevelPlan, names: tuple[str, ...]
) -> float:
    """Seconds per minibatch of a parplan :class:`LevelPlan` (stages over positions of
    ``names``, any contiguous ranges of a linearisation) under the optimizer's formulas without
    compression: a stage's compute and weights are its nodes' (inputs count zero), the first
    stage of each range divides its sync by the machines below."""
    machines, bandwidths = _check_machine(machines, bandwidths, None)

    def stage_nodes(stage: Stage) -> list[str]:
        return [x for x in names[stage.first : stage.last + 1] if x in states.compute]

    def price(lp: LevelPlan) -> float:
        k = lp.level - 1
        bw, within = bandwidths[k], machines[k - 1] if k else 1
        worst = 0.0
        for idx, s in enumerate(lp.stages):
            nodes = stage_nodes(s)
            c = (
                price(s.inner)
                if s.inner is not None
                else math.fsum(states.compute[x] for x in nodes)
            )
            w = math.fsum(states.parameters[x] for x in nodes)
            worst = max(worst, _stage_seconds(c, w, s.replicas, bw, within if idx == 0 else 1))
        return worst

    if plan.level != len(machines):
        raise ConfigError(
            f"pipedream-code: the plan has {plan.level} levels, the machine {len(machines)}"
        )
    return price(plan)


def to_level_plan(plan: CodePlan, names: tuple[str, ...]) -> LevelPlan | None:
    """The optimizer's plan as a parplan :class:`LevelPlan` over positions of ``names`` (a
    linearisation, e.g. the profile's layers): each stage's nodes (the removed inputs go with
    the first stage, removed sinks with their producer's) must be one contiguous range there.
    None when a stage is not contiguous (a branching model linearised differently)."""
    st = plan.states
    pos = {x: i for i, x in enumerate(names)}
    owner: dict[str, int] = {}

    def nodes(s: CodeStage) -> frozenset[str]:
        return st.members[s.end - 1] - (st.members[s.start - 1] if s.start else frozenset())

    flat = plan.levels[-1]
    for idx, s in enumerate(flat):
        for x in nodes(s):
            owner[x] = idx
    for x in names:  # removed nodes: inputs to the first stage, sinks to the last stage before them
        if x not in owner:
            before = [owner[y] for y in names[: pos[x]] if y in owner]
            owner[x] = max(before) if before else 0
    spans = []
    for idx in range(len(flat)):
        where = sorted(pos[x] for x in names if owner[x] == idx)
        if not where or where[-1] - where[0] + 1 != len(where):
            return None
        spans.append((where[0], where[-1]))
    if sorted(spans) != spans:
        return None

    def build(level: int, lo: int, hi: int) -> LevelPlan:
        # the level-`level` (top = len(levels)) stages inside flat stage indices lo..hi
        depth = len(plan.levels) - level
        stages = []
        for s in plan.levels[depth]:
            inside = [i for i, f in enumerate(flat) if s.start <= f.start and f.end <= s.end]
            if not inside or inside[0] < lo or inside[-1] > hi:
                continue
            inner = build(level - 1, inside[0], inside[-1]) if level > 1 else None
            stages.append(Stage(spans[inside[0]][0], spans[inside[-1]][1], s.replicas, inner))
        return LevelPlan(level, tuple(stages))

    return build(len(plan.levels), 0, len(flat) - 1)


@dataclass(frozen=True)
class SideBySide:
    """The optimizer's plan and parplan's on one profile and machine, each priced by both
    models (seconds per minibatch; None where a plan cannot be priced by a model: a stage not
    contiguous in parplan's linearisation, or transfers the set pricing does not define)."""

    code: CodePlan
    native: PipelineResult
    code_by_parplan: float | None
    native_by_code: float | None

    def rows(self) -> list[dict]:
        """One row per plan: its time under each model and the speedups over each model's
        data parallelism."""
        code_dp, native_dp = self.code.data_parallel_seconds, self.native.data_parallel_seconds

        def ratio(a, b):
            return None if a is None or b is None else a / b

        return [
            {
                "plan": "pipedream-code",
                "stages": len(self.code.levels[-1]),
                "code_s": self.code.seconds,
                "parplan_s": self.code_by_parplan,
                "code_speedup_vs_dp": ratio(code_dp, self.code.seconds),
                "parplan_speedup_vs_dp": ratio(native_dp, self.code_by_parplan),
            },
            {
                "plan": "parplan",
                "stages": len(self.native.stages),
                "code_s": self.native_by_code,
                "parplan_s": self.native.seconds_per_minibatch,
                "code_speedup_vs_dp": ratio(code_dp, self.native_by_code),
                "parplan_speedup_vs_dp": ratio(native_dp, self.native.seconds_per_minibatch),
            },
        ]


def _fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def _stage_names(plan: CodePlan, stage: CodeStage) -> str:
    st = plan.states
    new = st.members[stage.end - 1] - (st.members[stage.start - 1] if stage.start else frozenset())
    order = [x for x in st.compute if x in new]
    return order[0] if len(order) == 1 else f"{order[0]}..{order[-1]} ({len(order)} nodes)"


def side_by_side_table(sbs: SideBySide) -> str:
    """Plain-text report of :func:`side_by_side`: the optimizer's stages per level, then both
    plans under both models."""
    code = sbs.code
    lines = [
        f"PipeDream's released optimizer (--cost-model pipedream-code) on {code.states.name}: "
        f"{code.states.n} antichain states; machines per level {list(code.machines)} (lowest first) at "
        f"{', '.join(f'{b / 1e9:g}' for b in code.bandwidths)} GB/s"
        + (f", activation compression {code.compression:g}" if code.compression else ""),
        "",
    ]
    for depth, stages in enumerate(code.levels):
        lines.append(f"  level {len(code.levels) - depth} stages (states, replicas, nodes):")
        for s in stages:
            lines.append(f"    [{s.start}, {s.end})  x{s.replicas}  {_stage_names(code, s)}")
    lines += [
        "",
        f"  {'plan':<16}{'stages':>7}{'code model ms':>15}{'parplan ms':>12}{'code vs DP':>12}"
        f"{'parplan vs DP':>15}",
    ]
    for r in sbs.rows():

        def x(v):
            return "-" if v is None else f"{v:.2f}x"

        lines.append(
            f"  {r['plan']:<16}{r['stages']:>7}{_fmt_ms(r['code_s']):>15}{_fmt_ms(r['parplan_s']):>12}"
            f"{x(r['code_speedup_vs_dp']):>12}{x(r['parplan_speedup_vs_dp']):>15}"
        )
    lines += [
        "",
        "  code model: the optimizer's formulas (stage time (compute + 4(m-1)/m W/B)/m, no transfers "
        "without compression, inputs' loading time zeroed, antichain states); parplan: "
        "docs/pipeline.md (max(compute, ring sync)/m, every cut's transfer, the profile's own order).",
    ]
    if sbs.code_by_parplan is None:
        lines.append(
            "  '-': the optimizer's stages are not contiguous in parplan's linearisation, so parplan's "
            "model cannot price them"
        )
    return "\n".join(lines)


def side_by_side(
    profile: PipelineProfile, machine, compression: float | None = None, options=None
) -> SideBySide:
    """:func:`code_plan` and parplan's :func:`~parplan.pipeline.dp.plan_pipeline` on ``profile``
    and ``machine`` (its levels' machines and link bandwidths; the optimizer has no latency),
    each priced by both models."""
    from parplan.pipeline.dp import plan_pipeline
    from parplan.pipeline.evaluate import evaluate_plan
    from parplan.pipeline.plans import PipelineOptions

    options = options or PipelineOptions()
    machines = [lv.machines for lv in machine.levels]
    bandwidths = [lv.bytes_per_s for lv in machine.levels]
    st = code_states(profile)
    code = code_plan(profile, machines, bandwidths, compression, st)
    native = plan_pipeline(profile, machine, options)
    names = tuple(layer.name for layer in profile.layers)
    lp = to_level_plan(code, names)
    code_by_parplan = (
        evaluate_plan(profile, machine, lp, options).seconds_per_minibatch
        if lp is not None
        else None
    )
    native_by_code = (
        code_price_sets(st, machines, bandwidths, native.plan, names)
        if compression is None
        else None
    )
    return SideBySide(code, native, code_by_parplan, native_by_code)
