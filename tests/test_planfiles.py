"""Plan files and the commands around them: --save, evaluate, diff, compare; plan's memory check."""

import copy
import json
import pickle
from pathlib import Path

import pytest

from parplan.cli import main
from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.hardware import parse_array
from parplan.costmodel.planio import (
    check_plan_fits,
    load_plan,
    plan_document,
    read_plan_document,
    read_plan_file,
    save_plan,
)
from parplan.costmodel.problem import Problem
from parplan.errors import ConfigError
from parplan.solvers.planners import make_plan
from parplan.models.zoo import get_model


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _step_ms(text: str, label: str = "step time") -> float:
    line = next(l for l in text.splitlines() if l.startswith(label))
    value, unit = line.split()[len(label.split()) :][:2]
    return float(value) * {"s": 1e3, "ms": 1.0, "us": 1e-3, "ns": 1e-6}[unit]


def test_plans_pickle_deepcopy_and_round_trip_through_json(tmp_path):
    p = Problem(get_model("resnet18"), parse_array("tpu-v2:2,tpu-v3:2"), batch=64)
    plan = make_plan(p, "accpar")
    assert pickle.loads(pickle.dumps(plan)) == plan
    assert copy.deepcopy(plan) == plan
    path = save_plan(tmp_path / "p.json", p, plan)
    loaded = read_plan_file(path)
    assert loaded.plan == plan and load_plan(path) == plan
    assert loaded.problem["nodes"] == [n.name for n in p.planning.nodes]
    assert evaluate(p, loaded.plan).step_time_s == evaluate(p, plan).step_time_s
    doc = json.loads(path.read_text())
    assert (
        doc["format"] == "parplan-plan"
        and doc["schema_version"] == 1
        and doc["problem"]["batch"] == 64
    )


def test_save_then_evaluate_prints_the_same_step_time(tmp_path, capsys):
    path = tmp_path / "p.json"
    code, out, err = run(
        capsys,
        "plan",
        "--model",
        "vgg11",
        "--array",
        "tpu-v2:2,tpu-v3:2",
        "--batch",
        "64",
        "--save",
        str(path),
    )
    assert code == 0, err
    planned = _step_ms(out)
    code, out2, err = run(capsys, "evaluate", "--plan", str(path))
    assert code == 0, err
    assert _step_ms(out2) == planned
    assert "(re-priced: the same)" in out2
    # the same plan on slower links costs more; the file's own record is reported beside it
    code, out3, _ = run(capsys, "evaluate", "--plan", str(path), "--bandwidth", "5")
    assert code == 0 and _step_ms(out3) > planned and "re-priced here: +" in out3
    # JSON output carries the run metadata and the saved record
    code, out4, _ = run(capsys, "evaluate", "--plan", str(path), "--format", "json")
    doc = json.loads(out4)
    assert doc["model"] == "vgg11" and doc["batch"] == 64 and doc["parplan_version"]
    assert doc["saved_evaluation"]["step_time_s"] == pytest.approx(doc["step_time_s"], rel=1e-12)


def test_a_plan_file_keeps_its_fabric(tmp_path, capsys):
    """A plan made with one link per split re-prices the same without --fabric; on the devices'
    fabric (NVSwitch ports) the same plan is faster; a file without the key predates fabrics."""
    path = tmp_path / "p.json"
    code, out, err = run(
        capsys,
        "plan",
        "--model",
        "vgg11",
        "--array",
        "h100:4",
        "--batch",
        "64",
        "--fabric",
        "papers",
        "--ignore-memory",
        "--save",
        str(path),
    )
    assert code == 0, err
    assert json.loads(path.read_text())["problem"]["fabric"] == "papers"
    code, out2, err = run(capsys, "evaluate", "--plan", str(path))
    assert code == 0 and "(re-priced: the same)" in out2, err
    code, out3, err = run(capsys, "evaluate", "--plan", str(path), "--fabric", "devices")
    assert code == 0 and _step_ms(out3) < _step_ms(out), err
    doc = json.loads(path.read_text())
    del doc["problem"]["fabric"]
    path.write_text(json.dumps(doc))
    code, out4, err = run(capsys, "evaluate", "--plan", str(path))
    assert code == 0 and _step_ms(out4) == _step_ms(out), err


def test_evaluate_refuses_other_layers_and_other_trees_with_one_line(tmp_path, capsys):
    path = tmp_path / "p.json"
    assert run(capsys, "plan", "--model", "lenet", "--array", "h100:4", "--save", str(path))[0] == 0
    code, _, err = run(capsys, "evaluate", "--plan", str(path), "--model", "alexnet")
    assert (
        code == 2
        and "was made for other layers than model 'alexnet'" in err
        and "Traceback" not in err
    )
    code, _, err = run(capsys, "evaluate", "--plan", str(path), "--array", "h100:8")
    assert (
        code == 2
        and "does not fit array h100:8" in err
        and "splits for group(s) the array does not have" not in err
    )
    # same tree, other device kinds: fine
    code, out, err = run(capsys, "evaluate", "--plan", str(path), "--array", "v100:4")
    assert code == 0, err and "v100:4" in out


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "not a parplan plan file"),
        ('{"format": "parplan-plan", "schema_version": 99}', "schema_version 99 is not supported"),
        (
            '{"format": "parplan-plan", "schema_version": 1, "problem": {"nodes": ["a"]}, "splits": {}}',
            '"splits" must be an object with a "root" split',
        ),
        (
            '{"format": "parplan-plan", "schema_version": 1, "problem": {"nodes": ["a"]}, '
            '"splits": {"root": {"types": ["sideways"], "shares": [0.5]}}}',
            "node 'a' has type 'sideways'",
        ),
        (
            '{"format": "parplan-plan", "schema_version": 1, "problem": {"nodes": ["a"]}, '
            '"splits": {"root": {"types": ["batch"], "shares": [1.5]}}}',
            "node 'a' has share 1.5",
        ),
        (
            '{"format": "parplan-plan", "schema_version": 1, "problem": {"nodes": ["a"]}, '
            '"splits": {"root": {"types": ["batch"], "shares": [0.5]}, "X": {"types": [], "shares": []}}}',
            "a split path is 'root' or a string of L and R",
        ),
    ],
)
def test_malformed_plan_files_are_one_clear_error(tmp_path, capsys, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match="plan file"):
        read_plan_file(path)
    code, _, err = run(capsys, "evaluate", "--plan", str(path))
    assert code == 2 and message in err and err.count("\n") == 1


def test_missing_and_directory_plan_files(tmp_path, capsys):
    code, _, err = run(capsys, "evaluate", "--plan", str(tmp_path / "nope.json"))
    assert code == 2 and "does not exist" in err
    code, _, err = run(capsys, "evaluate", "--plan", str(tmp_path))
    assert code == 2 and "is a directory" in err


def test_diff_lists_each_differing_cell_and_its_cost(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    common = ("--model", "vgg11", "--array", "tpu-v2:1,tpu-v3:1", "--batch", "64")
    assert run(capsys, "plan", *common, "--save", str(a))[0] == 0
    assert run(capsys, "plan", *common, "--planner", "data", "--save", str(b))[0] == 0
    code, out, err = run(capsys, "diff", str(a), str(b))
    assert code == 0, err
    fa, fb = read_plan_file(a), read_plan_file(b)
    p = Problem(
        get_model("vgg11"), parse_array("tpu-v2:1,tpu-v3:1"), batch=64, overlap=True
    )  # the CLI's default
    differing = [
        v
        for v in range(len(fa.nodes))
        if (fa.plan.root.choices[v], fa.plan.root.shares[v])
        != (fb.plan.root.choices[v], fb.plan.root.shares[v])
    ]
    assert f"{len(differing)} cell" in out
    for v in differing:
        assert fa.nodes[v] in out
    ta, tb = evaluate(p, fa.plan).step_time_s, evaluate(p, fb.plan).step_time_s
    assert f"{(tb - ta) / ta:+.3%} vs a" in out
    code, out, _ = run(capsys, "diff", str(a), str(a))
    assert code == 0 and "identical" in out


def test_compare_all_prints_one_row_per_planner(tmp_path, capsys):
    csv_path = tmp_path / "c.csv"
    code, out, err = run(
        capsys,
        "compare",
        "--model",
        "vgg16",
        "--array",
        "tpu-v2:2,tpu-v3:2",
        "--planners",
        "all",
        "--csv",
        str(csv_path),
    )
    assert code == 0, err
    for name in ("accpar", "hypar", "owt", "data", "model"):
        assert any(line.startswith(name + " ") for line in out.splitlines()), name
    import pandas as pd

    frame = pd.read_csv(csv_path)
    assert list(frame.planner)[:2] == ["accpar", "accpar-topdown"] and set(frame.model) == {"vgg16"}
    data = frame.set_index("planner").loc["data"]
    assert data.speedup_over_data == pytest.approx(1.0)
    assert (frame.step_time_s * frame.speedup_over_data).round(12).nunique() == 1
    code, _, err = run(
        capsys, "compare", "--model", "lenet", "--array", "h100:2", "--planners", "accpar,fast"
    )
    assert code == 2 and "unknown planner(s) fast" in err


def test_plan_warns_when_a_device_is_over_its_memory_only_when_memory_is_ignored(capsys):
    code, _, err = run(
        capsys,
        "plan",
        "--model",
        "vgg16",
        "--array",
        "v100:2",
        "--batch",
        "2048",
        "--planner",
        "data",
        "--ignore-memory",
    )
    assert code == 0
    assert "warning: 2 of 2 devices exceed their memory" in err and "GiB of 32.00 GiB" in err
    code, _, err = run(
        capsys,
        "plan",
        "--model",
        "lenet",
        "--array",
        "h100:2",
        "--memory-limit",
        "0.001",
        "--ignore-memory",
    )
    assert code == 0 and "exceed the memory limit" in err
    code, _, err = run(capsys, "plan", "--model", "lenet", "--array", "h100:2")
    assert "warning" not in err
    # planned against memory (the default): micro-batches make it fit; without them, one error
    # line with the least memory any plan needs
    code, out, err = run(
        capsys,
        "plan",
        "--model",
        "vgg16",
        "--array",
        "v100:2",
        "--batch",
        "2048",
        "--planner",
        "data",
    )
    assert code == 0 and "micro-batches)" in out, err
    code, _, err = run(
        capsys,
        "plan",
        "--model",
        "vgg16",
        "--array",
        "v100:2",
        "--batch",
        "2048",
        "--planner",
        "data",
        "--micro-batches",
        "1",
        "--recompute",
        "no",
    )
    from parplan.solvers.fit import memory_lower_bound

    from parplan.models.zoo import get_model

    least = (
        memory_lower_bound(Problem(get_model("vgg16"), parse_array("v100:2"), batch=2048)) / 2**30
    )
    assert (
        code == 2
        and f"no plan fits: every plan keeps at least {least:.2f} GiB over the 2 devices" in err
    )
    code, _, err = run(
        capsys, "plan", "--model", "lenet", "--array", "h100:2", "--memory-limit", "0.0001"
    )
    assert code == 2 and "MiB per device on average" in err and len(err.strip().splitlines()) == 1


def test_one_device_units_version_and_output_paths(tmp_path, capsys):
    code, out, err = run(capsys, "plan", "--model", "lenet", "--array", "h100:1")
    assert code == 0, err
    assert "one device: nothing to split" in out and "(1 device, 0 levels)" in out
    example = Path(__file__).resolve().parents[1] / "examples" / "tiny_resnet.toml"
    code, out, _ = run(capsys, "plan", "--model", str(example), "--array", "h100:2", "--batch", "8")
    rows = [line.split() for line in out.splitlines() if line.startswith("conv1 ")]
    assert rows and float(rows[0][4]) > 0  # compute column in a unit where it is not 0.000
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("parplan ")
    code, _, err = run(
        capsys, "plan", "--model", "lenet", "--array", "h100:2", "--plot", str(tmp_path)
    )
    assert code == 2 and "is a directory" in err
    code, _, err = run(
        capsys,
        "plan",
        "--model",
        "lenet",
        "--array",
        "h100:2",
        "--save",
        str(tmp_path / "no" / "p.json"),
    )
    assert code == 2 and "does not exist" in err


def test_check_plan_fits_names_the_first_difference():
    p = Problem(get_model("lenet"), parse_array("h100:2"), batch=8)
    plan = make_plan(p, "data")
    doc = plan_document(p, plan)
    nodes = list(doc["problem"]["nodes"])
    nodes[1] = "renamed"
    with pytest.raises(
        ConfigError, match="layers only in the plan: renamed; layers only in the model: "
    ):
        check_plan_fits(p, nodes, plan, "plan")
    swapped = [nodes[0], doc["problem"]["nodes"][2], doc["problem"]["nodes"][1], *nodes[3:]]
    with pytest.raises(ConfigError, match="order differs at position 1"):
        check_plan_fits(p, swapped, plan, "plan")
    assert read_plan_document(doc, "doc").plan == plan


def test_overlap_is_the_cli_default_recorded_and_off_under_compat(tmp_path, capsys):
    """docs/costmodel.md section 4.2: plan overlaps weight traffic unless told not to or under a
    published planner's rules; the file records it and evaluate re-prices with it."""
    path = tmp_path / "p.json"
    common = ("--model", "vgg11", "--array", "h100:4", "--batch", "64", "--ignore-memory")
    code, out, err = run(capsys, "plan", *common, "--save", str(path))
    assert code == 0 and json.loads(path.read_text())["problem"]["overlap"] is True, err
    code, out2, err = run(capsys, "evaluate", "--plan", str(path), "--overlap", "no")
    assert code == 0 and _step_ms(out2) > _step_ms(out), err
    code, _, err = run(capsys, "plan", *common, "--compat", "hypar", "--save", str(path))
    assert code == 0 and json.loads(path.read_text())["problem"]["overlap"] is False, err


def test_plan_frame_and_per_layer_access():
    p = Problem(get_model("resnet18"), parse_array("h100:4"), batch=64)
    plan = make_plan(p, "accpar")
    frame = plan.to_frame(p)
    n = len(p.planning.nodes)
    assert len(frame) == 3 * n and list(frame.columns) == [
        "split",
        "level",
        "layer",
        "type",
        "share",
    ]
    assert list(frame.split[:n]) == [""] * n and set(frame.level) == {1, 2}
    name = p.planning.nodes[5].name
    cells = plan.layer(p, name)
    assert set(cells) == {"", "L", "R"}
    assert cells["L"] == (plan.splits["L"].choices[5].value, plan.splits["L"].shares[5])
    row = frame[(frame.split == "R") & (frame.layer == name)].iloc[0]
    assert (row.type, row.share) == cells["R"]
    with pytest.raises(ConfigError, match="no planning node 'nope'"):
        plan.layer(p, "nope")


def test_plan_report_says_when_a_half_sits_idle(capsys):
    p = Problem(get_model("lenet"), parse_array("h100:4"), batch=64)
    plan = make_plan(p, "accpar")
    from parplan.reporting.report import plan_report

    report = plan_report(p, plan, evaluate(p, plan), evaluate(p, make_plan(p, "data")))
    idle = report.idle_halves()
    ev = report.evaluation
    for path, fraction, side in idle:  # recomputed from the plan: nodes given nothing on that side
        split = plan.splits[path]
        empty = 0.0 if side == "left" else 1.0
        assert fraction == pytest.approx(
            sum(t for t, a in zip(ev.node_time_s, split.shares) if a == empty) / ev.step_time_s
        )
    if idle:
        assert "has no work for" in report.text()
    data = make_plan(p, "data")
    assert plan_report(p, data, evaluate(p, data), evaluate(p, data)).idle_halves() == []
