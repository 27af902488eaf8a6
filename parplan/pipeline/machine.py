"""The pipeline planner's machine: a stack of levels, lowest first, and what moving bytes over
a level costs (docs: :mod:`parplan.pipeline.planner`)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Sequence


from parplan.collectives.allreduce import ring_allreduce_seconds
from parplan.costmodel.dims import Device
from parplan.costmodel.hardware import ArrayNode
from parplan.errors import HardwareError


class SyncModel(enum.Enum):
    """How a replicated stage's weight all-reduce over ``m`` replicas is priced.

    - ``RING``: ring all-reduce, ``2(m-1)/m x bytes / B + 2(m-1) x latency`` (the default);
    - ``PIPEDREAM``: the paper's term ``2(m-1) x bytes / B`` (every replica exchanging the full
      weights with every other, as with a parameter server).
    """

    RING = "ring"
    PIPEDREAM = "pipedream"


@dataclass(frozen=True)
class Level:
    """Level ``index`` (1 = lowest): ``machines`` level-(index-1) machines joined by links."""

    index: int
    machines: int
    bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self):
        if self.machines < 1:
            raise HardwareError(f"level {self.index}: machines must be >= 1 (got {self.machines})")
        if not self.bytes_per_s > 0:
            raise HardwareError(
                f"level {self.index}: link bandwidth must be > 0 bytes/s (got {self.bytes_per_s})"
            )
        if self.latency_s < 0:
            raise HardwareError(
                f"level {self.index}: link latency must be >= 0 s (got {self.latency_s})"
            )


@dataclass(frozen=True)
class Machine:
    """A hierarchy of levels, lowest first; ``devices`` = product of the levels' machines.

    ``device_flops_per_s`` / ``device_memory_bytes`` describe the (slowest / smallest) device;
    they are informational for measured profiles.
    """

    levels: tuple[Level, ...]
    description: str = ""
    device_flops_per_s: float | None = None
    device_memory_bytes: float | None = None
    notes: tuple[str, ...] = ()
    #: The slowest device as the cost model prices it (peak, HBM bandwidth, efficiency), for
    #: profiles built from layer graphs (:func:`parplan.pipeline.profile.profile_from_graph`).
    device: Device | None = None

    def __post_init__(self):
        if not self.levels:
            raise HardwareError("a machine needs at least one level")
        for k, lvl in enumerate(self.levels, start=1):
            if lvl.index != k:
                raise HardwareError(
                    f"machine levels must be numbered 1, 2, ... lowest first (level {k} has index {lvl.index})"
                )

    @property
    def devices(self) -> int:
        return math.prod(lvl.machines for lvl in self.levels)

    def devices_below(self, k: int) -> int:
        """Devices in one level-``k`` machine (1 for ``k`` = 0)."""
        return math.prod(lvl.machines for lvl in self.levels[:k])

    def describe_levels(self) -> str:
        return "; ".join(
            f"level {lvl.index}: {lvl.machines} x {self.devices_below(lvl.index - 1)} device(s) at "
            f"{lvl.bytes_per_s / 1e9:g} GB/s, {lvl.latency_s * 1e6:g} us"
            for lvl in self.levels
        )


def flat_machine(
    devices: int, bytes_per_s: float, latency_s: float = 0.0, description: str = ""
) -> Machine:
    """One level of ``devices`` devices joined by links of ``bytes_per_s``.

    Example:
        >>> flat_machine(8, 25e9).devices
        8
    """
    return Machine(
        (Level(1, devices, bytes_per_s, latency_s),), description or f"{devices} devices"
    )


def hierarchical_machine(
    levels: Sequence[tuple[int, float, float]], description: str = ""
) -> Machine:
    """Machine from ``(machines, bytes_per_s, latency_s)`` per level, lowest first.

    Example:
        >>> m = hierarchical_machine([(8, 300e9, 2e-6), (4, 25e9, 5e-6)])
        >>> m.devices, m.devices_below(1)
        (32, 8)
    """
    lv = tuple(
        Level(k, int(n), float(bw), float(lat)) for k, (n, bw, lat) in enumerate(levels, start=1)
    )
    return Machine(lv, description or " x ".join(str(lvl.machines) for lvl in reversed(lv)))


def machine_from_array(array: ArrayNode, merge_equal_levels: bool = True) -> Machine:
    """Levels of a parplan array (a binary tree, :mod:`parplan.costmodel.hardware`).

    Level ``k`` holds the links at height ``k`` above the leaves (each joins 2 level-(k-1)
    groups), priced at the slowest such link. Consecutive levels with equal bandwidth and
    latency merge into one level of more machines (``a100:16`` becomes one level of 16), which
    lets stages use any number of devices rather than powers of two. A tree whose leaves are
    not all at one depth becomes one level at its slowest link. Compute uses the slowest
    device; the notes say so when the array is heterogeneous.

    A level's bandwidth is one port's: what each device sends at (on a switched node every
    device has its own port; docs/costmodel.md section 4).

    Example:
        >>> from parplan.costmodel.hardware import parse_array
        >>> m = machine_from_array(parse_array("a100:16"))  # two DGX A100 nodes
        >>> [(lvl.machines, lvl.bytes_per_s / 1e9) for lvl in m.levels]
        [(8, 300.0), (2, 25.0)]
        >>> [lvl.machines for lvl in machine_from_array(parse_array("a100:16"), merge_equal_levels=False).levels]
        [2, 2, 2, 2]
    """
    devices = array.devices()
    notes: list[str] = []
    slow = min(devices, key=lambda d: d.flops_per_s)
    if len({d.name for d in devices}) > 1:
        kinds = ", ".join(sorted({f"{d.name} {d.flops_per_s / 1e12:g} TFLOP/s" for d in devices}))
        notes.append(
            f"heterogeneous array ({kinds}): every device is priced as the slowest, {slow.name} "
            f"({slow.flops_per_s / 1e12:g} TFLOP/s), and the smallest memory"
        )
    n = array.count
    if n == 1:
        levels = (Level(1, 1, devices[0].link_bytes_per_s, devices[0].link_latency_s),)
        return Machine(
            levels,
            array.describe(),
            slow.flops_per_s,
            array.min_memory_bytes,
            tuple(notes),
            slow.as_device(),
        )

    def leaf_depths(node: ArrayNode, d: int) -> set[int]:
        return (
            {d} if node.is_leaf else leaf_depths(node.left, d + 1) | leaf_depths(node.right, d + 1)
        )

    depths = leaf_depths(array, 0)
    links = [node.link for _, node in array.inner_nodes()]
    if len(depths) != 1:
        bw = min(lk.bytes_per_s for lk in links)
        lat = max(lk.latency_s for lk in links)
        notes.append(
            f"array tree is not a perfect binary tree ({n} devices); planned as one level of {n} devices "
            f"at its slowest link ({bw / 1e9:g} GB/s)"
        )
        return Machine(
            (Level(1, n, bw, lat),),
            array.describe(),
            slow.flops_per_s,
            array.min_memory_bytes,
            tuple(notes),
            slow.as_device(),
        )
    height = depths.pop()
    by_height: dict[int, list] = {k: [] for k in range(1, height + 1)}

    def collect(node: ArrayNode, d: int) -> None:
        if node.is_leaf:
            return
        by_height[height - d].append(node.link)
        collect(node.left, d + 1)
        collect(node.right, d + 1)

    collect(array, 0)
    raw = []
    for k in range(1, height + 1):
        bws = [lk.bytes_per_s for lk in by_height[k]]
        if max(bws) > min(bws):
            notes.append(
                f"links at height {k} differ ({min(bws) / 1e9:g}..{max(bws) / 1e9:g} GB/s); using the slowest"
            )
        raw.append([2, min(bws), max(lk.latency_s for lk in by_height[k])])
    merged: list[list] = []
    for entry in raw:
        if merge_equal_levels and merged and merged[-1][1:] == entry[1:]:
            merged[-1][0] *= entry[0]
        else:
            merged.append(list(entry))
    if merge_equal_levels and len(merged) < len(raw):
        notes.append(
            f"levels with equal links merged: {len(raw)} tree levels -> {len(merged)} planner level(s)"
        )
    levels = tuple(Level(k, n_, bw, lat) for k, (n_, bw, lat) in enumerate(merged, start=1))
    return Machine(
        levels,
        array.describe(),
        slow.flops_per_s,
        array.min_memory_bytes,
        tuple(notes),
        slow.as_device(),
    )


def sync_seconds(
    bytes_: float, replicas: int, level: Level, model: SyncModel = SyncModel.RING
) -> float:
    """Seconds to all-reduce ``bytes_`` of weights over ``replicas`` replicas on ``level``'s links.

    Example:
        >>> sync_seconds(1e9, 4, Level(1, 4, 1e9))
        1.5
        >>> sync_seconds(1e9, 1, Level(1, 4, 1e9))
        0.0
    """
    if replicas <= 1:
        return 0.0
    if model is SyncModel.RING:
        return ring_allreduce_seconds(replicas, bytes_, level.bytes_per_s, level.latency_s)
    return 2.0 * (replicas - 1) * bytes_ / level.bytes_per_s


def transfer_seconds(bytes_: float, level: Level) -> float:
    """Seconds per minibatch to move a cut's activations forward and its gradients back.

    Example:
        >>> transfer_seconds(1e9, Level(1, 2, 1e9, latency_s=0.5))
        3.0
    """
    return 2.0 * (level.latency_s + bytes_ / level.bytes_per_s)
