"""Every nested pipeline plan, enumerated: the cross-check of the DP (see
:mod:`parplan.pipeline.planner`)."""

from __future__ import annotations

import itertools
import math
import time
from typing import Iterator


from parplan.errors import ConfigError, InfeasibleError
from parplan.pipeline.profile import PipelineProfile
from parplan.pipeline.machine import Machine
from parplan.pipeline.plans import LevelPlan, PipelineOptions, PipelineResult, Stage
from parplan.pipeline.evaluate import _Sums, _fits, _flatten, _price, evaluate_plan
from parplan.pipeline.dp import _infeasible_message

_INF = math.inf


def _compositions(first: int, last: int) -> Iterator[list[tuple[int, int]]]:
    n = last - first + 1
    for k in range(n):
        for cuts in itertools.combinations(range(first, last), k):
            bounds = [first - 1, *cuts, last]
            yield [(bounds[t] + 1, bounds[t + 1]) for t in range(len(bounds) - 1)]


def _replica_vectors(
    stages: int, machines: int, options: PipelineOptions
) -> Iterator[tuple[int, ...]]:
    if not options.replication:
        if stages == machines or (options.allow_idle and stages <= machines):
            yield (1,) * stages
        return
    totals = range(stages, machines + 1) if options.allow_idle else (machines,)
    for total in totals:
        # All compositions of `total` into `stages` positive parts.
        for cuts in itertools.combinations(range(1, total), stages - 1):
            bounds = (0, *cuts, total)
            yield tuple(bounds[t + 1] - bounds[t] for t in range(stages))


def _all_plans(
    level: int, first: int, last: int, machine: Machine, options: PipelineOptions
) -> Iterator[LevelPlan]:
    machines = machine.levels[level - 1].machines
    for ranges in _compositions(first, last):
        for reps in _replica_vectors(len(ranges), machines, options):
            if level == 1:
                yield LevelPlan(1, tuple(Stage(a, b, r) for (a, b), r in zip(ranges, reps)))
                continue
            inners = [list(_all_plans(level - 1, a, b, machine, options)) for a, b in ranges]
            for combo in itertools.product(*inners):
                yield LevelPlan(
                    level, tuple(Stage(a, b, r, p) for (a, b), r, p in zip(ranges, reps, combo))
                )


def plan_exhaustive(
    profile: PipelineProfile,
    machine: Machine,
    options: PipelineOptions = PipelineOptions(),
    max_plans: int = 200_000,
) -> PipelineResult:
    """Best plan by enumerating every nested plan (contiguous partitions x replication factors
    at every level) and pricing each with the evaluator. For small inputs: the cross-check of
    :func:`plan_pipeline`. Raises :class:`~parplan.errors.ConfigError` past ``max_plans``.
    """
    t0 = time.perf_counter()
    sums = _Sums(profile)
    K = len(machine.levels)
    best, best_plan, count = _INF, None, 0
    for plan in _all_plans(K, 0, sums.n - 1, machine, options):
        count += 1
        if count > max_plans:
            raise ConfigError(
                f"exhaustive search of '{profile.name}': more than {max_plans} plans; use plan_pipeline or a "
                "smaller instance (fewer layers or devices)"
            )
        seconds = float(_price(plan, sums, machine, options.sync))
        if seconds >= best:
            continue
        if options.memory_limit_bytes is not None:
            flat: list = []
            _flatten(plan, sums, machine, options.sync, 1, (), flat, [])
            if not _fits(flat, sums, options.memory_limit_bytes):
                continue
        best, best_plan = seconds, plan
    if best_plan is None:
        raise InfeasibleError(_infeasible_message(profile, machine, options, sums))
    return evaluate_plan(
        profile,
        machine,
        best_plan,
        options,
        solver="exhaustive",
        objective_seconds=best,
        solve_seconds=time.perf_counter() - t0,
        plans_examined=count,
    )
