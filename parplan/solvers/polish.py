"""Multi-level polish: whole-plan moves the top-down DP cannot see, each priced by the evaluator
(docs/costmodel.md section 7, "Multi-level polish").

The top-down recursion fixes a split before planning below it, pricing each half as one
device. So it cannot trade a choice at one level against the next: on LeNet-C on ``h100:8``
with one link per split (``fabric="papers"``; shares 1/2) it splits ``ip1`` by IN at level 2 and
OUT at level 3, 0.70% above the joint optimum (``parplan certify --joint``), which splits it OUT
then IN. The polish takes a plan and repeatedly tries, for each node,

- **swap**: exchanging its choices between a level and the level below it (shares stay, so a
  share rule still holds);
- **retype**: each other allowed choice at one level, at the same share;
- **reshare** (free shares only): one side taking all of the node at one level, or its share
  one grid step up or down,

where a *level* is every group at one depth with the same devices above it (interchangeable
groups move together, so a symmetric plan stays symmetric). A move is kept when the evaluator's
step time drops. Changing node ``v``'s states changes the times of ``v`` and its producers only
(a node's time reads its own states and its consumers'), so a move is priced by re-pricing
those (:func:`parplan.costmodel.evaluate.node_times`). The result is never slower than the
input; it is a local optimum over these moves, not a global one.

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.costmodel.evaluate import evaluate
    >>> from parplan.solvers.planners import make_plan, planner_options
    >>> p = Problem(get_model("lenet-c"), parse_array("h100:8", fabric="papers"), batch=512)
    >>> opts = planner_options("accpar", shares="half")
    >>> start = make_plan(p, "accpar-topdown", shares="half")
    >>> better, moves = polish(p, start, opts)
    >>> moves, round(evaluate(p, better).step_time_s / evaluate(p, start).step_time_s - 1, 4)
    (1, -0.007)
"""

from __future__ import annotations

from typing import Callable

from parplan.costmodel.evaluate import evaluate, node_times
from parplan.costmodel.hardware import ArrayNode, signature
from parplan.costmodel.problem import Plan, Problem, Split, has_work
from parplan.costmodel.cost import ShareMode
from parplan.costmodel.split import PlanOptions

__all__ = ["AUTO_MAX_NODES", "AUTO_MAX_WORK", "MAX_ROUNDS", "auto_polish", "level_sets", "polish"]

#: Passes over all moves (each pass can only lower the step time; it stops when one changes nothing).
MAX_ROUNDS = 10
#: ``certify`` (and ``parplan bench bound``) polish on their own only problems of at most this
#: many (planning nodes x levels x splits): a move re-prices its nodes at every split. Measured:
#: VGG-16 on tpu-v2:64,tpu-v3:64 (26,416) 25 s, ResNet-101 on h100:16 (8,280) 28 s ...
AUTO_MAX_WORK = 30_000
#: ... and of at most this many planning nodes (each split also costs a pass over every node:
#: ResNet-152 on h100:16, 206 nodes, took 83 s and found nothing; 31 s since node terms are
#: memoised, and still nothing).
AUTO_MAX_NODES = 150


def auto_polish(problem: Problem) -> bool:
    """Whether ``certify`` polishes the DP plan of ``problem`` without being asked."""
    if problem.array.is_leaf:
        return False
    n = len(problem.planning.nodes)
    paths = [path for path, _ in problem.array.inner_nodes()]
    return (
        n <= AUTO_MAX_NODES
        and n * len(level_sets(problem.array, paths)) * len(paths) <= AUTO_MAX_WORK
    )


def level_sets(array: ArrayNode, paths) -> dict[tuple, list[str]]:
    """Split paths grouped by depth and by the devices above them: the key of a path is the
    structural signature of every group from the root down to it."""
    sig_ids: dict[tuple, int] = {}
    out: dict[tuple, list[str]] = {}
    for path in sorted(paths, key=lambda p: (len(p), p)):
        group, key = array, []
        for step in "." + path:
            group = group if step == "." else (group.left if step == "L" else group.right)
            key.append(sig_ids.setdefault(signature(group), len(sig_ids)))
        out.setdefault(tuple(key), []).append(path)
    return out


def polish(
    problem: Problem,
    plan: Plan,
    options: PlanOptions,
    max_rounds: int = MAX_ROUNDS,
    progress: Callable[[str], None] | None = None,
) -> tuple[Plan, int]:
    """(polished plan, moves kept). Only choices in ``options.choices(node)`` are tried."""
    pg = problem.planning
    n = len(pg.nodes)
    splits = dict(plan.splits)
    sets = level_sets(problem.array, splits)
    keys = list(sets)
    below = {k: [j for j in keys if len(j) == len(k) + 1 and j[: len(k)] == k] for k in keys}
    producers = [sorted({w for w in range(n) if v in pg.succs[w]}) for v in range(n)]
    current = dict(enumerate(evaluate(problem, Plan(splits, plan.planner)).node_time_s))
    kept = 0
    free = options.shares is ShareMode.FREE

    def uniform(key, v):
        """The node's one choice at this level, or None if it differs between the groups or
        the node has no work there (a split above gave their side none of it: no move there
        can change a time)."""
        if not any(has_work(splits, p, v) for p in sets[key]):
            return None
        states = {splits[p].choices[v] for p in sets[key]}
        return states.pop() if len(states) == 1 else None

    def share_of(key, v):
        shares = {splits[p].shares[v] for p in sets[key]}
        return shares.pop() if len(shares) == 1 else None

    def trial(changes: dict[tuple, object], v: int, share: float | None = None) -> bool:
        """Apply ``{level: choice}`` (and ``share`` at those levels) for node ``v`` if the step
        time drops; True if kept."""
        nonlocal splits, kept
        new = dict(splits)
        for key, choice in changes.items():
            for p in sets[key]:
                s = new[p]
                shares = s.shares if share is None else s.shares[:v] + (share,) + s.shares[v + 1 :]
                new[p] = Split(s.choices[:v] + (choice,) + s.choices[v + 1 :], shares)
        affected = [v, *producers[v]]
        times = node_times(problem, Plan(new, plan.planner), affected)
        if sum(times.values()) < sum(current[u] for u in affected) * (1.0 - 1e-12):
            splits = new
            current.update(times)
            kept += 1
            return True
        return False

    for rnd in range(max_rounds):
        before = kept
        for v, node in enumerate(pg.nodes):
            allowed = options.choices(node)
            for key in keys:
                here = uniform(key, v)
                if here is None:
                    continue
                for child in below[key]:  # swap with the level below
                    there = uniform(child, v)
                    if there is not None and there != here and here in allowed and there in allowed:
                        if trial({key: there, child: here}, v):
                            here = there
                for choice in allowed:  # retype at this level
                    if choice != here and trial({key: choice}, v):
                        here = choice
                a = share_of(key, v)
                if free and a is not None:  # reshare: one side takes it all, or one grid step
                    step = 1.0 / options.share_grid
                    for b in (0.0, 1.0, round(a - step, 12), round(a + step, 12)):
                        if 0.0 <= b <= 1.0 and b != a and trial({key: here}, v, b):
                            a = b
        if progress is not None:
            progress(f"polish pass {rnd + 1}: {kept - before} move(s) kept")
        if kept == before:
            break
    return Plan(splits, planner=plan.planner, info=dict(plan.info)), kept
