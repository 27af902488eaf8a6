"""Memory limits per device (docs/costmodel.md section 6.2): a number of bytes for every device,
or each device's own memory (``"device"``). Shared by the exact solvers, the joint model and the
memory search, below all of them (no import circle).

Example:
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.models.zoo import get_model
    >>> p = Problem(get_model("lenet"), parse_array("a100:1,h100:1"), batch=8)
    >>> {path: round(b / 2**30) for path, b in device_capacity(p, "device").items()}
    {'L': 80, 'R': 80}
"""

from __future__ import annotations

from parplan.costmodel.problem import Problem
from parplan.errors import ConfigError
from parplan.formulation.joint import groups_by_path


def device_limit_bytes(device, memory_limit_bytes: float | str) -> float:
    """One device's memory limit: ``memory_limit_bytes``, or the device's own memory for
    ``"device"``."""
    if memory_limit_bytes == "device":
        return float(device.memory_bytes)
    try:
        per = float(memory_limit_bytes)
    except (TypeError, ValueError):
        raise ConfigError(
            f"memory limit must be a number of bytes or 'device' (got {memory_limit_bytes!r})"
        ) from None
    if not per > 0:
        raise ConfigError(f"memory limit must be > 0 bytes (got {per})")
    return per


def device_capacity(problem: Problem, memory_limit_bytes) -> dict[str, float] | None:
    """Per leaf path: its memory limit in bytes (``"device"``: the device's own), or None."""
    if memory_limit_bytes is None:
        return None
    return {
        path: device_limit_bytes(g.device, memory_limit_bytes)
        for path, g in groups_by_path(problem.array).items()
        if g.is_leaf
    }


__all__ = ["device_capacity", "device_limit_bytes"]
