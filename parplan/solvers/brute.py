"""Brute force over every state assignment of a small split (the DP's and the MIP's referee).

Every assignment of a state (choice and grid share) to every planning node is priced at once:
the nodes' cost tables (:func:`parplan.costmodel.split.node_factor`) are added over the full
joint table of all nodes' states, and the cheapest cell (ties to the lowest, as the DP breaks
them) is returned. It is exponential (``states ^ nodes``) and refuses splits whose joint table
exceeds :data:`MAX_CELLS`. :func:`brute_force` plans every split top-down this way and prices
the plan with the evaluator.

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> p = Problem(get_model("lenet"), parse_array("tpu-v2:1,tpu-v3:1"), batch=64)
    >>> opts = PlanOptions(share_grid=2)
    >>> value, split = brute_force_split(SplitProblem.root(p), opts)
    >>> from parplan.solvers.dp import frontier_dp
    >>> abs(value - frontier_dp(SplitProblem.root(p), opts)[0]) <= 1e-12 * value
    True
"""

from __future__ import annotations

import numpy as np

from parplan.costmodel.cost import REL_TOL
from parplan.costmodel.evaluate import Evaluation, evaluate, price_of
from parplan.costmodel.problem import Plan, Problem, Split
from parplan.costmodel.split import PlanOptions, SplitProblem, node_factor, split_tables
from parplan.errors import ConfigError
from parplan.solvers.hierarchy import plan_top_down

#: Largest joint table (cells) brute force builds.
MAX_CELLS = 2 * 10**7


def brute_force_split(
    sp: SplitProblem, options: PlanOptions, capacity_bytes: tuple[float, float] | None = None
) -> tuple[float, Split | None]:
    """(optimal objective, split) of one split by enumeration of the joint table. With
    ``capacity_bytes`` only assignments whose memory on each side (summed over the nodes'
    states) is within it count; ``(inf, None)`` when none is."""
    n = len(sp.planning.nodes)
    tables = split_tables(sp, options)
    shape = tuple(t.size for t in tables)
    cells = float(np.prod(shape, dtype=float))
    if cells > MAX_CELLS:
        raise ConfigError(
            f"graph '{sp.planning.name}': brute force would enumerate {cells:.3g} assignments "
            f"(limit {MAX_CELLS:.3g}); use the DP or the exact solver, or a coarser share grid"
        )
    total = np.zeros(shape)
    for u in range(n):
        scope, table = node_factor(sp, tables, u, options)
        total = total + table.reshape([shape[w] if w in scope else 1 for w in range(n)])
    if capacity_bytes is not None:
        blocks = sp.planning.blocks

        def along(v, x):
            return x.reshape([shape[v] if w == v else 1 for w in range(n)])

        for i, cap in enumerate(capacity_bytes):
            used = np.zeros(shape)
            held: dict[int, np.ndarray] = {}  # a recomputed block's activations (section 6.3)
            for v, t in enumerate(tables):
                used = used + along(v, t.memory[i])
                if sp.dims[v].recompute and sp.dims[v].checkpoint >= 0:  # a checkpointed block
                    held[blocks[v]] = held.get(blocks[v], 0.0) + along(v, t.activations[i])
            if held:
                used = used + np.maximum.reduce([np.broadcast_to(x, shape) for x in held.values()])
            if sp.side.zero_stage >= 3:  # the largest FSDP unit's gathered weights (section 6.1)
                units = sp.planning.units
                gathered: dict[int, np.ndarray] = {}
                for v, t in enumerate(tables):
                    gathered[units[v]] = gathered.get(units[v], 0.0) + along(v, t.gathered[i])
                used = used + np.maximum.reduce(
                    [np.broadcast_to(x, shape) for x in gathered.values()]
                )
            total = np.where(used <= cap * (1 + 1e-12), total, np.inf)
    flat = total.ravel()
    best = flat.min()
    if not np.isfinite(best):
        return float("inf"), None
    cell = int(np.argmax(flat <= best + REL_TOL * abs(best)))
    state = np.unravel_index(cell, shape)
    choices = tuple(tables[v].choices[state[v]] for v in range(n))
    shares = tuple(float(tables[v].shares[state[v]]) for v in range(n))
    return float(flat[cell]), Split(choices, shares)


def brute_force(problem: Problem, options: PlanOptions | None = None) -> tuple[Plan, Evaluation]:
    """Plan every split of ``problem`` by brute force (top-down), priced by the evaluator."""
    options = PlanOptions() if options is None else options
    plan = plan_top_down(problem, lambda sp: brute_force_split(sp, options)[1], "brute-force")
    return plan, evaluate(problem, plan)


#: Most whole-hierarchy plans :func:`brute_force_global` prices.
MAX_GLOBAL_PLANS = 20_000


def brute_force_global(
    problem: Problem, options: PlanOptions | None = None
) -> tuple[Plan, Evaluation]:
    """The global optimum over every plan of the whole hierarchy on ``options``' share points:
    each split's states chosen independently (no top-down recursion), every combination priced
    by the evaluator; ties to the first in enumeration order. The referee for whole-array
    planners on tiny instances (a few nodes, two or three splits); refuses more than
    :data:`MAX_GLOBAL_PLANS` plans."""
    import itertools

    from parplan.costmodel.cost import share_points

    options = PlanOptions() if options is None else options
    paths = [path for path, _ in problem.array.inner_nodes()]
    per_split = []
    for path, group in problem.array.inner_nodes():
        shares = share_points(problem.side_spec(group), options.shares, options.share_grid)
        states = [
            [(c, a) for c in options.choices(node) for a in shares]
            for node in problem.planning.nodes
        ]
        per_split.append(list(itertools.product(*states)))
    total = float(np.prod([len(s) for s in per_split], dtype=float))
    if total > MAX_GLOBAL_PLANS:
        raise ConfigError(
            f"brute force over the whole hierarchy would price {total:.3g} plans (limit "
            f"{MAX_GLOBAL_PLANS:,}); use fewer nodes, devices or share points"
        )
    best: tuple[float, Plan, Evaluation] | None = None
    for combo in itertools.product(*per_split):
        plan = Plan(
            {
                path: Split(tuple(c for c, _ in states), tuple(a for _, a in states))
                for path, states in zip(paths, combo)
            },
            planner="brute-force-global",
        )
        ev = evaluate(problem, plan)
        if best is None or price_of(ev, options) < best[0]:
            best = (price_of(ev, options), plan, ev)
    return best[1], best[2]


__all__ = [
    "MAX_CELLS",
    "MAX_GLOBAL_PLANS",
    "brute_force",
    "brute_force_global",
    "brute_force_split",
]
