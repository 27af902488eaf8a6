"""CLI subcommands ``parplan pipeline`` (PipeDream planner) and ``parplan allreduce`` (collectives).

The main CLI (:mod:`parplan.cli`) registers them through :func:`add_pipeline_parser` and
:func:`add_collectives_parser`; each subcommand's ``func(args) -> int`` prints its result and
raises :class:`~parplan.errors.ParplanError` for user mistakes.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="parplan")
    >>> sub = parser.add_subparsers()
    >>> _ = add_pipeline_parser(sub), add_collectives_parser(sub)
    >>> args = parser.parse_args(["allreduce", "--topology", "torus", "--dims", "4x4", "--bytes", "64MB"])
    >>> args.bytes_, args.func(args)  # doctest: +ELLIPSIS
    all-reduce of 64 MiB on torus4x4 (16 hosts, 4 port(s), links 25 GB/s)
    ...
    (67108864, 0)
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time

from parplan.errors import ConfigError

GIB = 2**30
#: Largest size an all-reduce may move (1 EiB): beyond any real buffer, and far from float overflow.
MAX_BYTES = 2**60
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 2**10,
    "kib": 2**10,
    "k": 2**10,
    "mb": 2**20,
    "mib": 2**20,
    "m": 2**20,
    "gb": 2**30,
    "gib": 2**30,
    "g": 2**30,
}


def parse_bytes(text: str) -> int:
    """``"64MB"`` -> 67108864. KB, MB, GB are powers of 1024 (as KiB, MiB, GiB).

    Example:
        >>> parse_bytes("32KB"), parse_bytes("1e6")
        (32768, 1000000)
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(
            f"size '{text}': expected a number of bytes with an optional unit KB, MB or GB (as in 64MB)"
        )
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not 0 < value <= MAX_BYTES:
        raise ConfigError(f"size '{text}': must be > 0 bytes and at most 1 EiB (2^60 bytes)")
    return int(round(value))


def _bytes_arg(text: str) -> int:
    try:
        return parse_bytes(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: PipeDream's released optimizer's link bandwidth when none is given (its ``-b``), GB/s.
PIPEDREAM_DEFAULT_GBPS = 1.0


def add_pipeline_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``pipeline``: PipeDream stages + replication for a model or a measured profile."""
    p = subparsers.add_parser(
        "pipeline",
        help="pipeline-parallel plan (PipeDream DP): stages, replication, time per minibatch",
        description=(
            "Split a model into contiguous pipeline stages, each replicated data-parallel, minimizing "
            "the slowest stage's time per minibatch (PipeDream, SOSP'19), level by level over the array."
        ),
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--model", help="zoo name (see 'parplan models') or a model file; times from the cost model"
    )
    src.add_argument(
        "--profile", metavar="GRAPH_TXT", help="a PipeDream profile graph.txt (measured times)"
    )
    p.add_argument(
        "--array", required=True, help="accelerator array, e.g. 'a100:16' or a tree file"
    )
    p.add_argument(
        "--batch",
        type=int,
        default=64,
        help="minibatch size for --model (default 64); a profile has its own",
    )
    p.add_argument(
        "--bytes-per-element",
        type=float,
        default=2.0,
        help="bytes per element for --model activations and weights (default 2)",
    )
    p.add_argument(
        "--bandwidth",
        type=float,
        default=None,
        metavar="GB/s",
        help="override every link's bandwidth",
    )
    p.add_argument(
        "--latency", type=float, default=None, metavar="us", help="override every link's latency"
    )
    p.add_argument(
        "--memory-limit",
        type=float,
        default=None,
        metavar="GiB",
        help="per-device limit on stashed weights + activations (default: the smallest device's "
        "memory; none with --ignore-memory or --cost-model pipedream-code)",
    )
    p.add_argument(
        "--ignore-memory",
        action="store_true",
        help="plan without a memory limit, as the PipeDream paper does",
    )
    p.add_argument(
        "--no-replication", action="store_true", help="straight pipeline: one device per stage"
    )
    p.add_argument("--allow-idle", action="store_true", help="allow devices to stay unused")
    p.add_argument(
        "--sync",
        choices=["ring", "pipedream"],
        default="ring",
        help="weight all-reduce price: ring (default) or the paper's 2(m-1)|w|/B",
    )
    p.add_argument(
        "--cost-model",
        choices=["parplan", "pipedream-code"],
        default="parplan",
        help="parplan (default; the paper's formulas, docs/pipeline.md) or pipedream-code: PipeDream's "
        "released optimizer, shown next to parplan's plan, each priced by both models (links "
        "default to the optimizer's 1 GB/s)",
    )
    p.add_argument(
        "--compression",
        type=float,
        default=None,
        metavar="RATIO",
        help="with --cost-model pipedream-code: the optimizer's activation compression ratio (its "
        "transfers are priced only when given)",
    )
    p.add_argument(
        "--no-merge-levels",
        action="store_true",
        help="keep every binary level of the array instead of merging levels with equal links",
    )
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=run_pipeline)
    return p


def run_pipeline(args: argparse.Namespace) -> int:
    """Plan and print; returns 0."""
    from parplan.costmodel.hardware import parse_array
    from parplan.pipeline.planner import (
        PipelineOptions,
        SyncModel,
        machine_from_array,
        plan_pipeline,
    )
    from parplan.pipeline.profile import profile_from_graph, read_profile

    if args.memory_limit is not None and not args.memory_limit > 0:
        raise ConfigError(f"--memory-limit must be > 0 GiB (got {args.memory_limit})")
    bandwidth = args.bandwidth
    if bandwidth is None and args.cost_model == "pipedream-code":
        bandwidth = PIPEDREAM_DEFAULT_GBPS  # the optimizer's default (its -b 1e9)
        print(
            f"parplan: note: links at {bandwidth:g} GB/s, the released optimizer's default (--bandwidth to set)",
            file=sys.stderr,
        )
    array = parse_array(
        args.array,
        bandwidth_bytes_per_s=None if bandwidth is None else bandwidth * 1e9,
        latency_s=None if args.latency is None else args.latency * 1e-6,
    )
    machine = machine_from_array(array, merge_equal_levels=not args.no_merge_levels)
    if args.profile:
        profile = read_profile(args.profile)
    else:
        from parplan.cli.common import import_hint, still_running
        from parplan.models.modelfile import load_model

        if args.batch is None or args.batch <= 0:
            raise ConfigError(f"--batch must be > 0 (got {args.batch})")
        with still_running(f"importing {args.model}", import_hint(args.model)):
            graph = load_model(args.model)
        profile = profile_from_graph(
            graph,
            args.batch,
            machine.device or machine.device_flops_per_s,
            args.bytes_per_element,
        )
    limit = None if args.memory_limit is None else args.memory_limit * GIB
    if limit is None and not args.ignore_memory and args.cost_model != "pipedream-code":
        limit = array.min_memory_bytes  # each device's memory, by default (docs/pipeline.md)
    options = PipelineOptions(
        memory_limit_bytes=limit,
        replication=not args.no_replication,
        allow_idle=args.allow_idle,
        sync=SyncModel(args.sync),
    )
    if args.cost_model == "pipedream-code":
        return _run_pipedream_code(args, profile, machine, options)
    if args.compression is not None:
        raise ConfigError("--compression is an option of --cost-model pipedream-code")
    result = plan_pipeline(profile, machine, options)
    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result.to_table())
    return 0


def _run_pipedream_code(args, profile, machine, options) -> int:
    """``--cost-model pipedream-code``: the released optimizer's plan next to parplan's."""
    from parplan.pipeline.pipedream_code import side_by_side, side_by_side_table

    if (
        args.memory_limit is not None or args.no_replication or args.allow_idle
    ):  # (--ignore-memory: its default)
        raise ConfigError(
            "--cost-model pipedream-code reproduces the optimizer's defaults: no memory limit, "
            "replication on, every machine used (drop --memory-limit, --no-replication, --allow-idle)"
        )
    sbs = side_by_side(profile, machine, args.compression, options)
    if args.format == "json":
        code = sbs.code
        print(
            json.dumps(
                {
                    "model": profile.name,
                    "cost_model": "pipedream-code",
                    "machines": list(code.machines),
                    "bandwidths_bytes_per_s": list(code.bandwidths),
                    "compression": code.compression,
                    "levels": [
                        [{"start": s.start, "end": s.end, "replicas": s.replicas} for s in lv]
                        for lv in code.levels
                    ],
                    "seconds_per_minibatch": code.seconds,
                    "data_parallel_seconds": code.data_parallel_seconds,
                    "single_seconds": code.single_seconds,
                    "plans": sbs.rows(),
                },
                indent=2,
            )
        )
    else:
        print(side_by_side_table(sbs))
    return 0


def add_collectives_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``allreduce``: schedules, validation and time of all-reduce algorithms."""
    p = subparsers.add_parser(
        "allreduce",
        help="all-reduce schedules (ring, dbtree, 2dring, multitree): steps, validity, time",
        description="Build, validate and time all-reduce schedules on a topology (MultiTree, ISCA'21).",
    )
    p.add_argument(
        "--topology",
        required=True,
        metavar="ring|mesh|torus|fattree|FILE",
        help="topology kind, or an edge-list file 'u v [GB/s [latency_us]]' per line",
    )
    p.add_argument("--nodes", type=int, default=None, help="hosts of a ring or fat tree")
    p.add_argument(
        "--dims",
        default=None,
        metavar="RxC",
        help="sides of a mesh or torus, e.g. 4x4, or 4x4x4 for a 3-D torus (TPU pods)",
    )
    p.add_argument(
        "--ports",
        type=int,
        default=None,
        help="network ports per host usable at once, 1-4 (default: its links, at most 4)",
    )
    p.add_argument(
        "--algorithm", default="all", choices=["all", "ring", "dbtree", "2dring", "multitree"]
    )
    p.add_argument(
        "--bytes",
        dest="bytes_",
        type=_bytes_arg,
        default=64 * 2**20,
        metavar="SIZE",
        help="data per host, e.g. 32KB or 64MB (powers of 1024; default 64MB)",
    )
    p.add_argument(
        "--bandwidth", type=float, default=25.0, metavar="GB/s", help="link bandwidth (default 25)"
    )
    p.add_argument(
        "--latency", type=float, default=1.0, metavar="us", help="per-hop latency (default 1)"
    )
    p.add_argument("--show-steps", action="store_true", help="also print every step's transfers")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=run_allreduce)
    return p


#: Above this many hosts ``allreduce`` reports each schedule as it is built.
PROGRESS_HOSTS = 64


def run_allreduce(args: argparse.Namespace) -> int:
    """Build, validate, time and print the chosen algorithms; returns 0."""
    from parplan.collectives.allreduce import (
        MAX_SCHEDULE_HOSTS,
        SLOW_SCHEDULE_HOSTS,
        Algorithm,
        best_schedule,
        lower_bound_steps,
        validate_schedule,
    )
    from parplan.collectives.topology import parse_topology

    if not (math.isfinite(args.bandwidth) and args.bandwidth > 0):
        raise ConfigError(f"--bandwidth must be a finite number > 0 of GB/s (got {args.bandwidth})")
    if not (math.isfinite(args.latency) and args.latency >= 0):
        raise ConfigError(f"--latency must be a finite number >= 0 of us (got {args.latency})")
    topo = parse_topology(
        args.topology,
        nodes=args.nodes,
        dims=args.dims,
        ports=args.ports,
        bytes_per_s=args.bandwidth * 1e9,
        latency_s=args.latency * 1e-6,
    )
    algorithms = list(Algorithm) if args.algorithm == "all" else [Algorithm.parse(args.algorithm)]
    if SLOW_SCHEDULE_HOSTS < topo.size <= MAX_SCHEDULE_HOSTS:
        # Measured: all four algorithms on 256 hosts 15 s, on 1,024 hosts 6 minutes (growth ~ hosts^2.7).
        seconds = 15.0 * (topo.size / SLOW_SCHEDULE_HOSTS) ** 2.7 * len(algorithms) / 4
        took = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
        print(
            f"parplan: warning: building schedules for {topo.size:,} hosts takes a while (about {took} for "
            f"{len(algorithms)} algorithm(s) on one core)",
            file=sys.stderr,
        )
    rows = []
    ring_seconds = None
    # above 64 hosts a schedule takes seconds to minutes: say what is being built
    say = print if topo.size > PROGRESS_HOSTS else (lambda *a, **k: None)
    for k, alg in enumerate(algorithms, start=1):
        t0 = time.perf_counter()
        say(
            f"[parplan] building the {alg.value} schedule ({k} of {len(algorithms)}) on {topo.size:,} hosts...",
            file=sys.stderr,
            flush=True,
        )
        sched, seconds = best_schedule(alg, topo, args.bytes_)
        say(
            f"[parplan] {alg.value}: {sched.steps} steps, built in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        check = validate_schedule(sched)
        if alg is Algorithm.RING:
            ring_seconds = seconds
        rows.append(
            {
                "algorithm": alg.value,
                "steps": sched.steps,
                "phase_steps": list(sched.phase_steps),
                "params": dict(sched.params),
                "valid": check.ok,
                "problems": list(check.problems),
                "seconds": seconds,
                "schedule": sched,
            }
        )
    if ring_seconds is None:
        ring_seconds = best_schedule(Algorithm.RING, topo, args.bytes_)[1]
    bound = lower_bound_steps(topo)
    if args.format == "json":
        out = {
            "topology": topo.describe(),
            "hosts": topo.size,
            "ports": topo.ports,
            "bytes": args.bytes_,
            "lower_bound_phase_steps": bound,
            "results": [
                {k: v for k, v in r.items() if k != "schedule"}
                | {"speedup_vs_ring": ring_seconds / r["seconds"]}
                for r in rows
            ],
        }
        print(json.dumps(out, indent=2))
        return 0
    print(f"all-reduce of {_fmt_bytes(args.bytes_)} on {topo.describe()}")
    print(f"lower bound per phase: ceil((N-1) / min(ports, links per host)) = {bound} steps")
    header = f"  {'algorithm':<10} {'steps':>6} {'phases':>9} {'valid':>6} {'time us':>12} {'vs ring':>8}  notes"
    print(header)
    for r in rows:
        phases = "-" if r["phase_steps"][1] == 0 else f"{r['phase_steps'][0]}+{r['phase_steps'][1]}"
        notes = ", ".join(f"{k}={v}" for k, v in r["params"].items())
        if r["problems"]:
            notes = (notes + "; " if notes else "") + r["problems"][0]
        print(
            f"  {r['algorithm']:<10} {r['steps']:>6} {phases:>9} {str(r['valid']):>6} "
            f"{r['seconds'] * 1e6:>12.2f} {ring_seconds / r['seconds']:>7.2f}x  {notes}"
        )
    if args.show_steps:
        for r in rows:
            print(f"\n{r['algorithm']} schedule:")
            for s, step in enumerate(r["schedule"].by_step(), start=1):
                moves = ", ".join(f"{t.src}->{t.dst}:{t.op.value[0]}{list(t.chunks)}" for t in step)
                print(f"  step {s}: {moves}")
    return 0


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"
