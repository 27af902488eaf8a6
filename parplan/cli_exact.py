"""``parplan solve`` and ``parplan certify``: exact plans with certificates.

``parplan solve --model resnet50 --array tpu-v2:1,tpu-v3:1 --backend scip|cpsat|cbc|highs
[--time-limit S] [--memory-limit GiB|device]`` prints the plan and its certificate.
``parplan certify --model ... --array ...`` runs the DP and the exact solver on the same
problem and prints both objectives, their relative difference, the bound, the gap and both
times (exit status 1 if they contradict each other).

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="parplan")
    >>> add_exact_parsers(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["certify", "--model", "lenet", "--array", "tpu-v2:1,tpu-v3:1"])
    >>> args.backend, args.batch
    ('scip', 512)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

from parplan.errors import ConfigError

GIB = 2**30
GB = 1e9


def _problem_arguments(parser: argparse.ArgumentParser) -> None:
    try:
        from parplan.cli import add_problem_arguments
    except ImportError:  # the main CLI module is optional for this one
        add_problem_arguments = _add_problem_arguments
    add_problem_arguments(parser)


def _add_problem_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="zoo name or model file")
    parser.add_argument("--array", required=True, help="accelerator array, e.g. 'tpu-v2:1,tpu-v3:1'")
    parser.add_argument("--batch", type=int, default=512, help="global batch size (default 512)")
    parser.add_argument("--bandwidth", type=float, default=None, metavar="GB/s", help="link bandwidth override")
    parser.add_argument("--latency", type=float, default=None, metavar="us", help="link latency override")
    parser.add_argument("--bytes-per-element", type=float, default=2.0, help="bytes per element (default 2)")


def _problem(args: argparse.Namespace):
    try:
        from parplan.cli import problem_from_args
    except ImportError:
        problem_from_args = _problem_from_args
    return problem_from_args(args)


def _problem_from_args(args: argparse.Namespace):
    from parplan.costmodel.hardware import parse_array
    from parplan.costmodel.problem import Problem
    from parplan.modelfile import load_model

    array = parse_array(args.array,
                        bandwidth_bytes_per_s=None if args.bandwidth is None else args.bandwidth * GB,
                        latency_s=None if args.latency is None else args.latency * 1e-6)
    return Problem(load_model(args.model), array, batch=args.batch, bytes_per_element=args.bytes_per_element)


def _memory_limit(text: str | None):
    if text is None:
        return None
    if text.strip().lower() == "device":
        return "device"
    try:
        gib = float(text)
    except ValueError:
        raise ConfigError(f"--memory-limit must be a number of GiB per device or 'device' (got {text!r})") from None
    if not gib > 0 or not math.isfinite(gib):
        raise ConfigError(f"--memory-limit must be > 0 GiB (got {text})")
    return gib * GIB


def _common(p: argparse.ArgumentParser) -> None:
    from parplan.solvers.backends.registry import BACKENDS
    from parplan.solvers.planners import PLANNERS

    _problem_arguments(p)
    p.add_argument("--backend", default="scip", help=f"exact backend: {' | '.join(BACKENDS)} (default scip)")
    p.add_argument("--planner", default="accpar",
                   help=f"whose options (types, shares, objective) to solve exactly: {', '.join(PLANNERS)}")
    p.add_argument("--objective", default=None, help="time | communication (default: the planner's)")
    p.add_argument("--shares", default=None, help="free | half | proportional (default: the planner's)")
    p.add_argument("--time-limit", type=float, default=None, metavar="S", help="time limit per MIP solve (s)")
    p.add_argument("--memory-limit", default=None, metavar="GiB",
                   help="memory per device in GiB, or 'device' for each device's own memory (default: none)")
    p.add_argument("--threads", type=int, default=1, help="solver threads (default 1)")
    p.add_argument("--seed", type=int, default=0, help="solver random seed (default 0)")
    p.add_argument("--format", default="table", choices=("table", "json"))
    p.add_argument("-v", "--verbose", action="store_true", help="progress messages on stderr")


def add_exact_parsers(subparsers) -> None:
    """Register ``solve`` and ``certify`` on an argparse subparsers object."""
    s = subparsers.add_parser("solve", help="exact plan (MIP) with an optimality certificate")
    _common(s)
    s.add_argument("--write-lp", default=None, metavar="FILE", help="write the root split's model (.lp)")
    s.add_argument("--write-mps", default=None, metavar="FILE", help="write the root split's model (.mps)")
    s.set_defaults(func=cmd_solve)
    c = subparsers.add_parser("certify", help="DP vs exact: both objectives, the gap and both times")
    _common(c)
    c.set_defaults(func=cmd_certify)


def _setup(args):
    from parplan.solvers.backends.base import SolveOptions
    from parplan.solvers.planners import planner_options

    problem = _problem(args)
    options = planner_options(args.planner, args.objective, args.shares, args.share_grid)
    so = SolveOptions(time_limit_s=args.time_limit, threads=args.threads, seed=args.seed)
    progress = (lambda m: print(f"[parplan] {m}", file=sys.stderr, flush=True)) if args.verbose else None
    return problem, options, so, progress


def cmd_solve(args: argparse.Namespace) -> int:
    from parplan.costmodel.evaluate import evaluate
    from parplan.formulation.mip import build_mip
    from parplan.report import plan_report
    from parplan.solvers.backends.registry import backend_spec
    from parplan.costmodel.split import SplitProblem
    from parplan.solvers.exact import memory_limit_for, solve_exact
    from parplan.solvers.planners import make_plan

    problem, options, so, progress = _setup(args)
    memory = _memory_limit(args.memory_limit)
    if args.write_lp or args.write_mps:
        spec = backend_spec(args.backend)
        model, _ = build_mip(SplitProblem.root(problem), options, memory_limit_for(problem.array, memory),
                             discrete=not spec.supports_continuous)
        for path, write in ((args.write_lp, model.write_lp), (args.write_mps, model.write_mps)):
            if path:
                write(path)
                print(f"wrote {path} ({model.describe()})", file=sys.stderr)
    result = solve_exact(problem, args.backend, options, memory_limit_bytes=memory, solve_options=so,
                         progress=progress)
    cert = result.certificate
    if args.format == "json":
        out = {"certificate": cert.to_dict()}
        if result.plan is not None:
            baseline = evaluate(problem, make_plan(problem, "data"))
            out["plan"] = plan_report(problem, result.plan, result.evaluation, baseline).to_dict()
        print(json.dumps(out, indent=2, default=str))
    else:
        if result.plan is not None:
            baseline = evaluate(problem, make_plan(problem, "data"))
            print(plan_report(problem, result.plan, result.evaluation, baseline).text())
            print()
        else:
            print(f"{problem.graph.name} on {problem.array.describe()}: no plan")
        print("certificate")
        print("\n".join("  " + line for line in cert.lines()))
    return 0 if result.plan is not None else 1


def cmd_certify(args: argparse.Namespace) -> int:
    from parplan.costmodel.evaluate import evaluate
    from parplan.solvers.exact import price_of, solve_exact
    from parplan.solvers.planners import make_plan

    problem, options, so, progress = _setup(args)
    memory = _memory_limit(args.memory_limit)
    t0 = time.perf_counter()
    dp_plan = make_plan(problem, args.planner, options=options)
    dp_s = time.perf_counter() - t0
    dp_price = price_of(evaluate(problem, dp_plan), options)
    t0 = time.perf_counter()
    result = solve_exact(problem, args.backend, options, memory_limit_bytes=memory, solve_options=so,
                         progress=progress)
    exact_s = time.perf_counter() - t0
    cert = result.certificate
    unit = cert.unit
    exact_price = cert.objective
    rel = None if exact_price is None else (dp_price - exact_price) / exact_price
    gap_dp = None if cert.bound is None else max(0.0, (dp_price - cert.bound) / dp_price)
    # contradictions: the DP beats a proven bound, or an optimal one-level exact plan is beaten by the DP
    bad = []
    if cert.bound is not None and dp_price < cert.bound * (1 - 1e-6) and memory is None:
        bad.append("the DP plan is cheaper than the exact solver's proven bound")
    if cert.is_optimal and problem.array.depth == 1 and rel is not None and rel < -1e-6 and memory is None:
        bad.append("the DP plan is cheaper than the 'optimal' exact plan")
    row = {
        "model": problem.graph.name, "array": problem.array.describe(), "levels": problem.array.depth,
        "objective": options.objective.value, "unit": unit, "status": cert.status,
        "dp_objective": dp_price, "exact_objective": exact_price, "bound": cert.bound,
        "dp_minus_exact_rel": rel, "exact_gap": cert.gap, "dp_gap_to_bound": gap_dp,
        "dp_s": dp_s, "exact_s": exact_s, "solver": f"{cert.solver} {cert.version}",
        "memory_limit": args.memory_limit, "contradictions": bad, "message": cert.message,
    }
    if args.format == "json":
        print(json.dumps(row, indent=2, default=str))
    else:
        def fmt(x):
            if x is None:
                return "n/a"
            return f"{x * 1e3:.9f} ms" if unit == "s" else f"{x:.9g} {unit}"

        print(f"{problem.graph.name} on {problem.array.describe()} ({problem.array.depth} level"
              f"{'s' if problem.array.depth > 1 else ''}), batch {problem.batch}, planner {args.planner}, "
              f"objective {options.objective.value}")
        print(f"  DP          {fmt(dp_price)}   ({dp_s:.3f} s)")
        print(f"  exact       {fmt(exact_price)}   ({exact_s:.3f} s, {cert.solver} {cert.version})")
        print(f"  status      {cert.status}")
        print(f"  bound       {fmt(cert.bound)}")
        print(f"  DP - exact  {'n/a' if rel is None else f'{rel:.3e}'} (relative)")
        print(f"  exact gap   {'n/a' if cert.gap is None else f'{cert.gap:.3e}'}; DP gap to bound "
              f"{'n/a' if gap_dp is None else f'{gap_dp:.3e}'}")
        if cert.message:
            print(f"  message     {cert.message}")
        for n in cert.notes:
            print(f"  note        {n}")
        for b in bad:
            print(f"  CONTRADICTION: {b}")
    return 1 if bad else 0


__all__ = ["add_exact_parsers", "cmd_certify", "cmd_solve"]
