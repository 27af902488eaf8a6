"""Run an exported plan with PyTorch's own DTensor (``parplan run --runtime torch``,
docs/interop.md "Run it with torch"). torch is imported here only.

Every process builds the mesh of :func:`parplan.executor.export.torch_export`, distributes
every weight with its placements, and runs the reference step's network
(:func:`parplan.executor.torchexec.reference_step`, float64, the same weights, input and
target from ``seed``) on DTensors. Before a weighted layer or a join its input is
redistributed to the layout the plan gives it (``NEED``); an IN layer's partial sums are
reduced (``GIVE``). Products, convolutions and embeddings run as DTensor ops: torch chooses
and runs the collectives. Element-wise layers act on each device's local part (they act per
row and column, as parplan prices them), with the columns it holds. The step's collectives are
counted by torch's ``CommDebugMode``.

Tensors here keep the executor's layout ``(rows, columns, positions)``: the export's
``Shard(-1)`` (features last, torch's convention) is ``Shard(1)`` here.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as tf
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from parplan.costmodel.graph import INPUT, Add, Concat, Conv2d, Embedding, Linear, Mul, Norm
from parplan.executor.torchexec import _pair, apply_op, init_tensors, layer_norm, rms_norm


def _placement(text: str):
    """A placement of the export (torch's layout) in the executor's ``(rows, columns, positions)``."""
    if text == "Replicate()":
        return Replicate()
    if text == "Shard(0)":
        return Shard(0)
    if text in ("Shard(-1)", "Shard(1)"):
        return Shard(1)
    raise ValueError(f"unknown placement {text}")


def _weight_placement(text: str):
    return Replicate() if text == "Replicate()" else Shard(int(text[6:-1]))


def _reduced(x: DTensor) -> DTensor:
    """``x`` with every partial sum reduced (all-reduce to Replicate on those mesh dims)."""
    if any(isinstance(p, Partial) for p in x.placements):
        return x.redistribute(
            x.device_mesh, [Replicate() if isinstance(p, Partial) else p for p in x.placements]
        )
    return x


def _local_columns(x: DTensor) -> np.ndarray:
    """The global column indices of this process's part of ``x`` (contiguous: dim 1 is split
    at most once per mesh dim, in mesh order)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(x.shape, x.device_mesh, x.placements)
    return np.arange(offset[1], offset[1] + shape[1])


def _elementwise(layer, info, x: DTensor) -> DTensor:
    """An element-wise layer on each process's part of ``x`` (rows and columns it holds)."""
    x = _reduced(x)
    local = apply_op(layer, info, x.to_local().contiguous(), _local_columns(x)).contiguous()
    return DTensor.from_local(
        local,
        x.device_mesh,
        x.placements,
        shape=_global_shape(local, x),
        stride=torch.empty(_global_shape(local, x), dtype=local.dtype).stride(),
    )


def _global_shape(local: torch.Tensor, like: DTensor) -> torch.Size:
    """The whole tensor's shape of even parts ``local`` placed as ``like``."""
    shape = list(local.shape)
    for i, p in enumerate(like.placements):
        if isinstance(p, Shard):
            shape[p.dim] *= like.device_mesh.size(i)
    return torch.Size(shape)


def _conv2d_local(x: DTensor, w: DTensor, layer, s) -> DTensor:
    """A convolution of rows ``x`` (split by the batch or replicated) with a replicated weight,
    per process (DTensor's conv2d takes one mesh dimension on the batch): the weight's gradient
    is a partial sum over the mesh dimensions that split the rows (``local_map``'s rule)."""
    mesh = x.device_mesh
    partial = [Partial() if isinstance(p, Shard) else Replicate() for p in x.placements]
    xl = x.to_local()
    y = tf.conv2d(
        xl.reshape(xl.shape[0], s.channels, s.height, s.width),
        w.to_local(grad_placements=partial),
        stride=_pair(layer.stride),
        padding=_pair(layer.padding),
    )
    y = y.reshape(y.shape[0], y.shape[1], -1)
    return DTensor.from_local(
        y,
        mesh,
        x.placements,
        shape=_global_shape(y, x),
        stride=torch.empty(_global_shape(y, x), dtype=y.dtype).stride(),
    )


def _embedding_local(ids: DTensor, w: DTensor, layer) -> DTensor:
    """A replicated table looked up by the rows of ``ids`` each process holds (a table that is
    not a planning node of its own: it is read through a join); its gradient is a partial sum
    over the mesh dimensions that split the rows."""
    rows = [p if isinstance(p, Shard) and p.dim == 0 else Replicate() for p in ids.placements]
    ids = ids.redistribute(ids.device_mesh, rows)
    partial = [Partial() if isinstance(p, Shard) else Replicate() for p in rows]
    local = ids.to_local()
    y = tf.embedding(
        local.reshape(local.shape[0], -1).long() % layer.num, w.to_local(grad_placements=partial)
    ).permute(0, 2, 1)
    return DTensor.from_local(
        y,
        ids.device_mesh,
        rows,
        shape=_global_shape(y, ids),
        stride=torch.empty(_global_shape(y, ids), dtype=y.dtype).stride(),
    )


class _Dense(torch.autograd.Function):
    """The identity, with each process's part (and its gradient's) made contiguous: DTensor's
    global strides can call a part contiguous that is a slice or a transpose, and torch's
    backward then views it and fails."""

    @staticmethod
    def forward(ctx, x):
        return _dense(x)

    @staticmethod
    def backward(ctx, g):
        return _dense(g)


def _dense(x: DTensor) -> DTensor:
    local = x.to_local()
    if local.is_contiguous() and x.is_contiguous():
        return x
    return DTensor.from_local(
        local.contiguous(),
        x.device_mesh,
        x.placements,
        shape=x.shape,
        stride=torch.empty(x.shape, device="meta").stride(),
    )


def _per_position(x: DTensor, w: DTensor) -> DTensor:
    """A linear layer at every position: ``x`` (rows, in, positions), ``w`` (out, in) -> (rows,
    out, positions), as one 2-D product over the rows x positions (DTensor's ``mm``)."""
    n, i, s = x.shape
    x2 = _Dense.apply(x.transpose(1, 2)).reshape(n * s, i)
    y2 = torch.mm(x2, w.t())
    return _Dense.apply(_Dense.apply(y2).reshape(n, s, -1).transpose(1, 2))


def dtensor_forward(problem, export, mesh, weights: dict, inp: torch.Tensor) -> DTensor:
    """The network's output (rows, columns, positions) as a DTensor: ``weights`` are DTensors placed as
    the export says, ``inp`` the whole input batch (replicated)."""
    info = problem.graph.analyze()
    by_name = {e.name: e for e in export.layers}
    rep = [Replicate()] * mesh.ndim
    rows = inp.shape[0]  # the step's batch, or one micro-batch of it
    x0 = inp.reshape(rows, inp.shape[1], -1)
    f = {
        INPUT: DTensor.from_local(x0, mesh, rep)
    }  # every process drew the same batch from the seed
    for name in info.order:
        layer = problem.graph.layer(name)
        planned = by_name.get(name)
        xs = [f[s] for s in layer.inputs]
        if planned is not None:  # the plan's layout of the node's input(s)
            need = [_placement(p) for p in planned.input]
            xs = [_reduced(x).redistribute(mesh, need) for x in xs]
        if isinstance(layer, Conv2d):  # the export splits convolutions by the batch only
            y = _conv2d_local(xs[0], weights[name], layer, info.in_shapes[name][0])
        elif isinstance(layer, Linear) and layer.per_position:
            y = _per_position(xs[0], weights[name])
        elif isinstance(layer, Linear):
            y = (xs[0].reshape(rows, -1) @ weights[name].T).reshape(rows, -1, 1)
        elif isinstance(layer, Embedding) and planned is None:
            y = _embedding_local(_reduced(xs[0]), weights[name], layer)
        elif isinstance(layer, Embedding):
            ids = (
                _reduced(xs[0]).redistribute(mesh, rep).to_local().reshape(rows, -1).long()
                % layer.num
            )
            ids = distribute_tensor(
                ids,
                mesh,
                [
                    Shard(0) if isinstance(p, Shard) and p.dim == 0 else Replicate()
                    for p in xs[0].placements
                ],
            )
            y = tf.embedding(ids, weights[name]).permute(0, 2, 1)
        elif isinstance(layer, Norm) and layer.kind in (
            "layer",
            "rms",
        ):  # over the columns: DTensor's reductions
            y = (layer_norm if layer.kind == "layer" else rms_norm)(_reduced(xs[0]))
        elif isinstance(layer, Add):
            y = sum(xs[1:], xs[0])
        elif isinstance(layer, Mul):
            y = xs[0] * xs[1]
        elif isinstance(layer, Concat):
            y = torch.cat(xs, dim=1)
        else:
            y = _elementwise(layer, info, xs[0])
        if planned is not None:
            y = _reduced(y).redistribute(mesh, [_placement(p) for p in planned.output])
        f[name] = y
    return f[info.order[-1]]


def glu_orders(problem, export) -> dict[str, torch.Tensor]:
    """Per fused gate/up projection whose output columns the plan splits (OUT on some mesh
    dims), the order of its weight's rows that puts each part's gate columns next to its up
    columns: a part ``p`` of ``P`` holds ``[gate_p | up_p]``, so the gated unit acts on it
    locally (as parplan prices it; torch users shard ``gate_proj`` and ``up_proj`` each by
    ``Shard(0)``, which is the same)."""
    from parplan.costmodel.graph import Glu

    by_name = {e.name: e for e in export.layers}
    shapes = problem.graph.analyze().out_shape
    out = {}
    for layer in problem.graph.layers:
        if not isinstance(layer, Glu) or layer.inputs[0] not in by_name:
            continue
        producer = by_name[layer.inputs[0]]
        parts = 2 ** sum(c == "out" for c in producer.choices)
        if parts == 1:
            continue
        f = shapes[layer.name].channels
        if f % parts:
            raise ValueError(
                f"gated unit '{layer.name}': {f} columns do not split into {parts} parts"
            )
        k = f // parts
        out[producer.name] = torch.cat(
            [
                torch.cat([torch.arange(p * k, (p + 1) * k), f + torch.arange(p * k, (p + 1) * k)])
                for p in range(parts)
            ]
        )
    return out


def _counting_mode():
    """torch's ``CommDebugMode``, also summing each collective's payload on this process: the
    elements of its input (``payload``, by collective)."""
    from collections import Counter

    from torch.distributed.tensor.debug import CommDebugMode

    class Counted(CommDebugMode):
        def __init__(self):
            super().__init__()
            self.payload = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            packet = getattr(func, "_overloadpacket", None)
            if (
                out is not NotImplemented
                and packet is not None
                and args
                and isinstance(args[0], torch.Tensor)
            ):
                name = str(packet).split(".")[-1].rstrip("_")
                if name in COLLECTIVES:
                    self.payload[name] += args[0].numel()
            return out

    return Counted()


#: The collectives whose payload :func:`_counting_mode` sums.
COLLECTIVES = (
    "all_reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "broadcast",
)


def _sharded(placements: list, zero_stage: int) -> list:
    """Where ZeRO keeps a weight's state: on every mesh dim where the weight is replicated (its
    layer is BATCH there), its rows split (``Shard(0)``), as FSDP2 shards a parameter over the
    data-parallel dims; unchanged without ZeRO."""
    if not zero_stage:
        return list(placements)
    return [Shard(0) if isinstance(p, Replicate) else p for p in placements]


def _micro_batches(problem) -> list[slice]:
    """The rows of each of the step's micro-batches (docs/costmodel.md section 6.4)."""
    m = problem.micro_batches
    size = problem.batch // m
    return [slice(j * size, (j + 1) * size) for j in range(m)]


def run_dtensor(
    problem, export, rank: int, seed: int, steps: int, lr: float, device: str = "cpu"
) -> dict:
    """``steps`` SGD steps of the exported plan in this process (one of the mesh's): the losses,
    and on rank 0 every weight's last gradient (whole, numpy) and the collectives counted.

    Micro-batches run one after the other, their gradients accumulating (section 6.4). ZeRO (the
    problem's stage; docs/costmodel.md section 6.1) as FSDP2 runs it, with DTensor's
    redistributions: stage 1-2 reduce-scatter each gradient to the shard a device keeps, update
    that shard and all-gather the weight; stage 3 keeps only the shard and all-gathers the weight
    for use in the step (its backward reduce-scatters the gradient)."""
    mesh = init_device_mesh(
        device.split(":")[0], export.mesh_shape, mesh_dim_names=export.mesh_dim_names
    )
    weights, inp, target = init_tensors(problem, seed)
    rep = [Replicate()] * mesh.ndim
    zero = problem.zero_stage
    params, use, keep, orders = _distribute(problem, export, mesh, weights, device)
    target = target.to(device)
    losses, counts, grads, payload = [], {}, {}, {}
    for k in range(steps):
        w = {name: t.detach().requires_grad_() for name, t in params.items()}
        mode = _counting_mode()
        parts = []
        with mode:
            for rows in _micro_batches(problem):  # one after the other, the gradients accumulating
                used = (
                    {name: t.redistribute(mesh, use[name]) for name, t in w.items()}
                    if zero >= 3
                    else w
                )
                y = dtensor_forward(problem, export, mesh, used, inp[rows].to(device)).reshape(
                    rows.stop - rows.start, -1
                )
                part = DTensor.from_local(target[rows], mesh, rep).redistribute(mesh, y.placements)
                loss = 0.5 * ((y - part) ** 2).sum()
                loss.backward()
                parts.append(loss.detach())
            params, grads = _sgd(
                w, {name: t.grad for name, t in w.items()}, mesh, use, keep, zero, lr
            )
        losses.append(sum(float(part.full_tensor()) for part in parts))  # outside the count
        counts = {str(op).split(".", 1)[-1]: int(n) for op, n in mode.get_comm_counts().items()}
        payload = dict(mode.payload)
    whole = _whole(grads, orders)
    return {
        "losses": losses,
        "grads": whole if rank == 0 else {},
        "collectives": counts,
        "payload_elements": payload,
    }


def _distribute(problem, export, mesh, weights: dict, device: str):
    """(the weights as DTensors where the step keeps them, the placements each is used with, the
    placements its state is kept with (ZeRO: sharded over the data-parallel dims), the row
    orders of fused gate/up projections)."""
    by_name = {e.name: e for e in export.layers}
    rep = [Replicate()] * mesh.ndim
    orders = glu_orders(problem, export)
    use = {
        name: [_weight_placement(p) for p in by_name[name].weight] if name in by_name else rep
        for name in weights
    }  # a table read through a join: replicated
    zero = problem.zero_stage
    keep = {name: _sharded(use[name], zero) for name in weights}
    params = {
        name: distribute_tensor(
            (w[orders[name]] if name in orders else w).to(device),
            mesh,
            keep[name] if zero >= 3 else use[name],
        )
        for name, w in weights.items()
    }
    return params, use, keep, orders


def _sgd(w: dict, grads: dict, mesh, use: dict, keep: dict, zero: int, lr: float):
    """(the updated weights, each gradient reduced to where its weight's state lives). DTensor
    leaves a replicated weight's gradient a partial sum until asked: this is the gradient
    exchange. The update's collectives belong to the step, so the last step makes one too."""
    grads = {name: g.redistribute(mesh, keep[name]) for name, g in grads.items()}
    if zero >= 3:
        return {name: (w[name] - lr * grads[name]).detach() for name in w}, grads
    # update the kept shard, then every device's whole weight again (an all-gather)
    return {
        name: (w[name].detach().redistribute(mesh, keep[name]) - lr * grads[name]).redistribute(
            mesh, use[name]
        )
        for name in w
    }, grads


def _whole(grads: dict, orders: dict) -> dict:
    """Every gradient whole, as numpy, its rows in the model's order."""
    whole = {}
    for name, g in grads.items():
        full = g.full_tensor().cpu()
        if name in orders:  # back to the model's order of rows
            full = torch.empty_like(full).index_copy_(0, orders[name], full)
        whole[name] = full.numpy()
    return whole


class _Stage(torch.nn.Module):
    """One pipeline stage for ``torch.distributed.pipelining``: its layers on its group's mesh
    as DTensors (:func:`dtensor_forward` of its sub-problem), a plain tensor in and out (the
    whole micro-batch's tensor on every device of the group, as torch's pipelining sends it)."""

    def __init__(self, sub, export, mesh, params: dict, use: dict, last: bool):
        super().__init__()
        self.sub, self.export, self.mesh, self.use, self.last = sub, export, mesh, use, last
        self.weights = torch.nn.ParameterDict(
            {name.replace(".", "/"): torch.nn.Parameter(t) for name, t in params.items()}
        )

    def named_weights(self) -> dict:
        return {name.replace("/", "."): t for name, t in self.weights.items()}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.named_weights()
        if self.sub.zero_stage >= 3:  # ZeRO-3: gathered for use, as FSDP2 does
            w = {name: t.redistribute(self.mesh, self.use[name]) for name, t in w.items()}
        y = dtensor_forward(self.sub, self.export, self.mesh, w, x).full_tensor()
        return (y.reshape(y.shape[0], -1) if self.last else y).contiguous()  # sent as is


def run_pipeline_dtensor(
    problem, plan, pexport, rank: int, seed: int, steps: int, lr: float, device: str = "cpu"
) -> dict:
    """``steps`` SGD steps of a pipeline plan with torch's own ``torch.distributed.pipelining``
    (a ``PipelineStage`` per stage on its group, the plan's schedule, ``Schedule1F1B`` or
    ``ScheduleGPipe``) and DTensor inside each stage (its export on its group's mesh, a mesh
    dimension ``pp`` across the stages): this process's losses (the last stage's) and, on the
    first process of each stage, its weights' last gradients (whole, numpy)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from parplan.costmodel.stages import stage_problem
    from parplan.executor.torchexec import DTYPE

    p = len(pexport.stages)
    inner = pexport.stages[0].export.mesh_shape
    names = pexport.stages[0].export.mesh_dim_names
    layout = torch.tensor([list(st.ranks) for st in pexport.stages]).reshape(p, *inner)
    mesh = DeviceMesh(device.split(":")[0], layout, mesh_dim_names=("pp", *names))
    s = next(i for i, st in enumerate(pexport.stages) if rank in st.ranks)
    st, export = plan.stages[s], pexport.stages[s].export
    sub = stage_problem(problem, st.first, st.last, st.group)
    group = mesh[names] if len(names) > 1 else mesh[names[0]]
    weights, inp, target = init_tensors(problem, seed)
    layers = set(sub.graph.analyze().order)
    mine = {name: w for name, w in weights.items() if name in layers}
    params, use, keep, orders = _distribute(sub, export, group, mine, device)
    module = _Stage(sub, export, group, params, use, s == p - 1)
    m, dev = problem.micro_batches, torch.device(device)
    rows = problem.batch // m
    x_in = sub.graph.input_shape
    out = sub.graph.analyze().out_shape[sub.graph.analyze().order[-1]]
    stage = PipelineStage(
        module,
        s,
        p,
        dev,
        input_args=torch.empty(  # a later stage sends its input's gradient back
            rows, x_in.channels, x_in.spatial, dtype=DTYPE, device=dev, requires_grad=s > 0
        ),
        output_args=torch.empty(  # its gradient comes back from the next stage
            *((rows, out.elements) if s == p - 1 else (rows, out.channels, out.spatial)),
            dtype=DTYPE,
            device=dev,
            requires_grad=True,
        ),
        group=mesh.get_group("pp"),
    )
    schedule = (Schedule1F1B if plan.schedule == "1f1b" else ScheduleGPipe)(
        stage, m, loss_fn=lambda y, t: 0.5 * ((y - t) ** 2).sum(), scale_grads=False
    )
    losses, grads = [], {}
    for _ in range(steps):
        module.zero_grad(set_to_none=True)
        parts: list = []
        if s == 0:
            schedule.step(inp.reshape(problem.batch, inp.shape[1], -1).to(device))
        elif s == p - 1:
            schedule.step(target=target.to(device), losses=parts)
        else:
            schedule.step()
        losses.append(sum(float(x.detach()) for x in parts))
        w = module.named_weights()
        new, grads = _sgd(
            w, {n: t.grad for n, t in w.items()}, group, use, keep, sub.zero_stage, lr
        )
        with torch.no_grad():
            for name, t in w.items():
                t.copy_(new[name])
    whole = _whole(grads, orders)  # collectives over the stage's group: every process joins
    first = rank == pexport.stages[s].ranks[0]  # reports its stage (the group's replicas agree)
    return {
        "losses": losses if first else [0.0] * steps,
        "grads": whole if first else {},
        "collectives": {},
        "payload_elements": {},
    }


__all__ = ["dtensor_forward", "glu_orders", "run_dtensor", "run_pipeline_dtensor"]
