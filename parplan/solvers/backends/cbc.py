"""CBC through PuLP 3.x, reading the real status and bound from CBC's own log.

PuLP maps CBC's "Stopped on time - objective value X" to ``LpStatusOptimal`` (with
``sol_status`` = integer feasible) and never passes on the bound. This backend therefore sends
CBC's log to a file and reads its ``Result -`` line, ``Objective value:`` and ``Lower bound:``;
"optimal" needs both CBC's "Optimal solution found" and ``sol_status`` == optimal.

Example:
    >>> from parplan.formulation.mip import ModelBuilder
    >>> b = ModelBuilder("tiny"); x = b.var("x", 0, 3, True); b.objective(x, -1.0)
    >>> b.constraint("one_hot", "c", [(x, 2.0)], "<=", 5.0)
    >>> r = CbcBackend().solve(b.build(), SolveOptions())
    >>> r.termination.value, r.objective
    ('optimal', -2.0)
"""

from __future__ import annotations

import os
import re
import tempfile
import time

from parplan.errors import SolverError
from parplan.solvers.backends.base import RawResult, SolveOptions, Termination

#: CBC "Result - ..." line -> termination.
STATUS_MAP = {
    "Optimal solution found": Termination.OPTIMAL,
    "Stopped on time limit": Termination.TIME_LIMIT,
    "Problem proven infeasible": Termination.INFEASIBLE,
    "Linear relaxation infeasible": Termination.INFEASIBLE,
    "Integer infeasible": Termination.INFEASIBLE,
    "Stopped on iterations or time": Termination.TIME_LIMIT,
    "Stopped on nodes": Termination.ERROR,
    "Stopped on gap": Termination.ERROR,
    "Stopped on ctrl-c": Termination.ERROR,
    "Linear relaxation unbounded": Termination.ERROR,
}


def parse_cbc_log(text: str) -> dict:
    """Result line, objective, lower bound and version from a CBC log."""
    out: dict = {}
    m = re.search(r"^Result - (.+?)\s*$", text, re.M)
    out["result"] = m.group(1) if m else None
    m = re.search(r"^Objective value:\s+(\S+)", text, re.M)
    out["objective"] = float(m.group(1)) if m else None
    m = re.search(r"^Lower bound:\s+(\S+)", text, re.M)
    out["bound"] = float(m.group(1)) if m else None
    m = re.search(r"^Version:\s+(\S+)", text, re.M)
    out["version"] = m.group(1) if m else None
    out["presolve_infeasible"] = re.search(r"^Problem is infeasible", text, re.M) is not None
    out["no_solution"] = re.search(r"^No feasible solution found", text, re.M) is not None
    return out


class CbcBackend:
    """MIP with continuous variables via PuLP's bundled CBC."""

    name = "cbc"

    def solve(self, model, options: SolveOptions) -> RawResult:
        from parplan.formulation.mip import import_pulp

        pulp = import_pulp()

        prob, xs = model.to_pulp()
        fd, log_path = tempfile.mkstemp(prefix="parplan-cbc-", suffix=".log")
        os.close(fd)
        cmd = pulp.PULP_CBC_CMD(
            msg=False,
            timeLimit=options.time_limit_s,
            gapRel=options.mip_gap,
            threads=options.threads if options.threads > 1 else None,
            logPath=log_path,
            options=[f"randomCbcSeed {options.seed + 1}"],
        )
        t0 = time.perf_counter()
        try:
            prob.solve(cmd)
        except pulp.PulpSolverError as exc:
            raise SolverError(f"backend 'cbc': CBC failed ({exc})") from exc
        finally:
            wall = time.perf_counter() - t0
            with open(log_path) as f:
                text = f.read()
            os.unlink(log_path)
        log = parse_cbc_log(text)
        result = log["result"] or ""
        term = STATUS_MAP.get(result, Termination.ERROR)
        if not result and log["presolve_infeasible"] and prob.status == pulp.LpStatusInfeasible:
            term = Termination.INFEASIBLE  # presolve proved it before branch and bound started
        if term is Termination.OPTIMAL and prob.sol_status != pulp.LpSolutionOptimal:
            term = Termination.ERROR  # CBC and its solution file disagree: claim nothing
        has = (
            term in (Termination.OPTIMAL, Termination.TIME_LIMIT)
            and log["objective"] is not None
            and not log["no_solution"]
            and prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
        )
        values = tuple(float(x.varValue) if x.varValue is not None else 0.0 for x in xs) if has else None
        objective = model.objective_value(values) if has else None
        if term is Termination.OPTIMAL:
            # CBC stops when (objective - bound) <= mip_gap * |objective| (ratio gap we set)
            bound = objective - options.mip_gap * abs(objective) if has else None
        else:
            bound = log["bound"]
        return RawResult(
            termination=term,
            has_solution=has,
            values=values,
            objective=objective,
            bound=bound,
            solver="CBC (PuLP)",
            version=log["version"] or f"bundled with PuLP {pulp.__version__}",
            wall_s=wall,
            native_status=f"{result or 'no result line'}; pulp status {prob.status}, sol_status {prob.sol_status}",
        )
