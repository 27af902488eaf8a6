"""Which side of the gap is slack? The joint optimum on small arrays.

For every CNN of the zoo whose joint model fits, on small arrays with fixed shares (half on a
homogeneous ``h100:8``, proportional on ``tpu-v2:2,tpu-v3:2``; the joint model grows as
``states ^ (scope x depth)``, docs/costmodel.md section 8): the ``accpar`` plan with the same
share rule, the joint model's plan and proven bound (symmetric: interchangeable siblings take
the same states; SCIP, started from the DP plan, 120 s), and the global bound over every plan
with shares anywhere in [0, 1] (:func:`parplan.solvers.bound.global_bound`).

``dp_over_joint`` = accpar / joint - 1 is what the top-down DP (the published recursion with the
share rule) loses to the best plan of its own kind, ``portfolio_over_joint`` the same for the
``accpar`` portfolio (its look-ahead criteria included) with the share rule; ``joint_over_bound``
= joint / global bound - 1 is what is left between that optimum and the bound: free shares,
asymmetric plans, or the bound's slack.

Also, for one scope of VGG-11 on ``h100:128`` at half shares, the model's cells per group by
depth next to what a model sharing cells between equal frames would need (``joint_size.csv``):
why the joint model stops at 8-16 devices.

Writes ``joint.csv``, ``joint_size.csv``, ``joint.png`` and ``joint.md``.
Run: ``parplan bench joint --out results/`` or ``python -m parplan.bench.joint OUT_DIR [--quick]``.
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
    geomean,
    grouped_bars,
    md_table,
    models_and_time_limit,
    out_dir_path,
    run_tasks,
    standalone_main,
    with_progress_header,
    write_outputs,
)

NAME = "joint"
MODELS = (
    "lenet",
    "lenet-c",
    "cifar-c",
    "alexnet",
    "vgg11",
    "vgg13",
    "vgg16",
    "vgg19",
    "vgg-c",
    "resnet-2block",
    "resnet18",
)
#: (array, share rule of both planners)
ARRAYS = (("h100:8", "half"), ("tpu-v2:2,tpu-v3:2", "proportional"))
BATCH = 512
TIME_LIMIT_S = 120.0
QUICK = {
    "models": ("lenet", "alexnet"),
    "arrays": (("h100:4", "half"), ("tpu-v2:1,tpu-v3:2", "proportional")),
    "batch": 64,
}
_COST = {"resnet18": 20, "resnet-2block": 4}
#: Where the joint model's size comes from: (model, array, node) whose scope is counted along
#: two paths (:func:`parplan.formulation.joint.frame_counts`).
SIZE = ("vgg11", "h100:128", "features.18")
QUICK_SIZE = ("lenet", "h100:8", "conv2")


def size_rows(model: str, array: str, node: str, batch: int) -> list[dict]:
    """Per depth along the leftmost and an alternating path: the cells the joint model builds for
    ``node``'s scope at one group, and what a model sharing cells between equal frames would
    need there (distinct frames x states; half shares)."""
    from parplan.costmodel.cost import ShareMode
    from parplan.bench.common import BENCH_FABRIC
    from parplan.costmodel.hardware import parse_array
    from parplan.costmodel.problem import Problem
    from parplan.costmodel.split import PlanOptions
    from parplan.formulation.joint import frame_counts
    from parplan.models.zoo import get_model

    p = Problem(get_model(model), parse_array(array, fabric=BENCH_FABRIC), batch=batch)
    u = [n.name for n in p.planning.nodes].index(node)
    depth = p.array.depth - 1  # the deepest groups that split
    left = frame_counts(p, PlanOptions(shares=ShareMode.HALF), "L" * depth, u)
    alternating = frame_counts(p, PlanOptions(shares=ShareMode.HALF), ("LR" * depth)[:depth], u)
    return [
        {
            "model": model,
            "array": array,
            "node": node,
            "depth": d,
            "devices_below": p.array.count >> d,
            "cells_built": built,
            "frames_leftmost": lo,
            "frames_alternating": alt,
        }
        for d, ((built, lo), (_, alt)) in enumerate(zip(left, alternating))
    ]


def joint_task(model: str, array: str, shares: str, batch: int, time_limit_s: float) -> dict:
    """The accpar plan, the joint optimum and the global bound for one model and array."""
    from parplan.costmodel.cost import ShareMode
    from parplan.costmodel.evaluate import evaluate
    from parplan.bench.common import BENCH_FABRIC
    from parplan.costmodel.hardware import parse_array
    from parplan.costmodel.problem import Problem
    from parplan.costmodel.split import PlanOptions
    from parplan.errors import ConfigError
    from parplan.models.zoo import get_model
    from parplan.solvers.bound import global_bound
    from parplan.solvers.joint import solve_joint
    from parplan.solvers.planners import make_plan
    from parplan.solvers.polish import polish

    p = Problem(get_model(model), parse_array(array, fabric=BENCH_FABRIC), batch=batch)
    options = PlanOptions(shares=ShareMode(shares))
    t0 = time.perf_counter()
    plan = make_plan(p, "accpar", options=options)
    accpar = evaluate(p, plan).step_time_s
    plan_wall = time.perf_counter() - t0
    t0 = time.perf_counter()
    polished = evaluate(p, polish(p, plan, options)[0]).step_time_s
    row = {
        "model": model,
        "array": array,
        "devices": p.array.count,
        "shares": shares,
        "batch": batch,
        "accpar_step_s": accpar,
        "accpar_wall_s": plan_wall,
        "polished_step_s": polished,
        "polish_wall_s": time.perf_counter() - t0,
    }
    t0 = time.perf_counter()
    portfolio = make_plan(p, "accpar", shares=shares)
    row.update(
        portfolio_step_s=evaluate(p, portfolio).step_time_s,
        portfolio_wall_s=time.perf_counter() - t0,
        portfolio_selected=portfolio.info["selected"],
    )
    t0 = time.perf_counter()
    try:
        r = solve_joint(p, "scip", options, time_limit_s=time_limit_s)
        c = r.certificate
        row.update(
            status=str(c.status),
            joint_step_s=c.objective,
            joint_bound_s=c.bound,
            model_size=c.model_size,
        )
    except ConfigError as exc:  # too large for the joint model
        row.update(
            status="too large",
            joint_step_s=None,
            joint_bound_s=None,
            model_size=str(exc).split(";")[0],
        )
    row["joint_wall_s"] = time.perf_counter() - t0
    row["global_bound_s"] = global_bound(p).bound_s
    joint = row["joint_step_s"]
    row["dp_over_joint"] = None if joint is None else accpar / joint - 1.0
    row["polished_over_joint"] = None if joint is None else polished / joint - 1.0
    row["portfolio_over_joint"] = None if joint is None else row["portfolio_step_s"] / joint - 1.0
    row["joint_over_bound"] = None if joint is None else joint / row["global_bound_s"] - 1.0
    row["dp_over_bound"] = accpar / row["global_bound_s"] - 1.0
    return row


def run(
    out_dir: str | Path,
    quick: bool = False,
    executor: ExecutorSpec | None = None,
    models: tuple[str, ...] | None = None,
    time_limit_s: float = TIME_LIMIT_S,
) -> pd.DataFrame:
    """Run the benchmark; write joint.csv / joint.png / joint.md. Columns: model, array, devices,
    shares, batch, accpar_step_s, accpar_wall_s, polished_step_s, polish_wall_s, portfolio_step_s,
    portfolio_wall_s, portfolio_selected, status, joint_step_s, joint_bound_s, model_size, joint_wall_s,
    global_bound_s, dp_over_joint, polished_over_joint, portfolio_over_joint, joint_over_bound, dp_over_bound."""
    models = tuple(models or (QUICK["models"] if quick else MODELS))
    arrays = QUICK["arrays"] if quick else ARRAYS
    batch = QUICK["batch"] if quick else BATCH
    out = out_dir_path(out_dir)
    tasks = [
        Task(
            f"{m} on {a}",
            joint_task,
            dict(model=m, array=a, shares=s, batch=batch, time_limit_s=time_limit_s),
            cost=_COST.get(m, 1),
        )
        for a, s in arrays
        for m in models
    ]
    with_progress_header(
        NAME, f"{len(models)} models x {len(arrays)} arrays, batch {batch}; {len(tasks)} tasks"
    )
    table = pd.DataFrame(run_tasks(NAME, tasks, executor))
    sizes = pd.DataFrame(size_rows(*(QUICK_SIZE if quick else SIZE), batch))
    sizes.to_csv(out / f"{NAME}_size.csv", index=False)
    write_outputs(
        out,
        NAME,
        table,
        lambda p: _plot(table, p),
        _markdown(table, time_limit_s) + _size_markdown(sizes),
    )
    return table


def _plot(table: pd.DataFrame, path: Path) -> None:
    panels = [
        (
            a,
            sub.assign(
                dp_pct=100 * sub.dp_over_joint.fillna(0),
                joint_pct=100 * sub.joint_over_bound.fillna(0),
            ),
        )
        for a, sub in table.groupby("array", sort=False)
    ]
    grouped_bars(
        path,
        panels,
        "model",
        {
            "accpar over the joint optimum": "dp_pct",
            "joint optimum over the global bound": "joint_pct",
        },
        "gap (%)",
    )


def _markdown(table: pd.DataFrame, time_limit_s: float) -> str:
    lines = [
        "# Which side of the gap is slack? The joint optimum on small arrays",
        "",
        f"Batch {table.batch.iloc[0]}. `accpar` is the top-down planner's plan with the array's share rule (the "
        "published recursion); `portfolio` the `accpar` portfolio's with the same rule (its look-ahead criteria "
        "included, docs/costmodel.md section 7); `joint` "
        "the joint model's plan (every split at once, interchangeable siblings sharing their states; SCIP from the "
        f"DP plan, {time_limit_s:g} s limit), with `status` its certificate; `global bound` the bound over every "
        "plan with any shares (docs/costmodel.md section 8). `accpar/joint` = what the DP loses to the best "
        "symmetric plan with the same share rule; `polished/joint` = the same after the multi-level polish "
        "(docs/costmodel.md section 7); `portfolio/joint` the same for the portfolio; `joint/bound` = "
        "what is left: free shares, asymmetric plans and "
        "the bound's own slack. `joint bound` is the solver's proven bound over symmetric plans with the share "
        "rule (0 when it stopped before its first LP).",
        "",
    ]
    fmt_ms = lambda v: "-" if pd.isna(v) else f"{v * 1e3:.4g}"  # noqa: E731
    fmt_pct = lambda v: "-" if pd.isna(v) else f"{v:.2%}"  # noqa: E731
    for array, sub in table.groupby("array", sort=False):
        lines += [f"## {array} ({sub.devices.iloc[0]} devices, shares {sub.shares.iloc[0]})", ""]
        lines += md_table(
            sub,
            {
                "model": str,
                "accpar_step_s": fmt_ms,
                "joint_step_s": fmt_ms,
                "status": str,
                "joint_bound_s": fmt_ms,
                "global_bound_s": fmt_ms,
                "dp_over_joint": fmt_pct,
                "polished_over_joint": fmt_pct,
                "portfolio_over_joint": fmt_pct,
                "joint_over_bound": fmt_pct,
                "joint_wall_s": ".1f",
            },
            headers={
                "accpar_step_s": "accpar (ms)",
                "joint_step_s": "joint (ms)",
                "joint_bound_s": "joint bound (ms)",
                "global_bound_s": "global bound (ms)",
                "dp_over_joint": "accpar/joint - 1",
                "polished_over_joint": "polished/joint - 1",
                "portfolio_over_joint": "portfolio/joint - 1",
                "joint_over_bound": "joint/bound - 1",
                "joint_wall_s": "joint (s)",
            },
        )
        solved = sub.dropna(subset=["joint_step_s"])
        proven = int((sub.status == "optimal").sum())
        if len(solved):
            lines += [
                "",
                f"Proven optimal on {proven} of {len(sub)}, a plan on {len(solved)}; geometric mean of accpar/joint "
                f"{geomean(1 + solved.dp_over_joint):.4f}, of joint/bound {geomean(1 + solved.joint_over_bound):.4f}; "
                f"accpar equals the joint model's plan on {int((solved.dp_over_joint.abs() <= 1e-9).sum())}, "
                f"after the multi-level polish on {int((solved.polished_over_joint.abs() <= 1e-9).sum())} "
                f"(at most {solved.polished_over_joint.max():.2%} above it), the portfolio on "
                f"{int((solved.portfolio_over_joint.abs() <= 1e-9).sum())} (at most "
                f"{solved.portfolio_over_joint.max():.2%} above it); where the solver stopped at its "
                "limit, the joint plan is its incumbent.",
                "",
            ]
        else:
            lines += [""]
    return "\n".join(lines)


def _size_markdown(sizes: pd.DataFrame) -> str:
    from parplan.formulation.joint import MAX_JOINT_CELLS

    first = sizes.iloc[0]
    lines = [
        f"## Why the joint model stops at 8-16 devices ({first['model']}, `{first['array']}`, half shares)",
        "",
        f"Cells per group for `{first['node']}`'s scope (the node and its consumers): `built` is what the joint "
        "model builds (its states at the group and at every group above it); `frames` is what a model would "
        "need that shares cells between the state combinations above that leave the scope the same frame up "
        "to translation (all its terms read), times the states at the group (`formulation.joint.frame_counts`), "
        "along the leftmost path "
        "(every region starts at the group's corner) and an alternating one (L, R, L, ...). The whole model "
        f"is capped at {MAX_JOINT_CELLS:,} cells, for every node and every group.",
        "",
    ]
    count = lambda v: f"{int(v):,}"  # noqa: E731
    lines += md_table(
        sizes,
        {
            "depth": count,
            "devices_below": count,
            "cells_built": count,
            "frames_leftmost": count,
            "frames_alternating": count,
        },
        headers={
            "devices_below": "devices below",
            "cells_built": "built",
            "frames_leftmost": "frames (leftmost)",
            "frames_alternating": "frames (alternating)",
        },
    )
    last = sizes.iloc[-1]
    lines += [
        "",
        f"At depth {last['depth']} ({last['devices_below']} devices below each group) one scope at one "
        f"group needs {int(last['frames_alternating']):,} cells even with every equal frame shared (the "
        f"built model: {int(last['cells_built']):,}). The growth is the cost model's: what a group holds "
        "and needs depends on "
        "every cut above it (docs/costmodel.md section 3), so frames multiply about 4-fold per level on "
        "mixed paths; with free shares (54 states per node at a grid of 16) far faster.",
        "",
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``parplan bench joint``."""
    models_and_time_limit(parser, MODELS, TIME_LIMIT_S, "time limit of each joint solve")


def main(argv: list[str] | None = None) -> int:
    return standalone_main(__doc__, NAME, run, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
