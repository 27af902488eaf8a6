"""Plan pictures: the per-layer choice at every level and the time breakdown (``parplan plan --plot``).

:func:`plot_plan` draws a two-panel figure from a :class:`~parplan.reporting.report.PlanReport`:

- top, a heat-strip with one row per level of the array (the root split first) and one column
  per planning node (weighted layers and joins, in topological order). A cell's colour is the
  partition type (BATCH = data, IN = row / Di split, OUT = column / Do split; joins in greys by
  layout); the coloured part of the cell's height is the share of the level's first (left)
  group, the pale rest the second group's. Where the groups of a level chose differently the
  cell shows the most common choice, hatched.
- bottom, stacked bars per node of its step time (ms): compute (the slowest device's), then
  intra-layer and transition communication. The communication part of a node's time (its time
  minus that compute) is divided between intra-layer and transition in proportion to their
  seconds summed over all splits (the evaluator's per-split ``comm_s`` divided by elements).

The figure is built on matplotlib's object API with the Agg canvas: no pyplot state, no display.

Example:
    >>> import tempfile, os
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.costmodel.evaluate import evaluate
    >>> from parplan.solvers.planners import make_plan
    >>> from parplan.reporting.report import plan_report
    >>> p = Problem(get_model("alexnet"), parse_array("tpu-v2:2,tpu-v3:2"), batch=128)
    >>> plan = make_plan(p, "accpar")
    >>> r = plan_report(p, plan, evaluate(p, plan), evaluate(p, make_plan(p, "data")))
    >>> path = os.path.join(tempfile.mkdtemp(), "plan.png")
    >>> plot_plan(r, path) == path, os.path.getsize(path) > 10_000
    (True, True)
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from parplan.costmodel.layout import JOIN_LAYOUTS, TYPE_ORDER, Choice, Layout, PartitionType

__all__ = ["COLOURS", "level_choices", "plot_plan", "time_breakdown"]

#: Colour per choice (colour-blind safe Okabe-Ito hues for the types, greys for join layouts).
COLOURS: dict[Choice, str] = {
    PartitionType.BATCH: "#0072B2",
    PartitionType.IN: "#E69F00",
    PartitionType.OUT: "#009E73",
    Layout.ROWS: "#BBBBBB",
    Layout.COLS: "#888888",
    Layout.WHOLE: "#555555",
}
_LABELS: dict[Choice, str] = {
    PartitionType.BATCH: "BATCH (data parallel)",
    PartitionType.IN: "IN (row split, Di)",
    PartitionType.OUT: "OUT (column split, Do)",
    Layout.ROWS: "join: rows",
    Layout.COLS: "join: columns",
    Layout.WHOLE: "join: whole",
}
_TIME_COLOURS = {"compute": "#56B4E9", "intra-layer": "#E69F00", "transition": "#D55E00"}
_ORDER = {c: i for i, c in enumerate((*TYPE_ORDER, *JOIN_LAYOUTS))}


def level_choices(report) -> list[tuple[int, list[Choice], list[float], list[bool]]]:
    """Per depth: (depth, choice per node, mean side-1 share per node, whether groups differ).

    The choice is the most common over the level's splits (ties towards BATCH, IN, OUT).
    """
    plan = report.plan
    n = len(report.problem.planning.nodes)
    by_depth: dict[int, list[str]] = {}
    for path in plan.splits:
        by_depth.setdefault(len(path), []).append(path)
    out = []
    for depth in sorted(by_depth):
        splits = [plan.splits[p] for p in by_depth[depth]]
        choices, shares, mixed = [], [], []
        for v in range(n):
            counts = Counter(s.choices[v] for s in splits)
            best = max(counts.items(), key=lambda kv: (kv[1], -_ORDER[kv[0]]))[0]
            choices.append(best)
            shares.append(float(np.mean([s.shares[v] for s in splits])))
            mixed.append(len(counts) > 1)
        out.append((depth, choices, shares, mixed))
    return out


def time_breakdown(report) -> pd.DataFrame:
    """Per planning node: ``compute_ms``, ``intra_ms``, ``transition_ms`` (summing to its time).

    See the module doc for how communication is divided between intra-layer and transition.
    """
    frame = report.layer_frame()
    b = report.evaluation.breakdown
    intra_s = pd.Series(0.0, index=b.index)
    trans_s = pd.Series(0.0, index=b.index)
    for side in ("1", "2"):
        intra, trans = b[f"intra_elements_{side}"], b[f"transition_elements_{side}"]
        total = intra + trans
        frac = (intra / total.where(total > 0)).fillna(0.0)
        intra_s += b[f"comm_s_{side}"] * frac
        trans_s += b[f"comm_s_{side}"] * (1.0 - frac).where(total > 0, 0.0)
    per_node = (
        pd.DataFrame({"intra": intra_s, "trans": trans_s, "node": b.node})
        .groupby("node", sort=False)
        .sum()
    )
    intra_tot = frame.layer.map(per_node["intra"]).fillna(0.0).to_numpy()
    trans_tot = frame.layer.map(per_node["trans"]).fillna(0.0).to_numpy()
    comm = frame.communication_s.to_numpy()
    denom = intra_tot + trans_tot
    with np.errstate(invalid="ignore", divide="ignore"):
        intra_frac = np.where(denom > 0, intra_tot / denom, 0.0)
    return pd.DataFrame(
        {
            "layer": frame.layer,
            "kind": frame.kind,
            "compute_ms": frame.compute_s.to_numpy() * 1e3,
            "intra_ms": comm * intra_frac * 1e3,
            "transition_ms": comm * (1.0 - intra_frac) * np.where(denom > 0, 1.0, 0.0) * 1e3,
        }
    )


#: Column width of a join relative to a weighted layer (joins carry a layout, no compute).
JOIN_WIDTH = 0.4


def _columns(kinds) -> tuple[np.ndarray, np.ndarray]:
    """(centre, width) of every node's column: weighted layers 1 wide, joins narrower."""
    widths = np.array([JOIN_WIDTH if k == "join" else 1.0 for k in kinds])
    return np.cumsum(widths) - widths / 2, widths


def plot_plan(report, path: str | Path, *, title: str | None = None, dpi: int = 200) -> str:
    """Draw ``report``'s plan to ``path`` (PNG, or any format matplotlib infers from the suffix).

    Returns the path as a string. ``title`` overrides the default headline (model, array,
    batch, planner, step time and speedup over data parallelism). At most about 60 weighted
    layers are labelled (every k-th); joins are narrow columns without labels.
    """
    levels = level_choices(report)
    times = time_breakdown(report)
    centres, widths = _columns(times.kind)
    total = float(widths.sum())
    width_in = float(np.clip(4.0 + 0.09 * total, 8.0, 22.0))
    strip_h = 0.45 * len(levels) + 0.6
    fig = Figure(figsize=(width_in, strip_h + 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[strip_h, 3.2])
    _draw_strip(top, report, levels, centres, widths)
    _draw_times(bottom, times, centres, widths)
    weighted = [i for i, k in enumerate(times.kind) if k != "join"] or list(range(len(times)))
    step = max(1, int(np.ceil(len(weighted) / 60)))
    ticks = weighted[::step]
    labels = [times.layer[i] for i in ticks]
    for ax in (top, bottom):  # both panels share the layer columns and name them
        ax.set_xticks(centres[ticks])
        ax.set_xticklabels(labels, rotation=90, fontsize=7 if len(ticks) > 40 else 8)
        ax.tick_params(axis="x", labelbottom=True)
    bottom.set_xlim(0, total)
    p, ev = report.problem, report.evaluation
    headline = title or (
        f"{p.graph.name} on {p.array.describe()} ({p.array.count} devices), batch {p.batch}, "
        f"planner {report.plan.planner}\nstep {ev.step_time_s * 1e3:.3g} ms, "
        f"{report.speedup:.2f}x over data parallelism"
    )
    fig.suptitle(headline, fontsize=11)
    fig.savefig(str(path), dpi=dpi)
    return str(path)


def plot_compare(frame, meta: dict, path: str | Path, *, dpi: int = 150) -> str:
    """Step time and speedup over data parallelism per planner (``parplan compare --plot``)."""
    from parplan.reporting.report import time_unit

    unit, factor = time_unit(float(frame.step_time_s.max()))
    fig = Figure(figsize=(max(6.0, 1.1 * len(frame) + 2.5), 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    x = np.arange(len(frame))
    left.bar(x, frame.step_time_s * factor, color="#4c72b0")
    left.set_ylabel(f"step time ({unit})")
    right.bar(x, frame.speedup_over_data, color="#55a868")
    right.axhline(1.0, color="0.3", lw=0.8, ls="--")
    right.set_ylabel("speedup over data parallelism")
    for ax in (left, right):
        ax.set_xticks(x)
        ax.set_xticklabels(frame.planner, rotation=30, ha="right")
    fig.suptitle(
        f"{meta['model']} on {meta['array']} ({meta['devices']} devices), batch {meta['batch']}",
        fontsize=11,
    )
    fig.savefig(str(path), dpi=dpi)
    return str(path)


def _draw_strip(ax, report, levels, centres: np.ndarray, widths: np.ndarray) -> None:
    links = {depth: link for depth, _, _, link in report.level_types()}
    used: set[Choice] = set()
    for row, (depth, choices, shares, mixed) in enumerate(levels):
        y = len(levels) - 1 - row
        for v, (c, a, m) in enumerate(zip(choices, shares, mixed)):
            used.add(c)
            colour = COLOURS[c]
            fill = 1.0 if isinstance(c, Layout) else min(max(a, 0.0), 1.0)
            x0, w = centres[v] - widths[v] / 2, widths[v]
            ax.add_patch(Rectangle((x0, y), w, 1.0, facecolor=colour, alpha=0.28, linewidth=0))
            ax.add_patch(
                Rectangle(
                    (x0, y),
                    w,
                    0.9 * fill,
                    facecolor=colour,
                    linewidth=0,
                    hatch="////" if m else None,
                    edgecolor="white" if m else None,
                )
            )
        ax.axhline(y, color="white", linewidth=1.5)
    ax.set_ylim(0, len(levels))
    ax.set_yticks([len(levels) - 1 - r + 0.5 for r in range(len(levels))])
    ax.set_yticklabels([f"level {d + 1}  ({links.get(d, '')})" for d, *_ in levels], fontsize=8)
    ax.tick_params(axis="y", length=0)
    for spine in ("top", "right", "left"):
        ax.spines[spine].set_visible(False)
    ax.set_title(
        "partition choice per level (filled height = share of the first group; hatched = groups differ)",
        fontsize=9,
        loc="left",
    )
    handles = [
        Patch(facecolor=COLOURS[c], label=_LABELS[c])
        for c in (*TYPE_ORDER, *JOIN_LAYOUTS)
        if c in used
    ]
    ax.legend(
        handles=handles, loc="lower left", bbox_to_anchor=(1.0, 0.0), fontsize=8, frameon=False
    )


def _draw_times(ax, times: pd.DataFrame, centres: np.ndarray, widths: np.ndarray) -> None:
    x = centres
    base = np.zeros(len(times))
    for label, column in (
        ("compute", "compute_ms"),
        ("intra-layer", "intra_ms"),
        ("transition", "transition_ms"),
    ):
        values = times[column].to_numpy()
        ax.bar(
            x,
            values,
            bottom=base,
            width=0.8 * widths,
            color=_TIME_COLOURS[label],
            label=f"{label} communication" if label != "compute" else "compute",
            linewidth=0,
        )
        base = base + values
    ax.set_ylabel("time per step (ms)")
    ax.set_title("time per layer", fontsize=9, loc="left")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
