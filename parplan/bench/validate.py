"""Predicted against published, measured training throughput (issue 31; docs/calibration.md).

Each case of ``parplan/data/validation/published.csv`` is a fully specified published run:
the model's shape, the machine (``dgx-a100:N`` / ``dgx-h100:N``), the global and micro-batch,
the tensor and pipeline degrees (data parallelism takes the rest), the ZeRO stage,
recomputation and the measured tokens per second per GPU; ``sources.toml`` beside it says where
each source printed its figures. parplan makes each configuration a plan
(:func:`parplan.pipeline.configs.config_plan`: Megatron-LM's layout), prices one step with its
own model (:func:`parplan.costmodel.stages.evaluate_pipeline`) and reports predicted tokens per
second per GPU next to the measured figure.

One constant is fitted per source, on that source's rows marked ``fit``: the GEMM efficiency
of its GPUs (the share of the datasheet's bf16 peak the products reach; FP8 GEMMs may exceed
1), found by regula falsi so that the fitted rows' geometric-mean ratio is 1. Every other row is
held out: its error ``predicted / measured - 1`` is what the table, the median and the plot
report. Without the fit (efficiency 1, the datasheet) the ratios are listed too.

Writes ``validate.csv`` (one row per case), ``validate.png`` and ``validate.md``.
Run: ``parplan bench validate --out results/`` or
``python -m parplan.bench.validate OUT_DIR [--quick]``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
import tomllib
from importlib import resources
from pathlib import Path

import pandas as pd

from parplan.bench.common import (
    ExecutorSpec,
    csv_names,
    md_table,
    out_dir_path,
    standalone_main,
    with_progress_header,
    write_outputs,
)
from parplan.errors import ConfigError

NAME = "validate"
#: The published cases shipped with parplan.
DATA = "data/validation"
#: Machines the cases run on -> parplan's device kind of their GPUs.
SYSTEMS = {"dgx-a100": "a100", "dgx-h100": "h100"}
#: Fitted efficiencies are searched in this interval (the ratio rises with the efficiency).
EFFICIENCY_RANGE = (0.05, 4.0)
#: --quick: one source's fitted row and one held-out row.
QUICK_CASES = ("torchtitan-llama3-8b-sel-op", "torchtitan-llama2-13b-none")


def read_cases(path: str | Path | None = None) -> list[dict]:
    """The cases of ``published.csv`` (``path``: another file with the same columns), typed."""
    path = (
        Path(path)
        if path
        else Path(str(resources.files("parplan").joinpath(DATA))) / "published.csv"
    )
    if not path.is_file():
        raise ConfigError(f"validation cases '{path}': no such file")
    ints = ("gpus", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq")
    ints += ("global_batch", "micro_batch", "tp", "pp", "zero")
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
        columns = set(reader.fieldnames or ())
    needed = ("case", "source", "system", "precision", "model", "note", *ints)
    needed += ("measured_tokens_per_s_per_gpu", "recompute", "fit")
    missing = [c for c in needed if c not in columns]
    if missing:
        raise ConfigError(
            f"validation cases '{path}': missing column(s) {', '.join(missing)} "
            "(published.csv shipped with parplan has them all)"
        )
    cases = []
    for i, row in enumerate(rows, start=2):
        try:
            case = dict(row)
            for key in ints:
                case[key] = int(row[key])
            case["measured_tokens_per_s_per_gpu"] = float(row["measured_tokens_per_s_per_gpu"])
            case["recompute"] = _yes(row["recompute"])
            case["fit"] = _yes(row["fit"])
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"validation cases '{path}' line {i}: {exc}") from None
        if case["system"] not in SYSTEMS or case["model"] not in ("llama", "gpt"):
            raise ConfigError(
                f"validation cases '{path}' line {i}: system must be one of {', '.join(SYSTEMS)} "
                f"and model llama or gpt (got {case['system']!r}, {case['model']!r})"
            )
        cases.append(case)
    return cases


def read_sources() -> dict[str, dict]:
    """``sources.toml``: per source its title, where it was published, metric and setting."""
    path = Path(str(resources.files("parplan").joinpath(DATA))) / "sources.toml"
    return tomllib.loads(path.read_text(encoding="utf-8"))


def _yes(text: str) -> bool:
    value = str(text).strip().lower()
    if value not in ("yes", "no"):
        raise ValueError(f"expected yes or no (got {text!r})")
    return value == "yes"


def case_graph(case: dict):
    """The case's model as parplan's transformer builders make it."""
    from parplan.models.transformers import gpt_config, llama_config

    if case["model"] == "llama":
        return llama_config(
            case["layers"],
            case["hidden"],
            case["heads"],
            case["kv_heads"],
            case["ffn"],
            case["seq"],
            case["vocab"],
            name=case["case"],
        )
    return gpt_config(
        case["layers"],
        case["hidden"],
        case["heads"],
        case["seq"],
        case["vocab"],
        name=case["case"],
        ffn=case["ffn"],
    )


def predict(case: dict, efficiency: float = 1.0, graph=None) -> dict:
    """Predicted step time and tokens per second per GPU of ``case`` with its GPUs' GEMM
    ``efficiency``; also the priced step's parts."""
    from parplan.costmodel.hardware import load_devices, parse_array
    from parplan.costmodel.problem import Problem
    from parplan.costmodel.stages import evaluate_pipeline
    from parplan.pipeline.configs import ParallelConfig, config_plan

    kinds = load_devices()
    kind = SYSTEMS[case["system"]]
    kinds[kind] = dataclasses.replace(kinds[kind], efficiency=float(efficiency))
    if case["gpus"] % 8:
        raise ConfigError(f"case '{case['case']}': {case['gpus']} GPUs is not whole 8-GPU nodes")
    array = parse_array(f"{case['system']}:{case['gpus'] // 8}", devices=kinds)
    problem = Problem(graph or case_graph(case), array, batch=case["global_batch"])
    config = ParallelConfig(
        tensor=case["tp"],
        pipeline=case["pp"],
        zero_stage=case["zero"],
        recompute=case["recompute"],
        micro_batch_size=case["micro_batch"],
        global_batch=case["global_batch"],
        source=case["case"],
    )
    priced, plan = config_plan(problem, config)
    ev = evaluate_pipeline(priced, plan)
    tokens = case["global_batch"] * case["seq"]
    return {
        "step_s": ev.step_time_s,
        "tokens_per_s_per_gpu": tokens / ev.step_time_s / case["gpus"],
        "micro_batches": priced.micro_batches,
        "peak_memory_gib": ev.peak_memory_bytes / 2**30,
    }


def fit_efficiency(cases: list[dict], graphs: dict) -> float:
    """The GEMM efficiency at which the geometric mean of predicted / measured over ``cases``
    is 1 (the ratio rises with the efficiency: regula falsi in log space)."""

    def log_ratio(e: float) -> float:
        return sum(
            math.log(
                predict(c, e, graphs[c["case"]])["tokens_per_s_per_gpu"]
                / c["measured_tokens_per_s_per_gpu"]
            )
            for c in cases
        ) / len(cases)

    # regula falsi (Illinois) on log e: the mean log ratio is smooth and increasing in it
    a, b = (math.log(x) for x in EFFICIENCY_RANGE)
    fa, fb = log_ratio(math.exp(a)), log_ratio(math.exp(b))
    if fa > 0 or fb < 0:
        raise ConfigError(
            f"no GEMM efficiency in {list(EFFICIENCY_RANGE)} reproduces the fitted cases "
            f"({', '.join(c['case'] for c in cases)})"
        )
    side = 0
    for _ in range(60):
        x = (a * fb - b * fa) / (fb - fa)
        fx = log_ratio(math.exp(x))
        if abs(fx) < 1e-10 or b - a < 1e-12:
            return math.exp(x)
        if fx < 0:
            a, fa = x, fx
            fb = fb / 2 if side == -1 else fb
            side = -1
        else:
            b, fb = x, fx
            fa = fa / 2 if side == 1 else fa
            side = 1
    return math.exp(x)


def run(
    out_dir: str | Path,
    quick: bool = False,
    executor: ExecutorSpec | None = None,
    cases: tuple[str, ...] | None = None,
    data: str | None = None,
) -> pd.DataFrame:
    """Run the benchmark; write validate.csv / validate.png / validate.md.

    Columns: case, source, system, gpus, precision, model, parameters, tp, pp, dp, zero,
    recompute, micro_batches, fit (used for fitting), efficiency (its source's fitted GEMM
    efficiency), measured_tokens_per_s_per_gpu, predicted_tokens_per_s_per_gpu, ratio
    (predicted / measured), error (ratio - 1), datasheet_ratio (at efficiency 1), step_s,
    peak_memory_gib, note. ``executor`` is accepted for the common interface: the cases are
    priced in this process (each in well under a second)."""
    table_cases = read_cases(data)
    names = {c["case"] for c in table_cases}
    chosen = (
        tuple(cases) if cases else (QUICK_CASES if quick else tuple(c["case"] for c in table_cases))
    )
    unknown = [c for c in chosen if c not in names]
    if unknown:
        raise ConfigError(
            f"bench validate: unknown case(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}"
        )
    selected = [c for c in table_cases if c["case"] in chosen]
    with_progress_header(
        NAME,
        f"{len(selected)} published runs from {len({c['source'] for c in selected})} sources",
    )
    out = out_dir_path(out_dir)
    graphs = {c["case"]: case_graph(c) for c in selected}
    efficiency = {}
    for source in dict.fromkeys(c["source"] for c in selected):
        fitted = [c for c in selected if c["source"] == source and c["fit"]]
        if not fitted:
            raise ConfigError(f"bench validate: source '{source}' has no case marked fit=yes")
        efficiency[source] = fit_efficiency(fitted, graphs)
    rows = []
    for c in selected:
        got = predict(c, efficiency[c["source"]], graphs[c["case"]])
        sheet = predict(c, 1.0, graphs[c["case"]])
        measured = c["measured_tokens_per_s_per_gpu"]
        ratio = got["tokens_per_s_per_gpu"] / measured
        rows.append(
            {
                "case": c["case"],
                "source": c["source"],
                "system": c["system"],
                "gpus": c["gpus"],
                "precision": c["precision"],
                "model": c["model"],
                "parameters": graphs[c["case"]].parameter_count(),
                "tp": c["tp"],
                "pp": c["pp"],
                "dp": c["gpus"] // (c["tp"] * c["pp"]),
                "zero": c["zero"],
                "recompute": c["recompute"],
                "micro_batches": got["micro_batches"],
                "fit": c["fit"],
                "efficiency": efficiency[c["source"]],
                "measured_tokens_per_s_per_gpu": measured,
                "predicted_tokens_per_s_per_gpu": got["tokens_per_s_per_gpu"],
                "ratio": ratio,
                "error": ratio - 1.0,
                "datasheet_ratio": sheet["tokens_per_s_per_gpu"] / measured,
                "step_s": got["step_s"],
                "peak_memory_gib": got["peak_memory_gib"],
                "note": c["note"],
            }
        )
        print(f"[bench {NAME}] {c['case']}: ratio {ratio:.3f}", file=sys.stderr, flush=True)
    table = pd.DataFrame(rows)
    write_outputs(out, NAME, table, lambda p: _plot(table, p), _markdown(table))
    return table


def summary(table: pd.DataFrame) -> dict:
    """Median and largest |error| over the held-out cases, and how many there are."""
    held = table[~table.fit]
    errors = held.error.abs()
    return {
        "held_out": int(len(held)),
        "sources": int(held.source.nunique()),
        "median_abs_error": float(errors.median()) if len(held) else math.nan,
        "max_abs_error": float(errors.max()) if len(held) else math.nan,
    }


def _plot(table: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    for (source, fit), sub in table.groupby(["source", "fit"], sort=False):
        ax.scatter(
            sub.measured_tokens_per_s_per_gpu,
            sub.predicted_tokens_per_s_per_gpu,
            marker="s" if fit else "o",
            label=f"{source} ({'fitted' if fit else 'held out'})",
        )
    lo = min(table.measured_tokens_per_s_per_gpu.min(), table.predicted_tokens_per_s_per_gpu.min())
    hi = max(table.measured_tokens_per_s_per_gpu.max(), table.predicted_tokens_per_s_per_gpu.max())
    xs = [lo / 1.3, hi * 1.3]
    ax.plot(xs, xs, color="grey", linewidth=1)
    for band in (0.85, 1.15):
        ax.plot(xs, [x * band for x in xs], color="grey", linewidth=0.6, linestyle="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured tokens / s / GPU (published)")
    ax.set_ylabel("predicted tokens / s / GPU (parplan)")
    ax.set_title("parplan against published training runs (dashed: +-15%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _markdown(table: pd.DataFrame) -> str:
    sources = read_sources()
    s = summary(table)
    lines = [
        "# Predicted against published training throughput",
        "",
        f"{len(table)} published runs from {table.source.nunique()} sources; each configuration is "
        "priced by parplan's model as Megatron-LM lays it out (`parplan evaluate --config`). One GEMM "
        "efficiency per source is fitted on its `fit` rows; the rest are held out.",
        "",
        f"**Held-out cases: {s['held_out']} from {s['sources']} sources; median |error| "
        f"{s['median_abs_error']:.1%}, largest {s['max_abs_error']:.1%}.**",
        "",
    ]
    lines += md_table(
        table,
        {
            "case": str,
            "gpus": "d",
            "tp": "d",
            "pp": "d",
            "dp": "d",
            "zero": "d",
            "recompute": lambda v: "yes" if v else "no",
            "fit": lambda v: "fitted" if v else "held out",
            "measured_tokens_per_s_per_gpu": ".0f",
            "predicted_tokens_per_s_per_gpu": ".0f",
            "error": "+.1%",
            "datasheet_ratio": ".2f",
            "peak_memory_gib": ".1f",
        },
        headers={
            "measured_tokens_per_s_per_gpu": "measured tok/s/GPU",
            "predicted_tokens_per_s_per_gpu": "predicted",
            "error": "error",
            "datasheet_ratio": "ratio at datasheet peak",
            "peak_memory_gib": "predicted peak GiB",
        },
    )
    lines += ["", "## Sources and fitted efficiencies", ""]
    for source, sub in table.groupby("source", sort=False):
        info = sources.get(source, {})
        lines.append(
            f"- **{source}**: {info.get('title', source)} ({info.get('where', 'no address')}); "
            f"metric: {info.get('metric', '-')}; {info.get('setting', '')}. Fitted GEMM efficiency "
            f"{sub.efficiency.iloc[0]:.3f} of the bf16 datasheet peak, on "
            f"{', '.join(sub[sub.fit].case)}."
        )
    over = table[table.peak_memory_gib > 80]
    if len(over):
        lines += [
            "",
            f"Memory: {len(over)} of these runs ran on 80 GB GPUs but are predicted to need more "
            f"({', '.join(f'{r.case} {r.peak_memory_gib:.0f} GiB' for r in over.itertuples())}): "
            "the model keeps more activations there than the run did (docs/calibration.md, "
            '"Validation against published runs").',
        ]
    lines += [
        "",
        "What the model leaves out here: selective activation checkpointing is priced without "
        "recomputation; FP8 enters only through the fitted efficiency (attention and element-wise "
        "work keep their bf16 figures); sequence parallelism, which the NeMo runs use with tensor "
        "parallelism, moves the same bytes as the all-reduces parplan prices.",
        "",
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``parplan bench validate`` (``dest`` = the keyword of :func:`run`)."""
    parser.add_argument(
        "--cases",
        type=csv_names,
        default=None,
        metavar="NAME,...",
        help="run these cases only (default: every case of the data file)",
    )
    parser.add_argument(
        "--data",
        default=None,
        metavar="CSV",
        help="a case file with published.csv's columns (default: the one shipped with parplan)",
    )


def main(argv: list[str] | None = None) -> int:
    return standalone_main(__doc__, NAME, run, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
