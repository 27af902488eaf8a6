"""Plans that fit (docs/costmodel.md section 6.2): every plan parplan returns as fitting fits by
the independent evaluator, the memory lower bound is below every plan, "no plan fits" is never
said where brute force finds one, and the Llama cases of issue 30 beat Megatron-style plans."""

import math
from dataclasses import replace
from itertools import product

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.graph import Graph, Linear, Shape
from parplan.costmodel.hardware import parse_array
from parplan.costmodel.planio import save_plan
from parplan.costmodel.problem import Problem
from parplan.errors import ConfigError, InfeasibleError
from parplan.models.zoo import get_model
from parplan.costmodel.split import PlanOptions, SplitProblem
from parplan.solvers.brute import brute_force_split
from parplan.solvers.fit import device_limits, fit_plan, memory_lower_bound
from parplan.solvers.megatron import megatron_plan
from parplan.solvers.planners import make_plan
from reference_model import reference_evaluate
from test_brute import DEVICES, fast, graphs
from test_costmodel import plans as random_plans

EXAMPLES = __import__("pathlib").Path(__file__).resolve().parent.parent / "examples"


def in_blocks(g: Graph, cut: int) -> Graph:
    """``g`` with its layers named as two blocks (``blk.0.*`` before layer ``cut``, ``blk.1.*``
    from it on), so that recomputation checkpoints them per block (docs/costmodel.md 6.3)."""
    names = {layer.name: f"blk.{int(i >= cut)}.{layer.name}" for i, layer in enumerate(g.layers)}
    return Graph(
        g.name,
        g.input_shape,
        tuple(
            replace(
                layer, name=names[layer.name], inputs=tuple(names.get(x, x) for x in layer.inputs)
            )
            for layer in g.layers
        ),
    )


@st.composite
def fit_cases(draw, sizes=(2, 4)):
    g = draw(graphs(max_weighted=3, max_joins=1))
    if draw(st.booleans()):  # checkpointed blocks (recomputation is one of the settings searched)
        g = in_blocks(g, draw(st.integers(0, len(g.layers))))
    kinds = [draw(st.sampled_from(DEVICES)) for _ in range(draw(st.sampled_from(sizes)))]
    p = Problem(
        g,
        parse_array(",".join(f"{k}:1" for k in kinds), bandwidth_bytes_per_s=1e10),
        batch=draw(st.sampled_from([1, 4, 64])),
    )
    peak = evaluate(p, make_plan(p, "accpar", share_grid=2)).peak_memory_bytes
    micro = draw(st.sampled_from([1, 2])) if p.batch > 1 else 1
    return p, max(peak, 1.0) * draw(st.sampled_from([0.1, 0.3, 0.45, 0.7, 0.9, 1.3])), micro


def _fitting_optimum(p: Problem, limit: float, micro: int) -> float:
    """Brute force: the fastest one-split plan on the share grid 1/2 that fits, over every
    ZeRO stage and recomputation setting, per block and per layer (inf if none)."""
    best = float("inf")
    settings = [(False, "block"), (True, "block"), (True, "layer")]
    for zero, (recompute, checkpoint) in product(range(4), settings):
        q = replace(
            p, zero_stage=zero, recompute=recompute, checkpoint=checkpoint, micro_batches=micro
        )
        value, _ = brute_force_split(
            SplitProblem.root(q), PlanOptions(share_grid=2), (limit, limit)
        )
        best = min(best, value)
    return best


def _check_fit_case(case):
    p, limit, micro = case
    try:
        fit = fit_plan(
            p, "accpar", limit_bytes=limit, plan_kwargs={"share_grid": 2}, micro_batches=micro
        )
    except InfeasibleError as exc:
        if p.array.count == 2:  # one split: the search is exact, so no plan on the grid fits
            assert "no plan fits" in str(exc)
            assert _fitting_optimum(p, limit, micro) == float("inf")
        return "none"
    _, memory = reference_evaluate(fit.problem, fit.plan)
    assert max(memory.values()) <= limit * (1 + 1e-9)
    assert fit.fits and math.isclose(fit.peak_fraction, max(memory.values()) / limit, rel_tol=1e-9)
    if p.array.count == 2:  # the fastest fitting plan: DP or MIP == brute force
        assert math.isclose(
            fit.evaluation.step_time_s, _fitting_optimum(p, limit, micro), rel_tol=1e-7
        )
    return "fit"


@fast(5)  # 1,000 more in the slow set
@given(fit_cases())
def test_a_fitting_plan_fits_by_the_reference_and_is_the_fastest_on_one_split(case):
    _check_fit_case(case)


@pytest.mark.slow
@fast(1000)
@given(fit_cases())
def test_a_fitting_plan_fits_1000_instances(case):
    _check_fit_case(case)


@fast(40)
@given(st.data())
def test_the_memory_lower_bound_is_below_every_plan(data):
    """Every plan, at every ZeRO stage, keeps at least the bound summed over its devices."""
    g = data.draw(graphs(max_weighted=4, max_joins=2))
    if data.draw(st.booleans()):
        g = in_blocks(g, data.draw(st.integers(0, len(g.layers))))
    p = Problem(
        g,
        parse_array(data.draw(st.sampled_from(["h100:2", "h100:4", "tpu-v2:2,tpu-v3:1"]))),
        batch=data.draw(st.sampled_from([1, 8, 64])),
        zero_stage=data.draw(st.sampled_from([0, 1, 2, 3])),
        recompute=data.draw(st.booleans()),
        checkpoint=data.draw(st.sampled_from(["block", "layer"])),
    )
    plan = data.draw(random_plans(p))
    _, memory = reference_evaluate(p, plan)
    assert sum(memory.values()) >= memory_lower_bound(p) * (1 - 1e-12)


def test_the_exact_top_down_search_finds_a_plan_the_search_missed():
    """LeNet on two TPU v2s and two TPU v3s with a fifth of its plan's memory (one
    micro-batch): the planner's plan fits at no setting and the memory prices find none; each
    split's MIP top-down (halves at their devices' summed memory, the leaves at their own)
    finds a plan, re-checked by the reference model."""
    p = Problem(get_model("lenet"), parse_array("tpu-v2:2,tpu-v3:2"), batch=64)
    limit = 0.2 * evaluate(p, make_plan(p, "accpar", share_grid=2)).peak_memory_bytes
    kwargs = {"share_grid": 2}
    fit = fit_plan(p, "accpar", limit_bytes=limit, plan_kwargs=kwargs, micro_batches=1)
    assert fit.how.endswith("exact top-down") and fit.fits
    _, memory = reference_evaluate(fit.problem, fit.plan)
    assert max(memory.values()) <= limit * (1 + 1e-9)


def test_a_root_split_no_half_can_hold_proves_that_no_plan_fits():
    """One 70,000 x 70,000 layer (73 GiB of weights, gradients and Adam state) at half shares
    (HyPar) on two TPU v2s (16 GiB each) and two H100s: 73 GiB fit the four devices' 192 GiB,
    so the memory bound proves nothing, but every root split leaves half of the layer's state to
    the TPUs' 32 GiB, at every setting: the exact solver's proof."""
    n = 70000
    g = Graph("big", Shape(n), (Linear("fc", ("input",), out_features=n, bias=False),))
    p = Problem(g, parse_array("tpu-v2:2,h100:2"), batch=1)
    assert memory_lower_bound(p) < sum(device_limits(p, None).values())
    with pytest.raises(InfeasibleError) as err:
        fit_plan(p, "hypar")
    assert str(err.value).startswith("no plan fits: the exact solver proved that no root split")


def test_zero_stages_are_searched_least_first():
    p = Problem(get_model("vgg11"), parse_array("h100:2"), batch=64)
    free = fit_plan(p)
    assert free.problem.zero_stage == 0 and free.how == "as planned"
    need = free.evaluation.peak_memory_bytes
    # just below the stage-0 need: stage 1 shards Adam's state over the replicas at the same step time
    tight = fit_plan(p, limit_bytes=need * 0.999)
    assert tight.problem.zero_stage == 1
    assert math.isclose(tight.evaluation.step_time_s, free.evaluation.step_time_s, rel_tol=1e-12)
    assert tight.evaluation.peak_memory_bytes <= need * 0.999


def test_the_returned_fit_carries_its_whole_evaluation():
    """The search keeps only the time and memory of the plans it tries; the plan it returns,
    from whichever step (the planner's own plan, a re-planned setting, a setting found by the
    search), carries the evaluator's every row."""
    p = Problem(get_model("vgg11"), parse_array("h100:8"), batch=128)
    need = fit_plan(p).evaluation.peak_memory_bytes
    hows = []
    for fraction in (1.0, 0.8, 0.6):
        fit = fit_plan(p, limit_bytes=need * fraction)
        whole = evaluate(fit.problem, fit.plan)
        assert fit.evaluation.rows and fit.evaluation.rows == whole.rows
        assert fit.evaluation.step_time_s == whole.step_time_s
        hows.append(fit.how)
    assert hows[0] == "as planned" and hows[1].endswith("re-planned")
    assert "re-planned" not in hows[2]  # a tried setting's plan, its rows priced again


def test_an_impossible_limit_is_one_error_with_the_least_memory_needed(capsys):
    from parplan.cli import main

    assert (
        main(
            [
                "plan",
                "--model",
                "vgg11",
                "--array",
                "h100:2",
                "--batch",
                "64",
                "--memory-limit",
                "0.5",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no plan fits" in err[0] and "per device on average" in err[0]
    with pytest.raises(ConfigError):
        fit_plan(Problem(get_model("lenet"), parse_array("h100:2"), batch=8), zero=5)


def test_compat_profiles_ignore_memory_unless_asked():
    from parplan.cli.common import plans_against_memory
    from argparse import Namespace

    assert plans_against_memory(Namespace(compat=None, memory_limit=None))
    assert not plans_against_memory(Namespace(compat="hypar", memory_limit=None))
    assert plans_against_memory(Namespace(compat="hypar", memory_limit="8"))
    assert not plans_against_memory(Namespace(compat=None, memory_limit=None, ignore_memory=True))


def test_megatron_plan_is_tensor_inside_data_across():
    p = Problem(get_model("llama3-8b"), parse_array("h100:8"), batch=16)
    plan = megatron_plan(p, 2)
    names = [n.name for n in p.planning.nodes]
    tensor = dict(zip(names, plan.splits["LR"].choices))
    assert [
        tensor[f"layers.3.{x}"].value for x in ("qkv", "o", "add1", "gate_up", "down", "add2")
    ] == ["out", "in", "whole", "out", "in", "whole"]
    assert tensor["lm_head"].value == "out"
    assert {c.value for c in plan.splits[""].choices} == {"batch", "rows"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "array, batch, tensor_levels",
    [
        ("h100:8", 16, 2),  # data 2 x tensor 4
        (str(EXAMPLES / "two_h100_nodes.toml"), 32, 2),  # data 4 x tensor 4, two nodes at 50 GB/s
    ],
)
def test_llama3_8b_plans_fit_and_are_no_slower_than_megatron(
    tmp_path, capsys, array, batch, tensor_levels
):
    """Issue 30's must-show: ``parplan plan`` fits 80 GB and is no slower than the hand-written
    Megatron-style plan, which is written as a plan file and priced by ``parplan evaluate``."""
    import json

    from parplan.cli import main

    p = Problem(get_model("llama3-8b"), parse_array(array), batch=batch)
    hand = tmp_path / "megatron.json"
    save_plan(hand, p, megatron_plan(p, tensor_levels))
    assert (
        main(
            [
                "evaluate",
                "--plan",
                str(hand),
                "--model",
                "llama3-8b",
                "--array",
                array,
                "--format",
                "json",
            ]
        )
        == 0
    )
    theirs = json.loads(capsys.readouterr().out)
    assert (
        main(
            [
                "plan",
                "--model",
                "llama3-8b",
                "--array",
                array,
                "--batch",
                str(batch),
                "--format",
                "json",
            ]
        )
        == 0
    )
    ours = json.loads(capsys.readouterr().out)
    assert ours["memory_overruns"] == [] and ours["peak_device_memory_bytes"] <= 80 * 2**30
    assert theirs["memory_overruns"] == []
    assert ours["step_time_s"] <= theirs["step_time_s"]


def test_certify_with_a_memory_limit_and_no_exact_plan_reports_instead_of_crashing(capsys):
    """Issue 30: ``certify --memory-limit 3`` on VGG-16 ended in ``TypeError: 'float' object is
    not iterable`` when the exact solver had no plan."""
    from parplan.cli import main

    code = main(
        ["certify", "--model", "vgg16", "--array", "tpu-v2:1,tpu-v3:1", "--memory-limit", "3"]
    )
    out = capsys.readouterr().out
    assert code == 1 and "infeasible" in out and "x the memory it has" in out


@pytest.mark.parametrize("fraction", [0.5, 0.8])
def test_certify_with_a_memory_limit_works_on_every_backend(fraction):
    """``certify --memory-limit`` on every backend: the exact plan fits and equals brute force
    over the plans that fit (one split, per-device memory rows)."""
    p = Problem(
        get_model("lenet"),
        parse_array("tpu-v2:1,tpu-v3:1"),
        batch=64,
        zero_stage=1,
        micro_batches=2,
    )
    _certify_equals_brute_force(p, fraction)


def _certify_equals_brute_force(p: Problem, fraction: float) -> None:
    """``certify`` on every backend at ``fraction`` of the accpar plan's peak: infeasible where
    brute force finds no plan that fits, else optimal at brute force's value, and fitting."""
    from parplan.solvers.backends import available_backends
    from parplan.solvers.exact import certify

    options = PlanOptions(share_grid=2)
    need = max(evaluate(p, make_plan(p, "accpar", share_grid=2)).device_memory_bytes.values())
    limit = need * fraction
    want, _ = brute_force_split(SplitProblem.root(p), options, (limit, limit))
    for backend in available_backends():
        c = certify(p, "accpar", backend, options, memory_limit_bytes=limit)
        cert = c.exact.certificate
        assert not c.contradictions, (backend, c.contradictions)
        if want == float("inf"):
            assert cert.status == "infeasible", backend
            continue
        assert cert.status == "optimal", (backend, cert.status, cert.message)
        assert math.isclose(cert.objective, want, rel_tol=1e-5), backend
        assert max(c.exact.evaluation.device_memory_bytes.values()) <= limit * (1 + 1e-9)


def test_precision_sets_element_and_optimizer_bytes_unless_given():
    import argparse

    from parplan.cli.common import add_problem_arguments, problem_from_args

    parser = argparse.ArgumentParser()
    add_problem_arguments(parser)
    base = ["--model", "lenet", "--array", "h100:2"]
    for extra, want in (
        ([], (2.0, 12.0)),
        (["--precision", "fp32"], (4.0, 8.0)),
        (["--precision", "fp16"], (2.0, 12.0)),
        (["--precision", "fp32", "--optimizer-bytes", "4"], (4.0, 4.0)),
    ):
        p = problem_from_args(parser.parse_args(base + extra))
        assert (p.bytes_per_element, p.optimizer_bytes_per_param) == want, extra


@pytest.mark.slow
def test_overlap_keeps_the_lm_head_on_both_nodes():
    """Issue 31: on two H100 nodes joined at 50 GB/s, without overlap the fitting plan leaves the
    LM head to one node (share 0) to dodge its gradient exchange; with it (section 4.2) the head
    is split like the rest and the step is faster."""
    from parplan.costmodel.hardware import parse_array
    from parplan.costmodel.problem import Problem
    from parplan.models.zoo import get_model

    times, shares = {}, {}
    for overlap in (False, True):
        p = Problem(
            get_model("llama3-8b"),
            parse_array("examples/two_h100_nodes.toml"),
            batch=32,
            overlap=overlap,
        )
        fit = fit_plan(p, "accpar")
        head = p.planning.index("lm_head")
        times[overlap], shares[overlap] = (
            fit.evaluation.step_time_s,
            fit.plan.splits[""].shares[head],
        )
    assert shares[False] in (0.0, 1.0) and 0.0 < shares[True] < 1.0
    assert times[True] < times[False]


@pytest.mark.parametrize(
    "fraction",
    [pytest.param(0.5, marks=pytest.mark.slow), 0.7, pytest.param(0.9, marks=pytest.mark.slow)],
)
def test_every_backend_holds_the_largest_recomputed_block(fraction):
    """Two checkpointed blocks of unequal size with recomputation under a memory limit, on
    every backend: the memory rows hold the largest block again (section 6.3), so the exact
    plan equals brute force over the plans that fit, and fits by the evaluator."""
    from parplan.costmodel.graph import Activation, Conv2d, Shape

    layers, src = [], "input"
    for i, c in enumerate((24, 8, 40, 16)):
        layers += [Conv2d(f"w{i}", (src,), out_channels=c, kernel=3, padding=1)]
        layers += [Activation(f"r{i}", (f"w{i}",))]
        src = f"r{i}"
    g = in_blocks(Graph("two-blocks", Shape(8, 7, 7), tuple(layers)), 4)
    p = Problem(g, parse_array("tpu-v2:1,tpu-v3:1"), batch=16, recompute=True)
    assert p.planning.blocks == (0, 0, 1, 1)
    _certify_equals_brute_force(p, fraction)


def test_both_checkpointing_schedules_are_searched_where_the_model_has_blocks():
    """section 6.3: per block and per layer are both settings of the memory search (neither
    keeps less on every model), and `--recompute block` / `layer` fixes one."""
    import argparse

    from parplan.cli.common import add_problem_arguments, problem_from_args, technique_choices
    from parplan.solvers.fit import techniques

    gpt = Problem(get_model("gpt2"), parse_array("h100:2"), batch=8)
    vgg = Problem(get_model("vgg11"), parse_array("h100:2"), batch=8)
    assert gpt.planning.block_count == 12 and vgg.planning.block_count == 0
    both = {(t.recompute, t.checkpoint) for t in techniques(gpt, zero=0, micro_batches=1)}
    assert both == {(False, "block"), (True, "block"), (True, "layer")}
    only = {(t.recompute, t.checkpoint) for t in techniques(vgg, zero=0, micro_batches=1)}
    assert only == {(False, "block"), (True, "block")}  # no block: the two are the same
    labels = {t.label() for t in techniques(gpt, zero=0, recompute=True, micro_batches=1)}
    assert labels == {"zero-0, recompute", "zero-0, recompute per layer"}
    parser = argparse.ArgumentParser()
    add_problem_arguments(parser)
    for word, want in (("layer", "layer"), ("block", "block"), ("yes", "block")):
        args = parser.parse_args(["--model", "gpt2", "--array", "h100:2", "--recompute", word])
        p = problem_from_args(args)
        assert p.recompute and p.checkpoint == want
        assert technique_choices(args)["recompute"] == {"yes": True}.get(word, word)


def test_a_bad_checkpoint_schedule_is_one_error():
    from parplan.solvers.fit import techniques

    with pytest.raises(ConfigError, match="checkpoint must be one of block, layer"):
        Problem(get_model("gpt2"), parse_array("h100:2"), batch=8, checkpoint="blocks")
    p = Problem(get_model("gpt2"), parse_array("h100:2"), batch=8)
    with pytest.raises(ConfigError, match="recompute must be 'auto', True, False, 'block'"):
        techniques(p, recompute="sometimes")
