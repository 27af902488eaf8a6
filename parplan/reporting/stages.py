"""Reports of pipeline x partition plans (``parplan plan --pipeline``; docs/pipeline.md).

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.pipeline.partitioned import plan_partitioned
    >>> r = plan_partitioned(Problem(get_model("gpt2"), parse_array("h100:4"), batch=8), ignore_memory=True,
    ...                      micro_batches=(8,), zero=(1,), recompute=(False,))
    >>> print(result_text(r).splitlines()[0])
    gpt2 on h100:4, batch 8: 2 stages, 1f1b, m=8, zero-1
"""

from __future__ import annotations

from collections import Counter

from parplan.costmodel.problem import Problem
from parplan.costmodel.stages import PipelineEvaluation, PipelinePlan, in_flight
from parplan.pipeline.partitioned import PartitionedResult, Setting
from parplan.reporting.report import format_bytes, format_time


def _kinds(stage_plan) -> str:
    """What a stage's plan does at its top split: ``batch 12, in 3`` (types by count), or ``1 device``."""
    if not stage_plan.splits:
        return "1 device"
    root = stage_plan.splits[""]
    counts = Counter(c.value for c in root.choices)
    return ", ".join(f"{k} {n}" for k, n in counts.most_common())


def stage_rows(problem: Problem, plan: PipelinePlan, ev: PipelineEvaluation) -> list[dict]:
    """One dict per stage: layers, group, devices, step and per-micro-batch seconds, peak memory."""
    order = problem.graph.analyze().order
    moves = dict(enumerate(ev.boundary_moves))
    rows = []
    for s, (stage, seconds, sub_ev) in enumerate(
        zip(plan.stages, ev.stage_time_s, ev.stage_evaluations)
    ):
        group = problem.array.at(stage.group)
        peak = max(
            ev.device_memory_bytes[stage.group + path] for path in sub_ev.device_memory_bytes
        )
        rows.append(
            {
                "stage": s,
                "first_layer": order[stage.first],
                "last_layer": order[stage.last],
                "layers": stage.last - stage.first + 1,
                "group": stage.group or "root",
                "devices": group.describe(),
                "step_s": seconds,
                "micro_batch_s": seconds / ev.micro_batches,
                "in_flight": in_flight(plan.schedule, s, len(plan.stages), ev.micro_batches),
                "peak_memory_bytes": peak,
                "top_split": _kinds(stage.plan),
                # its cuts' tensor moved inside its group (docs/costmodel.md section 11)
                "moves_at_cuts_elements": sum(m.elements for m in moves.get(s, ())),
            }
        )
    return rows


def pipeline_dict(
    problem: Problem,
    plan: PipelinePlan,
    ev: PipelineEvaluation,
    result: PartitionedResult | None = None,
) -> dict:
    """The JSON report (with the search's candidates when ``result`` is given)."""
    out = {
        "model": problem.graph.name,
        "array": problem.array.describe(),
        "batch": problem.batch,
        "schedule": plan.schedule,
        "micro_batches": problem.micro_batches,
        "zero_stage": problem.zero_stage,
        "recompute": problem.recompute,
        "checkpoint": problem.checkpoint,
        "step_time_s": ev.step_time_s,
        "bubble_fraction": ev.bubble_fraction,
        "transfer_s": list(ev.transfer_s),
        "tied_sync_s": ev.tied_sync_s,
        "peak_device_memory_bytes": ev.peak_memory_bytes,
        "stages": stage_rows(problem, plan, ev),
    }
    if result is not None:
        out["priced"] = [
            {"plan": label, "step_time_s": t, "peak_memory_bytes": peak, "fits": fits}
            for label, t, peak, fits in result.priced
        ]
        out["notes"] = list(result.notes)
    return out


def pipeline_text(problem: Problem, plan: PipelinePlan, ev: PipelineEvaluation) -> str:
    """The table report of one pipeline plan: its stages and transfers."""
    n = len(plan.stages)
    setting = Setting(problem.micro_batches, problem.zero_stage, problem.recompute).label()
    lines = [
        f"{problem.graph.name} on {problem.array.describe()}, batch {problem.batch}: {n} stage{'s' * (n != 1)}, "
        f"{plan.schedule}, {setting}",
        f"step time {format_time(ev.step_time_s)}, bubble {ev.bubble_fraction:.1%}, "
        f"peak memory {format_bytes(ev.peak_memory_bytes)}",
        "",
    ]
    rows = stage_rows(problem, plan, ev)
    header = (
        "stage",
        "layers",
        "group",
        "devices",
        "step",
        "per micro-batch",
        "held",
        "peak memory",
        "top split",
    )
    table = [header] + [
        (
            str(r["stage"]),
            f"{r['first_layer']} .. {r['last_layer']} ({r['layers']})",
            r["group"],
            r["devices"],
            format_time(r["step_s"]),
            format_time(r["micro_batch_s"]),
            str(r["in_flight"]),
            format_bytes(r["peak_memory_bytes"]),
            r["top_split"],
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    if ev.transfer_s:
        lines.append(
            "transfers per micro-batch (activation forward, gradient back): "
            + ", ".join(format_time(t) for t in ev.transfer_s)
        )
    inside = [
        f"stage {r['stage']} {format_bytes(r['moves_at_cuts_elements'] * problem.bytes_per_element)}"
        for r in rows
        if r["moves_at_cuts_elements"] > 0
    ]
    if inside:
        lines.append(
            "moved inside a stage's group at its cuts per step (in its step time; "
            "docs/costmodel.md section 11): " + ", ".join(inside)
        )
    if ev.tied_sync_s:
        lines.append(f"tied weights across stages: {format_time(ev.tied_sync_s)} per step")
    return "\n".join(lines)


def result_text(result: PartitionedResult) -> str:
    """:func:`pipeline_text` of the search's plan, then every candidate it priced exactly."""
    lines = [
        pipeline_text(result.problem, result.plan, result.evaluation),
        "",
        "priced exactly (the best candidates of the stage DP, and the one-stage plan):",
    ]
    for label, t, peak, fits in result.priced:
        lines.append(
            f"  {label:<48} {format_time(t) if t != float('inf') else '-':>12}  "
            f"{format_bytes(peak) if peak != float('inf') else '-':>10}  {'fits' if fits else 'over memory'}"
        )
    lines += [f"note: {n}" for n in result.notes]
    lines.append(
        "proven: each candidate's stage split is the optimum of the stage space (groups of one depth of "
        "the array's tree, cuts at single-tensor points) for the whole-model templates' prices; the times "
        "above are the evaluator's price of each plan, every device's memory re-checked "
        "(docs/pipeline.md)"
    )
    return "\n".join(lines)
