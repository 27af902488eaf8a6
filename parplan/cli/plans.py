"""``parplan plan | evaluate | diff | compare``: make, keep, re-price and compare plans.

- ``plan``: one planner's plan, its price, a memory check, ``--save p.json`` (docs/planfile.md).
- ``evaluate --plan p.json [--model ... --array ... --bandwidth ...]``: re-price a saved plan,
  on the problem it was made for or on another array, bandwidth or batch with the same tree
  of groups and the same layers.
- ``diff a.json b.json``: where two plans of one problem differ and what each difference costs
  (a's step time with that one cell taken from b).
- ``compare --planners accpar,hypar,owt,data | all``: one table of step time, speedup,
  communication, peak memory and planning time; ``--csv`` and ``--plot`` optional.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="parplan")
    >>> add_plan_parsers(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["compare", "--model", "lenet", "--array", "h100:2", "--planners", "all"])
    >>> args.planners, args.batch
    ('all', 512)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

from parplan.cli.common import (
    COMPAT_CHOICES,
    PLANNER_NAMES,
    add_memory_arguments,
    data_parallel_baseline,
    add_problem_arguments,
    memory_limit,
    plans_against_memory,
    output_path,
    problem_from_args,
    problem_source,
    progress_printer,
    run_inputs,
    technique_choices,
)
from parplan.errors import ConfigError

#: Above this many devices ``plan`` says up front that it will take minutes.
LARGE_ARRAY = 4096
#: Planners ``compare --planners all`` runs, in table order.
COMPARE_ALL = PLANNER_NAMES


def report_and_checks(
    problem,
    plan,
    wall_s,
    limit,
    fmt: str,
    extra_json: dict | None = None,
    bound: bool = False,
    progress=None,
    inputs: dict | None = None,
    evaluation=None,
) -> tuple:
    """Price ``plan``, print it in ``fmt`` and warn about memory; returns (report, evaluation).
    ``bound``: also the global bound and the plan's gap to it (:func:`bound_figures`);
    ``evaluation``: the plan's price on ``problem`` where the caller has it (the memory search
    prices every plan it returns)."""
    from parplan.costmodel.evaluate import evaluate, memory_overruns
    from parplan.reporting.report import format_bytes, plan_report

    ev = evaluation if evaluation is not None else evaluate(problem, plan)
    if bound:
        extra_json = {**(extra_json or {}), **bound_figures(problem, ev, progress, plan)}
    baseline = data_parallel_baseline(problem)
    report = plan_report(problem, plan, ev, baseline, wall_s=wall_s)
    overruns = memory_overruns(problem, ev, None if limit in (None, "device") else limit)
    if fmt == "json":
        out = report.to_dict()
        out["memory_overruns"] = [
            {"device": p or "root", "kind": k, "need_bytes": n, "capacity_bytes": c}
            for p, k, n, c in overruns
        ]
        out.update(extra_json or {})
        if inputs:
            out["inputs"] = inputs
        print(json.dumps(out, indent=2, default=str))
    elif fmt == "csv":
        frame = report.layer_frame()
        if (
            extra_json and "layer_bounds" in extra_json
        ):  # --bound: each layer's own bound, and the global one
            frame.insert(
                len(frame.columns), "bound_s", [r["bound_s"] for r in extra_json["layer_bounds"]]
            )
        for key, value in {**report.metadata(), **(inputs or {})}.items():
            if key not in frame.columns:
                frame.insert(len(frame.columns), key, value)
        for key in ("global_bound_s", "global_gap"):
            if extra_json and key in extra_json:
                frame.insert(len(frame.columns), key, extra_json[key])
        print(frame.to_csv(index=False), end="")
    else:
        print(report.text())
        if bound:
            print(bound_text(extra_json))
    if overruns:
        what = "the memory limit" if limit not in (None, "device") else "their memory"
        path, kind, need, cap = overruns[0]
        print(
            f"parplan: warning: {len(overruns)} of {problem.array.count} devices exceed {what}; worst: "
            f"device {path or 'root'} ({kind}) needs {format_bytes(need)} of {format_bytes(cap)}. "
            "It was planned with --ignore-memory or a --compat profile; without them 'parplan plan' plans "
            "against memory.",
            file=sys.stderr,
        )
    return report, ev


#: Layers ``--bound`` lists by how far their time exceeds their own bound.
BOUND_TOP = 5


def bound_figures(problem, ev, progress=None, plan=None) -> dict:
    """``--bound``: the global lower bound (docs/costmodel.md section 8), the gap of the plan
    evaluated as ``ev`` to it, and each layer's own bound (the per-node bound's terms) next to
    its time in the plan. With ``plan``: also each layer's bound pinned to the plan's states
    (``bound.pinned_node_bounds``), which splits its excess into what its states cost in its
    own terms and what the plan pays to move data between layers (section 8, "Where a gap
    sits")."""
    from parplan.solvers.bound import excess_parts, global_bound, layer_excess, pinned_node_bounds

    if progress is not None:
        progress("global bound over the whole hierarchy")
    bound = global_bound(problem)
    names = [n.name for n in problem.planning.nodes]
    rows = [
        {"layer": name, "time_s": t, "bound_s": b, "excess_s": x}
        for name, t, b, x in zip(
            names, ev.node_time_s, bound.node_s, layer_excess(ev.node_time_s, bound)
        )
    ]
    out = {
        "global_bound_s": bound.bound_s,
        "global_gap": max(0.0, ev.step_time_s / bound.bound_s - 1.0),
        "per_layer_bound_s": sum(bound.node_s),
        "layer_bounds": rows,
    }
    if plan is not None:
        pinned = pinned_node_bounds(problem, plan)
        parts = excess_parts(ev.node_time_s, bound.node_s, pinned)
        for row, pin, (states, moves) in zip(rows, pinned, parts):
            row.update(pinned_s=pin, states_excess_s=states, transfers_excess_s=moves)
        out["states_excess_s"] = math.fsum(r["states_excess_s"] for r in rows)
        out["transfers_excess_s"] = math.fsum(r["transfers_excess_s"] for r in rows)
    return out


def bound_text(figures: dict) -> str:
    """The ``--bound`` lines of a table report."""
    from parplan.reporting.report import format_time

    lines = [
        f"global bound         {format_time(figures['global_bound_s'])}  -> gap "
        f"{figures['global_gap']:.2%} (no plan of this array's hierarchy, with any shares, is faster)",
        *layer_bound_lines(figures["layer_bounds"], figures["per_layer_bound_s"]),
    ]
    states, moves = figures.get("states_excess_s", 0.0), figures.get("transfers_excess_s", 0.0)
    if states + moves > 1e-9 * figures["per_layer_bound_s"]:  # a plan above its layers' bounds
        above = figures["global_bound_s"] - figures["per_layer_bound_s"]
        lines.append(
            f"  above the layers' own bounds: {_part(states, states + moves)} from the plan's states "
            f"(each layer's own terms), {_part(moves, states + moves)} from transfers between "
            f"layers; the global bound charges {_part(above, states + moves)} of it "
            f"(docs/costmodel.md section 8, "
            '"Where a gap sits")'
        )
    return "\n".join(lines)


def _part(seconds: float, whole: float) -> str:
    """A part of ``whole`` as a time, "0" where it is below rounding (1e-9 of ``whole``)."""
    from parplan.reporting.report import format_time

    return "0" if seconds <= 1e-9 * whole else format_time(seconds)


def layer_bound_lines(layer_bounds: list[dict], per_layer_bound_s: float) -> list[str]:
    """The :data:`BOUND_TOP` layers furthest above their own bound (``bound_figures``' rows), as
    report lines; none when no layer is above its bound."""
    from parplan.reporting.report import format_time

    top = sorted(layer_bounds, key=lambda r: -r["excess_s"])[:BOUND_TOP]
    top = [r for r in top if r["excess_s"] > 1e-9 * r["time_s"]]  # a rounding is no excess
    if not top:
        return []
    width = max(len(r["layer"]) for r in top)
    return [
        f"  the layers furthest above their own bound (each layer alone: {format_time(per_layer_bound_s)} in all):"
    ] + [
        f"    {r['layer']:<{width}}  {format_time(r['time_s'])} vs {format_time(r['bound_s'])}: "
        f"+{format_time(r['excess_s'])}"
        + (
            f" (states +{_part(r['states_excess_s'], r['excess_s'])}, transfers "
            f"+{_part(r['transfers_excess_s'], r['excess_s'])})"
            if "states_excess_s" in r
            else ""
        )
        for r in top
    ]


def _check_continuous(args: argparse.Namespace) -> None:
    """--continuous-shares: what it cannot be combined with, in one error."""
    if plans_against_memory(args):
        raise ConfigError(
            "--continuous-shares plans without a memory limit (its search has no memory rows): add "
            "--ignore-memory"
        )
    if args.planner not in ("accpar", "accpar-topdown") or args.shares not in (None, "free"):
        raise ConfigError(
            "--continuous-shares searches free shares with the time objective: use --planner accpar"
        )
    if args.objective not in (None, "time") or args.polish:
        raise ConfigError("--continuous-shares takes the time objective and no --polish")


def _print_continuous(found: dict) -> None:
    """One line per split on stderr: the continuous optimum's proof (or bracket)."""
    for path, r in sorted(found.items()):
        where = path or "root"
        if r["stop"] == "optimal":
            what = f"optimal within {r['gap']:.1e}"
        else:
            what = f"stopped ({r['stop']}); within {r['gap']:.2%} of the continuous optimum"
        grid = r["grid_value_s"]
        gain = "" if not grid else f", {1 - r['value_s'] / grid:.2%} below the grid of 16"
        print(f"parplan: split {where}: continuous shares {what}{gain}", file=sys.stderr)


def cmd_plan(args: argparse.Namespace) -> int:
    from parplan.costmodel.planio import plan_document, write_plan_file
    from parplan.solvers.planners import make_plan

    save = output_path(args.save, "--save") if args.save else None
    plot = output_path(args.plot, "--plot") if args.plot else None
    limit = memory_limit(args.memory_limit)
    problem = problem_from_args(args)
    _bound_applies(args, problem)
    if problem.array.count > LARGE_ARRAY:
        print(
            f"parplan: note: {problem.array.count:,} devices; pricing a plan visits every device, so planning "
            f"takes minutes (about 8 s per 1,000 devices for LeNet, more for larger models)",
            file=sys.stderr,
        )
    if args.polish:
        from parplan.solvers.polish import auto_polish

        if not auto_polish(problem):
            print(
                f"parplan: note: --polish re-prices a layer at every split per move: with "
                f"{len(problem.planning.nodes)} layers on {problem.array.count} devices it may take minutes "
                f"(-v shows each pass)",
                file=sys.stderr,
            )
    if args.pipeline:
        return _plan_pipeline(args, problem, limit, save)
    if args.continuous_shares:
        _check_continuous(args)
    start = time.perf_counter()
    priced = None
    kwargs = dict(
        objective=args.objective, shares=args.shares, share_grid=args.share_grid, polish=args.polish
    )
    if args.continuous_shares:
        from parplan.solvers.continuous import continuous_plan
        from parplan.solvers.planners import planner_options

        options = planner_options(args.planner, args.objective, args.shares, args.share_grid)
        plan, found = continuous_plan(
            problem, options, progress=progress_printer(args.verbose, after_s=5.0)
        )
        _print_continuous(found)
    elif plans_against_memory(args):
        from parplan.solvers.fit import fit_plan

        fit = fit_plan(
            problem,
            args.planner,
            None if limit in (None, "device") else limit,
            progress=progress_printer(args.verbose, after_s=5.0),
            plan_kwargs=kwargs,
            **technique_choices(args),
        )
        problem, plan, priced = fit.problem, fit.plan, fit.evaluation
    else:
        plan = make_plan(problem, args.planner, progress=progress_printer(args.verbose), **kwargs)
    wall = time.perf_counter() - start
    report, ev = report_and_checks(
        problem,
        plan,
        wall,
        limit,
        args.format,
        bound=args.bound,
        progress=progress_printer(args.verbose),
        inputs=run_inputs(args),
        evaluation=priced,
    )
    if plot:
        from parplan.reporting.plot import plot_plan

        plot_plan(report, plot)
        print(f"wrote {plot}", file=sys.stderr)
    if save:
        write_plan_file(
            save,
            plan_document(problem, plan, problem_source(args), evaluation=_summary(report, wall)),
        )
        print(f"wrote {save}", file=sys.stderr)
    return 0


def _bound_applies(args: argparse.Namespace, problem) -> None:
    """``--bound`` bounds parplan's own cost model: under compat rules it is refused before any
    planning (it used to fail after planning, without the plan)."""
    if args.bound and problem.compat is not None:
        raise ConfigError(
            f"--bound: the global bound is for parplan's own cost model, not the compat rules "
            f"'{problem.compat}'; drop --bound, or --compat to bound parplan's model"
        )


def _plan_pipeline(args: argparse.Namespace, problem, limit, save) -> int:
    """``plan --pipeline``: the joint search of :func:`parplan.pipeline.partitioned.plan_partitioned`."""
    from parplan.pipeline.partitioned import plan_partitioned
    from parplan.reporting.stages import pipeline_dict, result_text

    for flag, given in (
        ("--objective", args.objective),
        ("--shares", args.shares),
        ("--polish", args.polish),
        ("--bound", args.bound),
        ("--plot", args.plot),
    ):
        if given:
            raise ConfigError(
                f"{flag} does not apply to --pipeline (the stages' plans take the planner's defaults)"
            )
    if args.max_stages is not None and args.max_stages < 1:
        raise ConfigError(f"--max-stages must be >= 1 (got {args.max_stages})")
    techniques = technique_choices(args)
    fixed = {k: (v,) if v != "auto" else "auto" for k, v in techniques.items()}
    start = time.perf_counter()
    result = plan_partitioned(
        problem,
        args.planner,
        schedule=args.schedule,
        max_stages=args.max_stages,
        limit_bytes=None if limit in (None, "device") else limit,
        ignore_memory=not plans_against_memory(args),
        progress=progress_printer(args.verbose, after_s=5.0),
        **fixed,
    )
    wall = time.perf_counter() - start
    if args.format == "json":
        print(
            json.dumps(
                {
                    **pipeline_dict(result.problem, result.plan, result.evaluation, result),
                    "planning_wall_s": wall,
                    "inputs": run_inputs(args),
                },
                indent=2,
                default=str,
            )
        )
    elif args.format == "csv":
        import pandas as pd

        record = pipeline_dict(result.problem, result.plan, result.evaluation)
        frame = pd.DataFrame(record["stages"])
        for key in (
            "model",
            "array",
            "batch",
            "schedule",
            "micro_batches",
            "zero_stage",
            "recompute",
            "step_time_s",
        ):
            frame[key] = record[key]
        for key, value in run_inputs(args).items():
            frame[key] = value
        print(frame.to_csv(index=False), end="")
    else:
        print(result_text(result))
        print(f"planned in {wall:.1f} s")
    if save:
        from parplan.costmodel.planio import pipeline_document, write_plan_file

        write_plan_file(
            save,
            pipeline_document(
                result.problem,
                result.plan,
                problem_source(args),
                evaluation={
                    "step_time_s": result.evaluation.step_time_s,
                    "peak_device_memory_bytes": result.evaluation.peak_memory_bytes,
                    "planning_wall_s": wall,
                },
            ),
        )
        print(f"wrote {save}", file=sys.stderr)
    return 0


def _summary(report, wall_s: float | None) -> dict:
    ev = report.evaluation
    return {
        "step_time_s": ev.step_time_s,
        "data_parallel_step_time_s": report.baseline.step_time_s,
        "communication_bytes": ev.communication_bytes,
        "peak_device_memory_bytes": ev.peak_memory_bytes,
        "planning_wall_s": wall_s,
    }


def _problem_for(args: argparse.Namespace, record: dict):
    """The problem to price a saved plan on: the file's record, each field overridable."""
    ns = argparse.Namespace(
        model=args.model or record.get("model_source") or record.get("model"),
        array=args.array or record.get("array_source") or record.get("array"),
        batch=args.batch if args.batch is not None else record.get("batch", 512),
        bandwidth=args.bandwidth
        if args.bandwidth is not None
        else (None if args.array else record.get("bandwidth_gb_per_s")),
        latency=args.latency
        if args.latency is not None
        else (None if args.array else record.get("latency_us")),
        fabric=getattr(args, "fabric", None)
        or record.get("fabric", "papers"),  # files from before the fabric used one link
        bytes_per_element=args.bytes_per_element
        if args.bytes_per_element is not None
        else record.get("bytes_per_element", 2.0),
        optimizer_bytes=args.optimizer_bytes
        if args.optimizer_bytes is not None
        else record.get("optimizer_bytes_per_param", 12.0),
        devices=args.devices or record.get("devices_file"),
        compat=args.compat if args.compat is not None else record.get("compat"),
        zero=getattr(args, "zero", None)
        if getattr(args, "zero", None) is not None
        else str(record.get("zero_stage") or 0),
        # files from before block checkpointing checkpointed every layer
        recompute=getattr(args, "recompute", None)
        or (record.get("checkpoint", "layer") if record.get("recompute") else "no"),
        micro_batches=getattr(args, "micro_batches", None) or record.get("micro_batches") or 1,
        # files from before overlap priced traffic after compute
        overlap=getattr(args, "overlap", None) or ("yes" if record.get("overlap", False) else "no"),
    )
    return problem_from_args(ns)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from parplan.costmodel.planio import check_plan_fits, read_plan_file
    from parplan.reporting.report import format_time

    if (args.plan is None) == (args.config is None):
        raise ConfigError("evaluate needs --plan FILE or --config SPEC (one of them)")
    if args.config is not None:
        return _evaluate_config(args)
    if args.gap or args.tensor_plan:
        raise ConfigError(
            f"{'--gap' if args.gap else '--tensor-plan'} goes with --config (a saved plan's gap: "
            "parplan certify)"
        )
    if args.save:
        raise ConfigError("--save goes with --config (the plan file is already saved)")
    saved = read_plan_file(args.plan)
    problem = _problem_for(args, dict(saved.problem))
    _bound_applies(args, problem)
    where = f"plan file '{args.plan}'"
    if saved.pipeline is not None:
        return _evaluate_pipeline(args, saved, problem, where)
    check_plan_fits(problem, saved.nodes, saved.plan, where)
    report, ev = report_and_checks(
        problem,
        saved.plan,
        None,
        memory_limit(args.memory_limit),
        args.format,
        extra_json={"saved_evaluation": saved.evaluation, "saved_certificate": saved.certificate},
        bound=args.bound,
    )
    before = (saved.evaluation or {}).get("step_time_s")
    if args.format == "table" and before is not None:
        change = (ev.step_time_s - before) / before if before else 0.0
        same = abs(change) <= 1e-12
        print(
            f"saved step time      {format_time(before)}"
            + ("  (re-priced: the same)" if same else f"  (re-priced here: {change:+.3%})")
        )
    return 0


def _pipeline_for(saved, problem, where: str):
    """The saved pipeline plan, checked against ``problem`` (same layers, the stages' nodes and groups)."""
    from parplan.costmodel.planio import check_plan_fits, stage_nodes
    from parplan.costmodel.stages import check_pipeline, stage_problem

    layers = list(problem.graph.analyze().order)
    if layers != list(saved.problem.get("layers", [])):
        raise ConfigError(
            f"{where}: made for a model with other layers ({len(saved.problem.get('layers', []))} "
            f"layers; this one has {len(layers)})"
        )
    check_pipeline(problem, saved.pipeline)
    for s, (stage, names) in enumerate(
        zip(saved.pipeline.stages, stage_nodes(problem, saved.pipeline))
    ):
        sub = stage_problem(problem, stage.first, stage.last, stage.group)
        check_plan_fits(sub, names, stage.plan, f"{where}, stage {s}")
    return saved.pipeline


def _evaluate_pipeline(args: argparse.Namespace, saved, problem, where: str) -> int:
    from parplan.costmodel.stages import evaluate_pipeline
    from parplan.reporting.report import format_time
    from parplan.reporting.stages import pipeline_dict, pipeline_text

    for flag, given in (("--bound", args.bound),):
        if given:
            raise ConfigError(f"{flag} does not apply to a pipeline plan")
    plan = _pipeline_for(saved, problem, where)
    ev = evaluate_pipeline(problem, plan)
    limit = memory_limit(args.memory_limit)
    if args.format == "json":
        print(
            json.dumps(
                {**pipeline_dict(problem, plan, ev), "saved_evaluation": saved.evaluation},
                indent=2,
                default=str,
            )
        )
    elif args.format == "csv":
        import pandas as pd

        print(pd.DataFrame(pipeline_dict(problem, plan, ev)["stages"]).to_csv(index=False), end="")
    else:
        print(pipeline_text(problem, plan, ev))
        before = (saved.evaluation or {}).get("step_time_s")
        if before is not None:
            change = (ev.step_time_s - before) / before if before else 0.0
            print(
                f"saved step time      {format_time(before)}"
                + (
                    "  (re-priced: the same)"
                    if abs(change) <= 1e-12
                    else f"  (re-priced here: {change:+.3%})"
                )
            )
    _warn_pipeline_overruns(problem, ev, limit, "")
    return 0


def _warn_pipeline_overruns(problem, ev, limit, context: str) -> None:
    """One warning line when devices of a priced pipeline plan exceed their memory (the worst
    named; :func:`parplan.costmodel.evaluate.memory_overruns` reads the plan's per-device needs)."""
    from parplan.costmodel.evaluate import memory_overruns
    from parplan.reporting.report import format_bytes

    over = memory_overruns(problem, ev, None if limit in (None, "device") else limit)
    if over:
        path, kind, need, cap = over[0]
        print(
            f"parplan: warning: {len(over)} of {problem.array.count} devices exceed their memory{context}; worst: "
            f"device {path} ({kind}) needs {format_bytes(need)} of {format_bytes(cap)}",
            file=sys.stderr,
        )


def _evaluate_config(args: argparse.Namespace) -> int:
    """``evaluate --config``: a Megatron-LM / torchtitan configuration priced as a parplan plan,
    with ``--gap`` its distance to the best plan found and (one stage) to the proven bound."""
    from parplan.costmodel.evaluate import memory_overruns
    from parplan.costmodel.stages import evaluate_pipeline
    from parplan.pipeline.configs import config_plan, read_config
    from parplan.reporting.report import format_time
    from parplan.reporting.stages import pipeline_dict, pipeline_text

    if args.model is None or args.array is None:
        raise ConfigError(
            "evaluate --config needs --model and --array (the run the configuration is for)"
        )
    if args.bound:
        raise ConfigError("--bound goes with --plan; with --config, --gap reports the bound")
    config = read_config(args.config)
    if args.tensor_plan is not None:
        from dataclasses import replace as _replace

        from parplan.pipeline.configs import read_tensor_plan

        config = _replace(config, styles=read_tensor_plan(args.tensor_plan))
    problem, plan = config_plan(_problem_for(args, {}), config)
    ev = evaluate_pipeline(problem, plan)
    if args.save:
        _save_config_plan(args, problem, plan, ev)
    limit = memory_limit(args.memory_limit)
    over = memory_overruns(problem, ev, None if limit in (None, "device") else limit)
    record = {
        **pipeline_dict(problem, plan, ev),
        "config": plan.info["config"],
        "fits": not over,
        "inputs": run_inputs(args),
    }
    if args.gap:
        from parplan.costmodel.evaluate import evaluate
        from parplan.pipeline.partitioned import plan_partitioned

        best = plan_partitioned(
            problem,
            "accpar",
            limit_bytes=None if limit in (None, "device") else limit,
            progress=progress_printer(False, after_s=5.0),
        )
        record.update(
            best_step_time_s=best.evaluation.step_time_s,
            best_stages=len(best.plan.stages),
            best_setting=f"m={best.problem.micro_batches}, zero-{best.problem.zero_stage}"
            + (f", recompute per {best.problem.checkpoint}" if best.problem.recompute else ""),
            gap_to_best=ev.step_time_s / best.evaluation.step_time_s - 1.0,
        )
        if len(plan.stages) == 1:
            one = evaluate(problem, plan.stages[0].plan)
            assert abs(one.step_time_s - ev.step_time_s) <= 1e-9 * ev.step_time_s
            figures = bound_figures(
                problem, one, plan=plan.stages[0].plan
            )  # and where the configuration loses: each layer's own bound
            bound = figures["global_bound_s"]
            record.update(
                bound_s=bound,
                gap_to_bound=ev.step_time_s / bound - 1.0,
                layer_bounds=figures["layer_bounds"],
                per_layer_bound_s=figures["per_layer_bound_s"],
            )
    if args.format == "json":
        print(json.dumps(record, indent=2, default=str))
    elif args.format == "csv":
        import pandas as pd

        frame = pd.DataFrame(record["stages"])
        for key in (
            "model",
            "array",
            "batch",
            "config",
            "step_time_s",
            "fits",
            "best_step_time_s",
            "gap_to_best",
            "bound_s",
            "gap_to_bound",
        ):
            if key in record:
                frame[key] = record[key]
        print(frame.to_csv(index=False), end="")
    else:
        print(f"configuration: {plan.info['config']} ({config.source})")
        print(pipeline_text(problem, plan, ev))
        if "best_step_time_s" in record:
            print(
                f"best plan found      {format_time(record['best_step_time_s'])} ({record['best_stages']} stage"
                f"{'s' * (record['best_stages'] != 1)}, {record['best_setting']}; plan --pipeline): the "
                f"configuration is {record['gap_to_best']:+.1%}"
            )
        if "bound_s" in record:
            print(
                f"proven bound         {format_time(record['bound_s'])} (every partition plan of this array at "
                f"the configuration's settings): gap {record['gap_to_bound']:.1%}"
            )
            layers = layer_bound_lines(record["layer_bounds"], record["per_layer_bound_s"])
            if layers:
                print("where it loses:\n" + "\n".join(layers))
    _warn_pipeline_overruns(problem, ev, limit, " under this configuration")
    return 0


def _save_config_plan(args: argparse.Namespace, problem, plan, ev) -> None:
    """``evaluate --config --save``: one stage as a partition plan file, else a pipeline plan file
    (docs/planfile.md), the configuration recorded under ``options``."""
    from dataclasses import replace

    from parplan.costmodel.planio import pipeline_document, plan_document, write_plan_file

    path = output_path(args.save, "--save")
    evaluation = {
        "step_time_s": ev.step_time_s,
        "peak_device_memory_bytes": ev.peak_memory_bytes,
    }
    if len(plan.stages) == 1:
        one = plan.stages[0].plan
        doc = plan_document(
            problem,
            replace(one, info={**one.info, "config": plan.info["config"]}),
            problem_source(args),
            evaluation=evaluation,
        )
    else:
        doc = pipeline_document(problem, plan, problem_source(args), evaluation=evaluation)
    write_plan_file(path, doc)
    print(f"wrote {path}", file=sys.stderr)


def _diff_pipelines(args: argparse.Namespace, fa, fb) -> int:
    from parplan.costmodel.stages import evaluate_pipeline
    from parplan.reporting.report import format_time

    if fa.pipeline is None or fb.pipeline is None:
        raise ConfigError(
            f"plan files '{args.a}' and '{args.b}': diff compares two partition plans or two "
            "pipeline plans, not one of each"
        )
    # each plan on its own record (its micro-batches, ZeRO stage, recomputation), with the same overrides
    problem, other = _problem_for(args, dict(fa.problem)), _problem_for(args, dict(fb.problem))
    a = _pipeline_for(fa, problem, f"plan file '{args.a}'")
    b = _pipeline_for(fb, other, f"plan file '{args.b}'")
    ta, tb = evaluate_pipeline(problem, a).step_time_s, evaluate_pipeline(other, b).step_time_s
    order = problem.graph.analyze().order

    def setting(p, plan) -> str:
        n = len(plan.stages)
        return (
            f"{n} stage{'s' * (n != 1)}, {plan.schedule}, m={p.micro_batches}, zero-{p.zero_stage}"
            + (f", recompute per {p.checkpoint}" if p.recompute else "")
        )

    print(f"{problem.graph.name} on {problem.array.describe()}, batch {problem.batch}")
    print(f"  a: {args.a}  {setting(problem, a)}  step {format_time(ta)}")
    print(
        f"  b: {args.b}  {setting(other, b)}  step {format_time(tb)}  ({(tb - ta) / ta:+.3%} vs a)"
    )
    same = True
    for s in range(max(len(a.stages), len(b.stages))):
        sa = a.stages[s] if s < len(a.stages) else None
        sb = b.stages[s] if s < len(b.stages) else None
        text = lambda st: (
            "-" if st is None else f"{order[st.first]} .. {order[st.last]} on {st.group or 'root'}"
        )  # noqa: E731
        if (
            sa is not None
            and sb is not None
            and (sa.first, sa.last, sa.group) == (sb.first, sb.last, sb.group)
        ):
            cells = _cells(sa.plan, sb.plan) if set(sa.plan.splits) == set(sb.plan.splits) else None
            if cells == []:
                continue
            same = False
            print(
                f"  stage {s}: {text(sa)}: "
                + (f"{len(cells)} cells differ" if cells else "other splits")
            )
        else:
            same = False
            print(f"  stage {s}: a {text(sa)} | b {text(sb)}")
    if same and a.schedule == b.schedule:
        print("the plans are identical")
    return 0


def _cells(a, b) -> list[tuple[str, int]]:
    return [
        (path, v)
        for path in sorted(a.splits, key=lambda p: (len(p), p))
        for v, (ca, sa, cb, sb) in enumerate(
            zip(
                a.splits[path].choices,
                a.splits[path].shares,
                b.splits[path].choices,
                b.splits[path].shares,
            )
        )
        if ca is not cb or sa != sb
    ]


def cmd_diff(args: argparse.Namespace) -> int:
    from parplan.costmodel.evaluate import evaluate
    from parplan.costmodel.planio import check_plan_fits, read_plan_file
    from parplan.costmodel.problem import Plan, Split
    from parplan.reporting.report import format_time, time_unit

    if args.limit < 1:
        raise ConfigError(f"--limit must be >= 1 (got {args.limit})")
    fa, fb = read_plan_file(args.a), read_plan_file(args.b)
    if fa.pipeline is not None or fb.pipeline is not None:
        return _diff_pipelines(args, fa, fb)
    if fa.nodes != fb.nodes:
        raise ConfigError(
            f"plan files '{args.a}' and '{args.b}' are for different layers "
            f"({len(fa.nodes)} vs {len(fb.nodes)} planning nodes); diff compares plans of one model"
        )
    if set(fa.plan.splits) != set(fb.plan.splits):
        raise ConfigError(
            f"plan files '{args.a}' and '{args.b}' are for arrays with different trees of groups "
            f"({len(fa.plan.splits)} vs {len(fb.plan.splits)} splits)"
        )
    problem = _problem_for(args, dict(fa.problem))
    check_plan_fits(problem, fa.nodes, fa.plan, f"plan file '{args.a}'")
    ta, tb = evaluate(problem, fa.plan).step_time_s, evaluate(problem, fb.plan).step_time_s
    cells = _cells(fa.plan, fb.plan)
    nodes = fa.nodes
    print(f"{problem.graph.name} on {problem.array.describe()}, batch {problem.batch}")
    print(f"  a: {args.a} ({fa.plan.planner or '?'})  step {format_time(ta)}")
    print(
        f"  b: {args.b} ({fb.plan.planner or '?'})  step {format_time(tb)}  ({(tb - ta) / ta:+.3%} vs a)"
    )
    if not cells:
        print("the plans are identical")
        return 0
    print(
        f"{len(cells)} cell{'s' * (len(cells) != 1)} differ (split, layer: a -> b; cost = a's step time with "
        "that one cell taken from b, minus a's):"
    )
    shown = cells if args.all or len(cells) <= args.limit else cells[: args.limit]
    deltas = []
    for path, v in shown:
        sa, sb = fa.plan.splits[path], fb.plan.splits[path]
        swapped = dict(fa.plan.splits)
        choices, shares = list(sa.choices), list(sa.shares)
        choices[v], shares[v] = sb.choices[v], sb.shares[v]
        swapped[path] = Split(tuple(choices), tuple(shares))
        deltas.append(evaluate(problem, Plan(swapped, fa.plan.planner)).step_time_s - ta)
    unit, factor = time_unit(max((abs(d) for d in deltas), default=0.0))  # one unit for the column
    width = max(len(nodes[v]) for _, v in shown)
    moves = [
        f"{fa.plan.splits[p].choices[v].value}@{fa.plan.splits[p].shares[v]:.3f} -> "
        f"{fb.plan.splits[p].choices[v].value}@{fb.plan.splits[p].shares[v]:.3f}"
        for p, v in shown
    ]
    move_width = max(map(len, moves))
    for (path, v), move, delta in zip(shown, moves, deltas):
        level = f"level {len(path) + 1} {path or 'root'}"
        print(
            f"  {level:<16} {nodes[v]:<{width}} {move:<{move_width}} {delta * factor:+10.3f} {unit}"
        )
    if len(shown) < len(cells):
        print(f"  ... {len(cells) - len(shown)} more (--all to list every cell)")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    import pandas as pd

    from parplan.costmodel.evaluate import evaluate
    from parplan.costmodel.planio import parplan_version
    from parplan.solvers.planners import PLANNERS, make_plan

    names = (
        list(COMPARE_ALL)
        if args.planners.strip().lower() == "all"
        else [n.strip().lower() for n in args.planners.split(",") if n.strip()]
    )
    unknown = [n for n in names if n not in PLANNERS]
    if unknown or not names:
        raise ConfigError(
            f"--planners: unknown planner(s) {', '.join(unknown) or '(none given)'}; "
            f"valid: {', '.join(PLANNER_NAMES)} or 'all'"
        )
    csv_path = output_path(args.csv, "--csv") if args.csv else None
    plot_path = output_path(args.plot, "--plot") if args.plot else None
    problem = problem_from_args(args)
    progress = progress_printer(args.verbose)
    base = data_parallel_baseline(problem).step_time_s
    rows = []
    limit = memory_limit(args.memory_limit)
    fitting = plans_against_memory(args)
    for name in names:
        t0 = time.perf_counter()
        if fitting:  # each planner's fastest plan that fits (docs/costmodel.md section 6.2)
            from parplan.errors import InfeasibleError
            from parplan.solvers.fit import fit_plan

            try:
                fit = fit_plan(
                    problem,
                    name,
                    None if limit in (None, "device") else limit,
                    progress=progress or progress_printer(False, after_s=5.0),
                    plan_kwargs={"share_grid": args.share_grid},
                    **technique_choices(args),
                )
            except InfeasibleError as exc:
                rows.append(
                    {
                        "planner": name,
                        "step_time_s": float("nan"),
                        "speedup_over_data": float("nan"),
                        "communication_bytes": float("nan"),
                        "peak_memory_bytes": float("nan"),
                        "planning_s": time.perf_counter() - t0,
                        "zero_stage": None,
                        "recompute": None,
                        "checkpoint": None,
                        "micro_batches": None,
                        "fits": False,
                    }
                )
                print(f"parplan: {name}: {exc}", file=sys.stderr)
                continue
            p, plan = fit.problem, fit.plan
        else:
            p, plan = (
                problem,
                make_plan(problem, name, share_grid=args.share_grid, progress=progress),
            )
        wall = time.perf_counter() - t0
        ev = evaluate(p, plan)
        rows.append(
            {
                "planner": name,
                "step_time_s": ev.step_time_s,
                "speedup_over_data": base / ev.step_time_s,
                "communication_bytes": ev.communication_bytes,
                "peak_memory_bytes": ev.peak_memory_bytes,
                "planning_s": wall,
                "zero_stage": p.zero_stage,
                "recompute": p.recompute,
                "checkpoint": p.checkpoint,
                "micro_batches": p.micro_batches,
                "fits": fitting or None,
            }
        )
        if progress:
            progress(f"{name}: {ev.step_time_s * 1e3:.4g} ms ({wall:.2f} s)")
    frame = pd.DataFrame(rows)
    meta = {
        "model": problem.graph.name,
        "array": problem.array.describe(),
        "devices": problem.array.count,
        "batch": problem.batch,
        "parplan_version": parplan_version(),
        **run_inputs(args),
    }
    if args.format == "json":
        print(json.dumps({**meta, "rows": rows}, indent=2))
    elif args.format == "csv":
        print(frame.assign(**meta).to_csv(index=False), end="")
    else:
        print(compare_text(frame, meta))
    if csv_path:
        frame.assign(**meta).to_csv(csv_path, index=False)
        print(f"wrote {csv_path}", file=sys.stderr)
    if plot_path:
        from parplan.reporting.plot import plot_compare

        plot_compare(frame, meta, plot_path)
        print(f"wrote {plot_path}", file=sys.stderr)
    return 0


def compare_text(frame, meta: dict) -> str:
    """The compare table, in units chosen for its largest value."""
    from parplan.reporting.report import byte_unit, time_unit

    tu, tf = time_unit(frame.step_time_s.max())
    cu, cf = byte_unit(frame.communication_bytes.max())
    mu, mf = byte_unit(frame.peak_memory_bytes.max())
    pu, pf = time_unit(frame.planning_s.max())
    lines = [
        f"{meta['model']} on {meta['array']} ({meta['devices']} devices), batch {meta['batch']}",
        "",
        f"{'planner':<16} {'step ' + tu:>11} {'speedup':>8} {'comm ' + cu:>11} {'peak mem ' + mu:>12} "
        f"{'planning ' + pu:>12} {'ZeRO':>5} {'recomp':>6} {'micro':>5}",
    ]
    for r in frame.itertuples():
        if r.fits is False:
            lines.append(f"{r.planner:<16} {'no plan found that fits the memory (see above)':>58}")
            continue
        lines.append(
            f"{r.planner:<16} {r.step_time_s * tf:>11.3f} {r.speedup_over_data:>7.2f}x "
            f"{r.communication_bytes * cf:>11.2f} {r.peak_memory_bytes * mf:>12.2f} {r.planning_s * pf:>12.2f} "
            f"{r.zero_stage:>5} {r.checkpoint if r.recompute else 'no':>6} {r.micro_batches:>5}"
        )
    lines.append("")
    lines.append(
        "speedup: data parallelism's step time (memory ignored) / the planner's; comm: bytes received per "
        "step over all levels; ZeRO, recomp(utation: per block or layer, or no), micro(-batches): "
        "what the plan needs to fit (docs/costmodel.md section 6)"
    )
    return "\n".join(lines)


def add_plan_parsers(sub) -> None:
    """Register ``plan``, ``evaluate``, ``diff`` and ``compare``."""
    p = sub.add_parser("plan", help="plan a model on an array with a planner (fast DP path)")
    add_problem_arguments(p)
    p.add_argument(
        "--planner", default="accpar", help=f"one of: {', '.join(PLANNER_NAMES)} (default accpar)"
    )
    p.add_argument(
        "--objective", default=None, help="time | communication (default: the planner's)"
    )
    p.add_argument(
        "--shares", default=None, help="free | half | proportional (default: the planner's)"
    )
    p.add_argument("--format", default="table", choices=("table", "json", "csv"))
    p.add_argument(
        "--plot", default=None, metavar="PNG", help="also draw the plan to this PNG file"
    )
    p.add_argument(
        "--save",
        default=None,
        metavar="JSON",
        help="write the plan file (re-price with 'parplan evaluate')",
    )
    p.add_argument(
        "--polish",
        action="store_true",
        help="then improve the plan by multi-level moves priced by the evaluator (swap a layer's types "
        "between levels, retype, reshare; slower: seconds on 16 devices)",
    )
    p.add_argument(
        "--continuous-shares",
        action="store_true",
        help="shares anywhere in [0, 1], each split proven optimal by branch-and-bound over share "
        "intervals (the top-down recursion; needs --ignore-memory; docs/costmodel.md section 8)",
    )
    _bound_argument(p)
    add_memory_arguments(p)
    p.add_argument(
        "--pipeline",
        action="store_true",
        help="pipeline x partition x data: stages of layers on groups of the array, each partitioned by "
        "the planner (docs/pipeline.md); the one-stage plan is among the candidates",
    )
    p.add_argument(
        "--schedule",
        default="1f1b",
        choices=("1f1b", "gpipe"),
        help="with --pipeline: the pipeline schedule (default 1f1b)",
    )
    p.add_argument(
        "--max-stages",
        type=int,
        default=None,
        metavar="N",
        help="with --pipeline: at most N stages (default: as many as the array's tree allows)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="progress messages on stderr")
    p.set_defaults(func=cmd_plan)

    e = sub.add_parser(
        "evaluate",
        help="re-price a saved plan (optionally on another array, bandwidth or batch), "
        "or price a parallel configuration (--config)",
    )
    e.add_argument("--plan", default=None, metavar="JSON", help="plan file written by --save")
    e.add_argument(
        "--config",
        default=None,
        metavar="SPEC",
        help="price a Megatron-LM / torchtitan style configuration instead: a .toml / .json file or "
        "key=value pairs such as tp=4,dp=4,zero=1,recompute=yes,mbs=1 (docs/interop.md); needs "
        "--model and --array",
    )
    e.add_argument(
        "--tensor-plan",
        default=None,
        metavar="SPEC",
        help="with --config: a torch parallelize_module plan for the tensor levels (module patterns -> "
        "colwise/rowwise) in a .toml/.json file, or file.py:NAME (a dict of torch styles); default: "
        "Megatron-LM's column/row pairing (docs/interop.md)",
    )
    e.add_argument(
        "--gap",
        action="store_true",
        help="with --config: also the best plan parplan finds (plan --pipeline) and the config's gap to "
        "it; with one stage, the gap to the proven bound over partition plans",
    )
    e.add_argument(
        "--save",
        default=None,
        metavar="JSON",
        help="with --config: write the configuration as a plan file (for export, run, diff, certify)",
    )
    _override_arguments(e)
    e.add_argument("--format", default="table", choices=("table", "json", "csv"))
    _bound_argument(e)
    _memory_argument(e)
    e.set_defaults(func=cmd_evaluate)

    d = sub.add_parser("diff", help="where two saved plans differ and what each difference costs")
    d.add_argument("a", metavar="A.json")
    d.add_argument("b", metavar="B.json")
    _override_arguments(d)
    d.add_argument("--limit", type=int, default=40, help="cells to list (default 40)")
    d.add_argument("--all", action="store_true", help="list every differing cell")
    d.set_defaults(func=cmd_diff)

    c = sub.add_parser(
        "compare", help="several planners on one problem: one table (optional CSV and plot)"
    )
    add_problem_arguments(c)
    c.add_argument(
        "--planners",
        default="accpar,hypar,owt,data",
        help=f"comma-separated ({', '.join(PLANNER_NAMES)}) or 'all' (default accpar,hypar,owt,data)",
    )
    c.add_argument("--format", default="table", choices=("table", "json", "csv"))
    c.add_argument("--csv", default=None, metavar="FILE", help="also write the table as CSV")
    c.add_argument(
        "--plot", default=None, metavar="PNG", help="also draw step time and speedup per planner"
    )
    add_memory_arguments(c)
    c.add_argument("-v", "--verbose", action="store_true", help="progress messages on stderr")
    c.set_defaults(func=cmd_compare)


def _bound_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bound",
        action="store_true",
        help="also compute the global lower bound over every plan of the array and the plan's gap to "
        "it, with the layers furthest above their own bound (seconds on 128 devices)",
    )


def _memory_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--memory-limit",
        default=None,
        metavar="GiB",
        help="warn when a device needs more than this many GiB (default: each device's own memory)",
    )


def _override_arguments(p: argparse.ArgumentParser) -> None:
    """Problem options that default to what the plan file records."""
    p.add_argument("--model", default=None, help="model (default: the one the plan was made for)")
    p.add_argument(
        "--array",
        default=None,
        help="array (default: the plan's); it must have the same tree of groups",
    )
    p.add_argument("--batch", type=int, default=None, help="global batch (default: the plan's)")
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
        "--fabric",
        default=None,
        choices=("devices", "papers"),
        help="links as the device kinds' fabric gives them or one per split (default: the plan's)",
    )
    p.add_argument(
        "--bytes-per-element",
        type=float,
        default=None,
        help="bytes per element (default: the plan's)",
    )
    p.add_argument(
        "--optimizer-bytes",
        type=float,
        default=None,
        metavar="B",
        help="optimizer bytes per parameter (default: the plan's)",
    )
    p.add_argument("--devices", default=None, metavar="FILE", help="extra device kinds (TOML)")
    p.add_argument(
        "--compat",
        default=None,
        choices=COMPAT_CHOICES,
        help="price with HyPar's rule (default: the plan's)",
    )
    p.add_argument(
        "--zero",
        default=None,
        choices=("0", "1", "2", "3"),
        help="ZeRO stage (default: the plan's)",
    )
    p.add_argument(
        "--recompute",
        default=None,
        choices=("yes", "no"),
        help="recomputation (default: the plan's)",
    )
    p.add_argument(
        "--micro-batches",
        default=None,
        metavar="N",
        help="micro-batches per step (default: the plan's)",
    )
    p.add_argument(
        "--overlap",
        default=None,
        choices=("yes", "no"),
        help="weight traffic alongside compute (default: the plan's)",
    )
    p.add_argument("--share-grid", type=int, default=16, help=argparse.SUPPRESS)


__all__ = ["add_plan_parsers", "cmd_compare", "cmd_diff", "cmd_evaluate", "cmd_plan"]
