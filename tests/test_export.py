"""Export to PyTorch (docs/interop.md): plans as DTensor placements, refusals with reasons, the
nearest expressible plan, and runs through torch's own DTensor on cpu:4 equal to one process."""

import json

import pytest

from parplan.cli import main
from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.graph import Activation, Graph, Linear, Shape
from parplan.costmodel.hardware import parse_array
from parplan.costmodel.layout import PartitionType
from parplan.costmodel.problem import Plan, Problem, Split
from parplan.errors import ConfigError
from parplan.executor.export import nearest_plan, torch_export
from parplan.models.zoo import get_model
from parplan.solvers.megatron import megatron_plan
from parplan.solvers.planners import make_plan

B, I, O = PartitionType.BATCH, PartitionType.IN, PartitionType.OUT


def mlp() -> Graph:
    return Graph(
        "mlp",
        Shape(16, 1, 1),
        (
            Linear("fc1", ("input",), out_features=32),
            Activation("relu", ("fc1",), function="relu"),
            Linear("fc2", ("relu",), out_features=32),
            Activation("gelu", ("fc2",), function="gelu"),
            Linear("fc3", ("gelu",), out_features=8),
        ),
    )


def test_placements_follow_the_mapping_table():
    p = Problem(mlp(), parse_array("cpu:4"), batch=8)
    plan = Plan(
        {
            path: Split((O, I, B), (0.5,) * 3) if path else Split((B, B, O), (0.5,) * 3)
            for path, _ in p.array.inner_nodes()
        }
    )
    e = torch_export(p, plan)
    assert e.expressible and e.mesh_shape == (2, 2) and e.mesh_dim_names == ("l1", "l2")
    fc1, fc2, fc3 = e.layers
    assert fc1.weight == ("Replicate()", "Shard(0)") and fc1.input == ("Shard(0)", "Replicate()")
    assert (
        fc1.output == ("Shard(0)", "Shard(-1)")
        and fc1.style == "ColwiseParallel on l2, data parallel on l1"
    )
    assert fc2.weight == ("Replicate()", "Shard(1)") and fc2.input == ("Shard(0)", "Shard(-1)")
    assert fc2.style == "RowwiseParallel on l2, data parallel on l1"
    assert (
        fc3.weight == ("Shard(0)", "Replicate()")
        and fc3.style == "ColwiseParallel on l1, data parallel on l2"
    )
    assert "distribute_tensor" in e.script() and "'fc2': [Replicate(), Shard(1)]" in e.script()


def test_what_torch_cannot_express_is_refused_per_layer_and_the_nearest_plan_is_priced():
    p = Problem(mlp(), parse_array("cpu:4"), batch=8)
    plan = Plan(
        {
            "": Split((B, O, B), (0.25, 0.5, 1.0)),
            "L": Split((B, B, B), (0.5,) * 3),
            "R": Split((O, B, B), (0.5,) * 3),
        }
    )
    e = torch_export(p, plan)
    reasons = {(layer, path): why for layer, path, why in e.refusals}
    assert "gives the left half 0.25" in reasons[("fc1", "")]
    assert "one half" in reasons[("fc3", "")]
    assert "split it differently" in reasons[("fc1", "L")]
    near = nearest_plan(p, plan)
    assert torch_export(p, near).expressible
    assert all(a == 0.5 for s in near.splits.values() for a in s.shares)
    assert near.splits["L"] == near.splits["R"]
    assert evaluate(p, near).step_time_s > 0


def test_convolutions_split_by_channels_and_attention_with_too_few_groups_are_refused():
    p = Problem(get_model("lenet"), parse_array("cpu:2"), batch=8)
    e = torch_export(p, megatron_plan(p, 1))
    assert any("conv2d over the batch only" in why for _, _, why in e.refusals)
    assert all(
        c == "batch"
        for layer in torch_export(p, nearest_plan(p, megatron_plan(p, 1))).layers
        if layer.kind == "conv2d"
        for c in layer.choices
    )
    from parplan.models.transformers import gpt_config

    g = Problem(gpt_config(1, 16, 2, 4, vocab=32, name="gpt-tiny"), parse_array("cpu:4"), batch=8)
    assert any(
        "key/value groups" in why for _, _, why in torch_export(g, megatron_plan(g, 2)).refusals
    )
    assert torch_export(g, megatron_plan(g, 1)).expressible


def test_arrays_that_are_not_a_mesh_and_pipeline_plans_are_refused():
    p = Problem(mlp(), parse_array("cpu:3"), batch=8)
    with pytest.raises(ConfigError, match="full binary tree"):
        torch_export(p, make_plan(p, "data"))
    with pytest.raises(ConfigError, match="pipeline_export"):
        torch_export(p, object())


def test_a_pipeline_plan_exports_its_split_points_schedule_and_each_stage(tmp_path, capsys):
    from parplan.costmodel.planio import pipeline_document
    from parplan.costmodel.stages import PipelinePlan, Stage, even_ends, stage_problem
    from parplan.executor.export import pipeline_export
    from parplan.models.transformers import gpt_config

    p = Problem(
        gpt_config(2, 16, 2, 4, vocab=32, name="gpt-2block"),
        parse_array("cpu:4"),
        batch=8,
        micro_batches=4,
    )
    ends = even_ends(p.graph, 2)
    stages = []
    for (first, last), group in zip(((0, ends[0]), (ends[0] + 1, ends[1])), ("L", "R")):
        sub = stage_problem(p, first, last, group)
        stages.append(Stage(first, last, group, megatron_plan(sub, 1)))
    plan = PipelinePlan(tuple(stages), schedule="gpipe")
    e = pipeline_export(p, plan)
    order = p.graph.analyze().order
    assert e.expressible and e.schedule == "ScheduleGPipe" and e.micro_batches == 4
    assert e.split_points == (order[ends[0] + 1],)
    assert [st.ranks for st in e.stages] == [(0, 1), (2, 3)]
    assert all(st.export.mesh_shape == (2,) for st in e.stages)
    assert any("ColwiseParallel" in layer.style for layer in e.stages[1].export.layers)
    assert e.notes  # GPT's tied table and head live in different stages
    # the CLI on a pipeline plan file of a built-in model
    g = Problem(get_model("gpt2"), parse_array("cpu:4"), batch=8, micro_batches=4)
    ends = even_ends(g.graph, 2)
    plan = PipelinePlan(
        tuple(
            Stage(first, last, group, megatron_plan(stage_problem(g, first, last, group), 1))
            for (first, last), group in zip(((0, ends[0]), (ends[0] + 1, ends[1])), ("L", "R"))
        )
    )
    path = tmp_path / "pp.json"
    path.write_text(json.dumps(pipeline_document(g, plan)))
    capsys.readouterr()
    assert main(["export", "--plan", str(path)]) == 0
    text = capsys.readouterr().out
    first = g.graph.analyze().order[ends[0] + 1]
    assert (
        "2 stages, Schedule1F1B, n_microbatches=4" in text
        and f"(SplitPoint.BEGINNING): {first}" in text
    )
    assert "ranks 2-3, mesh (2,); ColwiseParallel on l1" in text


def test_fused_projections_are_placed_on_the_modules_of_the_model():
    """The importer fuses a Hugging Face Llama's q/k/v and gate/up projections into one layer
    each; the export places each of the model's own modules (Megatron's tensor parallelism:
    q, k, v each split by their output features), so every path in the script's PLACEMENTS is a
    module of the model the spec builds."""
    pytest.importorskip("transformers")
    from parplan.models.importers.hub import hf_model
    from parplan.models.modelfile import load_model

    spec = (
        "hf:llama,hidden_size=64,intermediate_size=128,num_attention_heads=4,"
        "num_key_value_heads=4,num_hidden_layers=1,vocab_size=128,seq=16"
    )
    p = Problem(load_model(spec), parse_array("h100:4"), batch=8)
    ex = torch_export(p, megatron_plan(p, 1))  # tensor 2 inside, data 2 across
    qkv = ex.layer("model.layers.0.self_attn.qkv")
    assert qkv.module_paths == tuple(f"model.layers.0.self_attn.{x}_proj" for x in ("q", "k", "v"))
    assert ex.layer("lm_head").module_paths == ("lm_head",)
    model, _ = hf_model("llama", {**_overrides(spec)}, 16)
    script = ex.script()
    placed = [line.split("'")[1] for line in script.splitlines() if line.startswith("    '")]
    assert len(placed) == 8 and "model.layers.0.mlp.gate_proj" in placed
    for path in placed:
        assert hasattr(model.get_submodule(path), "weight"), path
    assert json.loads(json.dumps(ex.to_dict()))["layers"][0]["modules"] == list(qkv.module_paths)


def _overrides(spec: str) -> dict:
    pairs = (kv.split("=") for kv in spec.split(",")[1:] if not kv.startswith("seq="))
    return {k: int(v) for k, v in pairs}


def test_export_cli_writes_json_and_a_script(tmp_path, capsys):
    out = tmp_path / "e.json"
    assert (
        main(
            [
                "export",
                "--model",
                "lenet",
                "--array",
                "cpu:4",
                "--batch",
                "8",
                "--planner",
                "data",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert (
        doc["mesh_shape"] == [2, 2] and doc["expressible"] and doc["layers"][0]["name"] == "conv1"
    )
    script = tmp_path / "e.py"
    assert (
        main(
            [
                "export",
                "--model",
                "lenet",
                "--array",
                "cpu:4",
                "--batch",
                "8",
                "--out",
                str(script),
                "--nearest",
            ]
        )
        == 0
    )
    compile(script.read_text(), str(script), "exec")
    capsys.readouterr()
    assert main(["export", "--model", "lenet", "--array", "h100:4", "--batch", "64"]) == 1
    text = capsys.readouterr().out
    assert "torch cannot express" in text and "nearest plan torch can express" in text


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("torch")
    from parplan.executor.launch import Cluster

    with Cluster(4, "gloo") as c:
        yield c


def _plans(p, names):
    for name in names:
        if name.startswith("megatron"):
            yield name, megatron_plan(p, int(name[-1]))
        elif name == "nearest":
            yield name, nearest_plan(p, make_plan(p, "accpar"))
        else:
            yield name, make_plan(p, name)


@pytest.mark.parametrize(
    "model,names",
    [
        ("mlp", ["data", "megatron1", "megatron2"]),
        ("resnet-2block", ["data", "nearest"]),
        pytest.param("gpt-tiny", ["data", "megatron1"], marks=pytest.mark.slow),
        ("llama-tiny", ["megatron1"]),
    ],
)
def test_torch_runs_the_exported_plan_as_one_process_computes(cluster, model, names):
    from parplan.executor.launch import RTOL, run_torch
    from parplan.models.transformers import gpt_config
    from test_executor import llama_like

    graph = {
        "mlp": mlp,
        "gpt-tiny": lambda: gpt_config(1, 16, 2, 4, vocab=32, name="gpt-tiny"),
        "llama-tiny": lambda: llama_like(4, 2, "gqa"),
    }.get(model, lambda: get_model(model))()
    p = Problem(graph, parse_array("cpu:4"), batch=8)
    for name, plan in _plans(p, names):
        r = run_torch(p, plan, steps=2, cluster=cluster, lr=0.01)
        assert r.numerics_equal, (name, r.loss_rel_error, r.max_grad_rel_error)
        assert r.loss_rel_error <= RTOL and len(r.losses) == 2 and r.losses[1] != r.losses[0]
        if name.startswith("megatron"):
            assert r.collectives.get("all_reduce", 0) > 0  # the row-parallel layers' partial sums
    if (
        model == "llama-tiny"
    ):  # the fused gate/up projection: each part holds its gate and up columns
        assert any("fused gate/up" in note for note in torch_export(p, megatron_plan(p, 1)).notes)


@pytest.mark.parametrize("zero", [1, 3])
def test_zero_and_micro_batches_run_as_fsdp_does_and_equal_one_process(cluster, zero):
    from parplan.executor.launch import run_torch

    p = Problem(
        mlp(), parse_array("cpu:4"), batch=16, zero_stage=zero, micro_batches=2 if zero == 3 else 1
    )
    for plan in (make_plan(p, "data"), megatron_plan(p, 1)):
        r = run_torch(p, plan, steps=2, cluster=cluster, lr=0.01)
        assert r.numerics_equal, (zero, r.loss_rel_error, r.max_grad_rel_error)
        # the gradients are reduce-scattered to the kept shards and the weights all-gathered
        assert (
            r.collectives.get("reduce_scatter_tensor", 0) > 0
            and r.collectives.get("all_gather_into_tensor", 0) > 0
        )
    assert torch_export(p, make_plan(p, "data")).layers[0].fsdp_dims == ("l1", "l2")


def test_run_torch_refuses_what_it_cannot_express(cluster):
    from parplan.executor.launch import run_torch

    p = Problem(get_model("lenet"), parse_array("cpu:4"), batch=8)
    with pytest.raises(ConfigError, match="export --nearest"):
        run_torch(p, megatron_plan(p, 1), cluster=cluster)


@pytest.mark.slow  # its own 2-process cluster: ~9 s of the default run's budget
def test_data_parallelism_on_two_devices_hands_torch_the_elements_the_model_moves():
    pytest.importorskip("torch")
    from parplan.executor.launch import Cluster, run_torch

    p = Problem(get_model("lenet"), parse_array("cpu:2"), batch=4)
    with Cluster(2, "gloo") as c:
        r = run_torch(p, make_plan(p, "data"), cluster=c)
    weights = sum(d.weight_elements for d in p.root_dims())
    assert r.numerics_equal and r.collectives == {"all_reduce": 5}
    assert r.payload_elements == {"all_reduce": 2 * weights} and r.model_elements == 2 * weights


@pytest.mark.parametrize(
    "model, schedule, micro, zero",
    [
        ("mlp", "1f1b", 2, 0),
        ("gpt-tiny", "gpipe", 2, 0),
        pytest.param("mlp", "1f1b", 4, 3, marks=pytest.mark.slow),
    ],
)
def test_torch_pipelining_runs_a_pipeline_plan_as_one_process_computes(
    cluster, model, schedule, micro, zero
):
    """Issue 33: a 2-stage x 2-way pipeline plan through torch's own
    ``torch.distributed.pipelining`` (a ``PipelineStage`` per stage, ``Schedule1F1B`` /
    ``ScheduleGPipe``) with each stage's plan as DTensor placements on its half of a
    ``pp x l1`` mesh: losses and every gradient equal one process over two SGD steps. gpt-tiny's
    second stage starts with a layer norm (which the reference executor does not run)."""
    from parplan.costmodel.stages import PipelinePlan, Stage, cut_points, stage_problem
    from parplan.executor.launch import run_torch
    from parplan.models.transformers import gpt_config

    graph = mlp() if model == "mlp" else gpt_config(2, 16, 2, 4, vocab=32, name="gpt-tiny")
    order = graph.analyze().order
    cuts = cut_points(graph)
    k = cuts[len(cuts) // 2]
    p = Problem(graph, parse_array("cpu:4"), batch=8, micro_batches=micro, zero_stage=zero)
    stages = []
    for first, last, group in ((0, k, "L"), (k + 1, len(order) - 1, "R")):
        sub = stage_problem(p, first, last, group)
        stages.append(Stage(first, last, group, megatron_plan(sub, 1)))
    r = run_torch(p, PipelinePlan(tuple(stages), schedule=schedule), steps=2, cluster=cluster)
    assert r.numerics_equal, (r.losses, r.reference_losses, r.max_grad_rel_error)
    assert r.export.mesh_shape == (2, 2) and r.losses[1] != r.losses[0]


def test_torch_pipelining_refuses_stages_it_cannot_run(cluster):
    from parplan.costmodel.stages import PipelinePlan, Stage, stage_problem
    from parplan.executor.launch import run_torch

    p = Problem(get_model("resnet-2block"), parse_array("cpu:4"), batch=8)
    uneven = [(0, 9, "L"), (10, 21, "RL")]  # a stage of 2 devices and one of 1
    stages = [Stage(f, l, g, make_plan(stage_problem(p, f, l, g), "data")) for f, l, g in uneven]
    with pytest.raises(ConfigError, match="groups of equal size"):
        run_torch(p, PipelinePlan(tuple(stages)), cluster=cluster)
