"""HiGHS through ``highspy`` directly (its MIP dual bound and model status).

highspy and OR-Tools each ship a ``libhighs.so.1`` (same soname, different versions): once one
is loaded in a process the other fails to import ("undefined symbol"). This backend therefore
always solves in a fresh child interpreter (``python -m parplan.solvers.backends.highs``, model
and options pickled through stdin/stdout), so SCIP / CP-SAT and HiGHS work in one session.
The reported wall time is the child's solve time; start-up adds about half a second.

Example:
    >>> from parplan.formulation.mip import ModelBuilder
    >>> b = ModelBuilder("tiny"); x = b.var("x", 0, 3, True); b.objective(x, -1.0)
    >>> b.constraint("one_hot", "c", [(x, 2.0)], "<=", 5.0)
    >>> r = HighsBackend().solve(b.build(), SolveOptions())
    >>> r.termination.value, r.objective, r.bound
    ('optimal', -2.0, -2.0)
"""

from __future__ import annotations

import math
import time

import numpy as np

from parplan.solvers.backends.base import (
    RawResult,
    SolveOptions,
    Termination,
    child_main,
    solve_in_subprocess,
)

#: HighsModelStatus name -> termination.
STATUS_MAP = {
    "kOptimal": Termination.OPTIMAL,
    "kInfeasible": Termination.INFEASIBLE,
    "kTimeLimit": Termination.TIME_LIMIT,
    "kUnboundedOrInfeasible": Termination.ERROR,
    "kUnbounded": Termination.ERROR,
    "kIterationLimit": Termination.ERROR,
    "kSolutionLimit": Termination.ERROR,
    "kInterrupt": Termination.ERROR,
    "kMemoryLimit": Termination.ERROR,
    "kModelEmpty": Termination.OPTIMAL,
}


class HighsBackend:
    """MIP with continuous variables via highspy."""

    name = "highs"

    def solve(self, model, options: SolveOptions) -> RawResult:
        return solve_in_subprocess("parplan.solvers.backends.highs", model, options)


def solve_here(model, options: SolveOptions) -> RawResult:
    """Solve with highspy in this process (do not call where OR-Tools' solvers are loaded)."""
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", bool(options.verbose))
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    n = len(model.variables)
    lp.num_col_ = n
    lp.num_row_ = len(model.constraints)
    cost = np.zeros(n)
    for i, a in model.objective:
        cost[i] += a
    lp.col_cost_ = cost
    lp.col_lower_ = np.array([-inf if v.lb == -math.inf else v.lb for v in model.variables])
    lp.col_upper_ = np.array([inf if v.ub == math.inf else v.ub for v in model.variables])
    lp.offset_ = model.objective_constant
    lower, upper, starts, index, value = [], [], [0], [], []
    for c in model.constraints:
        lower.append(c.rhs if c.sense in (">=", "==") else -inf)
        upper.append(c.rhs if c.sense in ("<=", "==") else inf)
        for i, a in c.coeffs:
            index.append(i)
            value.append(a)
        starts.append(len(index))
    lp.row_lower_ = np.array(lower, dtype=float)
    lp.row_upper_ = np.array(upper, dtype=float)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(value, dtype=float)
    lp.integrality_ = [
        highspy.HighsVarType.kInteger if v.integer else highspy.HighsVarType.kContinuous
        for v in model.variables
    ]
    h.passModel(lp)
    if options.time_limit_s is not None:
        h.setOptionValue("time_limit", float(options.time_limit_s))
    h.setOptionValue("mip_rel_gap", float(options.mip_gap))
    h.setOptionValue("random_seed", int(options.seed))
    t0 = time.perf_counter()
    h.run()
    wall = time.perf_counter() - t0
    status = h.getModelStatus()
    native = h.modelStatusToString(status)
    key = str(status).split(".")[-1]
    term = STATUS_MAP.get(key, Termination.ERROR)
    info = h.getInfo()
    has = info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
    values = tuple(float(x) for x in h.getSolution().col_value) if has else None
    bound = info.mip_dual_bound if (has or term is Termination.TIME_LIMIT) else None
    if bound is not None and not math.isfinite(bound):
        bound = None
    return RawResult(
        termination=term,
        has_solution=has,
        values=values,
        objective=info.objective_function_value if has else None,
        bound=bound,
        solver="HiGHS (highspy)",
        version=f"{h.versionMajor()}.{h.versionMinor()}.{h.versionPatch()}",
        wall_s=wall,
        native_status=native,
    )


if __name__ == "__main__":
    child_main(solve_here)
