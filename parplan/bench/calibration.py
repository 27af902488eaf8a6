"""Calibrated devices against measured training steps (issue 31; docs/calibration.md).

Reads a calibration recorded on a GPU (``parplan calibrate --csv calibration.csv -o
KIND.toml``, ``python -m parplan.calibration.steps --out steps.csv`` and, optionally, with
``--compile`` into ``steps_compiled.csv``; by default the H200 run shipped in
``parplan/data/calibration/``), then reports

- per op class, how well section 5's fitted figures reproduce the op measurements (median
  and largest |predicted / measured - 1|);
- per whole training step (forward + backward of a real model on one GPU), the time the cost
  model predicts on the datasheet kind (peak roofline, the papers' setting) and on the
  calibrated kind, against the measured time.

No case here was used to fit the figures: the fit saw single ops only.

Where the folder also holds ``memory.csv`` (and ``memory_compiled.csv``) from ``python -m
parplan.calibration.steps --memory [--compile]``, it sets section 6's memory of each case on one
device against what the GPU's allocator held: weights, gradients and AdamW's state, and the
activations the forward left for backward (with Hugging Face's per-block checkpointing too,
against section 6.3's recomputation).

Writes ``calibration.csv`` (one row per step case and mode), ``calibration_memory.csv`` (one
row per memory case), ``calibration.png`` and ``calibration.md``.
Run: ``parplan bench calibration --out results/`` or
``python -m parplan.bench.calibration OUT_DIR [--quick] [--measured DIR]``.
"""

from __future__ import annotations

import argparse
import math
import sys
import tomllib
from importlib import resources
from pathlib import Path

import pandas as pd

from parplan.bench.common import (
    ExecutorSpec,
    Task,
    grouped_bars,
    md_table,
    out_dir_path,
    run_tasks,
    standalone_main,
    with_progress_header,
    write_outputs,
)
from parplan.errors import ConfigError

NAME = "calibration"
#: The recorded run shipped with parplan.
RECORDED = "data/calibration"


def _measured_dir(measured: str | None) -> Path:
    path = Path(measured) if measured else Path(str(resources.files("parplan").joinpath(RECORDED)))
    missing = [f for f in ("calibration.csv", "steps.csv") if not (path / f).is_file()]
    tomls = sorted(path.glob("*.toml")) if path.is_dir() else []
    if missing or len(tomls) != 1:
        raise ConfigError(
            f"--measured '{path}': needs calibration.csv, steps.csv and one device file (*.toml)"
            f"{'; missing ' + ', '.join(missing) if missing else ''}"
        )
    return path


def _kinds(device_file: Path) -> tuple[str, str]:
    """(calibrated kind, its datasheet kind) named in the device file."""
    from parplan.calibration import known_kind

    name = next(iter(tomllib.loads(device_file.read_text())))
    from parplan.costmodel.hardware import load_devices

    kinds = load_devices(device_file)
    base = known_kind(kinds[name].description)
    if base is None:
        raise ConfigError(
            f"device file '{device_file}': its description names no built-in kind to compare with"
        )
    return name, base.name


def step_task(
    model: str,
    batch: int,
    measured_ms: float,
    device_file: str,
    kind: str,
    base: str,
    mode: str = "eager",
) -> dict:
    from parplan.calibration.steps import predict_step_seconds

    row = {"model": model, "batch": batch, "mode": mode, "measured_ms": measured_ms}
    recompute = "checkpointed" in mode  # section 6.3's forward again, per block
    for label, k in (("datasheet", base), ("calibrated", kind)):
        row[f"{label}_ms"] = (
            predict_step_seconds(model, batch, k, device_file, recompute=recompute) * 1e3
        )
        row[f"{label}_ratio"] = row[f"{label}_ms"] / measured_ms
    return row


def memory_task(
    model: str,
    batch: int,
    checkpoint: bool,
    mode: str,
    state_bytes: float,
    act_bytes: float,
    again_bytes: float,
) -> dict:
    """One memory case: section 6's bytes on one device against the measured ones."""
    from parplan.calibration.steps import predict_memory_bytes

    state, act, again = predict_memory_bytes(model, batch, recompute=checkpoint)
    return {
        "model": model,
        "batch": batch,
        "mode": mode,
        "checkpoint": int(checkpoint),
        "state_measured_gib": state_bytes / 2**30,
        "state_model_gib": state / 2**30,
        "state_ratio": state / state_bytes,
        "activations_measured_gib": act_bytes / 2**30,
        "activations_model_gib": act / 2**30,
        "activations_ratio": act / act_bytes,
        "again_measured_gib": again_bytes / 2**30 if checkpoint else math.nan,
        "again_model_gib": again / 2**30 if checkpoint else math.nan,
    }


def _memory_tasks(src: Path, quick: bool) -> list[Task]:
    """The recorded memory cases (none when the folder has no memory.csv)."""
    frames = [
        pd.read_csv(src / f).assign(mode=mode)
        for f, mode in (("memory.csv", "eager"), ("memory_compiled.csv", "compiled"))
        if (src / f).is_file()
    ]
    if not frames:
        return []
    rows = pd.concat(frames, ignore_index=True)
    if quick:
        rows = rows[rows.model.str.startswith("tv:")].head(1)
    return [
        Task(
            f"memory {r.model} b{r.batch} ({r.mode}{', checkpointed' if r.checkpoint else ''})",
            memory_task,
            dict(
                model=r.model,
                batch=int(r.batch),
                checkpoint=bool(r.checkpoint),
                mode=r.mode,
                # what the model counts: weights and AdamW's moments (allocated between steps),
                # the gradients backward writes; the activations the forward left, less its output
                state_bytes=float(r.state_bytes + r.grad_bytes),
                act_bytes=float(r.saved_bytes - r.output_bytes),
                # backward's peak above what the forward left and the gradients: a recomputed
                # block's activations (and backward's temporaries)
                again_bytes=float(r.peak_bytes - r.saved_bytes - r.grad_bytes),
            ),
            cost=2,
        )
        for r in rows.itertuples()
    ]


def run(
    out_dir: str | Path,
    quick: bool = False,
    executor: ExecutorSpec | None = None,
    measured: str | None = None,
) -> pd.DataFrame:
    """Run the benchmark; write calibration.csv / .png / .md. Columns: model, batch, measured_ms,
    datasheet_ms / datasheet_ratio (the built-in kind), calibrated_ms / calibrated_ratio."""
    from parplan.calibration.fit import Measurement, predict_seconds

    out = out_dir_path(out_dir)
    src = _measured_dir(measured)
    device_file = next(iter(sorted(src.glob("*.toml"))))
    kind, base = _kinds(device_file)
    ops = pd.read_csv(src / "calibration.csv")
    steps = pd.read_csv(src / "steps.csv")
    if "mode" not in steps:
        steps["mode"] = "eager"
    if (src / "steps_compiled.csv").is_file():  # the same models through torch.compile (fused ops)
        steps = pd.concat(
            [steps, pd.read_csv(src / "steps_compiled.csv").assign(mode="compiled")],
            ignore_index=True,
        )
    if (src / "steps_checkpointed.csv").is_file():  # with per-block checkpointing (eager)
        steps = pd.concat([steps, pd.read_csv(src / "steps_checkpointed.csv")], ignore_index=True)
    if quick:
        steps = steps[steps.model.str.startswith("tv:")].head(1)
    from parplan.costmodel.hardware import load_devices

    k = load_devices(device_file)[kind]
    ms = [
        Measurement(r.op, r.shape, r.flops, r.bytes, int(r.kernels), r.measured_ms / 1e3)
        for r in ops.itertuples()
        if r.op != "allreduce"
    ]
    device = k.as_device()  # the recorded device file's figures, as --devices prices them
    ops = ops[ops.op != "allreduce"].assign(
        ratio=[predict_seconds(m, device) / m.seconds for m in ms]
    )
    per_op = (
        ops.assign(err=(ops.ratio - 1).abs())
        .groupby("op", sort=False)
        .err.agg(["median", "max", "count"])
    )
    tasks = [
        Task(
            f"{r.model} b{r.batch} ({r.mode})",
            step_task,
            dict(
                model=r.model,
                batch=int(r.batch),
                measured_ms=float(r.fwd_bwd_ms),
                device_file=str(device_file),
                kind=kind,
                base=base,
                mode=r.mode,
            ),
            cost=2,
        )
        for r in steps.itertuples()
    ]
    memory = _memory_tasks(src, quick)
    with_progress_header(
        NAME, f"{len(tasks)} whole-step cases" + (f", {len(memory)} memory cases" if memory else "")
    )
    table = pd.DataFrame(run_tasks(NAME, tasks, executor))
    mem = pd.DataFrame(run_tasks(NAME, memory, executor)) if memory else None
    if mem is not None:
        mem.to_csv(out / f"{NAME}_memory.csv", index=False)
    device = steps.device.iloc[0] if len(steps) else kind
    write_outputs(
        out,
        NAME,
        table,
        lambda path: _plot(table, path),
        _markdown(table, per_op, k, base, device, device_file.name)
        + ("" if mem is None else _memory_markdown(mem)),
    )
    return table


def _short(model: str) -> str:
    name, *rest = model.split(",")
    keys = {"hidden_size": "h", "num_hidden_layers": "L", "seq": "seq", "num_key_value_heads": "kv"}
    parts = [f"{keys[k]}={v}" for k, _, v in (p.partition("=") for p in rest) if k in keys]
    return name + (" " + " ".join(parts) if parts else "")


def _plot(table: pd.DataFrame, path: Path) -> None:
    frame = table.assign(
        case=[
            f"{_short(m)}\nb{b} {mode}"
            for m, b, mode in zip(table.model, table.batch, table["mode"])
        ]
    )
    grouped_bars(
        path,
        [("one training step (forward + backward) on one GPU", frame)],
        "case",
        {
            "measured": "measured_ms",
            "datasheet peak": "datasheet_ms",
            "calibrated": "calibrated_ms",
        },
        "time (ms)",
    )


def _markdown(
    table: pd.DataFrame, per_op: pd.DataFrame, kind, base: str, device: str, file_name: str
) -> str:
    def pct(v):
        return f"{100 * v:.1f}%"

    lines = [
        "# Calibrated devices against measured training steps",
        "",
        f"Measured on one {device} with `parplan calibrate` and `python -m parplan.calibration.steps` "
        f"(recorded in `parplan/data/calibration/`, device file `{file_name}`; docs/calibration.md). "
        f"Fitted figures (docs/costmodel.md section 5): efficiency {kind.efficiency:.3f}, conv "
        f"{kind.conv_efficiency:.3f}, attention {kind.attention_efficiency:.3f}, HBM {kind.memory_efficiency:.3f}, "
        f"launch time {kind.kernel_overhead_s * 1e6:.1f} us per kernel.",
        "",
        "## Single ops (what the fit saw)",
        "",
        "| op | shapes | median error | largest error |",
        "| --- | --- | --- | --- |",
    ]
    lines += [
        f"| {op} | {int(r['count'])} | {pct(r['median'])} | {pct(r['max'])} |"
        for op, r in per_op.iterrows()
    ]
    lines += [
        "",
        "## Whole training steps (not used by the fit)",
        "",
        f"Forward + backward of each model on one GPU in bf16 (optimizer update apart), predicted as the sum of "
        f"section 5's compute over all nodes on one device: on the datasheet kind `{base}` (peak roofline) and "
        "on the calibrated kind. Ratio = predicted / measured.",
        "",
    ]
    frame = table.assign(case=[_short(m) for m in table.model])
    lines += md_table(
        frame,
        {
            "case": str,
            "batch": str,
            "mode": str,
            "measured_ms": ".2f",
            "datasheet_ms": ".2f",
            "datasheet_ratio": ".2f",
            "calibrated_ms": ".2f",
            "calibrated_ratio": ".2f",
        },
        headers={
            "measured_ms": "measured (ms)",
            "datasheet_ms": f"{base} (ms)",
            "datasheet_ratio": "ratio",
            "calibrated_ms": "calibrated (ms)",
            "calibrated_ratio": "ratio",
        },
    )
    for mode in ("eager", "compiled", "eager, checkpointed"):
        part = table[table["mode"] == mode]
        if len(part):

            def med(col):
                return float((part[col] - 1).abs().median())

            def geo(col):
                return math.exp(float(part[col].map(math.log).mean()))

            lines += [
                "",
                f"{mode.capitalize()} ({len(part)} cases): median |predicted / measured - 1| datasheet "
                f"{pct(med('datasheet_ratio'))}, calibrated {pct(med('calibrated_ratio'))}; geometric mean "
                f"ratio datasheet {geo('datasheet_ratio'):.2f}, calibrated {geo('calibrated_ratio'):.2f}.",
            ]
    lines += [
        "",
        "Where the gap comes from: run eagerly, a norm, a rotary embedding or a gated unit is several kernels "
        "that each read and write the tensor, while section 1 prices each such op as one fused read and write "
        "(two kernels). Through `torch.compile`, which fuses them, the same models run close to the "
        "calibrated prediction; eagerly the small decoders are under-predicted most. The optimizer's update "
        "is not priced.",
        "",
    ]
    ck = table[table["mode"] == "eager, checkpointed"]
    plain = table[table["mode"] == "eager"].set_index(["model", "batch"])
    if len(ck):
        pairs = [
            (
                r.measured_ms / plain.loc[(r.model, r.batch)].measured_ms,
                r.calibrated_ms / plain.loc[(r.model, r.batch)].calibrated_ms,
            )
            for r in ck.itertuples()
            if (r.model, r.batch) in plain.index
        ]
        lines += [
            "Per-block checkpointing (Hugging Face's, eager) against section 6.3's forward again: the "
            f"step grows {min(m for m, _ in pairs):.2f}-{max(m for m, _ in pairs):.2f}x measured and "
            f"{min(p for _, p in pairs):.2f}-{max(p for _, p in pairs):.2f}x in the model. The model "
            "charges a forward as a third of a step's FLOPs; eagerly, backward takes more than twice "
            "the forward's time, so a forward again adds less than a third.",
            "",
        ]
    return "\n".join(lines)


def _memory_markdown(mem: pd.DataFrame) -> str:
    """The memory section of calibration.md (docs/calibration.md, "Memory on one GPU")."""
    lines = [
        "## Memory of one training step (section 6 against the GPU's allocator)",
        "",
        "Each case on one GPU in bf16 with fused AdamW (`python -m parplan.calibration.steps --memory`, "
        "`torch.cuda.memory_allocated`): *state* is the weights and AdamW's two moments between steps plus "
        "the gradients backward writes; *activations* what the forward leaves allocated for backward, less "
        "its output. The model's side is section 6 with every node whole on one device (bf16 weights and "
        "gradients, 4 bytes of optimizer state per parameter); checkpointed rows are Hugging Face's "
        "per-block checkpointing, set against section 6.3's block checkpointing, and *block again* is what "
        "backward's peak holds above the forward's activations and the gradients (measured; it includes "
        "backward's temporaries) against the largest block's activations (model). Ratio = model / measured.",
        "",
    ]
    frame = mem.assign(
        case=[_short(m) for m in mem.model],
        checkpointed=["yes" if c else "" for c in mem.checkpoint],
        again_measured=[
            f"{x:.2f}" if c else "" for x, c in zip(mem.again_measured_gib, mem.checkpoint)
        ],
        again_model=[f"{x:.2f}" if c else "" for x, c in zip(mem.again_model_gib, mem.checkpoint)],
    )
    lines += md_table(
        frame,
        {
            "case": str,
            "batch": str,
            "mode": str,
            "checkpointed": str,
            "state_measured_gib": ".2f",
            "state_model_gib": ".2f",
            "state_ratio": ".2f",
            "activations_measured_gib": ".2f",
            "activations_model_gib": ".2f",
            "activations_ratio": ".2f",
            "again_measured": str,
            "again_model": str,
        },
        headers={
            "state_measured_gib": "state measured (GiB)",
            "state_model_gib": "model (GiB)",
            "state_ratio": "ratio",
            "activations_measured_gib": "activations measured (GiB)",
            "activations_model_gib": "model (GiB)",
            "activations_ratio": "ratio",
            "again_measured": "block again measured (GiB)",
            "again_model": "model (GiB)",
        },
    )
    lines += [
        "",
        'What the ratios say (docs/calibration.md, "Memory on one GPU"):',
        "",
        "- *Activations, fused.* Through `torch.compile` the Llama-class decoders keep what section 1's rule "
        "stores to within 1-9%: the rule prices fused element-wise ops, as the time rule does. Run eagerly, "
        "Hugging Face's RMS norm, rotary embedding and gated unit keep fp32 and intermediate copies (model / "
        "measured about 0.7). GPT-2 and BERT also keep dropout masks, which the model does not know of; "
        "compiled, BERT's masked attention keeps its score matrices.",
        "- *Convolutions.* ResNet-50 is over-counted about 1.5x: a ReLU's stored output is the next "
        "convolution's stored input, one tensor in PyTorch, counted for both in the model.",
        "- *State.* The model counts an embedding table at every node that reads it (section 2: Llama's token "
        "table at the first q/k/v projection and the first residual add) and a tied LM head apart from the "
        "table it shares (GPT-2): the small decoders here are over-counted by that table.",
        "- *Checkpointing.* Section 6.3 checkpoints per block, as the frameworks do: for the Llama-class "
        "decoders what it keeps between forward and backward plus the block it holds again in backward "
        "is 0.92-1.08 of the measured (GPT-2 0.69, its dropout masks; BERT 1.13). The per-layer rule it "
        "replaced kept 3.4-6.2x what per-block checkpointing keeps.",
        "",
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``parplan bench calibration``."""
    parser.add_argument(
        "--measured",
        default=None,
        metavar="DIR",
        help="folder with calibration.csv, steps.csv and the device file (default: the recorded "
        "H200 run in parplan/data/calibration)",
    )


def main(argv: list[str] | None = None) -> int:
    return standalone_main(__doc__, NAME, run, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
