"""The parallel configurations users run (Megatron-LM, torchtitan) as parplan plans (issue 33).

A :class:`ParallelConfig` is tensor x pipeline x data degrees, the ZeRO stage, recomputation,
the micro-batch size and the global batch, and the pipeline schedule. :func:`config_plan` makes
it a :class:`~parplan.costmodel.stages.PipelinePlan` on an array, priced by parplan's model
(docs/costmodel.md section 11):

- ``pipeline`` stages on the groups of depth ``log2(pipeline)`` of the array's tree, the layers
  divided as evenly as the cut points allow (Megatron-LM divides the transformer layers evenly;
  the embedding goes with the first stage and the head with the last);
- inside each stage :func:`~parplan.solvers.megatron.megatron_plan`: tensor parallelism on the
  lowest ``log2(tensor)`` levels (column- then row-parallel pairs, residual stream replicated),
  data parallelism above (``data`` replicas);
- ``global_batch / (micro_batch_size x data)`` micro-batches per step.

:func:`read_config` reads one from a file or a ``key=value,...`` string, in parplan's short keys
(``tp``, ``pp``, ``dp``, ``zero``, ``recompute``, ``mbs``, ``gbs``, ``schedule``), Megatron-LM's
argument names (``tensor_model_parallel_size``, ``pipeline_model_parallel_size``,
``micro_batch_size``, ``global_batch_size``, ``recompute_activations`` or
``recompute_granularity``, ``use_distributed_optimizer``; dashes or underscores) or
torchtitan's TOML sections (``[parallelism]`` ``tensor_parallel_degree``,
``pipeline_parallel_degree``, ``data_parallel_shard_degree`` (FSDP: ZeRO-3),
``data_parallel_replicate_degree``, ``pipeline_parallel_schedule``,
``pipeline_parallel_microbatch_size``; ``[training]`` ``global_batch_size``,
``local_batch_size``; ``[activation_checkpoint]`` ``mode``). What parplan does not model is
refused by name (sequence, context and expert parallelism, interleaved schedules).

Example (Megatron-style tensor 4 x data 4 with recomputation, Llama-3-8B on two H100 nodes):
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.costmodel.stages import evaluate_pipeline
    >>> cfg = read_config("tp=4,dp=4,zero=1,recompute=yes,mbs=1,gbs=32")
    >>> p, plan = config_plan(Problem(get_model("llama3-8b"), parse_array("h100:16"), batch=32), cfg)
    >>> p.micro_batches, p.recompute, len(plan.stages), plan.stages[0].plan.info["tensor_parallel"]
    (8, True, 1, 4)
    >>> evaluate_pipeline(p, plan).step_time_s > 0
    True
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

from parplan.costmodel.problem import ZERO_STAGES, Plan, Problem
from parplan.costmodel.stages import (
    SCHEDULES,
    PipelinePlan,
    Stage,
    even_ends,
    groups_at,
    stage_problem,
)
from parplan.errors import ConfigError
from parplan.readers import parse_json, parse_toml, read_text
from parplan.solvers.megatron import TORCH_STYLES, megatron_plan


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees, memory settings, batch sizes and schedule of a run (module docstring); ``data``
    None: the devices left over; ``global_batch`` None: the problem's batch."""

    tensor: int = 1
    pipeline: int = 1
    data: int | None = None
    zero_stage: int = 0
    recompute: bool = False
    micro_batch_size: int | None = None
    global_batch: int | None = None
    schedule: str = "1f1b"
    source: str = ""
    #: a ``parallelize_module`` plan for the tensor levels: (module pattern, style) pairs in order
    #: (:func:`read_tensor_plan`); empty: Megatron-LM's column/row pairing
    styles: tuple[tuple[str, str], ...] = ()

    def label(self) -> str:
        parts = [
            f"TP{self.tensor}",
            f"PP{self.pipeline}",
            f"DP{self.data if self.data is not None else '?'}",
            f"ZeRO-{self.zero_stage}",
        ] + (["recompute"] if self.recompute else [])
        if self.micro_batch_size is not None:
            parts.append(f"micro-batch {self.micro_batch_size}")
        if self.styles:
            parts.append(f"tensor plan of {len(self.styles)} patterns")
        return ", ".join(parts)


#: Keys read from flat configs (parplan's short names and Megatron-LM's argument names) -> field.
_FLAT = {
    "tp": "tensor",
    "tensor": "tensor",
    "tensor_parallel": "tensor",
    "tensor_model_parallel_size": "tensor",
    "pp": "pipeline",
    "pipeline": "pipeline",
    "pipeline_parallel": "pipeline",
    "pipeline_model_parallel_size": "pipeline",
    "dp": "data",
    "data": "data",
    "data_parallel": "data",
    "data_parallel_size": "data",
    "zero": "zero_stage",
    "zero_stage": "zero_stage",
    "recompute": "recompute",
    "recompute_activations": "recompute",
    "recompute_granularity": "recompute",
    "mbs": "micro_batch_size",
    "micro_batch_size": "micro_batch_size",
    "gbs": "global_batch",
    "global_batch": "global_batch",
    "global_batch_size": "global_batch",
    "schedule": "schedule",
    "use_distributed_optimizer": "use_distributed_optimizer",
}
#: Keys whose presence with a value other than these parplan cannot model.
_REFUSED = {
    "sequence_parallel": (False, "sequence parallelism"),
    "context_parallel_size": (1, "context parallelism"),
    "context_parallel_degree": (1, "context parallelism"),
    "expert_model_parallel_size": (1, "expert parallelism"),
    "expert_parallel_degree": (1, "expert parallelism"),
    "virtual_pipeline_model_parallel_size": (None, "interleaved (virtual) pipeline stages"),
}


def _key(k: str) -> str:
    return str(k).strip().lower().replace("-", "_").lstrip("_")


def _flag(value, where: str, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("yes", "true", "1", "on", "full", "selective"):
        return True
    if text in ("no", "false", "0", "off", "none", ""):
        return False
    raise ConfigError(f"{where}: {key} must be yes or no (got {value!r})")


def _int(value, where: str, key: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be a positive integer (got {value!r})")
    try:
        n = int(str(value).strip())
    except ValueError:
        raise ConfigError(f"{where}: {key} must be a positive integer (got {value!r})") from None
    if n < 1:
        raise ConfigError(f"{where}: {key} must be a positive integer (got {value!r})")
    return n


def _flat(entries: dict, where: str) -> ParallelConfig:
    fields: dict = {}
    distributed_optimizer = False
    for raw, value in entries.items():
        key = _key(raw)
        if key in _REFUSED:
            allowed, what = _REFUSED[key]
            if value not in (allowed, None, False, 0, 1) or (
                allowed is None and value not in (None, 1)
            ):
                raise ConfigError(f"{where}: {raw} = {value!r}: parplan does not model {what}")
            continue
        field = _FLAT.get(key)
        if key == "tensor_plan":
            fields["styles"] = _styles(value, f"{where}, tensor_plan")
            continue
        if field is None:
            continue  # the rest of a training config (learning rate, paths, ...)
        if field == "use_distributed_optimizer":
            distributed_optimizer = _flag(value, where, raw)
        elif field == "recompute":
            fields["recompute"] = _flag(value, where, raw)
        elif field == "schedule":
            name = str(value).strip().lower()
            if name not in SCHEDULES:
                raise ConfigError(
                    f"{where}: schedule {value!r}: parplan models {', '.join(SCHEDULES)}"
                )
            fields["schedule"] = name
        elif field == "zero_stage":
            z = _int(value, where, raw) if str(value).strip() != "0" else 0
            if z not in ZERO_STAGES:
                raise ConfigError(
                    f"{where}: {raw} must be one of {', '.join(map(str, ZERO_STAGES))} (got {value!r})"
                )
            fields["zero_stage"] = z
        else:
            fields[field] = _int(value, where, raw)
    if distributed_optimizer and "zero_stage" not in fields:
        fields["zero_stage"] = (
            1  # Megatron's distributed optimizer shards the optimizer state: ZeRO-1
        )
    return ParallelConfig(**fields, source=where)


def _torchtitan(doc: dict, where: str) -> ParallelConfig:
    par = doc.get("parallelism") or {}
    training = doc.get("training") or {}
    checkpoint = doc.get("activation_checkpoint") or {}
    for key in ("context_parallel_degree", "expert_parallel_degree"):
        if int(par.get(key, 1) or 1) > 1:
            raise ConfigError(
                f"{where}: [parallelism] {key} = {par[key]}: parplan does not model "
                f"{_REFUSED[key][1]}"
            )
    shard = int(par.get("data_parallel_shard_degree", -1) or -1)
    replicate = int(par.get("data_parallel_replicate_degree", 1) or 1)
    schedule = str(par.get("pipeline_parallel_schedule", "1F1B")).strip().lower()
    if schedule not in SCHEDULES:
        raise ConfigError(
            f"{where}: pipeline_parallel_schedule {par['pipeline_parallel_schedule']!r}: parplan models "
            f"{', '.join(s.upper() if s == '1f1b' else 'GPipe' for s in SCHEDULES)}"
        )
    fields = {
        "tensor": _int(par.get("tensor_parallel_degree", 1), where, "tensor_parallel_degree"),
        "pipeline": _int(par.get("pipeline_parallel_degree", 1), where, "pipeline_parallel_degree"),
        "schedule": schedule,
        "recompute": str(checkpoint.get("mode", "none")).lower() in ("full", "selective"),
        # FSDP shards over its shard degree (ZeRO-3); pure replication is DDP
        "zero_stage": 3 if shard != 1 else 0,
    }
    if shard > 0:
        fields["data"] = shard * replicate
    if "global_batch_size" in training and int(training["global_batch_size"]) > 0:
        fields["global_batch"] = _int(training["global_batch_size"], where, "global_batch_size")
    if "pipeline_parallel_microbatch_size" in par:
        fields["micro_batch_size"] = _int(
            par["pipeline_parallel_microbatch_size"], where, "pipeline_parallel_microbatch_size"
        )
    elif "local_batch_size" in training and fields["pipeline"] == 1:
        fields["micro_batch_size"] = _int(training["local_batch_size"], where, "local_batch_size")
    return ParallelConfig(**fields, source=where)


def read_config(spec) -> ParallelConfig:
    """A config from a ``.toml`` / ``.json`` file (flat keys, or torchtitan's sections) or a
    ``key=value,...`` string (module docstring)."""
    if isinstance(spec, ParallelConfig):
        return spec
    text = str(spec)
    path = Path(text)
    if path.suffix.lower() in (".toml", ".json") or path.is_file():
        where = f"config '{path}'"
        body = read_text(path, "config file")
        doc = parse_json(body, where) if path.suffix.lower() == ".json" else parse_toml(body, where)
        if not isinstance(doc, dict):
            raise ConfigError(f"{where}: expected an object of settings")
        if "parallelism" in doc:
            return _torchtitan(doc, where)
        return _flat(doc, where)
    entries = {}
    for part in re.split(r"[,\s]+", text):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise ConfigError(
                f"config '{text}': expected key=value pairs such as tp=4,dp=4,zero=1 (or a .toml / "
                f".json file); '{part.strip()}' has no '='"
            )
        entries[key.strip()] = value.strip()
    if not entries:
        raise ConfigError("config: empty; give key=value pairs such as tp=4,dp=4,zero=1 or a file")
    return _flat(entries, f"config '{text}'")


def _styles(mapping, where: str) -> tuple[tuple[str, str], ...]:
    """(pattern, style) pairs from a mapping of module paths (``fnmatch`` patterns) to style names
    (``colwise``, ``rowwise``, ``sequence``, ``prepare``; torch's class names also)."""
    if not isinstance(mapping, dict) or not mapping:
        raise ConfigError(
            f"{where}: expected a table of module paths to styles (colwise, rowwise, ...)"
        )
    out = []
    for pattern, style in mapping.items():
        name = (
            TORCH_STYLES.get(type(style).__name__)
            if not isinstance(style, str)
            else TORCH_STYLES.get(style, style.strip().lower().removesuffix("parallel"))
        )
        if name not in ("colwise", "rowwise", "sequence", "prepare"):
            raise ConfigError(
                f"{where}: '{pattern}' = {style!r}: expected colwise, rowwise, sequence or prepare "
                "(torch's ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModule*)"
            )
        out.append((str(pattern), name))
    return tuple(out)


def read_tensor_plan(spec: str) -> tuple[tuple[str, str], ...]:
    """A ``parallelize_module`` plan: a ``.toml`` / ``.json`` table of module paths (``fnmatch``
    patterns such as ``layers.*.qkv``) to styles (or one under ``tensor_plan``), or
    ``file.py:NAME``, a Python file whose dict ``NAME`` maps module paths to torch's style
    objects (the file is run, as ``file.py:factory`` model specs are)."""
    text = str(spec)
    file, sep, name = text.rpartition(":")
    if sep and file.endswith(".py"):
        import runpy

        if not Path(file).is_file():
            raise ConfigError(f"tensor plan '{text}': no file {file}")
        try:
            scope = runpy.run_path(file)
        except Exception as exc:  # noqa: BLE001 - the user's file: say what it raised
            raise ConfigError(
                f"tensor plan '{text}': running {file} raised {type(exc).__name__}: {exc}"
            ) from None
        if name not in scope:
            raise ConfigError(f"tensor plan '{text}': {file} defines no '{name}'")
        return _styles(scope[name], f"tensor plan '{text}'")
    path = Path(text)
    where = f"tensor plan '{path}'"
    body = read_text(path, "tensor plan")
    doc = parse_json(body, where) if path.suffix.lower() == ".json" else parse_toml(body, where)
    if isinstance(doc, dict) and isinstance(doc.get("tensor_plan"), dict):
        doc = doc["tensor_plan"]
    return _styles(doc, where)


def _levels(n: int, what: str) -> int:
    k = int(round(math.log2(n)))
    if 2**k != n:
        raise ConfigError(
            f"{what} degree {n} is not a power of two: parplan's groups halve the array"
        )
    return k


def config_plan(problem: Problem, config: ParallelConfig) -> tuple[Problem, PipelinePlan]:
    """The problem with the config's settings (batch, micro-batches, ZeRO, recomputation) and
    its plan (module docstring). Raises :class:`ConfigError` naming what does not fit the array."""
    config = read_config(config)
    n = problem.array.count
    tp, pp = config.tensor, config.pipeline
    tensor_levels, depth = _levels(tp, "tensor"), _levels(pp, "pipeline")
    if n % (tp * pp):
        raise ConfigError(
            f"{config.label()}: tensor x pipeline = {tp * pp} does not divide the {n} devices of "
            f"{problem.array.describe()}"
        )
    dp = config.data if config.data is not None else n // (tp * pp)
    if tp * pp * dp != n:
        raise ConfigError(
            f"{config.label()}: tensor x pipeline x data = {tp * pp * dp}, but "
            f"{problem.array.describe()} has {n} devices"
        )
    config = replace(config, data=dp)
    batch = config.global_batch or problem.batch
    mbs = config.micro_batch_size or batch // dp
    if batch % (mbs * dp):
        raise ConfigError(
            f"{config.label()}: global batch {batch} is not a multiple of micro-batch size {mbs} x "
            f"data {dp}"
        )
    p = replace(
        problem,
        batch=batch,
        micro_batches=batch // (mbs * dp),
        zero_stage=config.zero_stage,
        recompute=config.recompute,
    )
    groups = groups_at(problem.array, depth)
    if len(groups) != pp:
        raise ConfigError(
            f"{config.label()}: {problem.array.describe()} has no {pp} groups of {n // pp} devices "
            "to hold the pipeline's stages"
        )
    if any(problem.array.at(g).count != n // pp for g in groups):
        raise ConfigError(
            f"{config.label()}: the groups of depth {depth} of {problem.array.describe()} are not "
            f"{pp} equal groups of {n // pp} devices"
        )
    ends = even_ends(problem.graph, pp)
    stages, first = [], 0
    for path, last in zip(groups, ends):
        sub = stage_problem(p, first, last, path)
        if sub.array.depth < tensor_levels:
            raise ConfigError(
                f"{config.label()}: a stage's group {sub.array.describe()} cannot hold tensor degree {tp}"
            )
        plan = (
            megatron_plan(sub, tensor_levels, config.styles)
            if not sub.array.is_leaf
            else Plan({}, planner="megatron", info={"tensor_parallel": 1})
        )
        stages.append(Stage(first, last, path, plan))
        first = last + 1
    return p, PipelinePlan(
        tuple(stages),
        schedule=config.schedule,
        planner="config",
        info={"config": config.label(), "source": config.source},
    )


__all__ = ["ParallelConfig", "config_plan", "read_config", "read_tensor_plan"]
