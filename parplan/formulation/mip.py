"""The exact MIP of one split, as a solver-neutral model (SPEC sections 4 and 6).

:class:`MipModel` is plain data: variables (bounds, integrality, names), linear constraints
(each with a name and a *family*: ``one_hot``, ``edge_link``, ``share_link``, ``segment``,
``epigraph``, ``memory``) and a linear objective. Any backend of
:mod:`parplan.solvers.backends` solves it; :meth:`MipModel.write_lp` / :meth:`MipModel.write_mps`
write it without solving. :func:`build_mip` builds the model of a
:class:`~parplan.solvers.dp.SplitProblem` and a decoder that turns a solution back into a
:class:`~parplan.costmodel.problem.Split`. Every cost coefficient comes from
:mod:`parplan.costmodel.cost`; nothing is re-derived here.

Formulation of one split (node ``v``, choice ``c``, predecessors ``u``):

- ``x[v,c]`` binary, one-hot per node (family ``one_hot``).
- Configuration ``k = (choices of v's predecessors, choice of v)``: ``z[v,k]`` in [0, 1] linked
  to the node variables by marginals (``edge_link``): the ``z`` with own choice ``c`` sum to
  ``x[v,c]``, and for every predecessor ``u`` and its choice ``c_u`` the ``z`` whose entry for
  ``u`` is ``c_u`` sum to ``x[u,c_u]``. With binary ``x`` this forces ``z`` to the product of the
  ``x`` (for one predecessor it is the edge variable of the (producer type, consumer type)
  pair; for joins it couples all inputs); no product of variables is left. A node without
  predecessors uses ``x`` as its ``z``.
- Shares: for every configuration, the candidate shares ``S_k`` of
  :func:`~parplan.costmodel.cost.share_candidates` (the per-configuration optimum lies there),
  refined by a uniform grid of ``share_grid`` intervals where that tightens the model (below).
  Variables ``u[v,k,s] >= 0`` with ``sum_s u = z[v,k]`` (``share_link``): the disaggregated
  convex hull of "binary times share", i.e. the exact McCormick envelope of ``z * a`` with the
  share's true bounds [0, 1] and no big-M. The share is ``a_v = sum_{k,s} s * u``.
- Time (SPEC 4): node ``v`` costs ``sum_{k,s} u[v,k,s] * max(T_1, T_2)(k, s)`` where
  ``T_i(k, s)`` comes from :func:`~parplan.costmodel.cost.side_times` (compute + latency +
  bytes * comm_i(s) / BW). Taking the max per candidate (``max_form="folded"``, the default)
  is tighter than an epigraph over mixtures. ``max_form="epigraph"`` builds the textbook form
  instead: ``tau_v >= T_1v(u)``, ``tau_v >= T_2v(u)`` (family ``epigraph``) with segment binaries
  (below) wherever the time has a quadratic term. Both are exact without a memory limit.
- Why it is exact: ``max(T_1, T_2) = k*q*a(1-a) + max(lin_1, lin_2)`` with ``q >= 0`` equal on
  both sides (:mod:`parplan.costmodel.layout`), so on each side of the balance point it is
  concave (linear when ``q = 0``). With the objective linear in ``u``, the solver puts each
  active configuration's mass on one candidate, the true optimum. An *epigraph over mixtures
  of candidates* is not exact when ``q > 0``: mixing ``a = 0`` and ``a = 1`` reaches the
  balance value of the linear parts without paying ``q*a(1-a)``; hence the segment binaries
  in that form.
- Memory (family ``memory``, optional): per side ``sum_v node_memory_i(c_v, a_v) * bytes <=
  capacity`` (node memory is linear in ``a``). A side's capacity is the sum of its devices'
  memory: exact when the side is one device, a necessary condition above (the devices of a
  group together hold at least what the group holds as one device). With a memory limit the
  share may have to stop between candidates; there the time is concave, so the model uses
  segment binaries ``w`` (family ``segment``, one per interval between consecutive points of
  ``S_k`` plus the grid; DCC formulation, locally ideal) and the chord under-estimates the
  time: the model is then a relaxation whose bound is valid and whose gap shrinks with
  ``share_grid``. The decoded plan is always re-priced by the evaluator.
- Floors (splits below the root, :class:`~parplan.solvers.dp.SplitProblem` ``floor_s``): a
  node's cost is ``max(T_1, T_2, floor)`` per point; where shares may stop between points the
  shares at which the time crosses the floor become points too. Collective arrays: the terms
  come from :func:`~parplan.costmodel.cost.node_terms` (all-reduce time included).
- Communication objective (HyPar's): fixed share, cost ``sum_k z[v,k] * (e_1 + e_2)(a)``
  elements.
- ``discrete=True`` builds the integer model for CP-SAT: shares restricted to ``S_k`` plus the
  grid, one binary per (configuration, share), objective coefficients rounded to integers at
  a scale where the total is about 1e9 units (error <= 0.5 unit per node, stated in
  :attr:`MipModel.objective_error`), memory coefficients rounded up and capacities down
  (conservative). Without a memory limit it is exact up to that rounding.

Times are in model units (``objective_scale`` units per second, chosen so the ideal compute
time of the split is about 1000 units) to keep solver tolerances meaningful.

Example:
    >>> from parplan.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.solvers.dp import PlanOptions, SplitProblem
    >>> sp = SplitProblem.root(Problem(get_model("lenet"), parse_array("tpu-v2:1,tpu-v3:1"), batch=64))
    >>> model, decode = build_mip(sp, PlanOptions())
    >>> sorted(model.families())
    ['edge_link', 'one_hot', 'share_link']
    >>> model.n_integer == 3 * len(sp.planning.nodes)
    True
"""

from __future__ import annotations

import itertools
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Iterable, Mapping, Sequence

from parplan.costmodel.cost import (
    FLOOR_TIE_WEIGHT,
    Objective,
    ShareMode,
    floored_time,
    node_comm,
    node_memory,
    node_terms,
    share_candidates,
    side_times,
)
from parplan.costmodel.layout import Choice, ShareExpr
from parplan.costmodel.problem import Split
from parplan.errors import ConfigError

GIB = float(2**30)
SENSES = ("<=", ">=", "==")
FAMILIES = ("one_hot", "edge_link", "share_link", "segment", "epigraph", "memory")
#: Shares closer than this to a model point are snapped onto it when decoding.
SNAP_TOL = 1e-7
#: Units of the time objective for the ideal compute time of a split (continuous model).
TIME_UNITS = 1e3
#: Units of the objective for the integer (CP-SAT) model.
INTEGER_UNITS = 1e9


# ----------------------------------------------------------------------------------------------
# The solver-neutral model
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variable:
    """A model variable: name, bounds, integrality."""

    name: str
    lb: float
    ub: float
    integer: bool = False


@dataclass(frozen=True)
class Constraint:
    """``sum(coef * var) sense rhs``; ``coeffs`` pairs (variable index, coefficient)."""

    name: str
    family: str
    coeffs: tuple[tuple[int, float], ...]
    sense: str
    rhs: float


@dataclass(frozen=True)
class MipModel:
    """A minimisation MIP as plain data (solver-neutral).

    ``objective_scale``: model units per ``objective_unit`` ("s" or "elements").
    ``objective_error``: bound on |model objective - true objective| at any solution, in model
    units (rounding of the integer model; 0 otherwise). ``exact``: the model's optimum is the
    true optimum of the problem it encodes (False for relaxations, e.g. with memory limits).
    """

    name: str
    variables: tuple[Variable, ...]
    constraints: tuple[Constraint, ...]
    objective: tuple[tuple[int, float], ...]
    objective_constant: float = 0.0
    objective_unit: str = "s"
    objective_scale: float = 1.0
    objective_error: float = 0.0
    exact: bool = True
    notes: tuple[str, ...] = ()

    @property
    def n_vars(self) -> int:
        return len(self.variables)

    @property
    def n_integer(self) -> int:
        return sum(v.integer for v in self.variables)

    @property
    def n_constraints(self) -> int:
        return len(self.constraints)

    def families(self) -> Mapping[str, int]:
        """Number of constraints per family."""
        out: dict[str, int] = {}
        for c in self.constraints:
            out[c.family] = out.get(c.family, 0) + 1
        return MappingProxyType(out)

    def describe(self) -> str:
        fams = ", ".join(f"{k} {n}" for k, n in self.families().items())
        return (f"{self.n_vars} variables ({self.n_integer} integer), {self.n_constraints} constraints "
                f"({fams})")

    def without(self, *families: str) -> "MipModel":
        """The model with every constraint of ``families`` removed (for infeasibility diagnosis)."""
        unknown = set(families) - set(FAMILIES)
        if unknown:
            raise ConfigError(f"unknown constraint families {sorted(unknown)}; valid: {list(FAMILIES)}")
        return replace(self, constraints=tuple(c for c in self.constraints if c.family not in families))

    @property
    def is_integral(self) -> bool:
        """All variables integer with integer bounds, all coefficients integers (CP-SAT's input)."""
        def whole(x: float) -> bool:
            return math.isfinite(x) and abs(x - round(x)) <= 1e-9 * max(1.0, abs(x))

        return (
            all(v.integer and whole(v.lb) and whole(v.ub) for v in self.variables)
            and all(whole(c) for _, c in self.objective)
            and all(whole(c.rhs) and all(whole(a) for _, a in c.coeffs) for c in self.constraints)
        )

    def objective_value(self, values: Sequence[float]) -> float:
        return self.objective_constant + sum(c * values[i] for i, c in self.objective)

    def violations(self, values: Sequence[float]) -> Mapping[str, float]:
        """Largest violation per constraint family (and ``bounds``/``integrality``) at ``values``."""
        out: dict[str, float] = {"bounds": 0.0, "integrality": 0.0}
        for v, x in zip(self.variables, values):
            out["bounds"] = max(out["bounds"], v.lb - x, x - v.ub)
            if v.integer:
                out["integrality"] = max(out["integrality"], abs(x - round(x)))
        for c in self.constraints:
            lhs = sum(a * values[i] for i, a in c.coeffs)
            viol = {"<=": lhs - c.rhs, ">=": c.rhs - lhs, "==": abs(lhs - c.rhs)}[c.sense]
            out[c.family] = max(out.get(c.family, 0.0), viol)
        return MappingProxyType(out)

    def to_pulp(self):
        """(pulp.LpProblem, [pulp.LpVariable]) of this model (used for .lp/.mps and CBC)."""
        pulp = import_pulp()

        xs = []
        for v in self.variables:
            cat = "Continuous"
            if v.integer:
                cat = "Binary" if (v.lb, v.ub) == (0.0, 1.0) else "Integer"
            lb = None if v.lb == -math.inf else v.lb
            ub = None if v.ub == math.inf else v.ub
            xs.append(pulp.LpVariable(v.name, lowBound=lb, upBound=ub, cat=cat))
        prob = pulp.LpProblem(_safe(self.name), pulp.LpMinimize)
        prob.setObjective(pulp.LpAffineExpression([(xs[i], c) for i, c in self.objective],
                                                  constant=self.objective_constant))
        sense = {"<=": pulp.LpConstraintLE, ">=": pulp.LpConstraintGE, "==": pulp.LpConstraintEQ}
        for c in self.constraints:
            expr = pulp.LpAffineExpression([(xs[i], a) for i, a in c.coeffs])
            prob.addConstraint(pulp.LpConstraint(expr, sense[c.sense], name=c.name, rhs=c.rhs))
        return prob, xs

    def write_lp(self, path: str | Path) -> Path:
        """Write the model in CPLEX LP format (through PuLP); returns the path."""
        prob, _ = self.to_pulp()
        prob.writeLP(str(path))
        return Path(path)

    def write_mps(self, path: str | Path) -> Path:
        """Write the model in MPS format (through PuLP, original names kept); returns the path."""
        prob, _ = self.to_pulp()
        prob.writeMPS(str(path))
        return Path(path)


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


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name) or "model"


class ModelBuilder:
    """Accumulates variables, constraints and objective terms, then freezes a :class:`MipModel`."""

    def __init__(self, name: str):
        self.name = name
        self._vars: list[Variable] = []
        self._names: set[str] = set()
        self._cons: list[Constraint] = []
        self._obj: dict[int, float] = {}

    def var(self, name: str, lb: float = 0.0, ub: float = 1.0, integer: bool = False) -> int:
        name = _safe(name)
        if name in self._names:
            raise ValueError(f"duplicate variable name '{name}'")
        if lb > ub:
            raise ValueError(f"variable '{name}': lower bound {lb} > upper bound {ub}")
        self._names.add(name)
        self._vars.append(Variable(name, float(lb), float(ub), integer))
        return len(self._vars) - 1

    def constraint(self, family: str, name: str, terms: Iterable[tuple[int, float]], sense: str, rhs: float) -> None:
        if family not in FAMILIES:
            raise ValueError(f"unknown constraint family '{family}'")
        if sense not in SENSES:
            raise ValueError(f"unknown sense '{sense}'")
        merged: dict[int, float] = {}
        for i, a in terms:
            merged[i] = merged.get(i, 0.0) + a
        coeffs = tuple((i, a) for i, a in merged.items() if a != 0.0)
        self._cons.append(Constraint(_safe(name), family, coeffs, sense, float(rhs)))

    def objective(self, index: int, coef: float) -> None:
        self._obj[index] = self._obj.get(index, 0.0) + coef

    def build(self, **meta) -> MipModel:
        obj = tuple((i, c) for i, c in self._obj.items() if c != 0.0)
        return MipModel(self.name, tuple(self._vars), tuple(self._cons), obj, **meta)


# ----------------------------------------------------------------------------------------------
# The split formulation
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryLimit:
    """Memory capacity of the two sides of a split, bytes (a side's = sum of its devices').

    ``per_device``: each side is a single device, so the constraint is exact; otherwise it is
    a necessary condition (see the module docstring).
    """

    capacity_bytes: tuple[float, float]
    per_device: bool = True

    def __post_init__(self):
        for c in self.capacity_bytes:
            if not c > 0:
                raise ConfigError(f"memory capacity must be > 0 bytes (got {c})")


@dataclass(frozen=True)
class ConfigVars:
    """Variables of one configuration of a node: its indicator and, per share point, the
    variables whose sum is the mass at that point."""

    pred_choices: tuple[Choice, ...]
    choice: Choice
    indicator: int
    points: tuple[float, ...]
    mass: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class NodeVars:
    x: Mapping[Choice, int]
    configs: tuple[ConfigVars, ...]


@dataclass(frozen=True)
class SplitDecoder:
    """Turns a solution (an object with ``.values`` or a sequence, model order) into a Split."""

    nodes: tuple[NodeVars, ...]

    def __call__(self, raw) -> Split:
        values = getattr(raw, "values", raw)
        if values is None:
            raise ConfigError("cannot decode a result without a solution")
        choices, shares = [], []
        for nv in self.nodes:
            choice = max(nv.x, key=lambda c: values[nv.x[c]])
            configs = [k for k in nv.configs if k.choice == choice]
            k = max(configs, key=lambda k: values[k.indicator])
            masses = [sum(values[i] for i in m) for m in k.mass]
            total = sum(masses)
            a = sum(s * m for s, m in zip(k.points, masses)) / total if total > 0 else k.points[0]
            near = min(k.points, key=lambda s: abs(s - a))
            a = near if abs(near - a) <= SNAP_TOL else a
            choices.append(choice)
            shares.append(min(1.0, max(0.0, a)))
        return Split(tuple(choices), tuple(shares))


def share_grid_points(share_grid: int) -> tuple[float, ...]:
    """{0, 1/G, ..., 1} for ``share_grid`` G >= 1; () for 0."""
    if share_grid < 0:
        raise ConfigError(f"share_grid must be >= 0 (got {share_grid})")
    return tuple(j / share_grid for j in range(share_grid + 1)) if share_grid else ()


def _merge_points(*groups: Iterable[float]) -> tuple[float, ...]:
    out: list[float] = []
    for s in sorted(p for g in groups for p in g):
        if not out or s - out[-1] > 1e-12:
            out.append(s)
    return tuple(out)


@dataclass(frozen=True)
class _Config:
    pred_choices: tuple[Choice, ...]
    choice: Choice
    e1: ShareExpr
    e2: ShareExpr
    exchanges: bool
    extra_s: float  # share-independent time on both sides (an all-reduce on collective arrays)


def node_configs(sp, v: int, options) -> list[_Config]:
    """Every (predecessor choices, own choice) of node ``v`` allowed by ``options``, with its
    communication terms from :func:`~parplan.costmodel.cost.node_terms` (or
    :func:`~parplan.costmodel.cost.node_comm` for the communication objective, as node_cost)."""
    node = sp.planning.nodes[v]
    covered = bool(sp.covered[v]) if getattr(sp, "covered", None) is not None else False
    pred_sets = [options.choices(sp.planning.nodes[u]) for u in node.preds]
    out = []
    for pc in itertools.product(*pred_sets):
        for c in options.choices(node):
            if options.objective is Objective.COMMUNICATION:
                e1, e2 = node_comm(sp.dims[v], c, tuple(pc), node.fractions)
                out.append(_Config(tuple(pc), c, e1, e2, True, 0.0))
            else:
                e1, e2, ex, extra = node_terms(sp.dims[v], c, tuple(pc), node.fractions, sp.side, covered)
                out.append(_Config(tuple(pc), c, e1, e2, ex, extra))
    return out


def _node_time(sp, v: int, cfg: _Config, a: float) -> tuple[float, float]:
    """(T_1, T_2) of node ``v`` in configuration ``cfg`` at share ``a``, seconds."""
    return side_times(sp.dims[v].flops, cfg.e1, cfg.e2, cfg.exchanges, sp.side, a, cfg.extra_s)


def floor_crossings(f, lo: float, hi: float, floor: float, concave: bool) -> tuple[float, ...]:
    """Shares in (lo, hi) where ``f`` (linear, or concave if ``concave``) equals ``floor``."""
    def root(a: float, b: float) -> float | None:
        fa, fb = f(a) - floor, f(b) - floor
        if fa == 0.0 or fb == 0.0 or (fa > 0) == (fb > 0):
            return None
        for _ in range(80):
            m = 0.5 * (a + b)
            if (f(m) - floor > 0) == (fa > 0):
                a = m
            else:
                b = m
        return 0.5 * (a + b)

    if not concave:
        r = root(lo, hi)
        return () if r is None else (r,)
    a, b = lo, hi  # the maximiser of a concave function by golden-section search
    for _ in range(100):
        m1, m2 = a + (b - a) * 0.382, a + (b - a) * 0.618
        if f(m1) < f(m2):
            a = m1
        else:
            b = m2
    m = 0.5 * (a + b)
    return tuple(r for r in (root(lo, m), root(m, hi)) if r is not None and lo < r < hi)


def _time_scale(sp) -> float:
    c1, c2 = sp.side.flops_per_s
    ref = sum(d.flops for d in sp.dims) / (c1 + c2)
    if not ref > 0:
        ref = 1e-6 * max(1, len(sp.dims))
    return 1.0 / ref


def _elements_scale(sp) -> float:
    ref = sum(d.in_elements + d.weight_elements for d in sp.dims)
    return 1.0 / ref if ref > 0 else 1.0


@dataclass(frozen=True)
class _Node:
    """Per-node data the builder needs: its configurations with points and per-point values."""

    configs: tuple[_Config, ...]
    points: tuple[tuple[float, ...], ...]
    values: tuple[tuple[float, ...], ...]  # objective per point, objective units
    sides: tuple[tuple[tuple[float, float], ...], ...]  # (T_1, T_2) per point (time) or ()
    segmented: tuple[bool, ...]
    floor: float = 0.0  # objective units


def build_mip(
    sp,
    options=None,
    memory: MemoryLimit | None = None,
    share_grid: int = 0,
    discrete: bool = False,
    max_form: str = "folded",
) -> tuple[MipModel, SplitDecoder]:
    """The MIP of split ``sp`` (a :class:`~parplan.solvers.dp.SplitProblem`) and its decoder.

    ``options``: a :class:`~parplan.solvers.dp.PlanOptions` (objective, share mode, allowed
    choices); ``memory``: per-side capacity; ``share_grid``: extra uniform share points
    (intervals) used where shares may stop between candidates (memory limits, integer model);
    ``discrete``: the integer model for CP-SAT; ``max_form``: "folded" or "epigraph".
    """
    from parplan.solvers.dp import PlanOptions  # solvers.dp holds the option type; no cycle at import

    options = PlanOptions() if options is None else options
    if max_form not in ("folded", "epigraph"):
        raise ConfigError(f"max_form must be 'folded' or 'epigraph' (got {max_form!r})")
    grid = share_grid_points(share_grid)
    time_obj = options.objective is Objective.TIME
    free = time_obj and options.shares is ShareMode.FREE
    fixed = None if free else sp.side.fixed_share(options.shares)
    scale = _time_scale(sp) * TIME_UNITS if time_obj else _elements_scale(sp) * TIME_UNITS
    if discrete:
        scale *= INTEGER_UNITS / TIME_UNITS
    epigraph = max_form == "epigraph" and free and not discrete
    nodes = _prepare(sp, options, free, fixed, scale, grid, discrete, memory is not None or epigraph)

    b = ModelBuilder(f"split_{sp.planning.name}_{sp.path or 'root'}")
    pg = sp.planning
    xs: list[dict[Choice, int]] = []
    for v, node in enumerate(pg.nodes):
        choices = options.choices(node)
        xv = {c: b.var(f"x_{v}_{c.value}", 0, 1, True) for c in choices}
        xs.append(xv)
        b.constraint("one_hot", f"one_hot_{v}", ((i, 1.0) for i in xv.values()), "==", 1.0)

    node_vars: list[NodeVars] = []
    mem_terms: tuple[list, list] = ([], [])
    n_rounded = 0
    for v, node in enumerate(pg.nodes):
        data = nodes[v]
        tau = b.var(f"tau_{v}", data.floor, max(data.floor, max(max(max(t) for t in s) for s in data.sides))) \
            if epigraph else None
        side_terms: tuple[list, list] = ([], [])
        cvars = []
        for j, (cfg, pts, vals) in enumerate(zip(data.configs, data.points, data.values)):
            tag = f"{v}_{'_'.join(c.value for c in cfg.pred_choices)}__{cfg.choice.value}"
            ind = xs[v][cfg.choice] if not node.preds else b.var(f"z_{tag}", 0, 1, discrete)
            mass = _share_vars(b, tag, ind, pts, data.segmented[j], discrete)
            cvars.append(ConfigVars(cfg.pred_choices, cfg.choice, ind, pts, mass))
            for s, val, m, sides in zip(pts, vals, mass, data.sides[j] or [None] * len(pts)):
                for i in m:
                    if epigraph:
                        side_terms[0].append((i, sides[0]))
                        side_terms[1].append((i, sides[1]))
                        if data.floor > 0:  # the tie-breaking term of floored_time
                            b.objective(i, FLOOR_TIE_WEIGHT * max(sides))
                    else:
                        b.objective(i, round(val) if discrete else val)
            if memory is not None:
                _memory_terms(sp, v, cfg.choice, pts, mass, memory, discrete, mem_terms)
        n_rounded += 1
        if epigraph:
            b.objective(tau, 1.0)
            for i in (0, 1):
                b.constraint("epigraph", f"epigraph_{v}_side{i + 1}",
                             [(tau, 1.0)] + [(k, -t) for k, t in side_terms[i]], ">=", 0.0)
        if node.preds:
            _edge_links(b, v, pg, cvars, xs)
        node_vars.append(NodeVars(MappingProxyType(dict(xs[v])), tuple(cvars)))

    notes = []
    if memory is not None:
        unit = GIB if not discrete else _memory_unit(memory)
        for i, cap in enumerate(memory.capacity_bytes):
            rhs = cap / unit if not discrete else math.floor(cap / unit)
            b.constraint("memory", f"memory_side{i + 1}", mem_terms[i], "<=", rhs)
        notes.append(
            "memory limit: shares may stop between candidates, where the time is concave; the model "
            "uses chords there (a relaxation: valid bound, gap shrinks with share_grid)"
            + ("" if memory.per_device else "; side capacity = sum of its devices' memory "
               "(a necessary condition above the last level)")
        )
    if discrete:
        notes.append(
            f"integer model: shares restricted to candidates plus a grid of {share_grid} intervals; "
            f"times rounded to 1/{scale:.3g} of the objective unit (error <= 0.5 unit per node)"
            + ("; memory coefficients rounded up, capacities down" if memory is not None else "")
        )
    model = b.build(
        objective_unit="s" if time_obj else "elements",
        objective_scale=scale,
        objective_error=0.5 * n_rounded if discrete else 0.0,
        exact=memory is None,
        notes=tuple(notes),
    )
    return model, SplitDecoder(tuple(node_vars))


def _prepare(sp, options, free, fixed, scale, grid, discrete, segment) -> list[_Node]:
    """Configurations, share points and their costs for every node (costmodel calls only).

    A node's time at a split below the root is at least its floor (the sibling group's time at
    the parent split, see :class:`~parplan.solvers.dp.SplitProblem`): each point's value is
    ``max(T_1, T_2, floor)``, and where shares may stop between points the shares at which the
    time crosses the floor are points too (so the chords stay under the true time).
    """
    floors = getattr(sp, "floor_s", None)
    out = []
    for v in range(len(sp.planning.nodes)):
        d = sp.dims[v]
        floor = floors[v] if (floors is not None and options.objective is Objective.TIME) else 0.0
        configs = node_configs(sp, v, options)
        points, values, sides, segmented = [], [], [], []
        for cfg in configs:
            if cfg.e1.q < 0 or abs(cfg.e1.q - cfg.e2.q) > 1e-12 * max(1.0, abs(cfg.e1.q)):
                raise ConfigError(f"node '{sp.planning.nodes[v].name}': the share formulation needs an "
                                  "equal, non-negative quadratic term on both sides (layout.py guarantees it)")
            quad = cfg.e1.q > 0
            if options.objective is Objective.COMMUNICATION:
                pts = (fixed,)
                vals = ((cfg.e1.at(fixed) + cfg.e2.at(fixed)) * scale,)
                sd = ()
            else:
                if free:
                    cands = share_candidates(d.flops, cfg.e1, cfg.e2, sp.side)
                    pts = _merge_points(cands, grid) if (discrete or (quad and segment)) else tuple(cands)
                    if floor > 0 and segment and not discrete:
                        def f(a, cfg=cfg):
                            return max(_node_time(sp, v, cfg, a))
                        extra = [r for lo, hi in zip(pts, pts[1:]) for r in floor_crossings(f, lo, hi, floor, quad)]
                        pts = _merge_points(pts, extra)
                else:
                    pts = (fixed,)
                sd = tuple(tuple(t * scale for t in _node_time(sp, v, cfg, s)) for s in pts)
                vals = tuple(floored_time(max(t), floor * scale) for t in sd)
            points.append(pts)
            values.append(vals)
            sides.append(sd)
            segmented.append(bool(free and segment and not discrete and quad and len(pts) > 2))
        out.append(_Node(tuple(configs), tuple(points), tuple(values), tuple(sides), tuple(segmented), floor * scale))
    return out


def _share_vars(b: ModelBuilder, tag: str, ind: int, pts, segmented: bool, discrete: bool) -> tuple[tuple[int, ...], ...]:
    """Share variables of one configuration; returns, per point, the variables of its mass."""
    if len(pts) == 1:
        return ((ind,),)
    if not segmented:
        us = [b.var(f"u_{tag}_{j}", 0, 1, discrete) for j in range(len(pts))]
        b.constraint("share_link", f"share_link_{tag}", [(u, 1.0) for u in us] + [(ind, -1.0)], "==", 0.0)
        return tuple((u,) for u in us)
    # DCC: one binary per interval, the mass of an interval split between its two ends
    mass: list[list[int]] = [[] for _ in pts]
    ws = []
    for j in range(len(pts) - 1):
        w = b.var(f"w_{tag}_{j}", 0, 1, True)
        lo, hi = b.var(f"l_{tag}_{j}", 0, 1), b.var(f"r_{tag}_{j}", 0, 1)
        b.constraint("share_link", f"share_link_{tag}_{j}", [(lo, 1.0), (hi, 1.0), (w, -1.0)], "==", 0.0)
        mass[j].append(lo)
        mass[j + 1].append(hi)
        ws.append(w)
    b.constraint("segment", f"segment_{tag}", [(w, 1.0) for w in ws] + [(ind, -1.0)], "==", 0.0)
    return tuple(tuple(m) for m in mass)


def _edge_links(b: ModelBuilder, v: int, pg, cvars: list[ConfigVars], xs) -> None:
    """Marginal constraints tying configuration indicators to the node variables."""
    for c, xi in xs[v].items():
        b.constraint("edge_link", f"edge_link_{v}_own_{c.value}",
                     [(k.indicator, 1.0) for k in cvars if k.choice == c] + [(xi, -1.0)], "==", 0.0)
    for p, u in enumerate(pg.nodes[v].preds):
        for cu, xi in xs[u].items():
            b.constraint("edge_link", f"edge_link_{v}_pred{p}_{u}_{cu.value}",
                         [(k.indicator, 1.0) for k in cvars if k.pred_choices[p] == cu] + [(xi, -1.0)], "==", 0.0)


def _memory_unit(memory: MemoryLimit) -> float:
    return max(memory.capacity_bytes) / 1e6


def _memory_terms(sp, v, choice, pts, mass, memory: MemoryLimit, discrete: bool, out) -> None:
    """Memory of node ``v`` on each side at each share point, times the point's mass."""
    m = node_memory(sp.dims[v], choice)
    bpe = sp.side.bytes_per_element
    unit = GIB if not discrete else _memory_unit(memory)
    for i in (0, 1):
        for s, vars_ in zip(pts, mass):
            coef = m[i].at(s) * bpe / unit
            if discrete:
                coef = math.ceil(coef - 1e-9)
            if coef:
                out[i].extend((k, coef) for k in vars_)


def memory_need_model(model: MipModel) -> MipModel:
    """The model that finds the smallest factor ``f`` by which the memory capacities must grow
    for the model to be feasible (objective: ``f``). Used to say how much memory is missing."""
    mem = [c for c in model.constraints if c.family == "memory"]
    if not mem:
        raise ConfigError("the model has no memory constraint")
    f = len(model.variables)
    hi = max(sum(abs(a) * 1.0 for _, a in c.coeffs) / c.rhs for c in mem if c.rhs > 0) + 1.0
    variables = model.variables + (Variable("memory_factor", 0.0, hi, False),)
    cons = tuple(
        replace(c, coeffs=c.coeffs + ((f, -c.rhs),), rhs=0.0) if c.family == "memory" else c
        for c in model.constraints
    )
    return replace(model, variables=variables, constraints=cons, objective=((f, 1.0),),
                   objective_constant=0.0, objective_unit="factor", objective_scale=1.0,
                   objective_error=0.0, exact=True)


__all__ = [
    "Constraint",
    "FAMILIES",
    "GIB",
    "MemoryLimit",
    "MipModel",
    "ModelBuilder",
    "SplitDecoder",
    "Variable",
    "build_mip",
    "import_pulp",
    "memory_need_model",
    "node_configs",
    "share_grid_points",
]
