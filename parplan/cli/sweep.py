"""``parplan sweep``: plan every combination of models, arrays, batches, planners and link
overrides; one CSV row per case (:func:`parplan.bench.sweep.sweep`).

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="parplan")
    >>> add_sweep_parser(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["sweep", "--models", "lenet,alexnet", "--arrays", "h100:2", "--bandwidths", "10,50"])
    >>> _list(args.models), _numbers(args.bandwidths, float, "--bandwidths")
    (['lenet', 'alexnet'], [10.0, 50.0])
"""

from __future__ import annotations

import argparse
import sys

from parplan.cli.common import memory_limit, output_path
from parplan.errors import ConfigError


def _list(text: str | None) -> list[str] | None:
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def _arrays(text: str) -> list[str]:
    """Arrays: ';'-separated when any is mixed (``a100:8,h100:8;h100:16``), else ','-separated."""
    return (
        _list(text.replace(";", ","))
        if ";" not in text
        else [t.strip() for t in text.split(";") if t.strip()]
    )


def _numbers(text: str | None, kind, flag: str) -> list | None:
    if text is None:
        return None
    try:
        return [kind(t) for t in _list(text)]
    except ValueError:
        raise ConfigError(f"{flag} takes comma-separated numbers (got {text!r})") from None


def cmd_sweep(args: argparse.Namespace) -> int:
    from parplan.bench.common import ExecutorSpec
    from parplan.bench.sweep import sweep

    out = output_path(args.out, "--out") if args.out else None
    limit = memory_limit(args.memory_limit)
    table = sweep(
        _list(args.models),
        _arrays(args.arrays),
        planners=_list(args.planners),
        batches=_numbers(args.batches, int, "--batches"),
        bandwidths=_numbers(args.bandwidths, float, "--bandwidths"),
        latencies=_numbers(args.latencies, float, "--latencies"),
        fabric=args.fabric,
        memory_limit_gib=None if limit in (None, "device") else limit / 2**30,
        ignore_memory=args.ignore_memory,
        overlap=args.overlap == "yes",
        executor=ExecutorSpec(
            args.executor,
            *([args.workers] if args.workers is not None else []),
            scheduler=args.scheduler,
        ),
    )
    if out:
        table.to_csv(out, index=False)
        print(f"wrote {out} ({len(table)} cases)", file=sys.stderr)
    else:
        print(table.to_csv(index=False), end="")
    failed = table[table.error.notna()]
    if len(failed):
        print(
            f"parplan: {len(failed)} of {len(table)} cases failed; their rows say why (column 'error')",
            file=sys.stderr,
        )
    return 0


def add_sweep_parser(sub) -> None:
    # the executor's choices are checked by ExecutorSpec: importing parplan.bench here would load
    # pandas for every command's --help
    p = sub.add_parser(
        "sweep",
        help="plan every combination of models, arrays, batches, planners and link "
        "overrides; one CSV row per case",
    )
    p.add_argument(
        "--models", required=True, help="comma-separated models (zoo names, files, hf:/tv: specs)"
    )
    p.add_argument(
        "--arrays",
        required=True,
        help="arrays separated by ';' or ',' between specs of one kind "
        "(h100:2,h100:8); mixed arrays by ';' (a100:8,h100:8;h100:16)",
    )
    p.add_argument("--planners", default="accpar", help="comma-separated planners (default accpar)")
    p.add_argument("--batches", default="512", help="comma-separated global batches (default 512)")
    p.add_argument(
        "--bandwidths",
        default=None,
        metavar="GB/s,...",
        help="link bandwidths to sweep (default: the arrays' own)",
    )
    p.add_argument(
        "--latencies",
        default=None,
        metavar="us,...",
        help="link latencies to sweep (default: the arrays' own)",
    )
    p.add_argument("--fabric", default="devices", choices=("devices", "papers"))
    p.add_argument("--overlap", default="yes", choices=("yes", "no"))
    p.add_argument(
        "--memory-limit",
        default=None,
        metavar="GiB",
        help="plan against this many GiB per device (default: each device's own memory)",
    )
    p.add_argument("--ignore-memory", action="store_true", help="plan without memory limits")
    p.add_argument(
        "--out", default=None, metavar="CSV", help="write the table here (default: stdout)"
    )
    p.add_argument(
        "--executor", default="local", help="local (a process pool, default), dask or serial"
    )
    p.add_argument(
        "--workers", type=int, default=None, help="local pool / LocalCluster workers (default 2)"
    )
    p.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDR",
        help="Dask scheduler address (with --executor dask)",
    )
    p.set_defaults(func=cmd_sweep)
