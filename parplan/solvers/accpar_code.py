"""The published AccPar C++ planner's per-level DP, rule for rule (``compat="accpar-code"``;
docs/costmodel.md section 9).

The C++ (github.com/linghaosong/AccPar, ``dp_on_one_hierarchy``) plans a chain of weighted
layers, one type per layer, shares 1/2, minimising communication. parplan's own DP reproduces
its AlexNet and VGG plans; its ResNets need three more rules, which this module implements:

1. **Shortcut term.** At every shortcut-in layer ``l`` (here: a layer reading a residual add)
   the C++ adds, for each predecessor type ``t'``, the inter-layer cost with Type-II and
   Type-III swapped in both arguments, at layer ``l``'s input size, between the *block-start*
   layer's type and ``l``'s type. The block-start type is not in the DP state: it is read from
   the back-pointers of ``(l - 1, t')`` (one step for ResNet-18/34, two for ResNet-50).
2. **Running minimum.** The minimum over ``t'`` starts at the Type-I predecessor *without* the
   shortcut term, and is replaced only by a strictly smaller candidate.
3. **Ties.** The last layer takes the lowest type among equal costs; the rest follow the
   back-pointers (the lowest predecessor type among equal candidates).

A graph has a *C++ view* when its weighted nodes form a chain, each reading the previous one
directly or through one residual add whose other input is what an earlier weighted node (the
block start) reads: the form :func:`~parplan.models.modelfile.load_layer_table` builds from a
table's ``shortcut`` column. Costs come from parplan's own pricing of that chain in the C++'s
frames (each node's intra-layer term and each chain edge's term; the shortcut term is the edge
term with types swapped), so the two agree on every number the C++ prints for AlexNet and VGG.
A residual add takes the layout its reader needs (the C++ has no add to plan).

Example (the C++'s ResNet-18 at the root split, 3 types):
    >>> from pathlib import Path
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.costmodel.split import PlanOptions, SplitProblem
    >>> from parplan.costmodel.cost import Objective, ShareMode
    >>> from parplan.models.modelfile import load_layer_table
    >>> table = Path(__file__).resolve().parents[1] / "data" / "accpar_cpp" / "resnet18.csv"
    >>> p = Problem(load_layer_table(table), parse_array("h100:2"), batch=512, compat="accpar-code")
    >>> view = cpp_view(p.planning)
    >>> [p.planning.nodes[view.order[e]].name for e in sorted(view.shortcuts)][:2]
    ['cv24', 'cv36']
    >>> split, value = solve_split_cpp(SplitProblem.root(p), PlanOptions(Objective.COMMUNICATION, ShareMode.HALF))
    >>> [c.roman for c in split.choices if c.__class__.__name__ == "PartitionType"][-2:], value
    (['I', 'II'], 27158912.0)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from parplan.costmodel.cost import (
    REL_TOL,
    Objective,
    ShareMode,
    node_terms,
    node_value,
    scale_for_sides,
)
from parplan.costmodel.layout import PartitionType, ports
from parplan.costmodel.planning import PlanningGraph
from parplan.costmodel.problem import Plan, Problem, Split
from parplan.costmodel.split import PlanOptions, SplitProblem, split_tables

__all__ = ["CppView", "cpp_view", "cpp_tables", "cpp_dp", "cpp_level_comm", "solve_split_cpp"]

#: Type-II and Type-III exchanged (the C++'s ``Com_Cost_Inter_Layer_Block``).
_SWAP = {
    PartitionType.BATCH: PartitionType.BATCH,
    PartitionType.IN: PartitionType.OUT,
    PartitionType.OUT: PartitionType.IN,
}


@dataclass(frozen=True)
class CppView:
    """The C++'s view of a planning graph: the weighted nodes in chain order (planning
    indices), the residual add each reads (planning index or None), and the shortcuts as
    {position of the shortcut-in layer: position of its block start}."""

    order: tuple[int, ...]
    joins: tuple[int | None, ...]
    shortcuts: dict[int, int]


def cpp_view(planning: PlanningGraph) -> CppView | None:
    """The C++ view of ``planning``, or None when the graph is not a chain with residual adds."""
    nodes = planning.nodes
    order = tuple(v for v, n in enumerate(nodes) if not n.is_join)
    pos = {v: i for i, v in enumerate(order)}
    joins: list[int | None] = []
    shortcuts: dict[int, int] = {}
    used = set()
    for i, v in enumerate(order):
        preds = nodes[v].preds
        prev = order[i - 1] if i else None
        if i == 0:
            if preds:
                return None
            joins.append(None)
            continue
        if preds == (prev,):
            joins.append(None)
            continue
        if len(preds) != 1 or not nodes[preds[0]].is_join:
            return None
        j = preds[0]
        jp = nodes[j].preds
        if len(jp) != 2 or prev not in jp or j in used:
            return None
        source = jp[1] if jp[0] == prev else jp[0]
        readers = [
            w for w in planning.succs[source] if not nodes[w].is_join and w in pos and pos[w] < i
        ]
        if len(readers) != 1:
            return None
        used.add(j)
        joins.append(j)
        shortcuts[i] = pos[readers[0]]
    if len(used) != sum(n.is_join for n in nodes):
        return None
    return CppView(order, tuple(joins), shortcuts)


def _chain(sp: SplitProblem, view: CppView) -> SplitProblem:
    """The split problem of the view's chain (weighted nodes only, each reading the previous)."""
    nodes = []
    for i, v in enumerate(view.order):
        node = sp.planning.nodes[v]
        prev = sp.planning.nodes[view.order[i - 1]].name if i else None
        nodes.append(
            replace(
                node,
                preds=(i - 1,) if i else (),
                fractions=(1.0,) if i else (),
                sources=(prev,) if i else (),
                absorbed=(),
            )
        )

    def pick(values):
        return None if values is None else tuple(values[v] for v in view.order)

    return replace(
        sp,
        planning=PlanningGraph(sp.planning.name, tuple(nodes)),
        dims=pick(sp.dims),
        floor_s=pick(sp.floor_s),
        covered=pick(sp.covered),
        regions=pick(sp.regions),
        root_dims=pick(sp.root_dims),
        above=pick(sp.above),
    )


def cpp_tables(sp: SplitProblem, view: CppView, options: PlanOptions):
    """(tables, intra, inter, shortcut) over the view's chain: per position ``l`` the states'
    intra-layer values ``intra[l][s]``, the edge into ``l`` as ``inter[l][s', s]`` (state of
    ``l - 1``, state of ``l``), and for shortcut-in positions ``shortcut[l][s_start, s]`` (the
    edge with Type-II and Type-III swapped; None without three types)."""
    chain = _chain(sp, view)
    tables = split_tables(chain, options)
    n = len(tables)
    intra, inter, short = [], [None] * n, {}
    for u in range(n):
        scope = (u, u + 1) if u + 1 < n else (u,)
        idx = {
            w: np.arange(tables[w].size).reshape([-1 if j == k else 1 for j in range(len(scope))])
            for k, w in enumerate(scope)
        }
        terms = node_terms(tables, chain.side, chain.groups(u), u, idx, *chain.frames)
        shape = tuple(tables[w].size for w in scope)
        total = np.broadcast_to(
            np.asarray(node_value(terms, options.objective), dtype=float), shape
        )
        own = np.broadcast_to(np.asarray(terms.intra[0] + terms.intra[1], dtype=float), shape)
        if u + 1 < n:
            own = own[:, 0]
            inter[u + 1] = total - own[:, None]
        intra.append(np.array(own))
    for end, start in view.shortcuts.items():
        swap_prev = _swap_index(tables[end - 1], tables[start])
        swap_this = _swap_index(tables[end], tables[end])
        if swap_prev is None or swap_this is None:
            continue  # the C++ prices shortcuts with its three types only
        short[end] = inter[end][np.ix_(swap_prev, swap_this)]
    return tables, intra, inter, short


def _swap_index(table_to, table_from):
    """For each state of ``table_from``: the index in ``table_to`` of its swapped type at the same
    share, or None if one is missing (fewer than three types)."""
    states = {(c, float(a)): i for i, (c, a) in enumerate(zip(table_to.choices, table_to.shares))}
    out = []
    for c, a in zip(table_from.choices, table_from.shares):
        key = (_SWAP[c], float(a))
        if key not in states or not set(_SWAP) <= set(table_from.choices):
            return None
        out.append(states[key])
    return np.array(out)


def cpp_dp(
    intra, inter, shortcuts: dict[int, int], short: dict[int, np.ndarray]
) -> tuple[list[int], float]:
    """(state per position, DP value): ``dp_on_one_hierarchy``'s recursion over state indices,
    with its running minimum, back-pointer shortcut types and tie rules (module doc). Plain
    Python lists: with 2 or 3 states per layer, numpy's per-call cost would dominate."""
    n = len(intra)
    inter = [None] + [np.asarray(inter[l], dtype=float).tolist() for l in range(1, n)]
    short = {l: np.asarray(s, dtype=float).tolist() for l, s in short.items()}
    cost = [[float(x) for x in intra[0]]]
    track = [list(range(len(intra[0])))]
    for l in range(1, n):
        prev, edge, mine = cost[l - 1], inter[l], [float(x) for x in intra[l]]
        cut = short.get(l)
        here, back = [], []
        for t in range(len(mine)):
            best, arg = prev[0] + edge[0][t], 0
            for tp in range(len(prev)):
                c = prev[tp] + edge[tp][t]
                if cut is not None:
                    ts = tp
                    for k in range(
                        l - 1, shortcuts[l], -1
                    ):  # follow the back-pointers to the start
                        ts = track[k][ts]
                    c += cut[ts][t]
                if c < best - REL_TOL * abs(best):
                    best, arg = c, tp
            here.append(mine[t] + best)
            back.append(arg)
        cost.append(here)
        track.append(back)
    final = cost[-1]
    last = min(range(len(final)), key=final.__getitem__)
    for t in range(len(final)):  # the lowest type among (numerically) equal costs
        if final[t] <= final[last] + REL_TOL * abs(final[last]):
            last = t
            break
    states = [0] * n
    states[-1] = last
    for l in range(n - 1, 0, -1):
        states[l - 1] = track[l][states[l]]
    return states, float(final[last])


def solve_split_cpp(sp: SplitProblem, options: PlanOptions) -> tuple[Split, float]:
    """(split, the C++'s DP value) for one split under the C++'s rules. Raises ValueError when
    the graph has no C++ view (callers check :func:`cpp_view` first)."""
    view = cpp_view(sp.planning)
    if view is None:
        raise ValueError(f"graph '{sp.planning.name}' is not a chain with residual adds")
    tables, intra, inter, short = cpp_tables(sp, view, options)
    states, value = cpp_dp(intra, inter, view.shortcuts, short)
    n = len(sp.planning.nodes)
    choices, shares = [None] * n, [0.0] * n
    for i, v in enumerate(view.order):
        choices[v] = tables[i].choices[states[i]]
        shares[v] = float(tables[i].shares[states[i]])
        if view.joins[i] is not None:  # the add is done in the layout its reader needs
            choices[view.joins[i]] = ports(choices[v]).need_in
            shares[view.joins[i]] = shares[v]
    return Split(tuple(choices), tuple(shares)), value


def cpp_level_comm(problem: Problem, plan: Plan) -> list[float]:
    """The C++'s model of ``plan``: per level, the elements one side receives by its DP's
    objective (intra-layer, inter-layer and shortcut terms, the shortcut from the block start's
    actual type), along the first group's path (``""``, ``"L"``, ``"LL"``, ...: the C++ plans
    one group per level) with every share taken as 1/2 (the C++ has no other). Raises
    ValueError when the graph has no C++ view."""
    problem = replace(problem, compat="accpar-code")
    view = cpp_view(problem.planning)
    if view is None:
        raise ValueError(f"graph '{problem.planning.name}' is not a chain with residual adds")
    options = PlanOptions(Objective.COMMUNICATION, ShareMode.HALF)
    group, path, dims, out = problem.array, "", problem.root_dims(), []
    while not group.is_leaf and path in plan.splits:
        split = plan.splits[path]
        sp = SplitProblem(problem.planning, dims, problem.side_spec(group), path)
        tables, intra, inter, short = cpp_tables(sp, view, options)
        state = [tables[i].choices.index(split.choices[v]) for i, v in enumerate(view.order)]
        total = sum(float(intra[i][state[i]]) for i in range(len(state)))
        total += sum(float(inter[i][state[i - 1], state[i]]) for i in range(1, len(state)))
        total += sum(float(short[e][state[view.shortcuts[e]], state[e]]) for e in short)
        out.append(total / 2)
        dims = tuple(scale_for_sides(d, c, 0.5)[0] for d, c in zip(dims, split.choices))
        group, path = group.left, path + "L"
    return out
