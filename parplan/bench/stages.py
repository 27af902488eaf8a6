"""Pipeline x partition x data (issue 32): the joint plan against its special cases.

For GPT-style models on one and several H100 nodes, at memory limits where a plan without
pipelining does not fit or fits only with ZeRO-3 or recomputation, and on a heterogeneous array
(an A100 node and an H100 node): ``parplan plan --pipeline``'s plan
(:func:`parplan.pipeline.partitioned.plan_partitioned`), the best partition-only plan (one
stage: ``fit_plan``'s on up to 8 devices, else the root's templates under each setting), the
best pipeline whose stages are data parallel inside, and for the heterogeneous case the same
stages with the layers divided evenly. Times are parplan's model's (docs/costmodel.md section
11) with overlap, as ``parplan plan`` prices by default; planning time is the search's CPU time.

Writes ``stages.csv``, ``stages.png`` and ``stages.md``.
Run: ``parplan bench stages --out results/`` or ``python -m parplan.bench.stages OUT_DIR [--quick]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from parplan.bench.common import (
    ExecutorSpec,
    Task,
    grouped_bars,
    md_table,
    out_dir_path,
    run_tasks,
    standalone_main,
    with_progress_header,
    two_nodes_file,
    write_outputs,
)

NAME = "stages"
GIB = 2**30
#: (model, array, batch, memory limit GiB per device or None for each device's own)
CASES = (
    ("gpt2-xl", "two-slow-nodes", 64, None),
    ("llama3-8b", "two-slow-nodes", 32, None),
    ("llama3-70b", "h100:16", 32, None),
    ("llama3-70b", "a100:8,h100:8", 32, None),
    ("llama3-70b", "h100:64", 64, None),
)
QUICK = (("gpt2", "h100:2", 8, 1.5),)


def stages_task(
    model: str, array: str, batch: int, limit_gib: float | None, tree_file: str | None = None
) -> dict:
    """One case: the joint plan, the one-stage and data-parallel-stage candidates, an even split."""
    from parplan.costmodel.hardware import parse_array
    from parplan.costmodel.problem import Problem
    from parplan.costmodel.stages import (
        PipelinePlan,
        Stage,
        evaluate_pipeline,
        even_ends,
        stage_problem,
    )
    from parplan.models.zoo import get_model
    from parplan.pipeline.partitioned import plan_partitioned, template_planner
    from parplan.solvers.planners import make_plan

    p = Problem(get_model(model), parse_array(tree_file or array), batch=batch, overlap=True)
    limit = None if limit_gib is None else limit_gib * GIB
    t0 = time.process_time()
    r = plan_partitioned(p, limit_bytes=limit)
    cpu = time.process_time() - t0
    one = [
        (t, peak, label)
        for label, t, peak, fits in r.priced
        if label.startswith("1 stage") and fits
    ]
    data = [
        (t, peak, label)
        for label, t, peak, fits in r.priced
        if "data parallel inside" in label and fits
    ]
    row = {
        "model": model,
        "array": array,
        "devices": p.array.count,
        "batch": batch,
        "limit_gib": limit_gib
        if limit_gib is not None
        else min(d.memory_bytes for d in p.array.devices()) / GIB,
        "joint_step_s": r.evaluation.step_time_s,
        "joint_peak_gib": r.evaluation.peak_memory_bytes / GIB,
        "stages": len(r.plan.stages),
        "micro_batches": r.problem.micro_batches,
        "zero_stage": r.problem.zero_stage,
        "recompute": r.problem.recompute,
        "stage_layers": "/".join(str(s.last - s.first + 1) for s in r.plan.stages),
        "one_stage_step_s": one[0][0] if one else None,
        "one_stage_peak_gib": one[0][1] / GIB if one else None,
        "one_stage_setting": one[0][2] if one else "none fits",
        "data_stages_step_s": data[0][0] if data else None,
        "data_stages_peak_gib": data[0][1] / GIB if data else None,
        "even_step_s": None,
        "search_cpu_s": cpu,
    }
    if (
        len(r.plan.stages) > 1
        and len({p.array.at(s.group).devices()[0].name for s in r.plan.stages}) > 1
    ):
        # the same groups and setting with the layers divided as evenly as the cut points allow
        ends = even_ends(p.graph, len(r.plan.stages))
        stages, first = [], 0
        q = r.problem
        for s, last in zip(r.plan.stages, ends):
            sub = stage_problem(q, first, last, s.group)
            stages.append(Stage(first, last, s.group, make_plan(sub, template_planner("accpar"))))
            first = last + 1
        ev = evaluate_pipeline(q, PipelinePlan(tuple(stages), schedule=r.plan.schedule))
        row.update(
            even_step_s=ev.step_time_s,
            even_peak_gib=ev.peak_memory_bytes / GIB,
            even_layers="/".join(str(s.last - s.first + 1) for s in stages),
        )
    return row


def run(
    out_dir: str | Path, quick: bool = False, executor: ExecutorSpec | None = None
) -> pd.DataFrame:
    """Run the benchmark; write stages.csv / stages.png / stages.md. Columns: model, array,
    devices, batch, limit_gib, joint_step_s, joint_peak_gib, stages, micro_batches, zero_stage,
    recompute, stage_layers, one_stage_step_s / one_stage_peak_gib / one_stage_setting (the
    partition-only plan), data_stages_step_s / data_stages_peak_gib (stages data parallel
    inside), even_step_s / even_peak_gib / even_layers (heterogeneous cases: the layers divided
    evenly), search_cpu_s."""
    out = out_dir_path(out_dir)
    cases = QUICK if quick else CASES
    tree = two_nodes_file(
        "two_slow_nodes", 12.5, 10
    )  # one 100 Gb/s link between the nodes: a commodity cluster
    tasks = [
        Task(
            f"{m} on {a}, batch {b}",
            stages_task,
            dict(
                model=m,
                array=a,
                batch=b,
                limit_gib=g,
                tree_file=tree if a == "two-slow-nodes" else None,
            ),
            cost=8 if "70b" in m else 2 if "llama" in m else 1,
        )
        for m, a, b, g in cases
    ]
    with_progress_header(NAME, f"{len(tasks)} cases")
    table = pd.DataFrame(run_tasks(NAME, tasks, executor))
    write_outputs(out, NAME, table, lambda path: _plot(table, path), _markdown(table))
    return table


def _plot(table: pd.DataFrame, path: Path) -> None:
    frame = table.assign(case=[f"{m}\n{a}" for m, a in zip(table.model, table.array)])
    frame = frame.assign(
        joint_ms=1e3 * frame.joint_step_s,
        one_ms=1e3 * frame.one_stage_step_s.astype(float),
        data_ms=1e3 * frame.data_stages_step_s.astype(float),
    )
    grouped_bars(
        path,
        [("step time per case (each within its memory limit)", frame)],
        "case",
        {
            "pipeline x partition": "joint_ms",
            "partition only (1 stage)": "one_ms",
            "pipeline, data-parallel stages": "data_ms",
        },
        "step time (ms)",
    )


def _markdown(table: pd.DataFrame) -> str:
    def ms(v):
        return "-" if v is None or pd.isna(v) else f"{v * 1e3:.4g}"

    def gib(v):
        return "-" if v is None or pd.isna(v) else f"{v:.1f}"

    table = table.assign(
        setting=[
            ", ".join([f"m={int(m)}", f"ZeRO-{int(z)}"] + (["recompute"] if r else []))
            for m, z, r in zip(table.micro_batches, table.zero_stage, table.recompute)
        ]
    )
    lines = [
        "# Pipeline x partition x data: `parplan plan --pipeline`",
        "",
        "The joint plan (stages of layers on groups of the array, each partitioned inside; docs/pipeline.md) "
        "against the best partition-only plan (one stage, memory techniques searched) and the best pipeline "
        "whose stages are data parallel inside, each within the memory limit (GiB per device). Times are "
        "parplan's model's (docs/costmodel.md section 11), with overlap as `parplan plan` prices by default. "
        "`layers` lists the layers per stage; `CPU (s)` is the whole search's CPU time on one core. "
        "`two-slow-nodes`: two nodes of 8 H100s joined by one 100 Gb/s link (12.5 GB/s); `h100:16` and "
        "`h100:64`: nodes of 8 joined by a 50 GB/s rail per GPU; `a100:8,h100:8`: an A100 node and an H100 "
        "node (one link between them, section 4.1).",
        "",
    ]
    lines += md_table(
        table,
        {
            "model": str,
            "array": str,
            "batch": str,
            "limit_gib": ".0f",
            "joint_step_s": ms,
            "joint_peak_gib": gib,
            "stages": str,
            "setting": str,
            "stage_layers": str,
            "one_stage_step_s": ms,
            "one_stage_peak_gib": gib,
            "one_stage_setting": str,
            "data_stages_step_s": ms,
            "search_cpu_s": ".1f",
        },
        headers={
            "limit_gib": "limit (GiB)",
            "joint_step_s": "joint (ms)",
            "joint_peak_gib": "joint (GiB)",
            "stage_layers": "layers",
            "one_stage_step_s": "1 stage (ms)",
            "one_stage_peak_gib": "1 stage (GiB)",
            "one_stage_setting": "1 stage setting",
            "data_stages_step_s": "data-parallel stages (ms)",
            "search_cpu_s": "CPU (s)",
        },
    )
    even = table[table.even_step_s.notna()] if "even_step_s" in table else table.iloc[0:0]
    for row in even.itertuples():
        fits = "within" if row.even_peak_gib <= row.limit_gib else "over"
        lines += [
            "",
            f"{row.model} on {row.array}: the layers divided {row.stage_layers} between the stages take "
            f"{row.joint_step_s * 1e3:.4g} ms; divided evenly ({row.even_layers}) on the same groups "
            f"and setting, {row.even_step_s * 1e3:.4g} ms at {row.even_peak_gib:.1f} GiB ({fits} the "
            f"{row.limit_gib:.0f} GiB limit).",
        ]
    lines.append("")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``parplan bench stages`` has no options of its own."""


def main(argv: list[str] | None = None) -> int:
    return standalone_main(__doc__, NAME, run, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
