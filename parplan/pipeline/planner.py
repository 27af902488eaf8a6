"""PipeDream's pipeline planner (SOSP'19): contiguous stages, each replicated, on a hierarchy.

The machine is a stack of levels (:class:`Machine`, lowest first). A level-``k`` machine is
``m_k`` level-``(k-1)`` machines joined by links of bandwidth ``B_k`` (a level-0 machine is one
device). Layers (a :class:`~parplan.pipeline.profile.PipelineProfile`, topological order) are
split into contiguous stages; a stage at level ``k`` runs on ``m`` level-``(k-1)`` machines as
data-parallel replicas, each replica running the best plan of those layers on one
level-``(k-1)`` machine. PipeDream's recurrences, in seconds per minibatch:

- ``T^k(i->j, m) = max(A^{k-1}(i->j), sync_k(W(i..j), m)) / m`` with ``A^0(i->j)`` the forward +
  backward seconds of layers ``i..j`` on one device and ``sync_k`` the all-reduce of the
  stage's weight bytes over ``m`` replicas on level-``k`` links (:class:`SyncModel`);
- ``A^k(i->j, m) = min(T^k(i->j, m), min over s, m' of max(A^k(i->s, m-m'),
  2 x (latency_k + cut_bytes(s) / B_k), T^k(s+1->j, m')))``;

the plan's time per minibatch is ``A^K(first->last, m_K)`` at the top level ``K``. A cut after
position ``s`` carries every tensor crossing it (on a chain, the activation of layer ``s``);
branching models are linearized in topological order and the result says so.

Every plan, from :func:`plan_pipeline` (the DP) or :func:`plan_exhaustive` (enumeration of
every nested plan, the cross-check), is priced by one evaluator, :func:`evaluate_plan`; a
result carries the solver's own objective next to the evaluator's price.

Memory per device of a stage = in-flight minibatches x (stage weights + stage activations)
(PipeDream's weight stashing: one weight version and one set of activations per minibatch in
flight). Under 1F1B a stage with ``r`` device replicas and ``D`` devices from it to the end of
the pipeline has ``ceil(D / r)`` minibatches in flight; for the input stage this is PipeDream's
NOAM. The DP enforces a memory limit exactly: it runs over suffixes and carries, per level,
how many devices follow per replica (see :class:`_Solver`). The one exception is a memory
limit together with idle devices on a multi-level machine, where a stage assumes the machines
after it use all their devices: the plan fits, but may be beaten by one the DP rejected.

Example:
    >>> from parplan.pipeline.profile import ProfiledLayer, PipelineProfile
    >>> layers = tuple(ProfiledLayer(f"l{i}", "", f, 2 * f, 1e6, 5e9) for i, f in enumerate((1.0, 1.0, 2.0)))
    >>> prof = PipelineProfile("toy", layers, (("l0", "l1"), ("l1", "l2")))
    >>> res = plan_pipeline(prof, flat_machine(2, bytes_per_s=1e9))
    >>> [(s.first, s.last, s.replicas) for s in res.stages], round(res.seconds_per_minibatch, 3)
    ([(0, 1, 1), (2, 2, 1)], 6.0)
    >>> round(res.speedup_vs_single, 2), round(res.speedup_vs_data_parallel, 2), res.noam
    (2.0, 1.25, 2)
"""

from __future__ import annotations

import enum
import itertools
import math
import time
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from typing import Iterator, Sequence

import numpy as np

from parplan.costmodel.hardware import ArrayNode
from parplan.errors import ConfigError, HardwareError, InfeasibleError
from parplan.pipeline.profile import PipelineProfile

__all__ = [
    "SyncModel",
    "Level",
    "Machine",
    "machine_from_array",
    "flat_machine",
    "hierarchical_machine",
    "PipelineOptions",
    "Stage",
    "LevelPlan",
    "StageReport",
    "PipelineResult",
    "plan_pipeline",
    "plan_exhaustive",
    "evaluate_plan",
    "data_parallel_plan",
    "sync_seconds",
    "transfer_seconds",
]

_INF = math.inf


class SyncModel(enum.Enum):
    """How a replicated stage's weight all-reduce over ``m`` replicas is priced.

    - ``RING``: ring all-reduce, ``2(m-1)/m x bytes / B + 2(m-1) x latency`` (the default);
    - ``PIPEDREAM``: the paper's term ``2(m-1) x bytes / B`` (every replica exchanging the full
      weights with every other, as with a parameter server).
    """

    RING = "ring"
    PIPEDREAM = "pipedream"


@dataclass(frozen=True)
class Level:
    """Level ``index`` (1 = lowest): ``machines`` level-(index-1) machines joined by links."""

    index: int
    machines: int
    bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self):
        if self.machines < 1:
            raise HardwareError(f"level {self.index}: machines must be >= 1 (got {self.machines})")
        if not self.bytes_per_s > 0:
            raise HardwareError(f"level {self.index}: link bandwidth must be > 0 bytes/s (got {self.bytes_per_s})")
        if self.latency_s < 0:
            raise HardwareError(f"level {self.index}: link latency must be >= 0 s (got {self.latency_s})")


@dataclass(frozen=True)
class Machine:
    """A hierarchy of levels, lowest first; ``devices`` = product of the levels' machines.

    ``device_flops_per_s`` / ``device_memory_bytes`` describe the (slowest / smallest) device;
    they are informational for measured profiles.
    """

    levels: tuple[Level, ...]
    description: str = ""
    device_flops_per_s: float | None = None
    device_memory_bytes: float | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.levels:
            raise HardwareError("a machine needs at least one level")
        for k, lvl in enumerate(self.levels, start=1):
            if lvl.index != k:
                raise HardwareError(
                    f"machine levels must be numbered 1, 2, ... lowest first (level {k} has index {lvl.index})"
                )

    @property
    def devices(self) -> int:
        return math.prod(lvl.machines for lvl in self.levels)

    def devices_below(self, k: int) -> int:
        """Devices in one level-``k`` machine (1 for ``k`` = 0)."""
        return math.prod(lvl.machines for lvl in self.levels[:k])

    def describe_levels(self) -> str:
        return "; ".join(
            f"level {lvl.index}: {lvl.machines} x {self.devices_below(lvl.index - 1)} device(s) at "
            f"{lvl.bytes_per_s / 1e9:g} GB/s, {lvl.latency_s * 1e6:g} us"
            for lvl in self.levels
        )


def flat_machine(devices: int, bytes_per_s: float, latency_s: float = 0.0, description: str = "") -> Machine:
    """One level of ``devices`` devices joined by links of ``bytes_per_s``.

    Example:
        >>> flat_machine(8, 25e9).devices
        8
    """
    return Machine((Level(1, devices, bytes_per_s, latency_s),), description or f"{devices} devices")


def hierarchical_machine(levels: Sequence[tuple[int, float, float]], description: str = "") -> Machine:
    """Machine from ``(machines, bytes_per_s, latency_s)`` per level, lowest first.

    Example:
        >>> m = hierarchical_machine([(8, 300e9, 2e-6), (4, 25e9, 5e-6)])
        >>> m.devices, m.devices_below(1)
        (32, 8)
    """
    lv = tuple(Level(k, int(n), float(bw), float(lat)) for k, (n, bw, lat) in enumerate(levels, start=1))
    return Machine(lv, description or " x ".join(str(lvl.machines) for lvl in reversed(lv)))


def machine_from_array(array: ArrayNode, merge_equal_levels: bool = True) -> Machine:
    """Levels of a parplan array (a binary tree, :mod:`parplan.costmodel.hardware`).

    Level ``k`` holds the links at height ``k`` above the leaves (each joins 2 level-(k-1)
    groups), priced at the slowest such link. Consecutive levels with equal bandwidth and
    latency merge into one level of more machines (``a100:16`` becomes one level of 16), which
    lets stages use any number of devices rather than powers of two. A tree whose leaves are
    not all at one depth becomes one level at its slowest link. Compute uses the slowest
    device; the notes say so when the array is heterogeneous.

    Example:
        >>> from parplan.costmodel.hardware import parse_array
        >>> m = machine_from_array(parse_array("a100:16"))
        >>> [(lvl.machines, lvl.bytes_per_s) for lvl in m.levels]
        [(16, 300000000000.0)]
        >>> [lvl.machines for lvl in machine_from_array(parse_array("a100:16"), merge_equal_levels=False).levels]
        [2, 2, 2, 2]
    """
    devices = array.devices()
    notes: list[str] = []
    slow = min(devices, key=lambda d: d.flops_per_s)
    if len({d.name for d in devices}) > 1:
        kinds = ", ".join(sorted({f"{d.name} {d.flops_per_s / 1e12:g} TFLOP/s" for d in devices}))
        notes.append(
            f"heterogeneous array ({kinds}): every device is priced as the slowest, {slow.name} "
            f"({slow.flops_per_s / 1e12:g} TFLOP/s), and the smallest memory"
        )
    n = array.count
    if n == 1:
        levels = (Level(1, 1, devices[0].link_bytes_per_s, devices[0].link_latency_s),)
        return Machine(levels, array.describe(), slow.flops_per_s, array.min_memory_bytes, tuple(notes))

    def leaf_depths(node: ArrayNode, d: int) -> set[int]:
        return {d} if node.is_leaf else leaf_depths(node.left, d + 1) | leaf_depths(node.right, d + 1)

    depths = leaf_depths(array, 0)
    links = [node.link for _, node in array.inner_nodes()]
    if len(depths) != 1:
        bw = min(lk.bytes_per_s for lk in links)
        lat = max(lk.latency_s for lk in links)
        notes.append(
            f"array tree is not a perfect binary tree ({n} devices); planned as one level of {n} devices "
            f"at its slowest link ({bw / 1e9:g} GB/s)"
        )
        return Machine((Level(1, n, bw, lat),), array.describe(), slow.flops_per_s, array.min_memory_bytes,
                       tuple(notes))
    height = depths.pop()
    by_height: dict[int, list] = {k: [] for k in range(1, height + 1)}

    def collect(node: ArrayNode, d: int) -> None:
        if node.is_leaf:
            return
        by_height[height - d].append(node.link)
        collect(node.left, d + 1)
        collect(node.right, d + 1)

    collect(array, 0)
    raw = []
    for k in range(1, height + 1):
        bws = [lk.bytes_per_s for lk in by_height[k]]
        if max(bws) > min(bws):
            notes.append(
                f"links at height {k} differ ({min(bws) / 1e9:g}..{max(bws) / 1e9:g} GB/s); using the slowest"
            )
        raw.append([2, min(bws), max(lk.latency_s for lk in by_height[k])])
    merged: list[list] = []
    for entry in raw:
        if merge_equal_levels and merged and merged[-1][1:] == entry[1:]:
            merged[-1][0] *= entry[0]
        else:
            merged.append(list(entry))
    if merge_equal_levels and len(merged) < len(raw):
        notes.append(f"levels with equal links merged: {len(raw)} tree levels -> {len(merged)} planner level(s)")
    levels = tuple(Level(k, n_, bw, lat) for k, (n_, bw, lat) in enumerate(merged, start=1))
    return Machine(levels, array.describe(), slow.flops_per_s, array.min_memory_bytes, tuple(notes))


@dataclass(frozen=True)
class PipelineOptions:
    """Planner settings.

    - ``memory_limit_bytes``: per-device limit on stashed weights + activations (None: none);
    - ``replication``: False forces a straight pipeline (every stage on one machine per level);
    - ``allow_idle``: a level may leave machines unused (else every device is used);
    - ``sync``: how weight all-reduces are priced (:class:`SyncModel`).
    """

    memory_limit_bytes: float | None = None
    replication: bool = True
    allow_idle: bool = False
    sync: SyncModel = SyncModel.RING

    def __post_init__(self):
        if self.memory_limit_bytes is not None and not self.memory_limit_bytes > 0:
            raise ConfigError(f"memory limit must be > 0 bytes (got {self.memory_limit_bytes})")
        if not isinstance(self.sync, SyncModel):
            raise ConfigError(f"sync must be a SyncModel ({', '.join(s.value for s in SyncModel)}), got {self.sync!r}")


@dataclass(frozen=True)
class Stage:
    """A stage of a level plan: layers ``first..last`` (positions) on ``replicas`` machines of
    the level below, each running ``inner`` (None at level 1, where a machine is a device)."""

    first: int
    last: int
    replicas: int
    inner: "LevelPlan | None" = None


@dataclass(frozen=True)
class LevelPlan:
    """The stages of one level-``level`` machine, in pipeline order."""

    level: int
    stages: tuple[Stage, ...]

    @property
    def first(self) -> int:
        return self.stages[0].first

    @property
    def last(self) -> int:
        return self.stages[-1].last


@dataclass(frozen=True)
class StageReport:
    """One flattened stage: a contiguous layer range on ``replicas`` devices.

    ``compute_seconds`` is one replica's forward + backward time per minibatch;
    ``sync_seconds`` its weight all-reduce at level 1 (0 without replicas there);
    ``seconds_per_minibatch`` the largest term this stage puts into the pipeline time
    (compute and all-reduces of it and of the enclosing replicated groups, divided by the
    replication). ``cut_*`` describe the transfer to the next stage (0 for the last).
    """

    index: int
    first: int
    last: int
    layers: tuple[str, ...]
    replicas: int
    compute_seconds: float
    sync_seconds: float
    seconds_per_minibatch: float
    parameter_bytes: float
    activation_bytes: float
    in_flight: int
    weight_stash_bytes: float
    activation_stash_bytes: float
    cut_bytes: float
    cut_level: int
    cut_seconds: float

    @property
    def memory_bytes(self) -> float:
        """Per-device memory: stashed weight versions + activations of in-flight minibatches."""
        return self.weight_stash_bytes + self.activation_stash_bytes


@dataclass(frozen=True)
class PipelineResult:
    """A priced pipeline plan; times in seconds per minibatch.

    ``objective_seconds`` is what the solver itself reported; ``seconds_per_minibatch`` the
    evaluator's price (they agree for the DP and the exhaustive search). ``bottleneck_stage``
    indexes ``stages``, or when ``bottleneck`` is a transfer, the stage the transfer leaves.
    """

    model: str
    source: str
    machine: Machine
    options: PipelineOptions
    plan: LevelPlan
    stages: tuple[StageReport, ...]
    seconds_per_minibatch: float
    objective_seconds: float
    bottleneck: str
    bottleneck_stage: int
    single_device_seconds: float
    data_parallel_seconds: float
    data_parallel_fits: bool
    devices_used: int
    memory_fits: bool
    solver: str
    solve_seconds: float
    notes: tuple[str, ...] = ()
    plans_examined: int = 0

    @property
    def throughput_per_s(self) -> float:
        """Minibatches per second in steady state."""
        return 1.0 / self.seconds_per_minibatch

    @property
    def speedup_vs_single(self) -> float:
        return self.single_device_seconds / self.seconds_per_minibatch

    @property
    def speedup_vs_data_parallel(self) -> float:
        return self.data_parallel_seconds / self.seconds_per_minibatch

    @property
    def noam(self) -> int:
        """In-flight minibatches at the input stage, ceil(devices used / its replicas)."""
        return self.stages[0].in_flight

    def summary(self) -> str:
        """One line: stages, replication, time, speedups."""
        shape = "-".join(str(s.replicas) for s in self.stages)
        return (
            f"{self.model} on {self.machine.description} ({self.devices_used}/{self.machine.devices} devices): "
            f"{len(self.stages)} stage(s) [{shape}], {self.seconds_per_minibatch * 1e3:.3f} ms/minibatch, "
            f"{self.speedup_vs_single:.2f}x one device, {self.speedup_vs_data_parallel:.2f}x data parallel, "
            f"bottleneck {self.bottleneck}"
        )

    def to_table(self) -> str:
        """Plain-text report: settings, one row per stage, totals and notes."""
        o = self.options
        lines = [
            f"pipeline plan for {self.model} ({self.solver}, {self.solve_seconds:.2f} s)",
            f"  source:  {self.source}",
            f"  machine: {self.machine.description}; {self.machine.describe_levels()}",
            "  options: memory limit "
            + (f"{o.memory_limit_bytes / 2**30:g} GiB" if o.memory_limit_bytes else "none")
            + f", replication {'on' if o.replication else 'off (straight pipeline)'}"
            + f", idle devices {'allowed' if o.allow_idle else 'not allowed'}, weight sync {o.sync.value}",
            "",
        ]
        header = ("stage", "layers", "n", "devices", "compute ms", "time ms", "in-flight", "memory GiB", "cut MB",
                  "cut ms", "cut level")
        rows = []
        for s in self.stages:
            names = s.layers[0] if len(s.layers) == 1 else f"{s.layers[0]}..{s.layers[-1]}"
            rows.append((
                str(s.index), names, str(len(s.layers)), str(s.replicas), f"{s.compute_seconds * 1e3:.3f}",
                f"{s.seconds_per_minibatch * 1e3:.3f}", str(s.in_flight), f"{s.memory_bytes / 2**30:.2f}",
                f"{s.cut_bytes / 1e6:.2f}" if s.index < len(self.stages) - 1 else "-",
                f"{s.cut_seconds * 1e3:.3f}" if s.index < len(self.stages) - 1 else "-",
                str(s.cut_level) if s.index < len(self.stages) - 1 else "-",
            ))
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        for r in (header, *rows):
            cells = (c.ljust(w) if i == 1 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
            lines.append("  " + "  ".join(cells))
        dp = f"{self.data_parallel_seconds * 1e3:.3f} ms"
        if not self.data_parallel_fits:
            dp += " (exceeds the memory limit)"
        lines += [
            "",
            f"  time per minibatch:  {self.seconds_per_minibatch * 1e3:.3f} ms "
            f"({self.throughput_per_s:.2f} minibatches/s); bottleneck: {self.bottleneck}",
            f"  one device:          {self.single_device_seconds * 1e3:.3f} ms -> "
            f"speedup {self.speedup_vs_single:.2f}x",
            f"  data parallel:       {dp} -> speedup {self.speedup_vs_data_parallel:.2f}x",
            f"  devices used:        {self.devices_used} of {self.machine.devices}; "
            f"NOAM (1F1B in-flight at input) {self.noam}",
        ]
        if not self.memory_fits:
            lines.append("  WARNING: some stage exceeds the memory limit")
        dev_mem = self.machine.device_memory_bytes
        largest = max(s.memory_bytes for s in self.stages)
        if dev_mem and largest > dev_mem:
            lines.append(
                f"  note: the largest stage needs {largest / 2**30:.1f} GiB per device, "
                f"more than the device's {dev_mem / 2**30:.0f} GiB; set --memory-limit to plan within it"
            )
        for note in self.notes:
            lines.append(f"  note: {note}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """JSON-ready dictionary (seconds and bytes as plain floats)."""
        o = self.options
        return {
            "model": self.model,
            "source": self.source,
            "solver": self.solver,
            "solve_seconds": self.solve_seconds,
            "machine": {
                "description": self.machine.description,
                "devices": self.machine.devices,
                "levels": [asdict(lvl) for lvl in self.machine.levels],
            },
            "options": {
                "memory_limit_bytes": o.memory_limit_bytes,
                "replication": o.replication,
                "allow_idle": o.allow_idle,
                "sync": o.sync.value,
            },
            "stages": [
                {**{k: v for k, v in asdict(s).items()}, "layers": list(s.layers), "memory_bytes": s.memory_bytes}
                for s in self.stages
            ],
            "seconds_per_minibatch": self.seconds_per_minibatch,
            "objective_seconds": self.objective_seconds,
            "throughput_per_s": self.throughput_per_s,
            "bottleneck": self.bottleneck,
            "bottleneck_stage": self.bottleneck_stage,
            "single_device_seconds": self.single_device_seconds,
            "speedup_vs_single": self.speedup_vs_single,
            "data_parallel_seconds": self.data_parallel_seconds,
            "data_parallel_fits": self.data_parallel_fits,
            "speedup_vs_data_parallel": self.speedup_vs_data_parallel,
            "devices_used": self.devices_used,
            "noam": self.noam,
            "memory_fits": self.memory_fits,
            "notes": list(self.notes),
            "plan": _plan_to_dict(self.plan),
        }


def _plan_to_dict(plan: LevelPlan) -> dict:
    return {
        "level": plan.level,
        "stages": [
            {"first": s.first, "last": s.last, "replicas": s.replicas,
             "inner": _plan_to_dict(s.inner) if s.inner else None}
            for s in plan.stages
        ],
    }


# --------------------------------------------------------------------------------------------
# Cost primitives (shared by the DP and the evaluator).


def sync_seconds(bytes_: float, replicas: int, level: Level, model: SyncModel = SyncModel.RING) -> float:
    """Seconds to all-reduce ``bytes_`` of weights over ``replicas`` replicas on ``level``'s links.

    Example:
        >>> sync_seconds(1e9, 4, Level(1, 4, 1e9))
        1.5
        >>> sync_seconds(1e9, 1, Level(1, 4, 1e9))
        0.0
    """
    if replicas <= 1:
        return 0.0
    if model is SyncModel.RING:
        return 2.0 * (replicas - 1) / replicas * bytes_ / level.bytes_per_s + 2.0 * (replicas - 1) * level.latency_s
    return 2.0 * (replicas - 1) * bytes_ / level.bytes_per_s


def transfer_seconds(bytes_: float, level: Level) -> float:
    """Seconds per minibatch to move a cut's activations forward and its gradients back.

    Example:
        >>> transfer_seconds(1e9, Level(1, 2, 1e9, latency_s=0.5))
        3.0
    """
    return 2.0 * (level.latency_s + bytes_ / level.bytes_per_s)


class _Sums:
    """Range sums over layer positions: ``compute[i, j]`` etc. for layers ``i..j`` (inf if j < i)."""

    def __init__(self, profile: PipelineProfile):
        n = len(profile.layers)
        if n == 0:
            raise ConfigError(f"profile '{profile.name}' has no layers")
        self.n = n
        self.names = tuple(layer.name for layer in profile.layers)
        self.compute = self._ranges([layer.compute_seconds for layer in profile.layers])
        self.params = self._ranges([layer.parameter_bytes for layer in profile.layers])
        self.acts = self._ranges([layer.activation_bytes for layer in profile.layers])
        self.stash = self.params + self.acts
        self.cut = np.asarray(profile.cut_bytes(), dtype=float)

    def _ranges(self, values: list[float]) -> np.ndarray:
        prefix = np.concatenate(([0.0], np.cumsum(np.asarray(values, dtype=float))))
        out = prefix[None, 1:] - prefix[:-1, None]
        out[np.tril_indices(self.n, -1)] = _INF
        return out


# --------------------------------------------------------------------------------------------
# Evaluator.


def _check_level_plan(
    plan: LevelPlan, level: int, first: int, last: int, machine: Machine, options: PipelineOptions
) -> None:
    lvl = machine.levels[level - 1]
    where = f"plan at level {level} for layers {first}..{last}"
    if not isinstance(plan, LevelPlan) or plan.level != level:
        raise ConfigError(f"{where}: expected a LevelPlan of level {level} (got {plan!r:.80})")
    if not plan.stages:
        raise ConfigError(f"{where}: has no stages")
    pos = first
    for s in plan.stages:
        if s.first != pos or s.last < s.first:
            raise ConfigError(
                f"{where}: stages must cover the layers contiguously; stage {s.first}..{s.last} breaks at {pos}"
            )
        if s.replicas < 1:
            raise ConfigError(f"{where}: stage {s.first}..{s.last} needs replicas >= 1 (got {s.replicas})")
        if not options.replication and s.replicas != 1:
            raise ConfigError(f"{where}: stage {s.first}..{s.last} is replicated but replication is off")
        if level == 1 and s.inner is not None:
            raise ConfigError(f"{where}: level-1 stages run on single devices and take no inner plan")
        if level > 1:
            if s.inner is None:
                raise ConfigError(f"{where}: stage {s.first}..{s.last} needs an inner plan of level {level - 1}")
            _check_level_plan(s.inner, level - 1, s.first, s.last, machine, options)
        pos = s.last + 1
    if pos != last + 1:
        raise ConfigError(f"{where}: stages end at {pos - 1}, not at {last}")
    used = sum(s.replicas for s in plan.stages)
    if used > lvl.machines or (not options.allow_idle and used != lvl.machines):
        rule = "at most" if options.allow_idle else "exactly"
        raise ConfigError(f"{where}: stages use {used} machines; level {level} has {rule} {lvl.machines}")


def _price(plan: LevelPlan, sums: _Sums, machine: Machine, sync: SyncModel) -> float:
    """Seconds per minibatch of a level plan (the recurrence ``A^k``), recursively."""
    lvl = machine.levels[plan.level - 1]
    terms = []
    for s in plan.stages:
        inner = sums.compute[s.first, s.last] if plan.level == 1 else _price(s.inner, sums, machine, sync)
        terms.append(max(inner, sync_seconds(sums.params[s.first, s.last], s.replicas, lvl, sync)) / s.replicas)
    for s in plan.stages[:-1]:
        terms.append(transfer_seconds(sums.cut[s.last], lvl))
    return max(terms)


def _flatten(plan: LevelPlan, sums: _Sums, machine: Machine, sync: SyncModel, outer: int,
             outer_terms: tuple[float, ...], stages: list, cuts: list) -> None:
    """Flat stages (first, last, devices, compute, sync1, effective) and cuts (after, level, bytes, effective)."""
    lvl = machine.levels[plan.level - 1]
    for n, s in enumerate(plan.stages):
        own_sync = sync_seconds(sums.params[s.first, s.last], s.replicas, lvl, sync)
        own_term = own_sync / (s.replicas * outer)
        if plan.level == 1:
            compute = float(sums.compute[s.first, s.last])
            eff = max(compute / (s.replicas * outer), own_term, *outer_terms)
            stages.append((s.first, s.last, s.replicas * outer, compute, float(own_sync), float(eff)))
        else:
            _flatten(s.inner, sums, machine, sync, outer * s.replicas, outer_terms + (own_term,), stages, cuts)
        if n < len(plan.stages) - 1:
            b = float(sums.cut[s.last])
            cuts.append((s.last, plan.level, b, float(transfer_seconds(b, lvl) / outer)))


def _memory(flat: list, sums: _Sums) -> list[tuple[int, float, float]]:
    """(in-flight, weight stash bytes, activation stash bytes) per flat stage under 1F1B."""
    out = []
    downstream = sum(f[2] for f in flat)
    for first, last, devices, *_ in flat:
        in_flight = -(-downstream // devices)
        out.append((in_flight, in_flight * float(sums.params[first, last]), in_flight * float(sums.acts[first, last])))
        downstream -= devices
    return out


def _fits(flat: list, sums: _Sums, limit: float | None) -> bool:
    if limit is None:
        return True
    return all(w + a <= limit for _, w, a in _memory(flat, sums))


def data_parallel_plan(machine: Machine, layers: int) -> LevelPlan:
    """The plan with one stage of all ``layers`` at every level, replicated on every machine."""
    plan = None
    for lvl in machine.levels:
        plan = LevelPlan(lvl.index, (Stage(0, layers - 1, lvl.machines, plan),))
    return plan


def evaluate_plan(
    profile: PipelineProfile,
    machine: Machine,
    plan: LevelPlan,
    options: PipelineOptions = PipelineOptions(),
    solver: str = "evaluate",
    objective_seconds: float | None = None,
    solve_seconds: float = 0.0,
    plans_examined: int = 0,
) -> PipelineResult:
    """Price any nested plan: time per minibatch, per-stage memory, bottleneck and baselines.

    Raises :class:`~parplan.errors.ConfigError` if the plan does not cover the layers
    contiguously, uses the wrong number of machines at a level, or replicates with
    replication off. A plan over the memory limit is priced and flagged (``memory_fits``).
    """
    sums = _Sums(profile)
    top = len(machine.levels)
    _check_level_plan(plan, top, 0, sums.n - 1, machine, options)
    seconds = float(_price(plan, sums, machine, options.sync))
    flat: list = []
    cuts: list = []
    _flatten(plan, sums, machine, options.sync, 1, (), flat, cuts)
    mem = _memory(flat, sums)
    cut_after = {c[0]: c for c in cuts}
    reports = []
    for idx, ((first, last, devices, compute, sync1, eff), (in_flight, w, a)) in enumerate(zip(flat, mem)):
        c = cut_after.get(last, (last, 0, 0.0, 0.0))
        reports.append(StageReport(
            index=idx, first=first, last=last, layers=sums.names[first:last + 1], replicas=devices,
            compute_seconds=compute, sync_seconds=sync1, seconds_per_minibatch=eff,
            parameter_bytes=float(sums.params[first, last]), activation_bytes=float(sums.acts[first, last]),
            in_flight=in_flight, weight_stash_bytes=w, activation_stash_bytes=a,
            cut_bytes=c[2], cut_level=c[1], cut_seconds=c[3],
        ))
    worst_stage = max(range(len(reports)), key=lambda i: reports[i].seconds_per_minibatch)
    bottleneck, b_idx = f"stage {worst_stage}", worst_stage
    if cuts:
        worst_cut = max(range(len(cuts)), key=lambda i: cuts[i][3])
        if cuts[worst_cut][3] > reports[worst_stage].seconds_per_minibatch:
            bottleneck = f"transfer after stage {worst_cut} (level {cuts[worst_cut][1]})"
            b_idx = worst_cut
    limit = options.memory_limit_bytes
    dp_plan = data_parallel_plan(machine, sums.n)
    dp_flat: list = []
    _flatten(dp_plan, sums, machine, options.sync, 1, (), dp_flat, [])
    notes = tuple(profile.notes) + tuple(machine.notes)
    if options.sync is SyncModel.RING:
        notes += ("weight sync priced as a ring all-reduce per level",)
    return PipelineResult(
        model=profile.name,
        source=profile.source,
        machine=machine,
        options=options,
        plan=plan,
        stages=tuple(reports),
        seconds_per_minibatch=seconds,
        objective_seconds=seconds if objective_seconds is None else objective_seconds,
        bottleneck=bottleneck,
        bottleneck_stage=b_idx,
        single_device_seconds=float(sums.compute[0, sums.n - 1]),
        data_parallel_seconds=float(_price(dp_plan, sums, machine, options.sync)),
        data_parallel_fits=_fits(dp_flat, sums, limit),
        devices_used=sum(r.replicas for r in reports),
        memory_fits=all(r.memory_bytes <= limit for r in reports) if limit is not None else True,
        solver=solver,
        solve_seconds=solve_seconds,
        notes=notes,
        plans_examined=plans_examined,
    )


# --------------------------------------------------------------------------------------------
# Dynamic program.


class _Solver:
    """PipeDream's DP in suffix form, memory-exact through the downstream parameter ``q``.

    Under 1F1B a flat stage with ``r`` device replicas and ``D`` devices from it to the end of
    the pipeline holds ``ceil(D / r)`` minibatches. Seen from a level-``k`` plan that is itself
    replicated ``R`` times (all enclosing replications) with ``a`` devices after it, the only
    outside information a stage inside it needs is ``q = a / R``: a level-1 stage on ``rho``
    devices with ``d`` devices from it to the end of its level-1 machine holds
    ``ceil((d + q) / rho)``. A stage on ``r`` of ``m`` machines, followed by ``m - r`` machines
    of ``devices_below`` devices each, passes ``q' = (q + (m - r) x devices_below) / r`` to its
    inner plan. Tables ``A^k(i->j, m | q)`` are memoised per distinct ``q`` (one per level
    without a memory limit).
    """

    def __init__(self, sums: _Sums, machine: Machine, options: PipelineOptions):
        self.sums, self.machine, self.options = sums, machine, options
        self.limit = options.memory_limit_bytes
        self.X = [np.array([transfer_seconds(b, lvl) for b in sums.cut]) for lvl in machine.levels]
        self._stage: dict = {}
        self._tables: dict = {}

    def _q(self, q: Fraction) -> Fraction:
        return Fraction(0) if self.limit is None else q

    def stage_times(self, k: int, r: int, q: Fraction) -> np.ndarray:
        """``T^k(i->s, r)[i, s]`` for a stage on ``r`` machines whose inner plans see ``q``."""
        key = (k, r, self._q(q))
        if key in self._stage:
            return self._stage[key]
        n, lvl = self.sums.n, self.machine.levels[k - 1]
        if r > 1 and not self.options.replication:
            out = np.full((n, n), _INF)
        else:
            if k == 1:
                inner = self.sums.compute
                if self.limit is not None:
                    in_flight = math.ceil(1 + q)
                    inner = np.where(in_flight * self.sums.stash <= self.limit, inner, _INF)
            else:
                inner = self.full(k - 1, q)[0]
            if r == 1:
                sync = 0.0
            elif self.options.sync is SyncModel.RING:
                sync = 2.0 * (r - 1) / r * self.sums.params / lvl.bytes_per_s + 2.0 * (r - 1) * lvl.latency_s
            else:
                sync = 2.0 * (r - 1) * self.sums.params / lvl.bytes_per_s
            out = np.maximum(inner, sync) / r
        self._stage[key] = out
        return out

    def table(self, k: int, q: Fraction, top: bool = False):
        """(A, choice_s, choice_r): best time of layers i..j on m level-k machines.

        ``top``: only ranges ending at the last layer (arrays indexed [i, m]). The first stage
        of range i..j is i..s on r machines; ``choice_s == j`` means one stage on all m.
        """
        key = (k, self._q(q), top)
        if key in self._tables:
            return self._tables[key]
        n = self.sums.n
        M = self.machine.levels[k - 1].machines
        below = self.machine.devices_below(k - 1)
        X = self.X[k - 1]
        shape = (n, M + 1) if top else (n, n, M + 1)
        A = np.full(shape, _INF)
        cs = np.zeros(shape, dtype=np.int64)
        cr = np.zeros(shape, dtype=np.int64)
        for m in range(1, M + 1):
            single = self.stage_times(k, m, q / m)
            best = single[:, n - 1].copy() if top else single.copy()
            bs = np.full(best.shape, n - 1, dtype=np.int64) if top else np.broadcast_to(np.arange(n), (n, n)).copy()
            br = np.full(best.shape, m, dtype=np.int64)
            for r in range(1, m):
                if n == 1:
                    break
                T = self.stage_times(k, r, (q + (m - r) * below) / r)
                left = np.maximum(T[:, : n - 1], X[None, :])  # [i, s]
                if top:
                    cand = np.maximum(left, A[1:n, m - r][None, :])
                    s_best = cand.argmin(axis=1)
                    val = cand[np.arange(n), s_best]
                else:
                    cube = np.maximum(left[:, :, None], A[1:n, :, m - r][None, :, :])  # [i, s, j]
                    s_best = cube.argmin(axis=1)
                    val = np.take_along_axis(cube, s_best[:, None, :], axis=1)[:, 0, :]
                better = val < best
                best = np.where(better, val, best)
                bs = np.where(better, s_best, bs)
                br = np.where(better, r, br)
            A[..., m] = best
            cs[..., m] = bs
            cr[..., m] = br
        self._tables[key] = (A, cs, cr)
        return A, cs, cr

    def full(self, k: int, q: Fraction) -> tuple[np.ndarray, np.ndarray]:
        """Best time of each range on one whole level-k machine, and the machines it uses."""
        key = ("full", k, self._q(q))
        if key not in self._tables:
            A = self.table(k, q)[0]
            M = self.machine.levels[k - 1].machines
            if self.options.allow_idle:
                m_used = A[:, :, 1:].argmin(axis=2) + 1  # first minimum: fewest machines on ties
                best = np.take_along_axis(A, m_used[:, :, None], axis=2)[:, :, 0]
            else:
                m_used, best = np.full(A.shape[:2], M, dtype=np.int64), A[:, :, M]
            self._tables[key] = (best, m_used)
        return self._tables[key]

    def plan(self, k: int, i: int, j: int, m: int, q: Fraction, top: bool = False) -> LevelPlan:
        """Reconstruct the level-k plan of layers i..j on m machines from the choices."""
        _, cs, cr = self.table(k, q, top)
        below = self.machine.devices_below(k - 1)
        stages = []
        while True:
            idx = (i, m) if top else (i, j, m)
            s, r = int(cs[idx]), int(cr[idx])
            q_inner = q / m if s == j else (q + (m - r) * below) / r
            inner = None
            if k > 1:
                inner = self.plan(k - 1, i, s, int(self.full(k - 1, q_inner)[1][i, s]), q_inner)
            stages.append(Stage(i, s, r, inner))
            if s == j:
                return LevelPlan(k, tuple(stages))
            i, m = s + 1, m - r


def plan_pipeline(
    profile: PipelineProfile, machine: Machine, options: PipelineOptions = PipelineOptions()
) -> PipelineResult:
    """PipeDream's DP over ``profile`` on ``machine`` (see the module docstring).

    Every level fills ``A^k(i->j, m)`` over suffixes (first stage, then the rest) so that each
    stage knows how many devices follow it and the 1F1B memory check is exact; the top level
    only needs ranges ending at the last layer. Ties go to fewer stages, then earlier cuts.
    Raises :class:`~parplan.errors.InfeasibleError` when no plan fits the memory limit or a
    straight pipeline has more devices than layers (allow idle devices, or replication).
    """
    t0 = time.perf_counter()
    sums = _Sums(profile)
    n, K = sums.n, len(machine.levels)
    solver = _Solver(sums, machine, options)
    B = solver.table(K, Fraction(0), top=True)[0]
    M = machine.levels[K - 1].machines
    m_top = int(np.argmin(B[0, 1:]) + 1) if options.allow_idle else M
    objective = float(B[0, m_top])
    if not math.isfinite(objective):
        raise InfeasibleError(_infeasible_message(profile, machine, options, sums))
    plan = solver.plan(K, 0, n - 1, m_top, Fraction(0), top=True)
    result = evaluate_plan(profile, machine, plan, options, solver="dp", objective_seconds=objective,
                           solve_seconds=time.perf_counter() - t0)
    if K > 1 and options.memory_limit_bytes is not None and options.allow_idle:
        note = (
            "memory limit with idle devices on a multi-level machine: stages assume the machines after them use "
            "all their devices, so the plan fits but a plan the DP rejected may be faster"
        )
        result = replace(result, notes=result.notes + (note,))
    return result


def _infeasible_message(profile: PipelineProfile, machine: Machine, options: PipelineOptions, sums: _Sums) -> str:
    if not options.replication and not options.allow_idle and sums.n < machine.devices:
        return (
            f"model '{profile.name}': a straight pipeline needs one layer per device but has {sums.n} layers for "
            f"{machine.devices} devices; allow idle devices or replication"
        )
    biggest = max(float(sums.stash[i, i]) for i in range(sums.n))
    limit = options.memory_limit_bytes or _INF
    return (
        f"model '{profile.name}': no pipeline fits the memory limit of {limit / 2**30:.3g} GiB per device "
        f"(the largest layer alone stashes {biggest / 2**30:.3g} GiB per in-flight minibatch); "
        "raise the memory limit, allow replication or use more devices"
    )


# --------------------------------------------------------------------------------------------
# Exhaustive cross-check.


def _compositions(first: int, last: int) -> Iterator[list[tuple[int, int]]]:
    n = last - first + 1
    for k in range(n):
        for cuts in itertools.combinations(range(first, last), k):
            bounds = [first - 1, *cuts, last]
            yield [(bounds[t] + 1, bounds[t + 1]) for t in range(len(bounds) - 1)]


def _replica_vectors(stages: int, machines: int, options: PipelineOptions) -> Iterator[tuple[int, ...]]:
    if not options.replication:
        if stages == machines or (options.allow_idle and stages <= machines):
            yield (1,) * stages
        return
    totals = range(stages, machines + 1) if options.allow_idle else (machines,)
    for total in totals:
        # All compositions of `total` into `stages` positive parts.
        for cuts in itertools.combinations(range(1, total), stages - 1):
            bounds = (0, *cuts, total)
            yield tuple(bounds[t + 1] - bounds[t] for t in range(stages))


def _all_plans(level: int, first: int, last: int, machine: Machine, options: PipelineOptions) -> Iterator[LevelPlan]:
    machines = machine.levels[level - 1].machines
    for ranges in _compositions(first, last):
        for reps in _replica_vectors(len(ranges), machines, options):
            if level == 1:
                yield LevelPlan(1, tuple(Stage(a, b, r) for (a, b), r in zip(ranges, reps)))
                continue
            inners = [list(_all_plans(level - 1, a, b, machine, options)) for a, b in ranges]
            for combo in itertools.product(*inners):
                yield LevelPlan(level, tuple(Stage(a, b, r, p) for (a, b), r, p in zip(ranges, reps, combo)))


def plan_exhaustive(
    profile: PipelineProfile,
    machine: Machine,
    options: PipelineOptions = PipelineOptions(),
    max_plans: int = 200_000,
) -> PipelineResult:
    """Best plan by enumerating every nested plan (contiguous partitions x replication factors
    at every level) and pricing each with the evaluator. For small inputs: the cross-check of
    :func:`plan_pipeline`. Raises :class:`~parplan.errors.ConfigError` past ``max_plans``.
    """
    t0 = time.perf_counter()
    sums = _Sums(profile)
    K = len(machine.levels)
    best, best_plan, count = _INF, None, 0
    for plan in _all_plans(K, 0, sums.n - 1, machine, options):
        count += 1
        if count > max_plans:
            raise ConfigError(
                f"exhaustive search of '{profile.name}': more than {max_plans} plans; use plan_pipeline or a "
                "smaller instance (fewer layers or devices)"
            )
        seconds = float(_price(plan, sums, machine, options.sync))
        if seconds >= best:
            continue
        if options.memory_limit_bytes is not None:
            flat: list = []
            _flatten(plan, sums, machine, options.sync, 1, (), flat, [])
            if not _fits(flat, sums, options.memory_limit_bytes):
                continue
        best, best_plan = seconds, plan
    if best_plan is None:
        raise InfeasibleError(_infeasible_message(profile, machine, options, sums))
    return evaluate_plan(profile, machine, best_plan, options, solver="exhaustive", objective_seconds=best,
                         solve_seconds=time.perf_counter() - t0, plans_examined=count)
