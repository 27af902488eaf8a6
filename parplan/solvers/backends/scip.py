"""SCIP through OR-Tools' ``pywraplp`` (the default exact backend).

Example:
    >>> from parplan.formulation.mip import ModelBuilder
    >>> b = ModelBuilder("tiny"); x = b.var("x", 0, 3, True); b.objective(x, -1.0)
    >>> b.constraint("one_hot", "c", [(x, 2.0)], "<=", 5.0)
    >>> r = ScipBackend().solve(b.build(), SolveOptions())
    >>> r.termination.value, r.objective, r.bound
    ('optimal', -2.0, -2.0)
"""

from __future__ import annotations

import math
import time

from parplan.errors import SolverError
from parplan.solvers.backends.base import (
    RawResult,
    SolveOptions,
    Termination,
    child_main,
    is_library_clash,
    solve_in_subprocess,
    stopped_by_time,
)

#: pywraplp result status -> termination (FEASIBLE / NOT_SOLVED are refined by the wall time).
STATUS_MAP = {
    "OPTIMAL": Termination.OPTIMAL,
    "FEASIBLE": Termination.TIME_LIMIT,
    "INFEASIBLE": Termination.INFEASIBLE,
    "UNBOUNDED": Termination.ERROR,
    "ABNORMAL": Termination.ERROR,
    "MODEL_INVALID": Termination.ERROR,
    "NOT_SOLVED": Termination.TIME_LIMIT,
}


class ScipBackend:
    """MIP with continuous variables; reports SCIP's dual bound."""

    name = "scip"

    def solve(self, model, options: SolveOptions) -> RawResult:
        try:
            from ortools.linear_solver import pywraplp  # noqa: F401 - loads OR-Tools' native library
        except ImportError as exc:
            if not is_library_clash(exc):
                raise SolverError(f"backend 'scip': cannot load OR-Tools ({exc})") from exc
            return solve_in_subprocess("parplan.solvers.backends.scip", model, options)
        return solve_here(model, options)


def solve_here(model, options: SolveOptions) -> RawResult:
    """Solve with SCIP in this process."""
    from ortools.linear_solver import pywraplp

    solver = pywraplp.Solver.CreateSolver("SCIP")
    if solver is None:
        raise SolverError(
            "backend 'scip': this OR-Tools build has no SCIP; use --backend cbc or highs"
        )
    inf = solver.infinity()
    xs = []
    for v in model.variables:
        lb = -inf if v.lb == -math.inf else v.lb
        ub = inf if v.ub == math.inf else v.ub
        xs.append(solver.IntVar(lb, ub, v.name) if v.integer else solver.NumVar(lb, ub, v.name))
    for c in model.constraints:
        lo = c.rhs if c.sense in (">=", "==") else -inf
        hi = c.rhs if c.sense in ("<=", "==") else inf
        row = solver.RowConstraint(lo, hi, c.name)
        for i, a in c.coeffs:
            row.SetCoefficient(xs[i], a)
    obj = solver.Objective()
    for i, a in model.objective:
        obj.SetCoefficient(xs[i], a)
    obj.SetOffset(model.objective_constant)
    obj.SetMinimization()
    if model.start is not None:
        solver.SetHint(xs, list(model.start))
    if options.time_limit_s is not None:
        solver.SetTimeLimit(max(1, int(options.time_limit_s * 1000)))
    solver.SetNumThreads(options.threads)
    solver.SetSolverSpecificParametersAsString(
        f"randomization/randomseedshift = {options.seed}\nlimits/gap = {options.mip_gap}\n"
    )
    if options.verbose:
        solver.EnableOutput()
    params = pywraplp.MPSolverParameters()
    params.SetDoubleParam(params.RELATIVE_MIP_GAP, options.mip_gap)
    t0 = time.perf_counter()
    status = solver.Solve(params)
    wall = time.perf_counter() - t0
    names = {getattr(pywraplp.Solver, k): k for k in STATUS_MAP}
    native = names.get(status, str(status))
    term = STATUS_MAP.get(native, Termination.ERROR)
    has = status in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE)
    if term is Termination.TIME_LIMIT and not stopped_by_time(wall, options):
        term = Termination.ERROR
    values = tuple(x.solution_value() for x in xs) if has else None
    bound = obj.BestBound() if has or term is Termination.TIME_LIMIT else None
    if bound is not None and not math.isfinite(bound):
        bound = None
    return RawResult(
        termination=term,
        has_solution=has,
        values=values,
        objective=obj.Value() if has else None,
        bound=bound,
        solver="SCIP (OR-Tools pywraplp)",
        version=solver.SolverVersion(),
        wall_s=wall,
        native_status=native,
    )


if __name__ == "__main__":
    child_main(solve_here)
