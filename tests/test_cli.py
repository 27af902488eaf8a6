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
    code, out, err = run(
        capsys, "plan", "--model", "vgg16", "--array", "tpu-v2:2,tpu-v3:2", "--planner", "accpar"
    )
    assert code == 0, err
    assert "speedup" in out and "types per level" in out
    assert "level 1 (1 split" in out and "level 2 (2 splits" in out
    assert "features.0" in out and "classifier.6" in out


def test_plan_json_has_step_time_levels_and_layers(capsys):
    code, out, _ = run(
        capsys,
        "plan",
        "--model",
        "resnet18",
        "--array",
        "h100:4",
        "--format",
        "json",
        "--batch",
        "64",
    )
    assert code == 0
    data = json.loads(out)
    assert data["step_time_s"] > 0 and data["devices"] == 4 and data["batch"] == 64
    assert set(data["levels"]) == {"root", "L", "R"}
    root = data["levels"]["root"]
    assert len(root["types"]) == len(root["shares"]) == len(data["nodes"])
    assert {"layer", "type", "share", "compute_s", "communication_s", "time_s"} <= set(
        data["layers"][0]
    )
    assert data["speedup_over_data_parallel"] >= 1 - 1e-9


def test_plan_csv(capsys):
    code, out, _ = run(capsys, "plan", "--model", "alexnet", "--array", "a100:2", "--format", "csv")
    assert code == 0
    header = out.splitlines()[0].split(",")
    assert header[:4] == ["layer", "kind", "type", "share"] and len(out.splitlines()) == 9


@pytest.mark.parametrize(
    "argv,message",
    [
        (["plan", "--model", "resnet51", "--array", "h100:2"], "unknown model 'resnet51'"),
        (
            ["plan", "--model", "vgg16", "--array", "b200:2"],
            "unknown device 'b200'; valid devices: a100, cpu, h100, h200",
        ),
        (["plan", "--model", "vgg16", "--array", "h100:x"], "count must be an integer"),
        (
            ["plan", "--model", "vgg16", "--array", "h100:2", "--planner", "foo"],
            "unknown planner 'foo'",
        ),
        (
            ["plan", "--model", "vgg16", "--array", "h100:2", "--batch", "0"],
            "batch must be an integer in [1, ",
        ),
        (
            ["plan", "--model", "vgg16", "--array", "h100:2", "--bandwidth", "-1"],
            "bandwidth must be > 0",
        ),
        (["plan", "--model", "missing.toml", "--array", "h100:2"], "missing.toml"),
    ],
)
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
    res = subprocess.run(
        [sys.executable, "-m", "parplan.cli", "plan", "--model", "lenet", "--array", "h100:2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "step time" in res.stdout


def test_cli_planner_names_match_the_planners():
    from parplan.cli.common import PLANNER_NAMES
    from parplan.solvers.planners import PLANNERS

    assert tuple(PLANNERS) == PLANNER_NAMES


def test_help_does_not_import_the_planners_or_the_benchmarks():
    code = (
        "import sys; from parplan.cli import build_parser; build_parser(['plan']); "
        "print(sorted(m for m in ('parplan.solvers.planners', 'benchmarks', 'pandas') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_public_api():
    import parplan

    for name in (
        "Problem",
        "Plan",
        "parse_array",
        "load_model",
        "plan",
        "solve",
        "certify",
        "evaluate",
        "global_bound",
    ):
        assert name in parplan.__all__ and callable(getattr(parplan, name))
    assert isinstance(parplan.__version__, str) and parplan.__version__
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        parplan.nope


def test_bad_solver_numbers_are_one_line(capsys):
    for argv, message in (
        (["--time-limit", "nan"], "time limit must be a number > 0"),
        (["--threads", "0"], "threads must be an integer in [1, 1024]"),
        (["--seed", "-1"], "seed must be an integer >= 0"),
    ):
        code, _, err = run(capsys, "solve", "--model", "lenet", "--array", "h100:2", *argv)
        assert code == 2 and message in err and "Traceback" not in err
    code, out, err = run(
        capsys,
        "solve",
        "--model",
        "lenet",
        "--array",
        "h100:2",
        "--time-limit",
        "1e300",
        "--seed",
        str(10**30),
    )
    assert code == 0 and "optimal" in out, err


def test_solve_and_certify_outputs_carry_run_metadata(capsys):
    import io

    import pandas as pd

    problem = ["--model", "lenet", "--array", "h100:2", "--batch", "8"]
    code, out, err = run(capsys, "certify", *problem, "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert (
        doc["model"] == "lenet"
        and doc["batch"] == 8
        and doc["planner"] == "accpar"
        and doc["parplan_version"]
    )
    code, out, err = run(capsys, "solve", *problem, "--format", "csv")
    frame = pd.read_csv(io.StringIO(out))
    assert code == 0 and set(frame.model) == {"lenet"} and set(frame.batch) == {8}
    assert {"planner", "parplan_version", "status"} <= set(frame.columns)


def test_plan_and_evaluate_report_the_global_bound(capsys, tmp_path):
    """``--bound``: the global bound and gap of the plan, in the table and the JSON, with each
    layer's own bound next to its time; ``evaluate --bound`` gives the same for a saved plan."""
    import parplan
    from parplan.solvers.bound import global_bound, pinned_node_bounds

    p = parplan.Problem(
        parplan.load_model("lenet"), parplan.parse_array("h100:4"), batch=512, overlap=True
    )  # the CLI's default (docs/costmodel.md section 4.2)
    bound = global_bound(p)
    ev = parplan.evaluate(p, parplan.plan(p, "accpar"))
    saved = tmp_path / "p.json"
    code, out, err = run(
        capsys,
        "plan",
        "--model",
        "lenet",
        "--array",
        "h100:4",
        "--bound",
        "--format",
        "json",
        "--save",
        str(saved),
    )
    assert code == 0, err
    data = json.loads(out)
    assert len(data["layers"]) == len(p.planning.nodes)  # the report's own layers are kept
    assert data["global_bound_s"] == pytest.approx(bound.bound_s, rel=1e-12)
    assert data["global_gap"] == pytest.approx(ev.step_time_s / bound.bound_s - 1, rel=1e-9)
    rows = data["layer_bounds"]
    assert [r["bound_s"] for r in rows] == pytest.approx(list(bound.node_s), rel=1e-12)
    assert [r["time_s"] for r in rows] == pytest.approx(list(ev.node_time_s), rel=1e-12)
    assert all(
        r["excess_s"] == pytest.approx(max(0.0, r["time_s"] - r["bound_s"]), abs=1e-18)
        for r in rows
    )
    assert data["per_layer_bound_s"] == pytest.approx(sum(bound.node_s), rel=1e-12)
    assert data["per_layer_bound_s"] <= data["global_bound_s"] <= data["step_time_s"]
    # each layer's excess split at its bound pinned to the plan's states (bound.pinned_node_bounds)
    pinned = pinned_node_bounds(p, parplan.plan(p, "accpar"))
    assert [r["pinned_s"] for r in rows] == pytest.approx(list(pinned), rel=1e-12)
    for r in rows:
        assert r["states_excess_s"] + r["transfers_excess_s"] == pytest.approx(
            r["excess_s"], rel=1e-9, abs=1e-18
        )
    assert data["states_excess_s"] + data["transfers_excess_s"] == pytest.approx(
        data["step_time_s"] - data["per_layer_bound_s"], rel=1e-9
    )
    assert data["transfers_excess_s"] > 0.0  # lenet's hand-overs (a row that sends nothing: 0)
    code, out, err = run(capsys, "plan", "--model", "lenet", "--array", "h100:4", "--bound")
    assert code == 0, err
    gap_line = next(line for line in out.splitlines() if line.startswith("global bound"))
    assert f"gap {data['global_gap']:.2%}" in gap_line
    worst = max(rows, key=lambda r: r["excess_s"])
    listed = out.split("furthest above their own bound")[1].splitlines()[1]
    assert listed.split()[0] == worst["layer"]
    assert "transfers +" in listed and "above the layers' own bounds" in out
    code, out, err = run(
        capsys, "plan", "--model", "lenet", "--array", "h100:4", "--bound", "--format", "csv"
    )
    assert code == 0, err
    import io

    import pandas as pd

    frame = pd.read_csv(io.StringIO(out))
    assert list(frame.bound_s) == pytest.approx(list(bound.node_s), rel=1e-9)
    assert frame.global_bound_s.iloc[0] == pytest.approx(bound.bound_s, rel=1e-9)
    assert frame.global_gap.iloc[0] == pytest.approx(data["global_gap"], rel=1e-9)
    code, out, err = run(capsys, "evaluate", "--plan", str(saved), "--bound", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["global_gap"] == pytest.approx(data["global_gap"], rel=1e-12)
    code, _, err = run(
        capsys, "plan", "--model", "lenet", "--array", "h100:4", "--bound", "--compat", "hypar"
    )
    assert (
        code != 0
        and "global bound is for parplan's own cost model" in err
        and "Traceback" not in err
    )


@pytest.mark.parametrize("backend", ["scip", "cbc"])
def test_verbose_solve_shows_the_solver_log_on_stderr(backend, capfd):
    """``-v``: the solver's own log (its progress and bound) goes to stderr, what the solver
    library prints from C included; the report on stdout stays clean."""
    args = ["solve", "--model", "lenet", "--array", "tpu-v2:1,tpu-v3:1", "--backend", backend]
    assert main([*args, "-v"]) == 0
    out, err = capfd.readouterr()
    assert out.startswith("lenet on tpu-v2:1,tpu-v3:1") and "certificate" in out
    assert {"scip": "presolving", "cbc": "Cbc0"}[backend] in err
    assert main(args) == 0
    assert "presolving" not in capfd.readouterr().err


def test_a_step_without_progress_of_its_own_is_never_silent_for_long(capsys):
    """``still_running`` prints a line every few seconds while a model imports (an hf: model
    that traces one step per position ran for minutes without a word), its hint once."""
    import time

    from parplan.cli.common import import_hint, still_running

    err = ""
    with still_running("importing hf:rwkv", import_hint("hf:rwkv"), every_s=0.01):
        for _ in range(3000):  # until two lines came (no clock is asserted)
            err += capsys.readouterr().err
            if err.count("\n") >= 2:
                break
            time.sleep(0.01)
    lines = (err + capsys.readouterr().err).splitlines()
    assert len(lines) >= 2
    assert lines[0].startswith("[parplan] still importing hf:rwkv (") and "seq=<n>" in lines[0]
    assert all("seq=<n>" not in line for line in lines[1:])
    with still_running("importing vgg16", import_hint("vgg16"), every_s=5.0):
        pass  # a quick step prints nothing
    assert capsys.readouterr().err == ""
