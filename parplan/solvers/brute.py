"""Brute force over every choice assignment of a small split (the exact solver's referee).

Every assignment of choices to the planning nodes (types of weighted layers, layouts of
joins) is priced with the cost model: each node's share is the best one for its
configuration (:func:`parplan.costmodel.cost.node_cost`, i.e. ``best_share`` for free shares),
summed over nodes. The cheapest assignment (ties to the earliest in BATCH, IN, OUT order) is
returned; :func:`brute_force` then prices its plan with the evaluator. It is exponential
(3^nodes) and refuses graphs with more than :data:`MAX_WEIGHTED` weighted layers or more than
:data:`MAX_ASSIGNMENTS` assignments. No memory limit (shares are each configuration's best).

Example:
    >>> from parplan.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> p = Problem(get_model("lenet"), parse_array("tpu-v2:1,tpu-v3:1"), batch=64)
    >>> value, split = brute_force_split(SplitProblem.root(p), PlanOptions())
    >>> from parplan.solvers.dp import frontier_dp
    >>> abs(value - frontier_dp(SplitProblem.root(p), PlanOptions())[0]) <= 1e-12 * value
    True
"""

from __future__ import annotations

import itertools

from parplan.costmodel.cost import REL_TOL
from parplan.costmodel.evaluate import Evaluation, evaluate
from parplan.costmodel.problem import Plan, Problem, Split
from parplan.errors import ConfigError
from parplan.solvers.dp import PlanOptions, SplitProblem
from parplan.solvers.hierarchy import plan_top_down

#: Most weighted layers a brute-force split accepts.
MAX_WEIGHTED = 8
#: Most assignments a brute-force split enumerates (joins add choices too).
MAX_ASSIGNMENTS = 3**10


def brute_force_split(sp: SplitProblem, options: PlanOptions) -> tuple[float, Split]:
    """(optimal objective, split) of one split by enumeration."""
    nodes = sp.planning.nodes
    weighted = sum(not n.is_join for n in nodes)
    if weighted > MAX_WEIGHTED:
        raise ConfigError(f"graph '{sp.planning.name}': brute force enumerates 3^n assignments and is limited "
                          f"to {MAX_WEIGHTED} weighted layers (got {weighted}); use the DP or the exact solver")
    sets = [options.choices(n) for n in nodes]
    count = 1
    for s in sets:
        count *= len(s)
    if count > MAX_ASSIGNMENTS:
        raise ConfigError(f"graph '{sp.planning.name}': {count} assignments exceed the brute-force limit of "
                          f"{MAX_ASSIGNMENTS}; use the DP or the exact solver")
    memo: dict[tuple, tuple[float, float]] = {}

    def cost(v: int, c, pc) -> tuple[float, float]:
        key = (v, c, pc)
        if key not in memo:
            memo[key] = sp.cost(v, c, pc, options)
        return memo[key]

    best: tuple[float, tuple, tuple] | None = None
    for assignment in itertools.product(*sets):
        total, shares = 0.0, []
        for v, node in enumerate(nodes):
            share, val = cost(v, assignment[v], tuple(assignment[u] for u in node.preds))
            total += val
            shares.append(share)
        if best is None or total < best[0] - REL_TOL * abs(best[0]):
            best = (total, assignment, tuple(shares))
    value, choices, shares = best
    return value, Split(tuple(choices), shares)


def brute_force(problem: Problem, options: PlanOptions | None = None) -> tuple[Plan, Evaluation]:
    """Plan every split of ``problem`` by brute force (top-down), priced by the evaluator."""
    options = PlanOptions() if options is None else options
    plan = plan_top_down(problem, lambda sp: brute_force_split(sp, options)[1], "brute-force")
    return plan, evaluate(problem, plan)


__all__ = ["MAX_ASSIGNMENTS", "MAX_WEIGHTED", "brute_force", "brute_force_split"]
