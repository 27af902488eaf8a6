"""Interconnect topologies for all-reduce schedules: networkx graphs of directed links.

A :class:`Topology` is a directed graph (every cable is two directed links, each with
``bytes_per_s`` and ``latency_s``), the *hosts* that take part in a collective, and the number
of network ports per host usable at once (1 to 4): in one time step a host injects at most
``ports`` messages and receives at most ``ports``. Direct networks (ring, 2D mesh, 2D torus, a
user graph) have hosts only; the fat tree adds switches, which forward without port limits.
Routes are deterministic: dimension-order (X then Y, shortest way round a torus ring) on
meshes and tori, up-to-a-spine-and-down on the fat tree, a BFS shortest path otherwise.

Example:
    >>> t = torus2d(4, 4)
    >>> t.size, t.ports, t.graph.out_degree(0)
    (16, 4, 4)
    >>> t.route(0, 10)
    ((0, 1), (1, 2), (2, 6), (6, 10))
    >>> ring(8, ports=1).neighbors(0)
    (1, 7)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Hashable

import networkx as nx

from parplan.errors import ConfigError
from parplan.readers import read_text

__all__ = [
    "Topology",
    "ring",
    "mesh2d",
    "torus2d",
    "grid3d",
    "fat_tree",
    "from_edge_list",
    "parse_dims",
    "parse_topology",
    "DEFAULT_BYTES_PER_S",
    "DEFAULT_LATENCY_S",
]

#: Default per-direction link bandwidth (bytes/s): 25 GB/s, a 200 Gbit/s link.
DEFAULT_BYTES_PER_S = 25e9
#: Default per-hop latency (s).
DEFAULT_LATENCY_S = 1e-6


@dataclass(frozen=True, eq=False)
class Topology:
    """A network: directed links with ``bytes_per_s`` / ``latency_s``, hosts and ports per host.

    ``dims`` is ``(rows, cols)`` for meshes and tori (host ``r * cols + c``), else None.
    ``switched`` is True when hosts reach each other only through switches (fat tree), so a
    tree edge between two hosts is a multi-link route.
    """

    name: str
    kind: str
    graph: nx.DiGraph
    hosts: tuple[Hashable, ...]
    ports: int
    dims: tuple[int, int] | None = None
    switched: bool = False
    _cache: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        if not isinstance(self.ports, int) or not 1 <= self.ports <= 4:
            raise ConfigError(
                f"topology '{self.name}': ports must be an integer from 1 to 4 (got {self.ports!r})"
            )
        if len(self.hosts) < 2:
            raise ConfigError(
                f"topology '{self.name}': an all-reduce needs >= 2 hosts (got {len(self.hosts)})"
            )
        missing = [h for h in self.hosts if h not in self.graph]
        if missing:
            raise ConfigError(
                f"topology '{self.name}': hosts {missing[:5]} are not nodes of the graph"
            )
        if not nx.is_strongly_connected(self.graph):
            raise ConfigError(
                f"topology '{self.name}': the network is not connected; every host must reach every other"
            )
        for u, v, d in self.graph.edges(data=True):
            if not d.get("bytes_per_s", 0) > 0:
                raise ConfigError(
                    f"topology '{self.name}': link {u}->{v} needs bytes_per_s > 0 (got {d.get('bytes_per_s')})"
                )
            if d.get("latency_s", 0) < 0:
                raise ConfigError(
                    f"topology '{self.name}': link {u}->{v} needs latency_s >= 0 (got {d.get('latency_s')})"
                )

    @property
    def size(self) -> int:
        """Number of hosts."""
        return len(self.hosts)

    def neighbors(self, host: Hashable) -> tuple:
        """Hosts one link away (direct networks), in a fixed order."""
        return tuple(v for v in self.graph.successors(host) if v in self._host_set)

    @property
    def _host_set(self) -> frozenset:
        if "hosts" not in self._cache:
            self._cache["hosts"] = frozenset(self.hosts)
        return self._cache["hosts"]

    def link(self, u: Hashable, v: Hashable) -> tuple[float, float]:
        """(bytes_per_s, latency_s) of the directed link u -> v."""
        d = self.graph.edges[u, v]
        return d["bytes_per_s"], d["latency_s"]

    def route(self, src: Hashable, dst: Hashable) -> tuple[tuple[Hashable, Hashable], ...]:
        """Directed links from ``src`` to ``dst`` (deterministic; see the module docstring)."""
        key = ("route", src, dst)
        if key not in self._cache:
            if src == dst:
                raise ConfigError(f"topology '{self.name}': no route from host {src} to itself")
            path = self._path(src, dst)
            self._cache[key] = tuple(zip(path[:-1], path[1:]))
        return self._cache[key]

    def _path(self, src, dst) -> list:
        if self.kind in ("mesh", "torus") and self.dims is not None:
            return _dimension_order(src, dst, self.dims, wrap=self.kind == "torus")
        if self.kind == "fattree":
            return _fat_tree_path(self, src, dst)
        return nx.shortest_path(self.graph, src, dst)

    def route_cost(self, src: Hashable, dst: Hashable) -> tuple[float, float]:
        """(summed latency s, bottleneck bytes_per_s) along the route."""
        links = self.route(src, dst)
        lat = sum(self.graph.edges[e]["latency_s"] for e in links)
        bw = min(self.graph.edges[e]["bytes_per_s"] for e in links)
        return lat, bw

    def tree_candidates(self, host: Hashable) -> tuple:
        """Hosts a tree may attach below ``host``: neighbors on a direct network, every other
        host (nearest first) on a switched one."""
        key = ("cand", host)
        if key not in self._cache:
            if self.switched:
                others = [h for h in self.hosts if h != host]
                self._cache[key] = tuple(
                    sorted(others, key=lambda h: (len(self.route(host, h)), self.hosts.index(h)))
                )
            else:
                self._cache[key] = self.neighbors(host)
        return self._cache[key]

    def describe(self) -> str:
        bws = sorted({d["bytes_per_s"] for *_, d in self.graph.edges(data=True)})
        bw = (
            f"{bws[0] / 1e9:g} GB/s"
            if len(bws) == 1
            else f"{bws[0] / 1e9:g}..{bws[-1] / 1e9:g} GB/s"
        )
        return f"{self.name} ({self.size} hosts, {self.ports} port(s), links {bw})"


def _add_link(g: nx.DiGraph, u, v, bytes_per_s: float, latency_s: float) -> None:
    g.add_edge(u, v, bytes_per_s=bytes_per_s, latency_s=latency_s)
    g.add_edge(v, u, bytes_per_s=bytes_per_s, latency_s=latency_s)


#: Most hosts a topology may have (schedules are refused well below this; see allreduce.py).
MAX_HOSTS = 65536


def _check_count(what: str, n: int, minimum: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < minimum:
        raise ConfigError(f"{what} must be an integer >= {minimum} (got {n!r})")
    if n > MAX_HOSTS:
        raise ConfigError(f"{what}: at most {MAX_HOSTS:,} hosts are supported (got {n:,})")


def _check_link(bytes_per_s: float, latency_s: float) -> None:
    if not (
        isinstance(bytes_per_s, (int, float)) and math.isfinite(bytes_per_s) and bytes_per_s > 0
    ):
        raise ConfigError(f"link bandwidth must be a finite number > 0 bytes/s (got {bytes_per_s})")
    if not (isinstance(latency_s, (int, float)) and math.isfinite(latency_s) and latency_s >= 0):
        raise ConfigError(f"link latency must be a finite number >= 0 s (got {latency_s})")


def _default_ports(ports: int | None, degree: int) -> int:
    return min(4, max(1, degree)) if ports is None else ports


def ring(
    n: int,
    bytes_per_s: float = DEFAULT_BYTES_PER_S,
    latency_s: float = DEFAULT_LATENCY_S,
    ports: int | None = None,
) -> Topology:
    """Bidirectional ring of ``n`` hosts; ports default to 2 (both neighbors at once)."""
    _check_count("ring: nodes", n, 2)
    _check_link(bytes_per_s, latency_s)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for i in range(n):
        _add_link(g, i, (i + 1) % n, bytes_per_s, latency_s)
    return Topology(
        f"ring{n}", "ring", g, tuple(range(n)), _default_ports(ports, 2 if n > 2 else 1)
    )


def _grid(
    kind: str, rows: int, cols: int, bytes_per_s: float, latency_s: float, ports: int | None
) -> Topology:
    _check_count(f"{kind}: rows", rows, 1)
    _check_count(f"{kind}: cols", cols, 1)
    _check_count(f"{kind}: rows x cols", rows * cols, 1)
    _check_link(bytes_per_s, latency_s)
    if rows * cols < 2:
        raise ConfigError(f"{kind} {rows}x{cols}: needs at least 2 nodes")
    wrap = kind == "torus"
    g = nx.DiGraph()
    g.add_nodes_from(range(rows * cols))
    for r in range(rows):
        for c in range(cols):
            u = r * cols + c
            if c + 1 < cols or (wrap and cols > 2):
                _add_link(g, u, r * cols + (c + 1) % cols, bytes_per_s, latency_s)
            if r + 1 < rows or (wrap and rows > 2):
                _add_link(g, u, ((r + 1) % rows) * cols + c, bytes_per_s, latency_s)
    degree = max(d for _, d in g.out_degree())
    return Topology(
        f"{kind}{rows}x{cols}",
        kind,
        g,
        tuple(range(rows * cols)),
        _default_ports(ports, degree),
        dims=(rows, cols),
    )


def mesh2d(
    rows: int,
    cols: int,
    bytes_per_s: float = DEFAULT_BYTES_PER_S,
    latency_s: float = DEFAULT_LATENCY_S,
    ports: int | None = None,
) -> Topology:
    """``rows x cols`` 2D mesh; host ``r * cols + c``; ports default to the largest degree (4)."""
    return _grid("mesh", rows, cols, bytes_per_s, latency_s, ports)


def torus2d(
    rows: int,
    cols: int,
    bytes_per_s: float = DEFAULT_BYTES_PER_S,
    latency_s: float = DEFAULT_LATENCY_S,
    ports: int | None = None,
) -> Topology:
    """``rows x cols`` 2D torus (wrap-around links); ports default to 4."""
    return _grid("torus", rows, cols, bytes_per_s, latency_s, ports)


def grid3d(
    kind: str,
    dims: tuple[int, int, int],
    bytes_per_s: float = DEFAULT_BYTES_PER_S,
    latency_s: float = DEFAULT_LATENCY_S,
    ports: int | None = None,
) -> Topology:
    """A 3-D mesh or torus (``kind`` "mesh" or "torus"; TPU pods are 3-D tori): host
    ``(x * Y + y) * Z + z``, links along each axis (wrap-around on a torus); ports default to 4,
    the most a host drives at once in these schedules (a host has up to 6 links). Routes are
    shortest paths, and the all-reduce algorithms take their generic
    forms (a greedy ring order, trees over the graph); the 2-D constructions (snake ring order,
    dimension-order routes) are for 2-D grids.

    Example:
        >>> t = grid3d("torus", (4, 4, 4))
        >>> t.size, t.ports, len(t.neighbors(0)), t.name
        (64, 4, 6, 'torus4x4x4')
    """
    a, b, c = dims
    for what, n in (("x", a), ("y", b), ("z", c)):
        _check_count(f"{kind}: {what}", n, 1)
    _check_count(f"{kind}: x x y x z", a * b * c, 2)
    _check_link(bytes_per_s, latency_s)
    wrap = kind == "torus"
    g = nx.DiGraph()
    g.add_nodes_from(range(a * b * c))
    sizes = (a, b, c)
    for x in range(a):
        for y in range(b):
            for z in range(c):
                here = (x, y, z)
                u = (x * b + y) * c + z
                for axis in range(3):
                    n = sizes[axis]
                    if here[axis] + 1 < n or (wrap and n > 2):
                        there = list(here)
                        there[axis] = (here[axis] + 1) % n
                        _add_link(
                            g, u, (there[0] * b + there[1]) * c + there[2], bytes_per_s, latency_s
                        )
    degree = max(d for _, d in g.out_degree())
    return Topology(
        f"{kind}{a}x{b}x{c}", f"{kind}3d", g, tuple(range(a * b * c)), _default_ports(ports, degree)
    )


def _dimension_order(src: int, dst: int, dims: tuple[int, int], wrap: bool) -> list[int]:
    rows, cols = dims
    r, c = divmod(src, cols)
    tr, tc = divmod(dst, cols)
    path = [src]

    def steps(a: int, b: int, n: int) -> int:
        if not wrap or n <= 2:
            return 1 if b > a else -1
        fwd = (b - a) % n
        return 1 if fwd <= n - fwd else -1

    while c != tc:
        c = (c + steps(c, tc, cols)) % cols
        path.append(r * cols + c)
    while r != tr:
        r = (r + steps(r, tr, rows)) % rows
        path.append(r * cols + c)
    return path


def fat_tree(
    n: int,
    hosts_per_leaf: int | None = None,
    bytes_per_s: float = DEFAULT_BYTES_PER_S,
    latency_s: float = DEFAULT_LATENCY_S,
    ports: int | None = None,
) -> Topology:
    """Two-level fat tree (leaf-spine folded Clos) with full bisection bandwidth.

    ``n`` hosts, ``hosts_per_leaf`` per leaf switch (default: the divisor of ``n`` closest to
    sqrt(n)), as many spine switches as hosts per leaf, every leaf linked to every spine; all
    links ``bytes_per_s``. Each host has one link to its leaf, so ports default to 1. A route
    between leaves goes up to spine ``dst mod spines`` (destination-mod-k routing).

    Example:
        >>> t = fat_tree(16)
        >>> t.size, len(t.graph), t.route(0, 5)
        (16, 24, ((0, 'leaf0'), ('leaf0', 'spine1'), ('spine1', 'leaf1'), ('leaf1', 5)))
    """
    _check_count("fat tree: nodes", n, 2)
    _check_link(bytes_per_s, latency_s)
    if hosts_per_leaf is None:
        divisors = [d for d in range(1, n + 1) if n % d == 0]
        hosts_per_leaf = min(divisors, key=lambda d: (abs(math.log(d) - math.log(n) / 2), -d))
    _check_count("fat tree: hosts per leaf", hosts_per_leaf, 1)
    if n % hosts_per_leaf:
        raise ConfigError(
            f"fat tree: {n} hosts do not divide into leaves of {hosts_per_leaf}; pick a divisor of {n}"
        )
    leaves, spines = n // hosts_per_leaf, hosts_per_leaf
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for h in range(n):
        _add_link(g, h, f"leaf{h // hosts_per_leaf}", bytes_per_s, latency_s)
    if leaves > 1:
        for leaf in range(leaves):
            for s in range(spines):
                _add_link(g, f"leaf{leaf}", f"spine{s}", bytes_per_s, latency_s)
    t = Topology(
        f"fattree{n}", "fattree", g, tuple(range(n)), _default_ports(ports, 1), switched=True
    )
    t._cache["fat"] = (hosts_per_leaf, spines)
    return t


def _fat_tree_path(t: Topology, src: int, dst: int) -> list:
    per_leaf, spines = t._cache["fat"]
    a, b = f"leaf{src // per_leaf}", f"leaf{dst // per_leaf}"
    if a == b:
        return [src, a, dst]
    return [src, a, f"spine{dst % spines}", b, dst]


def parse_dims(text: str) -> tuple[int, ...]:
    """``"4x4"`` -> (4, 4); ``"4x4x4"`` -> (4, 4, 4) (a 3-D grid). Raises ConfigError naming the
    expected form."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX*,]\s*(\d+)\s*(?:[xX*,]\s*(\d+)\s*)?", str(text))
    if not m:
        raise ConfigError(f"dims '{text}': expected ROWSxCOLS or XxYxZ, as in '4x4' or '4x4x4'")
    return tuple(int(g) for g in m.groups() if g is not None)


def from_edge_list(
    path: str | Path,
    bytes_per_s: float = DEFAULT_BYTES_PER_S,
    latency_s: float = DEFAULT_LATENCY_S,
    ports: int | None = None,
) -> Topology:
    """User topology from an edge-list file.

    One cable per line, ``u v [GB/s [latency_us]]`` (bidirectional; missing figures take the
    defaults); ``switch NAME ...`` marks switch nodes (not hosts); ``#`` starts a comment. Node
    names are kept as strings, or ints when every name is a number. With switches, tree edges
    between hosts are routed along shortest paths.

    Example:
        >>> import tempfile, os
        >>> with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        ...     _ = f.write("0 1 50\\n1 2\\n2 0 50 2\\n")
        >>> t = from_edge_list(f.name); os.unlink(f.name)
        >>> t.size, t.link(2, 0)
        (3, (50000000000.0, 2e-06))
    """
    p = Path(path)
    lines = read_text(
        p, "topology file", hint="give an edge list 'u v [GB/s [latency_us]]' per line"
    ).splitlines()
    _check_link(bytes_per_s, latency_s)
    edges, switches = [], set()
    for lineno, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if parts[0].lower() == "switch":
            switches.update(parts[1:])
            continue
        if len(parts) not in (2, 3, 4):
            raise ConfigError(
                f"topology file '{path}' line {lineno}: expected 'u v [GB/s [latency_us]]' (got {line!r})"
            )
        try:
            bw = float(parts[2]) * 1e9 if len(parts) > 2 else bytes_per_s
            lat = float(parts[3]) * 1e-6 if len(parts) > 3 else latency_s
        except ValueError:
            raise ConfigError(
                f"topology file '{path}' line {lineno}: bandwidth and latency must be numbers (got {line!r})"
            ) from None
        if not (
            math.isfinite(bw) and bw > 0 and math.isfinite(lat) and lat >= 0
        ):  # NaN fails every comparison
            raise ConfigError(
                f"topology file '{path}' line {lineno}: need a finite GB/s > 0 and a finite "
                f"latency_us >= 0 (got {line!r})"
            )
        if parts[0] == parts[1]:
            raise ConfigError(
                f"topology file '{path}' line {lineno}: self-loop {parts[0]} -- {parts[1]}"
            )
        edges.append((parts[0], parts[1], bw, lat))
    if not edges:
        raise ConfigError(f"topology file '{path}': no edges found")
    names = {u for u, v, *_ in edges} | {v for u, v, *_ in edges}
    numeric = all(n.lstrip("-").isdigit() for n in names)
    conv = int if numeric else str
    g = nx.DiGraph()
    for u, v, bw, lat in edges:
        _add_link(g, conv(u), conv(v), bw, lat)
    sw = {conv(s) for s in switches}
    hosts = tuple(sorted((n for n in g if n not in sw), key=lambda n: (str(type(n)), n)))
    degree = max(sum(1 for v in g.successors(h)) for h in hosts)
    return Topology(
        p.stem,
        "custom",
        g,
        hosts,
        _default_ports(ports, degree if not sw else 1),
        switched=bool(sw),
    )


def parse_topology(
    spec: str,
    nodes: int | None = None,
    dims: str | tuple[int, int] | None = None,
    ports: int | None = None,
    bytes_per_s: float = DEFAULT_BYTES_PER_S,
    latency_s: float = DEFAULT_LATENCY_S,
) -> Topology:
    """Topology from a name and its size, or from an edge-list file.

    ``spec`` is ``ring``, ``fattree`` (with ``nodes``), ``mesh``, ``torus`` (with ``dims``
    ``"RxC"``, or a square number of ``nodes``), a short form with the size attached (``"ring:16"``, ``"torus:8x8"``,
    ``"fattree:64"``), or the path of an edge-list file (:func:`from_edge_list`).

    Example:
        >>> parse_topology("torus:8x8", ports=2).describe()
        'torus8x8 (64 hosts, 2 port(s), links 25 GB/s)'
        >>> parse_topology("ring", nodes=8).size
        8
    """
    text = str(spec).strip()
    kind, _, size = text.partition(":")
    kind = kind.lower().replace("-", "").replace("_", "")
    aliases = {
        "ring": "ring",
        "mesh": "mesh",
        "mesh2d": "mesh",
        "torus": "torus",
        "torus2d": "torus",
        "fattree": "fattree",
    }
    if kind not in aliases:
        if Path(text).exists():
            return from_edge_list(text, bytes_per_s, latency_s, ports)
        raise ConfigError(
            f"topology '{spec}': not one of ring, mesh, torus, fattree and not an existing edge-list file"
        )
    kind = aliases[kind]
    if kind in ("ring", "fattree"):
        if size:
            try:
                nodes = int(size)
            except ValueError:
                raise ConfigError(
                    f"topology '{spec}': the size after ':' must be a node count, as in '{kind}:16'"
                ) from None
        if nodes is None:
            raise ConfigError(f"topology '{kind}' needs a node count: --nodes N (or '{kind}:N')")
        return (
            ring(nodes, bytes_per_s, latency_s, ports)
            if kind == "ring"
            else fat_tree(nodes, None, bytes_per_s, latency_s, ports)
        )
    if size:
        dims = size
    if dims is None and nodes is not None and math.isqrt(nodes) ** 2 == nodes:
        dims = (math.isqrt(nodes), math.isqrt(nodes))
    if dims is None:
        raise ConfigError(
            f"topology '{kind}' needs dimensions: --dims RxC (or '{kind}:RxC'), as in 4x4, or XxYxZ "
            "for a 3-D grid"
        )
    dims = parse_dims(dims) if isinstance(dims, str) else tuple(dims)
    if len(dims) == 3:
        return grid3d(kind, dims, bytes_per_s, latency_s, ports)
    rows, cols = dims
    return (mesh2d if kind == "mesh" else torus2d)(rows, cols, bytes_per_s, latency_s, ports)
