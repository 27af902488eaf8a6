"""AccPar (HPCA'20) table: speedup over data parallelism on a TPU-v2 + TPU-v3 array.

For AlexNet, VGG-11/13/16/19 and ResNet-18/34/50/101/152 at batch 512 on
``tpu-v2:64,tpu-v3:64`` (128 devices, 7 levels: the setup of the authors' released planner,
the AccPar paper, HPCA'20), every planner's plan is priced by the one evaluator and divided into the
data-parallel step time (shares proportional to compute; the naive 1/2 form is reported too):

- OWT, HyPar, AccPar (``accpar``: the portfolio) and ``accpar-topdown`` (the published
  recursion alone);
- ``exact``: every split solved by an exact MIP backend level by level (each split certified
  optimal given its parent's plan, as AccPar plans; share grid 1/4) -- at the primary bandwidth
  only (the whole run takes about 30 minutes on 2 cores; no joint model of the 128-device array
  exists for the current cost model);
- ``bound``: the data-parallel time over a lower bound on every plan (the interval relaxation
  of the root split, halves as single devices): a proven upper bound on the speedup of *any*
  plan with shares anywhere in [0, 1].
- the AccPar plan's shape: devices it leaves idle and the fraction of IN / OUT choices, and a
  section on how the results changed from the previous cost model.

The interconnect bandwidth of the paper is unknown, so the table is repeated at several link
bandwidths (``sweep_gbps``, default 1, 10 and 100 GB/s) besides the primary one (``bandwidth_gbps``;
default the devices' own link figures, 62.5 GB/s). Per model, the markdown says where the
ordering (OWT < HyPar < AccPar, from the paper's averages 2.98x, 3.78x, 6.30x) or the
magnitude differs from the paper and which cost term is responsible.

Writes ``accpar.csv`` (one row per bandwidth and model), ``accpar_summary.csv`` (geometric
and arithmetic means per bandwidth and planner, next to the paper's), ``accpar.png`` (grouped
bars, one panel per bandwidth) and ``accpar.md``.

Run: ``parplan bench accpar --out results/`` or ``python -m parplan.bench.accpar OUT_DIR [--quick]``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import pandas as pd

from parplan.bench.common import (
    standalone_main,
    ExecutorSpec,
    Task,
    arithmean,
    bandwidth_label,
    csv_floats,
    csv_names,
    exact_top_down,
    fmt,
    geomean,
    grouped_bars,
    make_array,
    md_table,
    model_traits,
    out_dir_path,
    plan_shape,
    plan_stats,
    root_bound,
    run_tasks,
    with_progress_header,
    write_outputs,
)

NAME = "accpar"
#: The paper's average speedups over data parallelism (AccPar, HPCA'20).
PAPER = {"owt": 2.98, "hypar": 3.78, "accpar": 6.30}
#: AccPar's speedup over data parallelism at the devices' own links under the *previous* cost
#: model (recorded at commit c056e4c, before docs/costmodel.md section 10's changes): kept to
#: say how the results changed, not compared against in any test.
PREVIOUS_MODEL_ACCPAR = {
    "alexnet": 9.96,
    "vgg11": 6.30,
    "vgg13": 5.35,
    "vgg16": 4.21,
    "vgg19": 3.54,
    "resnet18": 1.31,
    "resnet34": 1.28,
    "resnet50": 1.22,
    "resnet101": 1.13,
    "resnet152": 1.10,
}
MODELS = (
    "alexnet",
    "vgg11",
    "vgg13",
    "vgg16",
    "vgg19",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
)
DEFAULT_ARRAY = "tpu-v2:64,tpu-v3:64"
DEFAULT_BATCH = 512
DEFAULT_SWEEP_GBPS = (1.0, 10.0, 100.0)
QUICK = {
    "models": ("alexnet", "resnet-2block"),
    "array": "tpu-v2:1,tpu-v3:1",
    "batch": 128,
    "sweep_gbps": (10.0,),
}

#: Column prefix -> planner name (``data`` is the baseline and always runs; ``--planners``
#: chooses among the others, by prefix or planner name).
PLANNERS = {
    "data": "data",
    "data_half": "data-half",
    "owt": "owt",
    "hypar": "hypar",
    "accpar": "accpar",
    "topdown": "accpar-topdown",
}
LABELS = {
    "owt": "OWT",
    "hypar": "HyPar",
    "accpar": "AccPar",
    "topdown": "AccPar top-down",
    "exact": "exact",
    "bound": "bound",
    "data_half": "data (1/2)",
}
#: Relative size of the work per model (submission order: longest first).
_COST = {"resnet152": 30, "resnet101": 20, "resnet50": 8, "resnet34": 4, "resnet18": 2}


#: The planners compared with data parallelism (every column prefix but the baseline's).
COMPARED = tuple(k for k in PLANNERS if k != "data")


def planner_keys(names) -> tuple[str, ...]:
    """Column prefixes of ``names`` (prefixes such as ``topdown`` or planner names such as
    ``accpar-topdown``), in the table's order; ``None`` is every planner.

    Example:
        >>> planner_keys(["accpar", "OWT"]), planner_keys(None)[-1]
        (('owt', 'accpar'), 'topdown')
    """
    from parplan.errors import ConfigError

    if names is None:
        return COMPARED
    by_name = {**{k: k for k in COMPARED}, **{PLANNERS[k]: k for k in COMPARED}}
    chosen = set()
    for name in names:
        key = by_name.get(str(name).strip().lower())
        if key is None:
            raise ConfigError(
                f"bench accpar: unknown planner '{name}' in --planners; choose from "
                f"{', '.join(COMPARED)} (data parallelism, the baseline, always runs)"
            )
        chosen.add(key)
    if not chosen:
        raise ConfigError("bench accpar: --planners names no planner")
    return tuple(k for k in COMPARED if k in chosen)


def paper_setup(array, batch) -> bool:
    """Whether a run is the paper's setup (128 TPUs, batch 512), where its averages are the
    reference; elsewhere the report compares the planners only."""
    return array == DEFAULT_ARRAY and int(batch) == DEFAULT_BATCH


def planner_task(
    model: str,
    array: str,
    batch: int,
    bandwidth_gbps: float | None,
    bound_backend: str,
    time_limit_s: float,
    planners: tuple[str, ...] = COMPARED,
) -> dict:
    """Data parallelism and ``planners`` (column prefixes) on one (model, bandwidth): prices,
    terms, planning wall times, root bound."""
    from parplan.costmodel.problem import Problem
    from parplan.solvers.planners import make_plan
    from parplan.models.zoo import get_model

    problem = Problem(get_model(model), make_array(array, bandwidth_gbps), batch=batch)
    row: dict = {"model": model, **model_traits(problem)}
    for key in ("data", *planners):
        planner = PLANNERS[key]
        t0 = time.perf_counter()
        plan = make_plan(problem, planner)
        row[f"{key}_wall_s"] = time.perf_counter() - t0
        row.update(plan_stats(problem, plan, prefix=f"{key}_"))
        if key == "accpar":
            row["accpar_selected"] = plan.info.get("selected", "accpar")
            row.update(plan_shape(problem, plan, prefix="accpar_"))
    bound = root_bound(problem, bound_backend, time_limit_s)
    row["bound_step_s"] = bound["bound"]
    row["bound_status"] = bound["status"]
    return row


#: The published C++'s own networks (parplan/data/accpar_cpp/), for the compat section.
CPP_MODELS = ("alexnet", "vgg11", "resnet18", "resnet34", "resnet50")
CPP_DATA = Path(__file__).resolve().parents[1] / "data" / "accpar_cpp"


def compat_task(model: str, array: str, batch: int, bandwidth_gbps: float | None) -> dict:
    """The C++'s own network ``model``: the plan the C++ makes (``--compat accpar-code``,
    communication objective, shares 1/2), parplan's ``accpar`` plan and data parallelism, each
    priced by parplan's model (step time, bytes) and by the C++'s (elements one side receives,
    summed over the levels of the first group's path; :func:`cpp_level_comm`)."""
    from dataclasses import replace

    from parplan.costmodel.problem import Problem
    from parplan.models.modelfile import load_layer_table
    from parplan.solvers.accpar_code import cpp_level_comm
    from parplan.solvers.planners import make_plan

    native = Problem(
        load_layer_table(CPP_DATA / f"{model}.csv"), make_array(array, bandwidth_gbps), batch=batch
    )
    compat = replace(native, compat="accpar-code")
    row: dict = {"model": model}
    for key, problem, planner, kw in (
        ("cpp", compat, "accpar", {"objective": "communication", "shares": "half"}),
        ("parplan", native, "accpar", {}),
        ("data", native, "data", {}),
    ):
        t0 = time.perf_counter()
        plan = make_plan(problem, planner, **kw)
        row[f"{key}_wall_s"] = time.perf_counter() - t0
        row.update(plan_stats(native, plan, prefix=f"{key}_"))
        row[f"{key}_cpp_elements"] = sum(cpp_level_comm(native, plan))
        row.update(plan_shape(native, plan, prefix=f"{key}_"))
    return row


def exact_task(
    model: str,
    array: str,
    batch: int,
    bandwidth_gbps: float | None,
    backend: str,
    time_limit_s: float,
) -> dict:
    """The level-by-level exact plan of one model (see :func:`parplan.bench.common.exact_top_down`)."""
    from parplan.costmodel.problem import Problem
    from parplan.models.zoo import get_model

    problem = Problem(get_model(model), make_array(array, bandwidth_gbps), batch=batch)
    return {"model": model, **exact_top_down(problem, backend, time_limit_s)}


def run(
    out_dir: str | Path,
    quick: bool = False,
    executor: ExecutorSpec | None = None,
    models: tuple[str, ...] | None = None,
    array: str | None = None,
    batch: int | None = None,
    bandwidth_gbps: float | None = None,
    sweep_gbps: tuple[float, ...] | None = None,
    exact_backend: str = "scip",
    time_limit_s: float = 60.0,
    exact: bool = True,
    compat: bool = True,
    planners: tuple[str, ...] | None = None,
) -> pd.DataFrame:
    """Run the benchmark; write accpar.csv / accpar_summary.csv / accpar.png / accpar.md.

    Columns of the returned table (one row per bandwidth and model): bandwidth, bandwidth_gbps,
    primary, model, array, devices, levels, batch, weighted_layers, activation_weight_ratio,
    fc_weight_fraction, data_step_ms, speedup_data_half, speedup_owt, speedup_hypar,
    speedup_accpar, speedup_topdown, speedup_exact, speedup_bound, exact_status, exact_gap,
    exact_wall_s, accpar_selected, accpar_idle_devices, accpar_model_parallel_cells,
    data_compute_fraction, accpar_compute_fraction, ordering,
    paper_order, dominant_term, note, and per planner P in data, data_half, owt, hypar, accpar,
    topdown: P_step_s, P_compute_s, P_other_s, P_comm_bytes, P_intra_bytes, P_transition_bytes,
    P_wall_s. ``planners`` (prefixes or planner names; default all) limits the compared planners:
    the others' speedup columns are NaN and their per-planner columns absent.
    """
    from parplan.models.zoo import get_model
    from parplan.solvers.backends.registry import backend_spec

    models = tuple(models or (QUICK["models"] if quick else MODELS))
    array = array or (QUICK["array"] if quick else DEFAULT_ARRAY)
    batch = batch or (QUICK["batch"] if quick else DEFAULT_BATCH)
    sweep = tuple(
        sweep_gbps
        if sweep_gbps is not None
        else (QUICK["sweep_gbps"] if quick else DEFAULT_SWEEP_GBPS)
    )
    for m in models:
        get_model(m)  # unknown names fail here, before any worker starts
    backend_spec(exact_backend)
    keys = planner_keys(planners)
    arr = make_array(array, bandwidth_gbps)
    bandwidths: list[float | None] = [bandwidth_gbps] + [b for b in sweep if b != bandwidth_gbps]
    out = out_dir_path(out_dir)

    tasks = _tasks(
        models,
        bandwidths,
        array,
        batch,
        bandwidth_gbps,
        exact_backend,
        time_limit_s,
        exact,
        ((("alexnet", "resnet18") if quick else CPP_MODELS) if compat else ()),
        keys,
    )
    with_progress_header(
        NAME,
        f"{len(models)} models x {len(bandwidths)} bandwidths on {array} "
        f"({arr.count} devices, {arr.depth} levels), batch {batch}; "
        f"planners {', '.join(keys)}; {len(tasks)} tasks",
    )
    results = run_tasks(NAME, tasks, executor)
    n_plan = len(bandwidths) * len(models)
    n_exact = len(models) if exact else 0
    exact_rows = {r["model"]: r for r in results[n_plan : n_plan + n_exact]}
    cpp = pd.DataFrame(results[n_plan + n_exact :])
    common = {"array": arr.describe(), "devices": arr.count, "levels": arr.depth, "batch": batch}
    rows = [
        _row(
            bw,
            r,
            bandwidth_gbps,
            exact_rows.get(m) if bw == bandwidth_gbps else None,
            exact,
            common,
        )
        for (bw, m), r in zip(((bw, m) for bw in bandwidths for m in models), results[:n_plan])
    ]
    table = pd.DataFrame(rows)
    lead = [
        "bandwidth",
        "bandwidth_gbps",
        "primary",
        "model",
        "array",
        "devices",
        "levels",
        "batch",
        "weighted_layers",
        "activation_weight_ratio",
        "fc_weight_fraction",
        "data_step_ms",
        "speedup_data_half",
        "speedup_owt",
        "speedup_hypar",
        "speedup_accpar",
        "speedup_topdown",
        "speedup_exact",
        "speedup_bound",
        "exact_status",
        "exact_gap",
        "exact_wall_s",
        "accpar_selected",
        "data_compute_fraction",
        "accpar_compute_fraction",
        "ordering",
        "paper_order",
        "dominant_term",
        "note",
    ]
    table = table[lead + [c for c in table.columns if c not in lead]]
    summary = summarize(table)
    extra = {"accpar_summary": summary}
    if len(cpp):
        extra["accpar_compat"] = cpp
    write_outputs(
        out,
        NAME,
        table,
        lambda p: _plot(table, p),
        _markdown(table, summary, exact_backend, time_limit_s) + _compat_section(cpp),
        extra=extra,
    )
    return table


def _tasks(
    models,
    bandwidths,
    array,
    batch,
    bandwidth_gbps,
    backend,
    time_limit_s,
    exact,
    cpp_models,
    planners=COMPARED,
) -> list[Task]:
    """Every planner per (bandwidth, model), then the exact plans, then the C++'s networks."""
    tasks = [
        Task(
            f"{m} @ {bandwidth_label(bw)}",
            planner_task,
            dict(
                model=m,
                array=array,
                batch=batch,
                bandwidth_gbps=bw,
                bound_backend=backend,
                time_limit_s=time_limit_s,
                planners=planners,
            ),
            cost=_COST.get(m, 1),
        )
        for bw in bandwidths
        for m in models
    ]
    if exact:
        tasks += [
            Task(
                f"{m} exact ({backend})",
                exact_task,
                dict(
                    model=m,
                    array=array,
                    batch=batch,
                    bandwidth_gbps=bandwidth_gbps,
                    backend=backend,
                    time_limit_s=time_limit_s,
                ),
                cost=1.5 * _COST.get(m, 1),
            )
            for m in models
        ]
    tasks += [
        Task(
            f"C++ {m} (compat)",
            compat_task,
            dict(model=m, array=array, batch=batch, bandwidth_gbps=bandwidth_gbps),
        )
        for m in cpp_models
    ]
    return tasks


def _row(bw, r: dict, primary_gbps, ex: dict | None, exact: bool, common: dict) -> dict:
    """One table row: a planner task's result with speedups, the exact column and the explanation."""
    row = {
        "bandwidth": bandwidth_label(bw),
        "bandwidth_gbps": math.nan if bw is None else bw,
        "primary": bw == primary_gbps,
        **common,
        **r,
    }
    data = r["data_step_s"]
    row["data_step_ms"] = data * 1e3
    for key in COMPARED:  # a planner not run has no speedup
        step = r.get(f"{key}_step_s")
        row[f"speedup_{key}"] = data / step if step else math.nan
    row["speedup_bound"] = data / r["bound_step_s"] if r["bound_step_s"] > 0 else math.nan
    row["speedup_exact"] = data / ex["step_time_s"] if ex and ex["step_time_s"] > 0 else math.nan
    row["exact_status"] = (
        ex["status"] if ex else ("-" if not exact else "not run at this bandwidth")
    )
    row["exact_gap"] = ex["gap"] if ex else math.nan
    row["exact_wall_s"] = ex["wall_s"] if ex else math.nan
    row["data_compute_fraction"] = r["data_compute_s"] / data
    row["accpar_compute_fraction"] = (
        r["accpar_compute_s"] / r["accpar_step_s"] if "accpar_step_s" in r else math.nan
    )
    row.setdefault("accpar_selected", "-")
    row.update(explain(row))
    return row


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Geometric and arithmetic mean of every speedup column per bandwidth, next to the paper."""
    rows = []
    for bw, sub in table.groupby("bandwidth", sort=False):
        for key in ("owt", "hypar", "accpar", "topdown", "exact", "bound", "data_half"):
            vals = sub[f"speedup_{key}"].dropna()
            if not len(vals):
                continue
            rows.append(
                {
                    "bandwidth": bw,
                    "primary": bool(sub.primary.iloc[0]),
                    "planner": key,
                    "models": len(vals),
                    "geomean": geomean(vals),
                    "arithmean": arithmean(vals),
                    "paper": PAPER.get(key, math.nan),
                }
            )
    return pd.DataFrame(rows)


def explain(row: dict) -> dict:
    """Per model: the ordering found, whether it is the paper's, the dominant cost term and why
    ordering or magnitude differ from the paper."""
    sp = {k: row[f"speedup_{k}"] for k in ("owt", "hypar", "accpar")}
    sp = {k: v for k, v in sp.items() if not math.isnan(v)}  # the planners that ran
    ranked = sorted(sp, key=lambda k: sp[k])
    ordering = " < ".join(f"{LABELS[k]} {sp[k]:.2f}x" for k in ranked)
    paper_order = ranked == ["owt", "hypar", "accpar"] and sp["owt"] > 1.0
    comm = 1.0 - row["data_compute_fraction"]
    dominant = "communication (weight-gradient exchange)" if comm >= 0.5 else "compute"
    notes = []
    for low, high in (("owt", "hypar"), ("hypar", "accpar"), ("owt", "accpar")):
        if low in sp and high in sp and sp[high] < sp[low] * (1 - 1e-9):
            notes.append(f"{LABELS[high]} < {LABELS[low]}: " + _pair_reason(row, high, low))
    if "owt" in sp and sp["owt"] <= 1.0 + 1e-9:
        notes.append(
            f"OWT no faster than data parallelism ({sp['owt']:.2f}x): "
            f"its FC layers hold {row['fc_weight_fraction']:.0%} of the weights, so splitting them "
            "leaves the convolutions' weight-gradient exchange in place"
        )
    ratio = (
        sp["accpar"] / PAPER["accpar"]
        if "accpar" in sp and paper_setup(row.get("array"), row.get("batch", 0))
        else 1.0
    )
    if ratio < 2 / 3:
        if comm < 0.5:
            why = (
                f"data parallelism is compute-bound here (communication {comm:.0%} of its step), so "
                f"no partition can gain more than ~{1 / max(1 - comm, 1e-9):.1f}x"
            )
        elif row["activation_weight_ratio"] > 1.0:
            why = (
                f"activations outweigh weights {row['activation_weight_ratio']:.1f}:1, so IN/OUT splits exchange "
                "more than the weight gradients data parallelism exchanges; only the weight-heavy layers gain "
                f"(AccPar is {row['accpar_compute_fraction']:.0%} compute)"
            )
        else:
            why = (
                f"AccPar's remaining step is {1 - row['accpar_compute_fraction']:.0%} communication on "
                "the lower levels' links"
            )
        notes.append(f"AccPar {sp['accpar']:.2f}x is below the paper's 6.30x average: {why}")
    elif ratio > 1.5:
        notes.append(
            f"AccPar {sp['accpar']:.2f}x is above the paper's 6.30x average: data parallelism is "
            f"{comm:.0%} communication and the FC layers hold {row['fc_weight_fraction']:.0%} of the "
            "weights, which IN/OUT splits stop exchanging"
        )
    fine = (
        "ordering and magnitude as in the paper"
        if paper_setup(row.get("array"), row.get("batch", 0))
        else "ordering as in the paper"
    )
    if len(sp) < 3:  # not all of OWT, HyPar and AccPar ran: no ordering to compare
        fine = "planners compared: " + (ordering or "none of OWT, HyPar, AccPar")
    return {
        "ordering": ordering,
        "paper_order": paper_order,
        "dominant_term": dominant,
        "note": "; ".join(notes) if notes else fine,
    }


def _pair_reason(row: dict, high: str, low: str) -> str:
    """Why planner ``high`` (expected faster) is slower than ``low``: the term that differs most."""
    hc, lc = row[f"{high}_compute_s"], row[f"{low}_compute_s"]
    ho, lo = row[f"{high}_other_s"], row[f"{low}_other_s"]
    if hc - lc >= ho - lo:
        extra = (
            " (shares of 1/2 load the slower half as much as the faster)" if high == "hypar" else ""
        )
        return f"its compute time is {hc * 1e3:.2f} ms vs {lc * 1e3:.2f} ms{extra}"
    extra = " (it minimises elements moved, not time)" if high == "hypar" else ""
    return (
        f"its communication time is {ho * 1e3:.2f} ms vs {lo * 1e3:.2f} ms, "
        f"{row[f'{high}_comm_bytes'] / 1e9:.2f} GB vs {row[f'{low}_comm_bytes'] / 1e9:.2f} GB moved{extra}"
    )


def _plot(table: pd.DataFrame, path: Path) -> None:
    panels = []
    for bw, sub in table.groupby("bandwidth", sort=False):
        frame = sub[
            ["model", "speedup_owt", "speedup_hypar", "speedup_accpar", "speedup_exact"]
        ].copy()
        means = {
            "model": "geomean",
            **{c: geomean(frame[c].dropna()) for c in frame.columns if c != "model"},
        }
        frame = pd.concat([frame, pd.DataFrame([means])], ignore_index=True)
        primary = " (primary)" if sub.primary.iloc[0] else ""
        panels.append(
            (f"{sub['array'].iloc[0]}, batch {sub['batch'].iloc[0]}, links {bw}{primary}", frame)
        )
    series = {
        label: col
        for label, col in (
            ("OWT", "speedup_owt"),
            ("HyPar", "speedup_hypar"),
            ("AccPar", "speedup_accpar"),
            ("exact (level-by-level)", "speedup_exact"),  # not with --no-exact
        )
        if table[col].notna().any()  # planners left out by --planners have no bars
    }
    first = table.iloc[0]
    # the paper's averages are drawn only on its own setup (128 TPUs, batch 512)
    refs = (
        {f"paper {LABELS[k]} {v}x": v for k, v in PAPER.items()}
        if paper_setup(first["array"], first["batch"])
        else None
    )
    grouped_bars(
        path, panels, "model", series, "speedup over data parallelism", references=refs, log_y=True
    )


def _changes_section(prim: pd.DataFrame, table: pd.DataFrame) -> list[str]:
    """How AccPar's speedups moved from the previous cost model to this one, and why."""
    rows = [r for r in prim.itertuples() if r.model in PREVIOUS_MODEL_ACCPAR]
    first = prim.iloc[0] if len(prim) else None
    same_setup = (
        first is not None
        and first["array"] == DEFAULT_ARRAY
        and first["batch"] == DEFAULT_BATCH
        and math.isnan(first["bandwidth_gbps"])
    )
    if not rows or not same_setup or "accpar_step_s" not in prim:
        return []  # the recorded figures are for the default setup and AccPar only
    lines = [
        "## Changes from the previous cost model",
        "",
        "AccPar's speedup at the devices' own links, before and after the honest cost model "
        "(docs/costmodel.md section 10; previous figures recorded at commit c056e4c):",
        "",
        "| model | previous model | current model | change | idle devices | IN/OUT cells |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        before = PREVIOUS_MODEL_ACCPAR[r.model]
        lines.append(
            f"| {r.model} | {before:.2f} | {r.speedup_accpar:.2f} | {r.speedup_accpar / before - 1:+.1%} "
            f"| {int(r.accpar_idle_devices)} of {r.devices} | {r.accpar_model_parallel_cells:.1%} |"
        )
    idle = [r.model for r in rows if r.model.startswith("resnet") and r.accpar_idle_devices > 0]
    lines += [
        "",
        "`idle devices`: devices the AccPar plan gives no work (every split above them puts their side at share "
        "0); `IN/OUT cells`: the fraction of (split, weighted layer) choices that are not data parallel.",
        "",
        "Why the ResNets changed: the previous model let a residual add sit at share 0 or 1 and convert a "
        "layout for free (a re-layout was priced only at the consumer's share, and `a (1 - a) = 0` there), "
        "and it let consecutive layers change shares for free; its ResNet plans routed re-layouts through the "
        "adds at no cost. Now every byte a join receives is charged and a share change moves `|a - a'|` of the "
        "tensor, so IN / OUT splits inside residual blocks pay off less: the ResNet plans are mostly data "
        "parallel (see the IN/OUT column), with model parallelism on the FC layer and on late, weight-heavy "
        "layers, mostly at the lowest levels. The element-wise, attention and HBM terms add compute that every "
        "plan pays, which lowers every speedup a little."
        + (
            f" {', '.join(idle)}: the plan leaves devices idle (the idle-devices column): a side at share 0 "
            "now holds nothing and pays neither reduction nor latency (the previous model charged it latency), and "
            "running on the TPU-v3 half alone beats spreading the batch over the slower TPU-v2 half and paying the "
            "gradient exchange across the root link."
            if idle
            else ""
        ),
        "",
    ]
    slow = (
        table[table.bandwidth_gbps == table.bandwidth_gbps.min()]
        if table.bandwidth_gbps.notna().any()
        else None
    )
    if slow is not None and len(slow) and slow.speedup_accpar.notna().any():
        r = slow.loc[slow.speedup_accpar.idxmax()]
        lines += (
            []
            if r.accpar_idle_devices == 0
            else [
                f"At slow links the same rule lets whole groups sit idle. At {r.bandwidth} AccPar's largest speedup is "
                f"{r.model}'s {r.speedup_accpar:.1f}x: its plan leaves {int(r.accpar_idle_devices)} of {r.devices} "
                f"devices idle and takes {r.accpar_step_s * 1e3:.3g} ms, while data parallelism spends "
                f"{r.data_step_s * 1e3:.3g} ms, mostly exchanging gradients over those links. Such speedups measure "
                "what data parallelism's communication costs there, not IN / OUT splits.",
                "",
            ]
        )
    return lines


def _markdown(table: pd.DataFrame, summary: pd.DataFrame, backend: str, time_limit_s: float) -> str:
    first = table.iloc[0]
    prim = table[table.primary]
    paper = paper_setup(first["array"], first["batch"])
    lines = [
        "# AccPar: speedup over data parallelism on TPU-v2 + TPU-v3"
        if paper
        else f"# AccPar and the baselines: speedup over data parallelism on {first['array']}",
        "",
        f"Array `{first['array']}` ({first['devices']} devices, {first['levels']} levels), "
        f"batch {first['batch']}, bf16 "
        "(2 bytes/element). Baseline: data parallelism with shares proportional to compute (the naive 1/2 "
        "form is the `data (1/2)` column). Every plan is priced by the one evaluator.",
        "",
        "## Averages (geometric / arithmetic) per link bandwidth",
        "",
        "| links | OWT | HyPar | AccPar | AccPar top-down | exact | bound | data (1/2) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for bw, sub in summary.groupby("bandwidth", sort=False):
        cell = {r.planner: f"{r.geomean:.2f} / {r.arithmean:.2f}" for r in sub.itertuples()}
        tag = " (primary)" if sub.primary.iloc[0] else ""
        lines.append(
            f"| {bw}{tag} | "
            + " | ".join(
                cell.get(k, "-")
                for k in ("owt", "hypar", "accpar", "topdown", "exact", "bound", "data_half")
            )
            + " |"
        )
    if paper:
        lines.append(
            f"| paper (mean) | {PAPER['owt']} | {PAPER['hypar']} | {PAPER['accpar']} | - | - | - | - |"
        )
    else:
        lines += [
            "",
            f"Not the paper's setup (it is `{DEFAULT_ARRAY}` at batch {DEFAULT_BATCH}): its averages are "
            "not a reference here, and no replication is claimed.",
        ]
    best = _closest(summary) if paper else None
    if best is not None:
        lines += [
            "",
            f"Closest to the paper's averages: links {best[0]} ({best[1]} means, mean |log ratio| "
            f"{best[2]:.2f}); paper ordering OWT < HyPar < AccPar on the averages: "
            + ", ".join(f"{bw} {'yes' if ok else 'no'}" for bw, ok in _order_by_bw(summary)),
        ]
    lines += [
        "",
        f"## Per model at links {prim.bandwidth.iloc[0]} (primary)",
        "",
    ]
    columns = {
        "model": str,
        "speedup_owt": ".2f",
        "speedup_hypar": ".2f",
        "speedup_accpar": ".2f",
        "speedup_topdown": ".2f",
        "speedup_exact": ".2f",
        "exact_status": str,
        "speedup_bound": ".1f",
        "data_compute_fraction": ".0%",
        "activation_weight_ratio": ".1f",
        "accpar_selected": str,
    }
    left_out = {f"speedup_{k}" for k in COMPARED if prim[f"speedup_{k}"].isna().all()}
    if "speedup_accpar" in left_out:
        left_out.add("accpar_selected")
    if prim.speedup_exact.isna().all():  # --no-exact
        left_out |= {"speedup_exact", "exact_status"}
    lines += md_table(
        prim,
        {c: f for c, f in columns.items() if c not in left_out},  # --planners' choice
        headers={
            "speedup_owt": "OWT",
            "speedup_hypar": "HyPar",
            "speedup_accpar": "AccPar",
            "speedup_topdown": "AccPar top-down",
            "speedup_exact": "exact",
            "exact_status": "exact status",
            "speedup_bound": "bound",
            "data_compute_fraction": "data-parallel compute share",
            "activation_weight_ratio": "activations / weights",
            "accpar_selected": "AccPar criterion",
        },
    )
    others = table[~table.primary]
    if len(others):
        lines += ["", "## Per model at the other bandwidths (OWT / HyPar / AccPar)", ""]
        bws = list(dict.fromkeys(others.bandwidth))
        lines.append("| model | " + " | ".join(bws) + " |")
        lines.append("| --- | " + " | ".join("---" for _ in bws) + " |")
        for m, sub in others.groupby("model", sort=False):
            cells = []
            for bw in bws:
                r = sub[sub.bandwidth == bw].iloc[0]
                cells.append(
                    " / ".join(fmt(v) for v in (r.speedup_owt, r.speedup_hypar, r.speedup_accpar))
                )
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Where and why results differ from the paper"
        if paper
        else "## Per model: ordering and why",
        "",
    ]
    for bw, sub in table.groupby("bandwidth", sort=False):
        lines.append(f"Links {bw}{' (primary)' if sub.primary.iloc[0] else ''}:")
        lines.append("")
        for r in sub.itertuples():
            ran = sum(not math.isnan(v) for v in (r.speedup_owt, r.speedup_hypar, r.speedup_accpar))
            mark = "paper order" if r.paper_order else ("differs" if ran == 3 else "subset")
            lines.append(
                f"- **{r.model}** ({mark}; {r.ordering}; data parallelism dominated by {r.dominant_term}): "
                f"{r.note}."
            )
        lines.append("")
    lines += _columns_section(backend, time_limit_s, first["devices"])
    lines += _changes_section(prim, table)
    lines += [
        "Why magnitudes depend on the links: data parallelism exchanges every weight gradient at every level; "
        "the slower the links, the larger the share of its step that AccPar's IN/OUT splits can remove."
        + (
            " The paper's simulator and link figures are not public, so the sweep shows where its averages are "
            "reached."
            if paper
            else ""
        ),
        "",
    ]
    return "\n".join(lines)


def _columns_section(backend: str, time_limit_s: float, devices: int) -> list[str]:
    """Markdown: what the exact and bound columns mean."""
    return [
        "## Columns `exact` and `bound`",
        "",
        f"`exact`: every split solved by the `{backend}` MIP backend ({time_limit_s:g} s per split, 1 thread, "
        "share grid 1/4), level by level as AccPar plans: each split is certified optimal given its parent's "
        "plan (`split-optimal`). That is the recursion `accpar-topdown` runs with the DP (share grid 1/16); the "
        "columns differ where the grids differ and where equally good split plans send the lower levels into "
        "different sub-problems. Run at the primary bandwidth only. No global optimum of the "
        f"{devices}-device array is claimed: the joint model over all levels (`solve --joint`) reaches 8-16 "
        "devices only (docs/costmodel.md section 8), and the `accpar` portfolio can beat `exact` because "
        "level-by-level optimality is not global optimality.",
        "",
        "`bound`: data-parallel time over a lower bound on every plan of the hierarchy with shares anywhere in "
        "[0, 1]: the interval relaxation of the root split with each half priced as one device of summed "
        "throughput (docs/costmodel.md section 8). This is the root split's relaxation, not the global bound "
        "(`parplan bench bound` and `plan --bound` give that one, which charges what the halves pay inside): it "
        "ignores the communication inside each half, so it is loose on deep arrays; the global optimum lies "
        "between max(AccPar, exact) and the bound.",
        "",
    ]


def _compat_section(cpp: pd.DataFrame) -> str:
    """Markdown: the published C++'s plans next to parplan's on the C++'s own networks."""
    if not len(cpp):
        return ""
    lines = [
        "## The published C++'s plans next to parplan's (its own networks)",
        "",
        "On the AccPar C++'s own network files (`parplan/data/accpar_cpp/`: AlexNet, VGG-11 and its generated "
        "ResNet-18/34/50, which have no downsampling shortcuts and an FC reading 2048 features), `C++` is the plan "
        "the C++ makes (`--compat accpar-code`, communication objective, shares 1/2; its types equal the binary's "
        "at every level, `tests/test_accpar_cpp.py`), `parplan` is parplan's `accpar` plan on the same graph and "
        "array. Each is priced by parplan's model (step time on this array, bytes over all links) and by the "
        "C++'s (elements one side receives by its DP objective, summed over the 7 levels of the first group's "
        "path, shares taken as 1/2).",
        "",
        "| network | C++ plan: step (ms) | parplan plan: step (ms) | data: step (ms) | C++ plan: bytes (GB) | "
        "parplan plan: bytes (GB) | C++ plan: C++ elements (M) | parplan plan: C++ elements (M) | "
        "C++ plan: IN/OUT cells | parplan plan: IN/OUT cells |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in cpp.itertuples():
        lines.append(
            f"| {r.model} | {r.cpp_step_s * 1e3:.3f} | {r.parplan_step_s * 1e3:.3f} | {r.data_step_s * 1e3:.3f} | "
            f"{r.cpp_comm_bytes / 1e9:.2f} | {r.parplan_comm_bytes / 1e9:.2f} | {r.cpp_cpp_elements / 1e6:.1f} | "
            f"{r.parplan_cpp_elements / 1e6:.1f} | {r.cpp_model_parallel_cells:.0%} | "
            f"{r.parplan_model_parallel_cells:.0%} |"
        )
    faster = cpp[cpp.parplan_step_s < cpp.cpp_step_s].model.tolist()
    fewer = cpp[cpp.cpp_cpp_elements <= cpp.parplan_cpp_elements].model.tolist()
    lines += [
        "",
        f"By parplan's model parplan's plan is faster on {len(faster)} of {len(cpp)} networks"
        f"{' (' + ', '.join(faster) + ')' if faster else ''}: it prices compute and each side's throughput, "
        "which the C++'s communication count does not see. By the C++'s own count the C++'s plan moves no more "
        f"than parplan's on {len(fewer)} of {len(cpp)}{' (' + ', '.join(fewer) + ')' if fewer else ''}: it "
        "minimises that count level by level, except that its running minimum skips the shortcut term of the "
        "Type-I predecessor, so on ResNets its DP value can understate its own count (docs/costmodel.md "
        "section 9).",
        "",
    ]
    return "\n".join(lines)


def _closest(summary: pd.DataFrame):
    best = None
    for bw, sub in summary.groupby("bandwidth", sort=False):
        for kind in ("geomean", "arithmean"):
            vals = {r.planner: getattr(r, kind) for r in sub.itertuples()}
            if not all(k in vals for k in PAPER):
                continue
            err = sum(abs(math.log(vals[k] / PAPER[k])) for k in PAPER) / len(PAPER)
            if best is None or err < best[2]:
                best = (bw, "geometric" if kind == "geomean" else "arithmetic", err)
    return best


def _order_by_bw(summary: pd.DataFrame):
    for bw, sub in summary.groupby("bandwidth", sort=False):
        g = {r.planner: r.geomean for r in sub.itertuples()}
        yield bw, all(k in g for k in PAPER) and g["owt"] < g["hypar"] < g["accpar"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``parplan bench accpar`` (``dest`` = the keyword of :func:`run`)."""
    parser.add_argument(
        "--models",
        type=csv_names,
        default=None,
        help=f"comma-separated zoo models (default {','.join(MODELS)})",
    )
    parser.add_argument("--array", default=None, help=f"array (default {DEFAULT_ARRAY})")
    parser.add_argument(
        "--batch", type=int, default=None, help=f"global batch (default {DEFAULT_BATCH})"
    )
    parser.add_argument(
        "--bandwidth",
        dest="bandwidth_gbps",
        type=float,
        default=None,
        metavar="GB/s",
        help="primary link bandwidth, every link (default: the devices' own figures)",
    )
    parser.add_argument(
        "--sweep",
        dest="sweep_gbps",
        type=csv_floats,
        default=None,
        metavar="GB/s,...",
        help="other link bandwidths to repeat the table at (default 1,10,100; '' for none)",
    )
    parser.add_argument(
        "--exact-backend",
        default="scip",
        help="backend of the exact and bound columns (default scip)",
    )
    parser.add_argument(
        "--time-limit",
        dest="time_limit_s",
        type=float,
        default=60.0,
        metavar="S",
        help="per exact solve (default 60)",
    )
    parser.add_argument(
        "--planners",
        type=csv_names,
        default=None,
        metavar="NAME,...",
        help=f"planners compared with data parallelism (default all: {','.join(COMPARED)})",
    )
    parser.add_argument(
        "--no-exact",
        dest="exact",
        action="store_false",
        help="skip the level-by-level exact column",
    )
    parser.add_argument(
        "--no-compat",
        dest="compat",
        action="store_false",
        help="skip the section on the published C++'s own networks",
    )


def main(argv: list[str] | None = None) -> int:
    return standalone_main(__doc__, NAME, run, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
