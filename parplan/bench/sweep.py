"""Sweeps: every combination of models, arrays, batches, planners and link overrides, one row each
(``parplan.sweep``, ``parplan sweep``; issue 36).

Each case is planned as ``parplan plan`` plans it (against each device's memory by default, the
memory techniques searched; ``memory_limit_gib`` sets another limit, ``ignore_memory`` none) and
priced by the evaluator next to data parallelism. The table carries every axis of the sweep as a
column, so sweeps can be concatenated; a case that fails (a model that does not import, no plan
that fits) is a row with its one-line ``error`` and empty figures, never a lost sweep. Cases run
in a local process pool (default), on Dask, or serially (:class:`~parplan.bench.common.ExecutorSpec`).

Example:
    >>> from parplan.bench.common import ExecutorSpec
    >>> t = sweep(["lenet"], ["h100:2", "h100:4"], planners=["accpar", "data"], batches=[64],
    ...           executor=ExecutorSpec("serial"), log=None)
    >>> len(t), list(t.columns[:6])
    (4, ['model', 'array', 'batch', 'planner', 'bandwidth_gb_per_s', 'latency_us'])
    >>> bool((t.step_time_s <= t.data_parallel_step_time_s * (1 + 1e-12)).all())
    True
"""

from __future__ import annotations

import itertools
import time
from typing import Iterable, Sequence, TextIO

import pandas as pd

from parplan.bench.common import STDERR, ExecutorSpec, Task, run_tasks
from parplan.errors import ConfigError

#: Columns of a sweep's table, in order (the axes first).
COLUMNS = (
    "model",
    "array",
    "batch",
    "planner",
    "bandwidth_gb_per_s",
    "latency_us",
    "fabric",
    "memory_limit_gib",
    "devices",
    "step_time_s",
    "data_parallel_step_time_s",
    "speedup_over_data_parallel",
    "communication_bytes",
    "peak_memory_bytes",
    "zero_stage",
    "recompute",
    "micro_batches",
    "planning_cpu_s",
    "error",
)


def sweep_case(
    model: str,
    array: str,
    batch: int,
    planner: str,
    bandwidth_gb_per_s: float | None,
    latency_us: float | None,
    fabric: str,
    memory_limit_gib: float | None,
    ignore_memory: bool,
    overlap: bool,
) -> dict:
    """One case: its plan (fitted to memory unless ``ignore_memory``), priced next to data parallelism."""
    from parplan.costmodel.evaluate import evaluate
    from parplan.costmodel.hardware import parse_array
    from parplan.costmodel.problem import Problem
    from parplan.errors import ParplanError
    from parplan.models.modelfile import load_model
    from parplan.solvers.fit import fit_plan
    from parplan.solvers.planners import make_plan

    row = {
        "model": model,
        "array": array,
        "batch": batch,
        "planner": planner,
        "bandwidth_gb_per_s": bandwidth_gb_per_s,
        "latency_us": latency_us,
        "fabric": fabric,
        "memory_limit_gib": "ignored" if ignore_memory else (memory_limit_gib or "device"),
    }
    start = time.process_time()
    try:
        arr = parse_array(
            array,
            bandwidth_bytes_per_s=None if bandwidth_gb_per_s is None else bandwidth_gb_per_s * 1e9,
            latency_s=None if latency_us is None else latency_us * 1e-6,
            fabric=fabric,
        )
        problem = Problem(load_model(model), arr, batch=batch, overlap=overlap)
        if ignore_memory:
            plan = make_plan(problem, planner)
        else:
            fit = fit_plan(
                problem, planner, None if memory_limit_gib is None else memory_limit_gib * 2**30
            )
            problem, plan = fit.problem, fit.plan
        ev = evaluate(problem, plan)
        base = evaluate(problem, make_plan(problem, "data"))
    except ParplanError as exc:  # the case's own failure: a row that says why
        return {
            **row,
            "planning_cpu_s": time.process_time() - start,
            "error": str(exc).splitlines()[0],
        }
    return {
        **row,
        "devices": problem.array.count,
        "step_time_s": ev.step_time_s,
        "data_parallel_step_time_s": base.step_time_s,
        "speedup_over_data_parallel": base.step_time_s / ev.step_time_s
        if ev.step_time_s > 0
        else None,
        "communication_bytes": ev.communication_bytes,
        "peak_memory_bytes": ev.peak_memory_bytes,
        "zero_stage": problem.zero_stage,
        "recompute": problem.recompute,
        "checkpoint": problem.checkpoint,
        "micro_batches": problem.micro_batches,
        "planning_cpu_s": time.process_time() - start,
        "error": None,
    }


def _values(name: str, values, default) -> list:
    if values is None:
        return [default]
    if isinstance(values, (str, int, float)):
        values = [values]
    out = list(values)
    if not out:
        raise ConfigError(f"sweep: {name} needs at least one value")
    return out


def sweep(
    models: Sequence[str] | str,
    arrays: Sequence[str] | str,
    planners: Iterable[str] | str = ("accpar",),
    batches: Iterable[int] | int | None = None,
    bandwidths: Iterable[float | None] | None = None,
    latencies: Iterable[float | None] | None = None,
    fabric: str = "devices",
    memory_limit_gib: float | None = None,
    ignore_memory: bool = False,
    overlap: bool = True,
    executor: ExecutorSpec | None = None,
    log: TextIO | None = STDERR,
) -> pd.DataFrame:
    """Plan every combination of ``models`` x ``arrays`` x ``batches`` (default 512) x
    ``planners`` x ``bandwidths`` (GB/s per link, None: the array's own) x ``latencies`` (us);
    one row per case with the columns :data:`COLUMNS` (module docstring)."""
    from parplan.solvers.planners import PLANNERS

    models, arrays = _values("models", models, None), _values("arrays", arrays, None)
    planners = [str(p).strip().lower() for p in _values("planners", planners, "accpar")]
    unknown = [p for p in planners if p not in PLANNERS]
    if unknown:
        raise ConfigError(
            f"sweep: unknown planner(s) {', '.join(unknown)}; valid: {', '.join(PLANNERS)}"
        )
    batches = _values("batches", batches, 512)
    for b in batches:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ConfigError(f"sweep: batches must be integers >= 1 (got {b!r})")
    bandwidths, latencies = (
        _values("bandwidths", bandwidths, None),
        _values("latencies", latencies, None),
    )
    for what, values in (("bandwidths", bandwidths), ("latencies", latencies)):
        for v in values:
            if v is not None and (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not 0 <= v < float("inf")
                or (what == "bandwidths" and v == 0)
            ):
                raise ConfigError(
                    f"sweep: {what} must be finite numbers > 0 (or None for the array's own; got {v!r})"
                )
    if memory_limit_gib is not None and not 0 < float(memory_limit_gib) < float("inf"):
        raise ConfigError(
            f"sweep: memory_limit_gib must be a finite number > 0 (got {memory_limit_gib!r})"
        )
    cases = list(itertools.product(models, arrays, batches, planners, bandwidths, latencies))
    tasks = [
        Task(
            f"{m} on {a}, batch {b}, {p}"
            + (f", {bw} GB/s" if bw is not None else "")
            + (f", {lat} us" if lat is not None else ""),
            sweep_case,
            dict(
                model=m,
                array=a,
                batch=b,
                planner=p,
                bandwidth_gb_per_s=bw,
                latency_us=lat,
                fabric=fabric,
                memory_limit_gib=memory_limit_gib,
                ignore_memory=ignore_memory,
                overlap=overlap,
            ),
        )
        for m, a, b, p, bw, lat in cases
    ]
    if log is not None:
        print(f"[sweep] {len(tasks)} cases", file=log, flush=True)
    rows = run_tasks("sweep", tasks, executor or ExecutorSpec(), log=log)
    return pd.DataFrame(rows).reindex(columns=list(COLUMNS))


__all__ = ["COLUMNS", "sweep", "sweep_case"]
