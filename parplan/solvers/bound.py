"""A global lower bound on the step time of every plan of a whole hierarchy
(docs/costmodel.md section 8, "Global bound").

The evaluator prices a node at a group as ``max`` over the two children of (the child's time
for the node + that side's communication at this split), and a step as the sum over nodes
(section 7). Dropping every re-layout between nodes (each is >= 0) leaves, per node, only
terms of the node itself: its compute at the devices, and at every split it divides with work
on both sides, its intra-layer reduction (the partial sum its type leaves, section 2) and the
link latency. The nodes then decouple, and for each node

    LB_g(d) = min( LB_L(d), LB_R(d),                                    one side does it all
                   min over choice c and share a in (0, 1) of
                   max(LB_L(d_L(c, a)) + comm_L(c, d), LB_R(d_R(c, a)) + comm_R(c, d)) )

with ``LB`` of a device its compute time at dims ``d``, is at most the node's time at group
``g`` under any plan (by induction: ``LB`` is nondecreasing in B, Di and Do, since compute and
every reduction are). The step-time bound is the sum over nodes at the root dims. Shares are
continuous:

- **Interchangeable children** (same devices and structure, same link each way): for each
  choice the best share is exactly 1/2 (with ``g`` nondecreasing, ``max(g(a), g(1 - a)) >=
  g(1/2)``), so the recursion over a homogeneous group only halves dims;
- **other splits**: shares in ``share_grid`` intervals, each priced at its ends that make the
  children smallest (``lo`` for the left, ``1 - hi`` for the right); the left term grows and
  the right term shrinks with the interval, so a bisection finds the best interval exactly.

Unlike the root-split bound (each half one device of summed throughput), this one charges each
half's own reductions: data parallelism's weight exchange at every level, a model-parallel
split's partial sums. It ignores re-layouts between nodes and, on collective arrays, the
BATCH all-reduce (an enclosing split may have paid it).

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.costmodel.evaluate import evaluate
    >>> from parplan.solvers.planners import make_plan
    >>> p = Problem(get_model("alexnet"), parse_array("h100:8"), batch=256)
    >>> b = hierarchy_bound(p)
    >>> 0 < b.bound_s <= evaluate(p, make_plan(p, "accpar")).step_time_s
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from parplan.costmodel.cost import intra_elements, receive_seconds, scale_for_sides, side_dims
from parplan.costmodel.layout import Layout, PartitionType
from parplan.costmodel.dims import LayerDims
from parplan.costmodel.hardware import ArrayNode, signature
from parplan.costmodel.problem import Problem
from parplan.errors import ConfigError

__all__ = ["GlobalBound", "hierarchy_bound", "root_dp_bound", "global_bound", "raised_tables", "DEFAULT_BOUND_GRID"]

#: Share intervals per heterogeneous split (bisection: ~log2 of it evaluations per choice).
DEFAULT_BOUND_GRID = 1024


@dataclass(frozen=True)
class GlobalBound:
    """``bound_s``: no plan of the problem has a shorter step; ``node_s``: each node's share of it."""

    bound_s: float
    node_s: tuple[float, ...]
    share_grid: int


class _Bound:
    """Memoised ``LB_g(d)`` for one node's choices over the array's groups."""

    def __init__(self, problem: Problem, grid: int):
        self.bpe = problem.bytes_per_element
        self.collective = problem.array.collective is not None
        self.grid = grid
        self.memo: dict[tuple, float] = {}
        self.sig: dict[int, int] = {}
        self.ids: dict[tuple, int] = {}
        self.devices: dict[int, object] = {}
        self.sides: dict[int, object] = {}
        self.problem = problem

    def signature(self, group: ArrayNode) -> int:
        """A small integer per structurally distinct group (cheap to hash in the memo keys)."""
        if id(group) not in self.sig:
            self.sig[id(group)] = self.ids.setdefault(signature(group), len(self.ids))
        return self.sig[id(group)]

    def comm(self, group: ArrayNode, dims: LayerDims, choice) -> tuple[float, float]:
        """Each side's seconds for the node's own reduction when both sides have work."""
        size = intra_elements(dims, choice)
        if self.collective and choice in (PartitionType.BATCH, Layout.ROWS):
            size = 0.0  # an enclosing split may have paid the all-reduce (covered)
        if id(group) not in self.sides:
            self.sides[id(group)] = self.problem.side_spec(group)
        side = self.sides[id(group)]
        return receive_seconds(side, 0, size), receive_seconds(side, 1, size)

    def lb(self, group: ArrayNode, dims: LayerDims, choices) -> float:
        key = (self.signature(group), dims.batch, dims.in_features, dims.out_features)
        if key in self.memo:
            return self.memo[key]
        if group.is_leaf:
            if id(group) not in self.devices:
                self.devices[id(group)] = group.device.as_device()
            self.memo[key] = dims.compute_seconds(self.devices[id(group)], self.bpe)
            return self.memo[key]
        left, right = group.left, group.right
        best = min(self.lb(left, dims, choices), self.lb(right, dims, choices))
        same = self.signature(left) == self.signature(right) and len(set(group.link.side_bytes_per_s)) == 1
        for c in choices:
            c1, c2 = self.comm(group, dims, c)
            if same:
                half = scale_for_sides(dims, c, 0.5)[0]
                best = min(best, self.lb(left, half, choices) + max(c1, c2))
            else:
                best = min(best, self._bisect(left, right, dims, c, c1, c2, choices))
        self.memo[key] = best
        return best

    def _bisect(self, left, right, dims, c, c1, c2, choices) -> float:
        """min over intervals [k/G, (k+1)/G] of max(A(k), B(k)), A nondecreasing, B nonincreasing."""
        g = self.grid

        def a(k):  # the left side at the interval's lower end
            return self.lb(left, scale_for_sides(dims, c, k / g)[0], choices) + c1

        def b(k):  # the right side at the interval's upper end
            return self.lb(right, scale_for_sides(dims, c, (k + 1) / g)[1], choices) + c2

        lo, hi = 0, g - 1
        if a(hi) < b(hi):
            return b(hi)
        while lo < hi:  # the first k with A(k) >= B(k)
            mid = (lo + hi) // 2
            if a(mid) >= b(mid):
                hi = mid
            else:
                lo = mid + 1
        return min(a(lo), b(lo - 1)) if lo > 0 else a(lo)


def raised_tables(problem: Problem, sp, options, relaxed: bool = False, solver: _Bound | None = None,
                  per_node: list | None = None):
    """The root split's state tables with each side's compute for a node raised to ``max`` of
    its compute on one summed device and the per-node bound of :func:`hierarchy_bound` for
    that half (at the share that leaves the half least work, for an interval state). Both are
    lower bounds on the half's time, so a DP over these tables still bounds (``relaxed``) or
    estimates the split better: a half is no longer assumed to reach its summed throughput
    when its own reductions would cost more than they save. ``per_node``: a list that receives
    each node's :func:`hierarchy_bound` term too, from the same memo (one pass for both)."""
    from dataclasses import replace

    from parplan.costmodel.split import split_tables

    array = problem.array
    tables = split_tables(sp, options, relaxed)
    solver = solver or _Bound(problem, DEFAULT_BOUND_GRID)
    raised = []
    for v, (node, t) in enumerate(zip(problem.planning.nodes, tables)):
        solver.memo.clear()  # the memo holds one node's LB_g(d)
        d = sp.dims[v]
        if per_node is not None:
            per_node.append(solver.lb(array, d, node.choices))
        compute, steps = t.compute.copy(), t.steps.copy()
        for s, c in enumerate(t.choices):
            for i, (group, share) in enumerate(((array.left, t.lo[s]), (array.right, t.hi[s]))):
                lb = solver.lb(group, side_dims(d, c, float(share), i, bool(t.has[i][s])), node.choices)
                compute[i][s] = max(compute[i][s], lb)
                steps[i][s] = [max(x, lb) for x in steps[i][s]]
        raised.append(replace(t, compute=compute, steps=steps))
    return raised


def root_dp_bound(problem: Problem, share_grid: int = 16) -> float:
    """A second global bound that keeps the root split's re-layouts: the interval relaxation of
    the root split (docs/costmodel.md section 8, every re-layout between nodes priced at the
    ends of its share intervals that make it smallest) over :func:`raised_tables`. Tighter
    where a plan cannot use both halves for some layers without moving activations between
    them (the per-node bound lets each layer choose alone)."""
    return _both(problem, share_grid)[1]


def _both(problem: Problem, share_grid: int = 16) -> tuple[GlobalBound, float]:
    """(:func:`hierarchy_bound`, :func:`root_dp_bound`) in one pass over the nodes."""
    from parplan.costmodel.split import PlanOptions, SplitProblem
    from parplan.solvers.dp import frontier_dp

    if problem.array.is_leaf:
        per_node = hierarchy_bound(problem)
        return per_node, per_node.bound_s
    _check(problem)
    sp = SplitProblem.root(problem)
    options = PlanOptions(share_grid=share_grid)
    nodes: list[float] = []
    tables = raised_tables(problem, sp, options, relaxed=True, per_node=nodes)
    per_node = GlobalBound(math.fsum(nodes), tuple(nodes), DEFAULT_BOUND_GRID)
    return per_node, frontier_dp(sp, options, relaxed=True, tables=tables)[0]


def _check(problem: Problem) -> None:
    if problem.compat is not None:
        raise ConfigError(f"the global bound is for parplan's own cost model (the problem uses compat "
                          f"'{problem.compat}')")


def hierarchy_bound(problem: Problem, share_grid: int = DEFAULT_BOUND_GRID) -> GlobalBound:
    """The global lower bound of the module doc for ``problem`` (shares anywhere in [0, 1]).
    Raises :class:`~parplan.errors.ConfigError` for a compat problem (a paper's pricing rule
    can price a reduction below parplan's, which this bound assumes)."""
    _check(problem)
    dims = problem.root_dims()
    solver = _Bound(problem, share_grid)
    nodes = []
    for node, d in zip(problem.planning.nodes, dims):
        solver.memo.clear()  # the memo holds one node's LB_g(d)
        nodes.append(solver.lb(problem.array, d, node.choices))
    total = math.fsum(nodes)
    return GlobalBound(total, tuple(nodes), share_grid)


def global_bound(problem: Problem) -> GlobalBound:
    """The better of :func:`hierarchy_bound` and :func:`root_dp_bound` (both are lower bounds on
    every plan; ``node_s`` stays the per-node bound's split of its own total)."""
    per_node, root = _both(problem)
    if root > per_node.bound_s:
        return GlobalBound(root, per_node.node_s, per_node.share_grid)
    return per_node
