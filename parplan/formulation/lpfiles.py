"""CPLEX LP and free MPS files of a :class:`~parplan.formulation.mip.MipModel`, written without a
solver library (any MIP solver reads them: CBC, HiGHS, SCIP, Gurobi, CPLEX).

Names are the model's, with characters outside ``[A-Za-z0-9_.]`` replaced by ``_`` (and made
unique); the objective constant is an ``obj_constant`` variable fixed at 1 in LP files (the
format has no constants) and the objective row's right-hand side in MPS (negated, as MPS
readers expect).

Example:
    >>> from parplan.formulation.mip import ModelBuilder
    >>> b = ModelBuilder("tiny")
    >>> x, y = b.var("x", 0, 4, integer=True), b.var("y", 0, 1)
    >>> b.constraint("one_hot", "cover", [(x, 1.0), (y, 2.0)], ">=", 3.0)
    >>> b.objective(x, 1.0); b.objective(y, 1.5)
    >>> print(lp_text(b.build()), end="")
    \\* tiny *\\
    Minimize
     obj: + 1 x + 1.5 y
    Subject To
     cover: + 1 x + 2 y >= 3
    Bounds
     0 <= x <= 4
     0 <= y <= 1
    Generals
     x
    End
"""

from __future__ import annotations

import math
import re
from pathlib import Path

__all__ = ["lp_text", "mps_text", "write_lp", "write_mps"]

_SENSE_LP = {"<=": "<=", ">=": ">=", "==": "="}
_SENSE_MPS = {"<=": "L", ">=": "G", "==": "E"}


def _names(raw: list[str], prefix: str) -> list[str]:
    """Names valid in both formats (not starting with a digit, 'e' or 'E' in LP), unique."""
    out, seen = [], set()
    for i, name in enumerate(raw):
        name = re.sub(r"[^A-Za-z0-9_.]", "_", name) or f"{prefix}{i}"
        if name[0].isdigit() or name[0] in "eE.":
            name = f"{prefix}_{name}"
        base, k = name, 1
        while name in seen:
            name, k = f"{base}_{k}", k + 1
        seen.add(name)
        out.append(name)
    return out


def _num(x: float) -> str:
    if x == math.inf:
        return "+inf"
    if x == -math.inf:
        return "-inf"
    return (
        repr(float(x)).removesuffix(".0")
        if float(x).is_integer() and abs(x) < 1e15
        else repr(float(x))
    )


def _terms(pairs, names) -> str:
    parts = [f"{'-' if c < 0 else '+'} {_num(abs(c))} {names[i]}" for i, c in pairs if c != 0.0]
    return " ".join(parts) if parts else "0 obj_constant"


def lp_text(model) -> str:
    """The model in CPLEX LP format."""
    vn = _names([v.name for v in model.variables], "x")
    cn = _names([c.name for c in model.constraints], "c")
    lines = [f"\\* {model.name} *\\", "Minimize"]
    objective = _terms(model.objective, vn)
    if model.objective_constant:
        sign = "-" if model.objective_constant < 0 else "+"
        objective += f" {sign} {_num(abs(model.objective_constant))} obj_constant"
    lines.append(f" obj: {objective}")
    lines.append("Subject To")
    for c, name in zip(model.constraints, cn):
        lines.append(f" {name}: {_terms(c.coeffs, vn)} {_SENSE_LP[c.sense]} {_num(c.rhs)}")
    lines.append("Bounds")
    for v, name in zip(model.variables, vn):
        if v.lb == -math.inf and v.ub == math.inf:
            lines.append(f" {name} free")
        else:
            lines.append(f" {_num(v.lb)} <= {name} <= {_num(v.ub)}")
    if model.objective_constant:
        lines.append(" obj_constant = 1")
    generals = [name for v, name in zip(model.variables, vn) if v.integer]
    if generals:
        lines.append("Generals")
        lines += [f" {name}" for name in generals]
    lines.append("End")
    return "\n".join(lines) + "\n"


def mps_text(model) -> str:
    """The model in free MPS format (integer columns between MARKER lines)."""
    vn = _names([v.name for v in model.variables], "x")
    cn = _names([c.name for c in model.constraints], "c")
    columns: list[list[tuple[str, float]]] = [[] for _ in model.variables]
    for i, c in model.objective:
        if c != 0.0:
            columns[i].append(("obj", c))
    for c, name in zip(model.constraints, cn):
        for i, a in c.coeffs:
            if a != 0.0:
                columns[i].append((name, a))
    lines = [f"NAME {re.sub(r'[^A-Za-z0-9_.]', '_', model.name) or 'model'}", "ROWS", " N obj"]
    lines += [f" {_SENSE_MPS[c.sense]} {name}" for c, name in zip(model.constraints, cn)]
    lines.append("COLUMNS")
    integer = False
    for v, name, entries in zip(model.variables, vn, columns):
        if v.integer != integer:
            lines.append(" MARKER 'MARKER' 'INTORG'" if v.integer else " MARKER 'MARKER' 'INTEND'")
            integer = v.integer
        lines += [f" {name} {row} {_num(a)}" for row, a in entries] or [f" {name} obj 0"]
    if integer:
        lines.append(" MARKER 'MARKER' 'INTEND'")
    lines.append("RHS")
    if model.objective_constant:
        lines.append(f" RHS obj {_num(-model.objective_constant)}")
    lines += [
        f" RHS {name} {_num(c.rhs)}" for c, name in zip(model.constraints, cn) if c.rhs != 0.0
    ]
    lines.append("BOUNDS")
    for v, name in zip(model.variables, vn):
        if v.lb == -math.inf and v.ub == math.inf:
            lines.append(f" FR BND {name}")
            continue
        if v.lb == v.ub:
            lines.append(f" FX BND {name} {_num(v.lb)}")
            continue
        lines.append(f" MI BND {name}" if v.lb == -math.inf else f" LO BND {name} {_num(v.lb)}")
        if v.ub != math.inf:
            lines.append(f" UP BND {name} {_num(v.ub)}")
    lines.append("ENDATA")
    return "\n".join(lines) + "\n"


def write_lp(model, path: str | Path) -> Path:
    """Write ``model`` as a CPLEX LP file; returns the path."""
    path = Path(path)
    path.write_text(lp_text(model))
    return path


def write_mps(model, path: str | Path) -> Path:
    """Write ``model`` as a free MPS file; returns the path."""
    path = Path(path)
    path.write_text(mps_text(model))
    return path
