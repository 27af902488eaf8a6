"""Exact MIP backends behind one interface (see :mod:`.registry`)."""

from parplan.solvers.backends.base import Backend, RawResult, SolveOptions, Termination
from parplan.solvers.backends.registry import (
    BACKENDS,
    BackendSpec,
    available_backends,
    backend_spec,
    get_backend,
)

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendSpec",
    "RawResult",
    "SolveOptions",
    "Termination",
    "available_backends",
    "backend_spec",
    "get_backend",
]
