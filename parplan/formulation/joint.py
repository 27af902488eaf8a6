"""One MIP over every split of the hierarchy (SPEC section 5, "optimise all levels jointly").

Level-by-level planning (AccPar, :func:`parplan.solvers.hierarchy.plan_top_down`) fixes the
root split before it sees what the halves will cost. The joint model chooses every split's
types and shares at once and prices exactly what the evaluator prices: a split's time for a
layer is the max over its two children of (child's time + that side's communication at this
level), a device's time is FLOPs over its throughput, and memory is checked per device.

A child's layer sizes are its parent's scaled by the parent's share, so costs are products of
shares along the path. To stay linear the shares of every split are discretised: each
(split ``p``, node ``v``) picks one *option* ``o = (choice, share)`` (binary ``y``; shares on a
uniform grid of ``share_grid`` intervals, plus the proportional share, plus the shares of a
given plan -- the level-by-level plan -- so the joint optimum is never worse than it). Sizes are
tracked as the factors ``P_bi, P_bo, P_io, P_bio`` (of ``B*Di``, ``B*Do``, ``Di*Do``,
``B*Di*Do``) relative to the root, computed with :func:`~parplan.costmodel.cost.scale_for_sides`.
Products "binary x factor" are disaggregated exactly with the factors' true bounds [0, 1]:
``sum_o Y[o,j] = P_j(p,v)``, ``0 <= Y[o,j] <= y_o``, and a child's ``P_j = sum_o f_j(o) Y[o,j]``.
Transitions multiply a configuration ``z_k`` (predecessor choices, own choice; linked by
marginals as in :mod:`.mip`) with ``Y[o,bi]``:
``sum_{k with own choice c} R[k,o] = Y[o,bi]`` and ``sum_o R[k,o] <= z_k`` (equality at the root),
exact for binary ``y`` and ``z``. Epigraph variables ``t[p,v] >= t[child,v] + latency + bytes*comm/BW``
give the max over the two groups at every level. A join pays the latency only if its size
at that split is non-zero (``alive``), as in the evaluator.

The model is exact for the discretised shares (its optimum is the best plan whose shares are
options) and grows as (options x configurations x splits): keep it for arrays of depth <= 3
(8 devices) and moderate graphs; deeper arrays are refused.

Example:
    >>> from parplan.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> p = Problem(get_model("lenet"), parse_array("tpu-v2:2,tpu-v3:2"), batch=64)
    >>> model, decode = build_joint(p, share_grid=2)
    >>> sorted(model.families())
    ['edge_link', 'epigraph', 'one_hot', 'share_link']
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Mapping

from parplan.costmodel.cost import Objective, ShareMode, exchanges, node_comm, scale_for_sides
from parplan.costmodel.dims import LayerDims
from parplan.costmodel.layout import PARTIAL_TENSOR, Choice, Tensor
from parplan.costmodel.problem import Plan, Problem, Split
from parplan.errors import ConfigError
from parplan.formulation.mip import GIB, TIME_UNITS, MipModel, ModelBuilder, share_grid_points

#: Deepest array the joint model accepts (levels of splits).
JOINT_MAX_DEPTH = 3
#: Default share grid (intervals) of the joint model.
DEFAULT_JOINT_GRID = 4
_UNIT = LayerDims(batch=1.0, in_features=1.0, out_features=1.0, in_spatial=1, out_spatial=1, kernel=1)
_PRODUCTS = ("bi", "bo", "io", "bio")
_TENSOR_PRODUCT = {Tensor.WEIGHT: "io", Tensor.OUTPUT: "bo", Tensor.INPUT: "bi"}


def factors(choice: Choice, share: float) -> tuple[Mapping[str, float], Mapping[str, float]]:
    """Size factors (bi, bo, io, bio) each side keeps under (choice, share), via scale_for_sides."""
    out = []
    for d in scale_for_sides(_UNIT, choice, share):
        b, i, o = d.batch, d.in_features, d.out_features
        out.append({"bi": b * i, "bo": b * o, "io": i * o, "bio": b * i * o})
    return out[0], out[1]


@dataclass(frozen=True)
class JointDecoder:
    """Turns a joint solution into a :class:`Plan` (one split per inner array node)."""

    options: Mapping[str, tuple[tuple[tuple[Choice, float, int], ...], ...]]  # path -> per node

    def __call__(self, raw) -> Plan:
        values = getattr(raw, "values", raw)
        if values is None:
            raise ConfigError("cannot decode a result without a solution")
        splits = {}
        for path, per_node in self.options.items():
            choices, shares = [], []
            for opts in per_node:
                c, s, _ = max(opts, key=lambda o: values[o[2]])
                choices.append(c)
                shares.append(s)
            splits[path] = Split(tuple(choices), tuple(shares))
        return Plan(splits, planner="exact-joint")


def _share_options(problem, group, path, v, c, options, grid, include: Plan | None) -> tuple[float, ...]:
    if options.shares is not ShareMode.FREE:
        side = problem.side_spec(group)
        return (side.fixed_share(options.shares),)
    pts = set(grid)
    pts.add(group.left.flops_per_s / group.flops_per_s)
    if include is not None and path in include.splits:
        sp = include.splits[path]
        if sp.choices[v] == c:
            pts.add(sp.shares[v])
    out: list[float] = []
    for s in sorted(pts):
        if not out or s - out[-1] > 1e-12:
            out.append(s)
    return tuple(out)


def build_joint(
    problem: Problem,
    options=None,
    memory_limit_bytes: float | str | None = None,
    share_grid: int = DEFAULT_JOINT_GRID,
    include: Plan | None = None,
) -> tuple[MipModel, JointDecoder]:
    """The joint MIP of all splits of ``problem`` and its decoder (see the module docstring).

    ``memory_limit_bytes``: capacity of every device (bytes), ``"device"`` for each device's
    own memory, None for no memory constraint. ``include``: a plan whose shares are added to
    the options (its plan is then feasible in the model).
    """
    from parplan.solvers.dp import PlanOptions

    options = PlanOptions() if options is None else options
    array = problem.array
    if array.is_leaf:
        raise ConfigError(f"array '{array.describe()}' has one device: nothing to split")
    if array.depth > JOINT_MAX_DEPTH:
        raise ConfigError(
            f"array '{array.describe()}' has {array.depth} levels; the joint model is limited to "
            f"{JOINT_MAX_DEPTH} levels (8 devices): plan deeper arrays level by level (joint=False)"
        )
    if options.objective is Objective.COMMUNICATION and options.shares is ShareMode.FREE:
        raise ConfigError("objective 'communication' needs fixed shares")
    if getattr(array, "collective", None) is not None:
        raise ConfigError(f"array '{array.describe()}' prices BATCH with a collective all-reduce; the joint model "
                          "does not model collectives: plan it level by level (joint=False)")
    pg = problem.planning
    dims = problem.root_dims()
    grid = share_grid_points(share_grid) if share_grid else (0.0, 1.0)
    time_obj = options.objective is Objective.TIME
    ref = (sum(d.flops for d in dims) / array.flops_per_s) if time_obj else \
        sum(d.in_elements + d.weight_elements for d in dims)
    scale = TIME_UNITS / ref if ref > 0 else 1.0
    bpe = problem.bytes_per_element
    b = ModelBuilder(f"joint_{pg.name}")
    groups = dict(array.inner_nodes())
    n = len(pg.nodes)

    # options y[p][v] = [(choice, share, var)], one-hot per (split, node)
    ys: dict[str, list[list[tuple[Choice, float, int]]]] = {}
    for path, group in groups.items():
        per_node = []
        for v, node in enumerate(pg.nodes):
            opts = []
            for c in options.choices(node):
                for j, s in enumerate(_share_options(problem, group, path, v, c, options, grid, include)):
                    opts.append((c, s, b.var(f"y_{path or 'root'}_{v}_{c.value}_{j}", 0, 1, True)))
            b.constraint("one_hot", f"one_hot_{path or 'root'}_{v}", [(o[2], 1.0) for o in opts], "==", 1.0)
            per_node.append(opts)
        ys[path] = per_node

    def x_terms(path: str, v: int, c: Choice) -> list[tuple[int, float]]:
        return [(o[2], 1.0) for o in ys[path][v] if o[0] == c]

    # size factors: P[(path, v)][j] = linear expression (terms, constant); root = 1
    P: dict[tuple[str, int], dict[str, tuple[list, float]]] = {
        ("", v): {j: ([], 1.0) for j in _PRODUCTS} for v in range(n)}
    alive: dict[tuple[str, int], tuple[list, float]] = {("", v): ([], 1.0) for v in range(n)}
    Y: dict[tuple[str, int], dict[str, list[int | None]]] = {}

    def products_of(v: int) -> tuple[str, ...]:
        return ("bi",) if pg.nodes[v].is_join else _PRODUCTS

    # depth-first so children's P exist when we reach them
    order = sorted(groups, key=len)
    for path in order:
        group = groups[path]
        for v in range(n):
            opts = ys[path][v]
            Y[path, v] = {}
            for j in products_of(v):
                terms, const = P[path, v][j]
                if not terms:  # P is the constant `const`: Y = const * y
                    Y[path, v][j] = [None] * len(opts)
                    continue
                vars_ = [b.var(f"Y_{path or 'root'}_{v}_{j}_{k}", 0, 1) for k in range(len(opts))]
                b.constraint("share_link", f"Ysum_{path or 'root'}_{v}_{j}",
                             [(i, 1.0) for i in vars_] + [(i, -a) for i, a in terms], "==", const)
                for k, (o, yi) in enumerate(zip(opts, vars_)):
                    b.constraint("share_link", f"Yub_{path or 'root'}_{v}_{j}_{k}", [(yi, 1.0), (o[2], -1.0)], "<=", 0.0)
                Y[path, v][j] = vars_
            # children's factors and alive
            for side, child_path, child in ((0, path + "L", group.left), (1, path + "R", group.right)):
                P[child_path, v] = {}
                for j in products_of(v):
                    terms, const = P[path, v][j]
                    expr: list[tuple[int, float]] = []
                    for k, o in enumerate(opts):
                        f = factors(o[0], o[1])[side][j]
                        yv = Y[path, v][j][k]
                        if f:
                            expr.append((o[2], f * const) if yv is None else (yv, f))
                    P[child_path, v][j] = (expr, 0.0)
                if pg.nodes[v].is_join and not child.is_leaf:
                    zero = [(o[2], 1.0) for o in opts if factors(o[0], o[1])[side]["bi"] == 0.0]
                    pa_terms, pa_const = alive[path, v]
                    if not zero and not pa_terms:
                        alive[child_path, v] = ([], pa_const)
                    else:
                        al = b.var(f"alive_{child_path}_{v}", 0, 1)
                        b.constraint("share_link", f"alive_{child_path}_{v}",
                                     [(al, 1.0)] + [(i, -a) for i, a in pa_terms] + zero, ">=", pa_const)
                        alive[child_path, v] = ([(al, 1.0)], 0.0)

    def Yexpr(path: str, v: int, k: int, j: str) -> list[tuple[int, float]]:
        yv = Y[path, v][j][k]
        if yv is None:
            return [(ys[path][v][k][2], P[path, v][j][1])]
        return [(yv, 1.0)]

    # times, communication, configurations
    t: dict[tuple[str, int], int] = {}
    for path in sorted(groups, key=len, reverse=True):  # children first (only for naming order)
        for v in range(n):
            if time_obj:
                t[path, v] = b.var(f"t_{path or 'root'}_{v}", 0.0, math.inf)
    for path in order:
        group = groups[path]
        side_spec = problem.side_spec(group)
        kb = bpe / side_spec.bytes_per_s
        lat = side_spec.latency_s
        for v, node in enumerate(pg.nodes):
            d = dims[v]
            opts = ys[path][v]
            comm: tuple[list, list] = ([], [])  # elements per side, terms
            lat_terms: list[tuple[int, float]] = []
            lat_const = 1.0 if not node.is_join else 0.0
            opt_of: dict[int, int] = {}  # communication variable -> its option
            # intra-layer: size of the reduced tensor at this split, per own choice
            if not node.is_join:
                for k, o in enumerate(opts):
                    intra1, intra2 = node_comm(d, o[0], (), ())
                    j = _TENSOR_PRODUCT[PARTIAL_TENSOR[o[0]]]
                    for side, e in ((0, intra1), (1, intra2)):
                        amount = e.at(o[1])
                        if amount:
                            for i, a in Yexpr(path, v, k, j):
                                comm[side].append((i, amount * a))
                                opt_of[i] = k
            # configurations and transitions
            if node.preds:
                pred_sets = [options.choices(pg.nodes[u]) for u in node.preds]
                zs = []
                for pc in itertools.product(*pred_sets):
                    for c in options.choices(node):
                        zi = b.var(f"z_{path or 'root'}_{v}_{'_'.join(x.value for x in pc)}__{c.value}", 0, 1)
                        zs.append((tuple(pc), c, zi))
                for c in options.choices(node):
                    b.constraint("edge_link", f"edge_link_{path or 'root'}_{v}_own_{c.value}",
                                 [(zi, 1.0) for pc, cc, zi in zs if cc == c] + [(i, -1.0) for i, _ in x_terms(path, v, c)],
                                 "==", 0.0)
                for p_, u in enumerate(node.preds):
                    for cu in options.choices(pg.nodes[u]):
                        b.constraint("edge_link", f"edge_link_{path or 'root'}_{v}_pred{p_}_{cu.value}",
                                     [(zi, 1.0) for pc, cc, zi in zs if pc[p_] == cu]
                                     + [(i, -1.0) for i, _ in x_terms(path, u, cu)], "==", 0.0)
                R_of_opt: dict[int, list[int]] = {}
                R_of_cfg: dict[int, list[int]] = {}
                for pc, c, zi in zs:
                    full1, full2 = node_comm(d, c, pc, node.fractions)
                    intra1, intra2 = node_comm(d, c, (), ())
                    tr1, tr2 = full1 + intra1 * -1.0, full2 + intra2 * -1.0
                    if node.is_join and exchanges(full1, full2, c):
                        a_terms, a_const = alive[path, v]
                        if not a_terms and a_const == 1.0:
                            lat_terms.append((zi, 1.0))
                        else:
                            lam = b.var(f"lat_{path or 'root'}_{v}_{zi}", 0, 1)
                            b.constraint("epigraph", f"lat_{path or 'root'}_{v}_{zi}",
                                         [(lam, 1.0), (zi, -1.0)] + [(i, -a) for i, a in a_terms], ">=", a_const - 1.0)
                            lat_terms.append((lam, 1.0))
                    for k, o in enumerate(opts):
                        if o[0] != c:
                            continue
                        a1, a2 = tr1.at(o[1]), tr2.at(o[1])
                        r = b.var(f"R_{path or 'root'}_{v}_{zi}_{k}", 0, 1)
                        R_of_opt.setdefault(k, []).append(r)
                        R_of_cfg.setdefault(zi, []).append(r)
                        if a1 or a2:
                            comm[0].append((r, a1))
                            comm[1].append((r, a2))
                            opt_of[r] = k
                # R[k,o] = z_k * Y[o,bi]: disaggregated over configurations (per option) and over
                # options (per configuration; at the root P_bi = 1 so this is the transportation polytope)
                root = not P[path, v]["bi"][0]
                for k, rs in R_of_opt.items():
                    b.constraint("share_link", f"Rsum_{path or 'root'}_{v}_{k}",
                                 [(r, 1.0) for r in rs] + [(i, -a) for i, a in Yexpr(path, v, k, "bi")], "==", 0.0)
                for zi, rs in R_of_cfg.items():
                    b.constraint("share_link", f"Rcfg_{path or 'root'}_{v}_{zi}",
                                 [(r, 1.0) for r in rs] + [(zi, -1.0)], "==" if root else "<=", 0.0)
            if not time_obj:
                for side in (0, 1):
                    for i, a in comm[side]:
                        b.objective(i, a * scale)
                continue
            # per-option disaggregation (valid because an inactive option's terms are all 0):
            # t >= sum_o T_o, T_o >= that option's leaf time + communication on each side. It forbids the
            # LP relaxation from balancing the two sides by mixing options (the max of the mixture).
            by_opt: list[tuple[list, list]] = [([], []) for _ in opts]
            for side, child_path, child in ((0, path + "L", group.left), (1, path + "R", group.right)):
                for k, o in enumerate(opts):
                    if child.is_leaf and not node.is_join:
                        f = factors(o[0], o[1])[side]["bio"] * d.flops / child.device.flops_per_s
                        if f:
                            by_opt[k][side].extend((i, a * f * scale) for i, a in Yexpr(path, v, k, "bio"))
                    if lat_const:
                        by_opt[k][side].append((o[2], lat * scale))
            for side in (0, 1):
                for i, a in comm[side]:
                    k = opt_of.get(i)
                    if k is not None:
                        by_opt[k][side].append((i, a * kb * scale))
            T = []
            for k, (left, right) in enumerate(by_opt):
                if not left and not right:
                    continue
                tk = b.var(f"T_{path or 'root'}_{v}_{k}", 0.0, math.inf)
                T.append(tk)
                for side, terms_o in enumerate((left, right)):
                    b.constraint("epigraph", f"epigraph_{path or 'root'}_{v}_{k}_{'LR'[side]}",
                                 [(tk, 1.0)] + [(i, -a) for i, a in terms_o], ">=", 0.0)
            if T:
                b.constraint("epigraph", f"epigraph_{path or 'root'}_{v}_options",
                             [(t[path, v], 1.0)] + [(tk, -1.0) for tk in T], ">=", 0.0)
            for side, child_path, child in ((0, path + "L", group.left), (1, path + "R", group.right)):
                terms = [(t[path, v], 1.0)]
                if child.is_leaf:
                    if not node.is_join:
                        fl = d.flops / child.device.flops_per_s
                        terms += [(i, -a * fl * scale) for i, a in P[child_path, v]["bio"][0]]
                else:
                    terms.append((t[child_path, v], -1.0))
                terms += [(i, -a * lat * scale) for i, a in lat_terms]
                terms += [(i, -a * kb * scale) for i, a in comm[side]]
                b.constraint("epigraph", f"epigraph_{path or 'root'}_{v}_{'LR'[side]}", terms, ">=",
                             lat_const * lat * scale)
    if time_obj:
        for v in range(n):
            b.objective(t["", v], 1.0)

    notes = [f"joint model over {len(groups)} splits; shares on a grid of {share_grid} intervals plus the "
             "proportional share" + (" and the given plan's shares" if include is not None else "")
             + "; exact for those shares"]
    if memory_limit_bytes is not None:
        for path, group in groups.items():
            for side, child_path, child in ((0, path + "L", group.left), (1, path + "R", group.right)):
                if not child.is_leaf:
                    continue
                cap = child.device.memory_bytes if memory_limit_bytes == "device" else float(memory_limit_bytes)
                terms = []
                for v, node in enumerate(pg.nodes):
                    if node.is_join:
                        continue
                    d = dims[v]
                    terms += [(i, a * 2 * d.weight_elements * bpe / GIB) for i, a in P[child_path, v]["io"][0]]
                    terms += [(i, a * d.in_elements * bpe / GIB) for i, a in P[child_path, v]["bi"][0]]
                b.constraint("memory", f"memory_{child_path}", terms, "<=", cap / GIB)
        notes.append("memory checked exactly per device")
    model = b.build(objective_unit="s" if time_obj else "elements", objective_scale=scale,
                    exact=True, notes=tuple(notes))
    decoder = JointDecoder(MappingProxyType({p: tuple(tuple(o) for o in ys[p]) for p in groups}))
    return model, decoder


def solve_joint(problem, backend, options, solve_options, memory_limit_bytes, share_grid, level, progress=None):
    """Solve the joint model (with ``level``'s plan as extra share options) and return an
    :class:`~parplan.solvers.exact.ExactResult` for the better plan, its certificate saying
    how much the joint optimum improves on level-by-level."""
    from parplan.costmodel.evaluate import evaluate
    from parplan.solvers.backends.registry import backend_spec, get_backend
    from parplan.solvers.exact import GAP_TOL, Certificate, ExactResult, price_of

    spec = backend_spec(backend)
    if not spec.supports_continuous:
        raise ConfigError(f"the joint model has continuous variables; backend '{spec.name}' cannot solve it: "
                          "use scip, cbc or highs")
    grid = DEFAULT_JOINT_GRID if share_grid is None else share_grid
    if progress is not None:
        progress(f"building the joint model (share grid {grid})")
    model, decoder = build_joint(problem, options, memory_limit_bytes, grid, include=level.plan)
    if progress is not None:
        progress(f"solving the joint model: {model.describe()}")
    raw = get_backend(spec.name).solve(model, solve_options)
    lbl = level.certificate
    notes = list(model.notes)
    if not raw.has_solution:
        notes.append(f"joint model: {raw.termination.value} without a plan; the level-by-level plan is kept")
        status = "time_limit" if raw.termination.value == "time_limit" else lbl.status
        return replace(level, certificate=replace(lbl, notes=lbl.notes + tuple(notes), scope="joint", status=status,
                                                  wall_s=lbl.wall_s + raw.wall_s))
    plan = decoder(raw)
    plan = Plan(plan.splits, planner=f"exact-joint-{spec.name}",
                info={"objective": options.objective.value, "shares": options.shares.value, "scope": "joint"})
    ev = evaluate(problem, plan)
    price = price_of(ev, options)
    model_obj = raw.objective / model.objective_scale
    grid_bound = None if raw.bound is None else raw.bound / model.objective_scale
    base = lbl.objective
    if base is not None:
        gain = (base - price) / base
        notes.append(f"joint vs level-by-level: {price:.9g} vs {base:.9g} ({gain:+.3%} improvement)")
    notes.append(f"joint model ({raw.termination.value}): objective {model_obj:.9g}, bound "
                 f"{'n/a' if grid_bound is None else f'{grid_bound:.9g}'} (bound for the model's shares only)")
    timed_out = raw.termination.value == "time_limit"
    if level.plan is not None and base is not None and price > base * (1 + 1e-12):
        notes.append("the joint plan is worse than level-by-level (time limit?): level-by-level plan kept")
        return replace(level, certificate=replace(lbl, notes=lbl.notes + tuple(notes), scope="joint",
                                                  status="time_limit" if timed_out else lbl.status,
                                                  wall_s=lbl.wall_s + raw.wall_s))
    bound = lbl.bound
    gap = None if bound is None else max(0.0, (price - bound) / price) if price else 0.0
    if timed_out:
        status = "time_limit"
    elif gap is not None and gap <= GAP_TOL and raw.termination.value == "optimal":
        status = "optimal"
    else:
        status = "feasible"
    cert = Certificate(
        status=status, termination=raw.termination.value, has_solution=True, objective=price,
        model_objective=model_obj, bound=bound, gap=gap, unit=model.objective_unit, backend=spec.name,
        solver=raw.solver, version=raw.version, wall_s=lbl.wall_s + raw.wall_s, scope="joint",
        notes=tuple(notes) + ("bound: the root split's (valid for every plan, any shares)",),
        model_size=model.describe(), splits=lbl.splits,
    )
    return ExactResult(plan, cert, ev)


__all__ = ["DEFAULT_JOINT_GRID", "JOINT_MAX_DEPTH", "JointDecoder", "build_joint", "factors", "solve_joint"]
