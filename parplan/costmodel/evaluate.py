"""The one evaluator: prices any plan on any problem (SPEC sections 4, 5, 7).

For every split (inner array node) and planning node: each side's time is the time of its
child group for that node (recursively; a device's is FLOPs / throughput) plus, if it
exchanges anything, the link latency and the bytes it receives over the link. The node's time
at the split is the max over the two sides; the step time is the root's sum over nodes.

Example:
    >>> from parplan.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.layout import PartitionType
    >>> from parplan.costmodel.problem import Plan, Split
    >>> p = Problem(get_model("vgg11"), parse_array("h100:2"), batch=32)
    >>> n = len(p.planning.nodes)
    >>> dp = Plan({"": Split((PartitionType.BATCH,) * n, (0.5,) * n)})
    >>> ev = evaluate(p, dp)
    >>> ev.step_time_s > 0, ev.communication_elements == 2 * sum(d.weight_elements for d in p.root_dims())
    (True, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd
from types import MappingProxyType

from parplan.costmodel.cost import comm_seconds, covered_below, intra_elements, node_comm, scale_for_sides
from parplan.costmodel.dims import LayerDims
from parplan.costmodel.hardware import ArrayNode
from parplan.costmodel.layout import JOIN_LAYOUTS, TYPE_ORDER
from parplan.costmodel.problem import Plan, Problem
from parplan.errors import ConfigError

_COLUMNS = [
    "level", "depth", "node", "choice", "share",
    "child_s_1", "child_s_2", "intra_elements_1", "intra_elements_2",
    "transition_elements_1", "transition_elements_2", "comm_s_1", "comm_s_2", "time_s",
]


@dataclass(frozen=True)
class Evaluation:
    """Price of a plan: step time, per-node root times, communication, per-split breakdown."""

    step_time_s: float
    node_time_s: tuple[float, ...]
    communication_elements: float
    communication_bytes: float
    breakdown: pd.DataFrame
    leaf_compute_s: tuple[float, ...]  # per node: the slowest device's compute time
    device_memory_bytes: Mapping[str, float]

    @property
    def peak_memory_bytes(self) -> float:
        """Largest per-device memory need (weights + gradients + stored activations)."""
        return max(self.device_memory_bytes.values())

    def level_communication(self) -> pd.Series:
        """Elements received (both sides) per split path."""
        b = self.breakdown
        total = (b.intra_elements_1 + b.intra_elements_2 + b.transition_elements_1 + b.transition_elements_2)
        return total.groupby(b.level, sort=False).sum()


def evaluate(problem: Problem, plan: Plan) -> Evaluation:
    """Price ``plan`` on ``problem``. Raises :class:`ConfigError` if the plan does not fit it."""
    pg = problem.planning
    n = len(pg.nodes)
    rows: list[tuple] = []
    for path, split in plan.splits.items():
        if len(split.choices) != n:
            raise ConfigError(
                f"plan split '{path or 'root'}' has {len(split.choices)} choices but model "
                f"'{pg.name}' has {n} planning nodes"
            )
        for v, c in enumerate(split.choices):
            valid = JOIN_LAYOUTS if pg.nodes[v].is_join else TYPE_ORDER
            if c not in valid:
                raise ConfigError(
                    f"plan split '{path or 'root'}': node '{pg.nodes[v].name}' cannot take choice "
                    f"{c.value!r}; valid: {[x.value for x in valid]}"
                )
    leaf_compute = np.zeros(n)
    memory: dict[str, float] = {}
    covered = (False,) * n
    times = _eval(problem, problem.array, "", 0, problem.root_dims(), plan, rows, leaf_compute, memory, covered)
    frame = pd.DataFrame(rows, columns=_COLUMNS)
    comm = float(
        (frame.intra_elements_1 + frame.intra_elements_2 + frame.transition_elements_1
         + frame.transition_elements_2).sum()
    ) if len(frame) else 0.0
    return Evaluation(
        step_time_s=float(times.sum()),
        node_time_s=tuple(float(t) for t in times),
        communication_elements=comm,
        communication_bytes=comm * problem.bytes_per_element,
        breakdown=frame,
        leaf_compute_s=tuple(float(t) for t in leaf_compute),
        device_memory_bytes=MappingProxyType(memory),
    )


def _eval(problem: Problem, group: ArrayNode, path: str, depth: int, dims: tuple[LayerDims, ...],
          plan: Plan, rows: list, leaf_compute: np.ndarray, memory: dict, covered: tuple[bool, ...]) -> np.ndarray:
    pg = problem.planning
    if group.is_leaf:
        t = np.array([d.flops / group.device.flops_per_s for d in dims])
        np.maximum(leaf_compute, t, out=leaf_compute)
        memory[path] = problem.bytes_per_element * sum(
            2 * d.weight_elements + d.in_elements for d, node in zip(dims, pg.nodes) if not node.is_join
        )
        return t
    if path not in plan.splits:
        raise ConfigError(
            f"plan has no split for group '{path or 'root'}' of array {problem.array.describe()} "
            f"(it has {sorted(plan.splits)}); was it made for another array?"
        )
    split = plan.splits[path]
    side = problem.side_spec(group)
    left_dims, right_dims = [], []
    for d, c, a in zip(dims, split.choices, split.shares):
        d1, d2 = scale_for_sides(d, c, a)
        left_dims.append(d1)
        right_dims.append(d2)
    below = covered_below(covered, split, problem.array.collective is not None)
    t_left = _eval(problem, group.left, path + "L", depth + 1, tuple(left_dims), plan, rows, leaf_compute, memory,
                   below)
    t_right = _eval(problem, group.right, path + "R", depth + 1, tuple(right_dims), plan, rows, leaf_compute,
                    memory, below)
    out = np.empty(len(dims))
    for v, node in enumerate(pg.nodes):
        c, a, d = split.choices[v], split.shares[v], dims[v]
        preds = tuple(split.choices[u] for u in node.preds)
        e1, e2 = node_comm(d, c, preds, node.fractions)
        i1, i2 = intra_elements(d, c, a)
        # communication part of each side's time (the compute part is the child's time)
        s1, s2 = comm_seconds(d, c, preds, node.fractions, side, a, covered[v])
        t1, t2 = t_left[v] + s1, t_right[v] + s2
        out[v] = max(t1, t2)
        rows.append((path, depth, node.name, c.value, a, t_left[v], t_right[v], i1, i2,
                     e1.at(a) - i1, e2.at(a) - i2, s1, s2, out[v]))
    return out
