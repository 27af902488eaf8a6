"""The CLI: the README's main job, JSON/CSV output, clear errors without tracebacks."""

import json
import subprocess
import sys

import pytest

from parplan.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_table_reports_speedup_and_level_table(capsys):
    code, out, err = run(capsys, "plan", "--model", "vgg16", "--array", "tpu-v2:2,tpu-v3:2", "--planner", "accpar")
    assert code == 0, err
    assert "speedup" in out and "types per level" in out
    assert "level 1 (1 split" in out and "level 2 (2 splits" in out
    assert "features.0" in out and "classifier.6" in out


def test_plan_json_has_step_time_levels_and_layers(capsys):
    code, out, _ = run(capsys, "plan", "--model", "resnet18", "--array", "h100:4", "--format", "json", "--batch", "64")
    assert code == 0
    data = json.loads(out)
    assert data["step_time_s"] > 0 and data["devices"] == 4 and data["batch"] == 64
    assert set(data["levels"]) == {"root", "L", "R"}
    root = data["levels"]["root"]
    assert len(root["types"]) == len(root["shares"]) == len(data["nodes"])
    assert {"layer", "type", "share", "compute_s", "communication_s", "time_s"} <= set(data["layers"][0])
    assert data["speedup_over_data_parallel"] >= 1 - 1e-9


def test_plan_csv(capsys):
    code, out, _ = run(capsys, "plan", "--model", "alexnet", "--array", "a100:2", "--format", "csv")
    assert code == 0
    header = out.splitlines()[0].split(",")
    assert header[:4] == ["layer", "kind", "type", "share"] and len(out.splitlines()) == 9


@pytest.mark.parametrize("argv,message", [
    (["plan", "--model", "resnet51", "--array", "h100:2"], "unknown model 'resnet51'"),
    (["plan", "--model", "vgg16", "--array", "h200:2"], "unknown device 'h200'; valid devices: a100, h100"),
    (["plan", "--model", "vgg16", "--array", "h100:x"], "count must be an integer"),
    (["plan", "--model", "vgg16", "--array", "h100:2", "--planner", "foo"], "unknown planner 'foo'"),
    (["plan", "--model", "vgg16", "--array", "h100:2", "--batch", "0"], "batch must be a positive integer"),
    (["plan", "--model", "vgg16", "--array", "h100:2", "--bandwidth", "-1"], "bandwidth must be > 0"),
    (["plan", "--model", "missing.toml", "--array", "h100:2"], "missing.toml"),
])
def test_user_mistakes_give_one_clear_line_and_status_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_models_and_devices_listings(capsys):
    code, out, _ = run(capsys, "models")
    assert code == 0 and "resnet50" in out and "vgg16" in out
    code, out, _ = run(capsys, "devices")
    assert code == 0 and "tpu-v3" in out and "123" in out


def test_console_script_runs_in_a_subprocess():
    res = subprocess.run([sys.executable, "-m", "parplan.cli", "plan", "--model", "lenet", "--array", "h100:2"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "step time" in res.stdout
