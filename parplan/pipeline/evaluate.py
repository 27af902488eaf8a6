"""The one evaluator of pipeline plans: time per minibatch, memory per device, the report
(see :mod:`parplan.pipeline.planner`)."""

from __future__ import annotations

import math

import numpy as np

from parplan.errors import ConfigError
from parplan.pipeline.profile import PipelineProfile
from parplan.pipeline.machine import Machine, SyncModel, sync_seconds, transfer_seconds
from parplan.pipeline.plans import (
    data_parallel_plan,
    LevelPlan,
    PipelineOptions,
    PipelineResult,
    StageReport,
)

_INF = math.inf


class _Sums:
    """Range sums over layer positions: ``compute[i, j]`` etc. for layers ``i..j`` (inf if j < i)."""

    def __init__(self, profile: PipelineProfile):
        n = len(profile.layers)
        if n == 0:
            raise ConfigError(f"profile '{profile.name}' has no layers")
        self.n = n
        self.names = tuple(layer.name for layer in profile.layers)
        self.compute = self._ranges([layer.compute_seconds for layer in profile.layers])
        self.params = self._ranges([layer.parameter_bytes for layer in profile.layers])
        self.acts = self._ranges([layer.activation_bytes for layer in profile.layers])
        self.stash = self.params + self.acts
        self.cut = np.asarray(profile.cut_bytes(), dtype=float)

    def _ranges(self, values: list[float]) -> np.ndarray:
        prefix = np.concatenate(([0.0], np.cumsum(np.asarray(values, dtype=float))))
        out = prefix[None, 1:] - prefix[:-1, None]
        out[np.tril_indices(self.n, -1)] = _INF
        return out


# --------------------------------------------------------------------------------------------
# Evaluator.


def _check_level_plan(
    plan: LevelPlan, level: int, first: int, last: int, machine: Machine, options: PipelineOptions
) -> None:
    lvl = machine.levels[level - 1]
    where = f"plan at level {level} for layers {first}..{last}"
    if not isinstance(plan, LevelPlan) or plan.level != level:
        raise ConfigError(f"{where}: expected a LevelPlan of level {level} (got {plan!r:.80})")
    if not plan.stages:
        raise ConfigError(f"{where}: has no stages")
    pos = first
    for s in plan.stages:
        if s.first != pos or s.last < s.first:
            raise ConfigError(
                f"{where}: stages must cover the layers contiguously; stage {s.first}..{s.last} breaks at {pos}"
            )
        if s.replicas < 1:
            raise ConfigError(
                f"{where}: stage {s.first}..{s.last} needs replicas >= 1 (got {s.replicas})"
            )
        if not options.replication and s.replicas != 1:
            raise ConfigError(
                f"{where}: stage {s.first}..{s.last} is replicated but replication is off"
            )
        if level == 1 and s.inner is not None:
            raise ConfigError(
                f"{where}: level-1 stages run on single devices and take no inner plan"
            )
        if level > 1:
            if s.inner is None:
                raise ConfigError(
                    f"{where}: stage {s.first}..{s.last} needs an inner plan of level {level - 1}"
                )
            _check_level_plan(s.inner, level - 1, s.first, s.last, machine, options)
        pos = s.last + 1
    if pos != last + 1:
        raise ConfigError(f"{where}: stages end at {pos - 1}, not at {last}")
    used = sum(s.replicas for s in plan.stages)
    if used > lvl.machines or (not options.allow_idle and used != lvl.machines):
        rule = "at most" if options.allow_idle else "exactly"
        raise ConfigError(
            f"{where}: stages use {used} machines; level {level} has {rule} {lvl.machines}"
        )


def _price(plan: LevelPlan, sums: _Sums, machine: Machine, sync: SyncModel) -> float:
    """Seconds per minibatch of a level plan (the recurrence ``A^k``), recursively."""
    lvl = machine.levels[plan.level - 1]
    terms = []
    for s in plan.stages:
        inner = (
            sums.compute[s.first, s.last]
            if plan.level == 1
            else _price(s.inner, sums, machine, sync)
        )
        terms.append(
            max(inner, sync_seconds(sums.params[s.first, s.last], s.replicas, lvl, sync))
            / s.replicas
        )
    for s in plan.stages[:-1]:
        terms.append(transfer_seconds(sums.cut[s.last], lvl))
    return max(terms)


def _flatten(
    plan: LevelPlan,
    sums: _Sums,
    machine: Machine,
    sync: SyncModel,
    outer: int,
    outer_terms: tuple[float, ...],
    stages: list,
    cuts: list,
) -> None:
    """Flat stages (first, last, devices, compute, sync1, effective) and cuts (after, level, bytes, effective)."""
    lvl = machine.levels[plan.level - 1]
    for n, s in enumerate(plan.stages):
        own_sync = sync_seconds(sums.params[s.first, s.last], s.replicas, lvl, sync)
        own_term = own_sync / (s.replicas * outer)
        if plan.level == 1:
            compute = float(sums.compute[s.first, s.last])
            eff = max(compute / (s.replicas * outer), own_term, *outer_terms)
            stages.append(
                (s.first, s.last, s.replicas * outer, compute, float(own_sync), float(eff))
            )
        else:
            _flatten(
                s.inner,
                sums,
                machine,
                sync,
                outer * s.replicas,
                outer_terms + (own_term,),
                stages,
                cuts,
            )
        if n < len(plan.stages) - 1:
            b = float(sums.cut[s.last])
            cuts.append((s.last, plan.level, b, float(transfer_seconds(b, lvl) / outer)))


def _memory(flat: list, sums: _Sums) -> list[tuple[int, float, float]]:
    """(in-flight, weight stash bytes, activation stash bytes) per flat stage under 1F1B."""
    out = []
    downstream = sum(f[2] for f in flat)
    for first, last, devices, *_ in flat:
        in_flight = -(-downstream // devices)
        out.append(
            (
                in_flight,
                in_flight * float(sums.params[first, last]),
                in_flight * float(sums.acts[first, last]),
            )
        )
        downstream -= devices
    return out


def _fits(flat: list, sums: _Sums, limit: float | None) -> bool:
    if limit is None:
        return True
    return all(w + a <= limit for _, w, a in _memory(flat, sums))


def evaluate_plan(
    profile: PipelineProfile,
    machine: Machine,
    plan: LevelPlan,
    options: PipelineOptions = PipelineOptions(),
    solver: str = "evaluate",
    objective_seconds: float | None = None,
    solve_seconds: float = 0.0,
    plans_examined: int = 0,
) -> PipelineResult:
    """Price any nested plan: time per minibatch, per-stage memory, bottleneck and baselines.

    Raises :class:`~parplan.errors.ConfigError` if the plan does not cover the layers
    contiguously, uses the wrong number of machines at a level, or replicates with
    replication off. A plan over the memory limit is priced and flagged (``memory_fits``).
    """
    sums = _Sums(profile)
    top = len(machine.levels)
    _check_level_plan(plan, top, 0, sums.n - 1, machine, options)
    seconds = float(_price(plan, sums, machine, options.sync))
    flat: list = []
    cuts: list = []
    _flatten(plan, sums, machine, options.sync, 1, (), flat, cuts)
    mem = _memory(flat, sums)
    cut_after = {c[0]: c for c in cuts}
    reports = []
    for idx, ((first, last, devices, compute, sync1, eff), (in_flight, w, a)) in enumerate(
        zip(flat, mem)
    ):
        c = cut_after.get(last, (last, 0, 0.0, 0.0))
        reports.append(
            StageReport(
                index=idx,
                first=first,
                last=last,
                layers=sums.names[first : last + 1],
                replicas=devices,
                compute_seconds=compute,
                sync_seconds=sync1,
                seconds_per_minibatch=eff,
                parameter_bytes=float(sums.params[first, last]),
                activation_bytes=float(sums.acts[first, last]),
                in_flight=in_flight,
                weight_stash_bytes=w,
                activation_stash_bytes=a,
                cut_bytes=c[2],
                cut_level=c[1],
                cut_seconds=c[3],
            )
        )
    worst_stage = max(range(len(reports)), key=lambda i: reports[i].seconds_per_minibatch)
    bottleneck, b_idx = f"stage {worst_stage}", worst_stage
    if cuts:
        worst_cut = max(range(len(cuts)), key=lambda i: cuts[i][3])
        if cuts[worst_cut][3] > reports[worst_stage].seconds_per_minibatch:
            bottleneck = f"transfer after stage {worst_cut} (level {cuts[worst_cut][1]})"
            b_idx = worst_cut
    limit = options.memory_limit_bytes
    dp_plan = data_parallel_plan(machine, sums.n)
    dp_flat: list = []
    _flatten(dp_plan, sums, machine, options.sync, 1, (), dp_flat, [])
    notes = tuple(profile.notes) + tuple(machine.notes)
    if options.sync is SyncModel.RING:
        notes += ("weight sync priced as a ring all-reduce per level",)
    return PipelineResult(
        model=profile.name,
        source=profile.source,
        machine=machine,
        options=options,
        plan=plan,
        stages=tuple(reports),
        seconds_per_minibatch=seconds,
        objective_seconds=seconds if objective_seconds is None else objective_seconds,
        bottleneck=bottleneck,
        bottleneck_stage=b_idx,
        single_device_seconds=float(sums.compute[0, sums.n - 1]),
        data_parallel_seconds=float(_price(dp_plan, sums, machine, options.sync)),
        data_parallel_fits=_fits(dp_flat, sums, limit),
        devices_used=sum(r.replicas for r in reports),
        memory_fits=all(r.memory_bytes <= limit for r in reports) if limit is not None else True,
        solver=solver,
        solve_seconds=solve_seconds,
        notes=notes,
        plans_examined=plans_examined,
    )


# --------------------------------------------------------------------------------------------
# Dynamic program.
