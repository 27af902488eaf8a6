"""Exact planning with certificates: every split solved by a MIP backend (docs/costmodel.md section 8).

:func:`solve_exact` plans a problem level by level over the hierarchy, as AccPar does (each
split is an exact MIP, :func:`parplan.formulation.mip.build_mip`). The plan is priced by the
evaluator and the :class:`Certificate` compares that price with the solver's proven bound:

- ``status`` "optimal" only when the solver proved optimality *and* the evaluated price is
  within ``gap_tol`` of a bound valid for the problem as posed (shares on the grid), and the
  decoded plan passed the cost model's own memory re-check; "feasible" when a plan exists but
  no such proof (e.g. level-by-level on several levels);
  "time_limit" when the solver ran out of time (the plan found so far and its true gap are
  kept); "infeasible" (with the failed constraint family and how much memory is missing);
  "error".
- ``bound``: for one split, the solver's bound converted to seconds (elements for the
  communication objective), minus the integer model's rounding error. For the hierarchy, the
  root split's bound: any plan's step time is at least its root split's one-level price
  (a group's time for a layer is at least its FLOPs over the group's summed throughput), and
  the root memory constraint is necessary, so this bounds every plan of the hierarchy.

Level by level, each split below the root is solved with the per-node floors that
:func:`~parplan.solvers.hierarchy.plan_top_down` hands it (the sibling group's time); floors
make many configurations tie, and which of the tied optima a solver returns changes the
sub-problems below it, so on deep arrays different backends (and the DP) may end at different
step times although every split is optimal. The certificate then says "feasible" with the
global bound and gap.

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> p = Problem(get_model("lenet"), parse_array("tpu-v2:1,tpu-v3:1"), batch=512)
    >>> r = solve_exact(p, backend="scip")
    >>> r.certificate.status == "optimal", r.certificate.status is Status.OPTIMAL, r.certificate.gap < 1e-6
    (True, True, True)
    >>> abs(r.certificate.objective - r.evaluation.step_time_s) < 1e-15
    True
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable

from parplan.costmodel.cost import Objective, ShareMode
from parplan.costmodel.split import price_split
from parplan.costmodel.evaluate import evaluate, memory_overruns, price_of
from parplan.costmodel.hardware import ArrayNode
from parplan.costmodel.problem import Plan, Problem, Split
from parplan.errors import ConfigError, TableTooLarge
from parplan.formulation.mip import (
    GIB,
    MemoryLimit,
    build_mip,
    memory_need_model,
    plan_memory_bytes,
)
from parplan.solvers.backends.base import SolveOptions, Termination, solve_after_build
from parplan.solvers.backends.registry import available_backends, backend_spec, get_backend
from parplan.costmodel.split import PlanOptions, SplitProblem, split_tables
from parplan.solvers.continuous import continuous_plan, continuous_split
from parplan.solvers.dp import fallback_split, frontier_dp, live_states
from parplan.solvers.certificate import (
    GAP_TOL,
    Certificate,
    ExactResult,
    Status,
    aggregate,
    gap,
    require_plan,
    status_of,
)
from parplan.solvers.hierarchy import plan_top_down
from parplan.solvers.limits import device_limit_bytes

#: Relative slack under which a decoded plan's memory counts as within its limit.
MEMORY_TOL = 1e-9
#: Wall seconds per split for the continuous-share search a certificate reports
#: (:mod:`parplan.solvers.continuous`; 12 of the zoo's 16 CNNs close within 1.5 s of CPU on one
#: split, ResNet-34 in 7 s; past the limit the certificate states the bracket found). 0: no search.
CONTINUOUS_TIME_S = 5.0


def solve_split_exact(
    sp: SplitProblem,
    backend: str = "scip",
    options: PlanOptions | None = None,
    solve_options: SolveOptions | None = None,
    memory: MemoryLimit | None = None,
    gap_tol: float = GAP_TOL,
    diagnose: bool = True,
) -> tuple[Split | None, Certificate]:
    """Solve one split exactly: (split or None, certificate). ``diagnose``: when infeasible,
    solve once more for how much memory is missing (the certificate's message).

    The decoded split is re-checked by the cost model, not the solver: its price is
    :func:`~parplan.costmodel.split.price_split` and its memory
    :func:`~parplan.formulation.mip.plan_memory_bytes`; a plan over its memory limit is never
    reported as optimal or feasible.
    """
    options = PlanOptions() if options is None else options
    solve_options = SolveOptions() if solve_options is None else solve_options
    spec = backend_spec(backend)
    discrete = not spec.supports_continuous
    started = time.perf_counter()
    dp = _dp_split(sp, options)
    tables, dropped = _live_tables(sp, options, memory, dp)
    try:
        model, decoder = build_mip(sp, options, memory=memory, discrete=discrete, tables=tables)
    except TableTooLarge as exc:
        return _fallback(sp, spec, options, memory, str(exc), dp)
    build_s = time.perf_counter() - started
    solver = get_backend(spec.name)
    raw = solve_after_build(solver, model, solve_options, build_s)
    notes = list(model.notes) + ([dropped] if dropped else [])
    scale = model.objective_scale
    split = decoder(raw) if raw.has_solution else None
    price = price_split(sp, split, options) if split is not None else None
    bound = None
    if raw.bound is not None:
        bound = (raw.bound - model.objective_error) / scale
    gap_ = gap(price, bound)
    status = status_of(raw, bound is not None, gap_, max(gap_tol, solve_options.mip_gap))
    message = ""
    if split is not None and memory is not None:
        used = plan_memory_bytes(sp, split)
        over = [
            (i, u, c)
            for i, (u, c) in enumerate(zip(used, memory.capacity_bytes))
            if u > c * (1 + MEMORY_TOL)
        ]
        if over:
            i, u, c = over[0]
            status = Status.ERROR
            message = (
                f"the solver's plan needs {u:.0f} B on side {i + 1}, over its {c:.0f} B limit (solver "
                "tolerance); the plan is not certified"
            )
    continuous = continuous_value = None
    if (
        split is not None
        and CONTINUOUS_TIME_S > 0
        and options.objective is Objective.TIME
        and options.shares is ShareMode.FREE
        and memory is None
    ):
        found = continuous_split(sp, options, time_limit_s=CONTINUOUS_TIME_S, start=split)
        continuous, continuous_value = found.bound_s, found.value_s
        notes.append(_continuous_note(found, price, options.share_grid))
    failed = None
    if status == "infeasible" and diagnose:
        failed, message = _diagnose(sp, model, solver, solve_options, memory)
    cert = Certificate(
        status=status,
        termination=raw.termination,
        has_solution=raw.has_solution,
        objective=price,
        model_objective=None if raw.objective is None else raw.objective / scale,
        bound=bound,
        gap=gap_,
        unit=model.objective_unit,
        backend=spec.name,
        solver=raw.solver,
        version=raw.version,
        wall_s=raw.wall_s,
        scope="split",
        path=sp.path,
        failed_family=failed,
        message=message or raw.message or _default_message(status, raw, solve_options),
        notes=tuple(notes),
        model_size=model.describe(),
        continuous_bound=continuous,
        continuous_value=continuous_value,
    )
    return split, cert


def _dp_split(sp: SplitProblem, options: PlanOptions) -> Split | None:
    """The exact DP's split on the share grid (planned without memory limits), or None where its
    tables are too large: the plan the exact model must beat, and a too-large model's plan."""
    try:
        return frontier_dp(sp, options)[1]
    except TableTooLarge:
        return None


def _fits(sp: SplitProblem, split: Split, memory: MemoryLimit | None, tol: float) -> bool:
    """Whether ``split`` needs at most ``(1 + tol)`` of each side's memory limit (the cost model's
    :func:`~parplan.formulation.mip.plan_memory_bytes`, not the solver's rows)."""
    if memory is None:
        return True
    used = plan_memory_bytes(sp, split)
    return all(u <= c * (1 + tol) for u, c in zip(used, memory.capacity_bytes))


def _live_tables(
    sp: SplitProblem, options: PlanOptions, memory, dp: Split | None
) -> tuple[list | None, str]:
    """(the state tables of the states an optimal assignment may have, a certificate note), or
    (None, "") for the whole tables: docs/costmodel.md section 8, "States no optimum has"
    (:func:`~parplan.solvers.dp.live_states`; each state dropped has a lower bound above the
    price of ``dp``, the DP's plan, re-priced by the cost model; without one, the bound of
    live_states' own small DP). Under a memory limit only where that plan fits it (its memory
    re-checked by the cost model): then no plan that fits and is cheaper has a state dropped
    either."""
    if memory is not None and (dp is None or not _fits(sp, dp, memory, -MEMORY_TOL)):
        return None, ""  # the plan to beat must fit
    tables = split_tables(sp, options)
    upper = None if dp is None else price_split(sp, dp, options)
    try:
        kept = live_states(sp, options, tables, force=True, upper=upper)
    except TableTooLarge:
        kept = None
    if kept is None:
        return None, ""
    total = sum(t.size for t in tables)
    left = sum(t.size if k is None else len(k) for t, k in zip(tables, kept))
    note = (
        f"{total - left} of {total} states dropped before the model: each one's bound (its own "
        "terms with nothing sent, and every other node at its cheapest) exceeds the price of a "
        "plan (the DP's), so no optimum has it"
    )
    return [t if k is None else t.subset(k) for t, k in zip(tables, kept)], note


def _continuous_note(found, price: float | None, grid: int) -> str:
    """What a certificate says of continuous shares (docs/costmodel.md section 8)."""
    ms = lambda x: f"{x * 1e3:.7g} ms"  # noqa: E731
    if found.proven:
        head = (
            f"with continuous shares (anywhere in [0, 1]) this split's optimum is {ms(found.value_s)}, "
            f"proven within {found.gap:.1e} (branch-and-bound over share intervals, {found.rounds} rounds)"
        )
    else:
        head = (
            f"with continuous shares this split's optimum lies in [{ms(found.bound_s)}, "
            f"{ms(found.value_s)}] (branch-and-bound over share intervals stopped: {found.stop}, "
            f"{found.rounds} rounds)"
        )
    if price is None or found.bound_s <= 0:
        return head
    above = max(0.0, price / found.bound_s - 1)
    return (
        f"{head}; the plan on the grid of 1/{grid} (plus the proportional share) is "
        f"{'' if found.proven else 'at most '}{above:.3%} above it"
    )


def _default_message(status, raw, solve_options: SolveOptions) -> str:
    """What a certificate says when the solver said nothing: never an empty "error"."""
    if status == Status.TIME_LIMIT:
        limit = (
            "" if solve_options.time_limit_s is None else f" of {solve_options.time_limit_s:g} s"
        )
        found = "with a plan (its gap is reported)" if raw.has_solution else "before finding a plan"
        return f"the solver stopped at its time limit{limit} {found}"
    if status == Status.ERROR:
        return (
            f"the solver stopped without a proof or a plan (its status: {raw.native_status or 'none'}, "
            f"after {raw.wall_s:.3g} s)"
        )
    return ""


def _fallback(
    sp: SplitProblem,
    spec,
    options: PlanOptions,
    memory: MemoryLimit | None,
    reason: str,
    dp: Split | None,
) -> tuple[Split | None, Certificate]:
    """A split too large for the exact model (a node read by many consumers: DenseNet; a large
    transformer's cells) still gets a plan: the exact DP's where its tables fit (and, under a
    memory limit, its plan fits: the DP plans without memory), else
    :func:`~parplan.solvers.dp.fallback_split`'s; re-priced and memory re-checked, certified as
    feasible only (no solver bound). ``dp``: the exact DP's split, or None where its tables
    are too large."""
    t0 = time.perf_counter()
    split = None
    # the exact DP where its tables fit (optimal for the grid, no solver bound), planned without
    # memory: kept where it fits
    if options.memory_price == 0 and dp is not None and _fits(sp, dp, memory, MEMORY_TOL):
        split = dp
        how = (
            f"the exact DP on the share grid of 1/{options.share_grid} (variable elimination: "
            "optimal for the grid; not a solver's proof)"
        )
    if split is None:
        _, split, how = fallback_split(sp, options)
    price = price_split(sp, split, options)
    status, message = (
        Status.FEASIBLE,
        f"{reason.split('; use')[0]}: no exact model; planned by {how}, no bound",
    )
    if not _fits(sp, split, memory, MEMORY_TOL):
        status, message = (
            Status.ERROR,
            message + "; the plan exceeds the memory limit (`parplan plan --memory-limit` "
            "searches ZeRO stages, recomputation and micro-batches for one that fits)",
        )
    cert = Certificate(
        status=status,
        termination=Termination.NOT_SOLVED,
        has_solution=True,
        objective=price,
        model_objective=None,
        bound=None,
        gap=None,
        unit="s" if options.objective is Objective.TIME else "elements",
        backend=spec.name,
        solver="fallback",
        version="",
        wall_s=time.perf_counter() - t0,
        path=sp.path,
        message=message,
    )
    return split, cert


def _diagnose(
    sp: SplitProblem, model, solver, solve_options: SolveOptions, memory: MemoryLimit | None
):
    """Which constraint family makes the split infeasible, and by how much (memory)."""
    c1, c2 = sp.side.flops_per_s
    where = (
        f"split '{sp.path}'"
        if sp.path
        else f"the split of the {sp.side.hosts}-device group ({c1 / 1e12:.0f} | {c2 / 1e12:.0f} TFLOP/s)"
    )
    if memory is None or "memory" not in model.families():
        return "unknown", f"{where} is infeasible without a memory limit (please report this model)"
    # Every state assignment satisfies the other families (one state per node; the cells follow),
    # so memory is the cause. How much is missing depends on the node states only: the need
    # model keeps the one-hot and memory rows.
    need_model = memory_need_model(model.without("edge_link"))
    cont = solver if backend_spec(solver.name).supports_continuous else None
    if cont is None:
        names = [n for n in available_backends() if backend_spec(n).supports_continuous]
        cont = get_backend(names[0]) if names else None
    factor = None
    if cont is not None:
        r = cont.solve(need_model, solve_options)
        if r.has_solution and r.bound is not None:
            factor = r.bound  # a proven lower bound on the factor: never over-states the need
    caps = memory.capacity_bytes
    if factor is None:
        return (
            "memory",
            f"memory: no plan of {where} fits the memory limit ({caps[0] / GIB:.2f} / {caps[1] / GIB:.2f} GiB)",
        )
    return "memory", (
        f"memory: {where} needs at least {factor:.4g}x the memory it has: side 1 at least "
        f"{factor * caps[0] / GIB:.2f} GiB (has {caps[0] / GIB:.2f}), side 2 at least {factor * caps[1] / GIB:.2f} GiB "
        f"(has {caps[1] / GIB:.2f})"
        + ("" if memory.per_device else " in total over the side's devices")
        + "; raise the memory limit or use more devices"
    )


def memory_limit_for(
    group: ArrayNode, memory_limit_bytes: float | str | None
) -> MemoryLimit | None:
    """Per-side capacities of splitting ``group``: ``memory_limit_bytes`` per device, or each
    device's own memory for ``"device"``, summed over the side's devices; None: no limit."""
    if memory_limit_bytes is None:
        return None
    caps = tuple(
        sum(device_limit_bytes(d, memory_limit_bytes) for d in side.devices())
        for side in (group.left, group.right)
    )
    return MemoryLimit(caps, per_device=group.left.is_leaf and group.right.is_leaf)


def memory_for_split(problem: Problem, sp: SplitProblem, memory_limit_bytes) -> MemoryLimit | None:
    """The memory limit of the group a split problem belongs to (found by its cost view, since
    the hierarchy hands splits over without their group); groups that look alike to the cost
    model must have the same capacities."""
    if memory_limit_bytes is None:
        return None
    limits = {
        memory_limit_for(g, memory_limit_bytes)
        for _, g in problem.array.inner_nodes()
        if problem.side_spec(g) == sp.side
    }
    if len(limits) != 1:
        raise ConfigError(
            f"array '{problem.array.describe()}': cannot tell which group a split belongs to for "
            "its memory limit (groups with equal throughput and links but different memory)"
        )
    return limits.pop()


class _Stop(Exception):
    def __init__(self, cert: Certificate):
        self.cert = cert


def solve_exact(
    problem: Problem,
    backend: str = "scip",
    options: PlanOptions | None = None,
    time_limit_s: float | None = None,
    memory_limit_bytes: float | str | None = None,
    joint: bool = False,
    solve_options: SolveOptions | None = None,
    progress: Callable[[str], None] | None = None,
    symmetric: bool = True,
) -> ExactResult:
    """Plan ``problem`` exactly, level by level (or jointly): plan, certificate, evaluation.

    ``time_limit_s`` applies to each MIP solve; ``memory_limit_bytes`` is the capacity of every
    device in bytes (``"device"``: each device's own memory; None: no memory constraint);
    ``joint=True`` solves every split at once (:func:`parplan.solvers.joint.solve_joint`, with
    ``symmetric`` classes for interchangeable siblings), started from the DP plan.
    """
    options = PlanOptions() if options is None else options
    base = SolveOptions() if solve_options is None else solve_options
    so = replace(base, time_limit_s=time_limit_s) if time_limit_s is not None else base
    if problem.array.is_leaf:
        raise ConfigError(f"array '{problem.array.describe()}' has one device: nothing to split")
    if joint:
        from parplan.solvers.joint import solve_joint

        return solve_joint(
            problem,
            backend,
            options,
            memory_limit_bytes=memory_limit_bytes,
            symmetric=symmetric,
            solve_options=so,
            progress=progress,
        )
    spec = backend_spec(backend)
    solved: list[tuple[Split, Certificate]] = []

    def plan_split(sp: SplitProblem) -> Split:
        if progress is not None:
            progress(f"solving a split of {sp.side.hosts} devices with {spec.name}")
        split, cert = solve_split_exact(
            sp, spec.name, options, so, memory_for_split(problem, sp, memory_limit_bytes)
        )
        if split is None or cert.status == Status.ERROR:
            # no plan, or one that failed the re-check (over its memory limit by the solver's
            # tolerance): never handed on as a plan (issue 30)
            raise _Stop(cert)
        solved.append((split, cert))
        return split

    t0 = time.perf_counter()
    try:
        plan = plan_top_down(problem, plan_split, f"exact-{spec.name}")
    except _Stop as stop:
        certs = {f"#{i}": c for i, (_, c) in enumerate(solved)}
        cert = aggregate(
            problem,
            None,
            None,
            certs,
            stop.cert,
            time.perf_counter() - t0,
            "level-by-level",
            options,
        )
        return ExactResult(None, cert, None)
    # the hierarchy hands splits over without their path: match them back by identity
    by_id = {id(split): cert for split, cert in solved}
    certs = {path: replace(by_id[id(split)], path=path) for path, split in plan.splits.items()}
    plan = Plan(
        plan.splits,
        planner=f"exact-{spec.name}",
        info={
            "objective": options.objective.value,
            "shares": options.shares.value,
            "scope": "level-by-level",
        },
    )
    ev = evaluate(problem, plan)
    cert = aggregate(
        problem, plan, ev, certs, None, time.perf_counter() - t0, "level-by-level", options
    )
    return ExactResult(plan, cert, ev)


@dataclass(frozen=True)
class Certification:
    """The fast DP plan checked against an exact solve of the same problem (``parplan certify``).

    Objectives are in the certificate's unit (seconds, or elements for the communication
    objective). ``contradictions`` lists results that would prove a planner or the model wrong:
    the DP beating a proven bound, or beating a one-level "optimal" exact plan.
    """

    dp_plan: Plan
    dp_objective: float
    dp_s: float
    exact: ExactResult
    exact_s: float
    contradictions: tuple[str, ...]
    #: Step-time objective only: a lower bound on every plan of the whole hierarchy, shares
    #: anywhere in [0, 1] (:func:`parplan.solvers.bound.global_bound`); None otherwise.
    global_bound_s: float | None = None
    #: The best step time of the DP's, the portfolio's, the polished, the continuous and the
    #: exact plan (seconds; None without a bound).
    best_s: float | None = None
    #: Step time of the better of the DP's and the portfolio's plans after
    #: :func:`parplan.solvers.polish.polish` (small problems, :func:`parplan.solvers.polish.auto_polish`;
    #: step-time objective, no memory limit; else None).
    polished_s: float | None = None
    #: The ``accpar`` portfolio's plan with the same shares and grid (what ``parplan plan``
    #: gives; its level criteria include look-aheads the plain DP lacks) and the criterion that
    #: won; None for other planners, custom options, the communication objective or a memory limit.
    portfolio_s: float | None = None
    portfolio_selected: str | None = None
    #: The top-down recursion with each split's shares searched continuously
    #: (:func:`parplan.solvers.continuous.continuous_plan`) where it fits; free shares and the
    #: step-time objective only, else None.
    continuous_s: float | None = None
    #: The better of the DP's and the portfolio's plans (the polish's start): its excess over its
    #: layers' own bounds, split into what its states cost in each layer's own terms and the
    #: transfers between layers (:func:`parplan.solvers.bound.pinned_node_bounds`; seconds,
    #: step-time objective only, else None).
    excess_states_s: float | None = None
    excess_transfers_s: float | None = None
    #: The per-node bound's sum (the layers' own bounds; the global bound is at least it).
    per_node_bound_s: float | None = None

    @property
    def global_gap(self) -> float | None:
        """How far the best plan found may be from the global optimum: best / bound - 1."""
        if self.global_bound_s is None or self.best_s is None or not self.global_bound_s > 0:
            return None
        return max(0.0, self.best_s / self.global_bound_s - 1.0)

    @property
    def dp_minus_exact_rel(self) -> float | None:
        e = self.exact.certificate.objective
        return None if e is None else (self.dp_objective - e) / e

    @property
    def dp_gap_to_bound(self) -> float | None:
        b = self.exact.certificate.bound
        return None if b is None else max(0.0, (self.dp_objective - b) / self.dp_objective)


def certify(
    problem: Problem,
    planner: str = "accpar",
    backend: str = "scip",
    options: PlanOptions | None = None,
    time_limit_s: float | None = None,
    memory_limit_bytes: float | str | None = None,
    solve_options: SolveOptions | None = None,
    progress: Callable[[str], None] | None = None,
    joint: bool = False,
    symmetric: bool = True,
) -> Certification:
    """Run ``planner``'s DP and the exact solver on ``problem`` with the same options; compare.
    ``joint``: the exact solver plans every split at once (``symmetric``: see
    :func:`~parplan.solvers.joint.solve_joint`) instead of level by level.

    Example:
        >>> from parplan.models.zoo import get_model
        >>> from parplan.costmodel.hardware import parse_array
        >>> c = certify(Problem(get_model("lenet"), parse_array("tpu-v2:1,tpu-v3:1"), batch=64))
        >>> str(c.exact.certificate.status), abs(c.dp_minus_exact_rel) < 1e-6, c.contradictions
        ('optimal', True, ())
    """
    from parplan.solvers.planners import make_plan, planner_options

    options = planner_options(planner) if options is None else options
    t0 = time.perf_counter()
    dp_plan = make_plan(problem, planner, options=options)
    dp_s = time.perf_counter() - t0
    dp_price = price_of(evaluate(problem, dp_plan), options)
    t0 = time.perf_counter()
    result = solve_exact(
        problem,
        backend,
        options,
        time_limit_s=time_limit_s,
        memory_limit_bytes=memory_limit_bytes,
        solve_options=solve_options,
        progress=progress,
        joint=joint,
        symmetric=symmetric,
    )
    exact_s = time.perf_counter() - t0
    cert = result.certificate
    bad = []

    def fits(plan: Plan) -> bool:
        """Whether every device keeps ``plan`` within the memory limit (always without one)."""
        if memory_limit_bytes is None:
            return True
        limit = (
            None if memory_limit_bytes == "device" else device_limit_bytes(None, memory_limit_bytes)
        )
        return not memory_overruns(problem, evaluate(problem, plan), limit)

    # the DP plans without memory: its plan is a competitor only where it fits
    dp_fits = fits(dp_plan)
    # a symmetric joint bound holds for symmetric plans only; the DP's need not be one
    bound_covers_dp = not (joint and symmetric)
    if (
        cert.bound is not None
        and dp_price < cert.bound * (1 - 1e-6)
        and dp_fits
        and bound_covers_dp
    ):
        bad.append("the DP plan is cheaper than the exact solver's proven bound")
    if (
        cert.is_optimal
        and problem.array.depth == 1
        and cert.objective is not None
        and dp_price < cert.objective * (1 - 1e-6)
        and dp_fits
    ):
        bad.append("the DP plan is cheaper than the 'optimal' exact plan")
    bound = best = polished = portfolio = selected = continuous = None
    states = transfers = per_node = None
    if options.objective is Objective.TIME and problem.compat is None:
        from parplan.solvers.bound import excess_parts, global_bound, pinned_node_bounds
        from parplan.solvers.polish import auto_polish, polish

        start = dp_plan
        same = dict(shares=options.shares.value, share_grid=options.share_grid)
        if (
            planner.strip().lower() == "accpar"
            and problem.array.depth > 1
            and options == planner_options("accpar", **same)
        ):
            if progress is not None:
                progress("the accpar portfolio (every level criterion)")
            plan = make_plan(problem, "accpar", **same)
            if fits(plan):
                portfolio, selected = evaluate(problem, plan).step_time_s, plan.info["selected"]
                start = plan if portfolio < dp_price or not dp_fits else dp_plan
        if progress is not None:
            progress("global bound over the whole hierarchy")
        whole = global_bound(problem)
        bound, per_node = whole.bound_s, math.fsum(whole.node_s)
        start_fits = fits(start)
        if start_fits:  # where its gap sits (docs/costmodel.md section 8)
            parts = excess_parts(
                evaluate(problem, start, rows=False).node_time_s,
                whole.node_s,
                pinned_node_bounds(problem, start),
            )
            states, transfers = (math.fsum(x) for x in zip(*parts))
        if start_fits and auto_polish(problem):
            if progress is not None:
                progress("polishing the best plan so far (multi-level moves)")
            moved = polish(problem, start, options)[0]
            polished = evaluate(problem, moved).step_time_s if fits(moved) else None
        if options.shares is ShareMode.FREE and options.memory_price == 0 and CONTINUOUS_TIME_S > 0:
            if progress is not None:
                progress("continuous shares, split by split (the top-down recursion)")
            try:
                found_plan, _ = continuous_plan(problem, options, CONTINUOUS_TIME_S, progress)
            except TableTooLarge:
                found_plan = None
            if found_plan is not None and fits(found_plan):
                continuous = evaluate(problem, found_plan).step_time_s
        # only plans that fit the memory limit count
        found = (
            ([dp_price] if dp_fits else [])
            + ([cert.objective] if cert.objective is not None else [])
            + [x for x in (polished, portfolio, continuous) if x is not None]
        )
        best = min(found) if found else None
        if min([dp_price, *found]) < bound * (
            1 - 1e-9
        ):  # the global bound drops memory: every plan
            bad.append("a plan is faster than the global bound")
    return Certification(
        dp_plan,
        dp_price,
        dp_s,
        result,
        exact_s,
        tuple(bad),
        bound,
        best,
        polished,
        portfolio,
        selected,
        continuous,
        states,
        transfers,
        per_node,
    )


__all__ = [
    "Certificate",
    "Status",
    "Certification",
    "certify",
    "ExactResult",
    "GAP_TOL",
    "device_limit_bytes",
    "memory_for_split",
    "memory_limit_for",
    "price_of",
    "require_plan",
    "solve_exact",
    "solve_split_exact",
]
