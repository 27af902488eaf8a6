"""The numerics of the reference executor (docs/executor.md): one device's part of a training
step, driven by a :class:`~parplan.executor.schedule.Schedule`, and the single-process
reference it must equal. float64 throughout; torch is imported here only.

Every buffer is a full-size ``(rows, cols, cell)`` tensor of which a device fills the part its
boxes and messages give it; regions are the schedule's boolean masks. Weights are drawn from
``seed`` (the same on every device); the loss is ``0.5 * sum((y - target)^2)`` over the
network's output, a sum of per-point terms, so every device computes the loss and its
gradient on the part of the output it holds (docs/costmodel.md section 3: the last node's
output feeds the loss locally). Biases are left out (the cost model does not price them);
batch norm runs with fixed statistics (a fixed per-channel scale), as the cost model prices it
(element-wise).
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as tf

from parplan.costmodel.graph import (
    INPUT,
    Add,
    Attention,
    Bias,
    Concat,
    Conv2d,
    Embedding,
    Flatten,
    Glu,
    Linear,
    Mul,
    Norm,
    Pool2d,
    Scale,
    Tokens,
)
from parplan.executor.schedule import (
    Schedule,
    graph_frames,
    held_mask,
    need_mask,
    readers_of,
    tensor_cols,
    weight_cell,
)

#: Epsilon of a layer norm.
LN_EPS = 1e-5

DTYPE = torch.float64


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def init_tensors(problem, seed: int):
    """Weights (torch layout, float64), the input batch and the loss target, from ``seed``."""
    g = torch.Generator().manual_seed(int(seed))
    info = problem.graph.analyze()
    weights = {}
    for name in info.order:
        layer = problem.graph.layer(name)
        x = info.in_shapes[name][0]
        if isinstance(layer, Conv2d):
            kh, kw = _pair(layer.kernel)
            fan = x.channels * kh * kw
            weights[name] = (
                torch.randn(layer.out_channels, x.channels, kh, kw, generator=g, dtype=DTYPE)
                / fan**0.5
            )
        elif isinstance(layer, Linear):
            fan = x.channels if layer.per_position else x.elements
            weights[name] = (
                torch.randn(layer.out_features, fan, generator=g, dtype=DTYPE) / fan**0.5
            )
        elif isinstance(layer, Embedding):
            weights[name] = torch.randn(layer.num, layer.dim, generator=g, dtype=DTYPE)
    s = problem.graph.input_shape
    tables = [
        problem.graph.layer(n).num
        for n in info.order
        if isinstance(problem.graph.layer(n), Embedding)
    ]
    if tables:  # token ids
        inp = torch.randint(
            0, min(tables), (problem.batch, s.channels, s.height, s.width), generator=g
        ).to(DTYPE)
    else:
        inp = torch.randn(problem.batch, s.channels, s.height, s.width, generator=g, dtype=DTYPE)
    out = info.out_shape[info.order[-1]]
    target = torch.randn(problem.batch, out.elements, generator=g, dtype=DTYPE)
    return weights, inp, target


def norm_scale(channels: int) -> torch.Tensor:
    """The fixed per-channel scale a batch norm applies (its statistics are not exchanged)."""
    return torch.linspace(0.5, 1.5, channels, dtype=DTYPE)


#: Cosine attention's logit scale in the executor: its learned value at initialisation (Swin V2's
#: ``exp(log 10)``), fixed as a norm's affine parameters are.
COSINE_SCALE = 10.0


def attention(
    x: torch.Tensor,
    head: int,
    rep: int = 1,
    rotary: bool = False,
    qk_norm: bool = False,
    cosine: bool = False,
) -> torch.Tensor:
    """Attention cores of whole key/value groups: ``x`` (rows, groups * (rep + 2) * head,
    positions), each group's columns its ``rep`` query heads, then its k and v (group-major)
    -> (rows, groups * rep * head, positions). ``rep`` > 1 is grouped-query attention;
    ``qk_norm`` RMS-normalises each head of q and k (without its scales, as a norm's affine
    parameters are not trained here); ``rotary`` then rotates q and k by position (RoPE,
    rotate-half form); ``cosine`` L2-normalises each head of q and k and scales the scores by
    :data:`COSINE_SCALE` instead of ``1 / sqrt(head)`` (Swin V2)."""
    n, c, seq = x.shape
    h = x.reshape(n, c // ((rep + 2) * head), rep + 2, head, seq)
    q, k, v = h[:, :, :rep], h[:, :, rep], h[:, :, rep + 1]
    if qk_norm:  # statistics over each head's features (dim -2)
        q = q / torch.sqrt((q * q).mean(dim=-2, keepdim=True) + LN_EPS)
        k = k / torch.sqrt((k * k).mean(dim=-2, keepdim=True) + LN_EPS)
    if rotary:
        q, k = rope(q, seq), rope(k, seq)
    if cosine:  # over each head's features (dim -2), as F.normalize (eps 1e-12)
        q = q / torch.linalg.vector_norm(q, dim=-2, keepdim=True).clamp_min(1e-12)
        k = k / torch.linalg.vector_norm(k, dim=-2, keepdim=True).clamp_min(1e-12)
        scores = torch.einsum("ngrds,ngdt->ngrst", q, k) * COSINE_SCALE
    else:
        scores = torch.einsum("ngrds,ngdt->ngrst", q, k) / head**0.5
    a = torch.softmax(scores, dim=-1)
    return torch.einsum("ngrst,ngdt->ngrds", a, v).reshape(n, -1, seq)


def rope(x: torch.Tensor, seq: int) -> torch.Tensor:
    """Rotary position embedding over the head dim (dim -2) of ``x`` (..., head, positions)."""
    d = x.shape[-2]
    half = d // 2
    freq = 10000.0 ** (-torch.arange(half, dtype=DTYPE, device=x.device) / half)
    angle = freq[:, None] * torch.arange(seq, dtype=DTYPE, device=x.device)[None, :]
    cos, sin = torch.cat([angle.cos()] * 2), torch.cat([angle.sin()] * 2)
    rotated = torch.cat([-x[..., half:, :], x[..., :half, :]], dim=-2)
    return x * cos + rotated * sin


def fixed_bias(channels: int, cell: int, full: bool) -> torch.Tensor:
    """The fixed bias a ``Bias`` layer adds (per channel, or per channel and position): its
    parameters are not trained here, as a norm's affine ones are not."""
    b = torch.linspace(-0.5, 0.5, channels * (cell if full else 1), dtype=DTYPE)
    return b.reshape(channels, cell if full else 1)


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    """RMS normalisation over the columns of (rows, columns, positions), without its scale."""
    return x / torch.sqrt((x * x).mean(dim=1, keepdim=True) + LN_EPS)


def layer_norm(x: torch.Tensor) -> torch.Tensor:
    """Normalisation over the columns of (rows, columns, positions), without affine parameters
    (the cost model does not price them)."""
    mean = x.mean(dim=1, keepdim=True)
    var = (x * x).mean(dim=1, keepdim=True) - mean * mean
    return (x - mean) / torch.sqrt(var + LN_EPS)


def apply_op(layer, info, x: torch.Tensor, cols) -> torch.Tensor:
    """An element-wise layer on ``x`` of shape (rows, len(cols), cell) -> (rows, len(cols), cell')."""
    n, c = x.shape[0], x.shape[1]
    if isinstance(layer, Attention):
        return attention(
            x,
            info.out_shape[layer.name].channels // layer.heads,
            layer.heads // layer.key_heads,
            layer.rotary,
            layer.qk_norm,
            layer.cosine,
        )
    if isinstance(layer, Pool2d):
        s = info.in_shapes[layer.name][0]
        x4 = x.reshape(n, c, s.height, s.width)
        if layer.output_size is not None:
            fn = tf.adaptive_max_pool2d if layer.mode == "max" else tf.adaptive_avg_pool2d
            y = fn(x4, _pair(layer.output_size))
        else:
            k = _pair(layer.kernel)
            st = _pair(layer.stride) if layer.stride is not None else k
            pad = _pair(layer.padding)
            if layer.mode == "max":
                y = tf.max_pool2d(x4, k, st, pad, ceil_mode=layer.ceil_mode)
            else:
                y = tf.avg_pool2d(x4, k, st, pad, ceil_mode=layer.ceil_mode)
        return y.reshape(n, c, -1)
    if isinstance(layer, (Norm, Scale)):
        total = info.out_shape[layer.name].channels
        return x * norm_scale(total)[torch.as_tensor(cols)].to(x.device).view(1, c, 1)
    if isinstance(layer, Bias):
        out = info.out_shape[layer.name]
        return (
            x
            + fixed_bias(out.channels, out.spatial, layer.full)[torch.as_tensor(cols)].to(x.device)[
                None
            ]
        )
    if isinstance(
        layer, Tokens
    ):  # fixed tokens (like a norm's affine values, not trained) before the positions
        total = info.out_shape[layer.name].channels
        token = fixed_bias(total, layer.count, True)[torch.as_tensor(cols)].to(x.device)
        return torch.cat([token[None].expand(n, -1, -1), x], dim=2)
    if isinstance(layer, Glu):
        half = c // 2  # the columns are the gate's then the up projection's, pairwise
        return ACTIVATIONS[layer.function.lower()](x[:, :half]) * x[:, half:]
    if isinstance(layer, Flatten):
        return x
    fn = layer.function.lower()
    if fn in ACTIVATIONS:
        return ACTIVATIONS[fn](x)
    return x  # identity, dropout and stochastic depth: the identity in a deterministic step


#: Activation functions by name (the rest of FUNCTIONS are identities in a deterministic step).
ACTIVATIONS = {
    "relu": torch.relu,
    "relu6": lambda x: tf.hardtanh(x, 0.0, 6.0),
    "gelu": tf.gelu,
    "silu": tf.silu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
}


def reference_step(problem, weights, inp, target):
    """Loss and every weight gradient of one step on one process (no partitioning)."""
    info = problem.graph.analyze()
    w = {k: v.clone().requires_grad_() for k, v in weights.items()}
    f = {INPUT: inp.reshape(problem.batch, inp.shape[1], -1)}
    for name in info.order:
        layer = problem.graph.layer(name)
        xs = [f[s] for s in layer.inputs]
        if isinstance(layer, Conv2d):
            s = info.in_shapes[name][0]
            y = tf.conv2d(
                xs[0].reshape(problem.batch, s.channels, s.height, s.width),
                w[name],
                stride=_pair(layer.stride),
                padding=_pair(layer.padding),
            )
            f[name] = y.reshape(problem.batch, y.shape[1], -1)
        elif isinstance(layer, Linear) and layer.per_position:
            f[name] = torch.einsum("bis,oi->bos", xs[0], w[name])
        elif isinstance(layer, Linear):
            y = xs[0].reshape(problem.batch, -1) @ w[name].T
            f[name] = y.reshape(problem.batch, -1, 1)
        elif isinstance(layer, Embedding):
            ids = xs[0].reshape(problem.batch, -1).long() % layer.num
            f[name] = w[name][ids].permute(0, 2, 1)
        elif isinstance(layer, Norm) and layer.kind == "layer":
            f[name] = layer_norm(xs[0])
        elif isinstance(layer, Norm) and layer.kind == "rms":
            f[name] = rms_norm(xs[0])
        elif isinstance(layer, Add):
            f[name] = sum(xs[1:], xs[0])
        elif isinstance(layer, Mul):
            f[name] = xs[0] * xs[1]
        elif isinstance(layer, Concat):
            f[name] = torch.cat(xs, dim=1)
        else:
            f[name] = apply_op(layer, info, xs[0], np.arange(xs[0].shape[1]))
    y = f[info.order[-1]].reshape(problem.batch, -1)
    loss = 0.5 * ((y - target) ** 2).sum()
    loss.backward()
    return float(loss.detach()), {k: v.grad.detach() for k, v in w.items()}


def weight_grid(layer, w: torch.Tensor, in_cell: int) -> torch.Tensor:
    """A weight (or its gradient) as the (in columns, out columns, cell) grid of the schedule;
    an embedding table as (entries, columns, 1)."""
    if isinstance(layer, Conv2d):
        return w.permute(1, 0, 2, 3).reshape(w.shape[1], w.shape[0], -1)
    if isinstance(layer, Embedding):
        return w.reshape(w.shape[0], w.shape[1], 1)
    if layer.per_position:
        return w.permute(1, 0).reshape(w.shape[1], w.shape[0], 1)
    return w.reshape(w.shape[0], -1, in_cell).permute(1, 0, 2)


def grid_weight(layer, grid: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`weight_grid`: a weight shaped like ``like`` from its grid."""
    if isinstance(layer, Conv2d):
        return grid.reshape(like.shape[1], like.shape[0], *like.shape[2:]).permute(1, 0, 2, 3)
    if layer.per_position:
        return grid[:, :, 0].permute(1, 0)
    return grid.permute(1, 0, 2).reshape(like.shape)


class DeviceStep:
    """One device's training step: buffers, local products, message handling."""

    def __init__(self, schedule: Schedule, rank: int, weights, inp, target, comm, device="cpu"):
        self.dev = torch.device(device)
        self.s = schedule
        self.p = schedule.problem
        self.info = self.p.graph.analyze()
        self.rank = rank
        self.leaf = schedule.leaves[rank]
        self.boxes = schedule.boxes[self.leaf]
        self.weights = weights
        self.target = target
        self.comm = comm
        self.origin = schedule.origin
        self.F: dict[str, torch.Tensor] = {}
        self.E: dict[str, torch.Tensor] = {}
        self.bufs: dict[str, torch.Tensor] = {}
        self.saved: dict[str, tuple] = {}
        self.avail: dict[
            tuple[str, str], torch.Tensor
        ] = {}  # (tensor, consumer) -> its gradient here
        self.arrived: dict[str, torch.Tensor] = {}  # tensor -> pre-summed gradients received
        self.received: dict[tuple, int] = {}
        self.seconds: dict[str, float] = {}
        self.readers = readers_of(self.p, schedule.frames)
        self.F[INPUT] = inp.reshape(self.p.batch, inp.shape[1], -1)
        self.gathered: dict[str, torch.Tensor] = {}  # ZeRO-3: each node's weights as gathered here
        self.gathered_tables: dict[str, torch.Tensor] = {}  # ZeRO-3: the tables, likewise

    # ---------------------------------------------------------------- buffers
    def _zeros(self, rows, cols, cell):
        return torch.zeros(rows, cols, cell, dtype=DTYPE, device=self.dev)

    def _clock(self) -> float:
        """CPU time of this process on CPU; wall time after the GPU's queue drains on a GPU."""
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
            return time.perf_counter()
        return time.process_time()

    def _t(self, array) -> torch.Tensor:
        """A numpy index array or mask as a tensor on this device's torch device."""
        return torch.as_tensor(array, device=self.dev)

    def _tensor(self, store, name):
        if name not in store:
            fr = self.s.frames[name]
            store[name] = self._zeros(self.p.batch, fr.cols, fr.cell)
        return store[name]

    def _buffer(self, kind: str, tensor: str) -> torch.Tensor:
        if kind == "fwd":
            return self._tensor(self.F, tensor)
        if kind == "bwd":
            return self._tensor(self.E, tensor)
        return self.bufs[tensor]

    def _contribution(self, reader: str, tensor: str) -> torch.Tensor:
        """The gradient of ``tensor`` that planning node ``reader`` holds (its input gradient)."""
        layer = self.p.graph.layer(reader)
        if isinstance(layer, (Conv2d, Linear)):
            return self.bufs[f"{reader}/ein"]
        e = self._tensor(self.E, reader)
        if isinstance(layer, Mul):
            # d(a * b)/da = b: the gradient times the other input where this device has the
            # join's gradient (zero elsewhere); a per-channel gate sums over the positions
            (other,) = [s for s in layer.inputs if s != tensor]
            g = e * self._tensor(self.F, other)
            return g.sum(dim=2, keepdim=True) if self.s.frames[tensor].cell < g.shape[2] else g
        if isinstance(layer, Concat):
            off = 0
            for src in layer.inputs:
                if src == tensor:
                    break
                off += self.s.frames[src].cols
            return e[:, off : off + self.s.frames[tensor].cols]
        return e

    def exchange(self, messages) -> None:
        """Send and receive in the schedule's global order (every device walks the same list,
        so each blocking pair meets)."""
        for m in messages:
            if m.src == self.rank:
                buf = self._buffer(m.kind, m.tensor)
                if m.kind == "bwd":
                    payload = torch.zeros(int(m.mask.sum()), m.cell, dtype=DTYPE, device=self.dev)
                    for reader, part in m.parts:
                        sel = self._t(part[m.mask])
                        payload[sel] += self.avail[(m.tensor, reader)][self._t(part)]
                else:
                    payload = buf[self._t(m.mask)]
                self.comm.send(payload.contiguous(), m.dst)
            elif m.dst == self.rank:
                payload = torch.empty(int(m.mask.sum()), m.cell, dtype=DTYPE, device=self.dev)
                self.comm.recv(payload, m.src)
                key = (m.split, m.node, m.side, m.phase)
                self.received[key] = self.received.get(key, 0) + payload.numel()
                mask = self._t(m.mask)
                if m.kind == "bwd":
                    # one consumer's gradient: kept apart (this device may forward it); several
                    # pre-summed by a single device: only added
                    if len(m.parts) == 1:
                        self.avail[(m.tensor, m.parts[0][0])][mask] += payload
                    else:
                        self._tensor(self.arrived, m.tensor)[mask] += payload
                    continue
                buf = self._buffer(m.kind, m.tensor)
                if m.kind == "rs":
                    buf[mask] += payload
                else:
                    buf[mask] = payload

    # ---------------------------------------------------------------- forward
    def _gather_tables(self, node: str) -> dict[str, torch.Tensor]:
        """ZeRO-3 on the embedding tables ``node`` reads (docs/costmodel.md section 6.1): this
        device starts from its shard (every other entry zero) and receives the rest of what it
        needs from the shards' owners; the tables as gathered here."""
        out = {}
        for src, _ in self._embeddings(node):
            table = self.weights[src].clone()
            table[~self._t(self.s.owners[f"{src}/table"][self.rank])] = 0.0
            self.bufs[f"{src}/tw"] = table[:, :, None]
            out[src] = table
        if out:
            self.exchange(self.s.table_gathers.get(node, ()))
        return out

    def forward(self) -> None:
        graph = self.p.graph
        tables = {}
        if self.p.zero_stage >= 3:  # the tables' shards gathered before the lookups
            for node in self.p.planning.nodes:
                tables.update(self._gather_tables(node.name))
            self.gathered_tables = tables
        for name in self.info.order:  # layers before the first planning node: data loading
            if self.origin[name] == INPUT:
                layer = graph.layer(name)
                x = self.F[layer.inputs[0]]
                if isinstance(layer, Embedding):
                    ids = x.reshape(self.p.batch, -1).long() % layer.num
                    table = tables.get(name, self.weights[name])
                    self.F[name] = table[ids].permute(0, 2, 1)
                elif isinstance(layer, Norm) and layer.kind == "layer":
                    self.F[name] = layer_norm(x)
                elif isinstance(layer, Norm) and layer.kind == "rms":
                    self.F[name] = rms_norm(x)
                else:
                    self.F[name] = apply_op(layer, self.info, x, np.arange(x.shape[1]))
        for node in self.p.planning.nodes:
            t0 = self._clock()
            box = self.boxes[node.name]
            layer = graph.layer(node.name)
            if not node.is_join:
                if self.p.zero_stage >= 3:
                    self._gather(node.name, layer)
                self._product(node.name, layer, box)
            t1 = self._clock()
            if not node.is_join:
                self.exchange(self.s.forward[node.name])
                self.F[node.name] = self.bufs[f"{node.name}/out"]
            t2 = self._clock()
            if node.is_join:
                self._join(node.name, layer, box)
            self._ops(node.name, box)
            t3 = self._clock()
            self.seconds[node.name] = self.seconds.get(node.name, 0.0) + (t1 - t0) + (t3 - t2)
            self.exchange(self.s.transitions_fwd[node.name])

    def use(self, schedule: Schedule) -> None:
        """Run the rows of ``schedule`` (one micro-batch of the step, or the whole step) next."""
        self.s = schedule
        self.boxes = schedule.boxes[self.leaf]

    def _owned(self, name: str) -> torch.Tensor:
        """ZeRO-3: the (in, out) grid points of ``name``'s weights whose shard this device keeps."""
        return self._t(self.s.owners[f"{name}/w"] == self.rank)

    def _gather(self, name: str, layer) -> None:
        """ZeRO-3 (docs/costmodel.md section 6.1): this device starts from its shard alone (every
        other point zero) and receives the rest of what it needs from the shards' owners."""
        fin = self.s.frames[layer.inputs[0]]
        grid = weight_grid(layer, self.weights[name], fin.cell).clone()
        grid[~self._owned(name)] = 0.0
        self.bufs[f"{name}/w"] = grid
        self.exchange(self.s.gathers[name])
        self.gathered[name] = grid_weight(layer, grid, self.weights[name])

    def _product(self, name, layer, box) -> None:
        fin = self.s.frames[layer.inputs[0]]
        fout = self.s.frames[name]
        self.bufs[f"{name}/out"] = self._zeros(self.p.batch, fout.cols, fout.cell)
        wcell = weight_cell(layer, fin)
        self.bufs[f"{name}/ein"] = self._zeros(self.p.batch, fin.cols, fin.cell)
        if f"{name}/dw" not in self.bufs:  # accumulated over the step's micro-batches
            self.bufs[f"{name}/dw"] = self._zeros(fin.cols, fout.cols, wcell)
        if box.empty:
            return
        ins, outs = self._t(box.ins), self._t(box.outs)
        n = box.r1 - box.r0
        x = self._tensor(self.F, layer.inputs[0])[box.r0 : box.r1][:, ins].clone().requires_grad_()
        wfull = self.gathered[name] if self.p.zero_stage >= 3 else self.weights[name]
        if isinstance(layer, Conv2d):
            s = self.info.in_shapes[name][0]
            w = wfull[outs][:, ins].clone().requires_grad_()
            y = tf.conv2d(
                x.reshape(n, len(ins), s.height, s.width),
                w,
                stride=_pair(layer.stride),
                padding=_pair(layer.padding),
            ).reshape(n, len(outs), -1)
        elif layer.per_position:
            w = wfull[outs][:, ins].clone().requires_grad_()
            y = torch.einsum("ris,oi->ros", x, w)
        else:
            w = (
                wfull.reshape(wfull.shape[0], fin.cols, fin.cell)[outs][:, ins]
                .clone()
                .requires_grad_()
            )
            y = (x.reshape(n, -1) @ w.reshape(len(outs), -1).T).reshape(n, len(outs), 1)
        self.saved[name] = (x, w, y)
        self.bufs[f"{name}/out"][box.r0 : box.r1, outs] = y.detach()

    def _join(self, name, layer, box) -> None:
        out = self._tensor(self.F, name)
        if box.empty:
            return
        cols = self._t(box.outs)
        if isinstance(layer, Add):
            total = sum(self._tensor(self.F, s)[box.r0 : box.r1][:, cols] for s in layer.inputs)
            out[box.r0 : box.r1, cols] = total
            return
        if isinstance(layer, Mul):  # a per-channel gate (one position) broadcasts over positions
            a, b = (self._tensor(self.F, s)[box.r0 : box.r1][:, cols] for s in layer.inputs)
            out[box.r0 : box.r1, cols] = a * b
            return
        off = 0
        for src in layer.inputs:
            c = self.s.frames[src].cols
            mine = box.outs[(box.outs >= off) & (box.outs < off + c)]
            if len(mine):
                out[box.r0 : box.r1, self._t(mine)] = self._tensor(self.F, src)[box.r0 : box.r1][
                    :, self._t(mine - off)
                ]
            off += c

    def _cols(self, tensor: str, box) -> np.ndarray:
        return tensor_cols(self.p, self.s.frames, tensor, box.outs)

    def _ops(self, node: str, box) -> None:
        for name in self.s.chain(node):
            layer = self.p.graph.layer(name)
            out = self._tensor(self.F, name)
            if isinstance(layer, Norm) and layer.kind == "layer":
                self._layer_norm(name, layer, box, out)
                continue
            if isinstance(layer, Norm) and layer.kind == "rms":
                self._rms_norm(name, layer, box, out)
                continue
            if box.empty:
                continue
            cin, cout = self._cols(layer.inputs[0], box), self._cols(name, box)
            x = (
                self._tensor(self.F, layer.inputs[0])[box.r0 : box.r1][:, self._t(cin)]
                .clone()
                .requires_grad_()
            )
            y = apply_op(layer, self.info, x, cin)
            self.saved[name] = (x, y)
            out[box.r0 : box.r1, self._t(cout)] = y.detach()

    def _row_sums(self, name: str, phase: str, box, *parts) -> tuple:
        """Sums over every column of (rows, columns, positions) tensors ``parts`` held in parts:
        this device's partial sums, reduced with the devices holding the other columns (one
        statistic per part: 2 for a layer norm, 1 for an RMS norm; None each on an empty box)."""
        cell = self.s.frames[name].cell
        buf = self.bufs[f"{name}/{phase}"] = self._zeros(self.p.batch, 1, len(parts) * cell)
        if not box.empty:
            buf[box.r0 : box.r1, 0] = torch.cat([x.sum(dim=1) for x in parts], dim=1)
        self.exchange((self.s.ops_fwd if phase == "stats" else self.s.ops_bwd)[name])
        if box.empty:
            return (None,) * len(parts)
        total = buf[box.r0 : box.r1, 0]
        return tuple(total[:, None, i * cell : (i + 1) * cell] for i in range(len(parts)))

    def _rms_norm(self, name, layer, box, out) -> None:
        cols = None if box.empty else self._t(self._cols(name, box))
        x = None if box.empty else self._tensor(self.F, layer.inputs[0])[box.r0 : box.r1][:, cols]
        (s2,) = self._row_sums(name, "stats", box, x * x if x is not None else None)
        if box.empty:
            return
        rstd = 1.0 / torch.sqrt(s2 / self.s.frames[name].cols + LN_EPS)
        xhat = x * rstd
        self.saved[name] = ("rms", xhat, rstd)
        out[box.r0 : box.r1, cols] = xhat

    def _rms_norm_backward(self, name, layer, box) -> None:
        g = xhat = None
        if not box.empty:
            cols = self._t(self._cols(name, box))
            _, xhat, rstd = self.saved[name]
            g = self._tensor(self.E, name)[box.r0 : box.r1][:, cols]
        (b,) = self._row_sums(name, "bstats", box, g * xhat if g is not None else None)
        if box.empty:
            return
        gx = rstd * (g - xhat * b / self.s.frames[name].cols)
        self._tensor(self.E, layer.inputs[0])[box.r0 : box.r1, cols] += gx

    def _layer_norm(self, name, layer, box, out) -> None:
        cols = None if box.empty else self._t(self._cols(name, box))
        x = None if box.empty else self._tensor(self.F, layer.inputs[0])[box.r0 : box.r1][:, cols]
        s1, s2 = self._row_sums(name, "stats", box, x, x * x if x is not None else None)
        if box.empty:
            return
        c = self.s.frames[name].cols
        mean = s1 / c
        rstd = 1.0 / torch.sqrt(s2 / c - mean * mean + LN_EPS)
        xhat = (x - mean) * rstd
        self.saved[name] = ("ln", xhat, rstd)
        out[box.r0 : box.r1, cols] = xhat

    def _layer_norm_backward(self, name, layer, box) -> None:
        g = xhat = None
        if not box.empty:
            cols = self._t(self._cols(name, box))
            _, xhat, rstd = self.saved[name]
            g = self._tensor(self.E, name)[box.r0 : box.r1][:, cols]
        a, b = self._row_sums(name, "bstats", box, g, g * xhat if g is not None else None)
        if box.empty:
            return
        c = self.s.frames[name].cols
        gx = rstd * (g - a / c - xhat * b / c)
        self._tensor(self.E, layer.inputs[0])[box.r0 : box.r1, cols] += gx

    # ---------------------------------------------------------------- loss and backward
    def loss(self) -> float:
        last = self.info.order[-1]
        producer = self.origin[last]
        box = self.boxes[producer]
        e = self._tensor(self.E, last)
        if box.empty:
            return 0.0
        mine = self._cols(last, box)
        cols = self._t(mine)
        y = self.F[last][box.r0 : box.r1][:, cols]
        fr = self.s.frames[last]
        t = self.target.reshape(self.p.batch, fr.cols, fr.cell)[box.r0 : box.r1][:, cols]
        e[box.r0 : box.r1, cols] = y - t
        own = self._t(self.s.owners["loss"][box.r0 : box.r1][:, mine] == self.rank)
        return float(0.5 * ((y - t) ** 2)[own].sum())

    def _recompute(self, node) -> None:
        """Activation recomputation (docs/costmodel.md section 6.3): the node's forward again
        from its input, with the forward's exchanges inside the node: an IN split's partial-sum
        reduction and the norms' forward statistics; inside a checkpointed block the re-layouts
        of its output to the block's nodes are sent again (by the caller, after this). The
        products and ops saved for backward are the recomputed ones;
        the executor keeps its activation buffers (it checks numerics and bytes, not memory), so
        the output points a device received from others stay where backward reads them."""
        box = self.boxes[node.name]
        layer = self.p.graph.layer(node.name)
        if node.is_join:
            self._join(node.name, layer, box)
        else:
            self._product(node.name, layer, box)
            self.exchange(self.s.forward[node.name])
        self._ops(node.name, box)

    def backward(self) -> None:
        graph = self.p.graph
        recomputed = self.p.recomputed_nodes
        for v, node in reversed(list(enumerate(self.p.planning.nodes))):
            box = self.boxes[node.name]
            if self.p.zero_stage >= 3:  # the tables were freed after forward: gathered again
                for src, again in self._gather_tables(node.name).items():
                    cols = self._t(self._table_cols(node.name, src))
                    if not torch.equal(again[:, cols], self.gathered_tables[src][:, cols]):
                        raise RuntimeError(
                            f"{src}: the backward gather brought another table than forward's"
                        )
            if self.p.zero_stage >= 3 and not node.is_join:
                forward = self.gathered[node.name]
                self._gather(
                    node.name, graph.layer(node.name)
                )  # the weights were freed after forward
                if not box.empty and not torch.equal(
                    self._region(node.name, box, forward),
                    self._region(node.name, box, self.gathered[node.name]),
                ):
                    raise RuntimeError(
                        f"{node.name}: the backward gather brought other weights than forward's"
                    )
            if recomputed[v]:  # section 6.3: every node per layer, a block's nodes per block
                self._recompute(node)
                self.exchange(self.s.resent(node.name))  # its block's re-layouts (section 6.3)
            tensors = [t for t in (node.name, *self.s.chain(node.name)) if t in self.readers]
            for tensor in tensors:
                self._own_contributions(tensor)
            self.exchange(self.s.transitions_bwd[node.name])
            for tensor in tensors:
                self._sum_gradients(tensor, box)
            t0 = self._clock()
            for name in reversed(self.s.chain(node.name)):
                layer = graph.layer(name)
                if isinstance(layer, Norm) and layer.kind == "layer":
                    self._layer_norm_backward(name, layer, box)
                    continue
                if isinstance(layer, Norm) and layer.kind == "rms":
                    self._rms_norm_backward(name, layer, box)
                    continue
                if box.empty:
                    continue
                x, y = self.saved[name]
                g = self._tensor(self.E, name)[box.r0 : box.r1][:, self._t(self._cols(name, box))]
                (gx,) = torch.autograd.grad(y, x, g)
                cin = self._t(self._cols(layer.inputs[0], box))
                self._tensor(self.E, layer.inputs[0])[box.r0 : box.r1, cin] += gx
            if not node.is_join and not box.empty:
                layer = graph.layer(node.name)
                x, w, y = self.saved[node.name]
                g = self._tensor(self.E, node.name)[box.r0 : box.r1][:, self._t(box.outs)]
                gx, gw = torch.autograd.grad(y, (x, w), g)
                ins, outs = self._t(box.ins), self._t(box.outs)
                self.bufs[f"{node.name}/ein"][box.r0 : box.r1, ins] = gx
                if isinstance(layer, Conv2d):
                    grid = gw.permute(1, 0, 2, 3).reshape(len(ins), len(outs), -1)
                elif layer.per_position:
                    grid = gw.permute(1, 0)[:, :, None]
                else:
                    grid = gw.permute(1, 0, 2)
                self.bufs[f"{node.name}/dw"][ins[:, None], outs[None, :]] += grid
            self._table_gradients(node.name, box)
            self.seconds[node.name] = self.seconds.get(node.name, 0.0) + self._clock() - t0
            self.exchange(self.s.backward[node.name])
            window = self.s.window
            if window is not None and not window[2] and self.p.zero_stage >= 2:
                # ZeRO-2/3 reduce-scatter each micro-batch's gradient: what was sent is not kept
                if not node.is_join:
                    self.bufs[f"{node.name}/dw"][~self._owned(node.name)] = 0.0
                for m in self.s.backward[node.name]:
                    if m.kind == "rs" and m.src == self.rank and m.tensor.endswith("/table"):
                        self.bufs[m.tensor][self._t(m.mask)] = 0.0

    def _embeddings(self, node: str):
        graph = self.p.graph
        for src in graph.layer(node).inputs:
            if src != INPUT and isinstance(graph.layer(src), Embedding):
                yield src, graph.layer(src)

    def _table_cols(self, node: str, src: str) -> np.ndarray:
        """Columns of table ``src`` that ``node``'s part of the step reads on this device."""
        r = next(x for x in self.readers[src] if x.node == node)
        m = need_mask(self.boxes[node], r, self.p.batch, self.s.frames[src])
        return np.flatnonzero(m.any(axis=0))

    def _table_gradients(self, node: str, box) -> None:
        """This device's partial gradient of each embedding table ``node`` reads: its gradient
        of the lookup's output, on what it holds, added at the looked-up entries."""
        for src, layer in self._embeddings(node):
            fr = self.s.frames[src]
            if f"{src}/table" not in self.bufs:  # accumulated over the step's micro-batches
                self.bufs[f"{src}/table"] = self._zeros(layer.num, fr.cols, 1)
            buf = self.bufs[f"{src}/table"]
            r = next(x for x in self.readers[src] if x.node == node)
            m = need_mask(box, r, self.p.batch, fr)
            if not m.any():
                continue
            e = (
                self._contribution(node, src) * self._t(m)[:, :, None]
            )  # (batch, columns, positions)
            ids = self.F[INPUT].reshape(self.p.batch, -1).long() % layer.num  # (batch, positions)
            flat = e.permute(0, 2, 1).reshape(-1, fr.cols)
            buf[:, :, 0].index_add_(0, ids.reshape(-1), flat)

    def _own_contributions(self, tensor: str) -> None:
        """Each consumer's gradient of ``tensor`` where this device holds it."""
        fr = self.s.frames[tensor]
        for r in self.readers[tensor]:
            buf = self._zeros(self.p.batch, fr.cols, fr.cell)
            m = self._t(need_mask(self.boxes[r.node], r, self.p.batch, fr))
            buf[m] = self._contribution(r.node, tensor)[m]
            self.avail[(tensor, r.node)] = buf

    def _sum_gradients(self, tensor: str, box) -> None:
        """The gradient of ``tensor`` on what this device holds of it: every consumer's part,
        held or received, and the pre-summed parts received."""
        if box.empty:
            return
        hold = self._t(held_mask(self.p, self.s.frames, box, tensor))
        e = self._tensor(self.E, tensor)
        for r in self.readers[tensor]:
            e[hold] += self.avail[(tensor, r.node)][hold]
        if tensor in self.arrived:
            e[hold] += self.arrived[tensor][hold]

    def _region(self, name: str, box, w: torch.Tensor) -> torch.Tensor:
        """The part of a weight (or gathered weight) that ``box`` computes with, as a grid."""
        layer = self.p.graph.layer(name)
        grid = weight_grid(layer, w, self.s.frames[layer.inputs[0]].cell)
        return grid[self._t(box.ins)[:, None], self._t(box.outs)[None, :]]

    def weight_gradients(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per weighted node: (dW grid as numpy, mask of the grid points this device holds)."""
        out = {}
        for node in self.p.planning.nodes:
            if node.is_join:
                continue
            box = self.boxes[node.name]
            dw = self.bufs[f"{node.name}/dw"]
            mask = np.zeros(dw.shape[:2], dtype=bool)
            if self.p.zero_stage >= 3:  # the reduce-scatter leaves the total on this device's shard
                mask = self.s.owners[f"{node.name}/w"] == self.rank
            elif not box.empty:
                mask[np.ix_(box.ins, box.outs)] = True
            out[node.name] = (dw.cpu().numpy().copy(), mask)
        for node in self.p.planning.nodes:
            for src, layer in self._embeddings(node.name):
                fr = self.s.frames[src]
                if self.p.zero_stage >= 3:  # the reduce-scatter leaves the total on the shard
                    mask = self.s.owners[f"{src}/table"][self.rank]
                else:
                    mask = np.zeros((layer.num, fr.cols), dtype=bool)
                    mask[:, self._table_cols(node.name, src)] = True
                out[src] = (self.bufs[f"{src}/table"].cpu().numpy().copy(), mask)
        return out

    def apply_update(self, lr: float) -> None:
        """SGD on the weight region this device holds (its reduced dW there is the total)."""
        for node in self.p.planning.nodes:
            box = self.boxes[node.name]
            if node.is_join or box.empty and self.p.zero_stage < 3:
                continue
            layer = self.p.graph.layer(node.name)
            if (
                self.p.zero_stage >= 3
            ):  # only this device's shard: the next forward gathers the rest
                fin = self.s.frames[layer.inputs[0]]
                grid = weight_grid(layer, self.weights[node.name], fin.cell).clone()
                own = self._owned(node.name)
                grid[own] -= lr * self.bufs[f"{node.name}/dw"][own]
                self.weights[node.name].copy_(grid_weight(layer, grid, self.weights[node.name]))
                continue
            ins, outs = self._t(box.ins), self._t(box.outs)
            g = self.bufs[f"{node.name}/dw"][ins[:, None], outs[None, :]].permute(
                1, 0, 2
            )  # (out, in, cell)
            w = self.weights[node.name]
            if isinstance(layer, Conv2d):
                w[outs[:, None], ins[None, :]] -= lr * g.reshape(len(outs), len(ins), *w.shape[2:])
            elif layer.per_position:
                w[outs[:, None], ins[None, :]] -= lr * g[:, :, 0]
            else:
                fin = self.s.frames[layer.inputs[0]]
                w.view(w.shape[0], fin.cols, fin.cell)[outs[:, None], ins[None, :]] -= lr * g
        for node in self.p.planning.nodes:
            for src, _ in self._embeddings(node.name):
                if self.p.zero_stage >= 3:  # only this device's shard: the next forward gathers
                    own = self._t(self.s.owners[f"{src}/table"][self.rank])
                    self.weights[src][own] -= lr * self.bufs[f"{src}/table"][:, :, 0][own]
                    continue
                cols = self._t(self._table_cols(node.name, src))
                self.weights[src][:, cols] -= lr * self.bufs[f"{src}/table"][:, cols, 0]


def run_device(
    schedule: Schedule, rank: int, comm, seed: int, steps: int, lr: float, device: str = "cpu"
) -> dict:
    """All ``steps`` of one device (on torch ``device``); returns its losses, weight gradients of
    the last step, elements received per (split, node, side, phase) per step, and per-node
    seconds."""
    weights, inp, target = init_tensors(schedule.problem, seed)
    weights = {k: w.to(device) for k, w in weights.items()}
    inp, target = inp.to(device), target.to(device)
    losses, received, seconds = [], [], []
    step = None
    for k in range(steps):
        step = DeviceStep(schedule, rank, weights, inp, target, comm, device)
        loss = 0.0
        for part in schedule.micro_batches():  # docs/costmodel.md section 6.4: one after the other
            step.use(part)
            step.forward()
            loss += step.loss()
            step.backward()
        step.use(schedule)  # the weights' region of the whole step: its gradients and update
        losses.append(loss)
        received.append(dict(step.received))
        seconds.append(dict(step.seconds))
        if k + 1 < steps:
            step.apply_update(lr)
    return {
        "rank": rank,
        "losses": losses,
        "grads": step.weight_gradients(),
        "received": received,
        "seconds": seconds,
    }


class _StepBuffers(dict):
    """A micro-batch's buffers whose weight gradients and table gradients are the stage's, shared
    by the micro-batches in flight (a pipeline stage keeps several at once)."""

    def __init__(self, shared: dict):
        super().__init__()
        self.shared = shared

    @staticmethod
    def _step_level(key: str) -> bool:
        return key.endswith(("/dw", "/table"))

    def __getitem__(self, key):
        return self.shared[key] if self._step_level(key) else super().__getitem__(key)

    def __setitem__(self, key, value):
        if self._step_level(key):
            self.shared[key] = value
        else:
            super().__setitem__(key, value)

    def __contains__(self, key):
        return key in self.shared if self._step_level(key) else super().__contains__(key)


class _GroupComm:
    """A stage's messages: its schedule's local ranks sent as global ones."""

    def __init__(self, comm, ranks):
        self.comm, self.ranks = comm, ranks

    def send(self, tensor, dst: int) -> None:
        self.comm.send(tensor, self.ranks[dst])

    def recv(self, tensor, src: int) -> None:
        self.comm.recv(tensor, self.ranks[src])


class _PipelineDevice:
    """One device of a pipeline run (:mod:`parplan.executor.stages`): its stage's micro-batches
    in the plan's order, each a :class:`DeviceStep` of its own (activations of several are held
    at once), and the cut tensors' routes."""

    def __init__(self, ps, rank: int, comm, weights, inp, target, device: str):
        self.ps, self.rank, self.comm, self.device = ps, rank, comm, device
        self.s = ps.stage_of(rank)
        self.sched = ps.stages[self.s]
        self.local = ps.ranks[self.s].index(rank)
        self.group = _GroupComm(comm, ps.ranks[self.s])
        self.weights, self.target = weights, target
        self.windows = self.sched.micro_batches()
        fr = self.sched.frames[INPUT]
        if self.s == 0:
            self.inp = inp
        else:
            self.inp = torch.zeros(ps.problem.batch, fr.cols, fr.cell, dtype=DTYPE, device=device)
        self.shared: dict = {}
        self.steps: dict[int, DeviceStep] = {}  # micro-batches in flight
        self.done: list[DeviceStep] = []  # every micro-batch's step (their counts and times)
        self.pending: list = []  # (handle, payload) of sends across cuts
        self.received: dict[tuple, int] = {}
        self.loss = 0.0

    def _count(self, key: tuple, n: int) -> None:
        self.received[key] = self.received.get(key, 0) + n

    def _rows(self, mask: np.ndarray, j: int) -> torch.Tensor:
        lo, hi = self._window(j)
        keep = np.zeros(mask.shape, dtype=bool)
        keep[lo:hi] = True
        return torch.as_tensor(mask & keep, device=self.device)

    def _window(self, j: int) -> tuple[int, int]:
        w = self.windows[j].window
        return (0, self.ps.problem.batch) if w is None else (w[0], w[1])

    def _isend(self, payload: torch.Tensor, dst: int) -> None:
        payload = payload.contiguous()
        self.pending.append((self.comm.isend(payload, dst), payload))

    def _recv(self, mask: torch.Tensor, cell: int, src: int) -> torch.Tensor:
        payload = torch.empty(int(mask.sum()), cell, dtype=DTYPE, device=self.device)
        self.comm.recv(payload, src)
        return payload

    def _within(self, routes, j: int, buf: torch.Tensor, cell: int, add: bool):
        """Routes inside this device's group, in their order on every device of the group."""
        for r in routes:
            if self.rank not in (r.src, r.dst):
                continue
            mask = self._rows(r.mask, j)
            if not mask.any():
                continue
            if r.src == self.rank:
                self.comm.send(buf[mask].contiguous(), r.dst)
                continue
            payload = self._recv(mask, cell, r.src)
            self._count(r.key, payload.numel())
            if add:
                buf[mask] += payload
            else:
                buf[mask] = payload

    def forward(self, j: int) -> None:
        ps, s = self.ps, self.s
        if s > 0:  # the cut's tensor arrives: once across, then inside the group
            cut = ps.cuts[s - 1]
            for r in cut.forward:
                mask = self._rows(r.mask, j)
                if r.dst == self.rank and mask.any():
                    payload = self._recv(mask, cut.cell, r.src)
                    self._count(r.key, payload.numel())
                    self.inp[mask] = payload
            self._within(cut.fan_out, j, self.inp, cut.cell, False)
        step = DeviceStep(
            self.windows[j],
            self.local,
            self.weights,
            self.inp,
            self.target,
            self.group,
            self.device,
        )
        step.bufs = _StepBuffers(self.shared)
        self.steps[j] = step
        self.done.append(step)
        step.forward()
        if s == len(ps.stages) - 1:
            self.loss += step.loss()
            return
        cut = ps.cuts[s]
        out = step._tensor(step.F, cut.tensor)  # noqa: SLF001 - the step's own buffer
        for r in cut.forward:
            mask = self._rows(r.mask, j)
            if r.src == self.rank and mask.any():
                self._isend(out[mask], r.dst)

    def backward(self, j: int) -> None:
        ps, s = self.ps, self.s
        step = self.steps[j]
        if s < len(ps.stages) - 1:  # the gradient of the cut's tensor comes back
            cut = ps.cuts[s]
            e = step._tensor(step.E, cut.tensor)  # noqa: SLF001
            for r in cut.back:
                mask = self._rows(r.mask, j)
                if r.dst == self.rank and mask.any():
                    payload = self._recv(mask, cut.cell, r.src)
                    self._count(r.key, payload.numel())
                    e[mask] = payload
            self._within(cut.fan_back, j, e, cut.cell, False)
        step.backward()
        if s > 0:  # this stage's input gradient: summed onto the landing devices, then across
            cut = ps.cuts[s - 1]
            frame = self.sched.frames[INPUT]
            g = torch.zeros(
                ps.problem.batch, frame.cols, frame.cell, dtype=DTYPE, device=self.device
            )
            owners = cut.owners[self.rank]
            for reader in step.readers.get(INPUT, []):
                m = self._rows(owners[reader.node], j)  # the one copy of it that is summed
                g[m] += step._contribution(reader.node, INPUT)[m]  # noqa: SLF001
            self._within(cut.gather, j, g, cut.cell, True)
            for r in cut.back:
                mask = self._rows(r.mask, j)
                if r.src == self.rank and mask.any():
                    self._isend(g[mask], r.dst)
        del self.steps[j]  # out of flight

    def run(self, order) -> None:
        for kind, j in order:
            if kind == "F":
                self.forward(j)
            else:
                self.backward(j)
        for handle, _ in self.pending:
            handle.wait()
        self.pending.clear()

    def whole_step(self) -> DeviceStep:
        """The stage's step over the whole batch: its weight gradients and update."""
        step = DeviceStep(
            self.sched, self.local, self.weights, self.inp, self.target, self.group, self.device
        )
        step.bufs = _StepBuffers(self.shared)
        return step


def run_pipeline_device(
    ps, rank: int, comm, seed: int, steps: int, lr: float, device: str = "cpu"
) -> dict:
    """All ``steps`` of one device of a pipeline plan (a
    :class:`~parplan.executor.stages.PipelineSchedule`); the same record as :func:`run_device`,
    its split paths global (its stage's group before them) and the cuts' moves under their
    routes' keys (:class:`~parplan.executor.stages.Route`)."""
    weights, inp, target = init_tensors(ps.problem, seed)
    weights = {k: w.to(device) for k, w in weights.items()}
    inp, target = inp.to(device), target.to(device)
    s = ps.stage_of(rank)
    if s is None:  # a device no stage uses
        return {
            "rank": rank,
            "losses": [0.0] * steps,
            "grads": {},
            "received": [{}] * steps,
            "seconds": [{}] * steps,
        }
    group = ps.plan.stages[s].group
    losses, received, seconds = [], [], []
    dev = None
    for k in range(steps):
        dev = _PipelineDevice(ps, rank, comm, weights, inp, target, device)
        dev.run(ps.order[s])
        got = dict(dev.received)
        took: dict[str, float] = {}
        for step in dev.done:
            for (split, node, side, phase), n in step.received.items():
                key = (group + split, node, side, phase)
                got[key] = got.get(key, 0) + n
            for node, t in step.seconds.items():
                took[node] = took.get(node, 0.0) + t
        losses.append(dev.loss)
        received.append(got)
        seconds.append(took)
        if k + 1 < steps:
            dev.whole_step().apply_update(lr)
    return {
        "rank": rank,
        "losses": losses,
        "grads": dev.whole_step().weight_gradients(),
        "received": received,
        "seconds": seconds,
    }


def reference_steps(problem, seed: int, steps: int, lr: float) -> tuple[list[float], dict]:
    """Losses of every step and the weight gradients of the last (torch layout), on one process
    (SGD between steps)."""
    weights, inp, target = init_tensors(problem, seed)
    losses = []
    grads = {}
    for k in range(steps):
        loss, grads = reference_step(problem, weights, inp, target)
        losses.append(loss)
        if k + 1 < steps:
            for name, g in grads.items():
                weights[name] = weights[name] - lr * g
    return losses, grads


def reference_run(problem, seed: int, steps: int, lr: float):
    """Losses of every step and the weight gradients of the last, on one process, the gradients
    on the executor's grids."""
    losses, grads = reference_steps(problem, seed, steps, lr)
    frames = graph_frames(problem)
    grids = {}
    for name, g in grads.items():
        layer = problem.graph.layer(name)
        grids[name] = weight_grid(layer, g, frames[layer.inputs[0]].cell).numpy()
    return losses, grids


__all__ = [
    "DeviceStep",
    "apply_op",
    "init_tensors",
    "reference_run",
    "reference_step",
    "reference_steps",
    "run_device",
    "run_pipeline_device",
    "weight_grid",
]
