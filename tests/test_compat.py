"""Compat rules (docs/costmodel.md section 9): HyPar's pricing of an IN reduction at the pooled size."""

import re
from dataclasses import replace

import pytest

from parplan.costmodel.graph import Conv2d, Graph, Pool2d, Shape
from parplan.costmodel.hardware import parse_array
from parplan.costmodel.layout import PartitionType
from parplan.costmodel.problem import Plan, Problem, Split
from parplan.costmodel.split import SplitProblem, split_terms
from parplan.costmodel.evaluate import evaluate
from parplan.errors import ConfigError
from parplan.solvers.planners import make_plan
from parplan.models.zoo import get_model

B, I = PartitionType.BATCH, PartitionType.IN


def _chain(pool: bool) -> Graph:
    layers = [Conv2d("c1", ("input",), out_channels=16, kernel=(3, 3), padding=(1, 1))]
    last = "c1"
    if pool:
        layers.append(Pool2d("p1", ("c1",), mode="max", kernel=(2, 2), stride=(2, 2)))
        last = "p1"
    layers.append(Conv2d("c2", (last,), out_channels=8, kernel=(3, 3), padding=(1, 1)))
    return Graph("chain", Shape(3, 16, 16), tuple(layers))


def _intra(graph: Graph, compat):
    p = Problem(graph, parse_array("h100:2"), batch=4, compat=compat)
    sp = SplitProblem.root(p)
    terms = split_terms(sp, (I, B), (0.5, 0.5))
    return [float(t.intra[0]) for t in terms]


def test_hypar_prices_an_in_reduction_at_the_pooled_size():
    # c1's output is 4 x 16 x 16 x 16 = 16384 elements; pooled 2x2 it is 4096.
    native, hypar = _intra(_chain(True), None), _intra(_chain(True), "hypar")
    assert native[0] == 4 * 16 * 16 * 16
    assert hypar[0] == 4 * 16 * 8 * 8
    assert native[1:] == hypar[1:]  # BATCH layers are priced the same


def test_without_pooling_the_rules_agree():
    assert _intra(_chain(False), None) == _intra(_chain(False), "hypar")


def test_compat_plans_and_prices_alexnet_at_most_as_native():
    native = Problem(get_model("alexnet"), parse_array("h100:4"), batch=128)
    hypar = Problem(get_model("alexnet"), parse_array("h100:4"), batch=128, compat="hypar")
    plan = make_plan(native, "hypar")
    # Pooled sizes are never larger, so HyPar's rule never prices a plan higher.
    assert evaluate(hypar, plan).step_time_s <= evaluate(native, plan).step_time_s
    assert evaluate(hypar, make_plan(hypar, "hypar")).step_time_s <= evaluate(
        hypar, plan
    ).step_time_s * (1 + 1e-12)


def test_rules_combine():
    """ "hypar+accpar-code" applies both rules (issue 36: HyPar's pooled reductions with the
    papers' per-level accounting): on one split, where frames change nothing, it prices as
    "hypar"; on 8 devices, a plan with IN splits at every level is priced differently from
    either rule alone, and by neither more than the published code's rule alone."""
    assert _intra(_chain(True), "hypar+accpar-code") == _intra(_chain(True), "hypar")
    native = Problem(_chain(True), parse_array("h100:8"), batch=16)
    n = len(native.planning.nodes)
    plan = Plan(
        {
            path: Split(tuple(I if v % 2 == 0 else B for v in range(n)), (0.5,) * n)
            for path, _ in native.array.inner_nodes()
        }
    )
    moved = {
        compat: evaluate(replace(native, compat=compat), plan).communication_bytes
        for compat in ("hypar", "accpar-code", "hypar+accpar-code")
    }
    both = moved.pop("hypar+accpar-code")
    assert both not in moved.values() and both <= moved["accpar-code"]


def test_unknown_compat_is_refused():
    msg = "compat must name rules among hypar, accpar-code, joined by '+' (got 'accpar')"
    with pytest.raises(ConfigError, match=re.escape(msg)):
        Problem(get_model("lenet"), parse_array("h100:2"), batch=8, compat="accpar")
    with pytest.raises(ConfigError, match="got 'hypar\\+x'"):
        Problem(get_model("lenet"), parse_array("h100:2"), batch=8, compat="hypar+x")


def test_cli_compat_and_plan_file_round_trip(tmp_path, capsys):
    from parplan.cli import main
    from parplan.costmodel.planio import read_plan_file

    path = tmp_path / "p.json"
    assert (
        main(
            [
                "plan",
                "--model",
                "alexnet",
                "--array",
                "h100:4",
                "--batch",
                "64",
                "--planner",
                "hypar",
                "--compat",
                "hypar",
                "--save",
                str(path),
            ]
        )
        == 0
    )
    assert read_plan_file(path).problem["compat"] == "hypar"
    capsys.readouterr()
    assert main(["evaluate", "--plan", str(path)]) == 0
    assert "(re-priced: the same)" in capsys.readouterr().out
