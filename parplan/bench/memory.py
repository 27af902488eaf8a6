"""Plans that fit: what ``parplan plan`` recommends once memory is a constraint (issue 30).

For models people train today on GPU nodes: the plan ``accpar`` makes with memory ignored (the
papers' setting: its step time and the memory it would need), the plan ``parplan plan`` makes
by default (:func:`parplan.solvers.fit.fit_plan`: ZeRO stage x recomputation x micro-batches,
then memory prices; docs/costmodel.md section 6.2), the hand-written Megatron-style plan where
one applies (tensor parallel on the lowest levels, data parallel above,
:func:`parplan.solvers.megatron.megatron_plan`, priced at ZeRO-1 as Megatron's distributed
optimizer runs it), and the least memory per device that any plan needs (the bound of section
6.2). Devices' own memory is the limit (80 GiB H100s, 32 GiB V100s).

Writes ``memory.csv``, ``memory.png`` (step time and peak memory per case) and ``memory.md``.
Run: ``parplan bench memory --out results/`` or ``python -m parplan.bench.memory OUT_DIR [--quick]``.
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

NAME = "memory"
GIB = 2**30
#: (model, array, batch, tensor-parallel levels of the Megatron-style plan or None)
CASES = (
    ("llama3-8b", "h100:8", 16, 2),
    ("llama3-8b", "two-h100-nodes", 32, 2),
    ("mistral-7b", "h100:8", 16, 2),
    ("gpt2-xl", "h100:4", 64, 2),
    ("vgg16", "v100:2", 2048, None),
)
QUICK = (("vgg16", "v100:2", 2048, None), ("gpt2", "h100:2", 64, 1))


def memory_task(
    model: str, array: str, batch: int, tensor_levels: int | None, tree_file: str | None
) -> dict:
    """One case: the unconstrained plan, the fitted plan, the Megatron-style plan, the bound."""
    from dataclasses import replace

    from parplan.costmodel.evaluate import evaluate
    from parplan.costmodel.hardware import parse_array
    from parplan.costmodel.problem import Problem
    from parplan.errors import InfeasibleError
    from parplan.models.zoo import get_model
    from parplan.solvers.fit import (
        device_limits,
        fit_plan,
        memory_lower_bound,
        peak_fraction,
        techniques,
    )
    from parplan.solvers.megatron import megatron_plan
    from parplan.solvers.planners import make_plan

    p = Problem(
        get_model(model), parse_array(tree_file or array), batch=batch, overlap=True
    )  # plan's default
    limits = device_limits(p, None)
    t0 = time.perf_counter()
    free = evaluate(p, make_plan(p, "accpar"))
    free_wall = time.perf_counter() - t0
    # the least memory any plan keeps, over every setting searched (section 6.2)
    least = min(memory_lower_bound(t.apply(p)) for t in techniques(p))
    row = {
        "model": model,
        "array": array,
        "devices": p.array.count,
        "batch": batch,
        "device_memory_gib": min(limits.values()) / GIB,
        "free_step_s": free.step_time_s,
        "free_peak_gib": free.peak_memory_bytes / GIB,
        "free_fits": peak_fraction(free, limits) <= 1.0,
        "free_wall_s": free_wall,
        "bound_per_device_gib": least / p.array.count / GIB,
    }
    t0 = time.perf_counter()
    try:
        fit = fit_plan(p, "accpar")
        row.update(
            fit_step_s=fit.evaluation.step_time_s,
            fit_peak_gib=fit.evaluation.peak_memory_bytes / GIB,
            zero_stage=fit.problem.zero_stage,
            recompute=fit.problem.recompute,
            micro_batches=fit.problem.micro_batches,
            how=fit.how,
        )
    except InfeasibleError as exc:
        row.update(
            fit_step_s=None,
            fit_peak_gib=None,
            zero_stage=None,
            recompute=None,
            micro_batches=None,
            how=f"none: {exc}",
        )
    row["fit_wall_s"] = time.perf_counter() - t0
    row.update(megatron_step_s=None, megatron_peak_gib=None, megatron_fits=None)
    if tensor_levels is not None:
        q = replace(p, zero_stage=1)
        ev = evaluate(q, megatron_plan(q, tensor_levels))
        row.update(
            megatron_step_s=ev.step_time_s,
            megatron_peak_gib=ev.peak_memory_bytes / GIB,
            megatron_fits=peak_fraction(ev, limits) <= 1.0,
            megatron_tp=2**tensor_levels,
        )
    return row


def run(
    out_dir: str | Path, quick: bool = False, executor: ExecutorSpec | None = None
) -> pd.DataFrame:
    """Run the benchmark; write memory.csv / memory.png / memory.md. Columns: model, array,
    devices, batch, device_memory_gib, free_step_s / free_peak_gib / free_fits / free_wall_s (the
    plan with memory ignored), bound_per_device_gib (the least any plan needs, on average),
    fit_step_s, fit_peak_gib, zero_stage, recompute, micro_batches, how, fit_wall_s (``parplan
    plan``'s default), megatron_step_s, megatron_peak_gib, megatron_fits, megatron_tp."""
    out = out_dir_path(out_dir)
    tree = two_nodes_file(
        "two_h100_nodes", 50, 5
    )  # the README's and examples/two_h100_nodes.toml's array
    cases = QUICK if quick else CASES
    tasks = [
        Task(
            f"{m} on {a}, batch {b}",
            memory_task,
            dict(
                model=m,
                array=a,
                batch=b,
                tensor_levels=t,
                tree_file=tree if a == "two-h100-nodes" else None,
            ),
            cost=4 if "llama" in m or "mistral" in m else 1,
        )
        for m, a, b, t in cases
    ]
    with_progress_header(NAME, f"{len(tasks)} cases")
    table = pd.DataFrame(run_tasks(NAME, tasks, executor))
    write_outputs(out, NAME, table, lambda path: _plot(table, path), _markdown(table))
    return table


def _plot(table: pd.DataFrame, path: Path) -> None:
    frame = table.assign(case=[f"{m}\n{a}" for m, a in zip(table.model, table.array)])
    frame = frame.assign(
        free_ms=1e3 * frame.free_step_s,
        fit_ms=1e3 * frame.fit_step_s.astype(float),
        megatron_ms=1e3 * frame.megatron_step_s.astype(float),
    )
    grouped_bars(
        path,
        [("step time per case (each device's own memory)", frame)],
        "case",
        {
            "memory ignored (does not fit)": "free_ms",
            "parplan plan (fits)": "fit_ms",
            "Megatron-style (ZeRO-1)": "megatron_ms",
        },
        "step time (ms)",
    )


def _markdown(table: pd.DataFrame) -> str:
    def ms(v):
        return "-" if pd.isna(v) else f"{v * 1e3:.4g}"

    def gib(v):
        return "-" if pd.isna(v) else f"{v:.1f}"

    table = table.assign(
        setting=[
            "-"
            if pd.isna(z)
            else ", ".join(
                [f"ZeRO-{int(z)}"]
                + (["recompute"] if r else [])
                + ([f"{int(m)} micro-batches"] if m and m > 1 else [])
            )
            for z, r, m in zip(table.zero_stage, table.recompute, table.micro_batches)
        ]
    )
    lines = [
        "# Plans that fit: `parplan plan` with memory as a constraint",
        "",
        "Each device's own memory is the limit. `memory ignored` is the `accpar` plan with memory ignored (the "
        "papers' setting, and `parplan plan` before issue 30); `parplan plan` is today's default "
        "(docs/costmodel.md section 6.2: ZeRO stage x recomputation x micro-batches, then memory prices; "
        "every device re-checked); `Megatron-style` is tensor parallelism on the lowest levels and data "
        "parallelism above at ZeRO-1 (`parplan.megatron_plan`); `bound` is the least memory per device, on "
        "average, that any plan keeps (section 6.2). Times are parplan's model's.",
        "",
    ]
    lines += md_table(
        table,
        {
            "model": str,
            "array": str,
            "batch": str,
            "free_step_s": ms,
            "free_peak_gib": gib,
            "fit_step_s": ms,
            "fit_peak_gib": gib,
            "setting": str,
            "megatron_step_s": ms,
            "megatron_peak_gib": gib,
            "bound_per_device_gib": gib,
            "fit_wall_s": ".1f",
        },
        headers={
            "free_step_s": "ignored (ms)",
            "free_peak_gib": "ignored (GiB)",
            "fit_step_s": "plan (ms)",
            "fit_peak_gib": "plan (GiB)",
            "megatron_step_s": "Megatron (ms)",
            "megatron_peak_gib": "Megatron (GiB)",
            "bound_per_device_gib": "bound (GiB)",
            "fit_wall_s": "planning (s)",
        },
    )
    faster = table[table.megatron_step_s.notna() & table.fit_step_s.notna()]
    if len(faster):
        ratio = faster.megatron_step_s / faster.fit_step_s.astype(float)
        lines += [
            "",
            f"parplan's fitting plan is {ratio.min():.2f}-{ratio.max():.2f}x faster than the "
            f"Megatron-style plan on the {len(faster)} cases that have one (both within memory).",
        ]
    over = table[~table.free_fits]
    lines += [
        "",
        f"With memory ignored, {len(over)} of {len(table)} recommended plans do not fit their devices.",
        "",
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``parplan bench memory`` has no options of its own."""


def main(argv: list[str] | None = None) -> int:
    return standalone_main(__doc__, NAME, run, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
