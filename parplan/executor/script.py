"""A plan as a training script that runs with PyTorch's own parallel APIs (docs/interop.md,
"A training script").

For a model that is a PyTorch module (``file.py:factory``, ``hf:``, ``tv:``), the script builds
the module, a ``DeviceMesh`` with one dimension per level of the plan (``l1`` the root split),
then applies the plan with torch's APIs only:

- the **tensor-parallel levels** (those where some weighted layer is IN or OUT; they must be
  the lowest levels, flattened into one ``tp`` mesh dimension): ``parallelize_module`` with
  ``ColwiseParallel`` for OUT and ``RowwiseParallel`` for IN. Each style's ``input_layouts`` is
  the layout its input arrives in and its ``output_layouts`` the layout its consumers read, both
  from the plan (joins WHOLE: ``Replicate()``, COLS: ``Shard(-1)``); the model's output is
  gathered (``Replicate()``) for the loss;
- the **data-parallel levels** (every other; flattened into ``dp``): each data rank takes its
  rows of the global batch; ZeRO stages are FSDP2's ``fully_shard`` over ``dp`` on every block
  (in a model without blocks, every weighted module: docs/costmodel.md section 6.1's units),
  then the model (stage 3 reshards after forward; FSDP2 has no stage 1 or 2 of its own, and
  runs them as ``reshard_after_forward=False``); without ZeRO the gradients are averaged over
  ``dp`` with one all-reduce each;
- **recomputation**: ``checkpoint_wrapper`` on every block (per layer: on every weighted module);
- **micro-batches**: gradient accumulation over the plan's micro-batches of each data rank's rows.

``--check`` runs the same step in one process on the whole batch (float64) and compares the loss
and every gradient. What the script cannot express is refused before it is written
(:func:`script_plan` raises :class:`ConfigError` with every reason): layers whose choices
differ between tensor-parallel levels, a weighted layer split by the batch on a tensor-parallel
level, tensor-parallel levels above data-parallel ones, consumers that read one layer's output in
different layouts, and everything :func:`parplan.executor.export.torch_export` refuses.
"""

from __future__ import annotations

from dataclasses import dataclass

from parplan.costmodel.planning import block_name
from parplan.costmodel.problem import Plan, Problem
from parplan.errors import ConfigError
from parplan.executor.export import torch_export
from parplan.models.importers.external import absolute_spec

#: A join's layout (its choice on a level) as a torch placement.
JOIN_PLACEMENT = {"rows": "Shard(0)", "cols": "Shard(-1)", "whole": "Replicate()"}
#: What a weighted layer reads on a tensor-parallel level (torch's style's desired input).
READS = {"out": "Replicate()", "in": "Shard(-1)"}
STYLE_CLASS = {"out": "ColwiseParallel", "in": "RowwiseParallel"}
#: Reasons a refusal lists (then how many more).
SHOWN = 8


@dataclass(frozen=True)
class ScriptPlan:
    """What the training script applies (see the module docstring)."""

    spec: str
    batch: int
    mesh_shape: tuple[int, ...]
    mesh_dims: tuple[str, ...]
    data_dims: tuple[str, ...]
    tensor_dims: tuple[str, ...]
    #: (module path, style class, input layout, output layout) per styled module
    styles: tuple[tuple[str, str, str, str], ...]
    #: modules ``fully_shard`` wraps before the whole model: the model's blocks, or in a model
    #: without blocks every weighted module (docs/costmodel.md section 6.1's units)
    units: tuple[str, ...]
    #: modules wrapped by checkpoint_wrapper (empty: no recomputation)
    recomputed: tuple[str, ...]
    zero_stage: int
    micro_batches: int


def script_plan(problem: Problem, plan: Plan, spec: str) -> ScriptPlan:
    """The torch calls that run ``plan`` (module docstring), or a :class:`ConfigError` naming
    every part of the plan they cannot express."""
    export = torch_export(problem, plan)
    why = [
        f"{layer} at split {path or 'root'}: {reason}" for layer, path, reason in export.refusals
    ]
    pg = problem.planning
    levels = len(export.mesh_shape)
    ex = {e.name: e for e in export.layers}
    weighted = [ex[n.name] for n in pg.nodes if not n.is_join]
    tensor = [j for j in range(levels) if any(e.choices[j] in READS for e in weighted)]
    data = [j for j in range(levels) if j not in tensor]
    if tensor and tensor != list(range(levels - len(tensor), levels)):
        why.append(
            "tensor-parallel levels "
            + ", ".join(f"l{j + 1}" for j in tensor)
            + " are not the lowest ones: torch runs data parallelism over the outer mesh dims"
        )
    choice: dict[int, str] = {}
    for i, node in enumerate(pg.nodes):
        e = ex[node.name]
        for j in data:
            if e.choices[j] not in ("batch", "rows"):
                why.append(
                    f"{node.name}: {e.choices[j]} at l{j + 1}, a data-parallel level (every layer "
                    "splits the batch there)"
                )
        on_tensor = {e.choices[j] for j in tensor}
        if len(on_tensor) > 1:
            why.append(
                f"{node.name}: {'/'.join(sorted(on_tensor))} on the tensor-parallel levels "
                "(torch gives a module one style over the flattened tp mesh)"
            )
        c = on_tensor.pop() if on_tensor else "batch"
        if tensor and c in ("batch", "rows"):
            why.append(
                f"{node.name}: split by rows on a tensor-parallel level (torch's styles do not "
                "split one module's batch or sequence there)"
            )
        choice[i] = c

    def layout(i: int) -> str:
        """The layout node i's output leaves in on the tp dim (weighted: what its consumers read)."""
        if pg.nodes[i].is_join:
            return JOIN_PLACEMENT.get(choice[i], "Replicate()")
        reads = {_reads(k, choice, pg) for k in pg.succs[i]}
        if len(reads) > 1:
            why.append(
                f"{pg.nodes[i].name}: its consumers read its output as {' and '.join(sorted(reads))} "
                "(torch gives a module's output one layout)"
            )
        return reads.pop() if reads else "Replicate()"

    styles = []
    if tensor:
        outs = {i: layout(i) for i in range(len(pg.nodes))}
        for i, node in enumerate(pg.nodes):
            arrive = {outs[p] for p in node.preds} | (
                {"Replicate()"} if node.graph_input or not node.preds else set()
            )
            if node.is_join:
                if arrive - {outs[i]}:
                    why.append(
                        f"{node.name}: a join laid out as {outs[i]} whose inputs arrive as "
                        f"{' and '.join(sorted(arrive))} (torch does not re-lay out between "
                        "element-wise operations)"
                    )
                continue
            if len(arrive) > 1:
                why.append(f"{node.name}: its inputs arrive as {' and '.join(sorted(arrive))}")
            style = STYLE_CLASS.get(choice[i])
            if style is not None:
                styles += [(m, style, min(arrive), outs[i]) for m in ex[node.name].module_paths]
    if why:
        shown = why[:SHOWN] + ([f"... and {len(why) - SHOWN} more"] if len(why) > SHOWN else [])
        raise ConfigError(
            "the plan cannot be written as a torch training script (export --nearest gives the "
            "nearest plan torch can express):\n  " + "\n  ".join(shown)
        )
    blocks = tuple(dict.fromkeys(block_name(n.name) for n, b in zip(pg.nodes, pg.blocks) if b >= 0))
    weighted_modules = tuple(m for n in pg.nodes if not n.is_join for m in ex[n.name].module_paths)
    if not problem.recompute:
        recomputed: tuple[str, ...] = ()
    elif problem.blocks_recomputed and blocks:
        recomputed = blocks
    else:
        recomputed = weighted_modules
    names = export.mesh_dim_names
    return ScriptPlan(
        spec=absolute_spec(spec),
        batch=problem.batch,
        mesh_shape=export.mesh_shape,
        mesh_dims=names,
        data_dims=tuple(names[j] for j in data),
        tensor_dims=tuple(names[j] for j in tensor),
        styles=tuple(styles),
        units=blocks or weighted_modules,
        recomputed=recomputed,
        zero_stage=problem.zero_stage,
        micro_batches=problem.micro_batches,
    )


def _reads(k: int, choice: dict[int, str], pg) -> str:
    """The layout node k reads its input in on the tp dim."""
    if pg.nodes[k].is_join:
        return JOIN_PLACEMENT.get(choice[k], "Replicate()")
    return READS.get(choice[k], "Replicate()")


def training_script(problem: Problem, plan: Plan, spec: str) -> str:
    """A runnable script (``torchrun --nproc-per-node N script.py [--check]``) that trains the
    module of ``spec`` under ``plan`` with torch's own APIs (module docstring)."""
    sp = script_plan(problem, plan, spec)
    world = 1
    for n in sp.mesh_shape:
        world *= n
    header = f'''"""parplan export: {problem.graph.name} on {problem.array.describe()}, batch {sp.batch},
run with PyTorch's own parallel APIs (docs/interop.md, "A training script").

    torchrun --nproc-per-node {world} {{this file}} [--steps N] [--check]

--check runs the first step again in one process (float64) and compares the loss and every
gradient. The script imports parplan only to build the model from its spec (build_model).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

MODEL = {sp.spec!r}
BATCH = {sp.batch}
MICRO_BATCHES = {sp.micro_batches}
ZERO_STAGE = {sp.zero_stage}
MESH_SHAPE = {sp.mesh_shape!r}
MESH_DIMS = {sp.mesh_dims!r}
DATA_DIMS = {sp.data_dims!r}  # data parallel: each rank's rows of the batch
TENSOR_DIMS = {sp.tensor_dims!r}  # tensor parallel: parallelize_module on their flattened mesh
# module path -> (style, input layout, output layout) on the tensor-parallel dims
STYLES = {{
'''
    body = "".join(
        f"    {path!r}: ({style}, {arrive}, {leave}),\n" for path, style, arrive, leave in sp.styles
    )
    tail = f'''}}
UNITS = {sp.units!r}  # fully_shard units (then the whole model)
RECOMPUTED = {sp.recomputed!r}  # checkpoint_wrapper


def build_model():
    from parplan.models.importers.external import module_of

    model, shape, ids = module_of(MODEL)
    return model, shape, ids


def submesh(mesh, dims, name):
    if not dims:
        return None
    return mesh[dims[0]] if len(dims) == 1 else mesh[dims]._flatten(name)


def parallelize(model, mesh):
    tp, dp = submesh(mesh, TENSOR_DIMS, "tp"), submesh(mesh, DATA_DIMS, "dp")
    if tp is not None:
        parallelize_module(
            model,
            tp,
            {{
                path: style(input_layouts=arrive, output_layouts=leave)
                for path, (style, arrive, leave) in STYLES.items()
            }},
        )
    if RECOMPUTED:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for path in RECOMPUTED:
            parent, _, child = path.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            setattr(owner, child, checkpoint_wrapper(getattr(owner, child)))
    if ZERO_STAGE and dp is not None:
        from torch.distributed.fsdp import fully_shard

        for path in UNITS:
            fully_shard(model.get_submodule(path), mesh=dp, reshard_after_forward=ZERO_STAGE >= 3)
        fully_shard(model, mesh=dp, reshard_after_forward=ZERO_STAGE >= 3)
    return model, dp


def batch_of(model, shape, ids, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if ids:
        vocab = next(m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding))
        return torch.randint(0, vocab, (BATCH, *shape), generator=g)
    return torch.randn((BATCH, *shape), generator=g, dtype=dtype)


def logits(out):
    out = getattr(out, "logits", out)
    return out[0] if isinstance(out, (tuple, list)) else out


def targets_for(out, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, out.shape[-1], (BATCH, *out.shape[1:-1]), generator=g)


def loss_of(out, target):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1).to(out.device))


def step(model, dp, x, device):
    """One training step's forward and backward on this rank's rows; returns the mean loss."""
    parts, rank = (dp.size(), dp.get_local_rank()) if dp is not None else (1, 0)
    rows = BATCH // parts
    mine = x[rank * rows : (rank + 1) * rows]
    micro = rows // MICRO_BATCHES
    total, target = 0.0, None
    for k in range(MICRO_BATCHES):
        out = logits(model(mine[k * micro : (k + 1) * micro].to(device)))
        target = targets_for(out) if target is None else target
        part = target[rank * rows : (rank + 1) * rows][k * micro : (k + 1) * micro]
        loss = loss_of(out, part) / MICRO_BATCHES
        loss.backward()
        total += loss.item()
    if dp is not None and not ZERO_STAGE:  # data parallel without ZeRO: average every gradient
        for p in model.parameters():
            if p.grad is not None:
                local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                dist.all_reduce(local, group=dp.get_group())
                local /= parts
    mean = torch.tensor([total], dtype=torch.float64, device=device)
    if dp is not None:
        dist.all_reduce(mean, group=dp.get_group())
    return mean.item() / parts


def check(model, shape, ids, x, loss, device):
    """The step in one process on the whole batch (float64), against this run's."""
    torch.manual_seed(0)
    ref, _, _ = build_model()
    ref = ref.double()
    out = logits(ref(x))
    expected = loss_of(out, targets_for(out))
    expected.backward()
    # differences relative to the largest gradient element of the model (a gradient that is
    # zero in exact arithmetic, such as an attention key's bias, is rounding on both sides)
    mine = {{n.replace("_checkpoint_wrapped_module.", ""): p for n, p in model.named_parameters()}}
    scale, worst = 1e-300, 0.0
    for name, p in ref.named_parameters():
        g = mine[name].grad
        g = g.full_tensor() if isinstance(g, DTensor) else g
        scale = max(scale, p.grad.abs().max().item())
        worst = max(worst, (g.cpu() - p.grad).abs().max().item())
    worst /= scale
    ok = abs(loss - expected.item()) <= 1e-9 * abs(expected.item()) and worst <= 1e-9
    if dist.get_rank() == 0:
        print(f"check: loss {{loss:.12g}} (one process {{expected.item():.12g}}), "
              f"largest gradient difference {{worst:.3g}} of the largest gradient: {{'equal' if ok else 'DIFFERENT'}}")
    return ok


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--check", action="store_true", help="float64, compared with one process")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    device = "cuda" if cuda else "cpu"
    dtype = torch.float64 if args.check else torch.float32
    torch.manual_seed(0)
    model, shape, ids = build_model()
    model = model.to(device=device, dtype=dtype)
    x = batch_of(model, shape, ids, dtype)
    mesh = init_device_mesh(device, MESH_SHAPE, mesh_dim_names=MESH_DIMS)
    model, dp = parallelize(model, mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ok = True
    for k in range(args.steps):
        loss = step(model, dp, x, device)
        if k == 0 and args.check:
            ok = check(model, shape, ids, x, loss, device)
        opt.step()
        opt.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {{k + 1}}: loss {{loss:.6g}}")
    dist.barrier()  # every rank done communicating before the groups go (gloo aborts otherwise)
    dist.destroy_process_group()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
'''
    return header + body + tail


@dataclass(frozen=True)
class ScriptRun:
    """What ``torchrun ... script --check`` printed: its exit code, its ``check:`` line and
    its output."""

    returncode: int
    check: str
    output: str

    @property
    def equal(self) -> bool:
        return self.returncode == 0 and self.check.endswith(": equal")


def run_script(text: str, processes: int, steps: int = 1, timeout_s: float = 1800.0) -> ScriptRun:
    """Run a training script (:func:`training_script`) under ``torchrun --standalone`` on
    ``processes`` processes with ``--check`` (``parplan run --runtime script``)."""
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="parplan-script-") as where:
        path = Path(where) / "train.py"
        path.write_text(text, encoding="utf-8")
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += ["--nproc-per-node", str(processes), str(path), "--check", "--steps", str(steps)]
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
                cwd=where,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            raise ConfigError(f"the training script did not finish in {timeout_s:.0f} s") from None
    check = next((x for x in done.stdout.splitlines() if x.startswith("check:")), "")
    return ScriptRun(done.returncode, check, done.stdout + done.stderr)


__all__ = ["ScriptPlan", "ScriptRun", "run_script", "script_plan", "training_script"]
