"""The registry of exact backends, with capability flags and availability checks.

Availability is checked with :func:`importlib.util.find_spec` (the solver libraries are not
imported until a backend runs). Each backend module keeps its native-status map
(``STATUS_MAP``: native status -> :class:`~parplan.solvers.backends.base.Termination`).

==========  =====================================  ==========  =========================
name        solver                                 continuous  required modules
==========  =====================================  ==========  =========================
scip        SCIP via OR-Tools pywraplp             yes         ortools
cbc         CBC via PuLP (log parsed for bound)    yes         pulp
highs       HiGHS via highspy                      yes         highspy
cpsat       OR-Tools CP-SAT (integer model)        no          ortools
==========  =====================================  ==========  =========================

Example:
    >>> sorted(BACKENDS)
    ['cbc', 'cpsat', 'highs', 'scip']
    >>> BACKENDS["cpsat"].supports_continuous
    False
    >>> get_backend("scip").name
    'scip'
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from parplan.errors import ConfigError, SolverError


@dataclass(frozen=True)
class BackendSpec:
    """A registered backend: where its class lives and what it can do."""

    name: str
    description: str
    module: str
    cls: str
    supports_continuous: bool
    required_modules: tuple[str, ...]

    @property
    def available(self) -> bool:
        return all(_has_module(m) for m in self.required_modules)

    def status_map(self) -> dict:
        return dict(importlib.import_module(self.module).STATUS_MAP)


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


BACKENDS: dict[str, BackendSpec] = {
    s.name: s
    for s in (
        BackendSpec(
            "scip",
            "SCIP through OR-Tools pywraplp",
            "parplan.solvers.backends.scip",
            "ScipBackend",
            True,
            ("ortools",),
        ),
        BackendSpec(
            "cbc",
            "CBC through PuLP (status and bound read from CBC's log)",
            "parplan.solvers.backends.cbc",
            "CbcBackend",
            True,
            ("pulp",),
        ),
        BackendSpec(
            "highs",
            "HiGHS through highspy",
            "parplan.solvers.backends.highs",
            "HighsBackend",
            True,
            ("highspy", "numpy"),
        ),
        BackendSpec(
            "cpsat",
            "OR-Tools CP-SAT on the integer model (shares on a grid)",
            "parplan.solvers.backends.cpsat",
            "CpSatBackend",
            False,
            ("ortools",),
        ),
    )
}


def backend_spec(name: str) -> BackendSpec:
    key = name.strip().lower()
    if key not in BACKENDS:
        raise ConfigError(f"unknown backend '{name}'; valid backends: {', '.join(BACKENDS)}")
    return BACKENDS[key]


def available_backends() -> list[str]:
    """Names of the registered backends whose libraries are installed."""
    return [n for n, s in BACKENDS.items() if s.available]


def get_backend(name: str):
    """An instance of backend ``name``; raises if unknown or its library is missing."""
    spec = backend_spec(name)
    if not spec.available:
        missing = [m for m in spec.required_modules if not _has_module(m)]
        raise SolverError(
            f"backend '{spec.name}' needs the Python modules {missing}; install them "
            f"(pip install {' '.join(missing)}) or choose one of {available_backends()}"
        )
    return getattr(importlib.import_module(spec.module), spec.cls)()
