"""``parplan solve`` and ``parplan certify``: exact plans with certificates.

``parplan solve --model resnet50 --array tpu-v2:1,tpu-v3:1 --backend scip|cpsat|cbc|highs
[--time-limit S] [--memory-limit GiB|device]`` prints the plan and its certificate.
``parplan certify --model ... --array ...`` runs the DP and the exact solver on the same
problem and prints both objectives, their relative difference, the bound, the gap and both
times (exit status 1 if they contradict each other or there is no exact plan). Each MIP solve
has a time limit (300 s by default); solves longer than 5 s report progress on stderr.

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
import sys

from parplan.cli.common import (
    PLANNER_NAMES,
    add_problem_arguments,
    data_parallel_baseline,
    memory_limit,
    plans_against_memory,
    problem_from_args,
    problem_source,
    output_path,
    progress_printer,
)
from parplan.errors import ConfigError

#: Default time limit per MIP solve (seconds); a long level-by-level solve is many of these.
DEFAULT_TIME_LIMIT_S = 300.0
#: Without -v, progress lines start after this many seconds.
PROGRESS_AFTER_S = 5.0


def _common(p: argparse.ArgumentParser) -> None:
    from parplan.solvers.backends.registry import BACKENDS

    add_problem_arguments(p)
    p.add_argument(
        "--backend", default="scip", help=f"exact backend: {' | '.join(BACKENDS)} (default scip)"
    )
    p.add_argument(
        "--planner",
        default="accpar",
        help=f"whose options (types, shares, objective) to solve exactly: {', '.join(PLANNER_NAMES)}",
    )
    p.add_argument(
        "--objective", default=None, help="time | communication (default: the planner's)"
    )
    p.add_argument(
        "--shares", default=None, help="free | half | proportional (default: the planner's)"
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=DEFAULT_TIME_LIMIT_S,
        metavar="S",
        help=f"time limit per MIP solve in seconds (default {DEFAULT_TIME_LIMIT_S:g}; the certificate "
        "reports the incumbent and its bound when it is reached)",
    )
    p.add_argument(
        "--memory-limit",
        default=None,
        metavar="GiB",
        help="memory per device in GiB, or 'device' for each device's own memory (the default)",
    )
    p.add_argument(
        "--ignore-memory",
        action="store_true",
        help="solve without memory limits, as the papers do (the default under --compat)",
    )
    p.add_argument("--threads", type=int, default=1, help="solver threads (default 1)")
    p.add_argument("--seed", type=int, default=0, help="solver random seed (default 0)")
    p.add_argument(
        "--joint",
        action="store_true",
        help="solve every split at once (the joint model of the whole array; small arrays) instead "
        "of level by level",
    )
    p.add_argument(
        "--no-symmetry",
        action="store_true",
        help="with --joint: give interchangeable sibling groups their own variables (exact over every "
        "plan, larger model)",
    )
    p.add_argument("--format", default="table", choices=("table", "json", "csv"))
    p.add_argument(
        "--save",
        default=None,
        metavar="JSON",
        help="write the exact plan and its certificate as a plan file (re-price with 'parplan evaluate')",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="progress messages and the solver's log on stderr",
    )


def add_exact_parsers(subparsers) -> None:
    """Register ``solve`` and ``certify`` on an argparse subparsers object."""
    s = subparsers.add_parser("solve", help="exact plan (MIP) with an optimality certificate")
    _common(s)
    s.add_argument(
        "--write-lp", default=None, metavar="FILE", help="write the root split's model (.lp)"
    )
    s.add_argument(
        "--write-mps", default=None, metavar="FILE", help="write the root split's model (.mps)"
    )
    s.set_defaults(func=cmd_solve)
    c = subparsers.add_parser(
        "certify", help="DP vs exact: both objectives, the gap and both times"
    )
    _common(c)
    c.set_defaults(func=cmd_certify)


def _setup(args):
    from parplan.solvers.backends.base import SolveOptions
    from parplan.solvers.planners import planner_options

    if args.no_symmetry and not args.joint:
        raise ConfigError("--no-symmetry applies to the joint model: add --joint")
    problem = problem_from_args(args)
    options = planner_options(args.planner, args.objective, args.shares, args.share_grid)
    so = SolveOptions(
        time_limit_s=args.time_limit, threads=args.threads, seed=args.seed, verbose=args.verbose
    )
    progress = progress_printer(args.verbose, after_s=PROGRESS_AFTER_S)
    return problem, options, so, progress


def cmd_solve(args: argparse.Namespace) -> int:
    from parplan.formulation.mip import build_mip
    from parplan.reporting.report import plan_report
    from parplan.solvers.backends.registry import backend_spec
    from parplan.costmodel.split import SplitProblem
    from parplan.solvers.exact import memory_limit_for, solve_exact

    outputs = {
        name: output_path(value, option)
        for name, value, option in (
            ("save", args.save, "--save"),
            ("lp", args.write_lp, "--write-lp"),
            ("mps", args.write_mps, "--write-mps"),
        )
        if value
    }
    problem, options, so, progress = _setup(args)
    memory = memory_limit(args.memory_limit)
    if memory is None and plans_against_memory(args):
        memory = "device"  # each device's own memory, by default (docs/costmodel.md section 6.2)
    if args.write_lp and args.joint or args.write_mps and args.joint:
        raise ConfigError("--write-lp/--write-mps write the root split's model; not with --joint")
    if args.write_lp or args.write_mps:
        spec = backend_spec(args.backend)
        model, _ = build_mip(
            SplitProblem.root(problem),
            options,
            memory_limit_for(problem.array, memory),
            discrete=not spec.supports_continuous,
        )
        for key, write in (("lp", model.write_lp), ("mps", model.write_mps)):
            if key in outputs:
                try:
                    write(str(outputs[key]))
                except OSError as exc:
                    raise ConfigError(
                        f"cannot write '{outputs[key]}': {exc.strerror or exc}"
                    ) from None
                print(f"wrote {outputs[key]} ({model.describe()})", file=sys.stderr)
    result = solve_exact(
        problem,
        args.backend,
        options,
        memory_limit_bytes=memory,
        solve_options=so,
        progress=progress,
        joint=args.joint,
        symmetric=not args.no_symmetry,
    )
    cert = result.certificate
    if "save" in outputs:
        _save(outputs["save"], problem, result, args)
    if args.format == "csv":
        if result.plan is not None:
            baseline = data_parallel_baseline(problem)
            report = plan_report(problem, result.plan, result.evaluation, baseline)
            frame = report.layer_frame()
            meta = {**report.metadata(), "backend": args.backend}
        else:
            import pandas as pd

            frame, meta = (
                pd.DataFrame([{"layer": None}]),
                {
                    "model": problem.graph.name,
                    "array": problem.array.describe(),
                    "backend": args.backend,
                },
            )
        for key, value in {
            **meta,
            "status": cert.status,
            "objective": cert.objective,
            "bound": cert.bound,
            "gap": cert.gap,
        }.items():
            frame[key] = value
        print(frame.to_csv(index=False), end="")
    elif args.format == "json":
        from parplan.costmodel.planio import parplan_version

        out = {
            "model": problem.graph.name,
            "array": problem.array.describe(),
            "devices": problem.array.count,
            "batch": problem.batch,
            "planner": args.planner,
            "backend": args.backend,
            "parplan_version": parplan_version(),
            "certificate": cert.to_dict(),
        }
        if result.plan is not None:
            baseline = data_parallel_baseline(problem)
            out["plan"] = plan_report(problem, result.plan, result.evaluation, baseline).to_dict()
        print(json.dumps(out, indent=2, default=str))
    else:
        if result.plan is not None:
            baseline = data_parallel_baseline(problem)
            print(plan_report(problem, result.plan, result.evaluation, baseline).text())
            print()
        else:
            print(f"{problem.graph.name} on {problem.array.describe()}: no plan")
        print("certificate")
        print("\n".join("  " + line for line in cert.lines()))
    return 0 if result.plan is not None else 1


def _save(path, problem, result, args, extra=None) -> None:
    """Write ``result``'s plan with its certificate and the evaluation the solve already made."""
    from parplan.costmodel.planio import plan_document, write_plan_file

    plan, cert, ev = result.plan, result.certificate, result.evaluation
    if plan is None:
        print(
            f"parplan: warning: no plan to save to {path} (status {cert.status})", file=sys.stderr
        )
        return
    summary = {
        "step_time_s": ev.step_time_s,
        "communication_bytes": ev.communication_bytes,
        "peak_device_memory_bytes": ev.peak_memory_bytes,
    }
    write_plan_file(
        path,
        plan_document(
            problem,
            plan,
            problem_source(args),
            evaluation=summary,
            certificate=cert.to_dict(),
            extra=extra,
        ),
    )
    print(f"wrote {path}", file=sys.stderr)


def cmd_certify(args: argparse.Namespace) -> int:
    from parplan.solvers.exact import certify

    save = output_path(args.save, "--save") if args.save else None
    problem, options, so, progress = _setup(args)
    memory = memory_limit(args.memory_limit)
    if memory is None and plans_against_memory(args):
        memory = "device"  # each device's own memory, by default (docs/costmodel.md section 6.2)
    c = certify(
        problem,
        args.planner,
        args.backend,
        options,
        memory_limit_bytes=memory,
        solve_options=so,
        progress=progress,
        joint=args.joint,
        symmetric=not args.no_symmetry,
    )
    result, cert = c.exact, c.exact.certificate
    unit = cert.unit
    solver = f"{cert.solver} {cert.version}".strip()  # a fallback has no solver
    dp_price, exact_price, rel, gap_dp = (
        c.dp_objective,
        cert.objective,
        c.dp_minus_exact_rel,
        c.dp_gap_to_bound,
    )
    dp_s, exact_s, bad = c.dp_s, c.exact_s, list(c.contradictions)
    row = {
        "model": problem.graph.name,
        "array": problem.array.describe(),
        "levels": problem.array.depth,
        "objective": options.objective.value,
        "unit": unit,
        "status": cert.status,
        "dp_objective": dp_price,
        "exact_objective": exact_price,
        "bound": cert.bound,
        "dp_minus_exact_rel": rel,
        "exact_gap": cert.gap,
        "dp_gap_to_bound": gap_dp,
        "dp_s": dp_s,
        "exact_s": exact_s,
        "solver": solver,
        "polished_step_time_s": c.polished_s,
        "portfolio_step_time_s": c.portfolio_s,
        "portfolio_selected": c.portfolio_selected,
        "continuous_step_time_s": c.continuous_s,
        "best_step_time_s": c.best_s,
        "global_bound_s": c.global_bound_s,
        "global_gap": c.global_gap,
        "excess_states_s": c.excess_states_s,
        "excess_transfers_s": c.excess_transfers_s,
        "per_node_bound_s": c.per_node_bound_s,
        "memory_limit": args.memory_limit,
        "contradictions": bad,
        "message": cert.message,
    }
    if save:
        _save(
            save,
            problem,
            result,
            args,
            extra={
                "dp_objective": dp_price,
                "dp_s": dp_s,
                "exact_s": exact_s,
                "contradictions": bad,
            },
        )
    from parplan.costmodel.planio import parplan_version

    meta = {
        "batch": problem.batch,
        "planner": args.planner,
        "backend": args.backend,
        "parplan_version": parplan_version(),
    }
    if args.format == "json":
        print(json.dumps({**row, **meta}, indent=2, default=str))
    elif args.format == "csv":
        import pandas as pd

        print(
            pd.DataFrame([{**row, **meta, "contradictions": "; ".join(bad)}]).to_csv(index=False),
            end="",
        )
    else:

        def fmt(x):
            if x is None:
                return "n/a"
            return f"{x * 1e3:.9f} ms" if unit == "s" else f"{x:.9g} {unit}"

        print(
            f"{problem.graph.name} on {problem.array.describe()} ({problem.array.depth} level"
            f"{'s' if problem.array.depth > 1 else ''}), batch {problem.batch}, planner {args.planner}, "
            f"objective {options.objective.value}"
        )
        print(f"  DP          {fmt(dp_price)}   ({dp_s:.3f} s)")
        print(f"  exact       {fmt(exact_price)}   ({exact_s:.3f} s, {solver})")
        print(f"  status      {cert.status}")
        print(f"  bound       {fmt(cert.bound)}")
        print(f"  DP - exact  {'n/a' if rel is None else f'{rel:.3e}'} (relative)")
        print(
            f"  exact gap   {'n/a' if cert.gap is None else f'{cert.gap:.3e}'}; DP gap to bound "
            f"{'n/a' if gap_dp is None else f'{gap_dp:.3e}'}"
        )
        if c.portfolio_s is not None:
            print(
                f"  portfolio   {fmt(c.portfolio_s)}   (`parplan plan`'s accpar: every level criterion, "
                f"{c.portfolio_selected} selected)"
            )
        if c.polished_s is not None:
            print(
                f"  polished DP {fmt(c.polished_s)}   (multi-level moves priced by the evaluator, from the better "
                "plan)"
            )
        if c.continuous_s is not None:
            print(
                f"  continuous  {fmt(c.continuous_s)}   (top-down, each split's shares searched "
                "anywhere in [0, 1])"
            )
        if c.global_bound_s is not None:
            print(
                f"  whole array best plan {fmt(c.best_s)}, global bound {fmt(c.global_bound_s)} (every plan of "
                f"the hierarchy, any shares), global gap {'n/a' if c.global_gap is None else f'{c.global_gap:.2%}'}"
            )
        excess = (c.excess_states_s or 0.0) + (c.excess_transfers_s or 0.0)
        if c.best_s is not None and excess > 1e-9 * c.best_s:  # a rounding is no excess
            print(
                f"  excess      of the better of the DP's and the portfolio's plans over its layers' own bounds: "
                f"{fmt(c.excess_states_s)} from its states, {fmt(c.excess_transfers_s)} from transfers between "
                f"layers; the global bound charges {fmt(max(0.0, c.global_bound_s - c.per_node_bound_s))} of it "
                '(docs/costmodel.md section 8, "Where a gap sits")'
            )
        if cert.message:
            print(f"  message     {cert.message}")
        for n in cert.notes:
            print(f"  note        {n}")
        for b in bad:
            print(f"  CONTRADICTION: {b}")
    # Non-zero when something contradicts (1) or when there is no exact plan at all (infeasible, error).
    return 1 if bad or result.plan is None else 0


__all__ = ["add_exact_parsers", "cmd_certify", "cmd_solve"]
