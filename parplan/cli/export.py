"""``parplan export``: a plan as PyTorch's DeviceMesh and DTensor placements (docs/interop.md,
"Export to PyTorch")."""

from __future__ import annotations

import argparse
import json
import sys

from parplan.cli.common import PLANNER_NAMES, model_spec, output_path
from parplan.errors import ConfigError


def _written(args: argparse.Namespace, out: dict, script) -> bool:
    """Write ``out`` to ``--out`` (JSON, or ``script()`` for a .py name where there is one) and
    print it with ``--format json``; True when the JSON was the output."""
    if args.out:
        path = output_path(args.out, "--out")
        if str(path).endswith(".py"):
            if script is None:
                raise ConfigError(
                    "export: a pipeline plan exports as JSON (--out FILE.json); training scripts "
                    "cover partition plans, and `parplan run --runtime torch` runs pipeline plans"
                )
            text = script()  # before the file is opened: a refusal leaves no empty file
        else:
            text = json.dumps(out, indent=2)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"wrote {path}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(out, indent=2))
        return True
    return False


def cmd_export(args: argparse.Namespace) -> int:
    from parplan.cli.run import _problem_and_plan
    from parplan.costmodel.evaluate import evaluate
    from parplan.executor.export import nearest_plan, torch_export
    from parplan.reporting.report import format_time

    if args.batch is None and not args.plan:
        args.batch = 512
    if args.plan:
        from parplan.costmodel.planio import read_plan_file

        saved = read_plan_file(args.plan)
        if saved.pipeline is not None:
            return _export_pipeline(args, saved)
    spec = model_spec(args, saved if args.plan else None)
    problem, plan, source = _problem_and_plan(args)
    export = torch_export(problem, plan)
    near = None
    if not export.expressible or args.nearest:
        near = nearest_plan(problem, plan)
        priced = (evaluate(problem, plan).step_time_s, evaluate(problem, near).step_time_s)
    if args.nearest:
        export = torch_export(problem, near)
    chosen = near if args.nearest else plan
    out = export.to_dict()
    out.update(
        {
            "model": problem.graph.name,
            "array": problem.array.describe(),
            "batch": problem.batch,
            "source": source + (" (nearest plan torch can express)" if args.nearest else ""),
        }
    )
    if near is not None:
        out["step_time_s"] = {"plan": priced[0], "nearest": priced[1]}
    if _written(args, out, lambda: _script(problem, chosen, spec, export)):
        return 0 if export.expressible else 1
    print(
        f"{out['source']}: {problem.graph.name} on {problem.array.describe()}, batch {problem.batch}; "
        f"DeviceMesh {export.mesh_shape} dims {', '.join(export.mesh_dim_names)} (l1 = the root split)"
    )
    width = max([12, *(len(e.name) for e in export.layers)])
    print(f"{'layer':<{width}} {'kind':<10} {'choices':<18} {'weight placements':<28} style")
    for e in export.layers:
        weight = "[" + ", ".join(e.weight) + "]" if e.weight else "-"
        print(f"{e.name:<{width}} {e.kind:<10} {'/'.join(e.choices):<18} {weight:<28} {e.style}")
    if export.zero_stage:
        print(
            f"ZeRO-{export.zero_stage}: fully_shard (FSDP2) each layer over the mesh dims where it is batch "
            "(the JSON's fully_shard_over)"
        )
    for note in export.notes:
        print(f"note: {note}")
    if not export.expressible:
        print(f"\ntorch cannot express {len(export.refusals)} part(s) of this plan:")
        for layer, path, reason in export.refusals:
            print(f"  {layer} at split {path or 'root'}: {reason}")
    if near is not None:
        print(
            f"\nnearest plan torch can express (every share 1/2, one choice per level, convolutions by the batch): "
            f"{format_time(priced[1])} against the plan's {format_time(priced[0])} "
            f"({(priced[1] / priced[0] - 1) * 100:+.1f}%); `--nearest` exports it, `parplan run --runtime torch "
            "--nearest` runs it"
        )
    return 0 if export.expressible or args.nearest else 1


def _script(problem, plan, spec, export) -> str:
    """``--out FILE.py``: the training script for a model that is a PyTorch module
    (docs/interop.md "A training script"), else the placements of every weight."""
    from parplan.models.importers.external import is_module_spec

    if spec is not None and is_module_spec(spec):
        from parplan.executor.script import training_script

        return training_script(problem, plan, spec)
    return export.script()


def _export_pipeline(args: argparse.Namespace, saved) -> int:
    """A pipeline plan file: the stages for torch.distributed.pipelining, each stage's plan as
    placements on its group (docs/interop.md "Pipeline plans")."""
    from parplan.cli.plans import _pipeline_for, _problem_for
    from parplan.executor.export import pipeline_export

    if args.nearest:
        raise ConfigError(
            "export: --nearest applies to partition plans; export a pipeline stage by stage"
        )
    problem = _problem_for(args, dict(saved.problem))
    plan = _pipeline_for(saved, problem, f"plan file '{args.plan}'")
    export = pipeline_export(problem, plan)
    out = {
        **export.to_dict(),
        "model": problem.graph.name,
        "array": problem.array.describe(),
        "batch": problem.batch,
        "source": f"plan file {args.plan}",
    }
    if _written(args, out, None):
        return 0 if export.expressible else 1
    print(
        f"plan file {args.plan}: {problem.graph.name} on {problem.array.describe()}, batch {problem.batch}; "
        f"torch.distributed.pipelining: {len(export.stages)} stages, {export.schedule}, "
        f"n_microbatches={export.micro_batches}"
    )
    print("split points (SplitPoint.BEGINNING): " + (", ".join(export.split_points) or "none"))
    for k, st in enumerate(export.stages):
        e = st.export
        where = (
            f"ranks {st.ranks[0]}-{st.ranks[-1]}" if len(st.ranks) > 1 else f"rank {st.ranks[0]}"
        )
        mesh = (
            "one device"
            if e is not None and not e.mesh_shape
            else (f"mesh {e.mesh_shape}" if e is not None else "no mesh")
        )
        styles = (
            sorted({layer.style for layer in e.layers if layer.weight}) if e is not None else []
        )
        print(
            f"stage {k}: {st.layers[0]} .. {st.layers[-1]} ({len(st.layers)} layers) on {where}, {mesh}"
            + ("; " + "; ".join(styles) if styles else "; " + st.refusal if st.refusal else "")
        )
        for layer, path, reason in e.refusals if e is not None else ():
            print(f"    cannot express {layer} at split {path or 'root'}: {reason}")
    for note in export.notes:
        print(f"note: {note}")
    return 0 if export.expressible else 1


def add_export_parser(sub) -> None:
    e = sub.add_parser(
        "export", help="a plan as PyTorch DeviceMesh + DTensor placements (docs/interop.md)"
    )
    e.add_argument(
        "--plan", default=None, metavar="JSON", help="a saved plan (parplan plan --save)"
    )
    e.add_argument(
        "--model", default=None, help="without --plan: the model to plan (or the plan file's)"
    )
    e.add_argument("--array", default=None, help="without --plan: the array (2^d devices)")
    e.add_argument(
        "--planner", default="accpar", help=f"without --plan: one of {', '.join(PLANNER_NAMES)}"
    )
    e.add_argument(
        "--batch", type=int, default=None, help="global batch (default 512, or the plan's)"
    )
    e.add_argument(
        "--to", default="torch", choices=("torch",), help="target (torch: DTensor placements)"
    )
    e.add_argument(
        "--nearest", action="store_true", help="export the nearest plan torch can express instead"
    )
    e.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="also write it: .py a script (a training script for file.py:factory, hf: and tv: "
        "models; else the placements), other names JSON",
    )
    e.add_argument("--format", default="table", choices=("table", "json"))
    e.add_argument("--bandwidth", type=float, default=None, metavar="GB/s", help=argparse.SUPPRESS)
    e.add_argument("--latency", type=float, default=None, metavar="us", help=argparse.SUPPRESS)
    e.add_argument("--bytes-per-element", type=float, default=None, help=argparse.SUPPRESS)
    e.add_argument("--optimizer-bytes", type=float, default=None, help=argparse.SUPPRESS)
    e.add_argument("--devices", default=None, metavar="FILE", help="extra device kinds (TOML)")
    e.add_argument(
        "--share-grid",
        type=int,
        default=16,
        metavar="G",
        help="share grid of the planner (default 16)",
    )
    e.set_defaults(func=cmd_export, compat=None)


__all__ = ["add_export_parser", "cmd_export"]
