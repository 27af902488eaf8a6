"""OR-Tools CP-SAT (native ``ortools.sat`` API, not PuLP's adapter, which silently rounds
continuous variables). It takes only integer models: build them with
``build_mip(..., discrete=True)`` (shares on candidates plus a grid, integer-scaled times).

Example:
    >>> from parplan.formulation.mip import ModelBuilder
    >>> b = ModelBuilder("tiny"); x = b.var("x", 0, 3, True); b.objective(x, -1.0)
    >>> b.constraint("one_hot", "c", [(x, 2.0)], "<=", 5.0)
    >>> r = CpSatBackend().solve(b.build(), SolveOptions())
    >>> r.termination.value, r.objective, r.bound
    ('optimal', -2.0, -2.0)
"""

from __future__ import annotations

import time

from parplan.errors import ConfigError, SolverError
from parplan.solvers.backends.base import (
    RawResult,
    SolveOptions,
    Termination,
    child_main,
    is_library_clash,
    solve_in_subprocess,
    stopped_by_time,
)

#: CpSolverStatus name -> termination (FEASIBLE / UNKNOWN refined by the wall time).
STATUS_MAP = {
    "OPTIMAL": Termination.OPTIMAL,
    "FEASIBLE": Termination.TIME_LIMIT,
    "INFEASIBLE": Termination.INFEASIBLE,
    "MODEL_INVALID": Termination.ERROR,
    "UNKNOWN": Termination.TIME_LIMIT,
}


class CpSatBackend:
    """Integer models only (``supports_continuous`` is False)."""

    name = "cpsat"

    def solve(self, model, options: SolveOptions) -> RawResult:
        if not model.is_integral:
            raise ConfigError(
                f"backend 'cpsat' needs an integer model with integer coefficients; model '{model.name}' "
                "has continuous variables or fractional coefficients: build it with discrete=True "
                "(shares on a grid) or use backend scip, cbc or highs"
            )
        try:
            from ortools.sat.python import cp_model  # noqa: F401 - loads OR-Tools' native library
        except ImportError as exc:
            if not is_library_clash(exc):
                raise SolverError(f"backend 'cpsat': cannot load OR-Tools ({exc})") from exc
            return solve_in_subprocess("parplan.solvers.backends.cpsat", model, options)
        return solve_here(model, options)


def solve_here(model, options: SolveOptions) -> RawResult:
    """Solve with CP-SAT in this process (the model must be integral)."""
    import ortools
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    xs = [m.new_int_var(round(v.lb), round(v.ub), v.name) for v in model.variables]
    for c in model.constraints:
        expr = cp_model.LinearExpr.weighted_sum(
            [xs[i] for i, _ in c.coeffs], [round(a) for _, a in c.coeffs]
        )
        rhs = round(c.rhs)
        if c.sense == "<=":
            m.add(expr <= rhs)
        elif c.sense == ">=":
            m.add(expr >= rhs)
        else:
            m.add(expr == rhs)
    m.minimize(
        cp_model.LinearExpr.weighted_sum(
            [xs[i] for i, _ in model.objective], [round(a) for _, a in model.objective]
        )
        + round(model.objective_constant)
    )
    solver = cp_model.CpSolver()
    p = solver.parameters
    if options.time_limit_s is not None:
        p.max_time_in_seconds = float(options.time_limit_s)
    p.num_workers = options.threads
    p.random_seed = options.seed
    p.relative_gap_limit = options.mip_gap
    p.log_search_progress = bool(options.verbose)
    t0 = time.perf_counter()
    status = solver.solve(m)
    wall = time.perf_counter() - t0
    native = solver.status_name(status)
    term = STATUS_MAP.get(native, Termination.ERROR)
    has = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    if term is Termination.TIME_LIMIT and not stopped_by_time(wall, options):
        # UNKNOWN under a time limit is CP-SAT stopping at it (its own clock may read the limit
        # differently from ours on a loaded machine); without a limit it is a failure
        term = (
            Termination.TIME_LIMIT
            if native == "UNKNOWN" and options.time_limit_s is not None
            else Termination.ERROR
        )
    return RawResult(
        termination=term,
        has_solution=has,
        values=tuple(float(solver.value(x)) for x in xs) if has else None,
        objective=float(solver.objective_value) if has else None,
        bound=float(solver.best_objective_bound)
        if (has or term is Termination.TIME_LIMIT)
        else None,
        solver="CP-SAT (OR-Tools)",
        version=ortools.__version__,
        wall_s=wall,
        native_status=native,
    )


if __name__ == "__main__":
    child_main(solve_here)
