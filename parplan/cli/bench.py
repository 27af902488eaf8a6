"""``parplan bench NAME``: run one of the repository's benchmarks (CSV, PNG and markdown).

``parplan bench NAME [--out DIR] [--quick] [--executor local|dask|serial] [--scheduler ADDR]
[--workers N] [benchmark options]``; ``parplan bench NAME --help`` lists a benchmark's own
options (e.g. ``--bandwidth GB/s`` for accpar). The benchmarks are the modules of
:mod:`parplan.bench`, installed with the package (``parplan.bench.BENCHMARKS`` lists them);
their recorded results live in ``benchmarks/results/`` of the repository.

The markdown summary is printed on stdout, progress (one line per finished task) on stderr.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="parplan")
    >>> add_bench_parser(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["bench", "accpar", "--quick", "--bandwidth", "10"])
    >>> args.bench, args.quick, args.bandwidth_gbps, args.executor
    ('accpar', True, 10.0, 'local')
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType

from parplan.errors import ConfigError

#: Benchmark name -> one-line description; the module list is in parplan.bench.BENCHMARKS.
BENCH_HELP = {
    "accpar": "AccPar's table: OWT / HyPar / AccPar / exact speedup over data parallelism on TPU-v2 + TPU-v3",
    "hypar": "HyPar's table: HyPar vs data and model parallelism on 16 devices, plans per level",
    "dp-vs-exact": "DP vs every exact backend for every zoo model and depths 1..8",
    "scaling": "planner wall time vs layers and depth; where exact backends stop certifying",
    "ablations": "AccPar with one feature removed at a time",
    "allreduce": "all-reduce algorithms per topology and size (MultiTree)",
    "speed": "planner CPU time: issue 35's goals (whole processes) and the published AccPar C++ (ratios)",
    "pipeline": "PipeDream's released optimizer vs parplan's pipeline plans, each priced by both models",
    "bound": "the global lower bound over the whole hierarchy and the accpar plans' gap to it (zoo CNNs)",
    "joint": "the joint optimum on small arrays: what accpar loses to it, what is left to the global bound",
    "continuous": "grid 16, grid 64 and the proven continuous-share optimum on one split (zoo CNNs)",
    "memory": "plans that fit each device's memory (parplan plan's default) vs memory ignored vs Megatron-style",
    "calibration": "a calibrated GPU (parplan calibrate) against measured whole training steps",
    "stages": "pipeline x partition x data (plan --pipeline) vs partition-only and data-parallel-stage plans",
    "validate": "predicted against published, measured training throughput (Megatron / FSDP runs, cited)",
}


def import_benchmarks() -> ModuleType:
    """The :mod:`parplan.bench` package (imported on use: it pulls in pandas and matplotlib)."""
    return importlib.import_module("parplan.bench")


def _module(name: str) -> ModuleType:
    pkg = import_benchmarks()
    if name not in pkg.BENCHMARKS:
        raise ConfigError(f"unknown benchmark '{name}'; valid: {', '.join(pkg.BENCHMARKS)}")
    return importlib.import_module(pkg.BENCHMARKS[name])


def add_bench_parser(subparsers, with_options: bool = True) -> None:
    """Register ``parplan bench NAME ...`` on the CLI's subparsers.

    ``with_options=False`` skips each benchmark's own options (importing the benchmarks takes
    about a second); the CLI passes it unless the command is ``bench``.
    """
    bench = subparsers.add_parser(
        "bench",
        help="run a benchmark: CSV, PNG and markdown into --out",
        description="Run a benchmark; writes NAME.csv, NAME.png and NAME.md into --out.",
    )
    sub = bench.add_subparsers(dest="bench", required=True, metavar="NAME")
    for name, text in BENCH_HELP.items():
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument(
            "--out", default="results", metavar="DIR", help="output folder (default results/)"
        )
        p.add_argument("--quick", action="store_true", help="tiny inputs (seconds), same columns")
        p.add_argument(
            "--executor",
            default="local",
            choices=("local", "dask", "serial"),
            help="local process pool (default), Dask, or serial in this process",
        )
        p.add_argument(
            "--scheduler",
            default=None,
            metavar="ADDR",
            help="Dask scheduler address (implies --executor dask; default: a LocalCluster)",
        )
        p.add_argument(
            "--workers",
            type=int,
            default=2,
            metavar="N",
            help="local pool / LocalCluster worker processes (default 2)",
        )
        try:
            module = _module(name) if with_options else None
        except (ConfigError, ModuleNotFoundError):
            module = None  # reported when the benchmark is run
        if module is not None and hasattr(module, "add_arguments"):
            module.add_arguments(p)
        p.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    module = _module(args.bench)
    from parplan.bench.common import executor_from_args, run_kwargs

    if args.workers < 1:
        raise ConfigError(f"--workers must be >= 1 (got {args.workers})")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out '{out}' is a file; give a folder (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"--out '{out}': cannot create the folder ({exc.strerror or exc})"
        ) from None
    if hasattr(module, "add_arguments"):
        executor = executor_from_args(args.executor, args.workers, args.scheduler)
        module.run(out, quick=args.quick, executor=executor, **run_kwargs(module.run, args))
    else:
        if args.executor != "local" or args.scheduler is not None:
            print(
                f"[bench {args.bench}] runs in this process (no task pool); --executor ignored",
                file=sys.stderr,
            )
        module.run(out, quick=args.quick)
    name = (
        module.output_name(**run_kwargs(module.run, args))  # named by its options (bound_cli)
        if hasattr(module, "output_name")
        else getattr(module, "NAME", args.bench)
    )
    md = out / f"{name}.md"
    if md.is_file():
        print(md.read_text())
    print(f"[bench {args.bench}] wrote {out / name}.csv, .png, .md", file=sys.stderr)
    return 0


__all__ = ["BENCH_HELP", "add_bench_parser", "import_benchmarks"]
