"""``parplan calibrate``: measure the local device with torch and write a device file for
``--devices`` (docs/calibration.md)."""

from __future__ import annotations

import argparse
import sys

from parplan.cli.common import output_path, progress_printer
from parplan.errors import ConfigError


def cmd_calibrate(args: argparse.Namespace) -> int:
    from parplan.calibration import calibrate
    from parplan.calibration.measure import OPS

    ops = tuple(o.strip() for o in args.ops.split(",")) if args.ops else OPS
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise ConfigError(f"--ops: unknown op class {bad[0]!r}; valid: {', '.join(OPS)}")
    if "linear" not in ops:
        raise ConfigError(
            "--ops must include linear (the matrix products fit the efficiency and the overhead)"
        )
    out = output_path(args.output, "--output") if args.output else None
    csv = output_path(args.csv, "--csv") if args.csv else None
    c = calibrate(
        device=args.device,
        dtype=args.dtype,
        scope="quick" if args.quick else "full",
        like=args.like,
        name=args.name,
        processes=args.processes,
        ops=ops,
        devices_file=args.devices,
        progress=progress_printer(not args.quiet),
    )
    table = c.table()
    if csv:
        table.to_csv(csv, index=False)
    if out:
        out.write_text(c.text)
    summary = sys.stdout if out else sys.stderr
    if not args.quiet:
        print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"), file=summary)
    f = c.fit
    print(
        f"{c.host.name} ({c.host.device}, {c.host.dtype}): efficiency {f.efficiency:.3f}"
        + (f", conv {f.conv_efficiency:.3f}" if f.conv_efficiency is not None else "")
        + (
            f", attention {f.attention_efficiency:.3f}"
            if f.attention_efficiency is not None
            else ""
        )
        + f", HBM {f.memory_efficiency:.3f}, kernel overhead {f.kernel_overhead_s * 1e6:.1f} us",
        file=summary,
    )
    if out:
        print(
            f"wrote {out} (kind '{c.name}'); use it with --devices {out} --array {c.name}:N",
            file=summary,
        )
    else:
        print(c.text, end="")
    return 0


def add_calibrate_parser(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help="measure the local device with torch and write a device file",
        description="Time linear layers, convolutions, attention cores and a streaming op "
        "(forward + backward) on the local device, fit docs/costmodel.md section 5's "
        "efficiencies and per-kernel overhead, and write a device file for --devices.",
    )
    p.add_argument(
        "--device", default="auto", help="auto (a GPU if torch sees one), cpu, cuda or cuda:N"
    )
    p.add_argument(
        "--dtype", default="auto", help="bf16, fp16, fp32 or auto (bf16 on a GPU, fp32 on a CPU)"
    )
    p.add_argument(
        "--like",
        default=None,
        metavar="KIND",
        help="device kind whose datasheet peaks, memory and links the figures are relative to "
        "(default: the kind torch's device name names, e.g. h100; none on a CPU)",
    )
    p.add_argument("--name", default=None, help="name of the written kind (default: KIND-measured)")
    p.add_argument(
        "--quick", action="store_true", help="small shapes only (seconds; for CPUs and tests)"
    )
    p.add_argument(
        "--ops",
        default=None,
        help="comma-separated op classes (default: linear,conv,attention,memory)",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="also time all-reduces over this many local processes (gloo on CPU, NCCL with a GPU each) "
        "and fit the link figures (default 1: no collectives)",
    )
    p.add_argument(
        "--devices", default=None, metavar="FILE", help="extra device kinds (TOML) for --like"
    )
    p.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="FILE",
        help="write the device file here (default: stdout)",
    )
    p.add_argument(
        "--csv",
        default=None,
        metavar="FILE",
        help="write every measurement with its prediction here",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress and no table")
    p.set_defaults(func=cmd_calibrate)
