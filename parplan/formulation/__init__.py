"""Solver-neutral exact formulations: the MIP of one split (:mod:`.mip`) and of every split at once
(:mod:`.joint`, imported on use). Builders return ``(model, decoder)``; backends in
:mod:`parplan.solvers.backends` solve the model; decoders turn solutions into splits/plans."""

from parplan.formulation.mip import (
    FAMILIES,
    Constraint,
    MemoryLimit,
    MipModel,
    ModelBuilder,
    SplitDecoder,
    Variable,
    build_mip,
    memory_need_model,
)

__all__ = [
    "Constraint",
    "FAMILIES",
    "MemoryLimit",
    "MipModel",
    "ModelBuilder",
    "SplitDecoder",
    "Variable",
    "build_mip",
    "memory_need_model",
]
