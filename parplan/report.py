"""Human- and machine-readable reports of a priced plan (the CLI's ``plan`` output).

Example:
    >>> from parplan.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.costmodel.evaluate import evaluate
    >>> from parplan.solvers.planners import make_plan
    >>> p = Problem(get_model("alexnet"), parse_array("tpu-v2:1,tpu-v3:1"), batch=128)
    >>> r = plan_report(p, make_plan(p, "accpar"), evaluate(p, make_plan(p, "accpar")),
    ...                 evaluate(p, make_plan(p, "data")))
    >>> r.speedup >= 1.0, list(r.to_dict())[:3]
    (True, ['model', 'array', 'devices'])
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from parplan.costmodel.evaluate import Evaluation
from parplan.costmodel.layout import Layout, PartitionType
from parplan.costmodel.problem import Plan, Problem

_LETTER = {
    PartitionType.BATCH: "B", PartitionType.IN: "I", PartitionType.OUT: "O",
    Layout.ROWS: "r", Layout.COLS: "c", Layout.WHOLE: "w",
}


@dataclass(frozen=True)
class PlanReport:
    """A plan with its evaluation and the data-parallel baseline's, ready to print or serialise."""

    problem: Problem
    plan: Plan
    evaluation: Evaluation
    baseline: Evaluation
    wall_s: float | None = None

    @property
    def speedup(self) -> float:
        """Data-parallel step time / this plan's step time."""
        return self.baseline.step_time_s / self.evaluation.step_time_s

    def layer_frame(self) -> pd.DataFrame:
        """One row per planning node: root choice and share, compute, communication, time."""
        b = self.evaluation.breakdown
        comm = (b.intra_elements_1 + b.intra_elements_2).groupby(b.node, sort=False).sum()
        trans = (b.transition_elements_1 + b.transition_elements_2).groupby(b.node, sort=False).sum()
        root = self.plan.root
        rows = []
        bpe = self.problem.bytes_per_element
        for v, node in enumerate(self.problem.planning.nodes):
            t = self.evaluation.node_time_s[v]
            c = self.evaluation.leaf_compute_s[v]
            rows.append({
                "layer": node.name,
                "kind": "join" if node.is_join else ("fc" if node.is_fc else "conv"),
                "type": root.choices[v].value,
                "share": root.shares[v],
                "compute_s": c,
                "communication_s": max(t - c, 0.0),
                "time_s": t,
                "intra_bytes": float(comm.get(node.name, 0.0)) * bpe,
                "transition_bytes": float(trans.get(node.name, 0.0)) * bpe,
            })
        return pd.DataFrame(rows)

    def level_types(self) -> list[tuple[int, int, str, str]]:
        """Per depth: (depth, number of splits, letters one per node, link description)."""
        pg = self.problem.planning
        by_depth: dict[int, list[str]] = {}
        for path in self.plan.splits:
            by_depth.setdefault(len(path), []).append(path)
        groups = dict(self.problem.array.inner_nodes())
        out = []
        for depth in sorted(by_depth):
            paths = by_depth[depth]
            letters = []
            for v in range(len(pg.nodes)):
                seen = {self.plan.splits[p].choices[v] for p in paths}
                letters.append(_LETTER[seen.pop()] if len(seen) == 1 else "*")
            links = sorted({groups[p].link.bytes_per_s for p in paths if p in groups})
            link = "/".join(f"{bw / 1e9:g}" for bw in links) + " GB/s"
            out.append((depth, len(paths), "".join(letters), link))
        return out

    def to_dict(self) -> dict:
        p, ev = self.problem, self.evaluation
        return {
            "model": p.graph.name,
            "array": p.array.describe(),
            "devices": p.array.count,
            "batch": p.batch,
            "bytes_per_element": p.bytes_per_element,
            "planner": self.plan.planner,
            "options": dict(self.plan.info),
            "step_time_s": ev.step_time_s,
            "data_parallel_step_time_s": self.baseline.step_time_s,
            "speedup_over_data_parallel": self.speedup,
            "communication_bytes": ev.communication_bytes,
            "peak_device_memory_bytes": ev.peak_memory_bytes,
            "planning_wall_s": self.wall_s,
            "nodes": [n.name for n in p.planning.nodes],
            "levels": {
                path or "root": {
                    "depth": len(path),
                    "types": [c.value for c in split.choices],
                    "shares": list(split.shares),
                }
                for path, split in self.plan.splits.items()
            },
            "layers": self.layer_frame().to_dict(orient="records"),
        }

    def text(self) -> str:
        p, ev = self.problem, self.evaluation
        opts = ", ".join(f"{k} {v}" for k, v in self.plan.info.items())
        lines = [
            f"{p.graph.name} on {p.array.describe()} ({p.array.count} devices, {p.array.depth} levels), "
            f"batch {p.batch}, planner {self.plan.planner}" + (f" ({opts})" if opts else ""),
            "",
            f"{'layer':<24} {'kind':<4} {'type':<6} {'share':>6} {'compute ms':>11} {'comm ms':>9} "
            f"{'intra MB':>10} {'trans MB':>10} {'time ms':>9}",
        ]
        for r in self.layer_frame().itertuples():
            lines.append(
                f"{r.layer[:24]:<24} {r.kind:<4} {r.type:<6} {r.share:>6.3f} {r.compute_s * 1e3:>11.3f} "
                f"{r.communication_s * 1e3:>9.3f} {r.intra_bytes / 1e6:>10.2f} {r.transition_bytes / 1e6:>10.2f} "
                f"{r.time_s * 1e3:>9.3f}"
            )
        lines += [
            "",
            f"step time            {ev.step_time_s * 1e3:.3f} ms",
            f"data parallelism     {self.baseline.step_time_s * 1e3:.3f} ms  -> speedup {self.speedup:.2f}x",
            f"communication        {ev.communication_bytes / 1e6:.1f} MB per step (all levels)",
            f"peak device memory   {ev.peak_memory_bytes / 2**30:.2f} GiB (weights, gradients, optimizer state, activations)",
        ]
        if self.wall_s is not None:
            lines.append(f"planning time        {self.wall_s:.3f} s")
        lines += ["", "types per level (B=batch I=in O=out; joins r=rows c=cols w=whole; *=differs between groups):"]
        for depth, count, letters, link in self.level_types():
            lines.append(f"  level {depth} ({count} split{'s' if count > 1 else ''}, link {link}): {letters}")
        return "\n".join(lines)


def plan_report(problem: Problem, plan: Plan, evaluation: Evaluation, baseline: Evaluation,
                wall_s: float | None = None) -> PlanReport:
    return PlanReport(problem, plan, evaluation, baseline, wall_s)
