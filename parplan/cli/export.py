"""``parplan export``: a plan as PyTorch's DeviceMesh and DTensor placements (docs/interop.md,
"Export to PyTorch")."""

from __future__ import annotations

import argparse
import json
import sys

from parplan.cli.common import PLANNER_NAMES, output_path


def cmd_export(args: argparse.Namespace) -> int:
    from parplan.cli.run import _problem_and_plan
    from parplan.costmodel.evaluate import evaluate
    from parplan.executor.export import nearest_plan, torch_export
    from parplan.reporting.report import format_time

    if args.batch is None and not args.plan:
        args.batch = 512
    problem, plan, source = _problem_and_plan(args)
    export = torch_export(problem, plan)
    near = None
    if not export.expressible or args.nearest:
        near = nearest_plan(problem, plan)
        priced = (evaluate(problem, plan).step_time_s, evaluate(problem, near).step_time_s)
    if args.nearest:
        export = torch_export(problem, near)
    out = export.to_dict()
    out.update({"model": problem.graph.name, "array": problem.array.describe(), "batch": problem.batch,
                "source": source + (" (nearest plan torch can express)" if args.nearest else "")})
    if near is not None:
        out["step_time_s"] = {"plan": priced[0], "nearest": priced[1]}
    if args.out:
        path = output_path(args.out, "--out")
        with open(path, "w", encoding="utf-8") as fh:
            if str(path).endswith(".py"):
                fh.write(export.script())
            else:
                json.dump(out, fh, indent=2)
        print(f"wrote {path}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(out, indent=2))
        return 0 if export.expressible else 1
    print(f"{out['source']}: {problem.graph.name} on {problem.array.describe()}, batch {problem.batch}; "
          f"DeviceMesh {export.mesh_shape} dims {', '.join(export.mesh_dim_names)} (l1 = the root split)")
    width = max([12, *(len(e.name) for e in export.layers)])
    print(f"{'layer':<{width}} {'kind':<10} {'choices':<18} {'weight placements':<28} style")
    for e in export.layers:
        weight = "[" + ", ".join(e.weight) + "]" if e.weight else "-"
        print(f"{e.name:<{width}} {e.kind:<10} {'/'.join(e.choices):<18} {weight:<28} {e.style}")
    if export.zero_stage:
        print(f"ZeRO-{export.zero_stage}: fully_shard (FSDP2) each layer over the mesh dims where it is batch "
              "(the JSON's fully_shard_over)")
    for note in export.notes:
        print(f"note: {note}")
    if not export.expressible:
        print(f"\ntorch cannot express {len(export.refusals)} part(s) of this plan:")
        for layer, path, reason in export.refusals:
            print(f"  {layer} at split {path or 'root'}: {reason}")
    if near is not None:
        print(f"\nnearest plan torch can express (every share 1/2, one choice per level, convolutions by the batch): "
              f"{format_time(priced[1])} against the plan's {format_time(priced[0])} "
              f"({(priced[1] / priced[0] - 1) * 100:+.1f}%); `--nearest` exports it, `parplan run --runtime torch "
              "--nearest` runs it")
    return 0 if export.expressible or args.nearest else 1


def add_export_parser(sub) -> None:
    e = sub.add_parser("export", help="a plan as PyTorch DeviceMesh + DTensor placements (docs/interop.md)")
    e.add_argument("--plan", default=None, metavar="JSON", help="a saved plan (parplan plan --save)")
    e.add_argument("--model", default=None, help="without --plan: the model to plan (or the plan file's)")
    e.add_argument("--array", default=None, help="without --plan: the array (2^d devices)")
    e.add_argument("--planner", default="accpar", help=f"without --plan: one of {', '.join(PLANNER_NAMES)}")
    e.add_argument("--batch", type=int, default=None, help="global batch (default 512, or the plan's)")
    e.add_argument("--to", default="torch", choices=("torch",), help="target (torch: DTensor placements)")
    e.add_argument("--nearest", action="store_true", help="export the nearest plan torch can express instead")
    e.add_argument("--out", default=None, metavar="FILE", help="also write it: .py a script, else JSON")
    e.add_argument("--format", default="table", choices=("table", "json"))
    e.add_argument("--bandwidth", type=float, default=None, metavar="GB/s", help=argparse.SUPPRESS)
    e.add_argument("--latency", type=float, default=None, metavar="us", help=argparse.SUPPRESS)
    e.add_argument("--bytes-per-element", type=float, default=None, help=argparse.SUPPRESS)
    e.add_argument("--optimizer-bytes", type=float, default=None, help=argparse.SUPPRESS)
    e.add_argument("--devices", default=None, metavar="FILE", help="extra device kinds (TOML)")
    e.add_argument("--share-grid", type=int, default=16, metavar="G", help="share grid of the planner (default 16)")
    e.set_defaults(func=cmd_export, compat=None)


__all__ = ["add_export_parser", "cmd_export"]
