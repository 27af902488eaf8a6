"""The planners: AccPar, HyPar, OWT, data and model parallelism, all on one DP engine.

Each planner is a default :class:`PlanOptions` (objective, share mode, allowed choices per
node); the user may override objective and shares for any of them. Every plan is then priced
by :func:`parplan.costmodel.evaluate.evaluate`.

Why ``accpar`` is a portfolio: the published recursion prices each half of a split as one
device of summed throughput, blind to the communication the half will pay inside itself. On
deep arrays that myopia can lose to a plan chosen by another level criterion (e.g. HyPar's
communication objective), even though every such plan lies in AccPar's search space. So
``accpar`` runs the top-down DP under several level criteria (AccPar's own first), prices
each full plan with the evaluator and keeps the fastest; ``plan.info["selected"]`` says which
criterion won. Two criteria attack the myopia directly: ``lookahead`` (arrays up to 32
devices) prices each half of the root split by the half's own global bound, which charges the
reductions the half would pay inside (docs/costmodel.md section 8); ``lookahead-levels`` does
so at every split whose halves are groups (docs/costmodel.md section 7); ``spread-k`` does
that too but keeps every layer on both halves at the top ``k`` levels of interchangeable
splits, where the look-ahead still funnels a classifier into one half. A criterion whose
splits so far cannot beat the best plan so far (:func:`parplan.solvers.bound.
fixed_splits_bound`, checked after every split) is stopped there, unplanned below: the
portfolio's plan is the same. ``accpar-topdown``
is the published recursion alone (used in ablations).

============  ======================  ============  ==============  =========================
planner       types                   shares        objective       source
============  ======================  ============  ==============  =========================
accpar        BATCH, IN, OUT          free          time            AccPar + portfolio (below)
accpar-topdown BATCH, IN, OUT         free          time            AccPar (HPCA'20) as published
hypar         BATCH, IN               half          communication   HyPar (HPCA'19)
owt           conv BATCH, FC IN       proportional  time            Krizhevsky's "one weird trick"
data          BATCH                   proportional  time            data parallelism
data-half     BATCH                   half          time            naive data parallelism
model         IN                      proportional  time            model parallelism
============  ======================  ============  ==============  =========================

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.costmodel.evaluate import evaluate
    >>> p = Problem(get_model("vgg16"), parse_array("tpu-v2:2,tpu-v3:2"), batch=512)
    >>> acc, dp = (evaluate(p, make_plan(p, name)).step_time_s for name in ("accpar", "data"))
    >>> acc <= dp
    True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Callable

from parplan.costmodel.cost import Objective, ShareMode
from parplan.costmodel.layout import Choice, Layout, PartitionType
from parplan.costmodel.planning import PlanNode
from parplan.costmodel.problem import Plan, Problem, Split, has_work
from parplan.errors import ConfigError, TableTooLarge
from parplan.costmodel.dims import HashedTuple
from parplan.costmodel.split import PlanOptions, SplitProblem, all_choices
from parplan.solvers.accpar_code import cpp_view, solve_split_cpp
from parplan.solvers.dp import fallback_split, solve_split
from parplan.solvers.hierarchy import plan_top_down

B, I, O = PartitionType.BATCH, PartitionType.IN, PartitionType.OUT


def only(*types: PartitionType) -> Callable[[PlanNode], tuple[Choice, ...]]:
    """Choice rule: weighted layers take only ``types``; joins keep all three layouts."""

    def rule(node: PlanNode) -> tuple[Choice, ...]:
        return node.choices if node.is_join else types

    rule.__name__ = "only_" + "_".join(t.value for t in types)
    return rule


def owt_rule(node: PlanNode) -> tuple[Choice, ...]:
    """OWT: convolutions data parallel (BATCH), fully connected layers model parallel (IN)."""
    if node.is_join:
        return node.choices
    return (I,) if node.is_fc else (B,)


@dataclass(frozen=True)
class PlannerSpec:
    name: str
    description: str
    options: PlanOptions


PLANNERS: dict[str, PlannerSpec] = {
    s.name: s
    for s in (
        PlannerSpec(
            "accpar",
            "AccPar: three types, free shares, step time; best of a portfolio of level criteria",
            PlanOptions(Objective.TIME, ShareMode.FREE, all_choices),
        ),
        PlannerSpec(
            "accpar-topdown",
            "AccPar as published: three types, free shares, step time, top-down",
            PlanOptions(Objective.TIME, ShareMode.FREE, all_choices),
        ),
        PlannerSpec(
            "hypar",
            "HyPar: data or model parallel per layer, share 1/2, communication objective",
            PlanOptions(Objective.COMMUNICATION, ShareMode.HALF, only(B, I)),
        ),
        PlannerSpec(
            "owt",
            "OWT: conv data parallel, FC model parallel",
            PlanOptions(Objective.TIME, ShareMode.PROPORTIONAL, owt_rule),
        ),
        PlannerSpec(
            "data",
            "data parallelism, shares proportional to compute",
            PlanOptions(Objective.TIME, ShareMode.PROPORTIONAL, only(B)),
        ),
        PlannerSpec(
            "data-half",
            "data parallelism, share 1/2 (naive on heterogeneous arrays)",
            PlanOptions(Objective.TIME, ShareMode.HALF, only(B)),
        ),
        PlannerSpec(
            "model",
            "model parallelism (Di split) everywhere, shares proportional",
            PlanOptions(Objective.TIME, ShareMode.PROPORTIONAL, only(I)),
        ),
    )
}


def planner_options(
    name: str,
    objective: str | None = None,
    shares: str | None = None,
    share_grid: int | None = None,
) -> PlanOptions:
    """The options of planner ``name`` with optional overrides (by their string values)."""
    if not isinstance(name, str):
        raise ConfigError(
            f"planner must be a name (got {name!r}); valid planners: {', '.join(PLANNERS)}"
        )
    key = name.strip().lower()
    if key not in PLANNERS:
        raise ConfigError(f"unknown planner '{name}'; valid planners: {', '.join(PLANNERS)}")
    opts = PLANNERS[key].options
    changes = {}
    if objective is not None:
        changes["objective"] = _enum(Objective, objective, "objective")
    if shares is not None:
        changes["shares"] = _enum(ShareMode, shares, "shares")
    if share_grid is not None:
        changes["share_grid"] = share_grid
    return replace(opts, **changes) if changes else opts


def _enum(cls, value: str, what: str):
    try:
        return cls(value.strip().lower())
    except ValueError:
        raise ConfigError(
            f"unknown {what} '{value}'; valid: {', '.join(m.value for m in cls)}"
        ) from None


def make_plan(
    problem: Problem,
    planner: str = "accpar",
    objective: str | None = None,
    shares: str | None = None,
    options: PlanOptions | None = None,
    progress: Callable[[str], None] | None = None,
    share_grid: int | None = None,
    polish: bool = False,
) -> Plan:
    """Plan ``problem`` with a named planner (top-down over the hierarchy, layer-wise DP per split).

    ``options`` replaces the planner's options entirely (for ablations). ``polish``: then
    improve the plan by multi-level moves priced by the evaluator
    (:func:`parplan.solvers.polish.polish`; step-time objective only; ``plan.info["polished"]``
    counts the moves kept).
    """
    if not isinstance(problem, Problem):
        raise ConfigError(
            f"plan: problem must be a Problem (got {type(problem).__name__}); "
            "build one with Problem(load_model(...), parse_array(...), batch=...)"
        )
    opts = (
        options if options is not None else planner_options(planner, objective, shares, share_grid)
    )
    info = {
        "objective": opts.objective.value,
        "shares": opts.shares.value,
        "share_grid": opts.share_grid,
    }
    notes: list[str] = []
    if (
        planner.strip().lower() != "accpar"
        or options is not None
        or opts.objective is not Objective.TIME
    ):
        plan = plan_top_down(problem, _solver(opts, notes), planner, progress)
        plan = Plan(plan.splits, planner=planner, info=info)
    else:
        plan = _portfolio(problem, opts, progress, notes)
    if notes:
        plan = Plan(
            plan.splits, planner=plan.planner, info={**plan.info, "fallback": _fallback_note(notes)}
        )
    if polish:
        if opts.objective is not Objective.TIME:
            raise ConfigError(
                "--polish improves the step time; it does not apply to the communication objective"
            )
        from parplan.solvers.polish import polish as polish_plan

        plan, moves = polish_plan(problem, plan, opts, progress=progress)
        plan = Plan(plan.splits, planner=plan.planner, info={**plan.info, "polished": moves})
    return plan


#: What a split's plan depends on: its problem's fields less its path (read by the wrappers
#: only) and its planning graph (one per problem: a cache lives for one portfolio, keyed by id).
_KEYED = tuple(
    f.name for f in dataclasses.fields(SplitProblem) if f.name not in ("path", "planning")
)


def _solver(opts: PlanOptions, notes: list[str], cache: dict | None = None) -> Callable:
    """The exact DP per split; where its tables are too large, the local search (noted). Under
    ``compat="accpar-code"`` with the communication objective, a graph the C++ can describe (a
    chain, with residual adds) is planned by the C++'s own DP rules instead.

    ``cache``: splits already planned, shared by the portfolio's members: a split is a function
    of its :class:`SplitProblem` (less its path, which only the wrappers around this solver
    read) and the options, and members that agree above a level meet the same splits below it
    (on resnet50 / ``h100:8``, 19 of 49 DPs)."""

    def solve(sp):
        # the split's problem less its path, hashed once (HashedTuple)
        key = (
            HashedTuple((opts, id(sp.planning), *(getattr(sp, f) for f in _KEYED)))
            if cache is not None
            else None
        )
        hit = cache.get(key) if key is not None else None
        if hit is not None:
            split, note = hit
        else:
            split, note = _solve(sp)
            if key is not None:
                cache[key] = (split, note)
        if note is not None:
            notes.append(note)
        return split

    def _solve(sp) -> tuple[Split, str | None]:
        if (
            sp.side.compat == "accpar-code"
            and opts.objective is Objective.COMMUNICATION
            and cpp_view(sp.planning)
        ):
            # the C++'s own DP rules (docs/costmodel.md section 9)
            return solve_split_cpp(sp, opts)[0], None
        try:
            return solve_split(sp, opts), None
        except TableTooLarge as exc:
            _, split, how = fallback_split(sp, opts)
            return split, f"{exc}".split("; use")[0] + f"; planned by {how}"

    return solve


def _lookahead_root(problem: Problem, opts: PlanOptions, bounds=None) -> Split | None:
    """The root split with each half priced by its own bound (the DP over
    :func:`parplan.solvers.bound.raised_tables`, shares on a grid of at most
    :data:`LOOKAHEAD_GRID`); None where the tables are too large or compat rules apply.
    ``bounds``: per-node bounds to reuse (:func:`parplan.solvers.bound.node_bounds`)."""
    if problem.compat is not None:
        return None
    from parplan.costmodel.split import SplitProblem
    from parplan.solvers.bound import raised_tables
    from parplan.solvers.dp import finest_grid_dp

    sp = SplitProblem.root(problem)
    found = finest_grid_dp(
        sp,
        opts,
        min(opts.share_grid, LOOKAHEAD_GRID),
        LOOKAHEAD_MAX_CELLS,
        tables=lambda o: raised_tables(problem, sp, o, solver=bounds),
        last=1,
    )
    return None if found is None else found[0][1]


def _lookahead_levels(
    problem: Problem,
    opts: PlanOptions,
    solver: Callable,
    bounds=None,
    spread: frozenset[str] = frozenset(),
    cache: dict | None = None,
) -> Callable | None:
    """A split solver that plans every split whose halves are groups with each half priced by
    its own bound (the DP over :func:`parplan.solvers.bound.raised_tables` at that group), and
    the others (single-device halves, tables too large) with ``solver``; None under compat
    rules. The bounds' memos are kept across splits (``bounds``: ones to reuse). At the splits
    in ``spread`` (paths) every node keeps work on both halves (:func:`_both_sides`).
    ``cache``: as :func:`_solver`'s (a split's bound tables depend on its group too: the key
    keeps the path)."""
    if problem.compat is not None:
        return None
    from parplan.solvers.bound import node_bounds, raised_tables
    from parplan.solvers.dp import frontier_dp

    bounds = bounds if bounds is not None else node_bounds(problem)
    both = cache if cache is not None else {}  # _both_sides' tables, shared as the splits are

    def solve(sp):
        group = problem.array.at(sp.path)
        if group.left.is_leaf and group.right.is_leaf:
            return solver(sp)
        key = HashedTuple(
            (
                "lookahead",
                opts,
                id(sp.planning),
                sp.path,
                *(getattr(sp, f) for f in _KEYED),
                sp.path in spread,
            )
        )
        if cache is not None and key in cache:
            split = cache[key]
        else:
            try:
                tables = raised_tables(problem, sp, opts, solver=bounds, group=group)
                split = frontier_dp(
                    sp, opts, tables=_both_sides(tables, both) if sp.path in spread else tables
                )[1]
            except TableTooLarge:
                split = None
            if cache is not None:
                cache[key] = split
        return solver(sp) if split is None else split

    return solve


def _both_sides(tables, memo: dict) -> list:
    """The state tables with every state that leaves a side without work priced at infinity (the
    DP never picks one; each node keeps at least one state with both sides working). One new
    table per table object, kept in ``memo`` (the portfolio's cache) as the raised tables are
    kept: alike nodes stay one class, and a split met again finds its factors priced."""
    import numpy as np

    out = []
    for t in tables:
        one = ~(t.has[0] & t.has[1])
        if one.all():  # nothing to choose from (a fixed share of 0 or 1): leave it
            out.append(t)
            continue
        hit = memo.get(("both sides", id(t)))
        if hit is None or hit[0] is not t:
            compute, steps = t.compute.copy(), t.steps.copy()
            compute[:, one] = np.inf
            steps[:, one] = np.inf
            # the entry holds the table whose id keys it
            hit = memo[("both sides", id(t))] = (t, replace(t, compute=compute, steps=steps))
        out.append(hit[1])
    return out


def _one_sided(plan: Plan, paths: list[str], n: int) -> bool:
    """Whether ``plan`` gives some node, at one of the splits ``paths``, work on one side only
    (among the nodes that reach that split with work)."""
    return any(
        plan.splits[p].shares[v] in (0.0, 1.0) and has_work(plan.splits, p, v)
        for p in paths
        for v in range(n)
    )


def spread_levels(problem: Problem) -> list[list[str]]:
    """The split paths, level by level from the top, of every split whose halves are
    interchangeable groups (same devices in the same tree, the same link each way): the splits
    where the ``spread-k`` criteria keep every layer on both halves."""
    levels: dict[int, list[str]] = {}
    for path, g in problem.array.inner_nodes():
        if not g.left.is_leaf and g.interchangeable_halves:
            levels.setdefault(len(path), []).append(path)
    return [levels[d] for d in sorted(levels)]


class _CannotWin(Exception):
    """A level criterion's splits so far cannot beat the best plan so far (:func:`_unless_slower`)."""


#: Margin of :func:`_unless_slower`: a criterion stops only when its splits' bound exceeds the
#: best plan so far by more than float rounding could (the portfolio keeps a plan only if it is
#: faster by 1e-12).
CANNOT_WIN_MARGIN = 1e-9


def _unless_slower(problem: Problem, solver: Callable, bounds, best_s: float) -> Callable:
    """``solver``, except that it raises :class:`_CannotWin` as soon as the splits it has
    returned bound the step time above ``best_s`` (:func:`parplan.solvers.bound.
    fixed_splits_bound`: every plan with those splits takes at least that long; checked after
    every split): the portfolio then skips the criterion, whose plan could not have been
    selected, without planning the rest. OWT on Llama-3-70B / ``h100:512`` stops at its root
    split (its 511 splits were a third of each planning run); on a 4,096-layer chain the
    communication criterion, HyPar, OWT and data parallelism stop after two splits (they had
    planned 33, 33, 127 and 7), and on VGG-11 / ``h100:128`` the first three (10-14% slower) a
    few levels down (docs/costmodel.md section 7)."""
    from parplan.solvers.bound import fixed_splits_bound, root_split_bound

    limit = best_s * (1.0 + CANNOT_WIN_MARGIN)
    planned: dict = {}  # path -> (split problem, split) returned so far
    memo: dict = {}

    def cannot_win(sp, split) -> bool:
        # at the root the summed-device bound first (its terms are the ones the hierarchy
        # prices next), the raised one where that does not decide
        if not sp.path and root_split_bound(problem, sp, split) > limit:
            return True
        planned[sp.path] = (sp, split)
        try:
            return fixed_splits_bound(problem, planned, bounds, memo) > limit
        except TableTooLarge:  # the per-node bounds' budget is spent: undecided, plan it
            return False

    def solve(sp):
        split = solver(sp)
        if cannot_win(sp, split):
            raise _CannotWin
        return split

    return solve


def _with_root(root: Split, solver: Callable) -> Callable:
    """``solver``, except that the root split is ``root``."""

    def solve(sp):
        return root if not sp.path else solver(sp)

    return solve


def _fallback_note(notes: list[str]) -> str:
    return (
        f"{len(notes)} split(s) too large for the exact DP, planned without an optimality claim "
        f"(first: {notes[0].split(': ', 1)[-1]}); a global lower bound (plan --bound, "
        "bound.global_bound) says how far from optimal the plan can be"
    )


#: Level criteria tried by the ``accpar`` portfolio, AccPar's own first (ties keep the earliest).
#: ``lookahead``: AccPar's options, but the root split sees each half as what its own bound says
#: it can reach, not as one device of summed throughput (:func:`parplan.solvers.bound.raised_tables`):
#: on 2-node networks on 3 devices it turned 64% above the global optimum into 0%. Tried on
#: arrays of at most :data:`LOOKAHEAD_MAX_DEVICES` devices.
#: ``lookahead-levels``: the same at every split whose halves are groups (the myopia repeats at
#: every level: a layer put on one half at the root is put on one quarter by the half, and so
#: on down); on 128 devices it lowers VGG-11's and AlexNet's steps by 2-4%.
#: ``spread-k`` (after the others; arrays with interchangeable groups as halves): as
#: ``lookahead-levels``, but at the top ``k`` levels of such splits every layer keeps work on
#: both halves. A half priced by its bound still looks cheaper alone than it turns out to be
#: (the bound leaves out the hand-overs inside it), so classifiers are still funnelled; on
#: ``h100:128`` this lowers AlexNet's step by 4.9% and VGG-11's by 1.2-1.4%. ``k`` grows from 1
#: while the plans do not get slower, up to :data:`SPREAD_MAX_LEVELS`.
#: They run when the best plan so far leaves a layer on one half at a split of the top
#: :data:`SPREAD_MAX_LEVELS` such levels, and when (planning nodes x splits) is at most
#: :data:`SPREAD_MAX_WORK`: each is a whole recursion, and on networks with many layers and a
#: small classifier they found nothing (on 128 devices: VGG-19 is 2,413, ResNet-18 3,683 and
#: took 3 s more for nothing, ResNet-50 20 s more for 0.06%; now that losing criteria stop
#: early, lifting the limit costs ResNet-18 / ResNet-34 on ``h100:128`` 0.15-0.2 s for
#: 0.001-0.002%, docs/costmodel.md section 7).
LOOKAHEAD_MAX_DEVICES = 32
SPREAD_MAX_LEVELS = 3
SPREAD_MAX_WORK = 3_000
#: Share grid of the look-ahead root split (its tables cost a bound per state).
LOOKAHEAD_GRID = 8
#: Largest table (cells) of the look-ahead root split's DP: a criterion of the portfolio, not a
#: planner's optimum, so where the grid of :data:`LOOKAHEAD_GRID` needs larger tables it tries
#: half the grid, and so on (on GoogLeNet / ``h100:8`` the grid of 8 had 1.4e7-cell tables and
#: took 5.8 s of the plan's 15 s).
LOOKAHEAD_MAX_CELLS = 2 * 10**6
PORTFOLIO: tuple[tuple[str, PlanOptions | None], ...] = (
    ("accpar", None),  # the requested options (free shares by default)
    ("lookahead", None),
    ("lookahead-levels", None),
    (
        "communication-3types",
        PlanOptions(Objective.COMMUNICATION, ShareMode.PROPORTIONAL, all_choices),
    ),
    ("hypar", PLANNERS["hypar"].options),
    ("owt", PLANNERS["owt"].options),
    ("data", PLANNERS["data"].options),
)


def _portfolio(problem: Problem, opts: PlanOptions, progress, notes: list[str]) -> Plan:
    from parplan.costmodel.evaluate import evaluate  # local: planners do not price, they select
    from parplan.solvers.bound import node_bounds

    info = {
        "objective": opts.objective.value,
        "shares": opts.shares.value,
        "share_grid": opts.share_grid,
    }
    if problem.array.depth <= 1:
        # one split: the DP under AccPar's own options is already the exact optimum
        plan = plan_top_down(problem, _solver(opts, notes), "accpar", progress)
        return Plan(plan.splits, planner="accpar", info={**info, "selected": "accpar"})
    best: tuple[float, str, Plan] | None = None
    first: Plan | None = None
    cache: dict = {}  # splits planned so far, shared by the members (see _solver)
    bounds = None  # the look-ahead criteria's per-node bounds, shared (made when first needed)
    for label, candidate in PORTFOLIO:
        o = opts if candidate is None else replace(candidate, share_grid=opts.share_grid)
        solver = _solver(o, notes, cache)
        if label == "lookahead":
            bounds = bounds or node_bounds(problem)
            root = (
                _lookahead_root(problem, o, bounds)
                if problem.array.count <= LOOKAHEAD_MAX_DEVICES
                else None
            )
            if root is None or root == first.splits[""]:
                continue  # nothing to try, or the same root split as AccPar's: the same plan
            solver = _with_root(root, solver)
        if label == "lookahead-levels":
            bounds = bounds or node_bounds(problem)
            solver = _lookahead_levels(problem, o, solver, bounds, cache=cache)
            if solver is None:
                continue
        if best is not None and problem.compat is None:
            bounds = bounds or node_bounds(problem)
            solver = _unless_slower(problem, solver, bounds, best[0])
        try:
            plan = plan_top_down(problem, solver, "accpar", progress)
        except _CannotWin:
            continue  # its splits so far are slower than the best plan so far
        first = first or plan
        t = evaluate(problem, plan, rows=False, memory=False).step_time_s
        if best is None or t < best[0] * (1.0 - 1e-12):
            best = (t, label, plan)
    levels = spread_levels(problem) if problem.compat is None else []
    n = len(problem.planning.nodes)
    top = [path for level in levels[:SPREAD_MAX_LEVELS] for path in level]
    if (
        not levels
        or n * sum(1 for _ in problem.array.inner_nodes()) > SPREAD_MAX_WORK
        or not _one_sided(best[2], top, n)
    ):
        levels = []  # nothing to spread, or too costly a recursion for what it gains
    previous = best[0]
    for k in range(1, min(SPREAD_MAX_LEVELS, len(levels)) + 1):
        spread = frozenset(path for level in levels[:k] for path in level)
        bounds = bounds or node_bounds(problem)
        solver = _lookahead_levels(
            problem, opts, _solver(opts, notes, cache), bounds, spread, cache
        )
        try:
            # splits bounded above the last spread's plan (never below the best) are slower than
            # it: the loop would stop there, and select nothing
            plan = plan_top_down(
                problem, _unless_slower(problem, solver, bounds, previous), "accpar", progress
            )
        except _CannotWin:
            break
        t = evaluate(problem, plan, rows=False, memory=False).step_time_s
        if t < best[0] * (1.0 - 1e-12):
            best = (t, f"spread-{k}", plan)
        if t > previous * (1.0 + 1e-12):
            break  # keeping more levels spread made it slower: deeper ones will not help
        previous = t
    _, label, plan = best
    return Plan(plan.splits, planner="accpar", info={**info, "selected": label})


__all__ = [
    "LOOKAHEAD_GRID",
    "LOOKAHEAD_MAX_CELLS",
    "LOOKAHEAD_MAX_DEVICES",
    "PLANNERS",
    "SPREAD_MAX_LEVELS",
    "SPREAD_MAX_WORK",
    "PlannerSpec",
    "make_plan",
    "only",
    "owt_rule",
    "planner_options",
    "spread_levels",
    "Layout",
]
