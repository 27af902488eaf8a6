"""The exact MIP of one split, as a solver-neutral model (docs/costmodel.md section 8).

:class:`MipModel` is plain data: variables (bounds, integrality, names), linear constraints
(each with a name and a *family*: ``one_hot``, ``edge_link``, ``memory``) and a linear
objective. Any backend of :mod:`parplan.solvers.backends` solves it; :meth:`MipModel.write_lp`
/ :meth:`MipModel.write_mps` write it without solving. :func:`build_mip` builds the model of a
:class:`~parplan.costmodel.split.SplitProblem` and a decoder that turns a solution back into a
:class:`~parplan.costmodel.problem.Split`. Every cost coefficient is a cell of a node's cost
table (:func:`~parplan.costmodel.split.node_factor`); nothing is re-derived here.

Formulation (node ``v``, state ``s`` = choice and grid share):

- ``y[v,s]`` binary, one-hot per node (family ``one_hot``).
- Node ``u``'s cost depends on the states of its *scope* (``u`` and its consumers). For every
  cell ``k`` of the scope's joint states a variable ``z[u,k]`` in [0, 1], linked to the node
  variables by marginals (family ``edge_link``): for every member ``w`` and state ``s``, the
  ``z`` whose entry for ``w`` is ``s`` sum to ``y[w,s]``. With binary ``y`` exactly one cell
  (the product of the members' states) carries 1, so the objective ``sum_k cost[u,k] z[u,k]``
  is node ``u``'s true cost: no product of variables, no big-M. A node whose scope is itself
  (no consumers) uses ``y`` directly.
- A member's states whose slices of the table are equal (a consumer split by output columns
  needs the whole tensor at every share) are merged first (:func:`merge_alike`): one cell per
  merged state, linked to the sum of its states' ``y``. The same costs, exactly; ResNet-18's
  root split on ``tpu-v2:1,tpu-v3:1`` has 636,000 cells and 396,000 merged (the columns' limit
  is :data:`MAX_MODEL_CELLS`; the tables already hold each state that is the same plan once,
  ``StateTable.distinct``).
- Memory (family ``memory``, optional): per side ``sum_{v,s} memory_i[v,s] y[v,s] / capacity_i
  <= 1`` (rows scaled to the side's capacity, so coefficients are O(1) whatever the model).
  A side's capacity is the sum of its devices' memory: exact when the side is one device, a
  necessary condition above.

The model is exact for the share grid (its optimum is the DP's). ``discrete=True`` builds
the integer model for CP-SAT: the same model with ``z`` integer and objective coefficients
rounded to integers at a scale where the total is about 1e9 units (error <= 0.5 unit per
node, stated in :attr:`MipModel.objective_error`); memory coefficients and capacities rounded
down at 1e-6 of the capacity: a relaxation, so an "infeasible" answer is a proof, and a plan it
accepts is re-checked (one that the rounding let over its limit is reported as an error; an
earlier version rounded coefficients up, which made plans that fit look infeasible).

Times are in model units (``objective_scale`` units per second, chosen so the ideal compute
time of the split is about 1000 units) to keep solver tolerances meaningful.

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.costmodel.split import PlanOptions, SplitProblem
    >>> sp = SplitProblem.root(Problem(get_model("lenet"), parse_array("tpu-v2:1,tpu-v3:1"), batch=64))
    >>> model, decode = build_mip(sp, PlanOptions(share_grid=2))
    >>> sorted(model.families())
    ['edge_link', 'one_hot']
    >>> # 3 types x {1/2, proportional} and one state each for shares 0 and 1 (any type: not split)
    >>> model.n_integer == sum(3 * 2 + 2 for _ in sp.planning.nodes)
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Iterable, Mapping, Sequence

import numpy as np

from parplan.costmodel.cost import Objective, scale_for_sides
from parplan.costmodel.problem import Split
from parplan.costmodel.split import PlanOptions, factor_scope, node_factor, split_tables
from parplan.errors import ConfigError, TableTooLarge

GIB = float(2**30)
SENSES = ("<=", ">=", "==")
FAMILIES = ("one_hot", "edge_link", "memory", "node_time")
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
    #: A solution to start from (values in variable order), or None. SCIP takes it as a hint
    #: (it checks and repairs it); the other backends ignore it.
    start: tuple[float, ...] | None = None

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
        return (
            f"{self.n_vars} variables ({self.n_integer} integer), {self.n_constraints} constraints "
            f"({fams})"
        )

    def without(self, *families: str) -> "MipModel":
        """The model with every constraint of ``families`` removed (for infeasibility diagnosis)."""
        unknown = set(families) - set(FAMILIES)
        if unknown:
            raise ConfigError(
                f"unknown constraint families {sorted(unknown)}; valid: {list(FAMILIES)}"
            )
        return replace(
            self, constraints=tuple(c for c in self.constraints if c.family not in families)
        )

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

    def write_lp(self, path: str | Path) -> Path:
        """Write the model in CPLEX LP format (:mod:`parplan.formulation.lpfiles`); returns the path."""
        from parplan.formulation.lpfiles import write_lp

        return write_lp(self, path)

    def write_mps(self, path: str | Path) -> Path:
        """Write the model in free MPS format (:mod:`parplan.formulation.lpfiles`); returns the path."""
        from parplan.formulation.lpfiles import write_mps

        return write_mps(self, path)


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

    def constraint(
        self, family: str, name: str, terms: Iterable[tuple[int, float]], sense: str, rhs: float
    ) -> None:
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
            if not (math.isfinite(c) and c > 0):
                raise ConfigError(f"memory capacity must be a finite number > 0 bytes (got {c})")


@dataclass(frozen=True)
class SplitDecoder:
    """Turns a solution (an object with ``.values`` or a sequence, model order) into a Split."""

    y: tuple[tuple[int, ...], ...]  # per node, the variable of each state
    tables: tuple  # per node, its StateTable

    def __call__(self, raw) -> Split:
        values = getattr(raw, "values", raw)
        if values is None:
            raise ConfigError("cannot decode a result without a solution")
        choices, shares = [], []
        for ys, table in zip(self.y, self.tables):
            s = max(range(len(ys)), key=lambda j: values[ys[j]])
            choices.append(table.choices[s])
            shares.append(float(table.shares[s]))
        return Split(tuple(choices), tuple(shares))


def _time_scale(sp) -> float:
    c = sum(sp.side.flops_per_s)
    ref = sum(d.total_flops for d in sp.dims) / c
    if not ref > 0:
        ref = 1e-6 * max(1, len(sp.dims))
    return 1.0 / ref


def _elements_scale(sp) -> float:
    ref = sum(d.in_elements + d.weight_elements for d in sp.dims)
    return 1.0 / ref if ref > 0 else 1.0


#: Memory rows of the integer model count in units of this fraction of the side's capacity.
MEMORY_RESOLUTION = 1e-6

#: Most cell columns (joint states of a node and its consumers) a split's model may have. Each
#: costs several KiB while it is built and solved (ResNet-18's root split unmerged, 1.32e6
#: columns, took 10.9 GB and 487 s before it was refused; merged, 396,000: 4.1 GB and 170 s);
#: a larger split is planned by the DP instead and certified as feasible only
#: (:func:`parplan.solvers.exact.solve_split_exact`).
MAX_MODEL_CELLS = 400_000
#: Most cells a split's factors may have before merging (:func:`merge_alike`): above it the
#: model is refused without pricing them.
MAX_RAW_CELLS = 4_000_000


def model_cells(sp, tables, options: PlanOptions | None = None) -> float:
    """Cell columns the model of split ``sp`` would have (every factor of two or more nodes): with
    ``options``, after merging the states that price alike (:func:`merge_alike`; the factors are
    priced, unless there are more than :data:`MAX_RAW_CELLS` joint states), else the factors'
    whole size (an upper bound, without pricing)."""
    if options is not None:
        return _sized(sp, tables, options)[0]
    total = 0.0
    for u in range(len(sp.planning.nodes)):
        scope = factor_scope(sp.planning, u)
        if len(scope) > 1:
            total += float(np.prod([tables[w].size for w in scope], dtype=float))
    return total


def too_large(sp, tables, options: PlanOptions) -> bool:
    """Whether :func:`build_mip` refuses split ``sp``'s model for its size (above
    :data:`MAX_RAW_CELLS` joint states unpriced, or :data:`MAX_MODEL_CELLS` merged columns)."""
    return _sized(sp, tables, options)[0] > MAX_MODEL_CELLS


def _sized(sp, tables, options: PlanOptions):
    """(the model's cell columns, its merged factors): above :data:`MAX_RAW_CELLS` joint states
    the factors are not priced (None, and the joint states counted); the one size rule of
    :func:`build_mip` and :func:`too_large`."""
    raw = model_cells(sp, tables)
    if raw > MAX_RAW_CELLS:
        return raw, None
    factors = _merged_factors(sp, tables, options)
    return float(sum(c.size for scope, c, _ in factors if len(scope) > 1)), factors


def merge_alike(costs: np.ndarray) -> tuple[np.ndarray, list[list[tuple[int, ...]]]]:
    """(``costs`` with, along each axis, the states whose slices are equal merged into one, and
    per axis the original states of each merged one). A node's factor reads a consumer only
    through the part of the tensor it needs (docs/costmodel.md section 3), so every share of a
    consumer split by output columns, say, prices alike: ResNet-18's root split on
    ``tpu-v2:1,tpu-v3:1`` has 636,000 cells and 396,000 merged. The model stays exact: a merged cell's
    column links to the sum of its states' choice variables."""
    classes = [[(s,) for s in range(n)] for n in costs.shape]
    for axis in range(costs.ndim):
        rows = np.moveaxis(costs, axis, 0).reshape(costs.shape[axis], -1)
        _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        if len(first) == len(rows):
            continue
        order = np.argsort(first)  # merged states in the order of their first member
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        groups: list[list[int]] = [[] for _ in order]
        for row, g in enumerate(np.asarray(inverse).ravel()):
            groups[rank[g]].extend(classes[axis][row])
        classes[axis] = [tuple(sorted(g)) for g in groups]
        costs = np.take(costs, first[order], axis=axis)
    return costs, classes


def _merged_factors(sp, tables, options: PlanOptions):
    """Per node (scope, merged costs, per axis the states of each merged state): the model's
    factors (:func:`merge_alike`; one-node factors as they are)."""
    out = []
    for u in range(len(sp.planning.nodes)):
        scope, table = node_factor(sp, tables, u, options)
        costs = np.asarray(table, dtype=float)
        if len(scope) > 1:
            costs, classes = merge_alike(costs)
        else:
            classes = [[(s,) for s in range(costs.size)]]
        out.append((scope, costs, classes))
    return out


def build_mip(
    sp,
    options: PlanOptions | None = None,
    memory: MemoryLimit | None = None,
    discrete: bool = False,
    tables=None,
) -> tuple[MipModel, SplitDecoder]:
    """The MIP of split ``sp`` and its decoder.

    ``options``: objective, share mode, allowed choices, share grid; ``memory``: per-side
    capacity; ``discrete``: the integer model for CP-SAT; ``tables``: the nodes' state tables
    (default :func:`~parplan.costmodel.split.split_tables`'; the exact solvers pass those of
    the states an optimum may have, docs/costmodel.md section 8).
    """
    options = PlanOptions() if options is None else options
    time_obj = options.objective is Objective.TIME
    scale = (_time_scale(sp) if time_obj else _elements_scale(sp)) * TIME_UNITS
    if discrete:
        scale *= INTEGER_UNITS / TIME_UNITS
    pg = sp.planning
    tables = split_tables(sp, options) if tables is None else tables
    cells, factors = _sized(sp, tables, options)
    if cells > MAX_MODEL_CELLS:
        raise TableTooLarge(
            f"graph '{pg.name}': the exact model of split '{sp.path or 'root'}' would have "
            f"{cells:.3g} cell columns ("
            + ("its states that price alike merged; " if factors is not None else "")
            + f"limit {MAX_MODEL_CELLS:.3g}); use a coarser --share-grid "
            f"(now {options.share_grid}) or `parplan plan`"
        )
    b = ModelBuilder(f"split_{pg.name}_{sp.path or 'root'}")
    ys: list[tuple[int, ...]] = []
    for v, node in enumerate(pg.nodes):
        t = tables[v]
        yv = tuple(b.var(f"y_{v}_{t.choices[s].value}_{s}", 0, 1, True) for s in range(t.size))
        ys.append(yv)
        b.constraint("one_hot", f"one_hot_{v}", ((i, 1.0) for i in yv), "==", 1.0)
    for u, (scope, merged, classes) in enumerate(factors):
        costs = merged * scale
        if discrete:
            costs = np.round(costs)
        if len(scope) == 1:
            for s, c in enumerate(costs):
                b.objective(ys[u][s], float(c))
            continue
        shape = costs.shape
        flat = costs.ravel()
        zs = [b.var(f"z_{u}_{k}", 0, 1, discrete) for k in range(flat.size)]
        for k, c in enumerate(flat):
            b.objective(zs[k], float(c))
        cells = np.arange(flat.size).reshape(shape)
        for axis, w in enumerate(scope):
            # a merged state's cells carry the states it merges: their choice variables' sum
            for m, states in enumerate(classes[axis]):
                members = np.take(cells, m, axis=axis).ravel()
                b.constraint(
                    "edge_link",
                    f"edge_link_{u}_{w}_{m}",
                    [(zs[k], 1.0) for k in members] + [(ys[w][s], -1.0) for s in states],
                    "==",
                    0.0,
                )
    notes = []
    if memory is not None:
        blocks = pg.blocks
        recomputed = [
            v for v in range(len(pg.nodes)) if sp.dims[v].recompute and sp.dims[v].checkpoint >= 0
        ]

        def coefficient(x: float) -> float:
            # rounded down in the integer model: a relaxation, so "infeasible" stays a proof
            return float(math.floor(x / MEMORY_RESOLUTION)) if discrete else x

        for i, cap in enumerate(memory.capacity_bytes):
            terms = []
            for v, t in enumerate(tables):
                for s in range(t.size):
                    coef = coefficient(t.memory[i][s] / cap)
                    if coef:
                        terms.append((ys[v][s], coef))
            rhs = 1.0 if not discrete else math.floor(1.0 / MEMORY_RESOLUTION)
            if recomputed:  # the largest checkpointed block, held again (section 6.3): a row each
                again = b.var(f"again_side{i + 1}", 0, rhs, discrete)
                terms.append((again, 1.0))
                for block in sorted({blocks[v] for v in recomputed}):
                    held = [
                        (ys[v][s], coefficient(tables[v].activations[i][s] / cap))
                        for v in recomputed
                        if blocks[v] == block
                        for s in range(tables[v].size)
                    ]
                    b.constraint(
                        "memory",
                        f"memory_block{block}_side{i + 1}",
                        [x for x in held if x[1]] + [(again, -1.0)],
                        "<=",
                        0.0,
                    )
            if (
                sp.side.zero_stage >= 3
            ):  # the largest FSDP unit's gathered weights (6.1): a row each
                gathered = b.var(f"gathered_side{i + 1}", 0, rhs, discrete)
                terms.append((gathered, 1.0))
                for unit in sorted(set(pg.units)):
                    held = [
                        (ys[v][s], coefficient(tables[v].gathered[i][s] / cap))
                        for v in range(len(pg.nodes))
                        if pg.units[v] == unit
                        for s in range(tables[v].size)
                    ]
                    if any(c for _, c in held):
                        b.constraint(
                            "memory",
                            f"memory_unit{unit}_side{i + 1}",
                            [x for x in held if x[1]] + [(gathered, -1.0)],
                            "<=",
                            0.0,
                        )
            b.constraint("memory", f"memory_side{i + 1}", terms, "<=", rhs)
        if not memory.per_device:
            notes.append(
                "side capacity = sum of its devices' memory (a necessary condition above the last level)"
            )
    if discrete:
        notes.append(
            f"integer model: costs rounded to 1/{scale:.3g} of the objective unit (error <= 0.5 unit "
            "per node)"
            + (
                "; memory coefficients and capacities rounded down to 1e-6 of the capacity (a "
                "relaxation: its plan is re-checked, and fails where the rounding let it "
                "over)"
                if memory is not None
                else ""
            )
        )
    model = b.build(
        objective_unit="s" if time_obj else "elements",
        objective_scale=scale,
        objective_error=0.5 * len(pg.nodes) if discrete else 0.0,
        exact=True,
        notes=tuple(notes),
    )
    return model, SplitDecoder(tuple(ys), tuple(tables))


def plan_memory_bytes(sp, split: Split) -> tuple[float, float]:
    """Memory each side of ``sp`` keeps under ``split`` (cost model, not the solver's rows)."""
    out = [0.0, 0.0]
    held: list[dict[int, float]] = [{}, {}]  # per side, a recomputed block's activations
    gathered: list[dict[int, float]] = [{}, {}]  # per side, an FSDP unit's gathered weights
    bpe, opt, zero = (
        sp.side.bytes_per_element,
        sp.side.optimizer_bytes_per_param,
        sp.side.zero_stage,
    )
    blocks, units = sp.planning.blocks, sp.planning.units
    for v, (d, c, a) in enumerate(zip(sp.dims, split.choices, split.shares)):
        for i, part in enumerate(scale_for_sides(d, c, a)):
            out[i] += part.memory_bytes(bpe, opt, zero)
            if d.recompute and d.checkpoint >= 0:  # in a checkpointed block
                held[i][blocks[v]] = held[i].get(blocks[v], 0.0) + part.activation_bytes(bpe)
            gathered[i][units[v]] = gathered[i].get(units[v], 0.0) + part.gathered_bytes(bpe, zero)
    return tuple(
        out[i] + max(held[i].values(), default=0.0) + max(gathered[i].values(), default=0.0)
        for i in (0, 1)
    )


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
    return replace(
        model,
        variables=variables,
        constraints=cons,
        objective=((f, 1.0),),
        objective_constant=0.0,
        objective_unit="factor",
        objective_scale=1.0,
        objective_error=0.0,
        exact=True,
    )


__all__ = [
    "Constraint",
    "FAMILIES",
    "MemoryLimit",
    "MipModel",
    "ModelBuilder",
    "SplitDecoder",
    "Variable",
    "build_mip",
    "memory_need_model",
    "merge_alike",
    "model_cells",
    "too_large",
    "plan_memory_bytes",
]
