"""Pipeline plans: options, stages, nested level plans, and the result with its report
(see :mod:`parplan.pipeline.planner`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


from parplan.errors import ConfigError
from parplan.pipeline.machine import Machine, SyncModel


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
            raise ConfigError(
                f"sync must be a SyncModel ({', '.join(s.value for s in SyncModel)}), got {self.sync!r}"
            )


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
        header = (
            "stage",
            "layers",
            "n",
            "devices",
            "compute ms",
            "time ms",
            "in-flight",
            "memory GiB",
            "cut MB",
            "cut ms",
            "cut level",
        )
        rows = []
        for s in self.stages:
            names = s.layers[0] if len(s.layers) == 1 else f"{s.layers[0]}..{s.layers[-1]}"
            rows.append(
                (
                    str(s.index),
                    names,
                    str(len(s.layers)),
                    str(s.replicas),
                    f"{s.compute_seconds * 1e3:.3f}",
                    f"{s.seconds_per_minibatch * 1e3:.3f}",
                    str(s.in_flight),
                    f"{s.memory_bytes / 2**30:.2f}",
                    f"{s.cut_bytes / 1e6:.2f}" if s.index < len(self.stages) - 1 else "-",
                    f"{s.cut_seconds * 1e3:.3f}" if s.index < len(self.stages) - 1 else "-",
                    str(s.cut_level) if s.index < len(self.stages) - 1 else "-",
                )
            )
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        for r in (header, *rows):
            cells = (
                c.ljust(w) if i == 1 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
            )
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
                {
                    **{k: v for k, v in asdict(s).items()},
                    "layers": list(s.layers),
                    "memory_bytes": s.memory_bytes,
                }
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
            {
                "first": s.first,
                "last": s.last,
                "replicas": s.replicas,
                "inner": _plan_to_dict(s.inner) if s.inner else None,
            }
            for s in plan.stages
        ],
    }


# --------------------------------------------------------------------------------------------
# Cost primitives (shared by the DP and the evaluator).


def data_parallel_plan(machine: Machine, layers: int) -> LevelPlan:
    """The plan with one stage of all ``layers`` at every level, replicated on every machine."""
    plan = None
    for lvl in machine.levels:
        plan = LevelPlan(lvl.index, (Stage(0, layers - 1, lvl.machines, plan),))
    return plan
