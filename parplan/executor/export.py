"""A plan in PyTorch's own vocabulary: a ``DeviceMesh`` and per-layer DTensor placements
(docs/interop.md, "Export to PyTorch").

Each level of the bisection tree is a mesh dimension of size 2 (``l1`` is the root split), so
a plan on ``2^d`` devices whose every group at a level splits a layer the same way at share 1/2
is a set of DTensor placements, one per mesh dimension:

==========  ====================  ======================  =====================================
choice      weight (``nn.Linear``  activation in           activation out
            ``(out, in)``)
==========  ====================  ======================  =====================================
BATCH       ``Replicate()``       ``Shard(0)`` (batch)    ``Shard(0)``
IN          ``Shard(1)``          ``Shard(-1)``           ``Partial()``, reduced: ``Replicate()``
OUT         ``Shard(0)``          ``Replicate()``         ``Shard(-1)``
rows/cols/  -                     ``Shard(0)`` /          the same
whole                             ``Shard(-1)`` /
(joins)                           ``Replicate()``
==========  ====================  ======================  =====================================

A layer split by OUT on one mesh dimension and by BATCH on the others is torch's
``ColwiseParallel`` on that dimension with data parallelism on the rest; IN is
``RowwiseParallel``. An embedding table ``(num, dim)`` takes ``Shard(1)`` under OUT and
``Shard(0)`` under IN. ZeRO stages are FSDP2's ``fully_shard`` over the mesh dimensions where
the layer is BATCH. What torch cannot express is refused per layer with the reason: shares
other than 1/2 (DTensor shards evenly), a layer left on one half, groups of one level that
split a layer differently (placements are per mesh dimension), convolutions split by IN or
OUT (DTensor shards ``conv2d`` over the batch only), arrays that are not a full binary tree.
:func:`nearest_plan` then gives the closest plan torch can run, to be priced next to it.

Example:
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.solvers.planners import make_plan
    >>> from parplan.models.zoo import get_model
    >>> p = Problem(get_model("sfc"), parse_array("cpu:4"), batch=8)
    >>> e = torch_export(p, make_plan(p, "data"))
    >>> e.mesh_shape, e.expressible, e.layers[0].weight
    ((2, 2), True, ('Replicate()', 'Replicate()'))
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from parplan.costmodel.graph import Attention, Conv2d, Embedding, Glu
from parplan.costmodel.layout import JOIN_LAYOUTS, Layout, PartitionType, ports
from parplan.costmodel.problem import Plan, Problem, Split, has_work
from parplan.errors import ConfigError
from parplan.solvers.megatron import STYLE_CHOICES, TORCH_STYLES

B, I, O = PartitionType.BATCH, PartitionType.IN, PartitionType.OUT
#: A weight's placement per choice (``nn.Linear`` / conv weight: dim 0 out, dim 1 in).
WEIGHT = {B: "Replicate()", I: "Shard(1)", O: "Shard(0)"}
#: An embedding table's ``(num, dim)``: IN splits the vocabulary, OUT the embedding dim.
TABLE = {B: "Replicate()", I: "Shard(0)", O: "Shard(1)"}
#: An activation's placement per layout (torch's layout: batch first, features last).
PLACEMENT = {Layout.ROWS: "Shard(0)", Layout.COLS: "Shard(-1)", Layout.WHOLE: "Replicate()"}
#: The activation a node reads and the one it gives (IN's partial sums reduced, as parplan prices
#: them), per choice: its ports (``layout.ports``) as placements.
NEED = {c: PLACEMENT[ports(c).need_in] for c in (B, I, O, *JOIN_LAYOUTS)}
GIVE = {c: PLACEMENT[ports(c).give_out] for c in (B, I, O, *JOIN_LAYOUTS)}
#: torch.distributed.tensor.parallel's style for a layer split on one mesh dimension.
STYLE = {STYLE_CHOICES[name]: cls for cls, name in TORCH_STYLES.items() if name in STYLE_CHOICES}
SCHEDULES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe"}


@dataclass(frozen=True)
class LayerExport:
    """One planning node (a weighted layer or a join, named as the model's module path)."""

    name: str
    kind: str
    choices: tuple[str, ...]  # per mesh dimension (level), parplan's choice
    weight: tuple[str, ...] | None  # per mesh dimension, the weight's placement (None: no weight)
    input: tuple[str, ...]
    output: tuple[str, ...]
    style: str
    fsdp_dims: tuple[str, ...] = ()
    #: The model's modules it stands for (the importer's fused q/k/v or gate/up projections:
    #: each takes the layer's placements); empty: the layer itself.
    modules: tuple[str, ...] = ()

    @property
    def module_paths(self) -> tuple[str, ...]:
        return self.modules or (self.name,)


@dataclass(frozen=True)
class TorchExport:
    """What a PyTorch user needs to run a plan with DTensor (see the module docstring)."""

    mesh_shape: tuple[int, ...]
    mesh_dim_names: tuple[str, ...]
    layers: tuple[LayerExport, ...]
    #: (layer, split path or "", reason) for every part of the plan torch cannot express
    refusals: tuple[tuple[str, str, str], ...] = ()
    zero_stage: int = 0
    micro_batches: int = 1
    notes: tuple[str, ...] = field(default=())

    @property
    def expressible(self) -> bool:
        return not self.refusals

    def layer(self, name: str) -> LayerExport:
        for e in self.layers:
            if e.name == name:
                return e
        raise KeyError(name)

    def to_dict(self) -> dict:
        return {
            "mesh_shape": list(self.mesh_shape),
            "mesh_dim_names": list(self.mesh_dim_names),
            "expressible": self.expressible,
            "zero_stage": self.zero_stage,
            "micro_batches": self.micro_batches,
            "layers": [
                {
                    "name": e.name,
                    "kind": e.kind,
                    "choices": list(e.choices),
                    "weight": None if e.weight is None else list(e.weight),
                    "input": list(e.input),
                    "output": list(e.output),
                    "style": e.style,
                    "fully_shard_over": list(e.fsdp_dims),
                    "modules": list(e.module_paths),
                }
                for e in self.layers
            ],
            "refusals": [
                {"layer": a, "split": b or "root", "reason": c} for a, b, c in self.refusals
            ],
            "notes": list(self.notes),
        }

    def script(self) -> str:
        """Python that builds the mesh and distributes every weight as the plan says (a
        ``parallelize_module`` plan where a layer is split on one mesh dimension)."""
        dims = ", ".join(repr(d) for d in self.mesh_dim_names)
        lines = [
            "# parplan export: DTensor placements of every weight (docs/interop.md)",
            "from torch.distributed.device_mesh import init_device_mesh",
            "from torch.distributed.tensor import Replicate, Shard, distribute_tensor",
            "",
            f'mesh = init_device_mesh("cuda", {self.mesh_shape}, mesh_dim_names=({dims},))',
            "PLACEMENTS = {",
        ]
        lines += [
            f"    {path!r}: [{', '.join(e.weight)}],  # {e.style}"
            + (f" (of {e.name})" if e.modules else "")
            for e in self.layers
            if e.weight
            for path in e.module_paths
        ]
        lines += [
            "}",
            "",
            "",
            "def distribute(model):",
            '    """Every planned weight of ``model`` (module path -> placements) as a DTensor."""',
            "    import torch",
            "",
            "    for path, placements in PLACEMENTS.items():",
            "        module = model.get_submodule(path)",
            "        module.weight = torch.nn.Parameter(distribute_tensor(module.weight, mesh, placements))",
            "    return model",
        ]
        if self.zero_stage:
            lines += [
                "",
                f"# ZeRO-{self.zero_stage}: fully_shard each layer over its `fully_shard_over` mesh "
                "dimensions (FSDP2), see the export's JSON",
            ]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class StageExport:
    """One pipeline stage: its layers (module paths, in order), the ranks of its group (leaf
    indices of the whole array, root-first bits) and its plan as DTensor placements."""

    layers: tuple[str, ...]
    group: str
    ranks: tuple[int, ...]
    export: TorchExport | None
    refusal: str = ""


@dataclass(frozen=True)
class PipelineExport:
    """A pipeline plan for ``torch.distributed.pipelining``: the split points (the first layer of
    every stage but the first, ``SplitPoint.BEGINNING``), the schedule class, the micro-batches,
    and each stage's own export on its group's mesh."""

    stages: tuple[StageExport, ...]
    schedule: str
    micro_batches: int
    notes: tuple[str, ...] = ()

    @property
    def expressible(self) -> bool:
        return all(st.export is not None and st.export.expressible for st in self.stages)

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """``(stages, *a stage's mesh)``: the mesh a run builds, its first dimension ``pp``."""
        first = self.stages[0].export
        return (len(self.stages), *(first.mesh_shape if first is not None else ()))

    @property
    def split_points(self) -> tuple[str, ...]:
        return tuple(st.layers[0] for st in self.stages[1:])

    def to_dict(self) -> dict:
        return {
            "pipeline": {
                "schedule": self.schedule,
                "n_microbatches": self.micro_batches,
                "notes": list(self.notes),
                "split_points_beginning": list(self.split_points),
                "expressible": self.expressible,
                "stages": [
                    {
                        "layers": [st.layers[0], st.layers[-1]],
                        "layer_count": len(st.layers),
                        "group": st.group or "root",
                        "ranks": list(st.ranks),
                        "refusal": st.refusal or None,
                        "export": None if st.export is None else st.export.to_dict(),
                    }
                    for st in self.stages
                ],
            }
        }


def pipeline_export(problem: Problem, plan) -> PipelineExport:
    """A :class:`~parplan.costmodel.stages.PipelinePlan` for ``torch.distributed.pipelining``:
    per stage its layers, ranks and :func:`torch_export` of its plan on its group."""
    from parplan.costmodel.stages import stage_problem, tied_sync_seconds

    order = problem.graph.analyze().order
    leaves = _leaf_paths(problem.array)
    stages = []
    for st in plan.stages:
        sub = stage_problem(problem, st.first, st.last, st.group)
        ranks = tuple(i for i, path in enumerate(leaves) if path.startswith(st.group))
        try:
            e, why = torch_export(sub, st.plan), ""
        except ConfigError as exc:
            e, why = None, str(exc)
        stages.append(StageExport(tuple(order[st.first : st.last + 1]), st.group, ranks, e, why))
    notes = ()
    if tied_sync_seconds(problem, plan) > 0.0:
        notes = (
            "weights tied across stages (a table and a head): torch.distributed.pipelining does not keep them "
            "equal; all-reduce their gradients between the two stages each step, as parplan prices it",
        )
    return PipelineExport(tuple(stages), SCHEDULES[plan.schedule], problem.micro_batches, notes)


def mesh_of(problem: Problem) -> tuple[int, ...] | None:
    """``(2,) * depth`` where the array is a full binary tree of ``2^depth`` devices, else None."""
    depths = {len(path) for path in _leaf_paths(problem.array)}
    if len(depths) != 1:
        return None
    return (2,) * depths.pop()


def _leaf_paths(array) -> list[str]:
    """Every device's path, left to right (its rank in a row-major mesh of the tree's levels)."""
    from parplan.formulation.joint import groups_by_path

    return [path for path, group in groups_by_path(array).items() if group.is_leaf]


def _kind(layer) -> str:
    return type(layer).__name__.lower()


def torch_export(problem: Problem, plan: Plan) -> TorchExport:
    """``plan`` as DTensor placements on a mesh of ``problem.array`` (module docstring)."""
    if not isinstance(plan, Plan):
        raise ConfigError(
            "export: a pipeline plan goes to pipeline_export (its stages, each exported on its group)"
        )
    mesh = mesh_of(problem)
    if mesh is None:
        raise ConfigError(
            f"export: array {problem.array.describe()} is not a full binary tree of 2^d devices; "
            "a DeviceMesh is a grid, so only such arrays export"
        )
    pg = problem.planning
    depth = len(mesh)
    names = tuple(f"l{k + 1}" for k in range(depth))
    refusals: list[tuple[str, str, str]] = []
    layers = []
    names_of = {layer.name for layer in problem.graph.layers}
    for v, node in enumerate(pg.nodes):
        layer = problem.graph.layer(node.name)
        per_level = []
        for k in range(depth):
            paths = [
                p
                for p, _ in problem.array.inner_nodes()
                if len(p) == k and has_work(plan.splits, p, v)
            ]
            seen = {plan.splits[p].choices[v] for p in paths}
            for p in paths:
                a = plan.splits[p].shares[v]
                if a != 0.5:
                    what = (
                        "leaves the layer on one half"
                        if a in (0.0, 1.0)
                        else f"gives the left half {a:g}"
                    )
                    refusals.append((node.name, p, f"{what}; DTensor shards evenly"))
            if len(seen) > 1:
                refusals.append(
                    (
                        node.name,
                        paths[0],
                        f"the groups of level {k + 1} split it differently "
                        f"({', '.join(sorted(c.value for c in seen))}); a placement "
                        "holds for a whole mesh dimension",
                    )
                )
            per_level.append(
                Counter(plan.splits[p].choices[v] for p in paths).most_common(1)[0][0]
                if paths
                else (Layout.ROWS if node.is_join else B)
            )
        cut = 2 ** sum(c is O for c in per_level)
        for op in (
            node.dims.out_ops
        ):  # attention after an OUT split: every part must hold whole key/value groups
            inner = problem.graph.layer(op.name) if op.name in names_of else None
            if isinstance(inner, Attention) and inner.key_heads % cut:
                refusals.append(
                    (
                        node.name,
                        "",
                        f"its attention '{op.name}' has {inner.key_heads} key/value groups, "
                        f"which {cut} parts of an OUT split cannot hold whole",
                    )
                )
        if isinstance(layer, Conv2d) and any(c in (I, O) for c in per_level):
            refusals.append(
                (
                    node.name,
                    "",
                    "DTensor shards conv2d over the batch only (no input- or output-channel "
                    "sharding)",
                )
            )
        layers.append(_layer_export(node, layer, per_level, names, problem.zero_stage))
    notes = []
    for layer in problem.graph.layers:
        if isinstance(layer, Glu) and layer.inputs[0] in names_of:
            fused = next((e for e in layers if e.name == layer.inputs[0]), None)
            if fused is not None and "out" in fused.choices:
                notes.append(
                    f"'{fused.name}' is a fused gate/up projection split by OUT: shard its gate rows and its "
                    "up rows each by Shard(0) (ColwiseParallel on gate_proj and on up_proj), so that each "
                    f"part of '{layer.name}' holds its gate and up columns"
                )
    if problem.micro_batches > 1:
        notes.append(
            f"{problem.micro_batches} micro-batches: accumulate gradients over them before the step"
        )
    return TorchExport(
        mesh,
        names,
        tuple(layers),
        tuple(refusals),
        problem.zero_stage,
        problem.micro_batches,
        tuple(notes),
    )


def _layer_export(node, layer, per_level, names, zero_stage: int) -> LayerExport:
    weighted = not node.is_join
    table = isinstance(layer, Embedding)
    weight = tuple((TABLE if table else WEIGHT)[c] for c in per_level) if weighted else None
    split = [(n, c) for n, c in zip(names, per_level) if c in (I, O)]
    if not weighted:
        style = "join: " + "/".join(c.value for c in per_level)
    elif not split:
        style = "data parallel" if len(names) else "one device"
    elif len(split) == 1:
        n, c = split[0]
        rest = [x for x in names if x != n]
        style = f"{STYLE[c]} on {n}" + (f", data parallel on {', '.join(rest)}" if rest else "")
    else:
        style = "DTensor placements (split on " + ", ".join(n for n, _ in split) + ")"
    fsdp = tuple(n for n, c in zip(names, per_level) if c is B) if weighted and zero_stage else ()
    return LayerExport(
        node.name,
        _kind(layer),
        tuple(c.value for c in per_level),
        weight,
        tuple(NEED[c] for c in per_level),
        tuple(GIVE[c] for c in per_level),
        style,
        fsdp,
        tuple(getattr(layer, "fuses", ())),
    )


def nearest_plan(problem: Problem, plan: Plan) -> Plan:
    """The closest plan :func:`torch_export` accepts: every share 1/2, every group of a level
    with the level's most common choice for the layer, convolutions split by the batch."""
    export = torch_export(problem, plan)
    n = len(problem.planning.nodes)
    splits = {}
    for path, _ in problem.array.inner_nodes():
        k = len(path)
        choices = []
        for v in range(n):
            c = (
                PartitionType(export.layers[v].choices[k])
                if not problem.planning.nodes[v].is_join
                else Layout(export.layers[v].choices[k])
            )
            if isinstance(problem.graph.layer(problem.planning.nodes[v].name), Conv2d) and c in (
                I,
                O,
            ):
                c = B
            choices.append(c)
        splits[path] = Split(tuple(choices), (0.5,) * n)
    return Plan(
        splits,
        planner=f"{plan.planner or 'plan'}-torch",
        info={"nearest_to": plan.planner or "plan"},
    )


__all__ = [
    "GIVE",
    "LayerExport",
    "NEED",
    "PLACEMENT",
    "PipelineExport",
    "StageExport",
    "TABLE",
    "TorchExport",
    "WEIGHT",
    "mesh_of",
    "nearest_plan",
    "pipeline_export",
    "torch_export",
]
