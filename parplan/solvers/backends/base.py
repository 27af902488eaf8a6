"""What every exact backend takes and returns (the solver side of the stages in docs/architecture.md).

A backend turns a solver-neutral :class:`~parplan.formulation.mip.MipModel` into a
:class:`RawResult`: why the solver stopped (:class:`Termination`), whether it holds a solution,
the variable values in model order, the objective and the proven bound (both in model units),
the solver's name and version and the wall time. Backends never decide what "optimal" means
for the planning problem; :mod:`parplan.solvers.exact` does, from the bound.

Example:
    >>> SolveOptions(time_limit_s=5).mip_gap
    1e-09
    >>> Termination("time_limit") is Termination.TIME_LIMIT
    True
"""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Callable, Protocol

import numpy as np

from parplan.errors import ConfigError, SolverError


class Termination(StrEnum):
    """Why the solver stopped (separate from whether it holds a solution). A ``StrEnum``: it
    compares equal to, prints and serialises as its value."""

    OPTIMAL = "optimal"  # the solver proved its solution optimal within mip_gap
    TIME_LIMIT = "time_limit"  # stopped by the time limit (with or without a solution)
    INFEASIBLE = "infeasible"  # proved that the model has no solution
    ERROR = "error"  # the solver failed or stopped for another reason
    NOT_SOLVED = "not_solved"  # no exact model was solved (too large: a fallback plan)
    MIXED = "mixed"  # a certificate over several splits whose solves did not all end optimal


#: Time limits above this (one year) mean "no limit".
MAX_TIME_LIMIT_S = 365 * 24 * 3600.0
#: More solver threads than this is a mistake, not a machine.
MAX_THREADS = 1024


@dataclass(frozen=True)
class SolveOptions:
    """Settings of one solve. ``time_limit_s`` None means no limit; ``mip_gap`` is relative."""

    time_limit_s: float | None = None
    threads: int = 1
    seed: int = 0
    mip_gap: float = 1e-9
    verbose: bool = False

    def __post_init__(self):
        t = self.time_limit_s
        if t is not None:
            if (
                isinstance(t, bool)
                or not isinstance(t, (int, float, np.number))
                or math.isnan(t)
                or not t > 0
            ):
                raise ConfigError(f"time limit must be a number > 0 of seconds (got {t!r})")
            # Solvers take int64 milliseconds or timers with a finite range: beyond a year, no limit.
            object.__setattr__(self, "time_limit_s", None if t > MAX_TIME_LIMIT_S else float(t))
        for name in ("threads", "seed"):
            value = getattr(self, name)
            if isinstance(value, np.integer):
                object.__setattr__(self, name, int(value))
        if (
            not isinstance(self.threads, int)
            or isinstance(self.threads, bool)
            or not 1 <= self.threads <= MAX_THREADS
        ):
            raise ConfigError(
                f"threads must be an integer in [1, {MAX_THREADS}] (got {self.threads!r})"
            )
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigError(f"seed must be an integer >= 0 (got {self.seed!r})")
        # Every backend takes a 31-bit seed; larger seeds are folded into that range.
        object.__setattr__(self, "seed", self.seed % (2**31 - 1))
        if not 0.0 <= self.mip_gap < 1.0:
            raise ConfigError(f"mip_gap must lie in [0, 1) (got {self.mip_gap})")


@dataclass(frozen=True)
class RawResult:
    """A backend's answer. ``values`` are in model variable order (None without a solution);
    ``objective`` and ``bound`` are in model units (None when the solver has none)."""

    termination: Termination
    has_solution: bool
    values: tuple[float, ...] | None
    objective: float | None
    bound: float | None
    solver: str
    version: str
    wall_s: float
    native_status: str
    message: str = ""


class Backend(Protocol):
    """An exact solver: ``solve(model, options) -> RawResult``."""

    name: str

    def solve(self, model, options: SolveOptions) -> RawResult:  # pragma: no cover - protocol
        ...


def solve_after_build(
    backend, model, options: SolveOptions, built_s: float, what: str = "the model"
) -> RawResult:
    """Solve ``model`` with ``backend`` when building it already took ``built_s`` seconds of
    ``options``' time limit: the solver gets what is left, and a build that used it all up ends
    as a time limit without starting the solver (saying so). The result's time is build and
    solve together (issue 34: the limit covers both)."""
    limit = options.time_limit_s
    if limit is not None and built_s >= limit:
        raw = RawResult(
            Termination.TIME_LIMIT,
            False,
            None,
            None,
            None,
            getattr(backend, "name", ""),
            "",
            0.0,
            "not started",
            f"building {what} ({model.n_vars:,} variables) took {built_s:.3g} s of the "
            f"{limit:g} s time limit; the solver did not start",
        )
    else:
        left = None if limit is None else limit - built_s
        with solver_output_to_stderr(options.verbose):
            raw = backend.solve(model, replace(options, time_limit_s=left))
    return replace(raw, wall_s=raw.wall_s + built_s)


@contextmanager
def solver_output_to_stderr(on: bool):
    """With ``on`` (``SolveOptions.verbose``: ``-v``), what a solver library prints to file
    descriptor 1 from C goes to stderr, so its log shows without mixing into the report."""
    if not on:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def stopped_by_time(wall_s: float, options: SolveOptions) -> bool:
    """Whether a solve that ended without proof used up its time limit (5% slack)."""
    return options.time_limit_s is not None and wall_s >= 0.95 * options.time_limit_s


def solve_in_subprocess(module: str, model, options: SolveOptions) -> RawResult:
    """Run ``module``'s ``solve_here(model, options)`` in a fresh interpreter.

    highspy and OR-Tools ship different ``libhighs.so.1`` under one soname: once one is loaded
    (``import pulp`` loads highspy), the other cannot load in that process. Backends that meet
    this run their solve in a child process instead (model and options pickled via stdin/stdout).
    """
    timeout = None if options.time_limit_s is None else options.time_limit_s + 120.0
    # the child must import parplan exactly as this process does
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", module],
            input=pickle.dumps((model, options)),
            stdout=subprocess.PIPE,
            stderr=None if options.verbose else subprocess.PIPE,  # verbose: the log shows
            timeout=timeout,
            check=False,
            env=env,
        )
    except subprocess.TimeoutExpired:
        # a loaded machine can keep a child past its limit: that is the time limit, not a failure
        return RawResult(
            Termination.TIME_LIMIT,
            False,
            None,
            None,
            None,
            module.rsplit(".", 1)[-1],
            "",
            timeout,
            "stopped",
            f"the {module.rsplit('.', 1)[-1]} solver overran its {options.time_limit_s:g} s time limit "
            f"and had not answered {timeout:.0f} s after the solve began (a model of "
            f"{_size(model)}: a solver's presolve does not always check the limit); stopped without "
            "a plan. A coarser --share-grid makes the model smaller",
        )
    if proc.returncode != 0:
        said = proc.stderr.decode(errors="replace") if proc.stderr is not None else ""
        raise SolverError(child_failure(module, proc.returncode, said))
    return pickle.loads(proc.stdout)


def _size(model) -> str:
    """``"1,114,707 variables and 3,293 constraints"`` of a model (for messages)."""
    try:
        return f"{model.n_vars:,} variables and {model.n_constraints:,} constraints"
    except AttributeError:
        return "unknown size"


def child_failure(module: str, returncode: int, stderr: str) -> str:
    """One line on why a solver child process ended without an answer: the signal that killed
    it (SIGKILL is most often the system out of memory), or the last line of its traceback."""
    import signal

    name = module.rsplit(".", 1)[-1]
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode).name
        except ValueError:
            sig = f"signal {-returncode}"
        why = (
            " (most often the system running out of memory: this problem's MIP is too large for this machine; "
            "a coarser --share-grid or the DP planners need far less)"
            if sig == "SIGKILL"
            else ""
        )
        return f"the {name} solver process was killed by {sig}{why}"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return f"the {name} solver process failed (exit status {returncode}): {(errors or lines or ['no message'])[-1]}"


def child_main(solve_here: Callable) -> None:
    """Entry point of a solver child process (see :func:`solve_in_subprocess`)."""
    model, options = pickle.loads(sys.stdin.buffer.read())
    # Solver libraries print banners and logs to file descriptor 1 from C (highspy >= 1.16 prints
    # its banner before any option can silence it). Point fd 1 at stderr while solving so only
    # the pickled result reaches the parent through the saved stdout.
    sys.stdout.flush()
    result_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        result = solve_here(model, options)
    finally:
        sys.stdout.flush()
        os.dup2(result_fd, 1)
    with os.fdopen(result_fd, "wb") as out:
        out.write(pickle.dumps(result))


def is_library_clash(exc: ImportError) -> bool:
    """Whether an ImportError is the libhighs soname clash (not a missing library)."""
    return "undefined symbol" in str(exc)
