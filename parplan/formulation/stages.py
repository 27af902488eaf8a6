"""The pipeline planner's choice of stage cuts as a solver-neutral MIP (issue 32; docs/pipeline.md
"Pipeline x partition x data").

Given, for ``p`` stages in order over ``K`` units of layers, each stage's time per micro-batch on
units ``a..b-1`` (``costs[s][a, b]``, ``inf`` where it does not fit) and the transfer before stage
``s`` at boundary ``a`` (``transfers[s][a]``), a synchronous pipeline of ``m`` micro-batches takes
``sum c + sum x + (m - 1) max(c, x)`` (docs/costmodel.md section 11).
:func:`parplan.pipeline.partitioned._dp` minimises it by a DP over the cuts for every threshold
on the max; this model states the same problem for an exact solver:

- a binary ``y[s, a, b]`` per stage and finite segment: stage ``s`` runs units ``a..b-1``;
- stage 0 starts at boundary 0, the last stage ends at ``K``, and each stage starts where the one
  before it ended (``sum_a' y[s-1, a', a] = sum_b y[s, a, b]`` at every boundary ``a``), so exactly
  one segment per stage is chosen and the stages tile the units;
- ``tau >= sum y c`` for every stage and ``tau >= sum y x`` for every transfer (the max);
- minimise ``sum y (c + x) + (m - 1) tau``.

Its optimum is the DP's value (a test checks both, and brute force, on random instances); where
the DP stops early (more thresholds than ``MAX_TAUS``) the solver's bound certifies the split.

Example (two stages over three units; stage times in seconds):
    >>> import math, numpy as np
    >>> inf = math.inf
    >>> c0 = np.array([[inf, 1.0, 2.0, 3.0], [inf] * 4, [inf] * 4, [inf] * 4])
    >>> c1 = np.array([[inf] * 4, [inf, inf, inf, 2.0], [inf, inf, inf, 0.5], [inf] * 4])
    >>> model, decode = build_stage_mip([c0, c1], [np.zeros(4), np.full(4, 0.1)], 4)
    >>> model.n_vars, model.n_constraints  # 4 segments and the max; start, 2 flows, 3 maxima
    (5, 6)
    >>> from parplan.solvers.backends import SolveOptions, get_backend
    >>> raw = get_backend("highs").solve(model, SolveOptions())
    >>> decode(raw), round(raw.objective / model.objective_scale, 9)  # 2 + 0.5 + 0.1 + 3 * 2
    ((0, 2, 3), 8.6)
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from parplan.costmodel.stages import pipeline_step
from parplan.errors import ConfigError
from parplan.formulation.mip import TIME_UNITS, MipModel, ModelBuilder

__all__ = ["build_stage_mip", "stage_value"]


def build_stage_mip(
    costs: Sequence[np.ndarray], transfers: Sequence[np.ndarray], micro_batches: int
) -> tuple[MipModel, Callable]:
    """(model, decoder) of the stage-cut problem (module docstring); times in ms in the model
    (``objective_scale``). The decoder maps a solver's result to the boundaries ``(0, b_1, ...,
    K)`` of the chosen stages. Raises :class:`ConfigError` when no split into ``p`` stages has
    finite costs."""
    p = len(costs)
    if p < 1 or len(transfers) != p:
        raise ConfigError(f"stage MIP: {p} stage cost tables and {len(transfers)} transfer rows")
    last = costs[0].shape[0] - 1
    m = int(micro_batches)
    b = ModelBuilder(f"stages_{p}x{last}")
    y: dict[tuple[int, int, int], int] = {}
    for s in range(p):
        starts = [0] if s == 0 else range(1, last)
        for a in starts:
            ends = [last] if s == p - 1 else range(a + 1, last)
            for e in ends:
                c = float(costs[s][a, e])
                x = float(transfers[s][a]) if s else 0.0
                if math.isfinite(c) and math.isfinite(x):
                    y[s, a, e] = b.var(f"y_{s}_{a}_{e}", integer=True)
    if not any(k[0] == p - 1 for k in y) or not any(k[0] == 0 for k in y):
        raise ConfigError("stage MIP: no split into these stages has finite costs")
    finite = [float(costs[s][a, e]) for s, a, e in y] + [
        float(transfers[s][a]) for s, a, _ in y if s
    ]
    tau = b.var("tau", 0.0, max(finite) * TIME_UNITS)
    b.constraint("one_hot", "start", [(i, 1.0) for (s, _, _), i in y.items() if s == 0], "==", 1.0)
    for s in range(1, p):
        for a in range(1, last):
            terms = [(i, 1.0) for (t, _, e), i in y.items() if t == s - 1 and e == a]
            terms += [(i, -1.0) for (t, f, _), i in y.items() if t == s and f == a]
            if terms:
                b.constraint("edge_link", f"flow_{s}_{a}", terms, "==", 0.0)
    for s in range(p):
        stage = [(i, float(costs[t][a, e]) * TIME_UNITS) for (t, a, e), i in y.items() if t == s]
        b.constraint("node_time", f"max_c_{s}", stage + [(tau, -1.0)], "<=", 0.0)
        if s:
            moved = [
                (i, float(transfers[t][a]) * TIME_UNITS) for (t, a, _), i in y.items() if t == s
            ]
            b.constraint("node_time", f"max_x_{s}", moved + [(tau, -1.0)], "<=", 0.0)
    for (s, a, e), i in y.items():
        cost = float(costs[s][a, e]) + (float(transfers[s][a]) if s else 0.0)
        b.objective(i, cost * TIME_UNITS)
    b.objective(tau, float(m - 1))
    model = b.build(objective_scale=TIME_UNITS, objective_unit="s")
    keys = list(y)

    def decode(raw) -> tuple[int, ...]:
        chosen = sorted(
            (k for k in keys if raw.values[y[k]] > 0.5), key=lambda k: k[0]
        )  # one per stage
        return (0, *(e for _, _, e in chosen))

    return model, decode


def stage_value(
    costs: Sequence[np.ndarray], transfers: Sequence[np.ndarray], micro_batches: int, bounds
) -> float:
    """The step of the stages ``bounds`` by the pipeline formula (the DP's and the MIP's
    objective): ``sum c + sum x + (m - 1) max(c, x)``."""
    p = len(costs)
    return pipeline_step(
        [costs[s][bounds[s], bounds[s + 1]] for s in range(p)],
        [transfers[s][bounds[s]] for s in range(1, p)],
        micro_batches,
    )
