"""Pipeline x partition x data: stages of the layer graph on groups of the array, each stage
partitioned inside its group by AccPar's per-layer types and shares (docs/costmodel.md section
11, docs/pipeline.md "Pipeline x partition").

**The plan space** (:mod:`parplan.costmodel.stages`): stages end at single-tensor cuts of the
layer graph (a transformer's block boundaries, a CNN's between residual blocks); the stages'
groups are the subtrees of the array's bisection tree at one depth, in tree order or reversed
(``h100:16``: 1 stage of 16, 2 of 8 (the nodes), 4 of 4, ...; ``a100:8,h100:8``: one node of
each kind); each stage is partitioned on its group by a partition plan (which may be data
parallel, tensor parallel or any AccPar mix); the micro-batches, the ZeRO stage and
recomputation are global settings searched as :func:`parplan.solvers.fit.techniques` lists them.

**The search** is exact over that space for its *stage prices*: for every distinct group a
whole-model partition plan (the *template*: the planner's and data parallelism's) is priced once
per setting, and a stage's price is its nodes' share of it (per-node times and per-device,
per-node memory from the evaluator), with its devices' memory checked at the micro-batches its
stage holds in flight. For each depth, order and setting, a DP over (stage, last cut) minimises
``sum_s t_s + sum_c x_c`` under a bound ``tau`` on every ``t_s`` and ``x_c``, for every ``tau``
among the stage and transfer prices from the least feasible one up, and keeps the least
``F(tau) + (m - 1) tau``; ``tau`` stops once ``F(inf) + (m - 1) tau`` cannot beat the best. This
is the pipeline formula's optimum (the max is one of the prices), checked against enumeration
of every stage split (:func:`brute_force`).

**The result** is priced exactly: the best few candidates are rebuilt with each stage's own
plan (the template's restriction to the stage, or the planner's plan of the stage's
sub-problem, the faster that fits) and priced by :func:`~parplan.costmodel.stages.evaluate_pipeline`,
which re-checks every device's memory. The one-stage candidate is :func:`~parplan.solvers.fit.fit_plan`'s
plan, so the joint plan is never slower than the partition-only plan; the data-parallel-stage
DP's best is a candidate too, so it is never slower than the pipeline-only plan of this space.

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> p = Problem(get_model("gpt2"), parse_array("h100:4"), batch=8)
    >>> r = plan_partitioned(p, limit_bytes=0.8 * 2**30)
    >>> one_stage = r.priced[0]  # the partition-only plan that fits: ZeRO-3 and recomputation
    >>> len(r.plan.stages), r.evaluation.step_time_s < one_stage[1], r.evaluation.peak_memory_bytes <= 0.8 * 2**30
    (2, True, True)
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.hardware import ArrayNode, signature
from parplan.costmodel.problem import ZERO_STAGES, Plan, Problem, Split
from parplan.costmodel.stages import (
    SCHEDULES,
    PipelineEvaluation,
    PipelinePlan,
    Stage,
    boundary_moves,
    cut_points,
    cut_tensor,
    cut_seconds,
    evaluate_pipeline,
    group_array,
    groups_at,
    held_memory,
    in_flight,
    stage_evaluation,
    stage_seconds,
    stage_problem,
    structure,
    whole_model_stage,
)
from parplan.errors import ConfigError, InfeasibleError
from parplan.formulation.stages import build_stage_mip, stage_value
from parplan.solvers.fit import device_limits, fit_plan
from parplan.solvers.planners import make_plan

#: Candidates of the DP (by their estimated step) rebuilt with per-stage plans and priced exactly.
EXACT_CANDIDATES = 4
#: Most values of the bound ``tau`` tried per DP (a note says so when it is reached).
MAX_TAUS = 20000
#: Stages on groups of more devices than this are planned by the ``accpar-topdown`` recursion
#: instead of the ``accpar`` portfolio, and the one-stage candidate is the root's templates
#: instead of :func:`fit_plan`'s plan (the portfolio's look-ahead costs minutes there).
PORTFOLIO_MAX_DEVICES = 8


@dataclass(frozen=True)
class Setting:
    """One global setting: micro-batches, ZeRO stage, recomputation."""

    micro_batches: int
    zero_stage: int
    recompute: bool

    def apply(self, problem: Problem) -> Problem:
        return replace(
            problem,
            micro_batches=self.micro_batches,
            zero_stage=self.zero_stage,
            recompute=self.recompute,
        )

    def label(self) -> str:
        return f"m={self.micro_batches}, zero-{self.zero_stage}" + (
            ", recompute" if self.recompute else ""
        )


@dataclass(frozen=True)
class Candidate:
    """A DP optimum: estimated step (template prices), setting, groups and stage cuts."""

    estimate_s: float
    setting: Setting
    groups: tuple[str, ...]
    bounds: tuple[int, ...]  # unit boundaries (indices into the boundary list), len(groups) + 1
    kinds: tuple[str, ...]  # the template each stage's price came from
    data_only: bool = False


@dataclass(frozen=True)
class PartitionedResult:
    """The joint plan: the problem with the chosen setting, the plan and its exact price; the
    candidates the DP found (estimates) and what was priced exactly (``priced``: label, step
    seconds, peak bytes, fits)."""

    problem: Problem
    plan: PipelinePlan
    evaluation: PipelineEvaluation
    candidates: tuple[Candidate, ...]
    priced: tuple[tuple[str, float, float, bool], ...]
    notes: tuple[str, ...] = ()


def boundaries(problem: Problem) -> tuple[int, ...]:
    """Unit boundaries: -1, every cut point, the last layer's position."""
    order = problem.graph.analyze().order
    return (-1, *cut_points(problem.graph), len(order) - 1)


def frontiers(array: ArrayNode, max_stages: int) -> list[tuple[str, ...]]:
    """The groups of each depth of the bisection tree (a leaf above the depth stays), in tree
    order and reversed (when that differs), up to ``max_stages`` groups."""
    out: list[tuple[str, ...]] = []
    for depth in range(array.depth + 1):
        groups = list(groups_at(array, depth))
        if len(groups) > max_stages:
            break
        for order in (tuple(groups), tuple(reversed(groups))):
            if order not in out and (
                order == tuple(groups)
                or [signature(array.at(g)) for g in order]
                != [signature(array.at(g)) for g in groups]
            ):
                out.append(order)
    return out


def settings_of(
    problem: Problem, stages: int, micro_batches="auto", zero="auto", recompute="auto"
) -> list[Setting]:
    """Settings to search for ``stages`` stages: each given tuple, or "auto": micro-batches
    ``p``, ``2p``, ``4p`` and ``8p`` that divide the batch (fewer leave most of a pipeline idle,
    more cost a latency and a weight read each; for one stage, 1 to 8), ZeRO stages 1 and 3 (stage 0
    costs what stage 1 costs and keeps more; stage 2 reduce-scatters every micro-batch), and
    recomputation off and on."""
    if micro_batches == "auto":
        ms = [
            m
            for m in (stages, 2 * stages, 4 * stages, 8 * stages)
            if m <= problem.batch and problem.batch % m == 0
        ]
        ms = ms or [
            max(m for m in range(1, min(stages, problem.batch) + 1) if problem.batch % m == 0)
        ]
    else:
        ms = list(micro_batches)
    zs = [1, 3] if zero == "auto" else list(zero)
    rs = [False, True] if recompute == "auto" else list(recompute)
    for m in ms:
        if isinstance(m, bool) or not isinstance(m, int) or m < 1 or problem.batch % m:
            raise ConfigError(f"micro-batches must divide the batch {problem.batch} (got {m!r})")
    for z in zs:
        if isinstance(z, bool) or z not in ZERO_STAGES:
            raise ConfigError(
                f"ZeRO stage must be one of {', '.join(map(str, ZERO_STAGES))} (got {z!r})"
            )
    if not ms or not zs or not rs:
        raise ConfigError(
            "the pipeline search needs at least one value of micro-batches, ZeRO stage and recompute"
        )
    return [Setting(m, z, bool(r)) for m in ms for z in zs for r in rs]


def template_planner(planner: str) -> str:
    """The planner of the templates: ``accpar``'s published recursion for the portfolio (the
    templates only price the search; the stages that win are planned again by ``planner``)."""
    return "accpar-topdown" if planner == "accpar" else planner


def _groups_text(groups: Sequence[str], array: ArrayNode) -> str:
    sizes = sorted({array.at(g).count for g in groups})
    names = (
        ", ".join(g or "root" for g in groups)
        if len(groups) <= 8
        else f"{groups[0]} .. {groups[-1]}"
    )
    return f"groups of {'/'.join(map(str, sizes))} device{'s' * (sizes != [1])} ({names})"


class _Prices:
    """Template plans and their per-unit prefix sums per (group signature, template, setting)."""

    def __init__(
        self,
        problem: Problem,
        planner: str,
        bounds: Sequence[int],
        limits: dict[str, float],
        say: Callable[[str], None],
    ):
        self.problem, self.planner, self.limits, self.say = problem, planner, limits, say
        order = problem.graph.analyze().order
        pos = {name: k for k, name in enumerate(order)}
        b = np.asarray(bounds)
        # unit of each planning node: boundaries[u] < pos <= boundaries[u + 1]
        self.unit = np.array(
            [int(np.searchsorted(b, pos[n.name], side="left")) - 1 for n in problem.planning.nodes]
        )
        self.units = len(bounds) - 1
        self.templates: dict[tuple, dict[str, Plan]] = {}
        self.sums: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}

    def key(self, path: str) -> tuple:
        return signature(self.problem.array.at(path))

    def plans(self, path: str) -> dict[str, Plan]:
        key = self.key(path)
        if key not in self.templates:
            group = group_array(self.problem.array, path)
            base = replace(
                self.problem, array=group, micro_batches=1, zero_stage=0, recompute=False
            )
            if group.is_leaf:
                self.templates[key] = {"device": Plan({}, planner="device")}
            else:
                name = template_planner(self.planner)
                self.say(f"pipeline: template plans on {group.describe()} ({group.count} devices)")
                part, data = make_plan(base, name), make_plan(base, "data")
                same = dict(part.splits) == dict(
                    data.splits
                )  # priced once when the planner chose data parallel
                self.templates[key] = {"data": data} if same else {"partition": part, "data": data}
        return self.templates[key]

    def prefix(self, path: str, kind: str, setting: Setting):
        """(time prefix over units, state prefix per leaf, activation prefix per leaf, leaf limits)."""
        key = (self.key(path), kind, setting)
        if key not in self.sums:
            group = group_array(self.problem.array, path)
            p = setting.apply(replace(self.problem, array=group))
            ev = evaluate(p, self.plans(path)[kind], node_memory=True)
            n = self.units
            time = np.zeros(n)
            np.add.at(time, self.unit, np.asarray(ev.node_time_s))
            leaves = sorted(ev.node_memory)
            state = np.zeros((len(leaves), n))
            act = np.zeros((len(leaves), n))
            again = np.zeros(len(leaves))
            for i, leaf in enumerate(leaves):
                s, a, again[i] = ev.node_memory[leaf]
                np.add.at(state[i], self.unit, s)
                np.add.at(act[i], self.unit, a)
            cat = lambda x: np.concatenate(
                [np.zeros(x.shape[:-1] + (1,)), np.cumsum(x, axis=-1)], axis=-1
            )  # noqa: E731
            # a recomputed block's activations (section 6.3) as the whole model's largest block,
            # whatever the stage holds: an estimate (the stages' exact price checks each stage)
            limit = np.array([self.limits.get(path + leaf, math.inf) for leaf in leaves]) - again
            self.sums[key] = (cat(time), cat(state), cat(act), limit)
        return self.sums[key]

    def stage_matrix(
        self, path: str, kinds: Sequence[str], setting: Setting, held: int, memory: bool = True
    ):
        """(K x K) stage step seconds for units a..b-1 (inf where a >= b or no template fits;
        ``memory=False``: whether it fits is not asked), and the template index each came from."""
        best = np.full((self.units + 1, self.units + 1), math.inf)
        which = np.zeros(best.shape, dtype=int)
        upper = np.triu(np.ones(best.shape, dtype=bool), 1)
        for i, kind in enumerate(kinds):
            time, state, act, limit = self.prefix(path, kind, setting)
            t = time[None, :] - time[:, None]
            need = (state[:, None, :] - state[:, :, None]) + held * (
                act[:, None, :] - act[:, :, None]
            )
            fits = np.all(need <= limit[:, None, None] * (1 + 1e-12), axis=0) if memory else True
            t = np.where(upper & fits, t, math.inf)
            better = t < best
            best = np.where(better, t, best)
            which = np.where(better, i, which)
        return best, which


def _dp(
    costs: list[np.ndarray], transfers: list[np.ndarray], m: int
) -> tuple[float, tuple[int, ...], list[str]]:
    """min over stage cuts of sum c + sum x + (m - 1) max(c, x), with ``costs[s][a, b]`` stage
    ``s``'s per-micro-batch time on units a..b-1 and ``transfers[s][a]`` the cut before stage s
    at boundary a (``transfers[0]`` unused). Returns (value, boundaries, notes)."""
    p, size = len(costs), costs[0].shape[0]
    last = size - 1

    def run(tau: float, keep: bool = False):
        f = np.full(size, math.inf)
        f[0] = 0.0
        back = []
        for s in range(p):
            c = np.where(costs[s] <= tau, costs[s], math.inf)
            if s:
                x = np.where(transfers[s] <= tau, transfers[s], math.inf)
                total = (f + x)[:, None] + c
            else:
                total = f[:, None] + c
            if keep:
                back.append(np.argmin(total, axis=0))
            f = total.min(axis=0)
        return f[last], back

    values = [c[np.isfinite(c)] for c in costs] + [t[np.isfinite(t)] for t in transfers[1:]]
    taus = np.unique(np.concatenate(values)) if values else np.array([])
    notes: list[str] = []
    if not len(taus) or not math.isfinite(run(math.inf)[0]):
        return math.inf, (), notes
    lo, hi = 0, len(taus) - 1  # feasibility is monotone in tau: the least feasible one
    while lo < hi:
        mid = (lo + hi) // 2
        if math.isfinite(run(float(taus[mid]))[0]):
            hi = mid
        else:
            lo = mid + 1
    free = run(math.inf)[0]
    best, best_tau = math.inf, None
    for i, tau in enumerate(taus[lo:]):
        tau = float(tau)
        if free + (m - 1) * tau >= best:
            break
        if i >= MAX_TAUS:
            notes.append(
                f"stopped after {MAX_TAUS} bounds: the stage split is the best of those, not proven"
            )
            break
        value = run(tau)[0]
        if value + (m - 1) * tau < best:
            best, best_tau = value + (m - 1) * tau, tau
    _, back = run(best_tau, keep=True)
    cuts = [last]
    for s in range(p - 1, -1, -1):
        cuts.append(int(back[s][cuts[-1]]))
    bounds = tuple(reversed(cuts))
    return stage_value(costs, transfers, m, bounds), bounds, notes  # the true max (<= tau)


@dataclass(frozen=True)
class StageCertificate:
    """What the exact solver says of a stage-cut problem: ``status`` ("optimal", "time_limit",
    ...), the chosen ``bounds`` re-priced by the pipeline formula (not the solver), the proven
    lower ``bound`` (seconds; None without one) and the solver."""

    status: str
    value_s: float
    bounds: tuple[int, ...]
    bound_s: float | None
    solver: str


def exact_stages(
    costs: list[np.ndarray],
    transfers: list[np.ndarray],
    m: int,
    backend: str = "highs",
    time_limit_s: float | None = 60.0,
) -> StageCertificate:
    """The stage cuts :func:`_dp` chooses, solved as a MIP instead
    (:func:`parplan.formulation.stages.build_stage_mip`): the DP's cross-check, and its
    certificate where it stops early (``MAX_TAUS``). "optimal" only with the solver's bound
    within 1e-9 of the re-priced value; "infeasible" where no split into these stages fits."""
    from parplan.solvers.backends import SolveOptions, get_backend

    try:
        model, decode = build_stage_mip(costs, transfers, m)
    except ConfigError:  # no stage split with finite costs: nothing to solve
        return StageCertificate("infeasible", math.inf, (), None, backend)
    raw = get_backend(backend).solve(model, SolveOptions(time_limit_s=time_limit_s))
    bounds = decode(raw) if raw.has_solution else ()
    value = stage_value(costs, transfers, m, bounds) if bounds else math.inf
    bound = None if raw.bound is None else raw.bound / model.objective_scale
    proven = bound is not None and math.isfinite(value) and value <= bound * (1 + 1e-9) + 1e-15
    if proven:
        status = "optimal"
    elif raw.termination == "optimal":  # the solver's claim, not confirmed by the re-priced value
        status = "feasible"
    else:
        status = raw.termination.value
    return StageCertificate(status, value, bounds, bound, raw.solver)


def brute_force(costs: list[np.ndarray], transfers: list[np.ndarray], m: int) -> float:
    """The DP's value by enumerating every split into ``len(costs)`` non-empty stages (tests)."""
    p, last = len(costs), costs[0].shape[0] - 1
    best = math.inf
    for inner in itertools.combinations(range(1, last), p - 1):
        b = (0, *inner, last)
        c = [costs[s][b[s], b[s + 1]] for s in range(p)]
        x = [transfers[s][b[s]] for s in range(1, p)]
        best = min(best, sum(c) + sum(x) + ((m - 1) * max(c + x) if m > 1 else 0.0))
    return best


def plan_partitioned(
    problem: Problem,
    planner: str = "accpar",
    schedule: str = "1f1b",
    micro_batches="auto",
    zero="auto",
    recompute="auto",
    max_stages: int | None = None,
    limit_bytes: float | None = None,
    ignore_memory: bool = False,
    progress: Callable[[str], None] | None = None,
    prune: bool = True,
    one_stage: bool = True,
) -> PartitionedResult:
    """The fastest pipeline x partition x data plan of ``problem`` that parplan finds (module
    docstring); ``limit_bytes`` per device (None: each device's own), ``ignore_memory``: none.
    ``prune``: skip a setting whose memory-free optimum cannot beat the best estimate (False:
    search every setting; the best estimate is the same); ``one_stage``: also price the
    one-stage (partition-only) plan. Raises :class:`InfeasibleError` when no candidate fits."""
    if not isinstance(problem, Problem):
        raise ConfigError(
            f"plan_partitioned: problem must be a Problem (got {type(problem).__name__})"
        )
    if schedule not in SCHEDULES:
        raise ConfigError(f"schedule must be one of {', '.join(SCHEDULES)} (got {schedule!r})")
    if max_stages is not None and (
        isinstance(max_stages, bool) or not isinstance(max_stages, int) or max_stages < 1
    ):
        raise ConfigError(f"max_stages must be an integer >= 1 (got {max_stages!r})")
    say = progress or (lambda msg: None)
    bounds = boundaries(problem)
    units = len(bounds) - 1
    limits = {} if ignore_memory else device_limits(problem, limit_bytes)
    settings_of(problem, 1, micro_batches, zero, recompute)  # bad values are errors before any work
    prices = _Prices(problem, planner, bounds, limits, say)
    info = problem.graph.analyze()
    cut_elements = np.array(
        [0.0]
        + [info.out_shape[cut_tensor(problem.graph, k)].elements for k in bounds[1:-1]]
        + [0.0]
    )
    orders = [o for o in frontiers(problem.array, min(max_stages or units, units)) if len(o) > 1]
    candidates: list[Candidate] = []
    notes: list[str] = []
    searched = skipped = 0
    best = math.inf
    # small groups first: their templates are cheap, and the best estimate they give prunes the
    # costly settings of the large groups' (below)
    for groups in sorted(orders, key=len, reverse=True):
        p = len(groups)
        settings = settings_of(problem, p, micro_batches, zero, recompute)
        searched += len(settings)
        say(
            f"pipeline: {p} stages on {_groups_text(groups, problem.array)}, {len(settings)} settings"
        )
        by_m: dict[int, list[Setting]] = {}
        for setting in settings:
            by_m.setdefault(setting.micro_batches, []).append(setting)
        for m, at_m in by_m.items():
            transfers = [np.zeros(units + 1)]
            for a, b in zip(groups, groups[1:]):
                transfers.append(
                    np.array(
                        [
                            cut_seconds(problem, a, b, e, m) if 0 < i < units else math.inf
                            for i, e in enumerate(cut_elements)
                        ]
                    )
                )
            floor = (
                None  # the cheapest setting's optimum with memory ignored bounds every setting at m
            )
            for setting in sorted(at_m, key=_setting_cost):
                if prune and floor is not None and floor >= best:
                    skipped += 1
                    continue
                for data_only in (False, True):
                    value, cut, kinds, dp_notes = _search(
                        prices, groups, setting, schedule, transfers, data_only
                    )
                    notes += [n for n in dp_notes if n not in notes]
                    if math.isfinite(value):
                        candidates.append(Candidate(value, setting, groups, cut, kinds, data_only))
                        best = min(best, value)
                if floor is None:
                    floor = _search(
                        prices, groups, setting, schedule, transfers, False, memory=False
                    )[0]
    if skipped:
        say(
            f"pipeline: {skipped} of {searched} settings skipped (their least step exceeds the best found)"
        )
    one = (
        _one_stage(
            problem,
            planner,
            prices,
            settings_of(problem, 1, micro_batches, zero, recompute),
            limit_bytes,
            ignore_memory,
            say,
        )
        if one_stage
        else []
    )
    return _price(problem, planner, schedule, bounds, prices, candidates, one, notes, say, searched)


def _setting_cost(setting: Setting) -> tuple:
    """Settings at one micro-batch count, cheapest first: every later one has per-node times at
    least the first's (ZeRO-0 and 1 cost the same; stage 2 reduce-scatters every micro-batch,
    stage 3 gathers; recomputation runs the forward again; section 6)."""
    return (setting.recompute, setting.zero_stage >= 2, setting.zero_stage)


def _search(
    prices: _Prices,
    groups,
    setting: Setting,
    schedule: str,
    transfers,
    data_only: bool,
    memory: bool = True,
):
    """The stage DP for one order of groups and one setting: (value, cut, templates, notes)."""
    p, m = len(groups), setting.micro_batches
    costs, which, kinds_of = [], [], []
    for s, path in enumerate(groups):
        kinds = list(prices.plans(path))
        if data_only and "data" in kinds:
            kinds = ["data"]
        c, w = prices.stage_matrix(path, kinds, setting, in_flight(schedule, s, p, m), memory)
        costs.append(c / m)
        which.append(w)
        kinds_of.append(kinds)
    value, cut, notes = _dp(costs, transfers, m)
    kinds = (
        tuple(kinds_of[s][which[s][cut[s], cut[s + 1]]] for s in range(p))
        if math.isfinite(value)
        else ()
    )
    return value, cut, kinds, notes


def _restrict(template: Plan, whole: Problem, sub: Problem) -> Plan:
    """The template's choices and shares for the stage's nodes (by name), per split of the group."""
    index = {n.name: v for v, n in enumerate(whole.planning.nodes)}
    take = [index[n.name] for n in sub.planning.nodes]
    return Plan(
        {
            path: Split(tuple(s.choices[v] for v in take), tuple(s.shares[v] for v in take))
            for path, s in template.splits.items()
        },
        planner=template.planner,
    )


def _stage_plan(
    problem: Problem,
    first: int,
    last: int,
    path: str,
    template: Plan,
    planner: str,
    limits: dict[str, float],
    held: int,
    memo: dict,
    evals: dict,
) -> tuple[Plan, bool]:
    """The stage's plan: its template's restriction or the planner's own plan of the stage, the
    faster that fits (its devices holding ``held`` micro-batches); and whether it fits. The
    planner's plan is kept in ``memo`` for stages of the same structure on equal groups."""
    sub = stage_problem(problem, first, last, path)
    options = [_restrict(template, replace(problem, array=sub.array), sub)]
    if not sub.array.is_leaf:
        name = (
            planner
            if sub.array.count <= PORTFOLIO_MAX_DEVICES or planner != "accpar"
            else "accpar-topdown"
        )
        key = (
            structure(sub.graph),
            signature(sub.array),
            sub.array.collective,
            name,
            replace(sub, graph=problem.graph, array=problem.array),
        )
        if key not in memo:
            memo[key] = make_plan(sub, name)
        options.append(memo[key])
    best, best_key = None, None
    passes_on = last < len(problem.graph.analyze().order) - 1
    for plan in options:
        ev = stage_evaluation(sub, plan, evals)
        over = max(
            (
                need - limits.get(path + leaf, math.inf)
                for leaf, need in held_memory(ev, held).items()
            ),
            default=-1.0,
        )
        key = (over > 0, stage_seconds(sub, ev, boundary_moves(sub, plan, first > 0, passes_on)))
        if best_key is None or key < best_key:
            best, best_key = plan, key
    return best, not best_key[0]


def _one_stage(problem, planner, prices, settings, limit_bytes, ignore_memory, say):
    """One-stage candidates, (label, problem, plan): on arrays of up to PORTFOLIO_MAX_DEVICES
    devices :func:`fit_plan`'s plan (the partition-only plan ``parplan plan`` makes: the joint
    plan is never slower); on larger ones the root's template plans under each setting (a
    planning of the whole model per setting there takes minutes)."""
    out = []
    if problem.array.count <= PORTFOLIO_MAX_DEVICES:
        say("pipeline: the one-stage plan (partition only)")
        fixed = {
            what: values[0] if len(values) == 1 else "auto"
            for what, values in (
                ("micro_batches", sorted({c.micro_batches for c in settings})),
                ("zero", sorted({c.zero_stage for c in settings})),
                ("recompute", sorted({c.recompute for c in settings})),
            )
        }
        try:
            if ignore_memory:
                out.append(("1 stage", problem, make_plan(problem, planner)))
            else:
                fit = fit_plan(problem, planner, limit_bytes=limit_bytes, **fixed)
                out.append(("1 stage", fit.problem, fit.plan))
        except InfeasibleError:
            pass
    if problem.array.count > PORTFOLIO_MAX_DEVICES or problem.array.is_leaf:
        for kind, plan in prices.plans("").items():
            out += [
                (f"1 stage ({kind} template)", setting.apply(problem), plan) for setting in settings
            ]
    return out


def _cheapest_first(setting_problem: Problem) -> tuple:
    """Settings in the order their cost rises (section 6.2: ZeRO-1 without recomputation and with
    one micro-batch costs the least; every other setting adds time)."""
    return (
        setting_problem.recompute,
        setting_problem.zero_stage > 2,
        setting_problem.micro_batches,
    )


def _price(problem, planner, schedule, bounds, prices, candidates, one_stage, notes, say, searched):
    limits = prices.limits
    seen: set = set()
    unique = []  # settings that price a split alike (ZeRO on one-device stages) are priced once
    for c in sorted(candidates, key=lambda c: (c.estimate_s, c.setting.zero_stage)):
        key = (
            c.groups,
            c.bounds,
            c.kinds,
            c.setting.micro_batches,
            c.setting.recompute,
            c.data_only,
            float(f"{c.estimate_s:.12g}"),
        )
        if key not in seen:
            seen.add(key)
            unique.append(c)
    chosen = [c for c in unique if not c.data_only][:EXACT_CANDIDATES] + [
        c for c in unique if c.data_only
    ][:1]
    priced: list[tuple[str, float, float, bool]] = []
    memo: dict = {}  # the planner's plans of stages, by structure, group and settings
    evals: dict = {}  # stage evaluations, likewise (costmodel.stages.stage_evaluation)
    results: list[tuple[float, Problem, PipelinePlan, PipelineEvaluation]] = []

    def fits(ev: PipelineEvaluation) -> bool:
        return all(
            need <= limits.get(path, math.inf) * (1 + 1e-12)
            for path, need in ev.device_memory_bytes.items()
        )

    best_one, fitted = None, {}
    for label, p, plan in sorted(one_stage, key=lambda c: (c[0], _cheapest_first(c[1]))):
        if label in fitted and _cheapest_first(p) > fitted[label]:
            continue  # this template fits at a cheaper setting: the costlier ones only add time
        pp = whole_model_stage(p, plan)
        ev = evaluate_pipeline(p, pp)
        if fits(ev):
            fitted.setdefault(label, _cheapest_first(p))
            if best_one is None or ev.step_time_s < best_one[0]:
                best_one = (ev.step_time_s, label, p, pp, ev)
    if best_one is None:
        priced.append(("1 stage: no plan fits with these settings", math.inf, math.inf, False))
    else:
        t, label, p, pp, ev = best_one
        priced.append(
            (
                f"{label}, " + Setting(p.micro_batches, p.zero_stage, p.recompute).label(),
                t,
                ev.peak_memory_bytes,
                True,
            )
        )
        results.append((t, p, pp, ev))
    for cand in chosen:
        p = cand.setting.apply(problem)
        n = len(cand.groups)
        say(
            f"pipeline: pricing {n} stages, {cand.setting.label()} (estimate {cand.estimate_s * 1e3:.3f} ms)"
        )
        stages, ok = [], True
        for s, path in enumerate(cand.groups):
            first, last = bounds[cand.bounds[s]] + 1, bounds[cand.bounds[s + 1]]
            template = prices.plans(path)[cand.kinds[s]]
            held = in_flight(schedule, s, n, cand.setting.micro_batches)
            plan, good = _stage_plan(
                p,
                first,
                last,
                path,
                template,
                "data" if cand.data_only else planner,
                limits,
                held,
                memo,
                evals,
            )
            ok &= good
            stages.append(Stage(first, last, path, plan))
        pp = PipelinePlan(
            tuple(stages),
            schedule=schedule,
            planner=f"pipeline-{planner}",
            info={
                "setting": cand.setting.label(),
                "estimate_s": cand.estimate_s,
                "stage_plans": "data" if cand.data_only else planner,
            },
        )
        ev = evaluate_pipeline(p, pp, evals)
        good = fits(ev)
        label = f"{n} stages{' (data parallel inside)' if cand.data_only else ''}, {cand.setting.label()}"
        priced.append((label, ev.step_time_s, ev.peak_memory_bytes, good))
        if good:
            results.append((ev.step_time_s, p, pp, ev))
    if not results:
        closest = [
            f"{label}: peak {peak / 2**30:.2f} GiB"
            for label, _, peak, _ in priced
            if math.isfinite(peak)
        ]
        raise InfeasibleError(
            "no pipeline plan found fits the memory limits"
            + (
                ": closest " + "; ".join(closest)
                if closest
                else f" (no stage split of the {searched} settings searched fits in the DP)"
            )
            + "; try recomputation, more micro-batches or a larger memory limit"
        )
    step, p, pp, ev = min(results, key=lambda r: r[0])
    ev = evaluate_pipeline(
        p, pp
    )  # the answer priced afresh: its stage evaluations carry its own layer names
    return PartitionedResult(
        p,
        pp,
        ev,
        tuple(sorted(candidates, key=lambda c: c.estimate_s)),
        tuple(priced),
        tuple(notes),
    )


__all__ = [
    "plan_partitioned",
    "PartitionedResult",
    "Candidate",
    "Setting",
    "brute_force",
    "frontiers",
    "settings_of",
    "boundaries",
    "structure",
    "template_planner",
]
