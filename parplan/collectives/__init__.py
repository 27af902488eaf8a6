"""Collective communication: topologies, all-reduce schedules (ring, double binary tree, 2D
ring, MultiTree), their validator and time model.

Example:
    >>> from parplan.collectives import allreduce_seconds, torus2d
    >>> round(allreduce_seconds("multitree", torus2d(4, 4), 2**20) * 1e6, 1)  # 10 steps x (1 us + 64 KiB / 25 GB/s)
    36.2
"""

from parplan.collectives.allreduce import (
    Algorithm,
    Schedule,
    Transfer,
    Validation,
    allreduce_seconds,
    best_schedule,
    build_schedule,
    dbtree_schedule,
    lower_bound_steps,
    multitree_schedule,
    ring2d_schedule,
    ring_schedule,
    schedule_seconds,
    validate_schedule,
)
from parplan.collectives.topology import (
    Topology,
    fat_tree,
    from_edge_list,
    mesh2d,
    parse_topology,
    ring,
    torus2d,
)

__all__ = [
    "Algorithm",
    "Schedule",
    "Transfer",
    "Validation",
    "Topology",
    "allreduce_seconds",
    "best_schedule",
    "build_schedule",
    "dbtree_schedule",
    "fat_tree",
    "from_edge_list",
    "lower_bound_steps",
    "mesh2d",
    "multitree_schedule",
    "parse_topology",
    "ring",
    "ring2d_schedule",
    "ring_schedule",
    "schedule_seconds",
    "torus2d",
    "validate_schedule",
]
