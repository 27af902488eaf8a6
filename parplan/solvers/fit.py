"""Plans that fit in memory (docs/costmodel.md section 6.2).

A planner minimises the step time; :func:`fit_plan` makes every device's memory a constraint of
it. It never returns a plan over its limit as a fit: each candidate is priced by the evaluator
and re-checked device by device (:func:`parplan.costmodel.evaluate.memory_overruns`), code that
is not the planner's. In order:

1. **ZeRO stages** (section 6.1), least first. Stages 1 and 2 move exactly the bytes of stage 0
   (the reduce-scatter + all-gather of the gradient), so one plan serves stages 0-2 and only its
   memory is re-checked; stage 3 gathers weights again and is planned on its own.
2. **A memory price** (a Lagrangian term): each state of each split pays ``mu`` seconds per unit
   of the memory it keeps, as a fraction of its side's capacity
   (:attr:`~parplan.costmodel.split.PlanOptions.memory_price`). ``mu`` climbs a ladder from
   ``T / 64`` to ``256 T`` (``T``: the unpriced plan's step time) until a plan fits, then two
   bisection steps look for a faster one below. Each price is one top-down recursion.
3. Otherwise :class:`~parplan.errors.InfeasibleError`, with the least memory any plan needs
   (:func:`memory_lower_bound`) and the plan that came closest.

What is proven and what is not: the global time bound (:func:`parplan.solvers.bound.global_bound`)
drops memory, so it is still a lower bound on every plan that fits, and ``plan --bound`` reports
the gap of the fitting plan to it. The memory lower bound is a proof that *no* plan fits when it
exceeds the capacity; between the two, a failure to find a fitting plan is parplan's, and the
error says so.

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> p = Problem(get_model("vgg11"), parse_array("h100:2"), batch=64)
    >>> fit = fit_plan(p, "accpar", limit_bytes=2 * 2**30)
    >>> fit.problem.zero_stage, fit.peak_fraction <= 1.0
    (1, True)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from parplan.costmodel.evaluate import Evaluation, evaluate, memory_overruns
from parplan.costmodel.problem import ZERO_STAGES, Plan, Problem
from parplan.errors import ConfigError, InfeasibleError

#: Memory prices tried, in units of the unpriced plan's step time (section 6.2).
PRICE_LADDER = (1 / 64, 1 / 16, 1 / 4, 1.0, 4.0, 16.0, 64.0, 256.0)
#: Bisection steps between the last price that did not fit and the first that did.
PRICE_BISECTIONS = 2


@dataclass(frozen=True)
class Fit:
    """A plan and the problem it was priced on (with the ZeRO stage chosen), its evaluation,
    and its largest need as a fraction of a device's limit (``<= 1`` when it fits)."""

    problem: Problem
    plan: Plan
    evaluation: Evaluation
    peak_fraction: float
    how: str  # "as planned", "zero-2", "memory price 4 T at zero-3", ...

    @property
    def fits(self) -> bool:
        return self.peak_fraction <= 1.0


def device_limits(problem: Problem, limit_bytes: float | None) -> dict[str, float]:
    """Each device's limit by leaf path: ``limit_bytes``, or its own memory (None)."""
    out = {}

    def walk(group, path):
        if group.is_leaf:
            out[path] = group.device.memory_bytes if limit_bytes is None else float(limit_bytes)
        else:
            walk(group.left, path + "L")
            walk(group.right, path + "R")

    walk(problem.array, "")
    return out


def peak_fraction(evaluation: Evaluation, limits: dict[str, float]) -> float:
    """The largest need over limit of any device."""
    return max(evaluation.device_memory_bytes.get(path, 0.0) / cap for path, cap in limits.items())


def memory_lower_bound(problem: Problem) -> float:
    """Bytes that every plan keeps, summed over all devices: every weight with its gradient
    and optimizer state once (fully sharded) and every stored activation once (each row of
    every stored tensor lies on some device). A plan fits only if this is at most the summed
    limits (docs/costmodel.md section 6.2)."""
    bpe, opt = problem.bytes_per_element, problem.optimizer_bytes_per_param
    return sum(d.memory_bytes(bpe, opt, 3) for d in problem.root_dims())


def fit_plan(problem: Problem, planner: str = "accpar", limit_bytes: float | None = None,
             zero: int | str = "auto", progress: Callable[[str], None] | None = None,
             plan_kwargs: dict | None = None) -> Fit:
    """The fastest plan parplan finds for ``problem`` that fits every device's memory
    (``limit_bytes`` per device, or each device's own), searching ZeRO stages (``zero="auto"``,
    least first; an int fixes the stage) and then memory prices (module docstring). Raises
    :class:`InfeasibleError` when none fits."""
    from parplan.solvers.planners import make_plan, planner_options

    if zero != "auto" and (isinstance(zero, bool) or zero not in ZERO_STAGES):
        raise ConfigError(f"zero must be 'auto' or one of {', '.join(map(str, ZERO_STAGES))} (got {zero!r})")
    if limit_bytes is not None and not 0.0 < float(limit_bytes) < float("inf"):
        raise ConfigError(f"memory limit must be a finite number of bytes > 0 (got {limit_bytes!r})")
    kwargs = dict(plan_kwargs or {})
    limits = device_limits(problem, limit_bytes)
    say = progress or (lambda msg: None)
    stages = [s for s in ZERO_STAGES if s >= problem.zero_stage] if zero == "auto" else [int(zero)]
    tried: list[Fit] = []

    def candidate(p: Problem, plan: Plan, how: str) -> Fit:
        ev = evaluate(p, plan)
        fit = Fit(p, plan, ev, peak_fraction(ev, limits), how)
        tried.append(fit)
        return fit

    if memory_lower_bound(problem) > sum(limits.values()):
        # proven: no plan fits; one plan at the most sharding stage allowed shows how close one comes
        p = replace(problem, zero_stage=stages[-1])
        say(f"memory: no plan can fit; planning at ZeRO stage {stages[-1]} to show the closest")
        raise InfeasibleError(infeasible_message(problem, limits, candidate(p, make_plan(p, planner, **kwargs),
                                                                             f"zero-{stages[-1]}")))
    # 1. the planner's own plan, at the least ZeRO stage that fits (0-2 share one plan)
    plan = None
    for stage in stages:
        p = replace(problem, zero_stage=stage)
        if plan is None or stage == 3:
            say(f"memory: planning at ZeRO stage {stage}")
            plan = make_plan(p, planner, progress=progress, **kwargs)
        fit = candidate(p, plan, "as planned" if stage == 0 else f"zero-{stage}")
        if fit.fits:
            return fit
    # 2. memory prices, on the highest stage allowed below 3 first, then 3
    options = planner_options(planner, kwargs.get("objective"), kwargs.get("shares"), kwargs.get("share_grid"))
    base = min(tried, key=lambda f: f.evaluation.step_time_s).evaluation.step_time_s
    found: list[Fit] = []
    lower = [s for s in stages if s < 3]
    for stage in ([max(lower)] if lower else []) + ([3] if 3 in stages else []):
        p = replace(problem, zero_stage=stage)
        below = 0.0
        for k in PRICE_LADDER:
            say(f"memory: planning at ZeRO stage {stage} with a memory price of {k:g} x the step time")
            fit = candidate(p, _priced_plan(p, planner, options, k * base, progress),
                            f"memory price {k:g} T at zero-{stage}")
            if fit.fits:
                found.append(fit)
                lo, hi = below, k
                for _ in range(PRICE_BISECTIONS):
                    mid = (lo * hi) ** 0.5 if lo > 0 else hi / 4
                    fit = candidate(p, _priced_plan(p, planner, options, mid * base, progress),
                                    f"memory price {mid:.3g} T at zero-{stage}")
                    if fit.fits:
                        found.append(fit)
                        hi = mid
                    else:
                        lo = mid
                break
            below = k
        if found:
            break
    if found:
        return min(found, key=lambda f: f.evaluation.step_time_s)
    proven = False
    if problem.array.depth == 1:
        # one split: the exact MIP with a memory row per device is the whole problem
        fit, proven = _exact_one_split(problem, stages, limit_bytes, options, candidate, say)
        if fit is not None:
            return fit
    closest = min(tried, key=lambda f: f.peak_fraction)
    raise InfeasibleError(infeasible_message(problem, limits, closest, proven))


def _exact_one_split(problem: Problem, stages, limit_bytes, options, candidate, say) -> tuple[Fit | None, bool]:
    """On a two-device array: the fastest fitting plan of the exact MIP over the allowed ZeRO
    stages, or (None, whether every stage was proven infeasible)."""
    from parplan.costmodel.split import SplitProblem
    from parplan.solvers.exact import memory_limit_for, solve_split_exact

    best, proven = None, True
    for stage in stages:
        p = replace(problem, zero_stage=stage)
        say(f"memory: exact solve of the split at ZeRO stage {stage}")
        split, cert = solve_split_exact(SplitProblem.root(p), "scip", options,
                                        memory=memory_limit_for(p.array, "device" if limit_bytes is None else limit_bytes))
        if split is not None and cert.status.value in ("optimal", "feasible"):
            fit = candidate(p, Plan({"": split}, planner="exact", info={"certificate": cert.status.value}),
                            f"exact MIP at zero-{stage} ({cert.status.value})")
            if fit.fits and (best is None or fit.evaluation.step_time_s < best.evaluation.step_time_s):
                best = fit
        proven = proven and cert.status.value == "infeasible"
    return best, proven


def _priced_plan(problem: Problem, planner: str, options, price: float, progress) -> Plan:
    from parplan.solvers.planners import make_plan

    plan = make_plan(problem, planner, options=replace(options, memory_price=price), progress=progress)
    return Plan(plan.splits, planner=planner, info={**plan.info, "memory_price_s": price})


def _size(x: float) -> str:
    """Bytes in GiB, MiB or KiB, whichever shows them with 3 significant digits."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if x >= 0.1 * scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x / 2**10:.2f} KiB"


def infeasible_message(problem: Problem, limits: dict[str, float], closest: Fit, proven: bool = False) -> str:
    """One line: the least memory any plan needs and the plan that came closest."""
    need = memory_lower_bound(problem)
    total = sum(limits.values())
    n = len(limits)
    worst = max(limits, key=lambda path: closest.evaluation.device_memory_bytes.get(path, 0.0) / limits[path])
    close = (f"the closest plan found ({closest.how}) needs {_size(closest.evaluation.device_memory_bytes[worst])} "
             f"on device {worst or 'root'} of {_size(limits[worst])}")
    if need > total:
        return (f"no plan fits: every plan keeps at least {_size(need)} over the {n} devices "
                f"({_size(need / n)} per device on average, {need / total:.2f}x their "
                f"{_size(total)}); {close}. Use more devices, a smaller batch or fewer optimizer bytes")
    if proven:
        return (f"no plan fits: the exact solver proved that no plan on the share grid keeps every device within its "
                f"limit ({close}; every plan keeps at least {_size(need)} over the {n} devices)")
    return (f"parplan found no plan that fits ({close}); every plan keeps at least {_size(need)} over the "
            f"{n} devices ({need / total:.0%} of their memory), so a plan may exist that parplan's search missed: "
            f"try 'parplan solve --memory-limit', a smaller batch or more devices")


__all__ = ["Fit", "PRICE_LADDER", "device_limits", "fit_plan", "infeasible_message", "memory_lower_bound",
           "peak_fraction"]
