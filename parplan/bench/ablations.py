"""AccPar with one feature removed at a time: the step time of each variant relative to full AccPar.

On the AccPar setup (``tpu-v2:64,tpu-v3:64``, batch 512, AlexNet, VGG and ResNet series):

==========================  =================================================================
variant                     what is removed
==========================  =================================================================
accpar                      nothing: the full planner (portfolio of level criteria), the reference
accpar-topdown              the portfolio: the published recursion alone
only-I-II                   Type-III (OUT): layers may only be BATCH or IN (HyPar's space)
only-I-III                  Type-II (IN): layers may only be BATCH or OUT
share-half                  the flexible ratio: every share is 1/2
communication-objective     the time objective: minimise elements moved (shares proportional)
flat-split                  the hierarchy: the root split's DP plan repeated in every sub-group
bandwidth-x0.1              (sensitivity) every link 10x slower, full AccPar replanned
bandwidth-x10               (sensitivity) every link 10x faster, full AccPar replanned
allreduce-ring              (model) BATCH gradient exchange priced as a ring all-reduce
allreduce-dbtree            (model) ... as a double-binary-tree all-reduce
allreduce-multitree         (model) ... as a MultiTree all-reduce
==========================  =================================================================

The option ablations run the published recursion with the feature removed (``make_plan(...,
options=...)``), so ``rel_to_topdown`` isolates the feature and ``rel_to_accpar`` compares with
the full planner. ``speedup_over_data`` is over data parallelism on the same array (the
bandwidth and all-reduce variants change the array).

The all-reduce variants replace the default gradient exchange (each BATCH split sends partial
dW over the link between its two halves, docs/costmodel.md section 2) with one all-reduce over the devices below
the topmost BATCH split of each layer, on a torus of those devices built with that group's
link (array suffix ``@ALG:torus``, :mod:`parplan.costmodel.collective`); full AccPar is
replanned under that model, and ``pairwise_plan_step_s`` prices the default model's AccPar plan
under it (so a planner that ignored the collective would score that).

Writes ``ablations.csv`` (one row per model and variant), ``ablations.png`` (grouped bars of
the step time relative to AccPar) and ``ablations.md``.

Run: ``parplan bench ablations --out results/`` or ``python -m parplan.bench.ablations OUT_DIR [--quick]``.
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
    csv_names,
    geomean,
    grouped_bars,
    make_array,
    md_table,
    out_dir_path,
    plan_stats,
    run_tasks,
    with_progress_header,
    write_outputs,
)

NAME = "ablations"
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
QUICK = {"models": ("alexnet", "resnet-2block"), "array": "tpu-v2:2,tpu-v3:2", "batch": 128}
VARIANTS = {
    "accpar": "nothing (full AccPar, portfolio)",
    "accpar-topdown": "the portfolio (published recursion)",
    "only-I-II": "Type-III (OUT)",
    "only-I-III": "Type-II (IN)",
    "share-half": "flexible shares (all 1/2)",
    "communication-objective": "time objective (minimise elements moved)",
    "flat-split": "hierarchy (root split repeated below)",
    "bandwidth-x0.1": "(sensitivity) links 10x slower",
    "bandwidth-x10": "(sensitivity) links 10x faster",
    "allreduce-ring": "(model) gradient exchange as ring all-reduce",
    "allreduce-dbtree": "(model) gradient exchange as double-binary-tree all-reduce",
    "allreduce-multitree": "(model) gradient exchange as MultiTree all-reduce",
}
_SCALE = {"bandwidth-x0.1": 0.1, "bandwidth-x10": 10.0}
#: All-reduce variants: the collective suffix put on the array.
_COLLECTIVE = {
    "allreduce-ring": "ring:torus",
    "allreduce-dbtree": "dbtree:torus",
    "allreduce-multitree": "multitree:torus",
}
#: Variants that replan full AccPar on a changed array.
_REPLANNED = ("accpar", *_SCALE, *_COLLECTIVE)
_COST = {"resnet152": 30, "resnet101": 20, "resnet50": 8, "resnet34": 4, "resnet18": 2}


def variant_plan(problem, variant: str):
    """The plan of ``variant`` (the bandwidth variants plan full AccPar on their own array)."""
    from parplan.costmodel.cost import Objective, ShareMode
    from parplan.costmodel.layout import PartitionType
    from parplan.costmodel.problem import Plan
    from parplan.solvers.dp import PlanOptions, SplitProblem, all_choices, solve_split
    from parplan.solvers.planners import make_plan, only

    b, i, o = PartitionType.BATCH, PartitionType.IN, PartitionType.OUT
    options = {
        "only-I-II": PlanOptions(Objective.TIME, ShareMode.FREE, only(b, i)),
        "only-I-III": PlanOptions(Objective.TIME, ShareMode.FREE, only(b, o)),
        "share-half": PlanOptions(Objective.TIME, ShareMode.HALF, all_choices),
        "communication-objective": PlanOptions(
            Objective.COMMUNICATION, ShareMode.PROPORTIONAL, all_choices
        ),
    }
    if variant in _REPLANNED:
        return make_plan(problem, "accpar")
    if variant == "accpar-topdown":
        return make_plan(problem, "accpar-topdown")
    if variant in options:
        return make_plan(problem, "accpar", options=options[variant])
    if variant == "flat-split":
        root = solve_split(SplitProblem.root(problem), PlanOptions())
        return Plan({path: root for path, _ in problem.array.inner_nodes()}, planner="flat-split")
    raise ValueError(f"unknown ablation variant '{variant}'; valid: {', '.join(VARIANTS)}")


def variant_task(
    model: str, variant: str, array: str, batch: int, bandwidth_gbps: float | None
) -> dict:
    """Plan and price one variant on one model, with data parallelism on the same array."""
    from parplan.costmodel.problem import Problem
    from parplan.solvers.planners import make_plan
    from parplan.models.zoo import get_model

    base = array.partition("@")[0]  # the array without a collective suffix
    spec = f"{base}@{_COLLECTIVE[variant]}" if variant in _COLLECTIVE else array
    problem = Problem(
        get_model(model), make_array(spec, bandwidth_gbps, _SCALE.get(variant, 1.0)), batch=batch
    )
    t0 = time.perf_counter()
    plan = variant_plan(problem, variant)
    wall = time.perf_counter() - t0
    stats = plan_stats(problem, plan)
    data = plan_stats(problem, make_plan(problem, "data"))["step_s"]
    pairwise = math.nan
    if variant in _COLLECTIVE:
        default = Problem(problem.graph, make_array(base, bandwidth_gbps), batch=batch)
        pairwise = plan_stats(problem, make_plan(default, "accpar"))["step_s"]
    return {
        "model": model,
        "variant": variant,
        "removed": VARIANTS[variant],
        "wall_s": wall,
        "selected": plan.info.get("selected", ""),
        "data_step_s": data,
        "pairwise_plan_step_s": pairwise,
        **stats,
    }


def run(
    out_dir: str | Path,
    quick: bool = False,
    executor: ExecutorSpec | None = None,
    models: tuple[str, ...] | None = None,
    array: str | None = None,
    batch: int | None = None,
    bandwidth_gbps: float | None = None,
    variants: tuple[str, ...] | None = None,
) -> pd.DataFrame:
    """Run the benchmark; write ablations.csv / .png / .md.

    Columns: model, variant, removed, array, batch, step_s, rel_to_accpar, rel_to_topdown,
    speedup_over_data, data_step_s, compute_s, other_s, comm_bytes, intra_bytes,
    transition_bytes, selected (the portfolio's winning criterion, accpar variants),
    pairwise_plan_step_s (all-reduce variants: the default model's AccPar plan priced under the
    variant's all-reduce; NaN otherwise), wall_s.
    """
    from parplan.models.zoo import get_model

    models = tuple(models or (QUICK["models"] if quick else MODELS))
    for m in models:
        get_model(m)
    variants = tuple(variants or VARIANTS)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        from parplan.errors import ConfigError

        raise ConfigError(f"unknown ablation variant(s) {unknown}; valid: {', '.join(VARIANTS)}")
    variants = tuple(dict.fromkeys(("accpar", "accpar-topdown") + variants))
    array = array or (QUICK["array"] if quick else DEFAULT_ARRAY)
    batch = batch or (QUICK["batch"] if quick else DEFAULT_BATCH)
    arr = make_array(array, bandwidth_gbps)
    out = out_dir_path(out_dir)
    tasks = [
        Task(
            f"{m} {v}",
            variant_task,
            dict(model=m, variant=v, array=array, batch=batch, bandwidth_gbps=bandwidth_gbps),
            cost=_COST.get(m, 1) * (3 if v in _REPLANNED else 1),
        )
        for m in models
        for v in variants
    ]
    with_progress_header(
        NAME,
        f"{len(models)} models x {len(variants)} variants on {array} ({arr.count} devices), "
        f"batch {batch}; {len(tasks)} tasks",
    )
    rows = run_tasks(NAME, tasks, executor)
    table = pd.DataFrame(rows)
    ref = table[table.variant == "accpar"].set_index("model").step_s
    top = table[table.variant == "accpar-topdown"].set_index("model").step_s
    table["rel_to_accpar"] = table.step_s / table.model.map(ref)
    table["rel_to_topdown"] = table.step_s / table.model.map(top)
    table["speedup_over_data"] = table.data_step_s / table.step_s
    table["array"] = arr.describe()
    table["batch"] = batch
    cols = [
        "model",
        "variant",
        "removed",
        "array",
        "batch",
        "step_s",
        "rel_to_accpar",
        "rel_to_topdown",
        "speedup_over_data",
        "data_step_s",
        "compute_s",
        "other_s",
        "comm_bytes",
        "intra_bytes",
        "transition_bytes",
        "selected",
        "pairwise_plan_step_s",
        "wall_s",
    ]
    table = table[cols]
    write_outputs(out, NAME, table, lambda p: _plot(table, p), lambda: _markdown(table))
    return table


def _plot(table: pd.DataFrame, path: Path) -> None:
    wide = table.pivot_table(
        index="model", columns="variant", values="rel_to_accpar", sort=False
    ).reset_index()
    means = {"model": "geomean", **{c: geomean(wide[c]) for c in wide.columns if c != "model"}}
    wide = pd.concat([wide, pd.DataFrame([means])], ignore_index=True)
    series = {v: v for v in dict.fromkeys(table.variant) if v != "accpar"}
    grouped_bars(
        path,
        [
            (
                f"step time relative to full AccPar ({table['array'].iloc[0]}, batch "
                f"{table['batch'].iloc[0]}); > 1 = slower",
                wide,
            )
        ],
        "model",
        series,
        "step time / AccPar's",
        log_y=True,
    )


def _markdown(table: pd.DataFrame) -> str:
    first = table.iloc[0]
    variants = list(dict.fromkeys(table.variant))
    lines = [
        "# AccPar ablations",
        "",
        f"Array `{first['array']}`, batch {first['batch']}. Each cell: step time of the variant / full AccPar's "
        "(> 1: the removed feature was worth that factor). Option ablations run the published recursion "
        "(`accpar-topdown`) with one feature removed.",
        "",
        "## Geometric mean over models",
        "",
        "| variant | removed | vs AccPar | vs AccPar top-down | speedup over data parallelism |",
        "| --- | --- | --- | --- | --- |",
    ]
    for v in variants:
        sub = table[table.variant == v]
        lines.append(
            f"| {v} | {sub.removed.iloc[0]} | {geomean(sub.rel_to_accpar):.3f} | "
            f"{geomean(sub.rel_to_topdown):.3f} | {geomean(sub.speedup_over_data):.2f}x |"
        )
    lines += [
        "",
        "## Which term moves (geometric mean over models, relative to AccPar)",
        "",
        "| variant | compute (slowest device) | communication and waiting | bytes moved |",
        "| --- | --- | --- | --- |",
    ]
    ref = table[table.variant == "accpar"].set_index("model")
    for v in variants:
        sub = table[table.variant == v].set_index("model")
        ratio = {
            k: geomean((sub[k] / ref[k]).replace([math.inf], math.nan).dropna())
            for k in ("compute_s", "other_s", "comm_bytes")
        }
        lines.append(
            f"| {v} | {ratio['compute_s']:.3f} | {ratio['other_s']:.3f} | {ratio['comm_bytes']:.3f} |"
        )
    same = [
        v
        for v in variants
        if v not in ("accpar",)
        and math.isclose(geomean(table[table.variant == v].rel_to_accpar), 1.0, rel_tol=1e-9)
    ]
    if same:
        lines += [
            "",
            f"Equal to AccPar: {', '.join(same)} -- the portfolio's winning level criterion "
            f"({', '.join(sorted(set(table[table.variant == 'accpar'].selected)))}) is that variant's plan.",
        ]
    lines += ["", "## Per model (step time / AccPar's)", ""]
    wide = table.pivot_table(
        index="model", columns="variant", values="rel_to_accpar", sort=False
    ).reset_index()
    lines += md_table(wide, {"model": str, **{v: ".3f" for v in variants if v in wide.columns}})
    worst = {}
    removed = table[~table.variant.isin(_REPLANNED)]
    for m, sub in removed.groupby("model", sort=False):
        r = sub.loc[sub.rel_to_accpar.idxmax()]
        worst[m] = (r.variant, r.rel_to_accpar)
    lines += ["", "## Most valuable feature per model", ""]
    lines += [
        f"- {m}: removing {VARIANTS[v].split(' (')[0] if v != 'accpar-topdown' else 'the portfolio'} "
        f"(`{v}`) costs {x:.2f}x"
        for m, (v, x) in worst.items()
    ]
    lines += _collective_markdown(table)
    lines.append("")
    return "\n".join(lines)


def _collective_markdown(table: pd.DataFrame) -> list[str]:
    sub = table[table.variant.isin(_COLLECTIVE)]
    if not len(sub):
        return []
    lines = [
        "",
        "## Gradient exchange as an all-reduce (geometric mean over models)",
        "",
        "AccPar replanned with BATCH gradient exchange priced as one all-reduce per layer over the devices "
        "below its topmost BATCH split (torus of those devices). `vs data` compares with data parallelism "
        "under the same all-reduce; `pairwise plan` prices the default model's AccPar plan under it "
        "(> 1: planning with the collective in the cost model paid off).",
        "",
        "| variant | step vs default AccPar | speedup over data (same all-reduce) | pairwise plan / replanned |",
        "| --- | --- | --- | --- |",
    ]
    for v, s in sub.groupby("variant", sort=False):
        lines.append(
            f"| {v} | {geomean(s.rel_to_accpar):.3f} | {geomean(s.speedup_over_data):.2f}x | "
            f"{geomean(s.pairwise_plan_step_s / s.step_s):.3f} |"
        )
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``parplan bench ablations`` (``dest`` = the keyword of :func:`run`)."""
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
        help="every link's bandwidth before scaling (default: the devices' own figures)",
    )
    parser.add_argument(
        "--variants",
        type=csv_names,
        default=None,
        help=f"comma-separated subset of: {', '.join(VARIANTS)}",
    )


def main(argv: list[str] | None = None) -> int:
    return standalone_main(__doc__, NAME, run, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
