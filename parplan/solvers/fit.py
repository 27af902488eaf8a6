"""Plans that fit in memory (docs/costmodel.md section 6.2).

A planner minimises the step time; :func:`fit_plan` makes every device's memory a constraint of
it. It never returns a plan over its limit as a fit: each candidate is priced by the evaluator
and its every device re-checked against its limit (:func:`peak_fraction`), code that is not the
planner's. It searches *settings* of the memory techniques (:class:`Technique`: ZeRO stage x
recomputation x micro-batches), in order:

1. The planner's own plan, priced with every setting: if it fits at ZeRO stage 0-2 without
   recomputation or more micro-batches (which cost exactly its unconstrained time), the least
   such stage is the answer. Its memory comes first (:func:`~parplan.costmodel.evaluate.device_memory`):
   a setting under which it does not fit is priced only if the search later needs its time.
2. Otherwise the settings under which it fits, fastest first: the :data:`REPLANNED` fastest are
   planned again with the setting in force.
3. If none fits, a **memory price** (a Lagrangian term): each state of each split pays ``mu``
   seconds per unit of the memory it keeps, as a fraction of its side's capacity
   (:attr:`~parplan.costmodel.split.PlanOptions.memory_price`). ``mu`` climbs a ladder from
   ``T / 64`` to ``256 T`` until a plan fits, then two bisection steps look for a faster one.
4. On one split (two devices): exact over every setting (the DP's optimum bounds a setting;
   the MIP with a memory row per device decides where the DP's plan does not fit).
5. Otherwise :class:`~parplan.errors.InfeasibleError`, with the least memory any plan needs
   (:func:`memory_lower_bound`) and the plan that came closest.

What is proven and what is not: the global time bound (:func:`parplan.solvers.bound.global_bound`)
drops memory, so it is still a lower bound on every plan that fits, and ``plan --bound`` reports
the gap of the fitting plan to it. The memory lower bound (or, on one split, the exact MIPs) is a
proof that *no* plan fits; otherwise a failure to find a fitting plan is parplan's, and the error
says so (docs/costmodel.md section 6.2).

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

import time
from dataclasses import dataclass, replace
from typing import Callable

from parplan.costmodel.evaluate import (
    Evaluation,
    device_memory,
    evaluate,
    recomputed_block_bytes,
)
from parplan.costmodel.problem import ZERO_STAGES, Plan, Problem
from parplan.errors import ConfigError, InfeasibleError
from parplan.solvers.limits import device_capacity

#: Memory prices tried, in units of the unpriced plan's step time (section 6.2).
PRICE_LADDER = (1 / 64, 1 / 16, 1 / 4, 1.0, 4.0, 16.0, 64.0, 256.0)
#: Bisection steps between the last price that did not fit and the first that did.
PRICE_BISECTIONS = 2
#: Most micro-batches the search tries (powers of two that divide the batch).
MAX_MICRO_BATCHES = 32
#: Settings re-planned after the planner's own plan fitted with them (the fastest first).
REPLANNED = 2
#: Largest model (planning nodes) whose one-split fit is decided by the exact MIPs.
EXACT_MAX_NODES = 64


@dataclass(frozen=True)
class Fit:
    """A plan and the problem it was priced on (with the ZeRO stage chosen), its evaluation,
    and its largest need as a fraction of a device's limit (``<= 1`` when it fits)."""

    problem: Problem
    plan: Plan
    evaluation: Evaluation
    peak_fraction: float
    how: str  # "as planned", "zero-2", "zero-3, recompute, memory price 4 T", ...
    #: proven the fastest fitting plan of the search space (one split: the exact MIPs)
    exact: bool = False

    @property
    def fits(self) -> bool:
        return self.peak_fraction <= 1.0


def device_limits(problem: Problem, limit_bytes: float | None) -> dict[str, float]:
    """Each device's limit by leaf path: ``limit_bytes``, or its own memory (None)."""
    return device_capacity(problem, "device" if limit_bytes is None else limit_bytes)


def peak_fraction(evaluation: Evaluation | dict, limits: dict[str, float]) -> float:
    """The largest need over limit of any device (``evaluation``: an Evaluation, or its memory
    by leaf path, as :func:`~parplan.costmodel.evaluate.device_memory` gives it)."""
    need = evaluation.device_memory_bytes if isinstance(evaluation, Evaluation) else evaluation
    return max(need.get(path, 0.0) / cap for path, cap in limits.items())


def memory_lower_bound(problem: Problem) -> float:
    """Bytes that every plan keeps, summed over all devices: every weight with its gradient
    and optimizer state once (fully sharded) and every stored activation once (each row of
    every stored tensor lies on some device), and with recomputation the activations of the
    largest checkpointed block once more (while its backward runs, every point of them is on
    some device). A plan fits only if this is at most the summed limits (docs/costmodel.md
    sections 6.2 and 6.3)."""
    bpe, opt = problem.bytes_per_element, problem.optimizer_bytes_per_param
    dims = problem.root_dims()
    each: dict[int, float] = {}  # alike nodes share one root dims object: priced once
    for d in dims:
        if id(d) not in each:
            each[id(d)] = d.memory_bytes(bpe, opt, 3)
    return sum(each[id(d)] for d in dims) + recomputed_block_bytes(problem, dims)


@dataclass(frozen=True, order=True)
class Technique:
    """One setting of the memory techniques: ZeRO stage, recomputation (and what it
    checkpoints: per block or per layer, docs/costmodel.md section 6.3), micro-batches."""

    zero_stage: int = 0
    recompute: bool = False
    micro_batches: int = 1
    checkpoint: str = "block"

    def apply(self, problem: Problem) -> Problem:
        return replace(
            problem,
            zero_stage=self.zero_stage,
            recompute=self.recompute,
            micro_batches=self.micro_batches,
            checkpoint=self.checkpoint,
        )

    def label(self) -> str:
        recompute = "recompute" if self.checkpoint == "block" else "recompute per layer"
        parts = (
            [f"zero-{self.zero_stage}"]
            + ([recompute] if self.recompute else [])
            + ([f"{self.micro_batches} micro-batches"] if self.micro_batches > 1 else [])
        )
        return ", ".join(parts)


def techniques(
    problem: Problem,
    zero: int | str = "auto",
    recompute: bool | str = "auto",
    micro_batches: int | str = "auto",
) -> list[Technique]:
    """The settings a search may use ("auto": every value at least the problem's own; micro-batches
    powers of two that divide the batch, up to :data:`MAX_MICRO_BATCHES`). ``recompute``:
    "auto", True (checkpointing per block and per layer both, where the model has blocks),
    False, "block" or "layer"."""
    if zero != "auto" and (isinstance(zero, bool) or zero not in ZERO_STAGES):
        raise ConfigError(
            f"zero must be 'auto' or one of {', '.join(map(str, ZERO_STAGES))} (got {zero!r})"
        )
    if recompute not in ("auto", "block", "layer") and not isinstance(recompute, bool):
        raise ConfigError(
            f"recompute must be 'auto', True, False, 'block' or 'layer' (got {recompute!r})"
        )
    if micro_batches != "auto" and (
        isinstance(micro_batches, bool)
        or not isinstance(micro_batches, int)
        or micro_batches < 1
        or problem.batch % micro_batches
    ):
        raise ConfigError(
            f"micro_batches must be 'auto' or an integer that divides the batch {problem.batch} "
            f"(got {micro_batches!r})"
        )
    zs = [z for z in ZERO_STAGES if z >= problem.zero_stage] if zero == "auto" else [int(zero)]
    # (recompute, checkpoint): per block and per layer are different schedules, neither always
    # keeps less (a model of one block holds it all again), so both are searched
    granularities = ("block", "layer") if problem.planning.block_count else ("block",)
    if recompute == "auto":
        rs = ([] if problem.recompute else [(False, problem.checkpoint)]) + [
            (True, c) for c in granularities
        ]
    elif recompute is True:
        rs = [(True, c) for c in granularities]
    elif recompute is False:
        rs = [(False, problem.checkpoint)]
    else:
        rs = [(True, recompute)]
    if micro_batches == "auto":
        ms = [
            m
            for m in (2**k for k in range(12))
            if problem.micro_batches <= m <= MAX_MICRO_BATCHES and problem.batch % m == 0
        ]
        ms = ms or [problem.micro_batches]
    else:
        ms = [micro_batches]
    return [Technique(z, r, m, c) for z in zs for r, c in rs for m in ms]


def fit_plan(
    problem: Problem,
    planner: str = "accpar",
    limit_bytes: float | None = None,
    zero: int | str = "auto",
    progress: Callable[[str], None] | None = None,
    plan_kwargs: dict | None = None,
    recompute: bool | str = "auto",
    micro_batches: int | str = "auto",
) -> Fit:
    """The fastest plan parplan finds for ``problem`` that fits every device's memory
    (``limit_bytes`` per device, or each device's own), over the memory techniques
    (``zero``, ``recompute``, ``micro_batches``: "auto" searches them, a value fixes one) and
    memory prices (module docstring). Raises :class:`InfeasibleError` when none fits."""
    from parplan.solvers.planners import make_plan, planner_options

    if limit_bytes is not None and not 0.0 < float(limit_bytes) < float("inf"):
        raise ConfigError(
            f"memory limit must be a finite number of bytes > 0 (got {limit_bytes!r})"
        )
    settings = techniques(problem, zero, recompute, micro_batches)
    kwargs = dict(plan_kwargs or {})
    limits = device_limits(problem, limit_bytes)
    say = progress or (lambda msg: None)
    tried: list[Fit] = []

    def candidate(p: Problem, plan: Plan, how: str) -> Fit:
        # the search reads a tried plan's time and memory only: its per-split rows (245,000 on
        # llama3-70b / h100:512, about 100 MB) are not made, and are priced for the one
        # returned (:func:`_whole`)
        ev = evaluate(p, plan, rows=False)
        fit = Fit(p, plan, ev, peak_fraction(ev, limits), how)
        tried.append(fit)
        return fit

    #: settings under which the planner's plan does not fit, found from its memory alone: priced
    #: (into ``tried``) only where the search needs their times or the closest plan
    misses: list[tuple[Problem, Plan, str]] = []

    def price_misses() -> None:
        for p, plan, how in misses:
            candidate(p, plan, how)
        misses.clear()

    # the least any setting needs: recomputation can need more than none (a model of one block
    # holds that block again on top of its checkpoints, section 6.3)
    bounds = {t: memory_lower_bound(t.apply(problem)) for t in settings}
    need = min(bounds.values())
    # the most memory-saving setting: the highest ZeRO stage and micro-batches, then the least bound
    lightest = min(settings, key=lambda t: (-t.zero_stage, -t.micro_batches, bounds[t]))
    if need > sum(limits.values()):
        # proven: no plan fits; one plan with the most memory-saving setting shows how close one comes
        p = lightest.apply(problem)
        say(f"memory: no plan can fit; planning with {lightest.label()} to show the closest")
        raise InfeasibleError(
            infeasible_message(
                p,
                limits,
                candidate(p, make_plan(p, planner, **kwargs), lightest.label()),
                need=need,
            )
        )
    # 1. the planner's own plan, priced with every setting: the least ZeRO stage that fits at the
    # plain setting's time (stages 0-2 cost the same) is the answer when there is one
    plain = [t for t in settings if not t.recompute and t.micro_batches == problem.micro_batches]
    first = (plain or settings)[0]
    say(f"memory: planning with {first.label()}")
    base = make_plan(first.apply(problem), planner, progress=progress, **kwargs)
    for t in settings:
        p, how = t.apply(problem), "as planned" if t == Technique() else t.label()
        if peak_fraction(device_memory(p, base), limits) > 1.0:
            misses.append((p, base, how))  # does not fit: its time matters only if nothing does
            continue
        fit = candidate(p, base, how)
        if fit.fits and t in plain and t.zero_stage <= 2:
            return _whole(fit)
    # 2. the settings that make the planner's plan fit, re-planned with each (the fastest first)
    fitting = sorted((f for f in tried if f.fits), key=lambda f: f.evaluation.step_time_s)
    found = list(fitting)
    for fit in fitting[:REPLANNED]:
        q = fit.problem
        t = Technique(q.zero_stage, q.recompute, q.micro_batches, q.checkpoint)
        say(f"memory: planning with {t.label()}")
        found.append(
            candidate(
                fit.problem,
                make_plan(fit.problem, planner, progress=progress, **kwargs),
                t.label() + ", re-planned",
            )
        )
    found = [f for f in found if f.fits]
    # 3. memory prices, with the settings that save the most memory at ZeRO stages 2 and 3
    options = planner_options(
        planner, kwargs.get("objective"), kwargs.get("shares"), kwargs.get("share_grid")
    )
    if not found:
        price_misses()
        step = min(f.evaluation.step_time_s for f in tried)
        for stage in sorted({min(2, lightest.zero_stage), lightest.zero_stage}):
            t = replace(lightest, zero_stage=stage)
            found += _price_search(
                t.apply(problem), planner, options, step, t.label(), candidate, say, progress
            )
            if found:
                break
    exact = False
    if (
        problem.array.depth == 1
        and len(problem.planning.nodes) <= EXACT_MAX_NODES
        and (not found or min(found, key=lambda f: f.evaluation.step_time_s).how != "as planned")
    ):
        price_misses()  # the one-split search and its error read every setting tried
        # one split: the MIP with a memory row per device is the whole problem, setting by setting
        so_far = min(found, key=lambda f: f.evaluation.step_time_s) if found else None
        best, proven = _exact_one_split(
            problem, settings, limit_bytes, options, candidate, say, so_far
        )
        if best is not None:
            found.append(best)
        exact = proven
        if best is None and proven:
            raise InfeasibleError(
                infeasible_message(
                    lightest.apply(problem),
                    limits,
                    min(tried, key=lambda f: f.peak_fraction),
                    True,
                    need,
                )
            )
    if found:
        best = min(found, key=lambda f: (f.evaluation.step_time_s, f.peak_fraction))
        return replace(_whole(best), exact=exact)
    price_misses()
    proven = False
    if problem.array.depth >= 2:
        # 5. exact top-down: each split's MIP with its halves' summed memory (the leaves' own)
        best, proven = _exact_search(problem, bounds, limit_bytes, options, candidate, say)
        if best is not None:
            return _whole(best)
    closest = min(tried, key=lambda f: f.peak_fraction)
    raise InfeasibleError(
        infeasible_message(
            lightest.apply(problem),
            limits,
            closest,
            need=need,
            proven=ROOT_PROOF if proven else False,
        )
    )


def _whole(fit: Fit) -> Fit:
    """``fit`` with its evaluation's per-split rows (priced again where the search dropped them)."""
    if fit.evaluation.rows or fit.problem.array.is_leaf:
        return fit
    return replace(fit, evaluation=evaluate(fit.problem, fit.plan))


#: How :func:`infeasible_message` says what :func:`_exact_search` proved.
ROOT_PROOF = (
    "the exact solver proved that no root split on the share grid keeps each half within its "
    "devices' summed memory, at any setting searched (a half's devices keep at least what the "
    "half keeps as one device, docs/costmodel.md section 6.2)"
)


class _NoSplit(Exception):
    """A split of :func:`_exact_search`'s hierarchy has no plan (``root``: it is the root, and
    the solver proved it infeasible)."""

    def __init__(self, root: bool = False):
        super().__init__()
        self.root = root


def _exact_search(
    problem: Problem, bounds: dict, limit_bytes, options, candidate, say
) -> tuple[Fit | None, bool]:
    """Above one split, where the search found nothing: per setting of ``bounds`` (setting ->
    its memory lower bound) that the bound allows (the least root-split bound first), every
    split top-down by its MIP with a memory row per half, a half's capacity its devices' summed
    memory (the leaves' own at the last level). That capacity is a necessary
    condition of every plan (a side's devices together keep at least what the side keeps as one
    device: weights, gradients and state divide or replicate, ZeRO shards divide by the replica
    share, activations divide or replicate, and a sum of largest blocks or units is at least the
    largest sum), so a root split infeasible at every setting proves that no plan fits.
    Returns (the fastest fitting plan found, proven that none fits)."""
    from parplan.costmodel.split import SplitProblem
    from parplan.formulation.mip import split_tables, too_large
    from parplan.solvers.backends.base import SolveOptions
    from parplan.solvers.dp import frontier_dp
    from parplan.solvers.exact import memory_for_split, solve_split_exact
    from parplan.solvers.hierarchy import plan_top_down

    limit = "device" if limit_bytes is None else limit_bytes
    root = SplitProblem.root(problem)
    if too_large(root, split_tables(root, options), options):
        return None, False  # the splits below have about the root's states: too large too

    def plan_split(p: Problem):
        def solve(sp: SplitProblem):
            if too_large(sp, split_tables(sp, options), options):
                raise _NoSplit()
            split, cert = solve_split_exact(
                sp,
                _backend_for(sp, options),
                options,
                SolveOptions(time_limit_s=EXACT_SEARCH_TIME_S),
                memory=memory_for_split(p, sp, limit),
                diagnose=False,
            )
            if split is None or cert.status.value not in ("optimal", "feasible"):
                raise _NoSplit(root=not sp.path and cert.status.value == "infeasible")
            return split

        return solve

    capacity = sum(device_limits(problem, limit_bytes).values())
    ranked = sorted(
        (
            (frontier_dp(SplitProblem.root(t.apply(problem)), options)[0], t)
            for t, need in bounds.items()
            if need <= capacity  # the setting's memory bound: else no plan fits with it
        ),
        key=lambda row: row[0],
    )
    best: Fit | None = None
    proven = True
    started = time.process_time()
    for bound, t in ranked:
        if best is not None and bound >= best.evaluation.step_time_s * (1 - 1e-12):
            break  # the root split's bound: this setting and the later ones are no faster
        if time.process_time() - started > EXACT_SEARCH_BUDGET_S:
            say(f"memory: the exact top-down search stopped after {EXACT_SEARCH_BUDGET_S:g} s")
            return best, False
        p = t.apply(problem)
        say(f"memory: exact top-down solve with {t.label()}")
        try:
            plan = plan_top_down(p, plan_split(p), "exact")
        except _NoSplit as stop:
            proven = proven and stop.root
            continue
        proven = False
        fit = candidate(p, plan, f"{t.label()}, exact top-down")
        if fit.fits and (best is None or fit.evaluation.step_time_s < best.evaluation.step_time_s):
            best = fit
    return best, proven and best is None


#: Seconds each split's model may take in :func:`_exact_search`.
EXACT_SEARCH_TIME_S = 10.0
#: CPU seconds :func:`_exact_search` starts settings within (then it says what it found).
EXACT_SEARCH_BUDGET_S = 60.0


def _price_search(
    p: Problem, planner, options, step: float, label: str, candidate, say, progress
) -> list[Fit]:
    """Plans under a climbing memory price until one fits, then a bisection for a faster one."""
    found: list[Fit] = []
    below = 0.0
    for k in PRICE_LADDER:
        say(f"memory: planning with {label} and a memory price of {k:g} x the step time")
        fit = candidate(
            p,
            _priced_plan(p, planner, options, k * step, progress),
            f"{label}, memory price {k:g} T",
        )
        if fit.fits:
            found.append(fit)
            lo, hi = below, k
            for _ in range(PRICE_BISECTIONS):
                mid = (lo * hi) ** 0.5 if lo > 0 else hi / 4
                fit = candidate(
                    p,
                    _priced_plan(p, planner, options, mid * step, progress),
                    f"{label}, memory price {mid:.3g} T",
                )
                if fit.fits:
                    found.append(fit)
                    hi = mid
                else:
                    lo = mid
            break
        below = k
    return found


#: Cell columns above which the memory search's exact split model goes to HiGHS (a child
#: process: about 0.5 s to start) rather than SCIP (in this process): on random 4-node graphs of
#: 20,000 cells SCIP took 8-11 s and HiGHS 0.12 s; on small models SCIP answers in milliseconds.
HIGHS_ABOVE_CELLS = 5_000


def _backend_for(sp, options) -> str:
    from parplan.formulation.mip import model_cells, split_tables

    return "highs" if model_cells(sp, split_tables(sp, options)) > HIGHS_ABOVE_CELLS else "scip"


def _exact_one_split(
    problem: Problem, settings, limit_bytes, options, candidate, say, best: Fit | None = None
) -> tuple[Fit | None, bool]:
    """On a two-device array: the fastest fitting plan over ``settings``, and whether that is
    proven (every setting decided). Per setting the DP's unconstrained optimum is a lower bound
    on its fitting plans, and the optimum itself where it fits; settings are taken in the order
    of that bound, and the MIP with a memory row per device (exact) runs only where the DP's
    plan does not fit and the bound is below the best fitting plan so far."""
    from parplan.costmodel.split import SplitProblem
    from parplan.solvers.dp import frontier_dp
    from parplan.solvers.exact import memory_limit_for, solve_split_exact

    capacity = sum(device_limits(problem, limit_bytes).values())
    bounds = []
    for t in settings:
        p = t.apply(problem)
        value, split = frontier_dp(SplitProblem.root(p), options)
        bounds.append((value, t, p, split))
    bounds.sort(key=lambda row: row[0])
    proven = True
    for value, t, p, split in bounds:
        if best is not None and value >= best.evaluation.step_time_s * (1 - 1e-12):
            break  # this setting and every later one cost at least the best fitting plan
        fit = candidate(p, Plan({"": split}, planner="accpar"), f"{t.label()}, DP optimum")
        if not fit.fits:
            if memory_lower_bound(p) > capacity:
                continue  # proven: no plan with this setting fits
            say(f"memory: exact solve of the split with {t.label()}")
            sp = SplitProblem.root(p)
            split, cert = solve_split_exact(
                sp,
                _backend_for(sp, options),
                options,
                memory=memory_limit_for(p.array, "device" if limit_bytes is None else limit_bytes),
                diagnose=False,
            )
            proven = proven and cert.status.value in ("optimal", "infeasible")
            if split is None or cert.status.value not in ("optimal", "feasible"):
                continue
            fit = candidate(
                p,
                Plan({"": split}, planner="exact", info={"certificate": cert.status.value}),
                f"{t.label()}, exact MIP ({cert.status.value})",
            )
        if fit.fits and (best is None or fit.evaluation.step_time_s < best.evaluation.step_time_s):
            best = fit
    return best, proven


def _priced_plan(problem: Problem, planner: str, options, price: float, progress) -> Plan:
    from parplan.solvers.planners import make_plan

    plan = make_plan(
        problem, planner, options=replace(options, memory_price=price), progress=progress
    )
    return Plan(plan.splits, planner=planner, info={**plan.info, "memory_price_s": price})


def _size(x: float) -> str:
    """Bytes in GiB, MiB or KiB, whichever shows them with 3 significant digits."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if x >= 0.1 * scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x / 2**10:.2f} KiB"


def infeasible_message(
    problem: Problem,
    limits: dict[str, float],
    closest: Fit,
    proven: bool | str = False,
    need: float | None = None,
) -> str:
    """One line: the least memory any plan needs (``need``: the least over the settings
    searched; by default :func:`memory_lower_bound` of ``problem``, the most memory-saving
    setting) and the plan that came closest. ``proven``: no plan fits, by the exact solver (a
    string: what it proved)."""
    need = memory_lower_bound(problem) if need is None else need
    total = sum(limits.values())
    n = len(limits)
    worst = max(
        limits,
        key=lambda path: closest.evaluation.device_memory_bytes.get(path, 0.0) / limits[path],
    )
    close = (
        f"the closest plan found ({closest.how}) needs {_size(closest.evaluation.device_memory_bytes[worst])} "
        f"on device {worst or 'root'} of {_size(limits[worst])}"
    )
    if need > total:
        return (
            f"no plan fits: every plan keeps at least {_size(need)} over the {n} devices "
            f"({_size(need / n)} per device on average, {need / total:.2f}x their "
            f"{_size(total)}); {close}. Use more devices, a smaller batch or fewer optimizer bytes"
        )
    if proven:
        how = (
            proven
            if isinstance(proven, str)
            else "the exact solver proved that no plan on the share grid keeps every device within its limit"
        )
        return f"no plan fits: {how} ({close}; every plan keeps at least {_size(need)} over the {n} devices)"
    return (
        f"parplan found no plan that fits ({close}); every plan keeps at least {_size(need)} over the "
        f"{n} devices ({need / total:.0%} of their memory), so a plan may exist that parplan's search missed: "
        f"try 'parplan solve --memory-limit', a smaller batch or more devices"
    )


__all__ = [
    "Fit",
    "PRICE_LADDER",
    "device_limits",
    "fit_plan",
    "infeasible_message",
    "memory_lower_bound",
    "peak_fraction",
]
