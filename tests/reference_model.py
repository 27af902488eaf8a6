"""An independent evaluator written from docs/costmodel.md, for tests only.

It imports no pricing code of parplan (no costmodel.cost, layout, split or evaluate): it reads
the planning graph's structure and per-sample sizes, and recomputes every amount with explicit
rectangles in absolute coordinates (side 1 holds the first ``a`` of a split dimension, side 2
the rest; no mirroring; a node's box at a group is cut from its box at the parent), their
unions, differences and intersections by coordinate compression, with the set rules of
docs/costmodel.md section 3 written as predicates. No collective arrays.
"""

from __future__ import annotations

from itertools import product

PORTS = {
    "batch": ("rows", "rows"),
    "in": ("cols", "whole"),
    "out": ("whole", "cols"),
    "rows": ("rows", "rows"),
    "cols": ("cols", "cols"),
    "whole": ("whole", "whole"),
}
PARTIAL = {"batch": "W", "in": "out", "out": "in"}


def child_box(box, choice: str, a: float, side: int):
    """The box (rows, ins, outs intervals in root coordinates) side ``side`` keeps, or None."""
    s = a if side == 0 else 1.0 - a
    if box is None or s <= 0:
        return None
    axes = {
        "batch": ("rows",),
        "rows": ("rows",),
        "in": ("ins",),
        "out": ("outs",),
        "cols": ("ins", "outs"),
        "whole": (),
    }[choice]
    out = dict(box)
    for ax in axes:
        lo, hi = box[ax]
        cut = lo + a * (hi - lo)
        out[ax] = (lo, cut) if side == 0 else (cut, hi)
    return out


def port(box, which: str) -> list[tuple[float, float, float, float]]:
    """Rows x input columns ("in") or rows x output columns ("out") of a box."""
    if box is None:
        return []
    r0, r1 = box["rows"]
    c0, c1 = box["ins" if which == "in" else "outs"]
    return [(r0, r1, c0, c1)] if r1 > r0 and c1 > c0 else []


ROOT_BOX = {"rows": (0.0, 1.0), "ins": (0.0, 1.0), "outs": (0.0, 1.0)}


def _inside(rects, r, c) -> bool:
    return any(r0 <= r < r1 and c0 <= c < c1 for r0, r1, c0, c1 in rects)


def area_where(pred, *rect_sets) -> float:
    """Area of the cells (of the grid all rectangles induce) where ``pred(memberships)`` holds."""
    rs = sorted({0.0, 1.0} | {x for s in rect_sets for q in s for x in q[:2]})
    cs = sorted({0.0, 1.0} | {x for s in rect_sets for q in s for x in q[2:]})
    total = 0.0
    for (r0, r1), (c0, c1) in product(zip(rs, rs[1:]), zip(cs, cs[1:])):
        mid_r, mid_c = (r0 + r1) / 2, (c0 + c1) / 2
        if pred([_inside(s, mid_r, mid_c) for s in rect_sets]):
            total += (r1 - r0) * (c1 - c0)
    return total


def scaled(d: dict, choice: str, s: float) -> dict:
    if s <= 0:
        return {**d, "B": 0.0, "Di": 0.0, "Do": 0.0}
    if choice in ("batch", "rows"):
        return {**d, "B": d["B"] * s}
    if choice == "in":
        return {**d, "Di": d["Di"] * s}
    if choice == "out":
        return {**d, "Do": d["Do"] * s}
    if choice == "cols":
        return {**d, "Di": d["Di"] * s, "Do": d["Do"] * s}
    return d


def sizes(d: dict) -> tuple[float, float, float, float]:
    """(flops, |W|, |F_in|, |F_out|) of a node with raw sizes ``d``."""
    w = d["E"] * d["Di"] * d["Do"] * d["k"] / d["g"] + d["tables"] * d["Di"]
    fin, fout = d["B"] * d["Di"] * d["Si"], d["B"] * d["Do"] * d["So"]
    return 6 * d["top"] * d["B"] * d["Do"] * d["So"] * d["Di"] * d["k"] / d["g"], w, fin, fout


def _eff(dev, kind: str) -> float:
    """Section 5's achieved fraction of peak for FLOPs of ``kind``."""
    own = {
        "conv": getattr(dev, "conv_efficiency", None),
        "attention": getattr(dev, "attention_efficiency", None),
    }
    return own.get(kind) if own.get(kind) is not None else dev.efficiency


def _roof(flops: float, traffic: float, dev, kind: str, kernels: int) -> float:
    """Section 5: the roofline of one op with its launch roof (its kernels cannot be issued
    faster than one per t0) when it does anything."""
    hbm = getattr(dev, "memory_efficiency", 1.0) * dev.memory_bytes_per_s
    launch = kernels * getattr(dev, "kernel_overhead_s", 0.0) if flops > 0 or traffic > 0 else 0.0
    return max(flops / (_eff(dev, kind) * dev.flops_per_s), traffic / hbm, launch)


def compute_s(d: dict, dev, bpe: float) -> float:
    flops, w, fin, fout = sizes(d)
    mb = d["mb"]
    t = 0.0
    if d["k"] and flops > 0:  # the weights are read once per micro-batch
        kind = "conv" if d["k"] > 1 else "gemm"
        moved = (d["top"] * (fin + fout) + mb * w) * bpe
        t = _roof(flops, 3 * moved, dev, kind, 3 * mb)
        if d.get("rc"):  # recomputation: the forward product again, 2 of 6 FLOPs, F_in + W + F_out
            t += _roof(flops / 3, moved, dev, kind, mb)
    for n, ops in ((fout, d["out_ops"]), (fin, d["in_ops"])):
        if n > 0:
            for op in ops:
                kind = "attention" if op.kind == "attention" else "gemm"
                t += _roof(n * op.flops, n * op.traffic * bpe, dev, kind, 2 * mb)
                if d.get("rc"):  # and each op's forward: a third of its FLOPs, half its traffic
                    t += _roof(n * op.flops / 3, n * op.traffic / 2 * bpe, dev, kind, mb)
    return t


def memory_b(d: dict, bpe: float, opt: float, zero: int = 0, rows: float = 1.0) -> float:
    """Bytes a device keeps; ``rows``: the length of its box's row interval, i.e. the part of the
    batch it holds, which is its share of a replicated weight's ZeRO shards (section 6.1)."""
    _, w, fin, fout = sizes(d)
    stored = (
        (d["top"] * fin if d["k"] else 0.0)
        + fout * sum(o.stored for o in d["out_ops"])
        + fin * sum(o.stored for o in d["in_ops"])
    )
    if d.get("rc") and d.get("ck") is not None:  # block checkpointing: what enters the block
        stored = d["ck"] * fin
    elif d.get("rc"):  # recomputation keeps only the checkpoint: a product's input
        stored = fin if d["k"] else 0.0
    stored /= d["mb"]  # activations are held for one micro-batch at a time
    weights = bpe * (rows if zero == 3 else 1.0)
    grads = bpe * (rows if zero >= 2 else 1.0)
    state = opt * (rows if zero >= 1 else 1.0)
    return w * (weights + grads + state) + stored * bpe


def all_stored_b(d: dict, bpe: float) -> float:
    """Bytes of every activation a node's part keeps of one micro-batch, nothing recomputed."""
    _, _, fin, fout = sizes(d)
    stored = (
        (d["top"] * fin if d["k"] else 0.0)
        + fout * sum(o.stored for o in d["out_ops"])
        + fin * sum(o.stored for o in d["in_ops"])
    )
    return stored / d["mb"] * bpe


def ref_blocks(pg) -> list:
    """Section 6.3's blocks, from the node names: the name up to the first part that is a
    number (not the last part), else up to the first part that is letters then digits; blocks
    of one node are none."""
    keys = []
    for node in pg.nodes:
        parts = node.name.split(".")
        key = None
        for i in range(len(parts) - 1):
            if parts[i].isdigit():
                key = ".".join(parts[: i + 1])
                break
        if key is None:
            for i in range(len(parts) - 1):
                p = parts[i]
                head = p.rstrip("0123456789")
                if head and head != p and all(c.isalpha() or c == "_" for c in head):
                    key = ".".join(parts[: i + 1])
                    break
        keys.append(key)
    return [k if k is not None and keys.count(k) > 1 else None for k in keys]


def ref_units(pg) -> list:
    """Section 6.1's FSDP units: the blocks, and the nodes outside them one more unit; in a
    model without blocks, every node."""
    blocks = ref_blocks(pg)
    if all(b is None for b in blocks):
        return list(range(len(blocks)))
    return [b if b is not None else "outside blocks" for b in blocks]


def ref_checkpoints(pg, blocks) -> list:
    """Per node in a block, the part of its input kept: from each earlier node outside the
    block (or the graph input), the first time the block reads it."""
    out, seen = [], set()
    for v, node in enumerate(pg.nodes):
        b = blocks[v]
        if b is None:
            out.append(None)
            continue
        kept = 0.0
        for u, f in zip(node.preds, node.fractions):
            if blocks[u] != b and (b, u) not in seen:
                seen.add((b, u))
                kept += f
        if node.graph_input > 0 and (b, "input") not in seen:
            seen.add((b, "input"))
            kept += node.graph_input
        out.append(kept)
    return out


def raw(node, batch, recompute: bool = False, micro_batches: int = 1, ck=None) -> dict:
    d = node.dims
    return {
        "B": float(batch),
        "rc": recompute,
        "ck": ck,
        "mb": micro_batches,
        "Di": d.in_features,
        "Do": d.out_features,
        "Si": d.in_spatial,
        "So": d.out_spatial,
        "k": d.kernel,
        "g": d.groups,
        "out_ops": d.out_ops,
        "in_ops": d.in_ops,
        "tables": d.tables,
        "rowx": sum(op.row_exchange for op in d.out_ops),
        "E": d.experts,
        "top": d.active,
    }


def group_device(group):
    """A group as one device (sections 5 and 7): summed achieved FLOP/s of each kind, summed
    achieved HBM bandwidth, the smallest launch time."""
    devs = group.devices()
    gemm = sum(x.flops_per_s * _eff(x, "gemm") for x in devs)

    class D:
        flops_per_s = gemm
        memory_bytes_per_s = sum(x.memory_bytes_per_s * x.memory_efficiency for x in devs)
        efficiency = 1.0
        conv_efficiency = sum(x.flops_per_s * _eff(x, "conv") for x in devs) / gemm
        attention_efficiency = sum(x.flops_per_s * _eff(x, "attention") for x in devs) / gemm
        memory_efficiency = 1.0
        kernel_overhead_s = min(x.kernel_overhead_s for x in devs)

    return D


def split_comm(
    pg,
    dims,
    roots,
    boxes,
    split,
    link,
    bpe,
    leaf_pair,
    above=None,
    zero=0,
    mb=1,
    overlap=False,
    blocks=None,
):
    """Per node, per side: (seconds of communication, elements received, seconds of it that
    overlap the side's work) at one split.

    ``boxes``: every node's box at this group; ``roots``: raw sizes at the root (tensor sizes);
    ``above``: per node, whether a split above cut its rows / output columns (both sides
    working)."""
    above = above or [(False, False)] * len(pg.nodes)
    n = len(pg.nodes)
    kids = [
        [child_box(boxes[v], split.choices[v].value, split.shares[v], i) for v in range(n)]
        for i in (0, 1)
    ]
    out = []
    for u in range(n):
        cu, au = split.choices[u].value, split.shares[u]
        g = port(boxes[u], "out")
        h = [port(kids[0][u], "out"), port(kids[1][u], "out")]
        tensors: dict = {}
        for v, node in enumerate(pg.nodes):
            for p, pred in enumerate(node.preds):
                if pred == u:
                    size = node.fractions[p] * sizes(roots[v])[2]
                    tensors.setdefault(node.sources[p], [size, set()])[1].add(v)
        per_side = []
        for i in (0, 1):
            recv = 0.0
            wrecv = 0.0  # the weight-gradient exchange, once per step (section 6.4)
            both = 0 < au < 1
            tables = dims[u]["tables"] * dims[u]["Di"]
            stats = dims[u]["B"] * dims[u]["rowx"]
            _, w, fin, fout = sizes(dims[u])
            if cu in ("in", "out") and both:
                recv += {"in": fout, "out": fin}[cu]
            if (
                cu == "in" and both and dims[u]["rc"]
            ):  # recomputation reduces the forward partial again
                recv += fout
            replicated = w if cu == "batch" else (tables if cu == "rows" else 0.0)
            if both and replicated > 0:
                # reduce-scatter (this side's share of the other's partial) and all-gather (the
                # other's share) once per step; ZeRO-2: the reduce-scatter per micro-batch; ZeRO-3:
                # per micro-batch a reduce-scatter and an all-gather before forward and backward
                mine = au if i == 0 else 1 - au
                other = 1 - mine
                wrecv += {
                    0: mine + other,
                    1: mine + other,
                    2: mb * mine + other,
                    3: mb * (mine + 2 * other),
                }[zero] * replicated
            again = 1.5 if dims[u]["rc"] else 1.0  # recomputation: the forward half once more
            if (
                PORTS[cu][1] == "cols" and both
            ):  # layer norms' row statistics, columns on both sides
                recv += stats * again
            if i == 1 and both:  # a total reduced above reaches side 1; side 2 gets it from there
                if above[u][0] and cu in ("out", "whole"):
                    # the total reduced above reaches side 1; at ZeRO-3 side 1 keeps that shard
                    # and side 2 gathers it before every forward and backward (section 6.1)
                    wrecv += tables * (2 * mb if zero >= 3 else 1)
                if above[u][1] and cu in ("in", "whole"):
                    recv += stats * again
            for size, consumers in tensors.values():
                vs = sorted(consumers)
                # a recomputed block sends what its nodes send each other forward again
                resend = (
                    dims[u]["rc"]
                    and blocks is not None
                    and blocks[u] is not None
                    and any(blocks[v] == blocks[u] for v in vs)
                )
                m = [port(boxes[v], "in") for v in vs]
                pq = [[port(kids[j][v], "in") for v in vs] for j in (0, 1)]
                k = len(vs)
                # forward: side 1 gets what it needs of the group's holding from side 2; side 2 also
                # what landed on side 1 from outside the group
                if i == 0:
                    fwd = area_where(
                        lambda x: any(x[:k]) and x[k] and not x[k + 1], *pq[0], g, h[0]
                    )
                else:
                    fwd = area_where(
                        lambda x: any(x[:k]) and not x[k] and (x[k + 1] or any(x[k + 2 :])),
                        *pq[1],
                        h[1],
                        g,
                        *pq[0],
                    )
                if leaf_pair:  # one device pre-sums every consumer's gradient: one value per point
                    if i == 0:
                        bwd = area_where(
                            lambda x: x[0] and any(x[1 + j] and not x[1 + k + j] for j in range(k)),
                            h[0],
                            *m,
                            *pq[0],
                        )
                    else:
                        bwd = area_where(
                            lambda x: (
                                x[0]
                                and any(not x[2 + k + j] and (x[2 + j] or x[1]) for j in range(k))
                            ),
                            h[1],
                            h[0],
                            *m,
                            *pq[1],
                        )
                else:  # groups send each consumer's gradient apart
                    bwd = 0.0
                    for j in range(k):
                        if i == 0:
                            bwd += area_where(
                                lambda x: x[0] and x[1] and not x[2], h[0], m[j], pq[0][j]
                            )
                        else:
                            bwd += area_where(
                                lambda x: x[0] and not x[1] and (x[2] or x[3]),
                                h[1],
                                pq[1][j],
                                m[j],
                                h[0],
                            )
                recv += size * ((2 if resend else 1) * fwd + bwd)
            # section 4: a side receives at its direction's bandwidth through every port of the
            # link (a switched fabric gives each device of the smaller half its own)
            one_port = (
                link.bytes_per_s
                if i == 0 or link.right_bytes_per_s is None
                else link.right_bytes_per_s
            )
            bw = link.ports * one_port
            if overlap:  # section 4.2: the weight exchange is its own message, beside the work
                w_lat = link.latency_s * ((1 if zero < 2 else mb) if wrecv > 1e-9 else 0)
                r_lat = link.latency_s * (mb if recv > 1e-9 else 0)
                wsec = w_lat + wrecv * bpe / bw
                per_side.append((r_lat + recv * bpe / bw + wsec, recv + wrecv, wsec))
                continue
            if mb == 1:
                lat = link.latency_s if recv + wrecv > 1e-9 else 0.0
            else:  # a latency per micro-batch; the per-step exchange rides on the last (ZeRO-2/3: its own)
                lat = link.latency_s * max(
                    mb if recv > 1e-9 else 0, (1 if zero < 2 else mb) if wrecv > 1e-9 else 0
                )
            recv += wrecv
            per_side.append((lat + recv * bpe / bw, recv, 0.0))
        out.append(per_side)
    return out


def side_time(work: float, comm) -> float:
    """Section 4.2: a side's time for a node: its work, then all it receives, less the part of
    its weight exchange that ran during the work's backward (2 of its 3 parts; without overlap
    the weight part is 0)."""
    seconds, _, weight = comm
    return work + seconds - min(weight, 2.0 / 3.0 * work)


def _checkpointing(problem, pg):
    """(per block, each node's block or None): per-block checkpointing, or every layer's input
    kept (section 6.3; a model without blocks is checkpointed per layer): then no block."""
    blocks = ref_blocks(pg)
    per_block = (
        problem.recompute and problem.checkpoint == "block" and any(b is not None for b in blocks)
    )
    return per_block, blocks if per_block else [None] * len(pg.nodes)


def _root_dims(problem, pg, per_block: bool, blocks) -> list:
    """Every node's raw sizes at the root; per block, only the blocks' nodes run forward again
    (the rest keep all they store)."""
    return [
        raw(
            node,
            problem.batch,
            problem.recompute and (not per_block or b is not None),
            problem.micro_batches,
            ck,
        )
        for node, b, ck in zip(pg.nodes, blocks, ref_checkpoints(pg, blocks))
    ]


def reference_evaluate(problem, plan):
    """(step time, per-device memory) of ``plan`` by the rules of docs/costmodel.md."""
    pg = problem.planning
    bpe, opt = problem.bytes_per_element, problem.optimizer_bytes_per_param
    memory = {}

    per_block, blocks = _checkpointing(problem, pg)
    roots = _root_dims(problem, pg, per_block, blocks)
    units = ref_units(pg)

    def rec(group, path, dims, boxes, above):
        if group.is_leaf:
            dev = group.device
            memory[path] = sum(
                memory_b(d, bpe, opt, problem.zero_stage, b["rows"][1] - b["rows"][0] if b else 0.0)
                for d, b in zip(dims, boxes)
            )
            if problem.recompute:  # the largest block, recomputed, holds its activations again
                held: dict = {}
                for d, b in zip(dims, blocks):
                    if b is not None:
                        held[b] = held.get(b, 0.0) + all_stored_b(d, bpe)
                memory[path] += max(held.values(), default=0.0)
            if problem.zero_stage == 3:  # ZeRO-3 gathers a unit's weights while it runs (6.1)
                gathered: dict = {}
                for unit, d, b in zip(units, dims, boxes):
                    rows = b["rows"][1] - b["rows"][0] if b else 0.0
                    gathered[unit] = gathered.get(unit, 0.0) + sizes(d)[1] * bpe * (1.0 - rows)
                memory[path] += max(gathered.values(), default=0.0)
            return [compute_s(d, dev, bpe) for d in dims]
        split = plan.splits[path]
        pair = group.left.is_leaf and group.right.is_leaf
        comm = split_comm(
            pg,
            dims,
            roots,
            boxes,
            split,
            group.link,
            bpe,
            pair,
            above,
            problem.zero_stage,
            problem.micro_batches,
            problem.overlap,
            blocks,
        )
        below = []
        for (r, c), ch, a in zip(above, split.choices, split.shares):
            both = 0 < a < 1
            below.append(
                (
                    r or (both and ch.value in ("batch", "rows")),
                    c or (both and PORTS[ch.value][1] == "cols"),
                )
            )
        left = [scaled(d, c.value, a) for d, c, a in zip(dims, split.choices, split.shares)]
        right = [scaled(d, c.value, 1 - a) for d, c, a in zip(dims, split.choices, split.shares)]
        lb = [child_box(b, c.value, a, 0) for b, c, a in zip(boxes, split.choices, split.shares)]
        rb = [child_box(b, c.value, a, 1) for b, c, a in zip(boxes, split.choices, split.shares)]
        tl, tr = (
            rec(group.left, path + "L", left, lb, below),
            rec(group.right, path + "R", right, rb, below),
        )
        return [
            max(side_time(tl[v], comm[v][0]), side_time(tr[v], comm[v][1]))
            for v in range(len(dims))
        ]

    times = rec(
        problem.array,
        "",
        roots,
        [dict(ROOT_BOX) for _ in pg.nodes],
        [(False, False)] * len(pg.nodes),
    )
    return sum(times), memory


def reference_split_time(problem, split):
    """Step time of a one-split plan with each side priced as one device (the planner's view)."""
    pg = problem.planning
    bpe = problem.bytes_per_element
    per_block, blocks = _checkpointing(problem, pg)
    dims = _root_dims(problem, pg, per_block, blocks)
    a = problem.array
    comm = split_comm(
        pg,
        dims,
        dims,
        [dict(ROOT_BOX) for _ in pg.nodes],
        split,
        a.link,
        bpe,
        a.left.is_leaf and a.right.is_leaf,
        zero=problem.zero_stage,
        mb=problem.micro_batches,
        overlap=problem.overlap,
        blocks=blocks,
    )
    devs = (group_device(problem.array.left), group_device(problem.array.right))
    total = 0.0
    for v, (d, c, a) in enumerate(zip(dims, split.choices, split.shares)):
        sides = (scaled(d, c.value, a), scaled(d, c.value, 1 - a))
        total += max(side_time(compute_s(sides[i], devs[i], bpe), comm[v][i]) for i in (0, 1))
    return total
