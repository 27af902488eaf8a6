"""The hand-written plan practitioners start from (Megatron-LM, torchtitan): tensor parallelism
inside a node, data parallelism across nodes. A baseline to hold parplan's plans against.

The lowest ``tensor_levels`` split levels of the array are tensor-parallel, every level above
them data-parallel (every node BATCH, every join ROWS), all at share 1/2. Inside a tensor level
the weighted layers alternate as Megatron-LM pairs them (Shoeybi et al. 2019, section 3): a
layer that reads a column-parallel layer's output (through element-wise ops only: attention,
a gated unit) is *row-parallel* (IN: it reads its input's columns and leaves a partial sum,
reduced once); every other weighted layer is *column-parallel* (OUT); joins (residual adds)
are WHOLE, as Megatron keeps the residual stream replicated. On a Llama block this is q/k/v
and gate/up column-parallel, o and down row-parallel, and the LM head column-parallel over the
vocabulary.

Example (Llama-3-8B on 8 H100s: data 2 x tensor 4):
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> p = Problem(get_model("llama3-8b"), parse_array("h100:8"), batch=16)
    >>> plan = megatron_plan(p, tensor_levels=2)
    >>> [c.value for c in plan.splits["L"].choices[:6]], plan.splits[""].choices[0].value
    (['out', 'in', 'whole', 'out', 'in', 'whole'], 'batch')
"""

from __future__ import annotations

from parplan.costmodel.layout import Layout, PartitionType
from parplan.costmodel.problem import Plan, Problem, Split
from parplan.errors import ConfigError


def tensor_choices(problem: Problem) -> tuple:
    """Each planning node's choice at a tensor-parallel level (module docstring)."""
    nodes = problem.planning.nodes
    out = []
    for node in nodes:
        if node.is_join:
            out.append(Layout.WHOLE)
            continue
        reads_column = bool(node.preds) and all(
            not nodes[p].is_join and out[p] is PartitionType.OUT for p in node.preds
        )
        out.append(PartitionType.IN if reads_column else PartitionType.OUT)
    return tuple(out)


#: torch.distributed.tensor.parallel styles (lower case, "Parallel" dropped) -> a tensor level's choice.
STYLE_CHOICES = {"colwise": PartitionType.OUT, "rowwise": PartitionType.IN}
#: torch's style classes -> the names tensor plans use (``prepare``: layouts only; ``sequence``:
#: sequence parallelism, which parplan does not model).
TORCH_STYLES = {
    "ColwiseParallel": "colwise",
    "RowwiseParallel": "rowwise",
    "SequenceParallel": "sequence",
    "PrepareModuleInput": "prepare",
    "PrepareModuleOutput": "prepare",
    "PrepareModuleInputOutput": "prepare",
}


def styled_choices(problem: Problem, styles) -> tuple:
    """Each planning node's choice at a tensor-parallel level from a ``parallelize_module`` plan:
    ``styles`` is ``(pattern, style)`` pairs in order (the first whose ``fnmatch`` pattern matches
    a weighted layer's name decides; ``prepare`` entries only set layouts and are skipped).
    ``colwise`` is OUT, ``rowwise`` IN; joins keep the residual stream replicated (WHOLE).
    Sequence parallelism and weighted layers no style names are refused by name: torch runs an
    unnamed layer whole on every tensor-parallel rank, which no parplan choice does."""
    from fnmatch import fnmatchcase

    out, unmatched = [], []
    for node in problem.planning.nodes:
        if node.is_join:
            out.append(Layout.WHOLE)
            continue
        style = next(
            (st for pattern, st in styles if st != "prepare" and fnmatchcase(node.name, pattern)),
            None,
        )
        if style == "sequence":
            raise ConfigError(
                f"tensor plan: '{node.name}' is SequenceParallel; parplan does not model sequence "
                "parallelism"
            )
        if style not in STYLE_CHOICES:
            unmatched.append(node.name)
            out.append(PartitionType.BATCH)
            continue
        out.append(STYLE_CHOICES[style])
    if unmatched:
        shown = ", ".join(unmatched[:4]) + (
            f" and {len(unmatched) - 4} more" if len(unmatched) > 4 else ""
        )
        raise ConfigError(
            f"tensor plan: no colwise or rowwise style for {shown}; torch would run each whole on every "
            "tensor-parallel rank, which no parplan choice does: give each a style"
        )
    return tuple(out)


def megatron_plan(problem: Problem, tensor_levels: int, styles=None) -> Plan:
    """Tensor parallelism on the lowest ``tensor_levels`` levels of every root-leaf path, data
    parallelism above (module docstring). ``styles``: a ``parallelize_module`` plan's
    ``(pattern, style)`` pairs for the tensor levels instead of Megatron's pairing
    (:func:`styled_choices`)."""
    depth = problem.array.depth
    if (
        isinstance(tensor_levels, bool)
        or not isinstance(tensor_levels, int)
        or not 0 <= tensor_levels <= depth
    ):
        raise ConfigError(
            f"tensor_levels must be an integer in [0, {depth}] for {problem.array.describe()} "
            f"(got {tensor_levels!r})"
        )
    nodes = problem.planning.nodes
    n = len(nodes)
    tensor = Split(
        styled_choices(problem, styles) if styles else tensor_choices(problem), (0.5,) * n
    )
    data = Split(
        tuple(Layout.ROWS if v.is_join else PartitionType.BATCH for v in nodes), (0.5,) * n
    )
    splits = {}
    for path, group in problem.array.inner_nodes():
        splits[path] = tensor if group.depth <= tensor_levels else data
    tp = 2**tensor_levels
    return Plan(
        splits,
        planner="megatron",
        info={"tensor_parallel": tp, "data_parallel": problem.array.count // tp},
    )


__all__ = ["STYLE_CHOICES", "TORCH_STYLES", "megatron_plan", "styled_choices", "tensor_choices"]
