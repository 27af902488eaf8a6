"""What every benchmark shares: the task executor, arrays, exact solves, output files.

- :func:`run_tasks` runs independent tasks (plain functions over plain, picklable data) on a
  local process pool (default, ``max_workers`` fixed, 2 by default), on Dask
  (``ExecutorSpec("dask", scheduler="tcp://...")``, or a ``LocalCluster`` when no scheduler is
  given) or inline (``"serial"``, for tests and debugging), and prints one progress line per
  finished task on stderr: ``[bench accpar] 3/10 vgg16 done (1.2 s)``. Results come back in
  task order whatever the order of completion. Solver threads are fixed (1 per task, seed 0)
  through :func:`solve_options` and the ``*_NUM_THREADS`` environment of the workers.
- :func:`make_array` builds an array with every link's bandwidth overridden or scaled.
- :func:`exact_top_down` plans a problem level by level with an exact backend and records
  every split's certificate (the root's bound bounds every plan of the hierarchy).
- :func:`write_outputs` writes ``NAME.csv`` / ``NAME.png`` / ``NAME.md``; :func:`grouped_bars`
  and :func:`loglog_lines` draw the two plot kinds; :func:`md_table` renders a markdown table.

Example:
    >>> tasks = [Task(f"x{i}", pow, {"base": i, "exp": 2}) for i in range(3)]
    >>> run_tasks("demo", tasks, ExecutorSpec("serial"), log=None)
    [0, 1, 4]
    >>> geomean([1.0, 4.0]), make_array("tpu-v2:1,tpu-v3:1", bandwidth_gbps=10).link.bytes_per_s
    (2.0, 10000000000.0)
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, TextIO

#: Thread counts fixed for every benchmark process (BLAS, OpenMP, solver libraries).
THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
for _k, _v in THREAD_ENV.items():
    os.environ.setdefault(_k, _v)

import pandas as pd  # noqa: E402

from parplan.costmodel.hardware import ArrayNode, Link, parse_array  # noqa: E402
from parplan.errors import ConfigError, ParplanError  # noqa: E402

GB = 1e9
#: Executors :func:`run_tasks` knows.
EXECUTORS = ("local", "dask", "serial")
#: Default size of the local process pool.
DEFAULT_WORKERS = 2


# --------------------------------------------------------------------------- executor


@dataclass(frozen=True)
class ExecutorSpec:
    """Where tasks run: ``kind`` local (process pool), dask or serial; pool size; Dask scheduler."""

    kind: str = "local"
    workers: int = DEFAULT_WORKERS
    scheduler: str | None = None

    def __post_init__(self):
        if self.kind not in EXECUTORS:
            raise ConfigError(f"executor must be one of {', '.join(EXECUTORS)} (got {self.kind!r})")
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ConfigError(f"workers must be an integer >= 1 (got {self.workers!r})")
        if self.scheduler is not None and self.kind != "dask":
            raise ConfigError(
                f"a scheduler address needs --executor dask (got executor {self.kind!r})"
            )


@dataclass(frozen=True)
class Task:
    """One unit of work: ``fn(**kwargs)``; ``cost`` orders submission (largest first)."""

    label: str
    fn: Callable[..., Any]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    cost: float = 1.0


class _Stderr:
    """The process's stderr when something is written (the default ``log`` of the benchmarks):
    a default bound at import would keep a stream that a caller or a test harness has since
    replaced or closed."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


STDERR = _Stderr()


def _timed(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> tuple[Any, float]:
    """Run one task in a worker; return (result, wall seconds)."""
    for k, v in THREAD_ENV.items():
        os.environ.setdefault(k, v)
    from parplan.costmodel.collector import planning_gc

    t0 = time.perf_counter()
    with planning_gc():
        result = fn(**kwargs)
    return result, time.perf_counter() - t0


class TaskError(RuntimeError):
    """A benchmark task raised; the message names the benchmark and the task."""


class WorkerLost(TaskError, ParplanError):
    """A worker process died under a task (the system killed it, most often for lack of
    memory): not a bug in the task, so the CLI reports it without a traceback."""


def run_tasks(
    bench: str,
    tasks: Sequence[Task],
    executor: ExecutorSpec | None = None,
    log: TextIO | None = STDERR,
) -> list[Any]:
    """Run ``tasks`` and return their results in task order (see the module docstring)."""
    executor = ExecutorSpec() if executor is None else executor
    order = sorted(range(len(tasks)), key=lambda i: -tasks[i].cost)
    results: list[Any] = [None] * len(tasks)
    done = [0]

    def finish(i: int, value: tuple[Any, float]) -> None:
        results[i], seconds = value
        done[0] += 1
        if log is not None:
            print(
                f"[bench {bench}] {done[0]}/{len(tasks)} {tasks[i].label} done ({seconds:.1f} s)",
                file=log,
                flush=True,
            )

    def fail(i: int, exc: BaseException) -> TaskError:
        from concurrent.futures.process import BrokenProcessPool

        if isinstance(exc, BrokenProcessPool):
            return WorkerLost(
                f"[bench {bench}] a worker process died while running '{tasks[i].label}' or a task next to it "
                "(killed by the system, most often for lack of memory); run one task at a time (--workers 1) or "
                "leave the largest models out"
            )
        return TaskError(
            f"[bench {bench}] task '{tasks[i].label}' failed: {type(exc).__name__}: {exc}"
        )

    if not tasks:
        return []
    if executor.kind == "serial" or (executor.kind == "local" and len(tasks) == 1):
        for i in order:
            try:
                finish(i, _timed(tasks[i].fn, tasks[i].kwargs))
            except Exception as exc:
                raise fail(i, exc) from exc
        return results
    if executor.kind == "local":
        _run_local(tasks, order, executor.workers, finish, fail)
    else:
        _run_dask(tasks, order, executor, finish, fail)
    return results


def _run_local(tasks, order, workers, finish, fail) -> None:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    # spawn, not fork: the parent may hold solver or Dask threads, and a forked child would
    # inherit their locks
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx) as pool:
        futures = {pool.submit(_timed, tasks[i].fn, tasks[i].kwargs): i for i in order}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                i = futures[fut]
                exc = fut.exception()
                if exc is not None:
                    for other in pending:
                        other.cancel()
                    raise fail(i, exc) from exc
                finish(i, fut.result())


def _run_dask(tasks, order, executor: ExecutorSpec, finish, fail) -> None:
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ModuleNotFoundError:
        raise ConfigError(
            "executor 'dask' needs dask.distributed: pip install 'parplan[dask]' (or \"dask[distributed]\")"
        ) from None
    cluster = None
    try:
        if executor.scheduler is None:
            # LocalCluster workers are spawned from this process and see its import path
            cluster = LocalCluster(
                n_workers=executor.workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
            )
            client = Client(cluster)
        else:
            client = Client(
                executor.scheduler
            )  # its workers need parplan installed (benchmarks included)
        try:
            futures = {
                client.submit(_timed, tasks[i].fn, tasks[i].kwargs, pure=False): i for i in order
            }
            for fut in as_completed(list(futures)):
                i = futures[fut]
                if fut.status == "error":
                    exc = fut.exception()
                    client.cancel(list(futures))
                    raise fail(i, exc) from exc
                finish(i, fut.result())
        finally:
            client.close()
    finally:
        if cluster is not None:
            cluster.close()


# --------------------------------------------------------------------------- arrays and problems


def scale_links(node: ArrayNode, factor: float) -> ArrayNode:
    """A copy of ``node`` with every link's bandwidth multiplied by ``factor``."""
    if node.is_leaf:
        return node
    return ArrayNode(
        left=scale_links(node.left, factor),
        right=scale_links(node.right, factor),
        link=Link(
            node.link.bytes_per_s * factor,
            node.link.latency_s,
            None if node.link.right_bytes_per_s is None else node.link.right_bytes_per_s * factor,
            node.link.ports,
        ),
    )


#: The fabric of the benchmarks that study planners (accpar, hypar, ablations, dp-vs-exact,
#: scaling, speed, bound, joint): one link per split, the papers' setting, so that their
#: recorded figures and the papers' stay comparable (docs/costmodel.md section 4.1). The
#: memory and calibration benchmarks price the devices' own fabric.
BENCH_FABRIC = "papers"


def make_array(
    spec: str, bandwidth_gbps: float | None = None, scale: float = 1.0, fabric: str = BENCH_FABRIC
) -> ArrayNode:
    """``parse_array(spec)`` with every link at ``bandwidth_gbps`` GB/s (None: the devices'
    default links), then every link's bandwidth multiplied by ``scale``; ``fabric`` as
    :func:`~parplan.costmodel.hardware.parse_array`'s (default :data:`BENCH_FABRIC`)."""
    array = parse_array(
        spec,
        bandwidth_bytes_per_s=None if bandwidth_gbps is None else bandwidth_gbps * GB,
        fabric=fabric,
    )
    return array if scale == 1.0 else scale_links(array, scale)


def bandwidth_label(bandwidth_gbps: float | None) -> str:
    """``"device"`` for the devices' default links, else e.g. ``"10 GB/s"``."""
    return "device" if bandwidth_gbps is None else f"{bandwidth_gbps:g} GB/s"


def solve_options(time_limit_s: float | None):
    """Fixed solver settings of every benchmark: one thread, seed 0."""
    from parplan.solvers.backends.base import SolveOptions

    return SolveOptions(time_limit_s=time_limit_s, threads=1, seed=0)


class _Stopped(Exception):
    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


#: Share grid of every exact solve in the benchmarks (and of the DP runs they are compared
#: with): coarse enough that whole-network MIPs stay tractable (docs/costmodel.md section 8).
EXACT_SHARE_GRID = 4


def exact_options():
    from parplan.costmodel.split import PlanOptions

    return PlanOptions(share_grid=EXACT_SHARE_GRID)


def exact_top_down(
    problem,
    backend: str,
    time_limit_s: float | None = 60.0,
    budget_s: float | None = None,
    options=None,
) -> dict[str, Any]:
    """Plan ``problem`` level by level, every split solved by ``backend`` (as ``solve_exact``).

    Each split gets ``time_limit_s`` (and no more than what is left of ``budget_s`` for the whole
    run). Returns a row: ``status`` ("optimal" for one split proved optimal; "split-optimal" when
    every split of a deeper array is proved optimal given its parent's plan; "time_limit",
    "budget", "infeasible" or "error" otherwise), ``step_time_s`` (evaluator price of the plan,
    NaN without a plan), ``root_objective`` / ``root_bound`` / ``root_gap`` of the root split
    (its bound is a lower bound on any plan of the hierarchy), ``gap`` of the plan against that
    bound, ``splits`` / ``splits_optimal`` and ``wall_s``.
    """
    from parplan.costmodel.evaluate import evaluate
    from parplan.solvers.exact import solve_split_exact
    from parplan.solvers.hierarchy import plan_top_down

    opts = exact_options() if options is None else options
    certs = []
    t0 = time.perf_counter()

    def plan_split(sp):
        limit = time_limit_s
        if budget_s is not None:
            left = budget_s - (time.perf_counter() - t0)
            if left <= 0.05:
                raise _Stopped("budget", f"budget of {budget_s:g} s used after {len(certs)} splits")
            limit = left if limit is None else min(limit, left)
        split, cert = solve_split_exact(sp, backend, opts, solve_options(limit))
        certs.append(cert)
        if split is None:
            raise _Stopped(cert.status, cert.message or cert.termination)
        return split

    row: dict[str, Any] = {"backend": backend, "message": ""}
    try:
        plan = plan_top_down(problem, plan_split, f"exact-{backend}")
    except _Stopped as stop:
        plan, row["status"], row["message"] = None, stop.status, str(stop)
    wall = time.perf_counter() - t0
    root = certs[0] if certs else None
    step = evaluate(problem, plan).step_time_s if plan is not None else math.nan
    if plan is not None:
        statuses = [c.status for c in certs]
        if all(s == "optimal" for s in statuses):
            row["status"] = "optimal" if problem.array.depth == 1 else "split-optimal"
        elif "time_limit" in statuses:
            row["status"] = "time_limit"
        else:
            row["status"] = "feasible"
    bound = root.bound if root is not None and root.bound is not None else math.nan
    row.update(
        {
            "step_time_s": step,
            "root_objective": root.objective
            if root is not None and root.objective is not None
            else math.nan,
            "root_bound": bound,
            "root_gap": root.gap if root is not None and root.gap is not None else math.nan,
            "root_status": root.status if root is not None else "none",
            "gap": max(0.0, (step - bound) / step)
            if plan is not None and not math.isnan(bound)
            else math.nan,
            "splits": len(certs),
            "splits_optimal": sum(c.status == "optimal" for c in certs),
            "solver": root.solver if root is not None else "",
            "wall_s": wall,
        }
    )
    return row


def root_bound(problem, backend: str = "scip", time_limit_s: float | None = 60.0) -> dict[str, Any]:
    """A lower bound on the step time of every plan of the hierarchy, shares anywhere in [0, 1]:
    the interval relaxation of the root split with each half priced as one device (a group's
    time for a layer is at least its compute on the summed device, and the root's communication
    is the same; docs/costmodel.md section 8). ``backend`` and ``time_limit_s`` are unused (the
    bound comes from the DP); they are kept for the benchmarks' call sites. Returns status,
    objective (the grid optimum of the root split), bound (s) and wall time."""
    from parplan.costmodel.split import PlanOptions, SplitProblem
    from parplan.solvers.dp import continuous_bound, frontier_dp

    t0 = time.perf_counter()
    sp = SplitProblem.root(problem)
    value, _ = frontier_dp(sp, PlanOptions())
    bound = continuous_bound(sp, PlanOptions())
    return {
        "status": "bound",
        "objective": value,
        "bound": bound,
        "wall_s": time.perf_counter() - t0,
    }


def plan_shape(problem, plan, prefix: str = "") -> dict[str, float]:
    """What a plan does, beyond its price: ``idle_devices`` (devices given no work on any layer:
    every split above them put their side at share 0) and ``model_parallel_cells`` (the
    fraction of (split, weighted layer) cells that are IN or OUT rather than BATCH)."""
    from parplan.costmodel.layout import PartitionType

    nodes = problem.planning.nodes
    weighted = [v for v, n in enumerate(nodes) if not n.is_join]
    idle = 0

    def walk(group, path: str, work: tuple[float, ...]) -> None:
        nonlocal idle
        if group.is_leaf:
            idle += all(w <= 0.0 for w in work)
            return
        split = plan.splits[path]
        walk(group.left, path + "L", tuple(w * a for w, a in zip(work, split.shares)))
        walk(group.right, path + "R", tuple(w * (1 - a) for w, a in zip(work, split.shares)))

    walk(problem.array, "", (1.0,) * len(nodes))
    cells = [split.choices[v] for split in plan.splits.values() for v in weighted]
    mp = sum(c in (PartitionType.IN, PartitionType.OUT) for c in cells) / max(1, len(cells))
    return {f"{prefix}idle_devices": idle, f"{prefix}model_parallel_cells": mp}


def plan_stats(problem, plan, prefix: str = "") -> dict[str, float]:
    """The evaluator's price of ``plan`` split into terms: ``step_s``; ``compute_s`` (per layer,
    the slowest device's compute time, summed); ``other_s`` = step - compute (communication,
    latency and waiting for the slower side); bytes received over all links in total, in
    intra-layer reductions and in re-layouts between layers."""
    from parplan.costmodel.evaluate import evaluate

    ev = evaluate(problem, plan)
    b = ev.breakdown
    bpe = problem.bytes_per_element
    compute = float(sum(ev.leaf_compute_s))
    return {
        f"{prefix}step_s": ev.step_time_s,
        f"{prefix}compute_s": compute,
        f"{prefix}other_s": max(ev.step_time_s - compute, 0.0),
        f"{prefix}comm_bytes": ev.communication_bytes,
        f"{prefix}intra_bytes": float((b.intra_elements_1 + b.intra_elements_2).sum()) * bpe,
        f"{prefix}transition_bytes": float(
            (b.transition_elements_1 + b.transition_elements_2).sum()
        )
        * bpe,
    }


def model_traits(problem) -> dict[str, float]:
    """Shape facts that decide which partition wins: weighted layers, activation elements over
    weight elements (at the problem's batch, summed over weighted layers), the share of the
    weights held by fully connected layers."""
    pg = problem.planning
    dims = problem.root_dims()
    weighted = [(n, d) for n, d in zip(pg.nodes, dims) if not n.is_join]
    weights = sum(d.weight_elements for _, d in weighted)
    acts = sum(d.in_elements for _, d in weighted)
    fc = sum(d.weight_elements for n, d in weighted if n.is_fc)
    return {
        "weighted_layers": len(weighted),
        "activation_weight_ratio": acts / weights if weights else math.nan,
        "fc_weight_fraction": fc / weights if weights else math.nan,
    }


# --------------------------------------------------------------------------- statistics


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of the positive values (NaN if there are none); NaN, zero and negative
    values are left out (a ratio of 0, e.g. a term a variant removes entirely, has no log)."""
    xs = [float(v) for v in values if v == v and v > 0]
    if not xs:
        return math.nan
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def arithmean(values: Iterable[float]) -> float:
    xs = [float(v) for v in values if v == v]
    return sum(xs) / len(xs) if xs else math.nan


def fit_exponent(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit of ``log y = k log x + c``: (k, c)."""
    import numpy as np

    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    k, c = np.polyfit(lx, ly, 1)
    return float(k), float(c)


# --------------------------------------------------------------------------- outputs


def two_nodes_file(stem: str, gb_per_s: float, latency_us: float) -> str:
    """A scratch tree file (not a result) of two nodes of 8 H100s joined by one link of
    ``gb_per_s`` and ``latency_us`` (docs/formats.md); its path."""
    import tempfile

    path = Path(tempfile.gettempdir()) / f"parplan-{stem}.toml"
    path.write_text(
        f'gb_per_s = {gb_per_s:g}\nlatency_us = {latency_us:g}\n\n[left]\ndevices = "h100:8"\n\n'
        '[right]\ndevices = "h100:8"\n',
        encoding="utf-8",
    )
    return str(path)


def out_dir_path(out_dir: str | Path) -> Path:
    """``out_dir`` as a Path, created if missing."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_outputs(
    out: Path,
    name: str,
    table: pd.DataFrame,
    draw: Callable[[Path], None],
    markdown: str | Callable[[], str],
    extra: Mapping[str, pd.DataFrame] | None = None,
) -> None:
    """Write ``name.csv`` (``table``) and the extra CSVs (``extra``: file stem -> table) first,
    so that a long run's data survives a failing plot or summary; then ``name.png``
    (``draw(path)``) and ``name.md`` (``markdown``, or a callable making it)."""
    table.to_csv(out / f"{name}.csv", index=False)
    for stem, frame in (extra or {}).items():
        frame.to_csv(out / f"{stem}.csv", index=False)
    draw(out / f"{name}.png")
    (out / f"{name}.md").write_text(markdown() if callable(markdown) else markdown)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plain_log_ticks(axis, decimal: bool = True) -> None:
    """Label a log axis 0.5, 1, 2, 5 (``decimal``) or 16, 32, 64 instead of 5x10^-1, 2^4."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if decimal:
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def grouped_bars(
    path: Path,
    panels: Sequence[tuple[str, pd.DataFrame]],
    category: str,
    series: Mapping[str, str],
    ylabel: str,
    references: Mapping[str, float] | None = None,
    log_y: bool = False,
) -> None:
    """One grouped-bar panel per ``(title, frame)``: a group per ``category`` value, a bar per
    ``series`` (legend label -> column); ``references`` draws dashed horizontal lines."""
    plt = _pyplot()
    n = max(1, len(panels))
    cols = min(2, n)
    rows = -(-n // cols)
    bars = max((len(f) for _, f in panels), default=1) * max(1, len(series))
    width_per = min(16.0, max(6.0, 1.5 + 0.12 * bars))
    fig, axes = plt.subplots(rows, cols, figsize=(width_per * cols, 4.2 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if len(series) > len(colors):  # one distinct colour per series, never a repeat
        colors = [plt.get_cmap("tab20")(i % 20) for i in range(len(series))]
    for ax, (title, frame) in zip(axes.flat, panels):
        cats = list(frame[category])
        k = len(series)
        w = 0.8 / max(k, 1)
        for j, (label, col) in enumerate(series.items()):
            xs = [i - 0.4 + w * (j + 0.5) for i in range(len(cats))]
            ax.bar(
                xs,
                frame[col].astype(float).fillna(0.0),
                width=w,
                label=label,
                color=colors[j % len(colors)],
            )
        for j, (label, value) in enumerate((references or {}).items()):
            # Named in the legend above the panels, never as text over the bars.
            ax.axhline(
                value, ls="--", lw=0.9, color=colors[(k + j) % len(colors)], alpha=0.8, label=label
            )
        ax.axhline(1.0, color="black", lw=0.6)
        ax.set_xticks(range(len(cats)))
        ax.set_xticklabels(cats, rotation=40, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        if log_y:
            ax.set_yscale("log")
            _plain_log_ticks(ax.yaxis)
        ax.grid(True, axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    # Legend above the panels, outside every axes, so it never hides a bar.
    handles, labels = axes.flat[0].get_legend_handles_labels()
    # As many columns as fit the figure's width (7-pt text: ~0.055 in per character plus the
    # handle), so that no entry is cut at the edges however long the labels are.
    entry_in = 0.055 * max((len(label) for label in labels), default=1) + 0.5
    ncol = max(1, min(len(labels), 6, int(0.95 * width_per * cols / entry_in)))
    fig.legend(handles, labels, loc="upper center", ncol=ncol, fontsize=7, frameon=False)
    legend_in = 0.3 * (-(-len(labels) // ncol) + 0.5)  # ~0.3 inch per legend row, plus a margin
    fig.tight_layout(rect=(0, 0, 1, 1 - legend_in / (4.2 * rows)))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def loglog_lines(
    path: Path,
    panels: Sequence[tuple[str, str, str, Sequence[tuple[str, pd.DataFrame]]]],
    ylabel: str = "wall time (s)",
) -> None:
    """Log-log panels ``(title, x column, y column, [(label, frame), ...])``, one line per frame."""
    plt = _pyplot()
    n = max(1, len(panels))
    cols = min(3, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.6 * rows), squeeze=False)
    for ax, (title, x, y, lines) in zip(axes.flat, panels):
        for label, frame in lines:
            f = frame[frame[y] > 0]
            if len(f):
                ax.plot(f[x], f[y], marker="o", ms=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        _plain_log_ticks(ax.xaxis, decimal=False)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(x.replace("_", " "))
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if lines:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fmt(value: Any, spec: str = ".2f") -> str:
    """Format a number for a table (``-`` for NaN/None), anything else with ``str``."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return "-" if math.isnan(value) else format(value, spec)
    return str(value)


def md_table(
    frame: pd.DataFrame,
    columns: Mapping[str, str | Callable[[Any], str]],
    headers: Mapping[str, str] | None = None,
) -> list[str]:
    """Markdown table lines: ``columns`` maps column name to a format spec or a formatter;
    ``headers`` renames columns in the header row."""
    head = [(headers or {}).get(c, c) for c in columns]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for _, row in frame.iterrows():
        cells = []
        for col, spec in columns.items():
            v = row[col]
            cells.append(spec(v) if callable(spec) else fmt(v, spec))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def csv_floats(text: str) -> tuple[float, ...]:
    """argparse type: ``"1,10,100"`` -> (1.0, 10.0, 100.0); ``""`` -> ()."""
    import argparse

    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, as in '1,10,100' (got {text!r})"
        ) from None


def csv_ints(text: str) -> tuple[int, ...]:
    """argparse type: ``"1,2,4"`` -> (1, 2, 4)."""
    import argparse

    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, as in '1,2,4' (got {text!r})"
        ) from None


def models_and_time_limit(parser, models: Sequence[str], time_limit_s: float, what: str) -> None:
    """A benchmark's ``--models`` (comma-separated, default ``models``) and ``--time-limit``
    (seconds of ``what``, into ``time_limit_s``)."""
    parser.add_argument(
        "--models",
        type=csv_names,
        default=None,
        help=f"comma-separated (default {','.join(models)})",
    )
    parser.add_argument(
        "--time-limit",
        dest="time_limit_s",
        type=float,
        default=time_limit_s,
        metavar="S",
        help=f"{what} (default {time_limit_s:g})",
    )


def csv_names(text: str) -> tuple[str, ...]:
    """argparse type: ``"alexnet, vgg16"`` -> ("alexnet", "vgg16")."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def run_kwargs(run: Callable[..., Any], args: Any) -> dict[str, Any]:
    """The keyword arguments of ``run`` found on an argparse namespace (options whose ``dest``
    is a parameter name of ``run``, except ``out_dir``, ``quick`` and ``executor``)."""
    import inspect

    skip = {"out_dir", "quick", "executor"}
    return {
        name: getattr(args, name)
        for name in inspect.signature(run).parameters
        if name not in skip and hasattr(args, name)
    }


def executor_from_args(
    kind: str = "local", workers: int = DEFAULT_WORKERS, scheduler: str | None = None
) -> ExecutorSpec:
    """An :class:`ExecutorSpec`; a scheduler address implies Dask."""
    if scheduler is not None and kind == "local":
        kind = "dask"
    return ExecutorSpec(kind, workers, scheduler)


def with_progress_header(bench: str, message: str, log: TextIO | None = STDERR) -> None:
    """One line on stderr saying what a benchmark is about to run."""
    if log is not None:
        print(f"[bench {bench}] {message}", file=log, flush=True)


__all__ = [
    "DEFAULT_WORKERS",
    "EXECUTORS",
    "ExecutorSpec",
    "GB",
    "Task",
    "TaskError",
    "arithmean",
    "bandwidth_label",
    "csv_floats",
    "csv_ints",
    "csv_names",
    "run_kwargs",
    "exact_top_down",
    "executor_from_args",
    "fit_exponent",
    "fmt",
    "geomean",
    "grouped_bars",
    "loglog_lines",
    "model_traits",
    "plan_stats",
    "make_array",
    "BENCH_FABRIC",
    "md_table",
    "out_dir_path",
    "root_bound",
    "run_tasks",
    "scale_links",
    "solve_options",
    "two_nodes_file",
    "with_progress_header",
    "write_outputs",
]


def standalone_main(doc: str, name: str, run, add_arguments, argv: list[str] | None = None) -> int:
    """``python -m parplan.bench.NAME OUT_DIR [--quick] ...``: run one benchmark, print its summary."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--quick", action="store_true")
    add_arguments(parser)
    args = parser.parse_args(argv)
    kwargs = run_kwargs(run, args)
    run(args.out_dir, quick=args.quick, **kwargs)
    module = sys.modules.get(run.__module__)
    if hasattr(module, "output_name"):  # named by its options (bound_cli)
        name = module.output_name(**kwargs)
    print((Path(args.out_dir) / f"{name}.md").read_text())
    return 0
