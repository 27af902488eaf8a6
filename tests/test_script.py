"""Training scripts (docs/interop.md "A training script"): a plan written as torch's own
parallel APIs (parallelize_module styles, FSDP2 fully_shard, checkpoint_wrapper, gradient
accumulation), run with torchrun on cpu:4 (gloo), loss and every gradient equal to one
process; refusals name what the APIs cannot express."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from parplan.cli import main
from parplan.costmodel.hardware import parse_array
from parplan.costmodel.problem import Plan, Problem
from parplan.errors import ConfigError
from parplan.executor.script import script_plan
from parplan.models.transformers import gpt_config
from parplan.solvers.megatron import megatron_plan
from parplan.solvers.planners import make_plan

MODELS = Path(__file__).resolve().parent.parent / "examples" / "torch_models.py"


def _torchrun(script: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
        + [str(script), "--check", "--steps", "2"],
        capture_output=True,
        text=True,
        env=env,
        cwd=script.parent,
        timeout=timeout,
    )


def _checked(script: Path) -> str:
    run = _torchrun(script)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("check:"))
    assert line.endswith(": equal"), line
    assert "step 2: loss" in run.stdout
    return line


def test_a_megatron_configuration_trains_through_torchs_apis(tmp_path, capsys):
    """Tensor 2 x data 2 with ZeRO-3, block recomputation and 2 micro-batches on a small GPT,
    from a configuration (evaluate --config --save) through export --out to torchrun."""
    pytest.importorskip("torch")
    plan = tmp_path / "tp2dp2.json"
    args = ["--model", f"{MODELS}:gpt", "--array", "cpu:4", "--batch", "8"]
    config = "tp=2,dp=2,zero=3,recompute=yes,mbs=2"
    assert main(["evaluate", "--config", config, *args, "--save", str(plan)]) == 0
    script = tmp_path / "train.py"
    assert main(["export", "--plan", str(plan), "--out", str(script)]) == 0
    text = script.read_text()
    assert "'blocks.0.q': (ColwiseParallel, Replicate(), Shard(-1))" in text
    assert "'blocks.0.fc2': (RowwiseParallel, Shard(-1), Replicate())" in text
    assert "'head': (ColwiseParallel, Replicate(), Replicate())" in text  # gathered for the loss
    assert "ZERO_STAGE = 3" in text and "MICRO_BATCHES = 2" in text
    assert "RECOMPUTED = ('blocks.0', 'blocks.1')" in text
    assert "DATA_DIMS = ('l1',)" in text and "TENSOR_DIMS = ('l2',)" in text
    capsys.readouterr()
    _checked(script)


@pytest.mark.slow  # resnet-2block runs through DTensor in the default run (tests/test_export.py)
def test_a_data_parallel_resnet_trains_through_torchs_apis(tmp_path, capsys):
    """A two-block ResNet, data parallel over both levels (flattened into one mesh dim), the
    gradients averaged by all-reduce (no ZeRO): written by export, and run by run --runtime script."""
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    args = ["--model", f"{MODELS}:resnet", "--array", "cpu:4", "--batch", "8", "--planner", "data"]
    assert main(["export", *args, "--out", str(script)]) == 0
    text = script.read_text()
    assert "DATA_DIMS = ('l1', 'l2')" in text and "TENSOR_DIMS = ()" in text
    assert "UNITS = ('layers.0', 'layers.1')" in text
    capsys.readouterr()
    assert main(["run", *args, "--runtime", "script", "--steps", "2", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["numerics_equal"] and out["check"].endswith(": equal") and len(out["losses"]) == 2


def test_the_script_names_its_model_file_absolutely(tmp_path, monkeypatch):
    """A relative ``file.py:factory`` reads the same from the folder a script runs in."""
    from parplan.models.importers.external import absolute_spec

    (tmp_path / "m.py").write_text("def build():\n    pass\n")
    monkeypatch.chdir(tmp_path)
    assert absolute_spec("m.py:build") == f"{tmp_path / 'm.py'}:build"
    assert absolute_spec("missing.py:build") == "missing.py:build"  # the import says it is missing
    p = _gpt_problem()
    assert script_plan(p, megatron_plan(p, 1), "m.py:build").spec == f"{tmp_path / 'm.py'}:build"


def test_a_pipeline_plan_is_not_written_as_a_script(tmp_path, capsys):
    plan = Path(__file__).resolve().parent.parent / "examples" / "resnet-2block-pipeline.json"
    out = tmp_path / "pp.py"
    assert main(["export", "--plan", str(plan), "--out", str(out)]) == 2
    assert "a pipeline plan exports as JSON" in capsys.readouterr().err and not out.exists()


def test_run_script_needs_a_torch_module(capsys):
    assert main(["run", "--model", "lenet", "--array", "cpu:4", "--runtime", "script"]) == 2
    assert "'lenet' is not a PyTorch module" in capsys.readouterr().err


@pytest.mark.slow
def test_a_hugging_face_llama_trains_through_torchs_apis(tmp_path):
    """Hugging Face's Llama (grouped-query attention; the importer's fused q/k/v and gate/up
    placed on q_proj, k_proj, v_proj, gate_proj, up_proj), tensor 2 x data 2, ZeRO-1, recompute."""
    pytest.importorskip("transformers")
    spec = (
        "hf:llama,hidden_size=64,intermediate_size=128,num_attention_heads=4,"
        "num_key_value_heads=2,num_hidden_layers=2,vocab_size=128,seq=16"
    )
    plan, script = tmp_path / "hf.json", tmp_path / "train.py"
    args = ["--model", spec, "--array", "cpu:4", "--batch", "8"]
    assert (
        main(["evaluate", "--config", "tp=2,dp=2,zero=1,recompute=yes", *args, "--save", str(plan)])
        == 0
    )
    assert main(["export", "--plan", str(plan), "--out", str(script)]) == 0
    assert "'model.layers.0.self_attn.k_proj': (ColwiseParallel" in script.read_text()
    _checked(script)


def _gpt_problem(**kw) -> Problem:
    return Problem(
        gpt_config(1, 16, 2, 4, vocab=32, name="gpt-tiny"), parse_array("cpu:4"), batch=8, **kw
    )


def test_the_script_plan_of_megatron_tensor_levels():
    p = _gpt_problem(zero_stage=2, recompute=True, checkpoint="layer")
    sp = script_plan(p, megatron_plan(p, 1), "m.py:build")
    assert (sp.data_dims, sp.tensor_dims, sp.zero_stage) == (("l1",), ("l2",), 2)
    styles = {path: (style, arrive, leave) for path, style, arrive, leave in sp.styles}
    weighted = [n.name for n in p.planning.nodes if not n.is_join]
    assert set(styles) == set(weighted)  # every weighted layer styled (no fused modules here)
    assert {s for s, _, _ in styles.values()} == {"ColwiseParallel", "RowwiseParallel"}
    for path, (style, arrive, leave) in styles.items():
        if style == "ColwiseParallel":
            assert arrive == "Replicate()", path
        else:
            assert (arrive, leave) == ("Shard(-1)", "Replicate()"), path
    assert sp.recomputed == tuple(weighted)  # per layer: every weighted module


def test_plans_torch_cannot_run_are_refused_with_reasons():
    p = _gpt_problem()
    meg = megatron_plan(p, 1)
    # the tensor level above the data level
    upside = Plan({"": meg.splits["L"], "L": meg.splits[""], "R": meg.splits[""]})
    with pytest.raises(ConfigError, match="tensor-parallel levels l1 are not the lowest"):
        script_plan(p, upside, "m.py:build")
    # a layer split by OUT on one tensor level and IN on the other
    tp4 = megatron_plan(p, 2)
    first = next(i for i, n in enumerate(p.planning.nodes) if not n.is_join)
    low = tp4.splits["L"]
    flipped = replace(
        low,
        choices=tuple((c.__class__("in") if k == first else c) for k, c in enumerate(low.choices)),
    )
    mixed = Plan({**tp4.splits, "L": flipped, "R": flipped})
    with pytest.raises(ConfigError) as err:
        script_plan(p, mixed, "m.py:build")
    assert "in/out on the tensor-parallel levels" in str(err.value)
    # uneven shares: the export's own refusals, at most SHOWN of them listed
    small = make_plan(p, "accpar")
    with pytest.raises(ConfigError, match="export --nearest"):
        script_plan(p, small, "m.py:build")


def test_a_model_without_a_torch_module_gets_the_placements_script(tmp_path, capsys):
    out = tmp_path / "p.py"
    assert (
        main(
            [
                "export",
                "--model",
                "sfc",
                "--array",
                "cpu:4",
                "--planner",
                "data",
                "--batch",
                "8",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "def distribute(model):" in out.read_text()
    from parplan.models.importers.external import module_of

    with pytest.raises(ConfigError, match="not a PyTorch module"):
        module_of("vgg16")
