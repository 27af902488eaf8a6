"""Parallel configurations users run (Megatron-LM, torchtitan) as parplan plans (issue 33)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from parplan.cli import main
from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.hardware import parse_array
from parplan.costmodel.layout import PartitionType
from parplan.costmodel.problem import Problem
from parplan.costmodel.stages import evaluate_pipeline
from parplan.errors import ConfigError
from parplan.models.zoo import get_model
from parplan.pipeline.configs import ParallelConfig, config_plan, read_config
from parplan.solvers.megatron import megatron_plan


def test_the_three_spellings_read_the_same_config(tmp_path):
    short = read_config("tp=4,pp=2,dp=2 zero=1, recompute=yes,mbs=2,gbs=64")
    megatron = tmp_path / "megatron.json"
    megatron.write_text(
        json.dumps(
            {
                "tensor-model-parallel-size": 4,
                "pipeline-model-parallel-size": 2,
                "micro-batch-size": 2,
                "global-batch-size": 64,
                "recompute-activations": True,
                "use-distributed-optimizer": True,
                "lr": 3e-4,
                "seq-length": 2048,
            }
        )
    )
    titan = tmp_path / "titan.toml"
    titan.write_text(
        "[parallelism]\ntensor_parallel_degree = 4\npipeline_parallel_degree = 2\n"
        "data_parallel_shard_degree = 1\ndata_parallel_replicate_degree = 2\n"
        'pipeline_parallel_microbatch_size = 2\npipeline_parallel_schedule = "1F1B"\n'
        '[training]\nglobal_batch_size = 64\n[activation_checkpoint]\nmode = "full"\n'
    )
    a, b, c = short, read_config(megatron), read_config(titan)
    key = lambda x: (
        x.tensor,
        x.pipeline,
        x.recompute,
        x.micro_batch_size,
        x.global_batch,
        x.schedule,
    )  # noqa: E731
    assert key(a) == key(b) == key(c) == (4, 2, True, 2, 64, "1f1b")
    assert (
        (a.data, a.zero_stage) == (2, 1) and b.zero_stage == 1 and (c.data, c.zero_stage) == (2, 0)
    )
    fsdp = tmp_path / "fsdp.toml"
    fsdp.write_text("[parallelism]\ndata_parallel_shard_degree = 8\n")
    assert (read_config(fsdp).zero_stage, read_config(fsdp).data) == (3, 8)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("tp=4,sequence_parallel=true", "sequence parallelism"),
        ("tp=2,context_parallel_size=2", "context parallelism"),
        ("tp=two", "positive integer"),
        ("tp4", "no '='"),
        ("schedule=interleaved", "parplan models 1f1b"),
        ("zero=5", "ZeRO|zero"),
    ],
)
def test_what_parplan_does_not_model_is_refused_by_name(spec, message):
    with pytest.raises(ConfigError, match=message):
        read_config(spec)


def test_the_config_plan_is_megatron_inside_each_stage():
    p = Problem(get_model("gpt2"), parse_array("h100:8"), batch=16)
    q, plan = config_plan(p, read_config("tp=2,dp=4,zero=1"))
    assert len(plan.stages) == 1 and q.micro_batches == 1 and q.zero_stage == 1
    assert dict(plan.stages[0].plan.splits) == dict(megatron_plan(q, 1).splits)
    assert evaluate_pipeline(q, plan).step_time_s == pytest.approx(
        evaluate(q, megatron_plan(q, 1)).step_time_s, rel=1e-12
    )
    q, plan = config_plan(p, read_config("tp=2,pp=2,mbs=2"))
    assert [s.group for s in plan.stages] == ["L", "R"] and q.micro_batches == 16 // (2 * 2)
    order = p.graph.analyze().order
    sizes = [s.last - s.first + 1 for s in plan.stages]
    assert (
        sum(sizes) == len(order) and abs(sizes[0] - sizes[1]) <= 12
    )  # as even as the cut points allow
    assert all(s.plan.info["tensor_parallel"] == 2 for s in plan.stages)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("tp=3", "power of two"),
        ("tp=4,dp=4", "has 8 devices"),
        ("tp=16", "does not divide"),
        ("tp=2,mbs=3", "not a multiple"),
    ],
)
def test_configs_that_do_not_fit_the_array(spec, message):
    p = Problem(get_model("gpt2"), parse_array("h100:8"), batch=16)
    with pytest.raises(ConfigError, match=message):
        config_plan(p, read_config(spec))


def test_cli_evaluate_config_with_its_gap(capsys):
    code = main(
        [
            "evaluate",
            "--config",
            "tp=2,dp=2,zero=1",
            "--model",
            "gpt2",
            "--array",
            "h100:4",
            "--batch",
            "8",
            "--gap",
            "--format",
            "json",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    data = json.loads(out.out)
    assert (
        data["config"].startswith("TP2, PP1, DP2, ZeRO-1") and data["fits"]
    )  # the data degree resolved
    # the best plan parplan finds is never slower, and the proven bound is below both
    assert (
        data["best_step_time_s"] <= data["step_time_s"] * (1 + 1e-12)
        and data["gap_to_best"] >= -1e-12
    )
    assert data["bound_s"] <= data["step_time_s"] and data["gap_to_bound"] >= 0
    # where the configuration loses: every layer's time next to its own bound, summing to the step
    rows = data["layer_bounds"]
    assert len(rows) == len(
        Problem(get_model("gpt2"), parse_array("h100:4"), batch=8).planning.nodes
    )
    assert abs(sum(r["time_s"] for r in rows) - data["step_time_s"]) <= 1e-9 * data["step_time_s"]
    assert all(r["excess_s"] >= 0.0 and r["bound_s"] <= r["time_s"] * (1 + 1e-9) for r in rows)
    code = main(
        ["evaluate", "--config", "tp=2", "--model", "gpt2", "--array", "h100:4", "--batch", "8"]
    )
    assert code == 0 and "configuration: TP2, PP1, DP2, ZeRO-0" in capsys.readouterr().out
    code = main(["evaluate", "--config", "tp=2", "--model", "gpt2"])
    assert code == 2 and "--model and --array" in capsys.readouterr().err
    code = main(["evaluate", "--model", "gpt2", "--array", "h100:2"])
    assert code == 2 and "--plan FILE or --config SPEC" in capsys.readouterr().err


def test_config_label():
    assert (
        ParallelConfig(tensor=4, data=2, zero_stage=1, recompute=True).label()
        == "TP4, PP1, DP2, ZeRO-1, recompute"
    )


def test_a_parallelize_module_plan_sets_the_tensor_levels(tmp_path):
    from parplan.pipeline.configs import read_tensor_plan
    from parplan.solvers.megatron import megatron_plan

    p = Problem(get_model("llama3-8b"), parse_array("h100:16"), batch=32)
    toml = tmp_path / "tp.toml"
    toml.write_text(
        '[tensor_plan]\n"layers.*.qkv" = "colwise"\n"layers.*.o" = "rowwise"\n'
        '"layers.*.gate_up" = "ColwiseParallel"\n"layers.*.down" = "RowwiseParallel"\n'
        '"lm_head" = "colwise"\n'
    )
    styles = read_tensor_plan(str(toml))
    assert styles[0] == ("layers.*.qkv", "colwise") and styles[2] == ("layers.*.gate_up", "colwise")
    cfg = replace(read_config("tp=4,dp=4"), styles=styles)
    _, plan = config_plan(p, cfg)
    # Megatron-LM's pairing, written as torch styles: the same plan
    assert plan.stages[0].plan.splits == megatron_plan(p, 2).splits
    # another plan: the MLP's down projection column-parallel too, priced differently
    other = replace(cfg, styles=(("layers.*.down", "colwise"),) + styles)
    _, changed = config_plan(p, other)
    assert changed.stages[0].plan.splits["LL"].choices[4] is PartitionType.OUT
    assert (
        changed.stages[0].plan.splits[""] == plan.stages[0].plan.splits[""]
    )  # data parallel above


def test_a_tensor_plan_names_what_it_cannot_express(tmp_path):
    from parplan.pipeline.configs import read_tensor_plan

    p = Problem(get_model("llama3-8b"), parse_array("h100:8"), batch=16)
    with pytest.raises(
        ConfigError, match=r"no colwise or rowwise style for layers\.0\.o, layers\.0\.gate_up"
    ):
        config_plan(p, replace(read_config("tp=8"), styles=(("layers.*.qkv", "colwise"),)))
    with pytest.raises(ConfigError, match="sequence parallelism"):
        config_plan(p, replace(read_config("tp=8"), styles=(("*", "sequence"),)))
    bad = tmp_path / "bad.toml"
    bad.write_text('"layers.*.qkv" = "diagonal"\n')
    with pytest.raises(ConfigError, match="expected colwise, rowwise"):
        read_tensor_plan(str(bad))


def test_a_tensor_plan_in_python_with_torch_styles(tmp_path, capsys):
    pytest.importorskip("torch")
    from parplan.cli import main

    src = tmp_path / "plan.py"
    src.write_text(
        "from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, PrepareModuleInput\n"
        "PLAN = {'layers.*': PrepareModuleInput(), 'layers.*.qkv': ColwiseParallel(),\n"
        "        'layers.*.o': RowwiseParallel(), 'layers.*.gate_up': ColwiseParallel(),\n"
        "        'layers.*.down': RowwiseParallel(), 'lm_head': ColwiseParallel()}\n"
    )
    args = [
        "evaluate",
        "--config",
        "tp=4,dp=4,zero=1,recompute=yes,mbs=1",
        "--model",
        "llama3-8b",
        "--array",
        "h100:16",
        "--batch",
        "32",
        "--format",
        "json",
    ]
    assert main(args) == 0
    megatron = json.loads(capsys.readouterr().out)["step_time_s"]
    assert main(args + ["--tensor-plan", f"{src}:PLAN"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["step_time_s"] == megatron and "tensor plan of 6 patterns" in doc["config"]
    assert main(args + ["--tensor-plan", f"{src}:MISSING"]) == 2
