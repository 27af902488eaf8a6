"""Human- and machine-readable reports of a priced plan (the CLI's ``plan`` output).

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import has_work, Problem
    >>> from parplan.costmodel.evaluate import evaluate
    >>> from parplan.solvers.planners import make_plan
    >>> p = Problem(get_model("alexnet"), parse_array("tpu-v2:1,tpu-v3:1"), batch=128)
    >>> r = plan_report(p, make_plan(p, "accpar"), evaluate(p, make_plan(p, "accpar")),
    ...                 evaluate(p, make_plan(p, "data")))
    >>> r.speedup >= 1.0, list(r.to_dict())[:3]
    (True, ['parplan_version', 'model', 'array'])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from parplan.costmodel.evaluate import _COLUMNS, Evaluation
from parplan.costmodel.layout import Layout, PartitionType
from parplan.costmodel.problem import Plan, Problem, has_work

if TYPE_CHECKING:  # imported on demand by layer_frame
    import pandas as pd

_LETTER = {
    PartitionType.BATCH: "B",
    PartitionType.IN: "I",
    PartitionType.OUT: "O",
    Layout.ROWS: "r",
    Layout.COLS: "c",
    Layout.WHOLE: "w",
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

    def layer_rows(self) -> list[dict]:
        """One row per planning node: root choice and share, compute, communication, time
        (plain dicts: printing a plan does not import pandas)."""
        node_at, intra_at = (
            _COLUMNS.index("node"),
            (_COLUMNS.index("intra_elements_1"), _COLUMNS.index("intra_elements_2")),
        )
        trans_at = (
            _COLUMNS.index("transition_elements_1"),
            _COLUMNS.index("transition_elements_2"),
        )
        comm: dict[str, float] = {}
        trans: dict[str, float] = {}
        for r in self.evaluation.rows:
            comm[r[node_at]] = comm.get(r[node_at], 0.0) + r[intra_at[0]] + r[intra_at[1]]
            trans[r[node_at]] = trans.get(r[node_at], 0.0) + r[trans_at[0]] + r[trans_at[1]]
        root = self.plan.splits.get("")  # None on a one-device array: nothing is split
        rows = []
        bpe = self.problem.bytes_per_element
        for v, node in enumerate(self.problem.planning.nodes):
            t = self.evaluation.node_time_s[v]
            c = self.evaluation.leaf_compute_s[v]
            rows.append(
                {
                    "layer": node.name,
                    "kind": "join" if node.is_join else ("fc" if node.is_fc else "conv"),
                    "type": root.choices[v].value if root else "-",
                    "share": root.shares[v] if root else 1.0,
                    "compute_s": c,
                    "communication_s": max(t - c, 0.0),
                    "time_s": t,
                    "intra_bytes": float(comm.get(node.name, 0.0)) * bpe,
                    "transition_bytes": float(trans.get(node.name, 0.0)) * bpe,
                }
            )
        return rows

    def layer_frame(self) -> pd.DataFrame:
        """:meth:`layer_rows` as a pandas frame."""
        import pandas as pd

        return pd.DataFrame(self.layer_rows())

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
            links = sorted(
                {(groups[p].link.ports, groups[p].link.bytes_per_s) for p in paths if p in groups}
            )
            # a switched fabric's link: ports x one port's bandwidth (docs/costmodel.md section 4.1)
            link = (
                "/".join(f"{n} x {bw / 1e9:g}" if n > 1 else f"{bw / 1e9:g}" for n, bw in links)
                + " GB/s"
            )
            out.append((depth, len(paths), "".join(letters), link))
        return out

    def metadata(self) -> dict:
        """Run metadata carried by every CSV row and JSON output (so runs can be concatenated)."""
        from parplan.costmodel.planio import parplan_version

        p = self.problem
        return {
            "model": p.graph.name,
            "array": p.array.describe(),
            "devices": p.array.count,
            "batch": p.batch,
            "planner": self.plan.planner,
            "zero_stage": p.zero_stage,
            "recompute": p.recompute,
            "checkpoint": p.checkpoint,
            "micro_batches": p.micro_batches,
            "bytes_per_element": p.bytes_per_element,
            "optimizer_bytes_per_param": p.optimizer_bytes_per_param,
            "overlap": p.overlap,
            "parplan_version": parplan_version(),
        }

    def to_dict(self) -> dict:
        p, ev = self.problem, self.evaluation
        return {
            "parplan_version": self.metadata()["parplan_version"],
            "model": p.graph.name,
            "array": p.array.describe(),
            "devices": p.array.count,
            "batch": p.batch,
            "bytes_per_element": p.bytes_per_element,
            "optimizer_bytes_per_param": p.optimizer_bytes_per_param,
            "zero_stage": p.zero_stage,
            "recompute": p.recompute,
            "checkpoint": p.checkpoint,
            "micro_batches": p.micro_batches,
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
            "layers": self.layer_rows(),
        }

    def text(self) -> str:
        p, ev = self.problem, self.evaluation
        opts = ", ".join(f"{k} {v}" for k, v in self.plan.info.items())
        frame = self.layer_rows()
        tu, tf = time_unit(max(max(r["time_s"], r["compute_s"]) for r in frame))
        bu, bf = byte_unit(max(max(r["intra_bytes"], r["transition_bytes"]) for r in frame))
        levels = p.array.depth
        width = max(
            24, min(64, max((len(r["layer"]) for r in frame), default=0))
        )  # whole names, up to 64

        def kind_of(r) -> str:
            # a split that leaves a layer to one half is not a batch (or any) split of it
            if r["type"] == "-":  # one device: no split
                return "-"
            return "right" if r["share"] == 0.0 else "left" if r["share"] == 1.0 else r["type"]

        lines = [
            f"{p.graph.name} on {p.array.describe()} ({p.array.count} device{'s' * (p.array.count != 1)}, "
            f"{levels} level{'s' * (levels != 1)}), batch {p.batch}, planner {self.plan.planner}"
            + (f" ({opts})" if opts else ""),
            "",
            f"{'layer':<{width}} {'kind':<4} {'type':<6} {'left':>6} {'compute ' + tu:>11} {'comm ' + tu:>9} "
            f"{'intra ' + bu:>10} {'trans ' + bu:>10} {'time ' + tu:>9}",
        ]
        for r in frame:
            lines.append(
                f"{r['layer'][:width]:<{width}} {r['kind']:<4} {kind_of(r):<6} {r['share']:>6.3f} "
                f"{r['compute_s'] * tf:>11.3f} "
                f"{r['communication_s'] * tf:>9.3f} {r['intra_bytes'] * bf:>10.2f} {r['transition_bytes'] * bf:>10.2f} "
                f"{r['time_s'] * tf:>9.3f}"
            )
        lines += [
            "",
            f"step time            {format_time(ev.step_time_s)}",
            f"data parallelism     {format_time(self.baseline.step_time_s)}  -> speedup {self.speedup:.2f}x",
            f"communication        {format_bytes(ev.communication_bytes)} per step (all levels)",
            f"peak device memory   {format_bytes(ev.peak_memory_bytes)} "
            "(weights, gradients, optimizer state, activations"
            + "".join(
                f"; {x}"
                for x in (
                    f"ZeRO stage {p.zero_stage}" if p.zero_stage else "",
                    ("recomputation" if p.checkpoint == "block" else "recomputation per layer")
                    if p.recompute
                    else "",
                    f"{p.micro_batches} micro-batches" if p.micro_batches > 1 else "",
                )
                if x
            )
            + ")",
        ]
        if self.wall_s is not None:
            lines.append(f"planning time        {format_time(self.wall_s)}")
        if p.array.is_leaf:
            return "\n".join(lines + ["", "one device: nothing to split"])
        lines += [
            "",
            "types per level (level 1 = the root split; B=batch I=in O=out; joins r=rows c=cols w=whole; "
            "*=differs between groups):",
        ]
        for depth, count, letters, link in self.level_types():
            lines.append(
                f"  level {depth + 1} ({count} split{'s' if count > 1 else ''}, link {link}): {letters}"
            )
        idle = self.idle_halves()
        if idle:
            path, fraction, side = idle[0]
            others = (
                f"; {len(idle) - 1} more split{'s' * (len(idle) != 2)} like it"
                if len(idle) > 1
                else ""
            )
            lines += [
                "",
                f"note: at split {path or 'root'} the {side} half has no work for {fraction:.0%} of the step "
                f"(its devices wait: giving them work would cost more in communication than it saves"
                f"{others})",
            ]
        return "\n".join(lines)

    def idle_halves(self, threshold: float = 0.5) -> list[tuple[str, float, str]]:
        """Splits where one half has no work for more than ``threshold`` of the step: (split path,
        fraction of the step, "left" or "right"), the largest first. A node leaves a half idle at a
        split where its share gives that half nothing; its part of the step is its root time."""
        ev, plan = self.evaluation, self.plan
        total = ev.step_time_s
        if not total > 0:
            return []
        out = []
        for path, split in plan.splits.items():
            for side, empty in (("left", 0.0), ("right", 1.0)):
                idle = sum(
                    t
                    for t, a, v in zip(ev.node_time_s, split.shares, range(len(split.shares)))
                    if a == empty and has_work(plan.splits, path, v)
                )
                if idle / total > threshold:
                    out.append((path, idle / total, side))
        return sorted(out, key=lambda r: -r[1])


#: (unit, factor from seconds), largest first.
_TIME_UNITS = (("s", 1.0), ("ms", 1e3), ("us", 1e6), ("ns", 1e9))
#: (unit, factor from bytes), largest first; binary units throughout.
_BYTE_UNITS = (("GiB", 2.0**-30), ("MiB", 2.0**-20), ("KiB", 2.0**-10), ("B", 1.0))


def _unit(largest: float, units: tuple[tuple[str, float], ...]) -> tuple[str, float]:
    """The first (largest) unit in which ``largest`` reads as at least 1; the second for 0."""
    if not largest > 0:
        return units[1]
    return next(((u, f) for u, f in units if largest * f >= 1.0), units[-1])


def time_unit(largest_s: float) -> tuple[str, float]:
    """The unit in which ``largest_s`` reads as at least 1 (down to ns): (name, factor).

    Example:
        >>> time_unit(0.0123), time_unit(4e-7), time_unit(0.0)
        (('ms', 1000.0), ('ns', 1000000000.0), ('ms', 1000.0))
    """
    return _unit(largest_s, _TIME_UNITS)


def byte_unit(largest_bytes: float) -> tuple[str, float]:
    """The binary unit in which ``largest_bytes`` reads as at least 1: (name, factor).

    Example:
        >>> byte_unit(3 * 2**20)[0], byte_unit(100)[0], byte_unit(0)[0]
        ('MiB', 'B', 'MiB')
    """
    return _unit(largest_bytes, _BYTE_UNITS)


def format_time(seconds: float) -> str:
    """``0.00123`` -> ``'1.230 ms'``."""
    unit, factor = time_unit(seconds)
    return f"{seconds * factor:.3f} {unit}"


def format_bytes(n: float) -> str:
    """``3 * 2**30`` -> ``'3.00 GiB'``."""
    unit, factor = byte_unit(n)
    return f"{n * factor:.2f} {unit}"


def plan_report(
    problem: Problem,
    plan: Plan,
    evaluation: Evaluation,
    baseline: Evaluation,
    wall_s: float | None = None,
) -> PlanReport:
    return PlanReport(problem, plan, evaluation, baseline, wall_s)
