"""Layer-wise dynamic programming over one split (SPEC sections 4 and 6).

The cost of a node depends on its own choice and its predecessors' choices (the share is
optimised per node for each such configuration, see :func:`parplan.costmodel.cost.best_share`).
The DP walks the nodes in topological order keeping, for every assignment of choices to the
*frontier* (nodes already decided whose consumers are not all decided), the cheapest cost of
the decided part. On a chain the frontier is one node and this is the classic layer-wise DP;
on a residual block it is the fork (and the join's inputs), i.e. AccPar's enumeration of the
types at fork and join. It is exact on every DAG; its cost grows as 3^(frontier width), and
graphs wider than ``max_states`` states are refused with a pointer to the exact solver.

Example:
    >>> from parplan.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> p = Problem(get_model("vgg16"), parse_array("tpu-v2:1,tpu-v3:1"), batch=64)
    >>> split = solve_split(SplitProblem.root(p), PlanOptions())
    >>> len(split.choices) == len(p.planning.nodes)
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from parplan.costmodel.cost import REL_TOL, Objective, ShareMode, SideSpec, floored_time, node_cost
from parplan.costmodel.dims import LayerDims
from parplan.costmodel.layout import Choice, PartitionType
from parplan.costmodel.planning import PlanNode, PlanningGraph
from parplan.costmodel.problem import Problem, Split
from parplan.errors import ConfigError, SolverError


def all_choices(node: PlanNode) -> tuple[Choice, ...]:
    """Every choice of a node (three types, or three join layouts)."""
    return node.choices


@dataclass(frozen=True)
class PlanOptions:
    """Planner settings: objective, share mode, and which choices each node may take."""

    objective: Objective = Objective.TIME
    shares: ShareMode = ShareMode.FREE
    allowed: Callable[[PlanNode], tuple[Choice, ...]] = field(default=all_choices)

    def __post_init__(self):
        if self.objective is Objective.COMMUNICATION and self.shares is ShareMode.FREE:
            raise ConfigError(
                "objective 'communication' needs fixed shares (free shares would put all work on one "
                "side to move nothing): use shares 'half' or 'proportional'"
            )

    def choices(self, node: PlanNode) -> tuple[Choice, ...]:
        allowed = tuple(self.allowed(node))
        if not allowed:
            raise ConfigError(f"node '{node.name}': the planner allows no choice for it")
        return allowed


@dataclass(frozen=True)
class SplitProblem:
    """One split to plan: the planning graph, every node's dims at this level, the cost view."""

    planning: PlanningGraph
    dims: tuple[LayerDims, ...]
    side: SideSpec
    path: str = ""
    #: Per-node time (s) below which this split gains nothing: the sibling group's time for the
    #: node at the parent split (a node's time there is the max over both groups). None = 0.
    floor_s: tuple[float, ...] | None = None
    #: Per node: an enclosing split chose BATCH and paid the all-reduce (collective arrays only).
    covered: tuple[bool, ...] | None = None

    @classmethod
    def root(cls, problem: Problem) -> "SplitProblem":
        return cls(problem.planning, problem.root_dims(), problem.side_spec(problem.array), "")

    def cost(self, v: int, choice: Choice, pred_choices: tuple[Choice, ...], options: PlanOptions):
        """(share, value) of node ``v`` (see :func:`parplan.costmodel.cost.node_cost`)."""
        node = self.planning.nodes[v]
        share, value = node_cost(self.dims[v], choice, pred_choices, node.fractions, self.side,
                                 options.objective, options.shares,
                                 bool(self.covered[v]) if self.covered is not None else False)
        if self.floor_s is not None and options.objective is Objective.TIME:
            value = floored_time(value, self.floor_s[v])
        return share, value


def solve_split(sp: SplitProblem, options: PlanOptions, max_states: int = 3**9) -> Split:
    """Optimal choices and shares for one split under ``options`` (exact on any DAG)."""
    value, split = frontier_dp(sp, options, max_states)
    return split


def frontier_dp(sp: SplitProblem, options: PlanOptions, max_states: int = 3**9) -> tuple[float, Split]:
    """(optimal objective, split). Ties go to the earliest choices in BATCH, IN, OUT order."""
    nodes = sp.planning.nodes
    succs = sp.planning.succs
    last_use = [max(s) if s else v for v, s in enumerate(succs)]
    live: list[int] = []
    # state key: choices of the live nodes (in `live` order) -> (cost, back-link)
    states: dict[tuple, tuple[float, tuple | None]] = {(): (0.0, None)}
    allowed = [options.choices(node) for node in nodes]
    for v, node in enumerate(nodes):
        choices = allowed[v]
        pos = [live.index(u) for u in node.preds]
        memo: dict[tuple, tuple[float, float]] = {}
        new_states: dict[tuple, tuple[float, tuple | None]] = {}
        # states are keyed by small ints (index into each live node's allowed choices): hashing
        # enums dominates otherwise
        for key, (cost, link) in states.items():
            pk = tuple(key[p] for p in pos)
            for ci in range(len(choices)):
                if (pk, ci) not in memo:
                    pc = tuple(allowed[u][k] for u, k in zip(node.preds, pk))
                    memo[pk, ci] = sp.cost(v, choices[ci], pc, options)
                share, val = memo[pk, ci]
                nk = key + (ci,)
                total = cost + val
                old = new_states.get(nk)
                if old is None or total < old[0] - REL_TOL * abs(old[0]):
                    new_states[nk] = (total, (v, ci, share, link))
        live.append(v)
        keep = [i for i, u in enumerate(live) if last_use[u] > v]
        if len(keep) < len(live):
            projected: dict[tuple, tuple[float, tuple | None]] = {}
            for key, val in new_states.items():
                pk = tuple(key[i] for i in keep)
                old = projected.get(pk)
                if old is None or val[0] < old[0] - REL_TOL * abs(old[0]):
                    projected[pk] = val
            new_states = projected
            live = [live[i] for i in keep]
        if len(new_states) > max_states:
            raise SolverError(
                f"graph '{sp.planning.name}': the DP frontier reached {len(new_states)} states at node "
                f"'{node.name}' (limit {max_states}); use the exact solver (parplan solve) for this graph"
            )
        states = new_states
    (value, link), = states.values()
    choices: list[Choice | None] = [None] * len(nodes)
    shares = [0.0] * len(nodes)
    while link is not None:
        v, ci, share, link = link
        choices[v], shares[v] = allowed[v][ci], share
    return value, Split(tuple(choices), tuple(shares))


__all__ = ["PlanOptions", "SplitProblem", "all_choices", "frontier_dp", "solve_split", "PartitionType"]
