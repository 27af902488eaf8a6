"""Planning problems and plans.

A :class:`Problem` is the data: a layer graph, an accelerator array, a batch size and an
element size. A :class:`Plan` holds, for every inner node of the array (a split, keyed by its
path ``""``, ``"L"``, ``"LR"``, ...), each planning node's choice and side-1 share.
Planner settings (objective, shares, allowed types) are not part of the problem.

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> p = Problem(get_model("alexnet"), parse_array("h100:2"), batch=64)
    >>> len(p.planning.nodes), p.array.count
    (8, 2)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import math

import numpy as np

from parplan.costmodel.cost import DEFAULT_OPTIMIZER_BYTES, SideSpec, compat_rules
from parplan.costmodel.dims import HashedTuple, LayerDims
from parplan.costmodel.graph import Graph
from parplan.costmodel.hardware import ArrayNode
from parplan.costmodel.layout import Choice
from parplan.costmodel.planning import PlanningGraph, planning_graph
from parplan.errors import ConfigError


#: ZeRO stages (docs/costmodel.md section 6.1): 0 replicates everything a BATCH split replicates.
ZERO_STAGES = (0, 1, 2, 3)
#: What recomputation checkpoints (docs/costmodel.md section 6.3).
CHECKPOINTS = ("block", "layer")
#: Largest global batch (2^40): far beyond any training run, and sizes stay exact in float64.
MAX_BATCH = 2**40


#: (id of a planning graph, batch, micro-batches, recompute, checkpoint) -> (the graph, its
#: nodes' root dims): what :meth:`Problem.root_dims` reads, shared by problems that differ in
#: nothing else.
_ROOT_DIMS: dict = {}


@dataclass(frozen=True)
class Problem:
    """A graph on an array at a batch size; ``bytes_per_element`` defaults to 2 (bf16);
    ``optimizer_bytes_per_param`` is the optimizer state per parameter (default 12: Adam's two
    moments and an fp32 master copy; docs/costmodel.md section 6)."""

    graph: Graph
    array: ArrayNode
    batch: int
    bytes_per_element: float = 2.0
    optimizer_bytes_per_param: float = DEFAULT_OPTIMIZER_BYTES
    #: None (parplan's cost model), "hypar" (HyPar's pricing of IN reductions),
    #: "accpar-code" (every split in its own frame, as the published AccPar code; section 9),
    #: or both: "hypar+accpar-code" (HyPar's rule with the papers' per-level accounting).
    compat: str | None = None
    #: ZeRO stage 0-3 (docs/costmodel.md section 6.1): what a weight replicated by BATCH splits
    #: shards over its replicas (1: optimizer state, 2: and gradients, 3: and the weights, which
    #: are then gathered in forward and again in backward).
    zero_stage: int = 0
    #: Activation recomputation (docs/costmodel.md section 6.3): forward runs again in backward
    #: from checkpoints.
    recompute: bool = False
    #: Micro-batches per step (gradient accumulation, docs/costmodel.md section 6.4); must
    #: divide the batch.
    micro_batches: int = 1
    #: Weight traffic (gradient exchange, ZeRO-3 gathers) overlaps compute, as DDP and FSDP run
    #: it (docs/costmodel.md section 4.2); False (the papers' setting): it follows compute.
    overlap: bool = False
    #: What recomputation checkpoints (section 6.3): "block" (what enters each block, the
    #: largest block held again in backward; layers outside blocks keep their input) or
    #: "layer" (every weighted layer's input).
    checkpoint: str = "block"

    def __repr__(self) -> str:
        """One line (the full dataclass repr lists every layer and device: thousands of characters)."""
        settings = [
            f"bytes_per_element={self.bytes_per_element:g}",
            f"optimizer_bytes_per_param={self.optimizer_bytes_per_param:g}",
        ]
        for name, default in (
            ("compat", None),
            ("zero_stage", 0),
            ("recompute", False),
            ("micro_batches", 1),
            ("overlap", False),
            ("checkpoint", "block"),
        ):
            if getattr(self, name) != default:
                settings.append(f"{name}={getattr(self, name)!r}")
        return (
            f"Problem({self.graph.name!r}: {len(self.graph.layers)} layers, array {self.array.describe()!r}: "
            f"{self.array.count} devices, batch={self.batch}, {', '.join(settings)})"
        )

    def __post_init__(self):
        try:
            compat_rules(self.compat)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not isinstance(self.graph, Graph):
            raise ConfigError(
                f"Problem: graph must be a parplan Graph, e.g. load_model('alexnet') "
                f"(got {type(self.graph).__name__})"
            )
        if not isinstance(self.array, ArrayNode):
            raise ConfigError(
                f"Problem: array must be an array, e.g. parse_array('h100:8') "
                f"(got {type(self.array).__name__})"
            )
        if isinstance(self.batch, np.integer):
            object.__setattr__(self, "batch", int(self.batch))
        if (
            not isinstance(self.batch, int)
            or isinstance(self.batch, bool)
            or not 0 < self.batch <= MAX_BATCH
        ):
            raise ConfigError(
                f"batch must be an integer in [1, {MAX_BATCH:,}] (got {self.batch!r})"
            )
        for what in ("bytes_per_element", "optimizer_bytes_per_param"):
            value = getattr(self, what)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float, np.number))
                or not math.isfinite(value)
            ):
                raise ConfigError(f"{what} must be a finite number (got {value!r})")
        if not self.bytes_per_element > 0:
            raise ConfigError(f"bytes_per_element must be > 0 (got {self.bytes_per_element!r})")
        if self.optimizer_bytes_per_param < 0:
            raise ConfigError(
                f"optimizer_bytes_per_param must be >= 0 (got {self.optimizer_bytes_per_param!r})"
            )
        if isinstance(self.zero_stage, bool) or self.zero_stage not in ZERO_STAGES:
            raise ConfigError(
                f"zero_stage must be one of {', '.join(map(str, ZERO_STAGES))} (got {self.zero_stage!r})"
            )
        object.__setattr__(self, "zero_stage", int(self.zero_stage))
        if self.checkpoint not in CHECKPOINTS:
            raise ConfigError(
                f"checkpoint must be one of {', '.join(CHECKPOINTS)} (got {self.checkpoint!r})"
            )
        for what in ("recompute", "overlap"):
            if not isinstance(getattr(self, what), (bool, np.bool_)):
                raise ConfigError(f"{what} must be True or False (got {getattr(self, what)!r})")
            object.__setattr__(self, what, bool(getattr(self, what)))
        m = self.micro_batches
        if isinstance(m, np.integer):
            m = int(m)
        if (
            isinstance(m, bool)
            or not isinstance(m, int)
            or not 1 <= m <= self.batch
            or self.batch % m
        ):
            raise ConfigError(
                f"micro_batches must be an integer >= 1 that divides the batch {self.batch} (got {m!r})"
            )
        object.__setattr__(self, "micro_batches", m)
        self.graph.analyze()

    @property
    def planning(self) -> PlanningGraph:
        return planning_graph(self.graph)

    @property
    def blocks_recomputed(self) -> bool:
        """Whether recomputation checkpoints per block (section 6.3)."""
        return self.recompute and self.checkpoint == "block"

    @property
    def recomputed_nodes(self) -> tuple[bool, ...]:
        """Per planning node, whether its forward runs again in backward (section 6.3): every
        node per layer; per block, the nodes of blocks only (the frameworks checkpoint their
        blocks and keep everything else, the LM head and the embeddings). A model without
        blocks is checkpointed per layer either way."""
        pg = self.planning
        if not self.recompute:
            return (False,) * len(pg.nodes)
        if self.checkpoint == "layer" or not pg.block_count:
            return (True,) * len(pg.nodes)
        return tuple(b >= 0 for b in pg.blocks)

    def root_dims(self) -> tuple[LayerDims, ...]:
        """Every planning node's dims at the full batch (computed once per problem: the
        evaluator asks at every group)."""
        dims = self.__dict__.get("_root_dims")
        if dims is None:
            pg = self.planning
            # problems that differ in other settings (a memory search's ZeRO stages) share them
            key = (id(pg), self.batch, self.micro_batches, self.recompute, self.checkpoint)
            hit = _ROOT_DIMS.get(key)
            if hit is not None and hit[0] is pg:
                self.__dict__["_root_dims"] = hit[1]
                return hit[1]
            kept = pg.checkpoints if self.blocks_recomputed else (-1.0,) * len(pg.nodes)
            again = self.recomputed_nodes
            # alike nodes (equal dims: a transformer's blocks, a chain's repeated layers) get one
            # object, so every memo below that keys on a dims object's identity meets them once
            made: dict = {}
            dims = HashedTuple(
                made[key] if key in made else made.setdefault(key, self._scaled_root(*key))
                for key in zip((n.dims for n in pg.nodes), kept, again)
            )
            self.__dict__["_root_dims"] = (
                dims  # a cache, not a field: equality and hashing ignore it
            )
            if len(_ROOT_DIMS) >= 64:
                _ROOT_DIMS.clear()
            _ROOT_DIMS[key] = (pg, dims)  # the entry holds the graph whose id keys it
        return dims

    def _scaled_root(self, dims: LayerDims, checkpoint: float, recompute: float) -> LayerDims:
        """A node's dims at the full batch under this problem's settings."""
        return dataclasses.replace(
            dims,
            batch=dims.batch * self.batch,
            replica=1.0,
            recompute=recompute,
            checkpoint=checkpoint,
            micro_batches=self.micro_batches,
        )

    def side_spec(self, group: ArrayNode) -> SideSpec:
        """The cost-model view of splitting ``group``: its halves as two devices (one object per
        group and problem: the memos keyed on it then compare it by identity)."""
        sides = self.__dict__.setdefault("_sides", {})  # a cache, not a field
        hit = sides.get(id(group))
        if hit is not None and hit[0] is group:
            return hit[1]
        spec = self._side_spec(group)
        sides[id(group)] = (group, spec)  # the entry holds the group whose id keys it
        return spec

    def _side_spec(self, group: ArrayNode) -> SideSpec:
        return SideSpec(
            devices=(group.left.as_device, group.right.as_device),
            bytes_per_s=group.link.side_bytes_per_s,
            latency_s=group.link.latency_s,
            bytes_per_element=self.bytes_per_element,
            collective=self.array.collective,
            hosts=group.count,
            optimizer_bytes_per_param=self.optimizer_bytes_per_param,
            compat=self.compat,
            zero_stage=self.zero_stage,
            micro_batches=self.micro_batches,
            ports=group.link.ports,
            overlap=self.overlap,
            capacity_bytes=(
                sum(d.memory_bytes for d in group.left.devices()),
                sum(d.memory_bytes for d in group.right.devices()),
            ),
        )


@dataclass(frozen=True)
class Split:
    """One split: per planning node, its choice and side-1 (left) share."""

    choices: tuple[Choice, ...]
    shares: tuple[float, ...]

    def __post_init__(self):
        if len(self.choices) != len(self.shares):
            raise ConfigError("a split needs one share per choice")
        for a in self.shares:
            if not (isinstance(a, (int, float, np.number)) and 0.0 <= a <= 1.0):
                raise ConfigError(f"shares must be numbers in [0, 1] (got {a!r})")


@dataclass(frozen=True)
class Plan:
    """A plan: one :class:`Split` per inner array node, keyed by path; plus who made it."""

    splits: Mapping[str, Split]
    planner: str = ""
    info: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "splits", MappingProxyType(dict(self.splits)))
        object.__setattr__(self, "info", MappingProxyType(dict(self.info)))

    @property
    def root(self) -> Split:
        return self.splits[""]

    def __reduce__(self):
        # Mapping proxies do not pickle; rebuild from plain dicts (pickle and deepcopy).
        return (Plan, (dict(self.splits), self.planner, dict(self.info)))

    def layer(self, problem: Problem, name: str) -> dict[str, tuple[str, float]]:
        """Planning node ``name``'s (type, left share) at every split, by split path ("" the root)."""
        try:
            v = problem.planning.index(name)
        except KeyError:
            raise ConfigError(
                f"model '{problem.graph.name}' has no planning node '{name}' (planning nodes are its "
                "weighted layers and joins)"
            ) from None
        return {
            path: (split.choices[v].value, float(split.shares[v]))
            for path, split in self.splits.items()
        }

    def to_frame(self, problem: Problem):
        """One row per (split, planning node): ``split`` (path, "" the root), ``level`` (1 the
        root), ``layer``, ``type``, ``share`` (the left half's); a pandas frame, built on demand."""
        import pandas as pd

        names = [n.name for n in problem.planning.nodes]
        rows = [
            (path, len(path) + 1, names[v], c.value, float(a))
            for path, split in sorted(self.splits.items(), key=lambda kv: (len(kv[0]), kv[0]))
            for v, (c, a) in enumerate(zip(split.choices, split.shares))
        ]
        return pd.DataFrame(rows, columns=["split", "level", "layer", "type", "share"])


def has_work(splits: Mapping[str, Split], path: str, v: int) -> bool:
    """Whether node ``v`` reaches the group at ``path`` with work: every split above gives
    the side towards it a share of the node (``splits``: a plan's splits by path)."""
    for i, step in enumerate(path):
        a = splits[path[:i]].shares[v]
        if (a <= 0.0) if step == "L" else (a >= 1.0):
            return False
    return True
