"""All-reduce algorithms as explicit per-step link schedules, a validator and a time model.

The data (``bytes_`` per host) is cut into chunks; a :class:`Transfer` moves some chunks from
one host to another along a route of directed links in one time step, either *reducing* (the
receiver adds the sender's partial sums) or *copying* (the receiver takes the sender's value).
Within a step every transfer reads the state at the start of the step.

Algorithms (:class:`Algorithm`):

- ``ring``: reduce-scatter then all-gather around one ring (a Hamiltonian cycle when the
  topology has one), ``2(N-1)`` steps of ``1/N`` of the data;
- ``dbtree``: NCCL's double binary tree; each half of the data is reduced up one tree and
  broadcast down, pipelined in ``pieces`` pieces (the time model picks the best count);
- ``2dring``: reduce-scatter along rows, then columns; all-gather along columns, then rows
  (the topology's grid, or a near-square logical grid of the hosts);
- ``multitree``: MultiTree (ISCA'21): one spanning tree rooted at every host, grown top-down
  breadth-first with the trees taking turns, one edge per turn, so that within a time step no
  directed link and no port is used twice. Chunk ``r`` belongs to the tree rooted at ``r``:
  reduce-scatter runs up the trees in reverse step order, all-gather down them.

Ring, double binary tree and 2D ring are laid out by one list scheduler: messages in their
logical order, each placed in the earliest step where its links and both hosts' ports are free
and its data is ready (read after the last write of its chunks, write after their last read).
Every schedule is therefore contention-free by construction, and :func:`validate_schedule`
checks it independently (links, ports, routes, and every host ending with every chunk reduced
over all hosts exactly once).

Time model (:func:`schedule_seconds`): each step takes the longest of its transfers, a transfer
taking its route's summed latency + its bytes / the route's slowest link. On uniform links this
is steps x (latency + chunk bytes / bandwidth).

Example:
    >>> from parplan.collectives.topology import torus2d
    >>> t = torus2d(4, 4, ports=4)
    >>> mt, rg = build_schedule("multitree", t), build_schedule("ring", t)
    >>> validate_schedule(mt).ok, validate_schedule(rg).ok
    (True, True)
    >>> rg.phase_steps, mt.phase_steps[0] <= lower_bound_steps(t) + 2
    ((15, 15), True)
    >>> allreduce_seconds("ring", t, 64 * 2**20) > allreduce_seconds("multitree", t, 64 * 2**20)
    True
"""

from __future__ import annotations

import enum
import math
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Hashable, Sequence

from parplan.collectives.topology import Topology
from parplan.errors import ConfigError

__all__ = [
    "Algorithm",
    "Transfer",
    "Schedule",
    "Validation",
    "build_schedule",
    "ring_allreduce_seconds",
    "ring_schedule",
    "dbtree_schedule",
    "ring2d_schedule",
    "multitree_schedule",
    "validate_schedule",
    "schedule_seconds",
    "allreduce_seconds",
    "best_schedule",
    "lower_bound_steps",
    "DBTREE_PIECES",
]

#: Pipelining depths the time model tries for the double binary tree.
DBTREE_PIECES = (1, 2, 4, 8, 16, 32)


class Algorithm(enum.Enum):
    RING = "ring"
    DBTREE = "dbtree"
    RING2D = "2dring"
    MULTITREE = "multitree"

    @classmethod
    def parse(cls, value: "Algorithm | str") -> "Algorithm":
        if isinstance(value, cls):
            return value
        key = str(value).strip().lower().replace("_", "").replace("-", "")
        aliases = {
            "ring": cls.RING,
            "dbtree": cls.DBTREE,
            "doublebinarytree": cls.DBTREE,
            "2dring": cls.RING2D,
            "ring2d": cls.RING2D,
            "multitree": cls.MULTITREE,
        }
        if key not in aliases:
            raise ConfigError(
                f"unknown all-reduce algorithm '{value}'; valid: {', '.join(a.value for a in cls)}"
            )
        return aliases[key]


class Op(enum.Enum):
    REDUCE = "reduce"
    COPY = "copy"


@dataclass(frozen=True)
class Transfer:
    """``chunks`` sent from ``src`` to ``dst`` in time step ``step`` (1-based) along ``route``."""

    step: int
    src: Hashable
    dst: Hashable
    chunks: tuple[int, ...]
    op: Op
    route: tuple[tuple[Hashable, Hashable], ...]


@dataclass(frozen=True)
class Schedule:
    """An all-reduce schedule: chunk sizes (fractions of the data) and timed transfers.

    ``phase_steps`` = (reduce-scatter/reduce steps, all-gather/broadcast steps) where the
    algorithm has separate phases (for the pipelined tree the phases overlap: (steps, 0)).
    """

    algorithm: Algorithm
    topology: Topology
    chunk_fractions: tuple[float, ...]
    transfers: tuple[Transfer, ...]
    phase_steps: tuple[int, int]
    params: tuple[tuple[str, int], ...] = ()

    @property
    def steps(self) -> int:
        return max((t.step for t in self.transfers), default=0)

    def by_step(self) -> list[list[Transfer]]:
        """Transfers grouped by step, index 0 = step 1."""
        out: list[list[Transfer]] = [[] for _ in range(self.steps)]
        for t in self.transfers:
            out[t.step - 1].append(t)
        return out


@dataclass(frozen=True)
class Validation:
    """Result of :func:`validate_schedule`: ``ok`` and the problems found (empty when ok)."""

    ok: bool
    problems: tuple[str, ...]
    steps: int
    max_link_uses: int
    max_port_uses: int


# --------------------------------------------------------------------------------------------
# List scheduler shared by ring, double binary tree and 2D ring.


@dataclass(frozen=True)
class _Msg:
    src: Hashable
    dst: Hashable
    chunks: tuple[int, ...]
    op: Op


class _Packer:
    """Places messages, in logical order, at the earliest step that respects resources and data."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self.links: dict[int, set] = defaultdict(set)
        self.sends: dict[int, dict] = defaultdict(lambda: defaultdict(int))
        self.recvs: dict[int, dict] = defaultdict(lambda: defaultdict(int))
        self.last_write: dict = {}
        self.last_write_op: dict = {}
        self.last_read: dict = {}
        self.out: list[Transfer] = []

    def place(self, msg: _Msg) -> int:
        route = self.topo.route(msg.src, msg.dst)
        step = 1
        for c in msg.chunks:
            # read (src, c) after its last write; write (dst, c) no earlier than its last read
            # and after its last write (reductions into one place may share a step).
            step = max(
                step, self.last_write.get((msg.src, c), 0) + 1, self.last_read.get((msg.dst, c), 1)
            )
            w = self.last_write.get((msg.dst, c), 0)
            same_ok = msg.op is Op.REDUCE and self.last_write_op.get((msg.dst, c)) is Op.REDUCE
            step = max(step, w if same_ok else w + 1)
        ports = self.topo.ports
        while (
            self.sends[step][msg.src] >= ports
            or self.recvs[step][msg.dst] >= ports
            or any(link in self.links[step] for link in route)
        ):
            step += 1
        self.links[step].update(route)
        self.sends[step][msg.src] += 1
        self.recvs[step][msg.dst] += 1
        for c in msg.chunks:
            self.last_read[(msg.src, c)] = max(self.last_read.get((msg.src, c), 0), step)
            self.last_write[(msg.dst, c)] = max(self.last_write.get((msg.dst, c), 0), step)
            self.last_write_op[(msg.dst, c)] = msg.op
        self.out.append(Transfer(step, msg.src, msg.dst, msg.chunks, msg.op, route))
        return step


def _pack(topo: Topology, messages: Sequence[_Msg]) -> tuple[Transfer, ...]:
    packer = _Packer(topo)
    for m in messages:
        packer.place(m)
    return tuple(sorted(packer.out, key=lambda t: (t.step, str(t.src), str(t.dst))))


# --------------------------------------------------------------------------------------------
# Ring.


def _hamiltonian_order(topo: Topology) -> list:
    """A ring order of the hosts: a Hamiltonian cycle when easy to find, else BFS-ish order."""
    hosts = list(topo.hosts)
    if topo.kind == "ring":
        return hosts
    if topo.dims is not None:
        rows, cols = topo.dims
        if rows == 1 or cols == 1:
            return hosts
        transpose = rows % 2 == 1 and cols % 2 == 0
        r_, c_ = (cols, rows) if transpose else (rows, cols)
        cells: list[tuple[int, int]] = []
        if r_ % 2 == 0:
            # Row 0 left to right, snake through columns 1.. of the other rows, back up column 0.
            cells += [(0, c) for c in range(c_)]
            for r in range(1, r_):
                cols_r = range(c_ - 1, 0, -1) if r % 2 == 1 else range(1, c_)
                cells += [(r, c) for c in cols_r]
            cells += [(r, 0) for r in range(r_ - 1, 0, -1)]
        else:
            for r in range(r_):
                cells += [(r, c) for c in (range(c_) if r % 2 == 0 else range(c_ - 1, -1, -1))]
        if transpose:
            return [c * cols + r for r, c in cells]
        return [r * cols + c for r, c in cells]
    if topo.switched:
        return hosts
    # Greedy walk through neighbors, falling back to the nearest unvisited host.
    order, seen = [hosts[0]], {hosts[0]}
    while len(order) < len(hosts):
        nxt = [v for v in topo.neighbors(order[-1]) if v not in seen]
        if not nxt:
            nxt = sorted(
                (h for h in hosts if h not in seen), key=lambda h: len(topo.route(order[-1], h))
            )
        order.append(nxt[0])
        seen.add(nxt[0])
    return order


def _ring_messages(
    order: Sequence, chunk_groups: Sequence[tuple[int, ...]]
) -> tuple[list[_Msg], list[_Msg]]:
    """Reduce-scatter and all-gather messages of one ring; group ``g`` ends reduced at order[g]."""
    n = len(order)
    rs, ag = [], []
    for t in range(n - 1):
        for i in range(n):
            # Host i sends group (i - t - 1) mod n, reduced so far, to host i+1; after n-1 steps
            # host i holds group i complete.
            rs.append(_Msg(order[i], order[(i + 1) % n], chunk_groups[(i - t - 1) % n], Op.REDUCE))
    for t in range(n - 1):
        for i in range(n):
            ag.append(_Msg(order[i], order[(i + 1) % n], chunk_groups[(i - t) % n], Op.COPY))
    return rs, ag


def ring_schedule(topo: Topology) -> Schedule:
    """Ring all-reduce over a Hamiltonian cycle of the hosts: N chunks, 2(N-1) steps."""
    order = _hamiltonian_order(topo)
    n = len(order)
    rs, ag = _ring_messages(order, [(g,) for g in range(n)])
    transfers = _pack(topo, rs + ag)
    rs_steps = max(t.step for t in transfers if t.op is Op.REDUCE)
    steps = max(t.step for t in transfers)
    return Schedule(Algorithm.RING, topo, (1.0 / n,) * n, transfers, (rs_steps, steps - rs_steps))


# --------------------------------------------------------------------------------------------
# 2D ring.


def _grid_dims(topo: Topology) -> tuple[int, int]:
    if topo.dims is not None:
        return topo.dims
    n = topo.size
    rows = max(d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0)
    return rows, n // rows


def ring2d_schedule(topo: Topology) -> Schedule:
    """Hierarchical ring: reduce-scatter on row rings, then column rings; all-gather back.

    Uses the mesh/torus grid, or for other topologies a near-square logical grid of the hosts
    in order (routes may then be multi-hop). ``rows x cols`` chunks.
    """
    rows, cols = _grid_dims(topo)
    hosts = list(topo.hosts)
    grid = [[hosts[r * cols + c] for c in range(cols)] for r in range(rows)]
    # Chunk g*rows + b: column group g (held after the row phase by the host at column g) and
    # row b within it (held after the column phase by the host at row b).
    row_groups = [tuple(g * rows + b for b in range(rows)) for g in range(cols)]
    rs_row, ag_row, rs_col, ag_col = [], [], [], []
    if cols > 1:
        for r in range(rows):
            rs, ag = _ring_messages(grid[r], row_groups)
            rs_row += rs
            ag_row += ag
    if rows > 1:
        for c in range(cols):
            column = [grid[r][c] for r in range(rows)]
            rs, ag = _ring_messages(column, [(c * rows + b,) for b in range(rows)])
            rs_col += rs
            ag_col += ag
    # Interleave rows / columns by logical step so parallel rings share steps.
    transfers = _pack(
        topo,
        _by_round(rs_row, rows, cols)
        + _by_round(rs_col, cols, rows)
        + _by_round(ag_col, cols, rows)
        + _by_round(ag_row, rows, cols),
    )
    rs_steps = max((t.step for t in transfers if t.op is Op.REDUCE), default=0)
    steps = max(t.step for t in transfers)
    n = rows * cols
    return Schedule(
        Algorithm.RING2D,
        topo,
        (1.0 / n,) * n,
        transfers,
        (rs_steps, steps - rs_steps),
        params=(("rows", rows), ("cols", cols)),
    )


def _by_round(messages: list[_Msg], rings: int, size: int) -> list[_Msg]:
    """Reorder the messages of ``rings`` rings of ``size`` hosts so that round t of every ring
    comes before round t+1 of any."""
    if not messages:
        return []
    per_ring = len(messages) // rings
    rounds = per_ring // size
    out = []
    for t in range(rounds):
        for k in range(rings):
            out += messages[k * per_ring + t * size : k * per_ring + (t + 1) * size]
    return out


# --------------------------------------------------------------------------------------------
# Double binary tree.


def _btree(n: int) -> tuple[int, dict[int, list[int]]]:
    """In-order binary tree over positions 0..n-1 (leaves at even positions): root, children."""
    children: dict[int, list[int]] = {x: [] for x in range(n)}

    def build(x: int, low: int, high: int) -> None:
        # x (1-based) covers positions low..high (1-based).
        b = x & -x
        h = b // 2
        while h >= 1:
            left = x - h
            if left >= low:
                children[x - 1].append(left - 1)
                build(left, low, x - 1)
                break
            h //= 2
        h = b // 2
        while h >= 1:
            right = x + h
            if right <= high:
                children[x - 1].append(right - 1)
                build(right, x + 1, high)
                break
            h //= 2

    root = 1 << (n.bit_length() - 1)
    build(root, 1, n)
    return root - 1, children


def dbtree_schedule(topo: Topology, pieces: int = 1) -> Schedule:
    """Double binary tree: two trees whose inner nodes are each other's leaves (the second is
    the first shifted by one host); half the data per tree, pipelined in ``pieces`` pieces."""
    if not isinstance(pieces, int) or pieces < 1:
        raise ConfigError(f"dbtree pieces must be an integer >= 1 (got {pieces!r})")
    hosts = list(topo.hosts)
    n = len(hosts)
    root, children = _btree(n)
    trees = []
    for shift in (0, 1):

        def host(p: int, shift: int = shift):
            return hosts[(p + shift) % n]

        order, frontier = [], [root]
        while frontier:  # breadth-first: parents before children
            order += frontier
            frontier = [c for p in frontier for c in children[p]]
        up = [(host(c), host(p)) for p in reversed(order) for c in children[p]]
        down = [(host(p), host(c)) for p in order for c in children[p]]
        trees.append((up, down))
    messages: list[_Msg] = []
    for k in range(pieces):
        for t, (up, down) in enumerate(trees):
            chunk = (t * pieces + k,)
            messages += [_Msg(s, d, chunk, Op.REDUCE) for s, d in up]
        for t, (up, down) in enumerate(trees):
            chunk = (t * pieces + k,)
            messages += [_Msg(s, d, chunk, Op.COPY) for s, d in down]
    transfers = _pack(topo, messages)
    steps = max(t.step for t in transfers)
    return Schedule(
        Algorithm.DBTREE,
        topo,
        (1.0 / (2 * pieces),) * (2 * pieces),
        transfers,
        (steps, 0),
        params=(("pieces", pieces),),
    )


# --------------------------------------------------------------------------------------------
# MultiTree.


#: Directions of a 2D mesh / torus neighbour, as (row step, column step).
_DIRECTIONS = {"n": (-1, 0), "s": (1, 0), "w": (0, -1), "e": (0, 1)}
#: The reference construction's neighbour order on meshes and tori: north, south, west, east.
DIMENSION_ORDER = "nswe"


def grid_neighbor_order(topo: Topology, order: str = DIMENSION_ORDER):
    """Candidate children of a host on a 2D mesh or torus, in the direction order ``order``
    (a permutation of ``"nswe"``); None for other topologies (their own order is kept)."""
    if topo.dims is None or topo.switched:
        return None
    if sorted(order) != sorted(DIMENSION_ORDER):
        raise ConfigError(f"neighbour order must be a permutation of 'nswe' (got {order!r})")
    rows, cols = topo.dims
    wrap = topo.kind == "torus"

    def candidates(host) -> tuple:
        r, c = divmod(host, cols)
        out = []
        for d in order:
            dr, dc = _DIRECTIONS[d]
            nr, nc = r + dr, c + dc
            if wrap:
                nr, nc = nr % rows, nc % cols
            elif not (0 <= nr < rows and 0 <= nc < cols):
                continue
            v = nr * cols + nc
            if v != host and v not in out and topo.graph.has_edge(host, v):
                out.append(v)
        return tuple(out)

    return candidates


def multitree_schedule(topo: Topology, neighbor_order: str | None = DIMENSION_ORDER) -> Schedule:
    """MultiTree all-reduce: a spanning tree rooted at every host, built step by step.

    On meshes and tori a host's candidate children are its neighbours in ``neighbor_order``
    (default north, south, west, east, as the reference construction; ring's N-1 steps per
    phase on a 1-port torus); ``None`` or another topology: the topology's own order.

    In each time step the trees take turns in rounds (the trees with fewest hosts first, ties
    in an order rotating every step); on its turn a tree adds one edge: the first host already
    in it (breadth-first order) with a free send port, and its first candidate child (a
    neighbor; on a switched network any host, nearest first) not yet in the tree whose
    receive port and route links are free in this step. Turns repeat until no tree can grow in
    the step. Hosts joining in a step send from the next step on. Tree ``r`` carries chunk
    ``r``: its edge added in step ``t`` reduces the chunk up in schedule step ``T + 1 - t``
    (reduce-scatter, so children reduce before their parents) and copies it down in step
    ``T + t`` (all-gather), where ``T`` is the number of steps to span all trees.
    """
    hosts = list(topo.hosts)
    n = len(hosts)
    ports = topo.ports
    grid = grid_neighbor_order(topo, neighbor_order) if neighbor_order is not None else None
    candidates = grid if grid is not None else topo.tree_candidates
    members = [{h} for h in hosts]
    order = [[h] for h in hosts]  # breadth-first order of each tree
    joined: list[dict] = [{h: 0} for h in hosts]
    edges: list[tuple[int, int, Hashable, Hashable]] = []  # (step, tree, parent, child)
    step = 0
    while any(len(m) < n for m in members):
        step += 1
        used: set = set()
        sends: dict = defaultdict(int)
        recvs: dict = defaultdict(int)
        grew = True
        start = (step - 1) % n
        while grew:
            grew = False
            # One round of turns: trees that are behind (fewest hosts) go first, ties in an
            # order that rotates every step, so no tree is starved of links.
            for r in sorted(range(n), key=lambda r: (len(members[r]), (r - start) % n)):
                if len(members[r]) == n:
                    continue
                added = _grow_one(
                    topo,
                    candidates,
                    r,
                    step,
                    members[r],
                    order[r],
                    joined[r],
                    used,
                    sends,
                    recvs,
                    ports,
                )
                if added is not None:
                    edges.append((step, r, *added))
                    grew = True
    T = step
    transfers = []
    for t, r, parent, child in edges:
        route_down = topo.route(parent, child)
        # The reduction retraces the edge's route backwards, so the mirrored step uses exactly
        # the reversed links of the forward step and stays contention-free.
        route_up = tuple((b, a) for a, b in reversed(route_down))
        transfers.append(Transfer(t + T, parent, child, (r,), Op.COPY, route_down))
        transfers.append(Transfer(T + 1 - t, child, parent, (r,), Op.REDUCE, route_up))
    transfers.sort(key=lambda x: (x.step, str(x.src), str(x.dst)))
    return Schedule(
        Algorithm.MULTITREE,
        topo,
        (1.0 / n,) * n,
        tuple(transfers),
        (T, T),
        params=(("order", neighbor_order),) if grid is not None else (),
    )


def _grow_one(topo, candidates, r, step, members, order, joined, used, sends, recvs, ports):
    for parent in order:
        if joined[parent] >= step or sends[parent] >= ports:
            continue
        for child in candidates(parent):
            if child in members or recvs[child] >= ports:
                continue
            route = topo.route(parent, child)
            if any(link in used for link in route):
                continue
            used.update(route)
            sends[parent] += 1
            recvs[child] += 1
            members.add(child)
            order.append(child)
            joined[child] = step
            return parent, child
    return None


# --------------------------------------------------------------------------------------------
# Validation and time.


def validate_schedule(schedule: Schedule) -> Validation:
    """Check a schedule independently of how it was built.

    Per step: every route is a path of existing links from src to dst, no directed link
    carries two transfers, no host sends or receives more than ``ports`` transfers. Data:
    simulating the steps (each transfer reads the start-of-step state), no reduction adds a
    contribution twice, a copy and another write never hit one chunk of one host in the same
    step, and at the end every host holds every chunk reduced over all hosts.
    """
    topo = schedule.topology
    problems: list[str] = []
    hosts = list(topo.hosts)
    index = {h: i for i, h in enumerate(hosts)}
    full = (1 << len(hosts)) - 1
    n_chunks = len(schedule.chunk_fractions)
    if not math.isclose(sum(schedule.chunk_fractions), 1.0, rel_tol=1e-9):
        problems.append(f"chunk fractions sum to {sum(schedule.chunk_fractions)}, not 1")
    state = {(h, c): 1 << index[h] for h in hosts for c in range(n_chunks)}
    max_link, max_port = 0, 0
    for s, step in enumerate(schedule.by_step(), start=1):
        link_use: dict = defaultdict(int)
        sends: dict = defaultdict(int)
        recvs: dict = defaultdict(int)
        writes: dict = defaultdict(list)
        for t in step:
            if t.src not in index or t.dst not in index:
                problems.append(f"step {s}: transfer {t.src}->{t.dst} involves a non-host")
                continue
            path_ok = (
                bool(t.route)
                and t.route[0][0] == t.src
                and t.route[-1][1] == t.dst
                and all(a[1] == b[0] for a, b in zip(t.route[:-1], t.route[1:]))
            )
            if not path_ok:
                problems.append(
                    f"step {s}: route of {t.src}->{t.dst} is not a path from {t.src} to {t.dst}"
                )
            for link in t.route:
                if not topo.graph.has_edge(*link):
                    problems.append(f"step {s}: link {link[0]}->{link[1]} does not exist")
                link_use[link] += 1
            sends[t.src] += 1
            recvs[t.dst] += 1
            for c in t.chunks:
                if not 0 <= c < n_chunks:
                    problems.append(f"step {s}: chunk {c} out of range")
                    continue
                writes[(t.dst, c)].append((t.op, state[(t.src, c)], t.src))
        for link, k in link_use.items():
            if k > 1:
                problems.append(f"step {s}: link {link[0]}->{link[1]} used {k} times")
        for h, k in list(sends.items()) + list(recvs.items()):
            if k > topo.ports:
                problems.append(f"step {s}: host {h} uses {k} ports (has {topo.ports})")
        max_link = max([max_link, *link_use.values()])
        max_port = max([max_port, *sends.values(), *recvs.values()])
        new = {}
        for (h, c), ws in writes.items():
            if any(op is Op.COPY for op, *_ in ws):
                if len(ws) > 1:
                    problems.append(
                        f"step {s}: chunk {c} of host {h} written by a copy and {len(ws) - 1} other transfer(s)"
                    )
                new[(h, c)] = ws[0][1]
                continue
            acc = state[(h, c)]
            for _, contrib, src in ws:
                if acc & contrib:
                    problems.append(
                        f"step {s}: reduction {src}->{h} of chunk {c} adds contributions twice"
                    )
                acc |= contrib
            new[(h, c)] = acc
        state.update(new)
    incomplete = [(h, c) for (h, c), v in state.items() if v != full]
    if incomplete:
        h, c = incomplete[0]
        problems.append(
            f"{len(incomplete)} (host, chunk) pairs end incomplete, e.g. host {h} chunk {c} has "
            f"{bin(state[(h, c)]).count('1')} of {len(hosts)} contributions"
        )
    return Validation(not problems, tuple(problems[:50]), schedule.steps, max_link, max_port)


def schedule_seconds(schedule: Schedule, bytes_: float) -> float:
    """Seconds to run ``schedule`` on ``bytes_`` of data per host (see the module docstring)."""
    if bytes_ < 0:
        raise ConfigError(f"all-reduce size must be >= 0 bytes (got {bytes_})")
    topo = schedule.topology
    total = 0.0
    for step in schedule.by_step():
        longest = 0.0
        for t in step:
            lat = sum(topo.graph.edges[e]["latency_s"] for e in t.route)
            bw = min(topo.graph.edges[e]["bytes_per_s"] for e in t.route)
            size = bytes_ * sum(schedule.chunk_fractions[c] for c in t.chunks)
            longest = max(longest, lat + size / bw)
        total += longest
    return total


def lower_bound_steps(topo: Topology) -> int:
    """Fewest all-gather (or reduce-scatter) steps with N chunks of 1/N: each host must receive
    N-1 chunks, at most min(ports, its incoming links) per step. On a torus with 4 ports this
    is ceil((N-1) / 4); a mesh corner has 2 links, so a mesh needs ceil((N-1) / 2)."""
    fan_in = min(min(topo.ports, topo.graph.in_degree(h)) for h in topo.hosts)
    return -(-(topo.size - 1) // fan_in)


#: Largest topology an explicit schedule is built for. Building grows steeply with the hosts
#: (all four algorithms on a 16x16 torus: 15 s; on 32x32: about 6 minutes on one core).
MAX_SCHEDULE_HOSTS = 1024
#: Above this many hosts the CLI warns that building schedules takes a while.
SLOW_SCHEDULE_HOSTS = 256


def build_schedule(algorithm: Algorithm | str, topology: Topology, pieces: int = 1) -> Schedule:
    """The schedule of ``algorithm`` on ``topology`` (cached on the topology).

    ``pieces`` only applies to ``dbtree``. Topologies over :data:`MAX_SCHEDULE_HOSTS` hosts are
    refused (explicit per-step schedules would take hours to build).
    """
    if topology.size > MAX_SCHEDULE_HOSTS:
        raise ConfigError(
            f"{topology.describe()}: explicit all-reduce schedules are built for at most "
            f"{MAX_SCHEDULE_HOSTS:,} hosts (got {topology.size:,}; 1,024 hosts take about 6 minutes)"
        )
    alg = Algorithm.parse(algorithm)
    key = ("schedule", alg, pieces if alg is Algorithm.DBTREE else 1)
    cache = topology._cache
    if key not in cache:
        if alg is Algorithm.RING:
            cache[key] = ring_schedule(topology)
        elif alg is Algorithm.DBTREE:
            cache[key] = dbtree_schedule(topology, pieces)
        elif alg is Algorithm.RING2D:
            cache[key] = ring2d_schedule(topology)
        else:
            cache[key] = _multitree_no_worse_than_ring(topology)
    return cache[key]


def _multitree_no_worse_than_ring(topo: Topology) -> Schedule:
    """MultiTree in the dimension neighbour order (and, on meshes, the topology's own order
    where it needs fewer steps); never more steps than ring on the same topology and ports:
    then ring's schedule is returned, marked ``fallback=ring``."""
    tried = [multitree_schedule(topo)]
    if topo.kind == "mesh":
        tried.append(multitree_schedule(topo, None))
    best = min(tried, key=lambda sched: sched.steps)
    ring_sched = build_schedule(Algorithm.RING, topo)
    if best.steps > ring_sched.steps:
        return replace(ring_sched, algorithm=Algorithm.MULTITREE, params=(("fallback", "ring"),))
    return best


def best_schedule(
    algorithm: Algorithm | str, topology: Topology, bytes_: float
) -> tuple[Schedule, float]:
    """(schedule, seconds) for ``bytes_``; for ``dbtree`` the fastest pipelining depth of
    :data:`DBTREE_PIECES`."""
    alg = Algorithm.parse(algorithm)
    options = DBTREE_PIECES if alg is Algorithm.DBTREE else (1,)
    best = None
    for pieces in options:
        sched = build_schedule(alg, topology, pieces)
        seconds = schedule_seconds(sched, bytes_)
        if best is None or seconds < best[1]:
            best = (sched, seconds)
    return best


def ring_allreduce_seconds(
    hosts: int, bytes_: float, bytes_per_s: float, latency_s: float = 0.0
) -> float:
    """The ring all-reduce in closed form: ``2 (n-1)/n x bytes / B + 2 (n-1) x latency`` (a
    reduce-scatter then an all-gather, ``n - 1`` steps each). It equals what
    :func:`ring_schedule` takes on a ring of ``n`` hosts (tests/test_collectives.py checks it);
    the pipeline planner prices weight sync with it.

    Example:
        >>> ring_allreduce_seconds(4, 1e9, 1e9)
        1.5
    """
    if hosts <= 1:
        return 0.0
    return 2.0 * (hosts - 1) / hosts * bytes_ / bytes_per_s + 2.0 * (hosts - 1) * latency_s


def allreduce_seconds(algorithm: Algorithm | str, topology: Topology, bytes_: float) -> float:
    """Seconds to all-reduce ``bytes_`` per host with ``algorithm`` on ``topology``.

    The entry point for cost models (e.g. pricing BATCH-type gradient exchange).

    Example:
        >>> from parplan.collectives.topology import ring
        >>> t = ring(4, bytes_per_s=1e9, latency_s=0.0, ports=1)
        >>> allreduce_seconds("ring", t, 4e9)  # 2 (N-1) steps of 1e9 bytes at 1e9 B/s
        6.0
    """
    return best_schedule(algorithm, topology, bytes_)[1]
