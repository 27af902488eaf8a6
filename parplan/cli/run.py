"""``parplan run``: execute a plan with torch.distributed and check it against the cost model
(docs/executor.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

from parplan.cli.common import PLANNER_NAMES, output_path, problem_from_args
from parplan.errors import ConfigError

#: Default global batch of ``run``: small, since the reference executor computes in float64 on CPUs.
RUN_BATCH = 8


def _problem_and_plan(args: argparse.Namespace):
    from parplan.solvers.planners import make_plan

    if args.plan:
        from parplan.cli.plans import _problem_for
        from parplan.costmodel.planio import check_plan_fits, read_plan_file

        saved = read_plan_file(args.plan)
        record = dict(saved.problem)
        if args.batch is None:
            args.batch = record.get("batch", RUN_BATCH)
        problem = _problem_for(args, record)
        if problem.compat is not None:
            print(
                f"parplan: note: the plan was priced with --compat {problem.compat}; run compares with parplan's "
                "own model",
                file=sys.stderr,
            )
            problem = replace(problem, compat=None)
        if saved.pipeline is not None:  # stages on groups (docs/executor.md "Pipeline plans")
            from parplan.cli.plans import _pipeline_for

            return (
                problem,
                _pipeline_for(saved, problem, f"plan file '{args.plan}'"),
                f"pipeline plan file {args.plan}",
            )
        check_plan_fits(problem, saved.nodes, saved.plan, f"plan file '{args.plan}'")
        return problem, saved.plan, f"plan file {args.plan}"
    if not args.model or not args.array:
        raise ConfigError(
            "run: give --model and --array (and optionally --planner), or --plan FILE"
        )
    if args.batch is None:
        args.batch = RUN_BATCH
    problem = problem_from_args(args)  # element and optimizer sizes: the precision's unless given
    plan = make_plan(problem, args.planner, share_grid=args.share_grid)
    return problem, plan, f"planner {args.planner}"


def _per_node(report, bpe: float):
    """Bytes per (node, phase): model and measured, summed over splits and sides."""
    b = report.bytes
    g = (
        b.groupby(["node", "phase"], sort=False)[["model_elements", "measured_elements"]]
        .sum()
        .reset_index()
    )
    g["model_bytes"] = g.model_elements * bpe
    g["measured_bytes"] = g.measured_elements * bpe
    return g


#: ``run``'s default learning rate times the batch: the executor's loss is a sum over the batch's
#: samples, so a fixed rate diverges as the batch grows (0.01 at batch 8; resnet-2block at batch
#: 64 reached inf in 5 steps with 0.01).
DEFAULT_LR_PER_SAMPLE = 0.08


def _run_head(problem, source: str, runtime: str, steps: int) -> dict:
    """The first fields of ``run --format json``'s record."""
    return {
        "model": problem.graph.name,
        "array": problem.array.describe(),
        "batch": problem.batch,
        "source": source,
        "runtime": runtime,
        "steps": steps,
    }


def cmd_run_torch(args: argparse.Namespace, problem, plan, source: str) -> int:
    """``run --runtime torch``: the plan through torch's own DTensor (docs/interop.md)."""
    from parplan.executor.export import nearest_plan
    from parplan.executor.launch import RTOL, resolve_backend, run_torch

    if args.nearest:
        plan, source = nearest_plan(problem, plan), f"{source} (nearest plan torch can express)"
    args.backend = resolve_backend(args.backend)
    print(
        f"[parplan] running {args.steps} step(s) of {source} with torch's DTensor ({args.backend})...",
        file=sys.stderr,
        flush=True,
    )
    lr = args.lr if args.lr is not None else DEFAULT_LR_PER_SAMPLE / problem.batch
    start = time.perf_counter()
    report = run_torch(problem, plan, steps=args.steps, seed=args.seed, lr=lr, backend=args.backend)
    wall = time.perf_counter() - start
    if args.format == "json":
        print(
            json.dumps(
                {
                    **_run_head(problem, source, "torch", args.steps),
                    "lr": lr,
                    "numerics_equal": report.numerics_equal,
                    "losses": report.losses,
                    "reference_losses": report.reference_losses,
                    "loss_rel_error": report.loss_rel_error,
                    "max_grad_rel_error": report.max_grad_rel_error,
                    "collectives": report.collectives,
                    "payload_elements": report.payload_elements,
                    "model_elements": report.model_elements,
                    "mesh_shape": list(report.export.mesh_shape),
                    "wall_s": wall,
                },
                indent=2,
            )
        )
        return 0 if report.numerics_equal else 1
    pipeline = plan.__class__.__name__ == "PipelinePlan"
    how = "torch.distributed.pipelining + DTensor" if pipeline else "torch DTensor"
    print(
        f"model {problem.graph.name}  array {problem.array.describe()}  batch {problem.batch}  {source}  "
        f"{args.steps} step(s) in {wall:.1f} s, {how} on a {'x'.join(map(str, report.export.mesh_shape))} "
        "mesh"
    )
    print(
        f"loss (last step)     {report.losses[-1]:.12g}   single process: {report.reference_losses[-1]:.12g}"
    )
    verdict = "equal" if report.numerics_equal else "DIFFERENT"
    print(
        f"numerics             {verdict}: loss relative error {report.loss_rel_error:.1e}, weight gradients "
        f"{report.max_grad_rel_error:.1e} (tolerance {RTOL:g})"
    )
    if pipeline:
        print(
            f"schedule             {plan.schedule} over {len(plan.stages)} stages ('pp' mesh dimension), "
            f"{problem.micro_batches} micro-batch(es); collectives not counted (the stages' sends are "
            "point-to-point; `parplan run` without --runtime torch checks every element)"
        )
        return 0 if report.numerics_equal else 1
    ran = ", ".join(f"{n} {op}" for op, n in sorted(report.collectives.items())) or "none"
    print(f"collectives          {ran} (last step, one process's view; torch chose them)")
    payload = sum(report.payload_elements.values())
    print(
        f"elements moved       torch: {payload:,.0f} handed to its collectives over all processes; parplan's model: "
        f"{report.model_elements:,.0f} received over all devices (equal for data parallelism on 2 devices; "
        "otherwise torch's collectives are not the model's re-layouts, see docs/interop.md)"
    )
    return 0 if report.numerics_equal else 1


def cmd_run_script(args: argparse.Namespace, problem, plan, source: str) -> int:
    """``run --runtime script``: the plan's training script (``export --out train.py``) under
    torchrun with ``--check`` (docs/interop.md "A training script")."""
    from parplan.executor.export import nearest_plan
    from parplan.executor.script import run_script, training_script
    from parplan.models.importers.external import is_module_spec

    from parplan.cli.common import model_spec
    from parplan.costmodel.planio import read_plan_file

    spec = model_spec(args, read_plan_file(args.plan) if args.plan and args.model is None else None)
    if spec is None or not is_module_spec(spec):
        raise ConfigError(
            f"run --runtime script: model '{spec}' is not a PyTorch module (file.py:factory, hf:, tv:); "
            "--runtime torch runs any model through DTensor"
        )
    if args.nearest:
        plan, source = nearest_plan(problem, plan), f"{source} (nearest plan torch can express)"
    text = training_script(problem, plan, spec)
    n = problem.array.count
    print(
        f"[parplan] running {args.steps} step(s) of {source} as a training script under torchrun, "
        f"{n} processes...",
        file=sys.stderr,
        flush=True,
    )
    start = time.perf_counter()
    done = run_script(text, n, args.steps)
    wall = time.perf_counter() - start
    steps = [x for x in done.output.splitlines() if x.startswith("step ")]
    if args.format == "json":
        print(
            json.dumps(
                {
                    **_run_head(problem, source, "script", args.steps),
                    "numerics_equal": done.equal,
                    "check": done.check,
                    "losses": [float(x.rsplit(" ", 1)[1]) for x in steps],
                    "returncode": done.returncode,
                    "wall_s": wall,
                },
                indent=2,
            )
        )
        return 0 if done.equal else 1
    print(
        f"model {problem.graph.name}  array {problem.array.describe()}  batch {problem.batch}  {source}  "
        f"{args.steps} step(s) in {wall:.1f} s: torch's parallelize_module / fully_shard / "
        "checkpoint_wrapper under torchrun"
    )
    if done.check:
        print(done.check)
        for line in steps:
            print(line)
    if done.returncode != 0:
        print(f"the script exited with {done.returncode}; its last output:\n{done.output[-2000:]}")
    return 0 if done.equal else 1


def cmd_run(args: argparse.Namespace) -> int:
    from parplan.executor.launch import RTOL, run_plan
    from parplan.executor.schedule import graph_frames
    from parplan.reporting.report import format_bytes, format_time

    csv_path = output_path(args.csv, "--csv") if args.csv else None
    problem, plan, source = _problem_and_plan(args)
    pipeline = plan.__class__.__name__ == "PipelinePlan"
    if args.runtime in ("torch", "script"):
        if pipeline and args.nearest:
            raise ConfigError("run: --nearest does not apply to a pipeline plan")
        if pipeline and args.runtime == "script":
            raise ConfigError(
                "run --runtime script: training scripts cover partition plans; --runtime torch runs "
                "pipeline plans through torch.distributed.pipelining"
            )
        if args.runtime == "script":
            return cmd_run_script(args, problem, plan, source)
        return cmd_run_torch(args, problem, plan, source)
    if args.nearest:
        raise ConfigError("run: --nearest goes with --runtime torch or script")
    n = problem.array.count
    from parplan.executor.launch import check_runnable, resolve_backend

    graph_frames(problem)  # unsupported layers first, then size, before any process starts
    check_runnable(problem)
    args.backend = resolve_backend(args.backend)
    print(
        f"[parplan] running {args.steps} step(s) of {source} on {n} processes ({args.backend})...",
        file=sys.stderr,
        flush=True,
    )
    start = time.perf_counter()
    lr = args.lr if args.lr is not None else DEFAULT_LR_PER_SAMPLE / problem.batch
    if pipeline:
        from parplan.executor.launch import run_pipeline

        report = run_pipeline(
            problem, plan, steps=args.steps, seed=args.seed, lr=lr, backend=args.backend
        )
    else:
        report = run_plan(
            problem, plan, steps=args.steps, seed=args.seed, lr=lr, backend=args.backend
        )
    wall = time.perf_counter() - start
    bpe = problem.bytes_per_element
    meta = {
        "model": problem.graph.name,
        "array": problem.array.describe(),
        "devices": n,
        "batch": problem.batch,
        "source": source,
        "steps": args.steps,
    }
    if csv_path:
        report.bytes.assign(**meta).to_csv(csv_path, index=False)
        print(f"wrote {csv_path}", file=sys.stderr)
    ok = report.diverged_at is None and report.numerics_equal and report.bytes_equal
    if args.format == "csv":
        report.bytes.assign(**meta).to_csv(sys.stdout, index=False)
        return 0 if ok else 1
    if args.format == "json":
        out = {
            **meta,
            "lr": lr,
            "diverged_at_step": report.diverged_at,
            "numerics_equal": report.numerics_equal,
            "bytes_equal": report.bytes_equal,
            "losses": report.losses,
            "reference_losses": report.reference_losses,
            "loss_rel_error": report.loss_rel_error,
            "max_grad_rel_error": report.max_grad_rel_error,
            "inexact_shares": list(report.inexact_shares),
            "executed_shares": {k: list(v) for k, v in report.executed_shares.items()},
            "bytes": report.bytes.to_dict(orient="records"),
            "timing": report.timing.to_dict(orient="records"),
            "wall_s": wall,
        }
        print(json.dumps(out, indent=2))
        return 0 if ok else 1
    print(
        f"model {meta['model']}  array {meta['array']}  batch {problem.batch}  {source}  "
        f"{args.steps} step(s) in {wall:.1f} s"
    )
    if pipeline:
        order = problem.graph.analyze().order
        for k, st in enumerate(plan.stages):
            print(
                f"stage {k}: {order[st.first]} .. {order[st.last]} on {st.group or 'root'} "
                f"({problem.array.at(st.group).describe()})"
            )
        print(
            f"schedule {plan.schedule}, {problem.micro_batches} micro-batch(es); each cut's tensor "
            "crosses once each way per micro-batch and moves inside the groups as priced "
            "(docs/costmodel.md section 11)"
        )
    planned = (
        {
            f"stage {k}/{p}": sp
            for k, st in enumerate(plan.stages)
            for p, sp in st.plan.splits.items()
        }
        if pipeline
        else plan.splits
    )
    rounded = sum(
        1
        for p, s in report.executed_shares.items()
        for a, b in zip(planned[p].shares, s)
        if abs(a - b) > 1e-12
    )
    if rounded:
        print(
            f"shares rounded to whole rows/columns: {rounded} of "
            f"{sum(len(s) for s in report.executed_shares.values())}; the model is priced at the executed ones"
        )
    print(
        f"loss (last step)     {report.losses[-1]:.12g}   single process: {report.reference_losses[-1]:.12g}"
    )
    if report.diverged_at is not None:
        print(
            f"numerics             not compared: the training diverged (the single process's loss is "
            f"{report.reference_losses[report.diverged_at - 1]} at step {report.diverged_at} with --lr {lr:g}; "
            f"the loss sums over the batch, so try --lr {lr / 10:g})"
        )
    else:
        verdict = "equal" if report.numerics_equal else "DIFFERENT"
        print(
            f"numerics             {verdict}: loss relative error {report.loss_rel_error:.1e}, weight gradients "
            f"{report.max_grad_rel_error:.1e} (tolerance {RTOL:g})"
        )
    rows = _per_node(report, bpe)
    timing = report.timing.set_index("node")
    print()
    width = max([16, *(len(n) for n in rows.node)])
    print(
        f"{'node':<{width}} {'phase':<15} {'model':>11} {'measured':>11}  {'model compute':>13} {'measured':>12}"
    )
    for r in rows.itertuples():
        # a pipeline's cut tensor has no compute row of its own (its moves are listed)
        t = timing.loc[r.node] if r.node in timing.index else None
        same = (
            ""
            if abs(r.model_elements - r.measured_elements) <= 1e-6 * max(1.0, r.model_elements)
            else "  <- differs"
        )
        first = r.phase == "intra" and t is not None
        print(
            f"{r.node:<{width}} {r.phase:<15} {format_bytes(r.model_bytes):>11} {format_bytes(r.measured_bytes):>11}  "
            f"{format_time(t.model_s) if first else '':>13} {format_time(t.measured_s) if first else '':>12}{same}"
        )
    total_m, total_x = rows.model_bytes.sum(), rows.measured_bytes.sum()
    print(f"{'total':<{width}} {'':<15} {format_bytes(total_m):>11} {format_bytes(total_x):>11}")
    print()
    if report.bytes.empty:
        print("bytes                one device: nothing moves")
    elif report.bytes_equal:
        print(
            f"bytes                equal at every split, node, side and phase ({len(report.bytes)} figures; "
            f"elements x {bpe:g} bytes)"
        )
    else:
        print("bytes                DIFFERENT from the cost model at:")
        print(report.differences().to_string(index=False))
    where = (
        "on CPUs shown for reference only"
        if args.backend == "gloo"
        else "GPU float64, for reference"
    )
    print(
        "times                model: the slowest device's compute; measured: the slowest process's own "
        f"products and element-wise ops (float64; CPU time of its process; fastest step); {where}"
    )
    return 0 if ok else 1


def add_run_parser(sub) -> None:
    r = sub.add_parser(
        "run", help="run a plan with torch.distributed; check numerics and bytes against the model"
    )
    r.add_argument(
        "--model", default=None, help="model (zoo name, model file, ...); default: the plan file's"
    )
    r.add_argument(
        "--array",
        default=None,
        help="array, one process per device, e.g. cpu:4 (default: the plan file's)",
    )
    r.add_argument(
        "--plan", default=None, metavar="JSON", help="a saved plan (parplan plan --save)"
    )
    r.add_argument(
        "--planner", default="accpar", help=f"without --plan: one of {', '.join(PLANNER_NAMES)}"
    )
    r.add_argument(
        "--batch", type=int, default=None, help=f"global batch (default {RUN_BATCH}, or the plan's)"
    )
    r.add_argument(
        "--steps", type=int, default=1, help="training steps (SGD between them; default 1)"
    )
    r.add_argument(
        "--lr",
        type=float,
        default=None,
        help=f"SGD learning rate between steps (default {DEFAULT_LR_PER_SAMPLE:g} / batch: the loss sums "
        "over the batch)",
    )
    r.add_argument(
        "--seed", type=int, default=0, help="seed of weights, input and target (default 0)"
    )
    r.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "gloo", "nccl"),
        help="torch.distributed backend: nccl (one GPU per process) when GPUs are present, else gloo",
    )
    r.add_argument("--format", default="table", choices=("table", "json", "csv"))
    r.add_argument(
        "--csv", default=None, metavar="FILE", help="also write the byte comparison as CSV"
    )
    r.add_argument("--bandwidth", type=float, default=None, metavar="GB/s", help=argparse.SUPPRESS)
    r.add_argument("--latency", type=float, default=None, metavar="us", help=argparse.SUPPRESS)
    r.add_argument(
        "--bytes-per-element", type=float, default=None, help="bytes per element priced (default 2)"
    )
    r.add_argument("--optimizer-bytes", type=float, default=None, help=argparse.SUPPRESS)
    r.add_argument("--devices", default=None, metavar="FILE", help="extra device kinds (TOML)")
    r.add_argument(
        "--share-grid",
        type=int,
        default=16,
        metavar="G",
        help="share grid of the planner (default 16)",
    )
    r.add_argument(
        "--runtime",
        default="reference",
        choices=("reference", "torch", "script"),
        help="reference: parplan's executor (bytes checked against the model); torch: the plan as DTensor "
        "placements, run by torch; script: a PyTorch model's training script (parallelize_module, "
        "fully_shard) under torchrun (docs/interop.md)",
    )
    r.add_argument(
        "--nearest",
        action="store_true",
        help="with --runtime torch or script: run the nearest plan torch can express (parplan export --nearest)",
    )
    r.set_defaults(func=cmd_run, compat=None)


__all__ = ["add_run_parser", "cmd_run"]
