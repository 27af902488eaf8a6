"""Python's garbage collector while planning (docs/architecture.md "Rules the code keeps").

Imports nothing heavy, so the CLI can plan inside :func:`planning_gc` for every command.
"""

from __future__ import annotations

import contextlib
import gc

__all__ = ["PLANNING_GC_THRESHOLDS", "planning_gc"]

#: Python's cyclic collector during planning: a collection of generation 0 every this many
#: allocations (its default is 700), and of the older generations ten times rarer than by default.
PLANNING_GC_THRESHOLDS = (100_000, 50, 100)


@contextlib.contextmanager
def planning_gc():
    """Collect garbage rarely while planning, then restore the collector's settings. The memos
    and caches of the cost model hold millions of small objects that never form cycles, and
    every full collection walks them all: on llama3-70b / ``h100:64`` the pipeline search spent
    about a tenth of its time there (58 -> 52 s CPU). The CLI and the benchmarks plan inside it."""
    old = gc.get_threshold()
    gc.set_threshold(*PLANNING_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*old)
