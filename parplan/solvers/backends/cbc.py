"""CBC through PuLP 3.x, reading the real status and bound from CBC's own log.

PuLP maps CBC's "Stopped on time - objective value X" to ``LpStatusOptimal`` (with
``sol_status`` = integer feasible) and never passes on the bound. This backend therefore sends
CBC's log to a file and reads its ``Result -`` line, ``Objective value:`` and ``Lower bound:``;
"optimal" needs both CBC's "Optimal solution found" and ``sol_status`` == optimal.

The bound is what CBC's log proves, never a figure derived from the gap we asked for
(docs/costmodel.md section 8):

- stopped early, or exited on the gap: CBC's ``Lower bound:`` line;
- exited on the gap without that line (``Cbc0011I Exiting as integer gap of G``): best
  objective - G;
- tree search completed (``Cbc0001I Search completed - best objective V``): every pruned node's
  relaxation was >= V - c, with c CBC's cutoff increment (1e-5 unless the log says it changed),
  so V - c. When CBC raised c because every objective value is a multiple of some m > c, no
  value lies in (V - m, V) and the bound is V itself;
- preprocessing left no integer variables (``Cbc3007W``): the LP optimum, i.e. the objective;
- otherwise the root relaxation (``Continuous objective value is X``), or none.

Printed figures are rounded down by half a unit of their last printed digit.

Example:
    >>> from parplan.formulation.mip import ModelBuilder
    >>> b = ModelBuilder("tiny"); x = b.var("x", 0, 3, True); b.objective(x, -1.0)
    >>> b.constraint("one_hot", "c", [(x, 2.0)], "<=", 5.0)
    >>> r = CbcBackend().solve(b.build(), SolveOptions())
    >>> r.termination.value, r.objective
    ('optimal', -2.0)
"""

from __future__ import annotations

import math
import os
import re
import sys
import tempfile
import time

from parplan.errors import SolverError
from parplan.solvers.backends.base import RawResult, SolveOptions, Termination

#: CBC "Result - ..." line -> termination.
STATUS_MAP = {
    "Optimal solution found": Termination.OPTIMAL,
    "Optimal solution found (within gap tolerance)": Termination.OPTIMAL,
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


#: CBC's default cutoff increment (CbcModel's CbcCutoffIncrement): a new incumbent must beat
#: the last by more than this, so a completed search leaves at most this much unexplored.
DEFAULT_CUTOFF_INCREMENT = 1e-5


def optimal_bound(log: dict) -> float | None:
    """The lower bound an "Optimal solution found" log proves (see the module docstring)."""
    best = log["completed_best"]
    if log["bound"] is not None:
        return log["bound"]
    if log["gap_exit"] is not None:
        ref = best if best is not None else log["objective_floor"]
        return None if ref is None else ref - log["gap_exit"]
    if best is not None:
        return best if log["integral_objective"] else best - log["cutoff_increment"]
    if log["no_integers"] and log["objective_floor"] is not None:
        return log["objective_floor"]  # preprocessing left an LP, solved to optimality by CLP
    return log["relaxation"]


def _rounded_down(text: str) -> float:
    """A printed figure made safe as a lower bound: less half a unit of its last printed digit."""
    value = float(text)
    if "e" in text.lower():
        return value - abs(value) * 5e-6  # exponent form: CBC prints at least 6 significant digits
    digits = len(text.split(".", 1)[1]) if "." in text else 0
    return value - 0.5 * 10.0**-digits


def parse_cbc_log(text: str) -> dict:
    """Result line, objective, proven-bound evidence and version from a CBC log (minimisation;
    figures without the model's objective constant)."""
    out: dict = {}
    m = re.search(r"^Result - (.+?)\s*$", text, re.M)
    out["result"] = m.group(1) if m else None
    m = re.search(r"^Objective value:\s+(\S+)", text, re.M)
    out["objective"] = float(m.group(1)) if m else None
    out["objective_floor"] = _rounded_down(m.group(1)) if m else None
    m = re.search(r"^Lower bound:\s+(\S+)", text, re.M)
    out["bound"] = _rounded_down(m.group(1)) if m else None
    m = re.search(r"^Cbc0001I Search completed - best objective (\S+?),", text, re.M)
    out["completed_best"] = float(m.group(1)) if m else None
    m = re.search(r"^Cbc0011I Exiting as integer gap of (\S+)", text, re.M)
    out["gap_exit"] = -_rounded_down("-" + m.group(1)) if m else None
    m = re.search(r"^Cutoff increment increased from \S+ to (\S+)", text, re.M)
    out["cutoff_increment"] = float(m.group(1)) if m else DEFAULT_CUTOFF_INCREMENT
    out["integral_objective"] = m is not None
    m = re.search(r"^Continuous objective value is (\S+)", text, re.M)
    out["relaxation"] = _rounded_down(m.group(1)) if m else None
    out["no_integers"] = re.search(r"^Cbc3007W No integer variables", text, re.M) is not None
    m = re.search(r"^Version:\s+(\S+)", text, re.M)
    out["version"] = m.group(1) if m else None
    out["presolve_infeasible"] = re.search(r"^Problem is infeasible", text, re.M) is not None
    out["no_solution"] = re.search(r"^No feasible solution found", text, re.M) is not None
    return out


def import_pulp():
    """Import PuLP without letting it load highspy into this process.

    PuLP 3 imports highspy at import time when it is installed; highspy's ``libhighs.so.1``
    then shadows OR-Tools' (same soname), and OR-Tools' solvers cannot load in this process
    any more. parplan never uses PuLP's HiGHS interface (its HiGHS backend is highspy in a child
    process), so it hides highspy while PuLP imports.
    """
    if "pulp" in sys.modules:
        return sys.modules["pulp"]
    hide = "highspy" not in sys.modules
    if hide:
        sys.modules["highspy"] = None  # makes `import highspy` raise ImportError inside PuLP
    try:
        import pulp
    finally:
        if hide:
            del sys.modules["highspy"]
    return pulp


def to_pulp(model):
    """(pulp.LpProblem, [pulp.LpVariable]) of a :class:`~parplan.formulation.mip.MipModel`:
    the bridge this backend solves through (the model itself stays solver-neutral)."""
    pulp = import_pulp()
    xs = []
    for v in model.variables:
        cat = "Continuous"
        if v.integer:
            cat = "Binary" if (v.lb, v.ub) == (0.0, 1.0) else "Integer"
        lb = None if v.lb == -math.inf else v.lb
        ub = None if v.ub == math.inf else v.ub
        xs.append(pulp.LpVariable(v.name, lowBound=lb, upBound=ub, cat=cat))
    prob = pulp.LpProblem(
        "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in model.name) or "model",
        pulp.LpMinimize,
    )
    prob.setObjective(
        pulp.LpAffineExpression(
            [(xs[i], c) for i, c in model.objective], constant=model.objective_constant
        )
    )
    sense = {"<=": pulp.LpConstraintLE, ">=": pulp.LpConstraintGE, "==": pulp.LpConstraintEQ}
    for c in model.constraints:
        expr = pulp.LpAffineExpression([(xs[i], a) for i, a in c.coeffs])
        prob.addConstraint(pulp.LpConstraint(expr, sense[c.sense], name=c.name, rhs=c.rhs))
    return prob, xs


class CbcBackend:
    """MIP with continuous variables via PuLP's bundled CBC."""

    name = "cbc"

    def solve(self, model, options: SolveOptions) -> RawResult:
        pulp = import_pulp()

        prob, xs = to_pulp(model)
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
        if options.verbose:  # CBC writes its log to the file parplan reads its bound from
            sys.stderr.write(text)
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
        values = (
            tuple(float(x.varValue) if x.varValue is not None else 0.0 for x in xs) if has else None
        )
        objective = model.objective_value(values) if has else None
        bound = optimal_bound(log) if term is Termination.OPTIMAL else log["bound"]
        if bound is not None:
            bound += model.objective_constant  # CBC's log leaves out the objective's constant
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
            message=""
            if term is not Termination.ERROR
            else (
                f"CBC ended with '{result or 'no result line in its log'}' (PuLP status {prob.status}, solution "
                f"status {prob.sol_status}); no plan is certified"
            ),
        )
