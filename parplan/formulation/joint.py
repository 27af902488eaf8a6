"""The joint MIP of the whole hierarchy (docs/costmodel.md section 8, "Joint model").

Every split of the array is planned at once, priced exactly as the evaluator prices a plan
(section 7): a node's time at a group is the max over its two children of the child's time
plus what that side pays at this split, and what a side pays depends on the regions that
*every* split above cut (section 3). So a node's cost at a group of depth ``l`` depends on the
states of the node and its consumers at that group and at all ``l`` groups above it.

Formulation (``k`` a *state class*: a group, or with ``symmetric=True`` all interchangeable
groups of one level under one parent class, which then take the same states):

- ``y[k,v,s]`` binary, one-hot per class and node (family ``one_hot``).
- For every group ``g`` and node ``u``: cells ``z`` over the joint states of ``u``'s scope
  (``u`` and its consumers) at ``g`` and every group above it, linked to ``y`` by marginals
  (family ``edge_link``) as in the one-split model: with binary ``y`` exactly the product cell
  carries 1. Groups of one class share their cells (their costs differ and enter their own
  rows). Leaves get the cells of the node alone along their path (compute and memory).
- ``t[g,u] >= t[child,u] + comm_child(g,u)`` for both children (family ``node_time``; a
  leaf child's time is its compute), objective ``sum_u t[root,u]``: the evaluator's max-plus
  recursion, exact because every coefficient is the evaluator's own and the objective
  pushes each ``t`` down onto its max. Communication objective: the elements both sides
  receive at every group, summed; no ``t``.
- Memory (family ``memory``): per device, sum of its nodes' bytes / its capacity <= 1.

Every coefficient comes from :func:`~parplan.costmodel.cost.node_terms` at the group's frame
(dims, regions, cut flags, coverage walked down from the root) and
:meth:`~parplan.costmodel.dims.LayerDims.compute_seconds`; nothing is re-derived. The model
grows with ``states ^ (scope x depth)``; :data:`MAX_JOINT_CELLS` caps it.

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.costmodel.cost import ShareMode
    >>> p = Problem(get_model("lenet"), parse_array("h100:4"), batch=64)
    >>> model, decode = build_joint(p, PlanOptions(shares=ShareMode.HALF))
    >>> sorted(model.families())
    ['edge_link', 'node_time', 'one_hot']
    >>> sorted(decode.classes.items())  # interchangeable groups share one class per level
    [('', ''), ('L', 'S'), ('LL', 'SS'), ('LR', 'SS'), ('R', 'S'), ('RL', 'SS'), ('RR', 'SS')]
    >>> sorted(decode.ys)  # state variables: one set per level (the leaves have none)
    ['', 'S']
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from parplan.costmodel.cost import (
    OVERLAP_WINDOW,
    Objective,
    StateTable,
    covered_below,
    cuts_below,
    node_terms,
    output_groups,
    scale_for_sides,
    share_points,
)
from parplan.costmodel.dims import LayerDims
from parplan.costmodel.evaluate import evaluate, price_of
from parplan.costmodel.hardware import ArrayNode, signature
from parplan.costmodel.layout import Choice
from parplan.costmodel.problem import Plan, Problem, Split
from parplan.costmodel.regions import ROOT, Region, child_region
from parplan.costmodel.split import PlanOptions, factor_scope
from parplan.errors import ConfigError, TableTooLarge
from parplan.formulation.mip import TIME_UNITS, MipModel, ModelBuilder

#: Most cell variables (``z`` and leaf columns) the joint model builds.
MAX_JOINT_CELLS = 300_000


@dataclass(frozen=True)
class NodeFrame:
    """What one node looks like at one group: its sizes, its region in root coordinates, whether
    a split above cut its rows / output columns, whether an enclosing BATCH all-reduce covers it."""

    dims: LayerDims
    region: Region
    cut: tuple[bool, bool] = (False, False)
    covered: bool = False

    def child(self, choice: Choice, share: float, side: int, collective: bool) -> "NodeFrame":
        """The frame on side ``side`` (0, 1) of a split giving this node ``(choice, share)``."""
        one = Split((choice,), (share,))
        return NodeFrame(
            scale_for_sides(self.dims, choice, share)[side],
            child_region(self.region, choice, share, side),
            cuts_below((self.cut,), one)[0],
            covered_below((self.covered,), one, collective)[0],
        )


def state_classes(array: ArrayNode, symmetric: bool) -> dict[str, str]:
    """Group path -> state class, for every group (leaves included). Without ``symmetric`` each
    group is its own class (the key is its path); with it, the two children of a group whose
    halves are interchangeable (:func:`~parplan.costmodel.hardware.signature`) share the key
    ``parent + "S"``."""
    out: dict[str, str] = {}

    def rec(group: ArrayNode, path: str, key: str) -> None:
        out[path] = key
        if group.is_leaf:
            return
        same = symmetric and signature(group.left) == signature(group.right)
        rec(group.left, path + "L", key + ("S" if same else "L"))
        rec(group.right, path + "R", key + ("S" if same else "R"))

    rec(array, "", "")
    return out


def groups_by_path(array: ArrayNode) -> dict[str, ArrayNode]:
    """Every group (leaves included) by path."""
    out: dict[str, ArrayNode] = {}

    def rec(group: ArrayNode, path: str) -> None:
        out[path] = group
        if not group.is_leaf:
            rec(group.left, path + "L")
            rec(group.right, path + "R")

    rec(array, "")
    return out


@dataclass(frozen=True)
class JointDecoder:
    """Turns the joint model's solution into a :class:`Plan`, and a plan into a start point."""

    classes: Mapping[str, str]  # group path -> state class
    states: Mapping[
        str, tuple[tuple[tuple[Choice, float], ...], ...]
    ]  # class -> per node: its states
    ys: Mapping[str, tuple[tuple[int, ...], ...]]  # class -> per node: variable of each state
    cells: tuple[
        tuple[int, tuple[tuple[str, int], ...], tuple[int, ...]], ...
    ]  # (first var, members, shape)
    times: Mapping[tuple[str, int], int]  # (group path, node) -> variable t
    n_vars: int
    scale: float  # model units per second (time objective) or per element
    planner: str = "joint"

    def plan(self, values: Sequence[float]) -> Plan:
        """The plan of a solution (each node's state with the largest ``y``)."""
        chosen = {
            k: tuple(
                per[int(np.argmax([values[i] for i in yv]))] for per, yv in zip(self.states[k], ys)
            )
            for k, ys in self.ys.items()
        }
        splits = {
            path: Split(tuple(c for c, _ in chosen[k]), tuple(a for _, a in chosen[k]))
            for path, k in self.classes.items()
            if k in chosen
        }
        return Plan(splits, planner=self.planner)

    def __call__(self, raw) -> Plan:
        return self.plan(raw.values)

    def start(
        self, plan: Plan, node_times: Mapping[tuple[str, int], float]
    ) -> tuple[float, ...] | None:
        """A solution vector for ``plan`` (None if ``plan`` is not in the model: a state off the
        share grid, or different states in groups of one class). ``node_times``: the evaluator's
        time of each node at each group of ``plan``."""
        index: dict[str, tuple[int, ...]] = {}
        for path, k in self.classes.items():
            if k not in self.ys:
                continue
            split = plan.splits.get(path)
            if split is None:
                return None
            idx = []
            for v, per in enumerate(self.states[k]):
                hit = [
                    j
                    for j, (c, a) in enumerate(per)
                    if c == split.choices[v] and abs(a - split.shares[v]) < 1e-12
                ]
                if not hit:
                    return None
                idx.append(hit[0])
            if index.setdefault(k, tuple(idx)) != tuple(idx):
                return None
        x = np.zeros(self.n_vars)
        for k, ys in self.ys.items():
            for v, yv in enumerate(ys):
                x[yv[index[k][v]]] = 1.0
        for first, members, shape in self.cells:
            x[first + int(np.ravel_multi_index(tuple(index[k][w] for k, w in members), shape))] = (
                1.0
            )
        for key, var in self.times.items():
            x[var] = node_times[key] * self.scale
        return tuple(float(v) for v in x)


def _frames_at(
    path: str,
    scope: tuple[int, ...],
    root: Mapping[int, NodeFrame],
    states: Sequence[tuple[tuple[tuple[Choice, float], ...], ...]],
    collective: bool,
):
    """Every combination of the scope's states at the groups above ``path`` (level-major, scope
    order inside a level), with the scope's frames at ``path``: (state indices, frames)."""

    def walk(level: int, frames: Mapping[int, NodeFrame], prefix: tuple[int, ...]):
        if level == len(path):
            yield prefix, frames
            return
        side = 0 if path[level] == "L" else 1
        per = states[level]
        for combo in itertools.product(*(range(len(per[w])) for w in scope)):
            below = {w: frames[w].child(*per[w][s], side, collective) for w, s in zip(scope, combo)}
            yield from walk(level + 1, below, prefix + combo)

    yield from walk(0, root, ())


def _translation_key(u: int, scope: tuple[int, ...], frames: Mapping[int, NodeFrame]) -> tuple:
    """What node ``u``'s terms at a group depend on, up to moving every box of its tensors by one
    vector (docs/costmodel.md section 8, the symmetry lemma): each scope node's sizes, cut
    flags and coverage, and the boxes the terms read (``u``'s rows x output columns, each
    consumer's rows x input columns) relative to ``u``'s."""
    ref = frames[u].region
    r0, c0 = (ref.rows[0], ref.outs[0]) if not ref.empty else (0.0, 0.0)

    def box(w: int):
        reg = frames[w].region
        if reg.empty:
            return None
        x0, x1, y0, y1 = reg.rect("out" if w == u else "in")
        return tuple(round(v, 12) for v in (x0 - r0, x1 - r0, y0 - c0, y1 - c0))

    return tuple((frames[w].dims, frames[w].cut, frames[w].covered, box(w)) for w in scope)


class _Builder:
    """Builds the joint model of one problem (see the module docstring)."""

    def __init__(
        self,
        problem: Problem,
        options: PlanOptions,
        symmetric: bool,
        capacity: Mapping[str, float] | None,
    ):
        if problem.compat is not None:
            raise ConfigError(
                f"the joint model prices parplan's own cost model; --compat {problem.compat} plans split "
                "by split (solve level by level)"
            )
        if problem.array.is_leaf:
            raise ConfigError(
                f"array '{problem.array.describe()}' has one device: nothing to split"
            )
        self.p, self.o = problem, options
        self.pg = problem.planning
        self.n = len(self.pg.nodes)
        self.groups = groups_by_path(problem.array)
        self.classes = state_classes(problem.array, symmetric)
        self.collective = problem.array.collective is not None
        self.time_obj = options.objective is Objective.TIME
        self.capacity = capacity
        self.root = {v: NodeFrame(d, ROOT) for v, d in enumerate(problem.root_dims())}
        self.out_groups = [output_groups(self.pg, problem.root_dims(), u) for u in range(self.n)]
        self.b = ModelBuilder(f"joint_{self.pg.name}_{problem.array.count}")
        self.states: dict[str, tuple] = {}
        self.axes: dict[tuple[int, str], tuple[tuple[Choice, ...], tuple[float, ...]]] = {}
        self.ys: dict[str, tuple] = {}
        self.cells: list = []
        self.cell_sets: dict[tuple, tuple[int, tuple[int, ...]]] = {}
        self.n_cells = 0
        self.times: dict[tuple[str, int], int] = {}
        self.memo: dict[
            tuple, list[np.ndarray]
        ] = {}  # node terms of frames equal up to translation
        self.gids: dict[int, int] = {}
        self.sig_ids: dict[tuple, int] = {}
        self.scale = self._scale() * TIME_UNITS

    def _scale(self) -> float:
        """Model units per second (or element): about 1 unit per 1/1000 of the price of the plan
        with every node at its first state everywhere, so solver tolerances stay meaningful
        whatever dominates (compute, bandwidth or latency)."""
        first = Split(
            tuple(self.o.choices(node)[0] for node in self.pg.nodes),
            tuple(
                share_points(self.p.side_spec(self.p.array), self.o.shares, self.o.share_grid)[-1:]
                * self.n
            ),
        )
        plan = Plan(
            {path: first for path, g in self.groups.items() if not g.is_leaf}, planner="scale"
        )
        ref = price_of(evaluate(self.p, plan), self.o)
        if not ref > 0:
            ref = sum(d.in_elements + d.weight_elements for d in self.p.root_dims())
        return 1.0 / ref if ref > 0 else 1.0

    def declare_states(self) -> None:
        for path, group in self.groups.items():
            k = self.classes[path]
            if group.is_leaf or k in self.states:
                continue
            shares = share_points(self.p.side_spec(group), self.o.shares, self.o.share_grid)
            per = tuple(
                tuple((c, a) for c in self.o.choices(node) for a in shares)
                for node in self.pg.nodes
            )
            for v, node in enumerate(self.pg.nodes):
                self.axes[v, k] = (self.o.choices(node), shares)
            self.states[k] = per
            ys = []
            for v, node_states in enumerate(per):
                yv = tuple(
                    self.b.var(f"y_{k or 'root'}_{v}_{j}", 0, 1, True)
                    for j in range(len(node_states))
                )
                self.b.constraint(
                    "one_hot", f"one_hot_{k or 'root'}_{v}", ((i, 1.0) for i in yv), "==", 1.0
                )
                ys.append(yv)
            self.ys[k] = tuple(ys)

    def cell_set(self, path: str, scope: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        """(first variable, shape) of the cells over ``scope``'s states at every group above and at
        ``path`` (above only for a leaf); shared by the groups of one class sequence."""
        levels = [
            self.classes[path[:j]]
            for j in range(len(path) + (0 if self.groups[path].is_leaf else 1))
        ]
        key = (tuple(levels), scope)
        if key in self.cell_sets:
            return self.cell_sets[key]
        members = tuple((k, w) for k in levels for w in scope)
        shape = tuple(len(self.states[k][w]) for k, w in members)
        size = int(np.prod(shape))
        self.n_cells += size
        if self.n_cells > MAX_JOINT_CELLS:
            raise TableTooLarge(
                f"the joint model of '{self.pg.name}' on {self.p.array.describe()} would need more than "
                f"{MAX_JOINT_CELLS:,} cell variables (a node's cost depends on its and its consumers' states at "
                "every level above it); use fewer devices, fixed shares (--shares half) or a coarser --share-grid"
            )
        first = self.b.var(f"z_{path or 'root'}_{'_'.join(map(str, scope))}_0", 0, 1, False)
        for j in range(1, size):
            self.b.var(f"z_{path or 'root'}_{'_'.join(map(str, scope))}_{j}", 0, 1, False)
        cells = np.arange(size).reshape(shape)
        for axis, (k, w) in enumerate(members):
            for s in range(shape[axis]):
                terms = [(first + int(c), 1.0) for c in np.take(cells, s, axis=axis).ravel()]
                self.b.constraint(
                    "edge_link",
                    f"link_{len(self.cells)}_{axis}_{s}",
                    terms + [(self.ys[k][w][s], -1.0)],
                    "==",
                    0.0,
                )
        self.cells.append((first, members, shape))
        self.cell_sets[key] = (first, shape)
        return first, shape

    def path_states(self, path: str) -> list:
        return [self.states[self.classes[path[:j]]] for j in range(len(path))]

    def comm_costs(self, path: str, u: int) -> tuple[tuple[int, ...], list[np.ndarray]]:
        """Node ``u``'s cost at group ``path`` over its cells: per side seconds, then per side the
        seconds of them that overlap work (time), or one array of elements received by both
        sides (communication)."""
        group = self.groups[path]
        scope = factor_scope(self.pg, u)
        side = self.p.side_spec(group)
        here_key = self.classes[path]
        here = self.states[here_key]
        leaf_pair = bool(group.left.is_leaf and group.right.is_leaf)
        first, shape = self.cell_set(path, scope)
        k = len(scope)
        out = [np.zeros(shape) for _ in range(4 if self.time_obj else 1)]
        idx = {
            w: np.arange(len(here[w])).reshape([-1 if j == i else 1 for j in range(k)])
            for i, w in enumerate(scope)
        }
        group_key = (
            u,
            self.group_id(group),
            leaf_pair,
            tuple(self.axes[w, here_key] for w in scope),
        )
        for prefix, frames in _frames_at(
            path, scope, self.root, self.path_states(path), self.collective
        ):
            key = (group_key, _translation_key(u, scope, frames))
            if key not in self.memo:
                tables = {
                    w: StateTable.build(
                        frames[w].dims,
                        frames[w].covered,
                        *self.axes[w, here_key],
                        side,
                        None,
                        frames[w].cut,
                    )
                    for w in scope
                }
                regions = {w: frames[w].region for w in scope}
                terms = node_terms(tables, side, self.out_groups[u], u, idx, regions, leaf_pair)
                if (
                    self.time_obj
                ):  # each side's comm, then the part of it that overlaps work (section 4.2)
                    self.memo[key] = [
                        np.broadcast_to(np.asarray(x, dtype=float), shape[len(prefix) :])
                        for x in (*terms.comm, *terms.weight)
                    ]
                else:
                    both = np.asarray(terms.received[0], dtype=float) + np.asarray(
                        terms.received[1], dtype=float
                    )
                    self.memo[key] = [np.broadcast_to(both, shape[len(prefix) :])]
            for i, slab in enumerate(self.memo[key]):
                out[i][prefix] = slab
        return (first,) + shape, out

    def group_id(self, group: ArrayNode) -> int:
        """One id per structure of group (equal ids: the same devices and links)."""
        if id(group) not in self.gids:
            self.gids[id(group)] = self.sig_ids.setdefault(signature(group), len(self.sig_ids))
        return self.gids[id(group)]

    def leaf_costs(self, path: str, u: int) -> tuple[int, np.ndarray, ...]:
        """(first cell, compute seconds, memory bytes, activation bytes a recomputed block holds
        again, weight bytes ZeRO-3 gathers while the node's unit runs) of node ``u`` on leaf
        ``path`` over its column."""
        first, shape = self.cell_set(path, (u,))
        device = self.groups[path].device.as_device()
        bpe, zero = self.p.bytes_per_element, self.p.zero_stage
        compute, memory = np.zeros(shape), np.zeros(shape)
        again, gathered = np.zeros(shape), np.zeros(shape)
        for prefix, frames in _frames_at(
            path, (u,), self.root, self.path_states(path), self.collective
        ):
            dims = frames[u].dims
            compute[prefix] = dims.compute_seconds(device, bpe)
            memory[prefix] = dims.memory_bytes(bpe, self.p.optimizer_bytes_per_param, zero)
            again[prefix] = dims.activation_bytes(bpe)
            gathered[prefix] = dims.gathered_bytes(bpe, zero)
        return first, compute.ravel(), memory.ravel(), again.ravel(), gathered.ravel()

    def build(self) -> tuple[MipModel, JointDecoder]:
        self.declare_states()
        leaf_terms: dict[tuple[str, int], list[tuple[int, float]]] = {}
        for path, group in self.groups.items():
            if not group.is_leaf:
                continue
            mem_terms = []
            held: dict[int, list] = {}  # per checkpointed block, its activations (section 6.3)
            blocks = self.pg.blocks if self.p.blocks_recomputed else (-1,) * self.n
            units: dict[int, list] = {}  # per FSDP unit, its gathered weights (section 6.1)
            for u in range(self.n):
                first, compute, memory, again, gathered = self.leaf_costs(path, u)
                leaf_terms[path, u] = [
                    (first + j, float(c) * self.scale) for j, c in enumerate(compute) if c
                ]
                if self.capacity is not None:
                    mem_terms += [
                        (first + j, float(m) / self.capacity[path])
                        for j, m in enumerate(memory)
                        if m
                    ]
                    if blocks[u] >= 0:
                        held.setdefault(blocks[u], []).extend(
                            (first + j, float(a) / self.capacity[path])
                            for j, a in enumerate(again)
                            if a
                        )
                    units.setdefault(self.pg.units[u], []).extend(
                        (first + j, float(g) / self.capacity[path])
                        for j, g in enumerate(gathered)
                        if g
                    )
            if self.capacity is not None:
                # the largest block held again (6.3), the largest unit gathered (6.1): one
                # variable above every block's / unit's sum
                for what, per in (("again", held), ("gathered", units)):
                    per = {k: terms for k, terms in per.items() if terms}
                    if not per:
                        continue
                    top = self.b.var(f"{what}_{path}", 0.0, 1.0)
                    mem_terms.append((top, 1.0))
                    for key, terms in per.items():
                        self.b.constraint(
                            "memory",
                            f"memory_{path}_{'block' if what == 'again' else 'unit'}{key}",
                            terms + [(top, -1.0)],
                            "<=",
                            0.0,
                        )
                self.b.constraint("memory", f"memory_{path}", mem_terms, "<=", 1.0)
        for path, group in self.groups.items():
            if group.is_leaf:
                continue
            for u in range(self.n):
                self.node_rows(path, u, leaf_terms)
        model = self.b.build(
            objective_unit="s" if self.time_obj else "elements",
            objective_scale=self.scale,
            objective_error=0.0,
            exact=True,
            notes=self.notes(),
        )
        dec = JointDecoder(
            self.classes,
            self.states,
            self.ys,
            tuple(self.cells),
            self.times,
            len(model.variables),
            self.scale,
        )
        return model, dec

    def time_var(self, path: str, u: int) -> int:
        """Variable ``t``: node ``u``'s time at group ``path`` (section 7)."""
        if (path, u) not in self.times:
            self.times[path, u] = self.b.var(f"t_{path or 'root'}_{u}", 0.0, math.inf, False)
        return self.times[path, u]

    def node_rows(self, path: str, u: int, leaf_terms) -> None:
        cells, costs = self.comm_costs(path, u)
        first = cells[0]
        if not self.time_obj:
            for j, c in enumerate(costs[0].ravel()):
                if c:
                    self.b.objective(first + j, float(c) * self.scale)
            return
        t = self.time_var(path, u)
        for i, child in enumerate((path + "L", path + "R")):
            if self.groups[child].is_leaf:
                below = [(j, -c) for j, c in leaf_terms[child, u]]
            else:
                below = [(self.time_var(child, u), -1.0)]
            # t >= below + comm - min(weight, W below) (docs/costmodel.md section 4.2): two rows,
            # t >= below + (comm - weight) and t >= (1 - W) below + comm
            comm, weight = costs[i].ravel(), costs[2 + i].ravel()
            rest = [
                (first + j, -float(c - w) * self.scale)
                for j, (c, w) in enumerate(zip(comm, weight))
                if c - w
            ]
            self.b.constraint(
                "node_time", f"time_{path or 'root'}_{u}_{i}", [(t, 1.0)] + below + rest, ">=", 0.0
            )
            if weight.any():
                whole = [(first + j, -float(c) * self.scale) for j, c in enumerate(comm) if c]
                part = [(var, a * (1.0 - OVERLAP_WINDOW)) for var, a in below]
                self.b.constraint(
                    "node_time",
                    f"time_{path or 'root'}_{u}_{i}_overlap",
                    [(t, 1.0)] + part + whole,
                    ">=",
                    0.0,
                )
        if path == "":
            self.b.objective(t, 1.0)

    def notes(self) -> tuple[str, ...]:
        sym = any(k.endswith("S") for k in self.classes.values())
        out = [
            f"joint model over all {sum(1 for g in self.groups.values() if not g.is_leaf)} splits"
        ]
        if sym:
            out.append(
                "interchangeable sibling groups take the same states (symmetric plans; docs/costmodel.md "
                "section 8 says when this loses nothing)"
            )
        return tuple(out)


def frame_counts(
    problem: Problem, options: PlanOptions, path: str, u: int
) -> list[tuple[int, int]]:
    """Why the joint model stops at 8-16 devices (docs/costmodel.md section 8, "Joint model"):
    for node ``u`` at each group along ``path`` (a string of ``L``/``R`` from the root), a pair
    (cells the model builds for ``u``'s scope there, cells a model would need that shares them
    between state combinations above with equal frames). The first is ``states ^ (scope x
    (depth + 1))``; the second the distinct frames of the scope over every state combination
    above, up to translation (the key of :func:`_translation_key`: all the node's terms read),
    times the states at the group. States as the model's with symmetry (``options``' share
    rule)."""
    b = _Builder(problem, options, True, None)
    b.declare_states()
    scope = factor_scope(b.pg, u)
    frames = {_translation_key(u, scope, b.root): b.root}
    out = []
    for depth in range(len(path) + 1):
        here = b.states[b.classes[path[:depth]]]
        per_level = math.prod(len(here[w]) for w in scope)
        out.append((per_level ** (depth + 1), len(frames) * per_level))
        if depth == len(path):
            break
        side = 0 if path[depth] == "L" else 1
        below = {}
        for fr in frames.values():
            for combo in itertools.product(*(here[w] for w in scope)):
                child = {
                    w: fr[w].child(*state, side, b.collective) for w, state in zip(scope, combo)
                }
                below.setdefault(_translation_key(u, scope, child), child)
        frames = below
    return out


def build_joint(
    problem: Problem,
    options: PlanOptions | None = None,
    symmetric: bool = True,
    capacity_bytes: Mapping[str, float] | None = None,
) -> tuple[MipModel, JointDecoder]:
    """The joint MIP of every split of ``problem`` and its decoder.

    ``symmetric``: interchangeable sibling groups share their states (fewer variables; a
    restriction to symmetric plans). ``capacity_bytes``: per leaf path, its memory limit.
    """
    options = PlanOptions() if options is None else options
    return _Builder(problem, options, symmetric, capacity_bytes).build()


__all__ = [
    "MAX_JOINT_CELLS",
    "JointDecoder",
    "NodeFrame",
    "build_joint",
    "frame_counts",
    "groups_by_path",
    "state_classes",
]
