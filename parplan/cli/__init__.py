"""Command-line interface: ``parplan plan | evaluate | diff | compare | run | models | devices | solve |
certify | pipeline | allreduce | calibrate | bench`` (docs/cli.md).

User mistakes (unknown model, bad array, bad option) print one clear line on stderr and exit
with status 2; they never show a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

# Before numpy loads: parplan's numpy work is element-wise on small arrays, and OpenBLAS's thread
# pool alone cost about 0.1 s of CPU per command (the README's plan: 0.34 s -> 0.24 s). A user's
# own setting wins; torch, the MIP solvers and the executor do not read it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from parplan.cli.bench import add_bench_parser  # noqa: E402
from parplan.cli.calibrate import add_calibrate_parser
from parplan.cli.common import GB, GIB
from parplan.cli.exact import add_exact_parsers
from parplan.cli.export import add_export_parser
from parplan.cli.pipeline import add_collectives_parser, add_pipeline_parser
from parplan.cli.plans import add_plan_parsers
from parplan.cli.run import add_run_parser
from parplan.cli.sweep import add_sweep_parser
from parplan.errors import ParplanError, SolverError


def _cmd_models(args: argparse.Namespace) -> int:
    from parplan.models.zoo import list_models

    for name, desc in list_models():
        print(f"{name:<12} {desc}")
    print(
        "\nAlso: hf:<model type>[,key=value,...,seq=N] (Hugging Face, e.g. hf:gpt2), tv:<name> (torchvision, "
        "e.g. tv:resnet50), model files, .onnx files and file.py:factory (docs/formats.md, docs/importers.md)"
    )
    return 0


def _cmd_devices(args: argparse.Namespace) -> int:
    from parplan.costmodel.hardware import load_devices

    print(
        f"{'device':<8} {'TFLOP/s':>8} {'memory GiB':>10} {'HBM GB/s':>9} {'link GB/s':>9}  description"
    )
    for name, d in load_devices(args.devices).items():
        print(
            f"{name:<8} {d.flops_per_s / 1e12:>8.0f} {d.memory_bytes / GIB:>10.0f} "
            f"{d.memory_bytes_per_s / GB:>9.0f} {d.link_bytes_per_s / GB:>9.1f}  {d.description}"
        )
    return 0


class _Version(argparse.Action):
    """``--version``: the installed version, read only when asked (importlib.metadata is slow
    to import, and every command would pay for it)."""

    def __init__(
        self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None
    ):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        import parplan

        print(f"parplan {parplan.__version__}")
        parser.exit()


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; ``argv`` (when known) lets it skip importing what the command does not use."""
    parser = argparse.ArgumentParser(
        prog="parplan",
        description="Plan and certify tensor partitioning of DNN training on accelerator arrays.",
    )
    parser.add_argument("--version", action=_Version, help="show parplan's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    add_plan_parsers(sub)
    add_run_parser(sub)
    add_export_parser(sub)
    add_calibrate_parser(sub)

    m = sub.add_parser("models", help="list the built-in models")
    m.set_defaults(func=_cmd_models)

    d = sub.add_parser("devices", help="list the built-in device kinds")
    d.add_argument("--devices", default=None, metavar="FILE", help="extra device kinds (TOML)")
    d.set_defaults(func=_cmd_devices)

    add_exact_parsers(sub)
    add_pipeline_parser(sub)
    add_collectives_parser(sub)
    add_sweep_parser(sub)
    add_bench_parser(sub, with_options=argv is None or argv[:1] == ["bench"])
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        from parplan.costmodel.collector import planning_gc

        with planning_gc():
            return args.func(args)
    except SolverError as exc:  # not the input's fault: a solver crashed, was killed or is missing
        print(f"parplan: solver failure: {exc}", file=sys.stderr)
        return 3
    except ParplanError as exc:
        print(f"parplan: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("parplan: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output piped into e.g. `head`, which closed early: not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
