"""Exact results: a certificate of what a solve proves about its plan (docs/costmodel.md
section 8). The statuses, the gap, the aggregation of per-split certificates over a
hierarchy, and the plan-or-error rule live here; :mod:`parplan.solvers.exact` produces them.

Example:
    >>> gap(2.0, 1.5), gap(2.0, None), Status.OPTIMAL == "optimal"
    (0.25, None, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Mapping

from parplan.costmodel.evaluate import Evaluation, price_of
from parplan.costmodel.problem import Plan
from parplan.costmodel.split import PlanOptions
from parplan.errors import InfeasibleError, SolverError
from parplan.solvers.backends.base import RawResult, Termination

#: Relative gap under which a proven result is called optimal.
GAP_TOL = 1e-6


class Status(StrEnum):
    """What a certificate says of its plan (docs/costmodel.md section 8). A ``StrEnum``: it
    compares equal to, prints and serialises as its value ("optimal", ...)."""

    OPTIMAL = "optimal"  # proven within GAP_TOL, re-priced and memory re-checked
    FEASIBLE = "feasible"  # a checked plan, without a proof of optimality
    TIME_LIMIT = "time_limit"  # stopped by the time limit; the incumbent and its gap are kept
    INFEASIBLE = "infeasible"  # proven: no plan satisfies the constraints
    ERROR = "error"  # the solver failed, or its plan did not pass the re-check


@dataclass(frozen=True)
class Certificate:
    """What an exact solve proves about its plan (see the module docstring for the statuses).

    ``objective`` is the evaluator's price of the returned plan (seconds, or elements for the
    communication objective); ``model_objective`` the solver's objective in the same unit;
    ``bound`` a proven lower bound; ``gap`` = (objective - bound) / objective.
    """

    status: Status
    termination: Termination  # over several splits: OPTIMAL when every split's was, else MIXED
    has_solution: bool
    objective: float | None
    model_objective: float | None
    bound: float | None
    gap: float | None
    unit: str
    backend: str
    solver: str
    version: str
    wall_s: float
    scope: str = "split"
    path: str = ""
    failed_family: str | None = None
    message: str = ""
    notes: tuple[str, ...] = ()
    model_size: str = ""
    splits: Mapping[str, "Certificate"] = field(default_factory=dict)
    #: A proven lower bound on the objective with continuous shares (free shares, time
    #: objective, no memory limit; None otherwise). ``bound`` is for shares on the grid.
    continuous_bound: float | None = None
    #: The step of the best split found with continuous shares (re-priced by the cost model;
    #: :mod:`parplan.solvers.continuous`): the continuous optimum, within ``continuous_bound``.
    continuous_value: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "splits", MappingProxyType(dict(self.splits)))

    @property
    def is_optimal(self) -> bool:
        return self.status == Status.OPTIMAL

    def lines(self) -> list[str]:
        """Human-readable summary, one fact per line."""

        def fmt(x):
            if x is None:
                return "n/a"
            return f"{x * 1e3:.6f} ms" if self.unit == "s" else f"{x:.6g} {self.unit}"

        out = [
            f"status          {self.status} (solver termination: {self.termination}; scope: {self.scope})",
            f"objective       {fmt(self.objective)} (evaluator price of the plan)",
            f"model objective {fmt(self.model_objective)}",
            f"best bound      {fmt(self.bound)}",
            f"relative gap    {'n/a' if self.gap is None else f'{self.gap:.3e}'}",
            f"solver          {self.solver} {self.version} (backend '{self.backend}')",
            f"wall time       {self.wall_s:.3f} s",
        ]
        if self.model_size:
            out.append(f"model           {self.model_size}")
        if self.message:
            out.append(f"message         {self.message}")
        out += [f"note            {n}" for n in self.notes]
        if len(self.splits) > 1:
            for path, c in self.splits.items():
                out.append(
                    f"split {path or 'root':<9} {c.status:<10} gap {'n/a' if c.gap is None else f'{c.gap:.2e}'}"
                    f"  {c.wall_s:.2f} s"
                )
        return out

    def to_dict(self) -> dict:
        d = {
            k: getattr(self, k)
            for k in (
                "status",
                "termination",
                "has_solution",
                "objective",
                "model_objective",
                "bound",
                "gap",
                "unit",
                "backend",
                "solver",
                "version",
                "wall_s",
                "scope",
                "path",
                "failed_family",
                "message",
                "model_size",
                "continuous_bound",
                "continuous_value",
            )
        }
        d["notes"] = list(self.notes)
        d["splits"] = {p or "root": c.to_dict() for p, c in self.splits.items()}
        return d


@dataclass(frozen=True)
class ExactResult:
    """A plan (None if there is none), its certificate and its evaluation."""

    plan: Plan | None
    certificate: Certificate
    evaluation: Evaluation | None


def status_of(raw: RawResult, bound_valid: bool, gap: float | None, gap_tol: float) -> str:
    if raw.termination is Termination.INFEASIBLE:
        return Status.INFEASIBLE
    if raw.termination is Termination.TIME_LIMIT:
        return Status.TIME_LIMIT
    if raw.termination is Termination.ERROR or not raw.has_solution:
        return Status.ERROR
    if bound_valid and gap is not None and gap <= gap_tol:
        return Status.OPTIMAL
    return Status.FEASIBLE


def gap(objective: float | None, bound: float | None) -> float | None:
    if objective is None or bound is None:
        return None
    if objective == 0.0:
        return 0.0 if bound >= -1e-12 else math.inf
    return max(0.0, (objective - bound) / abs(objective))


def aggregate(
    problem,
    plan,
    ev,
    certs,
    failed: Certificate | None,
    wall: float,
    scope: str,
    options: PlanOptions,
) -> Certificate:
    """One certificate for a hierarchy from its splits' (``failed``: the split that stopped it)."""
    root = certs.get("") if failed is None else None
    first = failed or root or next(iter(certs.values()))
    notes: list[str] = []
    if failed is not None:
        status = (
            Status(failed.status)
            if failed.status in (Status.INFEASIBLE, Status.ERROR, Status.TIME_LIMIT)
            else Status.ERROR
        )
        where = (
            "the root split" if not certs else f"a split below the root (after {len(certs)} solved)"
        )
        return replace(
            failed,
            status=status,
            scope=scope,
            wall_s=wall,
            splits=certs,
            objective=None,
            gap=None,
            bound=None,
            notes=failed.notes + (f"no plan: {where} has {status} status",),
        )
    objective = price_of(ev, options)
    bound = root.bound if root is not None else None
    gap_ = gap(objective, bound)
    statuses = [c.status for c in certs.values()]
    one_level = problem.array.depth == 1
    if Status.TIME_LIMIT in statuses:
        status = Status.TIME_LIMIT
    elif all(s == Status.OPTIMAL for s in statuses) and gap_ is not None and gap_ <= GAP_TOL:
        status = Status.OPTIMAL
    else:
        status = Status.FEASIBLE
        if all(s == Status.OPTIMAL for s in statuses) and not one_level:
            notes.append(
                "every split is optimal given its parent's plan (level-by-level, as AccPar); the bound "
                "is the root split's, valid for every plan of the hierarchy"
            )
    if (
        one_level
        and root is not None
        and root.objective is not None
        and not math.isclose(root.objective, objective, rel_tol=1e-9, abs_tol=0.0)
    ):
        notes.append(f"split price {root.objective!r} differs from the evaluator's {objective!r}")
    notes.extend(n for c in certs.values() for n in c.notes if n not in notes)
    # what a split's solver said (a split too large for the exact model: how it was planned)
    said = [(p, c.message) for p, c in certs.items() if c.message]
    message = (
        said[0][1] if len(said) == 1 else "; ".join(f"split '{p or 'root'}': {m}" for p, m in said)
    )
    return Certificate(
        status=status,
        termination=first.termination
        if len(certs) == 1
        else (
            Termination.OPTIMAL
            if all(c.termination == Termination.OPTIMAL for c in certs.values())
            else Termination.MIXED
        ),
        has_solution=True,
        objective=objective,
        model_objective=root.model_objective if (root is not None and one_level) else None,
        bound=bound,
        gap=gap_,
        unit=first.unit,
        backend=first.backend,
        solver=first.solver,
        version=first.version,
        wall_s=wall,
        scope=scope if not one_level else "split",
        path="",
        notes=tuple(notes),
        message=message,
        model_size=first.model_size if len(certs) == 1 else f"{len(certs)} split models",
        splits=certs,
        continuous_bound=root.continuous_bound if (root is not None and one_level) else None,
        continuous_value=root.continuous_value if (root is not None and one_level) else None,
    )


def require_plan(result: ExactResult) -> Plan:
    """The plan of ``result``, or an error that says why there is none."""
    if result.plan is not None:
        return result.plan
    c = result.certificate
    if c.status == "infeasible":
        raise InfeasibleError(c.message or "the planning problem is infeasible")
    raise SolverError(
        f"backend '{c.backend}' found no plan ({c.status}): {c.message or c.termination}"
    )


__all__ = [
    "Certificate",
    "ExactResult",
    "GAP_TOL",
    "Status",
    "aggregate",
    "gap",
    "require_plan",
    "status_of",
]
