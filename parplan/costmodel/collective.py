"""Pricing BATCH-type gradient exchange with an all-reduce algorithm on a network topology.

By default a BATCH split exchanges the full partial dW over the link between the two halves
(docs/costmodel.md section 2). With a :class:`Collective` on the array (``--array "h100:64@multitree:torus"``),
the devices below the *topmost* BATCH split of a layer form one data-parallel region: that
split pays one all-reduce of ``|W|`` bytes over all the devices of its group, on a topology
of that many hosts, and BATCH splits of the same layer below it pay nothing more. A layer that
is BATCH at every level therefore pays exactly one all-reduce over all devices. (If a region
contains IN/OUT splits deeper down, the all-reduce is still priced over the whole region: an
over-estimate, since those devices hold only slices of dW.)
The topology of ``n`` hosts is built with the group's link bandwidth and latency: ``ring``,
``torus`` / ``mesh`` (the most square r x c = n; a ring when n is prime or < 4) or ``fattree``.
The amount does not depend on the share, so the exact share optimiser still applies.

Example:
    >>> c = parse_collective("ring:ring")
    >>> c.allreduce_seconds(4, 4e9, bytes_per_s=1e9, latency_s=0.0)  # 2 (N-1) steps of 1 GB
    6.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from parplan.errors import HardwareError

KINDS = ("ring", "torus", "mesh", "fattree")


@dataclass(frozen=True)
class Collective:
    """An all-reduce algorithm (ring, dbtree, 2dring, multitree) on a topology kind."""

    algorithm: str
    topology: str
    ports: int | None = None

    def allreduce_seconds(
        self, hosts: int, bytes_: float, bytes_per_s: float, latency_s: float
    ) -> float:
        """Seconds to all-reduce ``bytes_`` over ``hosts`` hosts of this topology kind."""
        if hosts <= 1 or bytes_ <= 0:
            return 0.0
        return _allreduce(self, hosts, float(bytes_), float(bytes_per_s), float(latency_s))


def parse_collective(text: str) -> Collective:
    """``ALGORITHM:TOPOLOGY[:PORTS]``, e.g. ``multitree:torus``, ``ring:ring``, ``multitree:torus:4``."""
    from parplan.collectives.allreduce import Algorithm

    if not isinstance(text, str):
        raise HardwareError(f"collective must be a string like 'multitree:torus' (got {text!r})")
    parts = [p.strip().lower() for p in text.split(":")]
    if len(parts) not in (2, 3):
        raise HardwareError(
            f"collective '{text}': expected ALGORITHM:TOPOLOGY[:PORTS], e.g. 'multitree:torus'"
        )
    valid = [a.value for a in Algorithm]
    if parts[0] not in valid:
        raise HardwareError(
            f"collective '{text}': unknown algorithm '{parts[0]}'; valid: {', '.join(valid)}"
        )
    if parts[1] not in KINDS:
        raise HardwareError(
            f"collective '{text}': unknown topology '{parts[1]}'; valid: {', '.join(KINDS)}"
        )
    ports = None
    if len(parts) == 3:
        try:
            ports = int(parts[2])
        except ValueError:
            raise HardwareError(
                f"collective '{text}': ports must be an integer 1-4 (got '{parts[2]}')"
            ) from None
        if not 1 <= ports <= 4:
            raise HardwareError(f"collective '{text}': ports must be 1-4 (got {ports})")
    return Collective(parts[0], parts[1], ports)


def _grid(n: int) -> tuple[int, int] | None:
    best = None
    for r in range(2, int(math.isqrt(n)) + 1):
        if n % r == 0:
            best = (r, n // r)
    return best


@lru_cache(maxsize=4096)
def _allreduce(
    c: Collective, hosts: int, bytes_: float, bytes_per_s: float, latency_s: float
) -> float:
    from parplan.collectives.allreduce import allreduce_seconds

    return allreduce_seconds(c.algorithm, _topology(c, hosts, bytes_per_s, latency_s), bytes_)


@lru_cache(maxsize=256)
def _topology(c: Collective, hosts: int, bytes_per_s: float, latency_s: float):
    from parplan.collectives import topology as t

    kind = c.topology
    grid = _grid(hosts) if kind in ("torus", "mesh") else None
    if kind == "fattree" and hosts >= 4:
        return t.fat_tree(hosts, bytes_per_s=bytes_per_s, latency_s=latency_s, ports=c.ports)
    if grid is not None and kind == "torus":
        return t.torus2d(*grid, bytes_per_s=bytes_per_s, latency_s=latency_s, ports=c.ports)
    if grid is not None and kind == "mesh":
        return t.mesh2d(*grid, bytes_per_s=bytes_per_s, latency_s=latency_s, ports=c.ports)
    return t.ring(hosts, bytes_per_s=bytes_per_s, latency_s=latency_s, ports=c.ports)
