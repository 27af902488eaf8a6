"""Accelerator kinds and arrays as binary trees of groups.

docs/costmodel.md sections 4 and 7; file formats: docs/formats.md.

Device kinds come from ``parplan/data/devices.toml`` (user-extendable with another TOML file).
An array is a binary tree: leaves are devices, each inner node carries the :class:`Link`
between its two halves. Short forms:

- ``"h100:8"``: 8 H100s as a balanced binary tree;
- ``"tpu-v2:4,tpu-v3:4"``: two halves (4 TPU-v2, 4 TPU-v3), each a balanced tree. More
  comma-separated parts are combined as a balanced tree of parts.
- ``"h100:64@multitree:torus"``: any of the above, with BATCH gradient exchange priced as a
  MultiTree all-reduce on a torus (see :mod:`parplan.costmodel.collective`).

Example:
    >>> arr = parse_array("tpu-v2:2,tpu-v3:2")
    >>> arr.count, arr.depth
    (4, 2)
    >>> round(arr.left.flops_per_s / 1e12), round(arr.right.flops_per_s / 1e12)
    (90, 246)
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, replace
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Iterator, Mapping

from parplan.costmodel.collective import Collective, parse_collective
from parplan.costmodel.dims import Device
from parplan.errors import ConfigError, HardwareError
from parplan.readers import parse_json, parse_toml, read_text

_FIELDS = (
    "flops_per_s",
    "memory_bytes",
    "memory_bytes_per_s",
    "link_bytes_per_s",
    "link_latency_s",
)
#: Optional keys of a device kind that are fractions in (0, 1] (with their defaults; None: as
#: ``efficiency``), and the per-kernel overhead (seconds >= 0); docs/costmodel.md section 5.
_OPTIONAL = {
    "efficiency": 1.0,
    "conv_efficiency": None,
    "attention_efficiency": None,
    "memory_efficiency": 1.0,
}
_OVERHEAD = "kernel_overhead_s"
#: Optional keys describing how devices of a kind are connected (docs/costmodel.md section 4).
_FABRIC = ("switch_devices", "nic_bytes_per_s", "nic_latency_s", "torus_dims")
#: Torus dimensions a kind's chips may form (TPU v2/v3 pods: 2; v4 and later: 3).
TORUS_DIMS = (0, 1, 2, 3)


@dataclass(frozen=True)
class DeviceKind:
    """One accelerator chip: peak throughput, memory and its interconnect link."""

    name: str
    flops_per_s: float
    memory_bytes: float
    memory_bytes_per_s: float
    link_bytes_per_s: float
    link_latency_s: float
    description: str = ""
    #: Achieved fraction of peak FLOP/s on matrix products (docs/costmodel.md section 5);
    #: 1.0, the papers' setting, by default. The others as :class:`~parplan.costmodel.dims.Device`'s
    #: (``parplan calibrate`` measures them all).
    efficiency: float = 1.0
    conv_efficiency: float | None = None
    attention_efficiency: float | None = None
    memory_efficiency: float = 1.0
    kernel_overhead_s: float = 0.0
    #: Fabric (docs/costmodel.md section 4): devices of this kind form switched domains (one
    #: node's NVSwitch) of up to this many, each device with its own ``link_bytes_per_s`` port;
    #: 0, the papers' setting, joins every two groups by one link.
    switch_devices: int = 0
    #: Each device's network port between domains (InfiniBand rail) and its latency; None: the
    #: domains are joined by one link of ``link_bytes_per_s``.
    nic_bytes_per_s: float | None = None
    nic_latency_s: float | None = None
    #: Chips of this kind are wired into a torus of this many dimensions (TPU ICI: 2 for v2 and
    #: v3 pods), two ``link_bytes_per_s`` links per dimension each; ``n`` of them form the most
    #: cubic such torus, and a split's halves are joined by the links its cut crosses
    #: (docs/costmodel.md section 4.1). 0: one link per split, the papers' setting.
    torus_dims: int = 0

    def as_device(self) -> Device:
        return Device(
            self.flops_per_s,
            self.memory_bytes_per_s,
            self.efficiency,
            self.conv_efficiency,
            self.attention_efficiency,
            self.memory_efficiency,
            self.kernel_overhead_s,
        )


@dataclass(frozen=True)
class Link:
    """The link between the two halves of a group: per-direction bandwidth and latency.

    ``bytes_per_s`` is the bandwidth at which the left half receives; ``right_bytes_per_s``
    the right half's (None: the same). They differ only when a tree file says so
    (docs/costmodel.md section 4).
    """

    bytes_per_s: float
    latency_s: float = 0.0
    right_bytes_per_s: float | None = None
    #: Parallel ports between the halves, each at ``bytes_per_s`` (docs/costmodel.md section 4):
    #: on a switched fabric every device of the smaller half has its own, so a half's part of
    #: a tensor, spread over its devices, crosses at ``ports`` times one port's bandwidth.
    ports: int = 1

    def __post_init__(self):
        for bw in (
            self.bytes_per_s,
            self.right_bytes_per_s if self.right_bytes_per_s is not None else 1.0,
        ):
            if not (isinstance(bw, (int, float)) and math.isfinite(bw) and bw > 0):
                raise HardwareError(
                    f"link bandwidth must be a finite number > 0 bytes/s (got {bw})"
                )
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise HardwareError(
                f"link latency must be a finite number >= 0 s (got {self.latency_s})"
            )
        if isinstance(self.ports, bool) or not isinstance(self.ports, int) or self.ports < 1:
            raise HardwareError(f"link ports must be an integer >= 1 (got {self.ports!r})")

    @property
    def side_bytes_per_s(self) -> tuple[float, float]:
        """(left, right) receive bandwidths, all ports together."""
        right = self.bytes_per_s if self.right_bytes_per_s is None else self.right_bytes_per_s
        return self.bytes_per_s * self.ports, right * self.ports


@dataclass(frozen=True, eq=False)
class ArrayNode:
    """A group of devices: a leaf (one device) or two halves joined by a link."""

    device: DeviceKind | None = None
    left: "ArrayNode | None" = None
    right: "ArrayNode | None" = None
    link: Link | None = None
    #: On the root only: price BATCH gradient exchange with this all-reduce (collective.py).
    collective: Collective | None = None

    @property
    def is_leaf(self) -> bool:
        return self.device is not None

    @cached_property
    def structure(self) -> tuple:
        """:func:`signature`'s key, built once (a half's key is a part of its parent's)."""
        if self.is_leaf:
            return (self.device,)
        return (self.link, self.left.structure, self.right.structure)

    @cached_property
    def interchangeable_halves(self) -> bool:
        """Whether the two halves are interchangeable: the same devices in the same tree
        (:func:`signature`) and the same link bandwidth each way (False on a leaf)."""
        return (
            not self.is_leaf
            and signature(self.left) == signature(self.right)
            and len(set(self.link.side_bytes_per_s)) == 1
        )

    @cached_property
    def flops_per_s(self) -> float:
        """Summed peak throughput of the group's devices (FLOP/s)."""
        if self.is_leaf:
            return self.device.flops_per_s
        return self.left.flops_per_s + self.right.flops_per_s

    @cached_property
    def as_device(self) -> Device:
        """The group as one device (the planner's view of a half, docs/costmodel.md section 7):
        summed achieved FLOP/s and summed HBM bandwidth."""
        if self.is_leaf:
            return self.device.as_device()
        return group_device((self.left.as_device, self.right.as_device))

    @cached_property
    def count(self) -> int:
        """Number of devices."""
        return 1 if self.is_leaf else self.left.count + self.right.count

    @cached_property
    def depth(self) -> int:
        """Number of split levels on the longest root-leaf path (0 for one device)."""
        return 0 if self.is_leaf else 1 + max(self.left.depth, self.right.depth)

    def devices(self) -> list[DeviceKind]:
        """Leaf devices, left to right."""
        return [self.device] if self.is_leaf else self.left.devices() + self.right.devices()

    @cached_property
    def min_memory_bytes(self) -> float:
        """Smallest device memory in the group (bytes)."""
        return min(d.memory_bytes for d in self.devices())

    def at(self, path: str) -> "ArrayNode":
        """The group at ``path`` below this one (``""``: this one; each L / R a step down)."""
        group = self
        for step in path:
            if group.is_leaf or step not in "LR":
                raise ConfigError(f"array {self.describe()} has no group '{path}'")
            group = group.left if step == "L" else group.right
        return group

    def inner_nodes(self, path: str = "") -> Iterator[tuple[str, "ArrayNode"]]:
        """(path, node) of every inner node, pre-order; the root is ``""``, children add L/R."""
        if self.is_leaf:
            return
        yield path, self
        yield from self.left.inner_nodes(path + "L")
        yield from self.right.inner_nodes(path + "R")

    def describe(self) -> str:
        """Compact description, e.g. ``tpu-v2:2,tpu-v3:2``."""
        parts: list[tuple[str, int]] = []
        for d in self.devices():
            if parts and parts[-1][0] == d.name:
                parts[-1] = (d.name, parts[-1][1] + 1)
            else:
                parts.append((d.name, 1))
        text = ",".join(f"{n}:{c}" for n, c in parts)
        if self.collective is not None:
            text += f"@{self.collective.algorithm}:{self.collective.topology}"
        return text


def signature(group: ArrayNode) -> tuple:
    """Structural key of a sub-array: equal keys mean interchangeable groups (same devices in
    the same tree, same links). Computed once per group (``ArrayNode.structure``)."""
    return group.structure


def _check_kind(name: str, entry: Mapping) -> DeviceKind:
    if not isinstance(entry, Mapping):
        raise HardwareError(f"device '{name}': expected a table of figures (got {entry!r})")
    unknown = set(entry) - set(_FIELDS) - set(_OPTIONAL) - set(_FABRIC) - {_OVERHEAD, "description"}
    if unknown:
        raise HardwareError(
            f"device '{name}': unknown keys {sorted(unknown)}; valid keys: "
            f"{list(_FIELDS) + list(_OPTIONAL) + [_OVERHEAD] + list(_FABRIC) + ['description']}"
        )
    missing = [f for f in _FIELDS if f not in entry]
    if missing:
        raise HardwareError(f"device '{name}': missing {missing}")
    values = {}
    for f in _FIELDS:
        values[f] = _number(name, f, entry[f])
        if f == "link_latency_s":
            if values[f] < 0:
                raise HardwareError(f"device '{name}': {f} must be >= 0 (got {entry[f]})")
        elif not values[f] > 0:
            raise HardwareError(f"device '{name}': {f} must be > 0 (got {entry[f]})")
    for f, default in _OPTIONAL.items():
        if f not in entry:
            values[f] = default
            continue
        values[f] = _number(name, f, entry[f])
        if not 0 < values[f] <= 1:
            raise HardwareError(f"device '{name}': {f} must lie in (0, 1] (got {entry[f]})")
    for key in (_OVERHEAD, "nic_latency_s"):
        if key in entry:
            values[key] = _number(name, key, entry[key])
            if not values[key] >= 0:
                raise HardwareError(
                    f"device '{name}': {key} must be >= 0 seconds (got {entry[key]})"
                )
    if "nic_bytes_per_s" in entry:
        values["nic_bytes_per_s"] = _number(name, "nic_bytes_per_s", entry["nic_bytes_per_s"])
        if not values["nic_bytes_per_s"] > 0:
            raise HardwareError(
                f"device '{name}': nic_bytes_per_s must be > 0 (got {entry['nic_bytes_per_s']})"
            )
    if "switch_devices" in entry:
        count = entry["switch_devices"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise HardwareError(
                f"device '{name}': switch_devices must be an integer >= 0 (got {count!r})"
            )
        values["switch_devices"] = count
    if "torus_dims" in entry:
        dims = entry["torus_dims"]
        if isinstance(dims, bool) or dims not in TORUS_DIMS:
            raise HardwareError(
                f"device '{name}': torus_dims must be one of {', '.join(map(str, TORUS_DIMS))} "
                f"(got {dims!r})"
            )
        values["torus_dims"] = dims
    description = entry.get("description", "")
    if not isinstance(description, str):
        raise HardwareError(f"device '{name}': description must be a string (got {description!r})")
    return DeviceKind(name=name, description=description, **values)


def _number(name: str, key: str, value) -> float:
    """A finite number (TOML's booleans are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise HardwareError(f"device '{name}': {key} must be a finite number (got {value!r})")
    return float(value)


def group_device(devices) -> Device:
    """Devices working as one (docs/costmodel.md sections 5 and 7): summed achieved FLOP/s of
    each kind, summed achieved HBM bandwidth, the smallest launch time (the group is no slower
    than its fastest device could be alone: the group's time stays a lower bound)."""
    gemm = sum(d.flops_per_s * d.efficiency for d in devices)
    conv = sum(d.flops_per_s * d.efficiency_of("conv") for d in devices)
    attention = sum(d.flops_per_s * d.efficiency_of("attention") for d in devices)
    same = all(d.conv_efficiency is None and d.attention_efficiency is None for d in devices)
    return Device(
        gemm,
        sum(d.memory_bytes_per_s * d.memory_efficiency for d in devices),
        1.0,
        None if same else conv / gemm,
        None if same else attention / gemm,
        1.0,
        min(d.kernel_overhead_s for d in devices),
    )


def load_devices(path: str | Path | None = None) -> dict[str, DeviceKind]:
    """Built-in device kinds, plus (overriding) those of a user TOML file of the same shape."""
    text = resources.files("parplan").joinpath("data/devices.toml").read_text()
    kinds = {name: _check_kind(name, e) for name, e in tomllib.loads(text).items()}
    if path is not None:
        user = parse_toml(
            read_text(path, "device file", HardwareError), f"device file '{path}'", HardwareError
        )
        for name, entry in user.items():
            if not isinstance(entry, dict):
                raise HardwareError(
                    f"device file '{path}': '{name}' must be a table of figures ([{name}] ...)"
                )
        for name in user:
            if not name.strip() or any(c in name for c in ":,@ \t"):
                raise HardwareError(
                    f"device file '{path}': device name {name!r} must be non-empty, without spaces "
                    "or any of ':,@' (it is written in arrays as NAME:COUNT)"
                )
        kinds.update({name.lower(): _check_kind(name.lower(), e) for name, e in user.items()})
    return kinds


def _kind(name: str, kinds: Mapping[str, DeviceKind]) -> DeviceKind:
    key = name.strip().lower()
    if key not in kinds:
        raise HardwareError(f"unknown device '{name}'; valid devices: {', '.join(sorted(kinds))}")
    return kinds[key]


def _join(
    left: ArrayNode,
    right: ArrayNode,
    bandwidth: float | None,
    latency: float | None,
    domain: bool = False,
) -> ArrayNode:
    """Two groups joined by the link their fabric gives (docs/costmodel.md section 4).

    Devices of one kind with a switch: inside one switched domain (``domain``), every device
    of the smaller half has its own port at ``link_bytes_per_s``; between domains, its own
    network port at ``nic_bytes_per_s`` (when the kind has one). Otherwise (the papers'
    setting, different kinds, no network figures) one link at the smallest link bandwidth and
    the largest latency of the devices. ``bandwidth`` / ``latency`` override one port's."""
    devs = left.devices() + right.devices()
    kind = devs[0]
    if (
        kind.switch_devices
        and all(d == kind for d in devs)
        and (domain or kind.nic_bytes_per_s is not None)
    ):
        ports = min(left.count, right.count)
        bw, lat = (
            (kind.link_bytes_per_s, kind.link_latency_s)
            if domain
            else (
                kind.nic_bytes_per_s,
                kind.link_latency_s if kind.nic_latency_s is None else kind.nic_latency_s,
            )
        )
        return ArrayNode(
            left=left,
            right=right,
            link=Link(
                bw if bandwidth is None else bandwidth,
                lat if latency is None else latency,
                ports=ports,
            ),
        )
    bw = bandwidth if bandwidth is not None else min(d.link_bytes_per_s for d in devs)
    lat = latency if latency is not None else max(d.link_latency_s for d in devs)
    return ArrayNode(left=left, right=right, link=Link(bw, lat))


def balanced(
    nodes: list[ArrayNode],
    bandwidth: float | None = None,
    latency: float | None = None,
    domain: bool = False,
) -> ArrayNode:
    """A balanced binary tree over ``nodes`` (left half gets the extra one when odd); ``domain``:
    all of them in one switched domain (:func:`_join`)."""
    if len(nodes) == 1:
        return nodes[0]
    mid = (len(nodes) + 1) // 2
    return _join(
        balanced(nodes[:mid], bandwidth, latency, domain),
        balanced(nodes[mid:], bandwidth, latency, domain),
        bandwidth,
        latency,
        domain,
    )


#: How links between groups are priced (docs/costmodel.md section 4): "devices" by the device
#: kinds' fabric (switched domains and network ports), "papers" by one link per split, as the
#: AccPar and HyPar papers do.
FABRICS = ("devices", "papers")


def devices_of(
    kind: DeviceKind,
    n: int,
    bandwidth: float | None = None,
    latency: float | None = None,
    fabric: str = "devices",
) -> ArrayNode:
    """``n`` devices of ``kind``: a balanced tree, or, on a switched kind, balanced trees of
    whole switched domains (nodes of ``switch_devices``) joined by a balanced tree of the
    network (docs/costmodel.md section 4). ``fabric="papers"`` ignores the kind's fabric."""
    if fabric == "papers" and (kind.switch_devices or kind.torus_dims):
        kind = replace(kind, switch_devices=0, torus_dims=0)
    if kind.torus_dims and not kind.switch_devices:
        return torus(kind, n, bandwidth, latency)
    size = kind.switch_devices or n
    domains = [
        balanced(
            [ArrayNode(device=kind) for _ in range(min(size, n - i))], bandwidth, latency, True
        )
        for i in range(0, n, size)
    ]
    return balanced(domains, bandwidth, latency)


def torus_shape(n: int, dims: int) -> tuple[int, ...]:
    """The most cubic ``dims``-dimensional shape of ``n`` chips (largest first), as TPU slices
    are laid out.

    Example:
        >>> torus_shape(64, 2), torus_shape(32, 2), torus_shape(8, 3), torus_shape(6, 2)
        ((8, 8), (8, 4), (2, 2, 2), (3, 2))
    """
    shape = [1] * dims
    for p in _prime_factors(n):  # largest factors first, each onto the smallest side
        shape[shape.index(min(shape))] *= p
    return tuple(sorted(shape, reverse=True))


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return sorted(out, reverse=True)


def torus(
    kind: DeviceKind, n: int, bandwidth: float | None = None, latency: float | None = None
) -> ArrayNode:
    """``n`` chips of ``kind`` on a ``kind.torus_dims``-dimensional torus
    (:func:`torus_shape`), bisected recursively across its longest side (docs/costmodel.md
    section 4.1): a cut crosses one link per chip of the cross-section, two where the side
    still wraps around (longer than 2); each half keeps the other sides and its part of the
    cut one, which no longer wraps."""
    shape = torus_shape(n, kind.torus_dims)
    return _torus_tree(kind, shape, (True,) * len(shape), bandwidth, latency)


def _torus_tree(kind, shape, wraps, bandwidth, latency) -> ArrayNode:
    if math.prod(shape) == 1:
        return ArrayNode(device=kind)
    j = max(range(len(shape)), key=lambda i: (shape[i], -i))  # the longest side
    side = shape[j]
    cross = math.prod(shape) // side * (2 if wraps[j] and side > 2 else 1)
    halves = []
    for part in ((side + 1) // 2, side // 2):
        sub = shape[:j] + (part,) + shape[j + 1 :]
        halves.append(
            _torus_tree(kind, sub, wraps[:j] + (False,) + wraps[j + 1 :], bandwidth, latency)
        )
    link = Link(
        kind.link_bytes_per_s if bandwidth is None else bandwidth,
        kind.link_latency_s if latency is None else latency,
        ports=cross,
    )
    return ArrayNode(left=halves[0], right=halves[1], link=link)


def parse_array(
    spec: str,
    bandwidth_bytes_per_s: float | None = None,
    latency_s: float | None = None,
    devices: Mapping[str, DeviceKind] | None = None,
    fabric: str = "devices",
) -> ArrayNode:
    """Array from a short form (``"h100:8"``, ``"tpu-v2:128,tpu-v3:128"``) or a JSON/TOML tree file.

    ``bandwidth_bytes_per_s`` / ``latency_s`` override every link (one port's bandwidth); by
    default links follow the device kinds' fabric (``fabric="devices"``: switched domains and
    network ports, docs/costmodel.md section 4), or take, as the papers do (``"papers"``), one
    link at the smallest link bandwidth and largest latency of the devices in the two groups.
    """
    if fabric not in FABRICS:
        raise HardwareError(f"fabric must be one of {', '.join(FABRICS)} (got {fabric!r})")
    if not isinstance(spec, (str, Path)):
        raise HardwareError(
            f"array must be a string like 'h100:8' or a tree file's path (got {type(spec).__name__})"
        )
    for what, value in (("bandwidth", bandwidth_bytes_per_s), ("latency", latency_s)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise HardwareError(
                f"{what} must be a number or None (got {type(value).__name__} {value!r:.40})"
            )
    if isinstance(spec, str) and "@" in spec:
        base, _, coll = spec.partition("@")
        root = parse_array(base, bandwidth_bytes_per_s, latency_s, devices, fabric)
        from parplan.collectives.allreduce import MAX_SCHEDULE_HOSTS

        if root.count > MAX_SCHEDULE_HOSTS:
            raise HardwareError(
                f"array '{spec}': an all-reduce collective is priced with explicit schedules, built "
                f"for at most {MAX_SCHEDULE_HOSTS:,} devices (got {root.count:,}); drop "
                f"'@{coll}' to price gradient exchange per split"
            )
        return replace(root, collective=parse_collective(coll))
    kinds = load_devices() if devices is None else devices
    if bandwidth_bytes_per_s is not None and not bandwidth_bytes_per_s > 0:
        raise HardwareError(f"bandwidth must be > 0 bytes/s (got {bandwidth_bytes_per_s})")
    if latency_s is not None and latency_s < 0:
        raise HardwareError(f"latency must be >= 0 s (got {latency_s})")
    path = Path(spec)
    if path.suffix.lower() in (".json", ".toml"):
        return _load_array_file(path, kinds, bandwidth_bytes_per_s, latency_s, fabric)
    if not isinstance(spec, str) or not spec.strip():
        raise HardwareError(
            "array must be a string like 'h100:8' or 'tpu-v2:4,tpu-v3:4' (got an empty value)"
        )
    groups = []
    total = 0
    for part in spec.split(","):
        name, sep, count = part.strip().rpartition(":")
        if not sep:
            name, count = part.strip(), "1"
        try:
            n = int(count)
        except ValueError:
            raise HardwareError(
                f"array part '{part.strip()}': count must be an integer, as in 'h100:8'"
            ) from None
        if n <= 0:
            raise HardwareError(f"array part '{part.strip()}': count must be > 0 (got {n})")
        name, n = _machine(name.strip().lower(), n, kinds, part.strip())
        total += n
        if total > MAX_DEVICES:
            raise HardwareError(
                f"array '{spec}' has at least {total:,} devices; parplan plans arrays of at most {MAX_DEVICES:,} "
                f"(planning time grows with the device count: about 8 s per 1,000 devices for a small model)"
            )
        groups.append(devices_of(_kind(name, kinds), n, bandwidth_bytes_per_s, latency_s, fabric))
    return balanced(groups, bandwidth_bytes_per_s, latency_s)


#: Machines by name (``dgx-h100:4`` = 4 nodes): a device kind with switched nodes, counted in
#: nodes of its ``switch_devices`` (docs/formats.md).
MACHINES = {"dgx-a100": "a100", "dgx-h100": "h100", "hgx-h200": "h200"}


def _machine(name: str, count: int, kinds, part: str) -> tuple[str, int]:
    """(device kind, devices) of an array part: a machine name counts nodes, a kind devices."""
    if name not in MACHINES:
        return name, count
    kind = _kind(MACHINES[name], kinds)
    if not kind.switch_devices:
        raise HardwareError(
            f"array part '{part}': '{kind.name}' has no switched nodes (switch_devices) to count"
        )
    return kind.name, count * kind.switch_devices


#: Deepest array tree a file may describe.
MAX_TREE_DEPTH = 64
#: Most devices an array may have: evaluation visits every device (65,536 take minutes).
MAX_DEVICES = 65536


def _load_array_file(path: Path, kinds, bandwidth, latency, fabric: str = "devices") -> ArrayNode:
    """A tree file (docs/formats.md): ``{"devices": "tpu-v3:4"}`` or ``{"device": "h100"}``
    leaves, and inner nodes ``{"left": ..., "right": ..., "gb_per_s": 100, "latency_us": 1}``
    (optionally ``gb_per_s_left`` / ``gb_per_s_right``: what each side receives at)."""
    where_file = f"array file '{path}'"
    text = read_text(path, "array file", HardwareError)
    if path.suffix.lower() == ".json":
        data = parse_json(text, where_file, HardwareError)
    else:
        data = parse_toml(text, where_file, HardwareError)

    def number(node, key: str, where: str, scale: float) -> float | None:
        """An optional numeric key: bandwidths (gb_per_s*) > 0, latency >= 0, finite."""
        if key not in node:
            return None
        value = node[key]
        positive = key.startswith("gb_per_s")
        ok = (
            not isinstance(value, bool)
            and isinstance(value, (int, float))
            and math.isfinite(value)
            and (value > 0 if positive else value >= 0)
        )
        if not ok:
            rule = "a finite number > 0" if positive else "a finite number >= 0"
            raise HardwareError(
                f"{where_file} at {where or 'root'}: '{key}' must be {rule} (got {value!r})"
            )
        return float(value) * scale

    seen = [0]

    def leaf(node: ArrayNode) -> ArrayNode:
        seen[0] += node.count
        if seen[0] > MAX_DEVICES:
            raise HardwareError(
                f"{where_file} describes more than {MAX_DEVICES:,} devices; parplan plans arrays of "
                f"at most {MAX_DEVICES:,}"
            )
        return node

    def build(node, where: str) -> ArrayNode:
        if len(where) > MAX_TREE_DEPTH:
            raise HardwareError(f"{where_file}: the tree is deeper than {MAX_TREE_DEPTH} levels")
        if not isinstance(node, Mapping):
            raise HardwareError(f"{where_file} at {where or 'root'}: expected a table")
        if "device" in node:
            if not isinstance(node["device"], str):
                raise HardwareError(
                    f"{where_file} at {where or 'root'}: 'device' must be a device name string"
                )
            try:
                return leaf(ArrayNode(device=_kind(node["device"], kinds)))
            except HardwareError as exc:
                raise HardwareError(f"{where_file} at {where or 'root'}: {exc}") from None
        if "devices" in node:
            if not isinstance(node["devices"], str):
                raise HardwareError(
                    f"{where_file} at {where or 'root'}: 'devices' must be a string like 'h100:4'"
                )
            return leaf(parse_array(node["devices"], bandwidth, latency, kinds, fabric))
        if "left" not in node or "right" not in node:
            raise HardwareError(
                f"{where_file} at {where or 'root'}: a node needs 'device', 'devices' or 'left' and 'right'"
            )
        left, right = build(node["left"], where + "L"), build(node["right"], where + "R")
        bw = number(node, "gb_per_s", where, 1e9)
        if bw is None:
            bw = (
                bandwidth
                if bandwidth is not None
                else min(d.link_bytes_per_s for d in left.devices() + right.devices())
            )
        lat = number(node, "latency_us", where, 1e-6)
        if lat is None:
            lat = (
                latency
                if latency is not None
                else max(d.link_latency_s for d in left.devices() + right.devices())
            )
        bw_left = number(node, "gb_per_s_left", where, 1e9)
        bw_right = number(node, "gb_per_s_right", where, 1e9)
        ports = node.get("ports", 1)
        if (
            isinstance(ports, bool)
            or not isinstance(ports, int)
            or not 1 <= ports <= min(left.count, right.count)
        ):
            raise HardwareError(
                f"{where_file} at {where or 'root'}: 'ports' must be an integer from 1 to the smaller "
                f"half's {min(left.count, right.count)} devices (got {ports!r})"
            )
        return ArrayNode(
            left=left,
            right=right,
            link=Link(bw if bw_left is None else bw_left, lat, bw_right, ports),
        )

    try:
        root = build(data, "")
    except RecursionError:
        raise HardwareError(f"{where_file}: the tree is nested too deeply") from None
    return root
