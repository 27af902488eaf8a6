"""Plan pictures: the figure is written, and the numbers it draws add up to the evaluator's."""

import doctest
import math

import pytest

import parplan.reporting.plot as plot_module
from parplan.models import zoo
from parplan.cli import main
from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.hardware import parse_array
from parplan.costmodel.problem import Problem
from parplan.reporting.plot import level_choices, plot_plan, time_breakdown
from parplan.reporting.report import plan_report
from parplan.solvers.planners import make_plan
from parplan.models.transformers import TRANSFORMER_MODELS, gpt_config

PNG = b"\x89PNG\r\n\x1a\n"


def report_for(graph, array, batch, planner="accpar"):
    p = Problem(graph, parse_array(array), batch=batch)
    plan = make_plan(p, planner)
    return plan_report(p, plan, evaluate(p, plan), evaluate(p, make_plan(p, "data")))


@pytest.fixture(scope="module")
def gpt_report():
    return report_for(gpt_config(2, 1024, 16, 128, vocab=1000), "a100:2,h100:2", batch=2)


def test_doctests():
    assert doctest.testmod(plot_module).failed == 0


def test_time_breakdown_adds_up_to_node_time(gpt_report):
    t = time_breakdown(gpt_report)
    frame = gpt_report.layer_frame()
    assert list(t.layer) == list(frame.layer)
    for row, ref in zip(t.itertuples(), frame.itertuples()):
        total = row.compute_ms + row.intra_ms + row.transition_ms
        assert math.isclose(total, ref.time_s * 1e3, rel_tol=1e-9, abs_tol=1e-12), row.layer
        assert min(row.compute_ms, row.intra_ms, row.transition_ms) >= 0.0
    # a layer whose root share leaves both sides work pays its intra-layer reduction
    split = frame[(frame.share > 0) & (frame.share < 1) & frame.type.isin(["batch", "in", "out"])]
    assert (t.set_index("layer").loc[split.layer, "intra_ms"] > 0).all()


def test_level_choices_follow_the_plan(gpt_report):
    levels = level_choices(gpt_report)
    assert [d for d, *_ in levels] == [0, 1]
    depth, choices, shares, mixed = levels[0]
    assert tuple(choices) == gpt_report.plan.root.choices
    assert shares == list(gpt_report.plan.root.shares) and not any(mixed)


def test_plot_writes_a_png(tmp_path, gpt_report):
    path = tmp_path / "gpt.png"
    assert plot_plan(gpt_report, path) == str(path)
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 20_000


@pytest.mark.slow  # a 50-layer plot; test_plot_writes_a_png draws one in the default run
def test_plot_resnet50(tmp_path):
    r = report_for(zoo.resnet50(), "tpu-v2:2,tpu-v3:2", batch=256)
    path = plot_plan(r, tmp_path / "r50.png", title="ResNet-50")
    assert open(path, "rb").read(8) == PNG


def test_cli_plan_gpt2_medium_with_plot(tmp_path, monkeypatch, capsys):
    """``parplan plan --model gpt2-medium --array a100:2,h100:2 --planner accpar --plot``."""
    monkeypatch.setitem(zoo.MODELS, "gpt2-medium", TRANSFORMER_MODELS["gpt2-medium"])
    png = tmp_path / "plan.png"
    rc = main(
        [
            "plan",
            "--model",
            "gpt2-medium",
            "--array",
            "a100:2,h100:2",
            "--planner",
            "accpar",
            "--batch",
            "8",
            "--plot",
            str(png),
            "--share-grid",
            "4",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0
    assert out.startswith(
        "gpt2-medium on a100:2,h100:2 (4 devices, 2 levels), batch 8, planner accpar"
    )
    assert f"wrote {png}" in err
    assert png.read_bytes().startswith(PNG)


def test_the_table_says_which_half_takes_a_layer_left_whole():
    """Issue 36: a BATCH split at share 0 read as a batch split; the column is the left half's
    share, a layer left to one half says which, and long layer names are not cut at 24."""
    from parplan.costmodel.evaluate import evaluate
    from parplan.costmodel.graph import Graph, Linear, Shape
    from parplan.costmodel.hardware import parse_array
    from parplan.costmodel.layout import PartitionType
    from parplan.costmodel.problem import Plan, Problem, Split
    from parplan.reporting.report import plan_report

    long = "transformer.h.11.attn.c_proj_with_a_long_name"
    g = Graph(
        "three",
        Shape(64),
        (
            Linear("fc0", ("input",), out_features=64),
            Linear(long, ("fc0",), out_features=64),
            Linear("fc2", (long,), out_features=8),
        ),
    )
    p = Problem(g, parse_array("h100:2"), batch=16)
    b = PartitionType.BATCH
    plan = Plan({"": Split((b, b, b), (0.0, 1.0, 0.5))})
    text = plan_report(p, plan, evaluate(p, plan), evaluate(p, plan)).text()
    rows = {
        line.split()[0]: line.split()
        for line in text.splitlines()
        if line.startswith(("fc", "transformer"))
    }
    assert rows["fc0"][2] == "right" and rows[long][2] == "left" and rows["fc2"][2] == "batch"
    assert any(line.split()[:4] == ["layer", "kind", "type", "left"] for line in text.splitlines())
