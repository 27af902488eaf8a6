"""Pipeline-parallel planning (PipeDream): profiles and the stage/replication planner.

Example:
    >>> from parplan.pipeline import flat_machine, plan_pipeline, profile_from_graph
    >>> from parplan.costmodel.graph import Graph, Linear, Shape
    >>> g = Graph("mlp", Shape(1024), tuple(
    ...     Linear(f"fc{i}", (f"fc{i - 1}" if i else "input",), out_features=1024) for i in range(4)))
    >>> res = plan_pipeline(profile_from_graph(g, batch=32, device=1e12), flat_machine(2, 1e9))
    >>> [s.replicas for s in res.stages]
    [1, 1]
"""

from parplan.pipeline.planner import (
    Level,
    LevelPlan,
    Machine,
    PipelineOptions,
    PipelineResult,
    Stage,
    StageReport,
    SyncModel,
    data_parallel_plan,
    evaluate_plan,
    flat_machine,
    hierarchical_machine,
    machine_from_array,
    plan_exhaustive,
    plan_pipeline,
    sync_seconds,
    transfer_seconds,
)
from parplan.pipeline.profile import (
    PipelineProfile,
    ProfiledLayer,
    parse_profile,
    profile_from_graph,
    read_profile,
)

__all__ = [
    "Level",
    "LevelPlan",
    "Machine",
    "PipelineOptions",
    "PipelineProfile",
    "PipelineResult",
    "ProfiledLayer",
    "Stage",
    "StageReport",
    "SyncModel",
    "data_parallel_plan",
    "evaluate_plan",
    "flat_machine",
    "hierarchical_machine",
    "machine_from_array",
    "parse_profile",
    "plan_exhaustive",
    "plan_pipeline",
    "profile_from_graph",
    "read_profile",
    "sync_seconds",
    "transfer_seconds",
]
