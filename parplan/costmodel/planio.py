"""Plan files: a plan with what it was made for, as versioned JSON (docs/planfile.md).

A plan file records the problem (model name and the source it was loaded from, array, batch,
element and optimizer sizes, the planning nodes' names), the planner and its options, every
split's types and shares, the step time it was priced at, the certificate when an exact
solver made it, and the parplan version. :func:`plan_document` builds the JSON object,
:func:`read_plan_file` reads and validates one, and :func:`check_plan_fits` says precisely why
a plan does not fit a problem (other layers, other array) before anything is priced.

Example:
    >>> from parplan.models.zoo import get_model
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Plan, Problem, Split
    >>> from parplan.costmodel.layout import PartitionType
    >>> p = Problem(get_model("lenet"), parse_array("h100:2"), batch=64)
    >>> n = len(p.planning.nodes)
    >>> plan = Plan({"": Split((PartitionType.BATCH,) * n, (0.5,) * n)}, planner="data")
    >>> doc = plan_document(p, plan)
    >>> doc["format"], doc["schema_version"], doc["problem"]["batch"]
    ('parplan-plan', 1, 64)
    >>> read_plan_document(doc, "doc").plan == plan
    True
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from parplan.costmodel.layout import Layout, PartitionType
from parplan.costmodel.problem import Plan, Problem, Split
from parplan.costmodel.stages import PipelinePlan, Stage
from parplan.errors import ConfigError
from parplan.readers import parse_json, read_text

FORMAT = "parplan-plan"
SCHEMA_VERSION = 1
#: Keys of the "problem" object; ``*_source`` are what the user typed (may be None).
PROBLEM_KEYS = (
    "model",
    "model_source",
    "array",
    "array_source",
    "bandwidth_gb_per_s",
    "latency_us",
    "fabric",
    "devices_file",
    "devices",
    "batch",
    "bytes_per_element",
    "optimizer_bytes_per_param",
    "compat",
    "zero_stage",
    "recompute",
    "checkpoint",
    "micro_batches",
    "overlap",
    "nodes",
)

_CHOICES = {c.value: c for c in (*PartitionType, *Layout)}


def parplan_version() -> str:
    from importlib import metadata  # on use: slow to import, and most commands never save

    try:
        return metadata.version("parplan")
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


@dataclass(frozen=True)
class ProblemSource:
    """How a problem was built from user input, so that a plan file can rebuild it."""

    model: str | None = None
    array: str | None = None
    bandwidth_gb_per_s: float | None = None
    latency_us: float | None = None
    devices_file: str | None = None
    #: ``parse_array``'s fabric (docs/costmodel.md section 4).
    fabric: str = "devices"


@dataclass(frozen=True)
class PlanFile:
    """A plan read from a file, with the problem description and records that came with it."""

    plan: Plan | None
    problem: Mapping[str, Any]
    evaluation: Mapping[str, Any] | None = None
    certificate: Mapping[str, Any] | None = None
    parplan_version: str = "unknown"
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: A pipeline plan file's plan (docs/planfile.md "Pipeline plans"); ``plan`` is then None.
    pipeline: PipelinePlan | None = None

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self.problem["nodes"])


def _finite(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None


def plan_document(
    problem: Problem,
    plan: Plan,
    source: ProblemSource | None = None,
    evaluation: Mapping[str, Any] | None = None,
    certificate: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict:
    """The JSON object of a plan file (see the module docstring)."""
    source = source or ProblemSource()
    nodes = [n.name for n in problem.planning.nodes]
    doc = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "parplan_version": parplan_version(),
        "problem": {
            "model": problem.graph.name,
            "model_source": source.model,
            "array": problem.array.describe(),
            "array_source": source.array,
            "bandwidth_gb_per_s": source.bandwidth_gb_per_s,
            "latency_us": source.latency_us,
            "fabric": source.fabric,
            "devices_file": source.devices_file,
            "devices": problem.array.count,
            "batch": problem.batch,
            "bytes_per_element": problem.bytes_per_element,
            "optimizer_bytes_per_param": problem.optimizer_bytes_per_param,
            "compat": problem.compat,
            "zero_stage": problem.zero_stage,
            "recompute": problem.recompute,
            "checkpoint": problem.checkpoint,
            "micro_batches": problem.micro_batches,
            "overlap": problem.overlap,
            "nodes": nodes,
        },
        "planner": plan.planner,
        "options": {k: _jsonable(v) for k, v in plan.info.items()},
        "splits": {
            path or "root": {
                "types": [c.value for c in split.choices],
                "shares": [float(a) for a in split.shares],
            }
            for path, split in sorted(plan.splits.items(), key=lambda kv: (len(kv[0]), kv[0]))
        },
        "evaluation": None
        if evaluation is None
        else {k: _jsonable(v) for k, v in evaluation.items()},
        "certificate": None
        if certificate is None
        else {k: _jsonable(v) for k, v in certificate.items()},
    }
    if extra:
        doc["extra"] = {k: _jsonable(v) for k, v in extra.items()}
    return doc


def pipeline_document(
    problem: Problem,
    plan: PipelinePlan,
    source: ProblemSource | None = None,
    evaluation: Mapping[str, Any] | None = None,
) -> dict:
    """The JSON object of a pipeline plan file: the problem record of :func:`plan_document`, and
    under ``"pipeline"`` the schedule and each stage's layers, group and splits (docs/planfile.md)."""
    from parplan.costmodel.stages import stage_problem

    order = problem.graph.analyze().order
    doc = plan_document(problem, Plan({}, planner=plan.planner, info=plan.info), source, evaluation)
    del doc["splits"]
    doc["problem"]["layers"] = list(order)
    stages = []
    for stage in plan.stages:
        sub = stage_problem(problem, stage.first, stage.last, stage.group)
        part = plan_document(sub, stage.plan)
        stages.append(
            {
                "first_layer": order[stage.first],
                "last_layer": order[stage.last],
                "group": stage.group or "root",
                "nodes": part["problem"]["nodes"],
                "splits": part["splits"],
            }
        )
    doc["pipeline"] = {"schedule": plan.schedule, "stages": stages}
    return doc


def _read_pipeline(doc: dict, problem: Mapping[str, Any], where: str) -> PipelinePlan:
    raw = doc["pipeline"]
    if not isinstance(raw, dict) or not isinstance(raw.get("stages"), list) or not raw["stages"]:
        raise ConfigError(f'{where}: "pipeline" must be an object with a non-empty "stages" list')
    layers = problem.get("layers")
    if not isinstance(layers, list) or not all(isinstance(n, str) for n in layers):
        raise ConfigError(f'{where}: a pipeline plan\'s "problem" needs the "layers" list')
    position = {name: k for k, name in enumerate(layers)}
    stages = []
    for i, st in enumerate(raw["stages"]):
        at = f"{where}: stage {i}"
        if not isinstance(st, dict):
            raise ConfigError(f"{at}: must be an object")
        first, last, group = st.get("first_layer"), st.get("last_layer"), st.get("group")
        if first not in position or last not in position:
            raise ConfigError(f'{at}: "first_layer" and "last_layer" must name layers of the model')
        if not isinstance(group, str) or (group != "root" and set(group) - {"L", "R"}):
            raise ConfigError(f"{at}: \"group\" is 'root' or a string of L and R")
        part = read_plan_document(
            {
                "format": FORMAT,
                "schema_version": SCHEMA_VERSION,
                "problem": {"nodes": st.get("nodes")},
                "splits": st.get("splits"),
            },
            at,
            allow_empty=True,
        )
        stages.append(
            Stage(position[first], position[last], "" if group == "root" else group, part.plan)
        )
    schedule = raw.get("schedule", "1f1b")
    plan = PipelinePlan(
        tuple(stages),
        schedule=schedule,
        planner=doc.get("planner") or "",
        info=doc.get("options") or {},
    )
    return plan


def stage_nodes(problem: Problem, plan: PipelinePlan) -> list[tuple[str, ...]]:
    """Each stage's planning-node names on ``problem`` (what its splits are listed by)."""
    from parplan.costmodel.stages import stage_problem

    return [
        tuple(n.name for n in stage_problem(problem, s.first, s.last, s.group).planning.nodes)
        for s in plan.stages
    ]


def _jsonable(v: Any) -> Any:
    if isinstance(v, (PartitionType, Layout)):
        return v.value
    if hasattr(v, "value") and not isinstance(v, (int, float, str, bool)):
        return v.value  # other enums (objective, share mode)
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if v is None or isinstance(v, (int, str, bool)):
        return v
    if hasattr(v, "item"):  # numpy scalars
        return _jsonable(v.item())
    return str(v)


def write_plan_file(path: str | Path, document: Mapping[str, Any]) -> Path:
    """Write ``document`` as JSON to ``path``; a bad path is a :class:`ConfigError` naming it."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(
            f"plan file '{path}' is a directory; give a file name such as {path / 'plan.json'}"
        )
    try:
        path.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write plan file '{path}': {exc.strerror or exc}") from None
    return path


def save_plan(path: str | Path, problem: Problem, plan: Plan, **records) -> Path:
    """Write ``plan`` for ``problem`` as a plan file (docs/planfile.md); ``records`` are
    :func:`plan_document`'s keyword arguments (``source``, ``evaluation``, ...)."""
    return write_plan_file(path, plan_document(problem, plan, **records))


def load_plan(path: str | Path) -> Plan:
    """The partition plan of a plan file (with its problem record: :func:`read_plan_file`)."""
    saved = read_plan_file(path)
    if saved.plan is None:
        raise ConfigError(
            f"plan file '{path}' holds a pipeline plan; read it with read_plan_file(path).pipeline"
        )
    return saved.plan


def read_plan_file(path: str | Path) -> PlanFile:
    """Read and validate a plan file. Every defect is a :class:`ConfigError` naming the file."""
    where = f"plan file '{path}'"
    doc = parse_json(read_text(path, "plan file"), where)
    return read_plan_document(doc, where)


def read_plan_document(doc: Any, where: str, allow_empty: bool = False) -> PlanFile:
    """Validate a plan file's JSON object (see :func:`read_plan_file`); ``allow_empty``: a plan
    with no split (a pipeline stage on one device)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f'{where}: not a parplan plan file (no "format": "{FORMAT}")')
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ConfigError(
            f"{where}: schema_version {version!r} is not supported (this parplan reads "
            f"{SCHEMA_VERSION})"
        )
    problem = doc.get("problem")
    if (
        not isinstance(problem, dict)
        or not isinstance(problem.get("nodes"), list)
        or not all(isinstance(n, str) for n in problem["nodes"])
    ):
        raise ConfigError(
            f'{where}: "problem" must be an object with a "nodes" list of layer names'
        )
    nodes = problem["nodes"]
    if "pipeline" in doc:
        pipeline = _read_pipeline(doc, problem, where)
        return PlanFile(
            plan=None,
            problem=problem,
            evaluation=doc.get("evaluation"),
            parplan_version=str(doc.get("parplan_version", "unknown")),
            extra=doc.get("extra") or {},
            pipeline=pipeline,
        )
    raw = doc.get("splits")
    if allow_empty and raw == {}:
        return PlanFile(plan=Plan({}), problem=problem)
    if not isinstance(raw, dict) or "root" not in raw:
        raise ConfigError(f'{where}: "splits" must be an object with a "root" split')
    splits = {}
    for key, value in raw.items():
        at = f"{where}: split '{key}'"
        path = "" if key == "root" else key
        if path and set(path) - {"L", "R"}:
            raise ConfigError(f"{at}: a split path is 'root' or a string of L and R")
        if not isinstance(value, dict):
            raise ConfigError(f'{at}: must be an object with "types" and "shares"')
        types, shares = value.get("types"), value.get("shares")
        if (
            not isinstance(types, list)
            or not isinstance(shares, list)
            or not len(types) == len(shares) == len(nodes)
        ):
            raise ConfigError(
                f'{at}: "types" and "shares" must be lists of {len(nodes)} entries, one per node'
            )
        choices = []
        for name, t in zip(nodes, types):
            if t not in _CHOICES:
                raise ConfigError(
                    f"{at}: node '{name}' has type {t!r}; valid: {', '.join(_CHOICES)}"
                )
            choices.append(_CHOICES[t])
        for name, a in zip(nodes, shares):
            if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 <= a <= 1.0:
                raise ConfigError(
                    f"{at}: node '{name}' has share {a!r}; shares are numbers in [0, 1]"
                )
        splits[path] = Split(tuple(choices), tuple(float(a) for a in shares))
    options = doc.get("options") or {}
    if not isinstance(options, dict):
        raise ConfigError(f'{where}: "options" must be an object')
    planner = doc.get("planner") or ""
    if not isinstance(planner, str):
        raise ConfigError(f'{where}: "planner" must be a string')
    for key in ("evaluation", "certificate", "extra"):
        if doc.get(key) is not None and not isinstance(doc[key], dict):
            raise ConfigError(f'{where}: "{key}" must be an object or null')
    return PlanFile(
        plan=Plan(splits, planner=planner, info=options),
        problem=problem,
        evaluation=doc.get("evaluation"),
        certificate=doc.get("certificate"),
        parplan_version=str(doc.get("parplan_version", "unknown")),
        extra=doc.get("extra") or {},
    )


def check_plan_fits(
    problem: Problem, nodes: tuple[str, ...] | list[str], plan: Plan, where: str
) -> None:
    """Raise :class:`ConfigError` naming the first difference when ``plan`` (made for layers
    ``nodes``) does not fit ``problem``: other layers, or another array's groups."""
    mine = [n.name for n in problem.planning.nodes]
    if list(nodes) != mine:
        missing = [n for n in nodes if n not in set(mine)]
        extra = [n for n in mine if n not in set(nodes)]
        detail = []
        if missing:
            detail.append(
                f"layers only in the plan: {', '.join(missing[:5])}"
                + (" ..." if len(missing) > 5 else "")
            )
        if extra:
            detail.append(
                f"layers only in the model: {', '.join(extra[:5])}"
                + (" ..." if len(extra) > 5 else "")
            )
        if not detail:
            i = next(i for i, (a, b) in enumerate(zip(nodes, mine)) if a != b)
            detail.append(f"order differs at position {i}: '{nodes[i]}' vs '{mine[i]}'")
        raise ConfigError(
            f"{where} was made for other layers than model '{problem.graph.name}' "
            f"({len(nodes)} vs {len(mine)} planning nodes; {'; '.join(detail)})"
        )
    groups = {path for path, _ in problem.array.inner_nodes()}
    have = set(plan.splits)
    if groups != have:
        lack = sorted(groups - have, key=lambda p: (len(p), p))
        more = sorted(have - groups, key=lambda p: (len(p), p))
        what = []
        if lack:
            what.append(f"no split for group(s) {', '.join(p or 'root' for p in lack[:4])}")
        if more:
            what.append(f"splits for group(s) the array does not have: {', '.join(more[:4])}")
        raise ConfigError(
            f"{where} does not fit array {problem.array.describe()} ({problem.array.count} devices): "
            f"{'; '.join(what)}. A plan fits arrays with the same tree of groups; "
            "bandwidth, latency and device kinds may differ"
        )
