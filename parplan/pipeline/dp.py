"""PipeDream's dynamic program over suffixes, level by level (see :mod:`parplan.pipeline.planner`)."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from fractions import Fraction

import numpy as np

from parplan.errors import ConfigError, InfeasibleError
from parplan.pipeline.profile import PipelineProfile
from parplan.pipeline.machine import Machine, SyncModel, transfer_seconds
from parplan.pipeline.plans import LevelPlan, PipelineOptions, PipelineResult, Stage
from parplan.pipeline.evaluate import _Sums, evaluate_plan

_INF = math.inf


class _Solver:
    """PipeDream's DP in suffix form, memory-exact through the downstream parameter ``q``.

    Under 1F1B a flat stage with ``r`` device replicas and ``D`` devices from it to the end of
    the pipeline holds ``ceil(D / r)`` minibatches. Seen from a level-``k`` plan that is itself
    replicated ``R`` times (all enclosing replications) with ``a`` devices after it, the only
    outside information a stage inside it needs is ``q = a / R``: a level-1 stage on ``rho``
    devices with ``d`` devices from it to the end of its level-1 machine holds
    ``ceil((d + q) / rho)``. A stage on ``r`` of ``m`` machines, followed by ``m - r`` machines
    of ``devices_below`` devices each, passes ``q' = (q + (m - r) x devices_below) / r`` to its
    inner plan. Tables ``A^k(i->j, m | q)`` are memoised per distinct ``q`` (one per level
    without a memory limit).
    """

    def __init__(self, sums: _Sums, machine: Machine, options: PipelineOptions):
        self.sums, self.machine, self.options = sums, machine, options
        self.limit = options.memory_limit_bytes
        self.X = [np.array([transfer_seconds(b, lvl) for b in sums.cut]) for lvl in machine.levels]
        self._stage: dict = {}
        self._tables: dict = {}

    def _q(self, q: Fraction) -> Fraction:
        return Fraction(0) if self.limit is None else q

    def stage_times(self, k: int, r: int, q: Fraction) -> np.ndarray:
        """``T^k(i->s, r)[i, s]`` for a stage on ``r`` machines whose inner plans see ``q``."""
        key = (k, r, self._q(q))
        if key in self._stage:
            return self._stage[key]
        n, lvl = self.sums.n, self.machine.levels[k - 1]
        if r > 1 and not self.options.replication:
            out = np.full((n, n), _INF)
        else:
            if k == 1:
                inner = self.sums.compute
                if self.limit is not None:
                    in_flight = math.ceil(1 + q)
                    inner = np.where(in_flight * self.sums.stash <= self.limit, inner, _INF)
            else:
                inner = self.full(k - 1, q)[0]
            if r == 1:
                sync = 0.0
            elif self.options.sync is SyncModel.RING:
                sync = (
                    2.0 * (r - 1) / r * self.sums.params / lvl.bytes_per_s
                    + 2.0 * (r - 1) * lvl.latency_s
                )
            else:
                sync = 2.0 * (r - 1) * self.sums.params / lvl.bytes_per_s
            out = np.maximum(inner, sync) / r
        self._stage[key] = out
        return out

    def table(self, k: int, q: Fraction, top: bool = False):
        """(A, choice_s, choice_r): best time of layers i..j on m level-k machines.

        ``top``: only ranges ending at the last layer (arrays indexed [i, m]). The first stage
        of range i..j is i..s on r machines; ``choice_s == j`` means one stage on all m.
        """
        key = (k, self._q(q), top)
        if key in self._tables:
            return self._tables[key]
        n = self.sums.n
        M = self.machine.levels[k - 1].machines
        below = self.machine.devices_below(k - 1)
        X = self.X[k - 1]
        shape = (n, M + 1) if top else (n, n, M + 1)
        A = np.full(shape, _INF)
        cs = np.zeros(shape, dtype=np.int64)
        cr = np.zeros(shape, dtype=np.int64)
        for m in range(1, M + 1):
            single = self.stage_times(k, m, q / m)
            best = single[:, n - 1].copy() if top else single.copy()
            bs = (
                np.full(best.shape, n - 1, dtype=np.int64)
                if top
                else np.broadcast_to(np.arange(n), (n, n)).copy()
            )
            br = np.full(best.shape, m, dtype=np.int64)
            for r in range(1, m):
                if n == 1:
                    break
                T = self.stage_times(k, r, (q + (m - r) * below) / r)
                left = np.maximum(T[:, : n - 1], X[None, :])  # [i, s]
                if top:
                    cand = np.maximum(left, A[1:n, m - r][None, :])
                    s_best = cand.argmin(axis=1)
                    val = cand[np.arange(n), s_best]
                else:
                    cube = np.maximum(left[:, :, None], A[1:n, :, m - r][None, :, :])  # [i, s, j]
                    s_best = cube.argmin(axis=1)
                    val = np.take_along_axis(cube, s_best[:, None, :], axis=1)[:, 0, :]
                better = val < best
                best = np.where(better, val, best)
                bs = np.where(better, s_best, bs)
                br = np.where(better, r, br)
            A[..., m] = best
            cs[..., m] = bs
            cr[..., m] = br
        self._tables[key] = (A, cs, cr)
        return A, cs, cr

    def full(self, k: int, q: Fraction) -> tuple[np.ndarray, np.ndarray]:
        """Best time of each range on one whole level-k machine, and the machines it uses."""
        key = ("full", k, self._q(q))
        if key not in self._tables:
            A = self.table(k, q)[0]
            M = self.machine.levels[k - 1].machines
            if self.options.allow_idle:
                m_used = A[:, :, 1:].argmin(axis=2) + 1  # first minimum: fewest machines on ties
                best = np.take_along_axis(A, m_used[:, :, None], axis=2)[:, :, 0]
            else:
                m_used, best = np.full(A.shape[:2], M, dtype=np.int64), A[:, :, M]
            self._tables[key] = (best, m_used)
        return self._tables[key]

    def plan(self, k: int, i: int, j: int, m: int, q: Fraction, top: bool = False) -> LevelPlan:
        """Reconstruct the level-k plan of layers i..j on m machines from the choices."""
        _, cs, cr = self.table(k, q, top)
        below = self.machine.devices_below(k - 1)
        stages = []
        while True:
            idx = (i, m) if top else (i, j, m)
            s, r = int(cs[idx]), int(cr[idx])
            q_inner = q / m if s == j else (q + (m - r) * below) / r
            inner = None
            if k > 1:
                inner = self.plan(k - 1, i, s, int(self.full(k - 1, q_inner)[1][i, s]), q_inner)
            stages.append(Stage(i, s, r, inner))
            if s == j:
                return LevelPlan(k, tuple(stages))
            i, m = s + 1, m - r


#: Most machines one level of a pipeline machine may have: the DP's table loop runs over
#: (machines)^2 / 2 pairs per level (2,048: about 2 million).
MAX_LEVEL_MACHINES = 2048


def plan_pipeline(
    profile: PipelineProfile, machine: Machine, options: PipelineOptions = PipelineOptions()
) -> PipelineResult:
    """PipeDream's DP over ``profile`` on ``machine`` (see the module docstring).

    Every level fills ``A^k(i->j, m)`` over suffixes (first stage, then the rest) so that each
    stage knows how many devices follow it and the 1F1B memory check is exact; the top level
    only needs ranges ending at the last layer. Ties go to fewer stages, then earlier cuts.
    Raises :class:`~parplan.errors.InfeasibleError` when no plan fits the memory limit or a
    straight pipeline has more devices than layers (allow idle devices, or replication).
    """
    t0 = time.perf_counter()
    widest = max(machine.levels, key=lambda lv: lv.machines)
    if widest.machines > MAX_LEVEL_MACHINES:
        raise ConfigError(
            "the pipeline planner's DP is quadratic in the machines of a level, and level "
            f"{machine.levels.index(widest) + 1} "
            f"has {widest.machines} (limit {MAX_LEVEL_MACHINES}): describe the array as nodes (e.g. 'dgx-h100:N', or a "
            f"tree file whose nodes have their own links) or plan fewer devices"
        )
    sums = _Sums(profile)
    n, K = sums.n, len(machine.levels)
    solver = _Solver(sums, machine, options)
    B = solver.table(K, Fraction(0), top=True)[0]
    M = machine.levels[K - 1].machines
    m_top = int(np.argmin(B[0, 1:]) + 1) if options.allow_idle else M
    objective = float(B[0, m_top])
    if not math.isfinite(objective):
        raise InfeasibleError(_infeasible_message(profile, machine, options, sums))
    plan = solver.plan(K, 0, n - 1, m_top, Fraction(0), top=True)
    result = evaluate_plan(
        profile,
        machine,
        plan,
        options,
        solver="dp",
        objective_seconds=objective,
        solve_seconds=time.perf_counter() - t0,
    )
    if K > 1 and options.memory_limit_bytes is not None and options.allow_idle:
        note = (
            "memory limit with idle devices on a multi-level machine: stages assume the machines after them use "
            "all their devices, so the plan fits but a plan the DP rejected may be faster"
        )
        result = replace(result, notes=result.notes + (note,))
    return result


def _infeasible_message(
    profile: PipelineProfile, machine: Machine, options: PipelineOptions, sums: _Sums
) -> str:
    if not options.replication and not options.allow_idle and sums.n < machine.devices:
        return (
            f"model '{profile.name}': a straight pipeline needs one layer per device but has {sums.n} layers for "
            f"{machine.devices} devices; allow idle devices or replication"
        )
    biggest = max(float(sums.stash[i, i]) for i in range(sums.n))
    limit = options.memory_limit_bytes or _INF
    return (
        f"model '{profile.name}': no pipeline fits the memory limit of {limit / 2**30:.3g} GiB per device "
        f"(the largest layer alone stashes {biggest / 2**30:.3g} GiB per in-flight minibatch); "
        "raise the memory limit, allow replication or use more devices"
    )


# --------------------------------------------------------------------------------------------
# Exhaustive cross-check.
