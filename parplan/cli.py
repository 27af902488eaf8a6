"""Command-line interface: ``parplan plan | models | devices | solve | certify | pipeline | allreduce | bench``.

User mistakes (unknown model, bad array, bad option) print one clear line on stderr and exit
with status 2; they never show a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time

from parplan.errors import ParplanError

GB = 1e9
GIB = 2**30


def add_problem_arguments(parser: argparse.ArgumentParser, model_required: bool = True) -> None:
    """--model, --array, --batch, --bandwidth, --latency, --bytes-per-element, --devices."""
    parser.add_argument("--model", required=model_required,
                        help="zoo name (see 'parplan models'), a model file (.toml/.json/.csv), an .onnx file, "
                             "or file.py:factory returning a Graph or (nn.Module, input shape)")
    parser.add_argument("--array", required=True,
                        help="accelerator array, e.g. 'h100:8' or 'tpu-v2:4,tpu-v3:4' or a tree file")
    parser.add_argument("--batch", type=int, default=512, help="global batch size (default 512)")
    parser.add_argument("--bandwidth", type=float, default=None, metavar="GB/s",
                        help="override every link's per-direction bandwidth (GB/s; default: device data)")
    parser.add_argument("--latency", type=float, default=None, metavar="us",
                        help="override every link's latency (microseconds)")
    parser.add_argument("--bytes-per-element", type=float, default=2.0,
                        help="bytes per tensor element (default 2, bf16)")
    parser.add_argument("--devices", default=None, metavar="FILE",
                        help="extra device kinds (TOML, same shape as the built-in devices.toml)")
    parser.add_argument("--optimizer-bytes", type=float, default=12.0, metavar="B",
                        help="optimizer state per parameter in bytes (default 12: Adam with an fp32 master copy)")
    parser.add_argument("--share-grid", type=int, default=16, metavar="G",
                        help="free shares are multiples of 1/G, plus the proportional share (default 16)")


def problem_from_args(args: argparse.Namespace):
    """Build a :class:`parplan.costmodel.problem.Problem` from :func:`add_problem_arguments` args."""
    from parplan.costmodel.hardware import load_devices, parse_array
    from parplan.costmodel.problem import Problem
    from parplan.modelfile import load_model

    graph = load_model(args.model)
    array = parse_array(
        args.array,
        bandwidth_bytes_per_s=None if args.bandwidth is None else args.bandwidth * GB,
        latency_s=None if args.latency is None else args.latency * 1e-6,
        devices=load_devices(args.devices),
    )
    return Problem(graph, array, batch=args.batch, bytes_per_element=args.bytes_per_element,
                   optimizer_bytes_per_param=args.optimizer_bytes)


def _progress(enabled: bool):
    if not enabled:
        return None
    return lambda msg: print(f"[parplan] {msg}", file=sys.stderr, flush=True)


def _cmd_plan(args: argparse.Namespace) -> int:
    from parplan.costmodel.evaluate import evaluate
    from parplan.report import plan_report
    from parplan.solvers.planners import make_plan

    problem = problem_from_args(args)
    start = time.perf_counter()
    plan = make_plan(problem, args.planner, objective=args.objective, shares=args.shares,
                     share_grid=args.share_grid, progress=_progress(args.verbose))
    wall = time.perf_counter() - start
    ev = evaluate(problem, plan)
    baseline = evaluate(problem, make_plan(problem, "data"))
    report = plan_report(problem, plan, ev, baseline, wall_s=wall)
    if args.format == "json":
        print(json.dumps(report.to_dict(), indent=2))
    elif args.format == "csv":
        print(report.layer_frame().to_csv(index=False), end="")
    else:
        print(report.text())
    if getattr(args, "plot", None):
        from parplan.plot import plot_plan

        plot_plan(report, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from parplan.zoo import list_models

    for name, desc in list_models():
        print(f"{name:<12} {desc}")
    return 0


def _cmd_devices(args: argparse.Namespace) -> int:
    from parplan.costmodel.hardware import load_devices

    print(f"{'device':<8} {'TFLOP/s':>8} {'memory GiB':>10} {'HBM GB/s':>9} {'link GB/s':>9}  description")
    for name, d in load_devices(args.devices).items():
        print(f"{name:<8} {d.flops_per_s / 1e12:>8.0f} {d.memory_bytes / GIB:>10.0f} "
              f"{d.memory_bytes_per_s / GB:>9.0f} {d.link_bytes_per_s / GB:>9.1f}  {d.description}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from parplan.solvers.planners import PLANNERS

    parser = argparse.ArgumentParser(
        prog="parplan",
        description="Plan and certify tensor partitioning of DNN training on accelerator arrays.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("plan", help="plan a model on an array with a planner (fast DP path)")
    add_problem_arguments(p)
    p.add_argument("--planner", default="accpar", help=f"one of: {', '.join(PLANNERS)} (default accpar)")
    p.add_argument("--objective", default=None, help="time | communication (default: the planner's)")
    p.add_argument("--shares", default=None, help="free | half | proportional (default: the planner's)")
    p.add_argument("--format", default="table", choices=("table", "json", "csv"))
    p.add_argument("--plot", default=None, metavar="PNG", help="also draw the plan to this PNG file")
    p.add_argument("-v", "--verbose", action="store_true", help="progress messages on stderr")
    p.set_defaults(func=_cmd_plan)

    m = sub.add_parser("models", help="list the built-in models")
    m.set_defaults(func=_cmd_models)

    d = sub.add_parser("devices", help="list the built-in device kinds")
    d.add_argument("--devices", default=None, metavar="FILE", help="extra device kinds (TOML)")
    d.set_defaults(func=_cmd_devices)

    # Subcommands owned by other modules register themselves here.
    for module, fn in (
        ("parplan.cli_exact", "add_exact_parsers"),
        ("parplan.cli_pipeline", "add_pipeline_parser"),
        ("parplan.cli_pipeline", "add_collectives_parser"),
        ("parplan.cli_bench", "add_bench_parser"),
    ):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        getattr(mod, fn)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ParplanError as exc:
        print(f"parplan: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("parplan: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
