"""Joint exact planning of the whole hierarchy (docs/costmodel.md section 8, "Joint model").

:func:`solve_joint` solves :func:`~parplan.formulation.joint.build_joint` with a MIP backend,
started from the DP plan (made symmetric when the model is), under a time limit, and
certifies the result the way every exact result is certified here: the decoded plan is
re-priced by the evaluator and re-checked against every device's memory by code that is not
the solver; "optimal" needs the solver's proof within the gap tolerance *and* the evaluator's
price equal to the model's objective. The bound holds for every plan with shares on the grid
(symmetric plans only, when the model is symmetric: see the certificate's notes).

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.costmodel.cost import ShareMode
    >>> p = Problem(get_model("lenet"), parse_array("h100:4"), batch=64)
    >>> r = solve_joint(p, options=PlanOptions(shares=ShareMode.HALF))
    >>> str(r.certificate.status), r.certificate.scope, abs(r.certificate.objective - r.evaluation.step_time_s) < 1e-15
    ('optimal', 'joint-symmetric', True)
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Callable

from parplan.costmodel.cost import Objective
from parplan.costmodel.evaluate import Evaluation, evaluate, price_of
from parplan.costmodel.problem import Plan, Problem
from parplan.costmodel.split import PlanOptions
from parplan.errors import ConfigError, TableTooLarge
from parplan.formulation.joint import build_joint
from parplan.solvers.backends.base import SolveOptions, solve_after_build
from parplan.solvers.backends.registry import backend_spec, get_backend
from parplan.solvers.certificate import GAP_TOL, Certificate, ExactResult, Status, gap, status_of
from parplan.solvers.limits import device_capacity

#: Relative difference under which the evaluator's price and the model's objective agree.
AGREE_TOL = 1e-6
#: Backends whose joint model keeps continuous node-time variables.
JOINT_BACKENDS = ("scip", "highs", "cbc")
#: Backends that take a start solution. HiGHS 1.16 given a start (``setSolution``) reported,
#: on some joint models, an optimum and a bound below the objective of its own returned values
#: (the certificate's re-check caught it); parplan passes it none.
WARM_START_BACKENDS = ("scip",)


def symmetrize(plan: Plan, classes) -> Plan:
    """``plan`` with every group taking the split of the first group (pre-order) of its class."""
    first: dict[str, str] = {}
    for path in sorted(plan.splits, key=lambda p: (len(p), p)):
        first.setdefault(classes[path], path)
    return Plan(
        {path: plan.splits[first[classes[path]]] for path in plan.splits},
        planner=plan.planner,
        info=plan.info,
    )


def node_times(problem: Problem, ev: Evaluation) -> dict[tuple[str, int], float]:
    """(group path, node index) -> the node's time at that group, from the evaluation."""
    index = {node.name: v for v, node in enumerate(problem.planning.nodes)}
    return {(path, index[name]): t for (path, name), t in ev.group_node_times().items()}


def solve_joint(
    problem: Problem,
    backend: str = "scip",
    options: PlanOptions | None = None,
    time_limit_s: float | None = None,
    memory_limit_bytes: float | str | None = None,
    symmetric: bool = True,
    start: Plan | str | None = "dp",
    solve_options: SolveOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> ExactResult:
    """Plan every split of ``problem`` at once, exactly: plan, certificate, evaluation.

    ``symmetric``: interchangeable sibling groups take the same states (docs/costmodel.md
    section 8 says when that loses nothing); ``start``: a plan to start from, ``"dp"`` (the
    ``accpar`` planner's plan with ``options``) or None.
    """
    from parplan.solvers.planners import make_plan

    options = PlanOptions() if options is None else options
    so = SolveOptions() if solve_options is None else solve_options
    if time_limit_s is not None:
        so = replace(so, time_limit_s=time_limit_s)
    spec = backend_spec(backend)
    if spec.name not in JOINT_BACKENDS:
        raise ConfigError(
            f"the joint model has continuous node-time variables; backend '{spec.name}' takes integers "
            f"only: use {', '.join(JOINT_BACKENDS)}"
        )
    capacity = device_capacity(problem, memory_limit_bytes)
    t0 = time.perf_counter()
    if progress is not None:
        progress(
            f"building the joint model of {problem.array.count} devices"
            f"{' (symmetric)' if symmetric else ''}"
        )
    try:
        model, decoder = build_joint(problem, options, symmetric, capacity)
    except TableTooLarge as exc:
        raise ConfigError(str(exc)) from exc
    if progress is not None:
        progress(f"joint model: {model.describe()} ({time.perf_counter() - t0:.1f} s to build)")
    notes = list(model.notes)
    if isinstance(start, str):
        if start != "dp":
            raise ConfigError(f"start must be a plan, 'dp' or None (got {start!r})")
        start = make_plan(problem, "accpar", options=options)
    if start is not None:
        plan0 = symmetrize(start, decoder.classes) if symmetric else start
        ev0 = evaluate(problem, plan0)
        x0 = decoder.start(plan0, node_times(problem, ev0))
        if x0 is None:
            notes.append("the start plan is not on the model's share points: no warm start")
        elif spec.name not in WARM_START_BACKENDS:
            notes.append(f"backend '{spec.name}' takes no start solution: no warm start")
        else:
            model = replace(model, start=x0)
            notes.append(
                f"warm start from the {'symmetrized ' if symmetric else ''}DP plan "
                f"({price_of(ev0, options):.6g} {model.objective_unit})"
            )
    built_s = time.perf_counter() - t0  # the time limit covers building the model too
    if progress is not None:
        limit = (
            "no time limit"
            if so.time_limit_s is None
            else f"{so.time_limit_s - built_s:.3g} s left"
        )
        progress(f"solving the joint model with {spec.name} ({limit})")
    raw = solve_after_build(get_backend(spec.name), model, so, built_s, "the joint model")
    return _certify(
        problem,
        options,
        model,
        decoder,
        raw,
        notes,
        symmetric,
        memory_limit_bytes,
        capacity,
        time.perf_counter() - t0,
        spec.name,
        max(GAP_TOL, so.mip_gap),
    )


def _certify(
    problem,
    options,
    model,
    decoder,
    raw,
    notes,
    symmetric,
    memory_limit_bytes,
    capacity,
    wall,
    backend,
    gap_tol,
) -> ExactResult:
    """Re-price and re-check the decoded plan; the certificate (module docstring)."""
    scale = model.objective_scale
    plan = ev = price = None
    message = raw.message
    if raw.has_solution:
        plan = decoder(raw)
        plan = Plan(
            plan.splits,
            planner=f"joint-{backend}",
            info={
                "objective": options.objective.value,
                "shares": options.shares.value,
                "scope": "joint-symmetric" if symmetric else "joint",
            },
        )
        ev = evaluate(problem, plan)
        price = price_of(ev, options)
    bound = None if raw.bound is None else raw.bound / scale
    if bound is not None and options.objective is Objective.TIME:
        bound = max(
            bound, 0.0
        )  # every node time is >= 0 (a solver stopped before its root LP reports -inf-ish)
    gap_ = gap(price, bound)
    status = status_of(raw, bound is not None, gap_, gap_tol)
    model_obj = None if raw.objective is None else raw.objective / scale
    if (
        price is not None
        and model_obj is not None
        and not math.isclose(price, model_obj, rel_tol=AGREE_TOL, abs_tol=1e-15)
    ):
        status = Status.ERROR
        message = (
            f"the evaluator prices the decoded plan at {price!r}, the model at {model_obj!r}: the plan is "
            "not certified"
        )
    if ev is not None and capacity is not None:
        over = [
            (path, used, capacity[path])
            for path, used in ev.device_memory_bytes.items()
            if used > capacity[path] * (1 + 1e-9)
        ]
        if over:
            path, used, cap = over[0]
            status = Status.ERROR
            message = (
                f"the solver's plan needs {used:.0f} B on device '{path}', over its {cap:.0f} B limit "
                "(solver tolerance); the plan is not certified"
            )
    notes.append(
        "the bound holds for every plan with shares on the model's share points"
        + (" in which interchangeable sibling groups take the same states" if symmetric else "")
    )
    if memory_limit_bytes is not None:
        notes.append(
            "memory limit per device: "
            + (
                "its own memory"
                if memory_limit_bytes == "device"
                else f"{memory_limit_bytes:.6g} B"
            )
        )
    cert = Certificate(
        status=status,
        termination=raw.termination,
        has_solution=raw.has_solution,
        objective=price,
        model_objective=model_obj,
        bound=bound,
        gap=gap_,
        unit=model.objective_unit,
        backend=backend,
        solver=raw.solver,
        version=raw.version,
        wall_s=wall,
        scope="joint-symmetric" if symmetric else "joint",
        message=message,
        notes=tuple(notes),
        model_size=model.describe(),
    )
    if status in (Status.ERROR, Status.INFEASIBLE):
        return ExactResult(None, cert, None)
    return ExactResult(plan, cert, ev)


__all__ = ["JOINT_BACKENDS", "device_capacity", "node_times", "solve_joint", "symmetrize"]
