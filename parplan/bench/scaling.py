"""Planner wall time against the number of layers and the hierarchy depth; exact solvers' reach.

- Layers: seeded synthetic graphs of 16 .. 4096 planning nodes -- chains (3x3 convolutions of
  random widths on 14x14, then one FC layer) and DAGs (residual blocks: two convolutions and an
  ``add`` join, every fourth block with a 1x1 projection shortcut). Timed: the layer-wise DP
  (``accpar-topdown`` on one heterogeneous split, ``tpu-v2:1,tpu-v3:1``) and the ``accpar``
  portfolio on ``tpu-v2:4,tpu-v3:4``; the planning graph is built beforehand (its build time is
  reported apart, ``build_s``). A least-squares fit of log(time) on log(layers) over sizes >= 64
  gives the exponent: 1 means linear (the goal: at most linear, k <= 1.2).
- Depth: the DP and the portfolio on VGG-16 and ResNet-50 for depths 1..10
  (``tpu-v2:2^(d-1),tpu-v3:2^(d-1)``, up to 1024 devices), with the number of split problems
  the recursion solves; the fit is against the number of devices.
- Exact reach: every exact backend on the one-split problem of growing chains and DAGs, with
  ``time_limit_s`` (60 s) per solve; a series stops at the first size not certified optimal.

Each series runs in one task (sizes in order, best of ``repeats`` wall times per point, the
garbage collector off while timing), so all points of a series share one process. Writes
``scaling.csv`` (one row per series and size),
``scaling.png`` (log-log lines) and ``scaling.md``.

Run: ``parplan bench scaling --out results/`` or ``python -m parplan.bench.scaling OUT_DIR [--quick]``.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

import pandas as pd

from parplan.bench.common import (
    standalone_main,
    EXACT_SHARE_GRID,
    ExecutorSpec,
    Task,
    csv_ints,
    csv_names,
    fit_exponent,
    loglog_lines,
    make_array,
    md_table,
    out_dir_path,
    run_tasks,
    solve_options,
    with_progress_header,
    write_outputs,
)

NAME = "scaling"
LAYER_SIZES = tuple(2**k for k in range(4, 13))  # 16 .. 4096
DEPTHS = tuple(range(1, 11))
EXACT_SIZES = LAYER_SIZES
DEFAULT_TIME_LIMIT_S = 60.0
FIT_MIN_LAYERS = 64
#: Timed runs per point (best kept) and the time after which a point stops repeating.
DEFAULT_REPEATS = 7
POINT_BUDGET_S = 10.0
BATCH = 512
QUICK = {
    "sizes": (8, 16),
    "depths": (1, 2),
    "exact_sizes": (8,),
    "repeats": 1,
    "time_limit_s": 10.0,
    "backends": ("scip",),
    "depth_models": ("vgg11",),
}
PLANNERS = {
    "dp": ("accpar-topdown", "tpu-v2:1,tpu-v3:1"),
    "portfolio": ("accpar", "tpu-v2:4,tpu-v3:4"),
}
DEPTH_MODELS = ("vgg16", "resnet50")
WIDTHS = (64, 128, 256, 512)


def synthetic_chain(layers: int, seed: int = 0):
    """A chain of ``layers`` weighted layers: ``layers - 1`` 3x3 convolutions of random widths on
    14x14 maps, then one FC layer to 10 outputs."""
    from parplan.costmodel.graph import Activation, Conv2d, Flatten, Graph, Linear, Shape

    if layers < 2:
        raise ValueError(f"a synthetic chain needs >= 2 layers (got {layers})")
    rng = random.Random(seed)
    out, prev = [], "input"
    for i in range(layers - 1):
        out.append(
            Conv2d(
                f"conv{i}", (prev,), out_channels=rng.choice(WIDTHS), kernel=(3, 3), padding=(1, 1)
            )
        )
        out.append(Activation(f"relu{i}", (f"conv{i}",)))
        prev = f"relu{i}"
    out += [Flatten("flatten", (prev,)), Linear("fc", ("flatten",), out_features=10)]
    return Graph(f"chain-{layers}", Shape(64, 14, 14), tuple(out))


def synthetic_dag(nodes: int, seed: int = 0):
    """Residual blocks until at least ``nodes`` planning nodes: two 3x3 convolutions and an add;
    every fourth block changes width through a 1x1 projection shortcut (a second weighted branch)."""
    from parplan.costmodel.graph import Activation, Add, Conv2d, Graph, Shape

    if nodes < 3:
        raise ValueError(f"a synthetic DAG needs >= 3 nodes (got {nodes})")
    rng = random.Random(seed)
    width, prev, out, count, b = 64, "input", [], 0, 0
    while count < nodes:
        project = b % 4 == 3
        new = rng.choice(WIDTHS) if project else width
        out.append(Conv2d(f"b{b}.conv1", (prev,), out_channels=new, kernel=(3, 3), padding=(1, 1)))
        out.append(Activation(f"b{b}.relu1", (f"b{b}.conv1",)))
        out.append(
            Conv2d(f"b{b}.conv2", (f"b{b}.relu1",), out_channels=new, kernel=(3, 3), padding=(1, 1))
        )
        short = prev
        if project:
            out.append(Conv2d(f"b{b}.proj", (prev,), out_channels=new, kernel=(1, 1)))
            short = f"b{b}.proj"
        out.append(Add(f"b{b}.add", (f"b{b}.conv2", short)))
        out.append(Activation(f"b{b}.relu", (f"b{b}.add",)))
        prev, width, count, b = f"b{b}.relu", new, count + (4 if project else 3), b + 1
    return Graph(f"dag-{nodes}", Shape(64, 14, 14), tuple(out))


def _graph(kind: str, size: int, seed: int):
    return synthetic_chain(size, seed) if kind == "chain" else synthetic_dag(size, seed)


def _best_wall(fn, repeats: int, budget_s: float = POINT_BUDGET_S) -> tuple[float, float]:
    """(best wall seconds, CPU seconds of that run) over up to ``repeats`` runs, fewer once the
    point has used ``budget_s``; the garbage collector is off while timing (as in ``timeit``),
    and every run starts from an empty memo of node terms (a warm one would price nothing)."""
    import gc

    from parplan.costmodel.split import clear_memo

    best = (math.inf, math.inf)
    spent = 0.0
    for _ in range(repeats):
        clear_memo()
        enabled = gc.isenabled()
        gc.disable()
        try:
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            w, c = time.perf_counter() - w0, time.process_time() - c0
        finally:
            if enabled:
                gc.enable()
        best = min(best, (w, c))
        spent += w
        if spent >= budget_s:
            break
    return best


def layers_series(
    kind: str, planner_key: str, sizes: tuple[int, ...], repeats: int, seed: int
) -> list[dict]:
    """Wall time of one planner against graph size (one process, sizes in order)."""
    from parplan.costmodel.problem import Problem
    from parplan.solvers.planners import make_plan

    planner, array = PLANNERS[planner_key]
    arr = make_array(array)
    rows = []
    warm = Problem(_graph(kind, sizes[0], seed), arr, batch=BATCH)
    make_plan(
        warm, planner
    )  # first call pays one-off imports and caches: keep it out of the series
    for size in sizes:
        t0 = time.perf_counter()
        problem = Problem(_graph(kind, size, seed), arr, batch=BATCH)
        n = len(problem.planning.nodes)
        build = time.perf_counter() - t0
        wall, cpu = _best_wall(lambda: make_plan(problem, planner), repeats)
        rows.append(
            {
                "series": f"{planner_key} {kind}",
                "study": "layers",
                "kind": kind,
                "planner": planner,
                "backend": "",
                "array": array,
                "size": size,
                "layers": n,
                "depth": arr.depth,
                "devices": arr.count,
                "wall_s": wall,
                "cpu_s": cpu,
                "build_s": build,
                "status": "ok",
            }
        )
    return rows


def depth_series(model: str, planner_key: str, depths: tuple[int, ...], repeats: int) -> list[dict]:
    """Wall time of one planner on one zoo model against hierarchy depth."""
    from parplan.costmodel.problem import Problem
    from parplan.solvers.planners import make_plan
    from parplan.models.zoo import get_model

    from parplan.solvers.dp import solve_split
    from parplan.solvers.hierarchy import plan_top_down
    from parplan.solvers.planners import planner_options

    planner = PLANNERS[planner_key][0]
    rows = []
    graph = get_model(model)
    options = planner_options("accpar-topdown")
    make_plan(
        Problem(graph, make_array("tpu-v2:1,tpu-v3:1"), batch=BATCH), planner
    )  # warm-up, untimed
    for d in depths:
        half = 2 ** (d - 1)
        array = f"tpu-v2:{half},tpu-v3:{half}"
        problem = Problem(graph, make_array(array), batch=BATCH)
        n = len(problem.planning.nodes)
        wall, cpu = _best_wall(lambda: make_plan(problem, planner), repeats)
        solved = [0]

        def counting(sp, solved=solved):
            solved[0] += 1
            return solve_split(sp, options)

        plan_top_down(
            problem, counting, "count"
        )  # untimed: how many split problems the recursion solves
        rows.append(
            {
                "series": f"{planner_key} {model}",
                "study": "depth",
                "kind": model,
                "planner": planner,
                "backend": "",
                "array": array,
                "size": d,
                "layers": n,
                "depth": d,
                "devices": problem.array.count,
                "splits": problem.array.count - 1,
                "splits_solved": solved[0],
                "wall_s": wall,
                "cpu_s": cpu,
                "build_s": math.nan,
                "status": "ok",
            }
        )
    return rows


def exact_series(
    kind: str, backend: str, sizes: tuple[int, ...], time_limit_s: float, seed: int
) -> list[dict]:
    """One exact backend on the one-split problem of growing graphs, until it stops certifying."""
    from parplan.costmodel.problem import Problem
    from parplan.costmodel.split import PlanOptions, SplitProblem
    from parplan.solvers.exact import solve_split_exact

    array = PLANNERS["dp"][1]
    arr = make_array(array)
    rows = []
    for size in sizes:
        problem = Problem(_graph(kind, size, seed), arr, batch=BATCH)
        n = len(problem.planning.nodes)
        w0, c0 = time.perf_counter(), time.process_time()
        _, cert = solve_split_exact(
            SplitProblem.root(problem),
            backend,
            PlanOptions(share_grid=EXACT_SHARE_GRID),
            solve_options(time_limit_s),
        )
        rows.append(
            {
                "series": f"{backend} {kind}",
                "study": "exact",
                "kind": kind,
                "planner": "exact",
                "backend": backend,
                "array": array,
                "size": size,
                "layers": n,
                "depth": 1,
                "devices": 2,
                "wall_s": time.perf_counter() - w0,
                "cpu_s": time.process_time() - c0,
                "build_s": math.nan,
                "status": cert.status,
                "termination": cert.termination,
                "gap": math.nan if cert.gap is None else cert.gap,
            }
        )
        if cert.status != "optimal":
            break
    return rows


def run(
    out_dir: str | Path,
    quick: bool = False,
    executor: ExecutorSpec | None = None,
    sizes: tuple[int, ...] | None = None,
    depths: tuple[int, ...] | None = None,
    exact_sizes: tuple[int, ...] | None = None,
    backends: tuple[str, ...] | None = None,
    time_limit_s: float | None = None,
    repeats: int | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """Run the benchmark; write scaling.csv / .png / .md.

    Columns: series, study (layers | depth | exact), kind (chain, dag or a model), planner,
    backend, array, size, layers, depth, devices, wall_s, cpu_s, build_s (graph analysis, layers
    study), status, termination and gap (exact: the certificate's), splits and splits_solved (depth study: inner
    nodes of the array, split problems the DP recursion solved). Also writes scaling_fits.csv.
    """
    from parplan.solvers.backends.registry import available_backends, backend_spec

    sizes = tuple(sizes or (QUICK["sizes"] if quick else LAYER_SIZES))
    depths = tuple(depths or (QUICK["depths"] if quick else DEPTHS))
    exact_sizes = tuple(exact_sizes or (QUICK["exact_sizes"] if quick else EXACT_SIZES))
    backends = tuple(
        backend_spec(b).name
        for b in (backends or (QUICK["backends"] if quick else available_backends()))
    )
    time_limit_s = time_limit_s or (QUICK["time_limit_s"] if quick else DEFAULT_TIME_LIMIT_S)
    repeats = repeats or (QUICK["repeats"] if quick else DEFAULT_REPEATS)
    depth_models = QUICK["depth_models"] if quick else DEPTH_MODELS
    out = out_dir_path(out_dir)
    tasks = [
        Task(
            f"{p} {k} layers",
            layers_series,
            dict(kind=k, planner_key=p, sizes=sizes, repeats=repeats, seed=seed),
            cost=10 if p == "portfolio" else 3,
        )
        for k in ("chain", "dag")
        for p in PLANNERS
    ]
    tasks += [
        Task(
            f"{p} {m} depths",
            depth_series,
            dict(model=m, planner_key=p, depths=depths, repeats=repeats),
            cost=5 if p == "portfolio" else 2,
        )
        for m in depth_models
        for p in PLANNERS
    ]
    tasks += [
        Task(
            f"{b} {k} exact",
            exact_series,
            dict(kind=k, backend=b, sizes=exact_sizes, time_limit_s=time_limit_s, seed=seed),
            cost=20,
        )
        for k in ("chain", "dag")
        for b in backends
    ]
    with_progress_header(
        NAME,
        f"layers {list(sizes)}, depths {list(depths)}, exact {list(backends)} up to "
        f"{max(exact_sizes)} layers ({time_limit_s:g} s each); {len(tasks)} tasks",
    )
    results = run_tasks(NAME, tasks, executor)
    table = pd.DataFrame([row for rows in results for row in rows])
    fits = fit_table(table)
    write_outputs(
        out,
        NAME,
        table,
        lambda p: _plot(table, fits, p),
        _markdown(table, fits, time_limit_s),
        extra={"scaling_fits": fits},
    )
    return table


def fit_table(table: pd.DataFrame) -> pd.DataFrame:
    """Fitted exponent of wall (and CPU) time against layers per series of the layers study
    (sizes >= 64 when there are at least 3 such points, else all), and against the number of
    devices (2^depth) for the depth study."""
    rows = []
    for (study, series), sub in table[table.study.isin(["layers", "depth"])].groupby(
        ["study", "series"], sort=False
    ):
        x = "layers" if study == "layers" else "devices"
        pts = sub[sub.layers >= FIT_MIN_LAYERS] if study == "layers" else sub
        if len(pts) < 3:
            pts = sub
        if len(pts) < 2:
            continue
        k, c = fit_exponent(pts[x], pts.wall_s)
        kc, _ = fit_exponent(pts[x], pts.cpu_s.clip(lower=1e-9))
        rows.append(
            {
                "study": study,
                "series": series,
                "x": x,
                "points": len(pts),
                "min_x": int(pts[x].min()),
                "max_x": int(pts[x].max()),
                "exponent_wall": k,
                "exponent_cpu": kc,
                "at_most_linear": bool(k <= 1.2) if study == "layers" else None,
                "max_wall_s": float(sub.wall_s.max()),
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "study",
            "series",
            "x",
            "points",
            "min_x",
            "max_x",
            "exponent_wall",
            "exponent_cpu",
            "at_most_linear",
            "max_wall_s",
        ],
    )


def _plot(table: pd.DataFrame, fits: pd.DataFrame, path: Path) -> None:
    def lines(study: str, kinds=None):
        sub = table[table.study == study]
        out = []
        for series, s in sub.groupby("series", sort=False):
            if kinds is not None and s.kind.iloc[0] not in kinds:
                continue
            f = fits[(fits.study == study) & (fits.series == series)]
            label = series + (f" (slope {f.exponent_wall.iloc[0]:.2f})" if len(f) else "")
            out.append((label, s))
        return out

    panels = [
        ("planner time vs layers (chains)", "layers", "wall_s", lines("layers", ("chain",))),
        ("planner time vs layers (DAGs)", "layers", "wall_s", lines("layers", ("dag",))),
        ("planner time vs devices (depth 1..)", "devices", "wall_s", lines("depth")),
        ("exact, one split, vs layers", "layers", "wall_s", lines("exact")),
    ]
    loglog_lines(path, panels)


def _markdown(table: pd.DataFrame, fits: pd.DataFrame, time_limit_s: float) -> str:
    lf = fits[fits.study == "layers"]
    df = fits[fits.study == "depth"]
    dp = lf[lf.series.str.startswith("dp ")]
    lines = [
        "# Scaling",
        "",
        f"Layer-wise DP exponent (wall time ~ layers^k, sizes >= {FIT_MIN_LAYERS}): "
        + ", ".join(f"{r.series}: k = {r.exponent_wall:.2f}" for r in dp.itertuples())
        + (
            " -- at most linear (k <= 1.2; below 1 where the fixed cost of a plan and the memo "
            "of repeated layers weigh at the small sizes)."
            if len(dp) and dp.at_most_linear.all()
            else " -- NOT at most linear (k > 1.2)."
        ),
        "",
        "## Planner wall time vs layers",
        "",
    ]
    lines += md_table(
        lf,
        {
            "series": str,
            "points": "d",
            "min_x": "d",
            "max_x": "d",
            "exponent_wall": ".2f",
            "exponent_cpu": ".2f",
            "at_most_linear": str,
            "max_wall_s": ".3f",
        },
        headers={
            "min_x": "min layers",
            "max_x": "max layers",
            "exponent_wall": "k (wall)",
            "exponent_cpu": "k (CPU)",
            "at_most_linear": "at most linear",
            "max_wall_s": "max wall (s)",
        },
    )
    layer_rows = table[table.study == "layers"]
    if len(layer_rows):
        pivot = layer_rows.pivot_table(
            index="layers", columns="series", values="wall_s", aggfunc="first"
        )
        lines += [
            "",
            "| layers | " + " | ".join(pivot.columns) + " | graph build (s) |",
            "| --- | " + " | ".join("---" for _ in pivot.columns) + " | --- |",
        ]
        build = layer_rows.groupby("layers").build_s.max()
        for n, r in pivot.iterrows():
            lines.append(
                f"| {n} | "
                + " | ".join("-" if v != v else f"{v:.4f}" for v in r)
                + f" | {build[n]:.3f} |"
            )
        lines += [
            "",
            "`graph build`: analysing the layer graph and building its planning graph (outside the timed "
            "planner calls).",
        ]
    lines += ["", "## Planner wall time vs hierarchy depth", ""]
    lines += md_table(
        df,
        {
            "series": str,
            "points": "d",
            "min_x": "d",
            "max_x": "d",
            "exponent_wall": ".2f",
            "max_wall_s": ".3f",
        },
        headers={
            "min_x": "min devices",
            "max_x": "max devices",
            "exponent_wall": "k (wall ~ devices^k)",
            "max_wall_s": "max wall (s)",
        },
    )
    dep = table[(table.study == "depth") & table.series.str.startswith("dp ")]
    if len(dep):
        lines += [
            "",
            "Split problems the top-down recursion solves (interchangeable sibling groups share one plan; "
            "an ideal recursion on a heterogeneous root over two homogeneous halves solves 2 x depth - 1):",
            "",
            "| model | " + " | ".join(f"depth {int(d)}" for d in sorted(dep.depth.unique())) + " |",
            "| --- | " + " | ".join("---" for _ in dep.depth.unique()) + " |",
        ]
        for m, sub in dep.groupby("kind", sort=False):
            lines.append(
                f"| {m} | "
                + " | ".join(f"{int(r.splits_solved)} / {int(r.splits)}" for r in sub.itertuples())
                + " |"
            )
    lines += [
        "",
        f"## Where each exact backend stops certifying within {time_limit_s:g} s (one split)",
        "",
        "| backend | graph | largest certified (layers) | wall there (s) | first not certified | there: status "
        "(solver stop), gap, wall |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    ex = table[table.study == "exact"]
    for series, s in ex.groupby("series", sort=False):
        ok = s[s.status == "optimal"]
        bad = s[s.status != "optimal"]
        lines.append(
            f"| {s.backend.iloc[0]} | {s.kind.iloc[0]} | {int(ok.layers.max()) if len(ok) else '-'} | "
            f"{ok.wall_s.iloc[-1] if len(ok) else float('nan'):.2f} | "
            f"{int(bad.layers.iloc[0]) if len(bad) else 'none up to ' + str(int(s.layers.max()))} | "
            + (
                f"{bad.status.iloc[0]} ({bad.termination.iloc[0]}), {bad.gap.iloc[0]:.1e}, {bad.wall_s.iloc[0]:.1f} s |"
                if len(bad)
                else "- |"
            )
        )
    proved_model = ex[(ex.status != "optimal") & (ex.termination == "optimal")]
    if len(proved_model):
        lines += [
            "",
            "Status `feasible` with solver stop `optimal`: the backend proved its own model optimal, "
            "but that "
            "model (CP-SAT: shares on a grid, integer-scaled objective) does not prove the plan within 1e-6 "
            "of the continuous optimum: " + ", ".join(sorted(set(proved_model.series))) + ".",
        ]
    lines.append("")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``parplan bench scaling`` (``dest`` = the keyword of :func:`run`)."""
    parser.add_argument(
        "--sizes",
        type=csv_ints,
        default=None,
        help="comma-separated layer counts (default 16..4096, powers of 2)",
    )
    parser.add_argument(
        "--depths", type=csv_ints, default=None, help="comma-separated depths (default 1..10)"
    )
    parser.add_argument(
        "--exact-sizes",
        type=csv_ints,
        default=None,
        help="layer counts for the exact backends (default 16..4096)",
    )
    parser.add_argument(
        "--backends",
        type=csv_names,
        default=None,
        help="comma-separated exact backends (default: every available one)",
    )
    parser.add_argument(
        "--time-limit",
        dest="time_limit_s",
        type=float,
        default=None,
        metavar="S",
        help=f"per exact solve (default {DEFAULT_TIME_LIMIT_S:g})",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"timed runs per point, best kept (default {DEFAULT_REPEATS}; fewer past "
        f"{POINT_BUDGET_S:g} s per point)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the synthetic graphs (default 0)"
    )


def main(argv: list[str] | None = None) -> int:
    return standalone_main(__doc__, NAME, run, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
