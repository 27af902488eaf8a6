"""PipeDream's pipeline planner (SOSP'19): contiguous stages, each replicated, on a hierarchy.

The machine is a stack of levels (:class:`Machine`, lowest first). A level-``k`` machine is
``m_k`` level-``(k-1)`` machines joined by links of bandwidth ``B_k`` (a level-0 machine is one
device). Layers (a :class:`~parplan.pipeline.profile.PipelineProfile`, topological order) are
split into contiguous stages; a stage at level ``k`` runs on ``m`` level-``(k-1)`` machines as
data-parallel replicas, each replica running the best plan of those layers on one
level-``(k-1)`` machine. PipeDream's recurrences, in seconds per minibatch:

- ``T^k(i->j, m) = max(A^{k-1}(i->j), sync_k(W(i..j), m)) / m`` with ``A^0(i->j)`` the forward +
  backward seconds of layers ``i..j`` on one device and ``sync_k`` the all-reduce of the
  stage's weight bytes over ``m`` replicas on level-``k`` links (:class:`SyncModel`);
- ``A^k(i->j, m) = min(T^k(i->j, m), min over s, m' of max(A^k(i->s, m-m'),
  2 x (latency_k + cut_bytes(s) / B_k), T^k(s+1->j, m')))``;

the plan's time per minibatch is ``A^K(first->last, m_K)`` at the top level ``K``. A cut after
position ``s`` carries every tensor crossing it (on a chain, the activation of layer ``s``);
branching models are linearized in topological order and the result says so.

Every plan, from :func:`plan_pipeline` (the DP) or :func:`plan_exhaustive` (enumeration of
every nested plan, the cross-check), is priced by one evaluator, :func:`evaluate_plan`; a
result carries the solver's own objective next to the evaluator's price.

Memory per device of a stage = in-flight minibatches x (stage weights + stage activations)
(PipeDream's weight stashing: one weight version and one set of activations per minibatch in
flight). Under 1F1B a stage with ``r`` device replicas and ``D`` devices from it to the end of
the pipeline has ``ceil(D / r)`` minibatches in flight; for the input stage this is PipeDream's
NOAM. The DP enforces a memory limit exactly: it runs over suffixes and carries, per level,
how many devices follow per replica (see :class:`_Solver`). The one exception is a memory
limit together with idle devices on a multi-level machine, where a stage assumes the machines
after it use all their devices: the plan fits, but may be beaten by one the DP rejected.

Example:
    >>> from parplan.pipeline.profile import ProfiledLayer, PipelineProfile
    >>> layers = tuple(ProfiledLayer(f"l{i}", "", f, 2 * f, 1e6, 5e9) for i, f in enumerate((1.0, 1.0, 2.0)))
    >>> prof = PipelineProfile("toy", layers, (("l0", "l1"), ("l1", "l2")))
    >>> res = plan_pipeline(prof, flat_machine(2, bytes_per_s=1e9))
    >>> [(s.first, s.last, s.replicas) for s in res.stages], round(res.seconds_per_minibatch, 3)
    ([(0, 1, 1), (2, 2, 1)], 6.0)
    >>> round(res.speedup_vs_single, 2), round(res.speedup_vs_data_parallel, 2), res.noam
    (2.0, 1.25, 2)
"""

from __future__ import annotations

from parplan.pipeline.dp import plan_pipeline
from parplan.pipeline.evaluate import evaluate_plan
from parplan.pipeline.exhaustive import plan_exhaustive
from parplan.pipeline.machine import (
    Level,
    Machine,
    SyncModel,
    flat_machine,
    hierarchical_machine,
    machine_from_array,
    sync_seconds,
    transfer_seconds,
)
from parplan.pipeline.plans import (
    LevelPlan,
    PipelineOptions,
    PipelineResult,
    Stage,
    StageReport,
    data_parallel_plan,
)

__all__ = [
    "SyncModel",
    "Level",
    "Machine",
    "machine_from_array",
    "flat_machine",
    "hierarchical_machine",
    "PipelineOptions",
    "Stage",
    "LevelPlan",
    "StageReport",
    "PipelineResult",
    "plan_pipeline",
    "plan_exhaustive",
    "evaluate_plan",
    "data_parallel_plan",
    "sync_seconds",
    "transfer_seconds",
]
