"""Pipeline stages over partitioned groups (docs/costmodel.md section 11; issue 32).

The pipeline's price is checked against tests/reference_model.py (stage times and memory by
the docs' rules, the schedule formula written here from section 11); the stage-split DP against
enumeration; the joint search against its special cases (one stage, data-parallel stages).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.graph import INPUT, Activation, Add, Conv2d, Graph, Shape
from parplan.costmodel.hardware import parse_array
from parplan.costmodel.problem import Plan, Problem
from parplan.costmodel.stages import (
    PipelinePlan,
    Stage,
    cut_points,
    cut_tensor,
    evaluate_pipeline,
    in_flight,
    segment,
    stage_problem,
    whole_model_stage,
)
from parplan.errors import ConfigError, InfeasibleError
from parplan.models.zoo import get_model
from parplan.pipeline.partitioned import _dp, brute_force, frontiers, plan_partitioned
from parplan.solvers.fit import fit_plan
from parplan.solvers.planners import make_plan
from reference_model import ROOT_BOX, area_where, child_box, port, reference_evaluate
from test_brute import fast, graphs
from test_costmodel import plans as random_plans


def residual_graph() -> Graph:
    return Graph(
        "res",
        Shape(8, 4, 4),
        (
            Conv2d("a", (INPUT,), out_channels=8, kernel=3, padding=1),
            Conv2d("b", ("a",), out_channels=8, kernel=3, padding=1),
            Add("sum", ("a", "b")),
            Activation("relu", ("sum",)),
            Conv2d("c", ("relu",), out_channels=4, kernel=1),
            Conv2d("d", ("c",), out_channels=4, kernel=1),
        ),
    )


def test_cut_points_are_single_tensor_cuts():
    g = residual_graph()
    order = g.analyze().order
    # after 'a' both 'a' (to the add) and nothing else cross: one tensor; after 'b' two ('a', 'b')
    assert [order[k] for k in cut_points(g)] == ["a", "sum", "relu", "c"]
    assert cut_tensor(g, order.index("relu")) == "relu"
    with pytest.raises(ConfigError, match="no single tensor"):
        cut_tensor(g, order.index("b"))
    llama = get_model("llama3-8b")
    names = [llama.analyze().order[k] for k in cut_points(llama)]
    # the embedding, both residual adds of each of the 32 blocks, the final norm
    assert names[0] == "embed" and names[-1] == "norm" and len(names) == 2 + 2 * 32
    assert all(n.endswith(("add1", "add2")) for n in names[1:-1])


def test_segment_is_the_layers_with_the_cut_tensor_as_input():
    g = residual_graph()
    order = g.analyze().order
    k = order.index("sum")
    tail = segment(g, k + 1, len(order) - 1)
    assert tail.input_shape == g.analyze().out_shape["sum"]
    assert [layer.name for layer in tail.layers] == list(order[k + 1 :])
    assert tail.layer("relu").inputs == (INPUT,)
    assert segment(g, 0, len(order) - 1) is g
    head = segment(g, 0, k)
    assert [n.name for n in Problem(head, parse_array("h100:2"), batch=4).planning.nodes] == [
        "a",
        "b",
        "sum",
    ]


@pytest.mark.parametrize("micro_batches", [1, 4])
def test_one_stage_is_the_partition_model(micro_batches):
    p = Problem(
        get_model("gpt2"), parse_array("h100:4"), batch=8, micro_batches=micro_batches, zero_stage=1
    )
    plan = make_plan(p, "accpar")
    ev, pe = evaluate(p, plan), evaluate_pipeline(p, whole_model_stage(p, plan))
    assert pe.step_time_s == pytest.approx(ev.step_time_s, rel=1e-12)
    assert dict(pe.device_memory_bytes) == pytest.approx(dict(ev.device_memory_bytes), rel=1e-12)


def test_node_memory_sums_to_the_device_memory():
    p = Problem(
        get_model("resnet18"), parse_array("a100:2,h100:2"), batch=32, zero_stage=2, micro_batches=4
    )
    ev = evaluate(p, make_plan(p, "accpar"), node_memory=True)
    for path, (state, act, again) in ev.node_memory.items():
        assert again == 0.0  # no recomputation
        assert state.sum() + act.sum() == pytest.approx(ev.device_memory_bytes[path], rel=1e-12)
        assert (state >= 0).all() and (act >= 0).all() and act.sum() > 0


def _reference_memory(problem: Problem, plan: Plan, held: int) -> dict[str, float]:
    """Each device's state + ``held`` micro-batches of activations, from the reference model's
    memory at m and at 1 micro-batch (activations are A / m at m, section 6.4)."""
    m = problem.micro_batches
    _, at_m = reference_evaluate(problem, plan)
    _, at_1 = reference_evaluate(replace(problem, micro_batches=1), plan)
    out = {}
    for path in at_m:
        per_micro_batch = (at_1[path] - at_m[path]) / (m - 1)
        out[path] = at_m[path] - per_micro_batch + held * per_micro_batch
    return out


@st.composite
def pipelines(draw):
    g = draw(graphs(max_weighted=5, max_joins=2))
    cuts = cut_points(g)
    kinds = draw(st.sampled_from(["h100:4", "a100:2,h100:2", "tpu-v2:2,tpu-v3:2", "v100:4"]))
    array = parse_array(kinds, fabric=draw(st.sampled_from(["devices", "papers"])))
    groups = draw(
        st.sampled_from(
            [("L", "R"), ("R", "L"), ("LL", "LR", "R"), ("LL", "LR", "RL", "RR"), ("",)]
        )
    )
    groups = groups[: len(cuts) + 1]
    ends = (
        sorted(
            draw(
                st.lists(
                    st.sampled_from(cuts),
                    min_size=len(groups) - 1,
                    max_size=len(groups) - 1,
                    unique=True,
                )
            )
        )
        if len(groups) > 1
        else []
    )
    m = draw(st.sampled_from([2, 4]))
    problem = Problem(
        g,
        array,
        batch=8,
        micro_batches=m,
        zero_stage=draw(st.sampled_from([0, 1, 3])),
        recompute=draw(st.booleans()),
        overlap=draw(st.booleans()),
    )
    return problem, pipeline_of(problem, groups, ends, lambda sub: draw(random_plans(sub)), draw)


def pipeline_of(problem: Problem, groups, ends, plan_of, draw) -> PipelinePlan:
    """Stages on ``groups`` ending at ``ends`` (then the last layer), each planned by
    ``plan_of(sub_problem)``, in a drawn schedule (the random pipelines of these tests and of
    tests/test_executor.py)."""
    n = len(problem.graph.analyze().order)
    stages, first = [], 0
    for path, last in zip(groups, [*ends, n - 1]):
        sub = stage_problem(problem, first, last, path)
        stages.append(Stage(first, last, path, plan_of(sub)))
        first = last + 1
    return PipelinePlan(tuple(stages), schedule=draw(st.sampled_from(["1f1b", "gpipe"])))


def _reference_boundary(sub: Problem, plan: Plan, arrives: bool, passes_on: bool) -> float:
    """Section 11's moves inside a stage's group, from the docs: boxes cut split by split; at
    each split the second side receives what both sides' readers of the input need (forward)
    and the first the same amount of summed gradient (backward); the second side receives the
    gradient of what both sides hold of the stage's output; each kind's time is a split's slower
    side plus the slower half below; kinds one after another."""
    graph, nodes = sub.graph, sub.planning.nodes
    names = [n.name for n in nodes]

    def source(name):  # the planning node (or the input) a layer's values come from
        while name != INPUT and name not in names:
            name = graph.layer(name).inputs[0]
        return name

    readers = [
        v for v, n in enumerate(names) if any(source(x) == INPUT for x in graph.layer(n).inputs)
    ]
    last = source(graph.analyze().order[-1])
    producer = names.index(last) if last != INPUT else None
    e_in = graph.input_shape.elements * sub.batch
    e_out = graph.analyze().out_shape[graph.analyze().order[-1]].elements * sub.batch
    m, bpe = sub.micro_batches, sub.bytes_per_element

    def seconds(link, side, elements):
        if elements <= 1e-12:
            return 0.0
        one = (
            link.bytes_per_s
            if side == 0 or link.right_bytes_per_s is None
            else link.right_bytes_per_s
        )
        return m * link.latency_s + elements * bpe / (link.ports * one)

    k = len(readers)

    def rec(group, path, boxes, kind, before):
        """``before``: per reader, the rectangles it needs on devices earlier in tree order."""
        if group.is_leaf:
            return 0.0
        split = plan.splits[path]
        kids = [
            [child_box(b, c.value, a, i) for b, c, a in zip(boxes, split.choices, split.shares)]
            for i in (0, 1)
        ]
        left = [port(kids[0][v], "in") for v in readers]
        right = [port(kids[1][v], "in") for v in readers]
        here = 0.0
        if kind == "input":  # what both sides need, forwarded into side 2
            both = area_where(lambda x: any(x[:k]) and any(x[k:]), *left, *right)
            here = seconds(group.link, 1, both * e_in)
        elif kind == "input-gradient":  # into side 1: side 2's first copies of what it needs
            first = area_where(
                lambda x: (
                    any(x[:k])
                    and any(x[k + j] and not x[2 * k + j] and not x[3 * k + j] for j in range(k))
                ),
                *left,
                *right,
                *left,
                *before,
            )
            here = seconds(group.link, 0, first * e_in)
        else:
            both = area_where(
                lambda x: x[0] and x[1],
                port(kids[0][producer], "out"),
                port(kids[1][producer], "out"),
            )
            here = seconds(group.link, 1, both * e_out)
        return here + max(
            rec(group.left, path + "L", kids[0], kind, before),
            rec(group.right, path + "R", kids[1], kind, [b + x for b, x in zip(before, left)]),
        )

    start = [dict(ROOT_BOX) for _ in nodes]
    none = [[] for _ in readers]
    total = 0.0
    if arrives and readers:
        total += rec(sub.array, "", start, "input", none)
        total += rec(sub.array, "", start, "input-gradient", none)
    if passes_on and producer is not None:
        total += rec(sub.array, "", start, "output", none)
    return total


@fast(40)
@given(pipelines())
def test_pipeline_price_equals_the_reference(case):
    """Section 11 by hand: stage times and memory from the reference model, transfers over the
    common group's link on min(ports, sizes) ports, the fill-drain-steady formula."""
    problem, plan = case
    ev = evaluate_pipeline(problem, plan)
    m, p = problem.micro_batches, len(plan.stages)
    info = problem.graph.analyze()
    per, memory = [], {}
    for s, stage in enumerate(plan.stages):
        sub = stage_problem(problem, stage.first, stage.last, stage.group)
        time, _ = reference_evaluate(sub, stage.plan)
        time += _reference_boundary(sub, stage.plan, s > 0, s < p - 1)
        per.append(time / m)
        held = min(m, p - s) if plan.schedule == "1f1b" else m
        for path, need in _reference_memory(sub, stage.plan, held).items():
            memory[stage.group + path] = need
    transfers = []
    for a, b in zip(plan.stages, plan.stages[1:]):
        common = 0
        while a.group[common] == b.group[common]:
            common += 1
        top = problem.array.at(a.group[:common])
        ports = min(
            top.link.ports, problem.array.at(a.group).count, problem.array.at(b.group).count
        )
        into_b = (
            (top.link.right_bytes_per_s or top.link.bytes_per_s)
            if b.group[common] == "R"
            else top.link.bytes_per_s
        )
        into_a = (
            (top.link.right_bytes_per_s or top.link.bytes_per_s)
            if a.group[common] == "R"
            else top.link.bytes_per_s
        )
        later = {
            src for name in info.order[a.last + 1 :] for src in problem.graph.layer(name).inputs
        }
        (crossing,) = [name for name in info.order[: a.last + 1] if name in later]
        size = info.out_shape[crossing].elements * problem.batch / m * problem.bytes_per_element
        transfers.append(2 * top.link.latency_s + size / (into_b * ports) + size / (into_a * ports))
    expected = sum(per) + sum(transfers) + (m - 1) * max(per + transfers)
    assert ev.step_time_s == pytest.approx(expected, rel=1e-9)
    assert dict(ev.device_memory_bytes) == pytest.approx(memory, rel=1e-9)


def test_gpipe_holds_every_micro_batch():
    """Under GPipe a stage holds the activations of all m micro-batches: the memory of the stage
    run with one micro-batch."""
    p = Problem(get_model("gpt2"), parse_array("h100:4"), batch=8, micro_batches=4)
    cuts = cut_points(p.graph)
    n = len(p.graph.analyze().order)
    stages = []
    for first, last, path in ((0, cuts[5], "L"), (cuts[5] + 1, n - 1, "R")):
        stages.append(
            Stage(first, last, path, make_plan(stage_problem(p, first, last, path), "data"))
        )
    ev = evaluate_pipeline(p, PipelinePlan(tuple(stages), schedule="gpipe"))
    for stage in stages:
        sub = stage_problem(replace(p, micro_batches=1), stage.first, stage.last, stage.group)
        for path, need in evaluate(sub, stage.plan).device_memory_bytes.items():
            assert ev.device_memory_bytes[stage.group + path] == pytest.approx(need, rel=1e-12)
    assert (
        in_flight("1f1b", 0, 2, 4) == 2
        and in_flight("1f1b", 1, 2, 4) == 1
        and in_flight("1f1b", 0, 8, 4) == 4
    )
    with pytest.raises(ConfigError, match="schedule must be one of 1f1b, gpipe"):
        in_flight("zigzag", 0, 2, 4)  # an unknown schedule is an error, never a fall-through


def _stage_instance(p, extra, seed):
    """Random stage costs (some stages do not fit) and transfers for ``p`` stages."""
    rng = np.random.default_rng(seed)
    units = p + extra
    costs = []
    for _ in range(p):
        c = np.triu(
            rng.choice([0.5, 1.0, 2.0, 3.0, 7.0], size=(units + 1, units + 1))
            * rng.random((units + 1,) * 2),
            1,
        )
        c[np.tril_indices(units + 1)] = math.inf
        c[rng.random(c.shape) < 0.15] = math.inf  # stages that do not fit
        costs.append(c)
    transfers = [np.zeros(units + 1)] + [
        np.where(np.arange(units + 1) % units == 0, math.inf, rng.random(units + 1) * 2)
        for _ in range(p - 1)
    ]
    return costs, transfers


@fast(200)
@given(st.integers(2, 4), st.integers(0, 4), st.integers(1, 9), st.integers(0, 2**32 - 1))
def test_stage_dp_equals_enumeration(p, extra, m, seed):
    costs, transfers = _stage_instance(p, extra, seed)
    value, bounds, _ = _dp(costs, transfers, m)
    expected = brute_force(costs, transfers, m)
    if math.isinf(expected):
        assert math.isinf(value)
        return
    assert value == pytest.approx(expected, rel=1e-12)
    c = [costs[s][bounds[s], bounds[s + 1]] for s in range(p)]
    x = [transfers[s][bounds[s]] for s in range(1, p)]
    assert sum(c) + sum(x) + (m - 1) * max(c + x) == pytest.approx(value, rel=1e-12)


def test_frontiers_of_homogeneous_and_mixed_arrays():
    assert frontiers(parse_array("h100:16"), 16) == [
        ("",),
        ("L", "R"),
        ("LL", "LR", "RL", "RR"),
        ("LLL", "LLR", "LRL", "LRR", "RLL", "RLR", "RRL", "RRR"),
        tuple(a + b + c + d for a in "LR" for b in "LR" for c in "LR" for d in "LR"),
    ]
    mixed = frontiers(parse_array("a100:8,h100:8"), 2)
    assert mixed == [("",), ("L", "R"), ("R", "L")]  # the order matters when the kinds differ


@pytest.fixture(scope="module")
def gpt2_joint():
    p = Problem(get_model("gpt2"), parse_array("h100:4"), batch=8)
    return p, plan_partitioned(p, limit_bytes=0.8 * 2**30)


def test_joint_fits_and_beats_its_special_cases(gpt2_joint):
    p, r = gpt2_joint
    limit = 0.8 * 2**30
    assert r.evaluation.peak_memory_bytes <= limit
    again = evaluate_pipeline(r.problem, r.plan)  # the result is priced by the evaluator
    assert again.step_time_s == r.evaluation.step_time_s
    one = fit_plan(p, "accpar", limit_bytes=limit)  # partition only, memory techniques searched
    assert r.evaluation.step_time_s <= one.evaluation.step_time_s
    # stages win here: 5% faster (10% before block checkpointing let the partition fit faster)
    assert len(r.plan.stages) > 1 and r.evaluation.step_time_s < 0.97 * one.evaluation.step_time_s
    data_only = [t for label, t, _, ok in r.priced if "data parallel inside" in label and ok]
    assert data_only and r.evaluation.step_time_s <= min(data_only)
    # the DP's candidates are never worse than what enumeration finds on the same prices
    assert all(c.estimate_s > 0 for c in r.candidates)


def test_joint_without_room_says_so():
    p = Problem(get_model("gpt2"), parse_array("h100:4"), batch=8)
    with pytest.raises(InfeasibleError, match="no pipeline plan found fits"):
        plan_partitioned(
            p, limit_bytes=0.2 * 2**30, micro_batches=(8,), zero=(3,), recompute=(True,)
        )


def test_bad_pipeline_plans_are_config_errors():
    p = Problem(residual_graph(), parse_array("h100:4"), batch=8)
    order = p.graph.analyze().order
    n = len(order)
    k = order.index("sum")
    plan = lambda first, last, path: (
        Plan({})
        if p.array.at(path).is_leaf
        else make_plan(  # noqa: E731
            stage_problem(p, first, last, path), "data"
        )
    )
    good = [Stage(0, k, "L", plan(0, k, "L")), Stage(k + 1, n - 1, "R", plan(k + 1, n - 1, "R"))]
    assert evaluate_pipeline(p, PipelinePlan(tuple(good))).step_time_s > 0
    with pytest.raises(ConfigError, match="overlap"):
        evaluate_pipeline(p, PipelinePlan((good[0], replace(good[1], group="LR"))))
    with pytest.raises(ConfigError, match="cut points"):
        b = order.index("b")
        evaluate_pipeline(
            p, PipelinePlan((replace(good[0], last=b), replace(good[1], first=b + 1)))
        )
    with pytest.raises(ConfigError, match="start at"):
        evaluate_pipeline(p, PipelinePlan((good[1], good[0])))
    with pytest.raises(ConfigError, match="cover"):
        evaluate_pipeline(p, PipelinePlan((good[0],)))
    with pytest.raises(ConfigError, match="schedule"):
        PipelinePlan(tuple(good), schedule="zigzag")
    with pytest.raises(ConfigError, match="divide the batch"):
        plan_partitioned(p, micro_batches=(3,))
    with pytest.raises(ConfigError, match="no group"):
        evaluate_pipeline(p, PipelinePlan((good[0], replace(good[1], group="RRR"))))


def _cli(capsys, *argv):
    from parplan.cli import main

    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_plan_pipeline_save_evaluate_diff(capsys, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    base = (
        "plan",
        "--model",
        "gpt2",
        "--array",
        "h100:4",
        "--batch",
        "8",
        "--pipeline",
        "--overlap",
        "no",
        "--zero",
        "1",
        "--recompute",
        "no",
        "--micro-batches",
        "8",
    )
    code, out, err = _cli(
        capsys, *base, "--memory-limit", "0.9", "--save", str(a), "--format", "json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert any(row["plan"] == "1 stage: no plan fits with these settings" for row in data["priced"])
    assert len(data["stages"]) > 1 and data["peak_device_memory_bytes"] <= 0.9 * 2**30
    assert (
        data["stages"][0]["first_layer"] == "wte" and data["stages"][-1]["last_layer"] == "lm_head"
    )
    # the saved plan re-prices to the same step, and its stages are read back as saved
    code, out, err = _cli(capsys, "evaluate", "--plan", str(a))
    assert code == 0, err
    assert "re-priced: the same" in out
    from parplan.costmodel.planio import read_plan_file

    saved = read_plan_file(a)
    assert saved.plan is None and len(saved.pipeline.stages) == len(data["stages"])
    p = Problem(get_model("gpt2"), parse_array("h100:4"), batch=8, micro_batches=8, zero_stage=1)
    assert evaluate_pipeline(p, saved.pipeline).step_time_s == pytest.approx(
        data["step_time_s"], rel=1e-12
    )
    code, out, err = _cli(
        capsys, *base[:-1], "1", "--save", str(b)
    )  # one micro-batch: the table report
    assert code == 0, err
    assert "stage  layers" in out and "priced exactly" in out
    code, out, err = _cli(capsys, "diff", str(a), str(b))
    assert code == 0, err
    assert "stage 0" in out
    code, out, err = _cli(capsys, "diff", str(a), str(a))
    assert "the plans are identical" in out
    # on an array without the stages' groups: one clear error
    code, out, err = _cli(capsys, "evaluate", "--plan", str(a), "--array", "h100:2")
    assert code == 2 and ("does not fit" in err or "no group" in err)


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--bound",), "--bound does not apply"),
        (("--max-stages", "0"), "--max-stages must be"),
        (("--micro-batches", "3"), "divide"),
    ],
)
def test_cli_pipeline_bad_options(capsys, extra, message):
    code, _, err = _cli(
        capsys, "plan", "--model", "gpt2", "--array", "h100:4", "--batch", "8", "--pipeline", *extra
    )
    assert code == 2 and message in err and "Traceback" not in err


def test_pruned_settings_lose_nothing():
    """A setting is skipped only when a bound says it cannot beat the best estimate: the best
    estimate is the same with and without the pruning; and on the real stage prices of a small
    problem the DP equals enumeration."""
    import parplan.pipeline.partitioned as joint

    p = Problem(get_model("gpt2"), parse_array("h100:4"), batch=8)
    # the one-stage plan is not the DP's: not needed here
    settings = dict(micro_batches=(4, 8), zero=(1, 3), recompute=(False, True), one_stage=False)
    pruned = plan_partitioned(p, limit_bytes=0.8 * 2**30, **settings)
    full = plan_partitioned(p, limit_bytes=0.8 * 2**30, prune=False, **settings)
    assert len(full.candidates) >= len(pruned.candidates)
    assert min(c.estimate_s for c in pruned.candidates) == min(
        c.estimate_s for c in full.candidates
    )
    best = min(full.candidates, key=lambda c: c.estimate_s)
    bounds = joint.boundaries(p)
    prices = joint._Prices(
        p, "accpar", bounds, joint.device_limits(p, 0.8 * 2**30), lambda msg: None
    )
    units = len(bounds) - 1
    m = best.setting.micro_batches
    costs = [
        prices.stage_matrix(
            g, list(prices.plans(g)), best.setting, in_flight("1f1b", s, len(best.groups), m)
        )[0]
        / m
        for s, g in enumerate(best.groups)
    ]
    elements = [p.graph.analyze().out_shape[cut_tensor(p.graph, k)].elements for k in bounds[1:-1]]
    from parplan.costmodel.stages import cut_seconds

    transfers = [np.zeros(units + 1)] + [
        np.array([math.inf] + [cut_seconds(p, a, b, e, m) for e in elements] + [math.inf])
        for a, b in zip(best.groups, best.groups[1:])
    ]
    value, _, _ = _dp(costs, transfers, m)
    assert value == pytest.approx(best.estimate_s, rel=1e-12)
    assert value == pytest.approx(brute_force(costs, transfers, m), rel=1e-12)
    from parplan.pipeline.partitioned import exact_stages

    cert = exact_stages(costs, transfers, m, backend="scip")  # the stage MIP agrees
    assert cert.status == "optimal" and cert.value_s == pytest.approx(value, rel=1e-9)


def test_stage_memo_never_changes_a_price():
    """Stages of the same structure on equal groups share an evaluation; the price is the same as
    without the memo, and the memo holds one entry for the equal middle stages."""
    from parplan.costmodel.stages import structure

    p = Problem(get_model("gpt2"), parse_array("h100:8"), batch=8, micro_batches=4)
    cuts = cut_points(p.graph)
    n = len(p.graph.analyze().order)
    # four stages; the middle two hold the same number of whole blocks
    ends = [cuts[4], cuts[8], cuts[12], n - 1]
    stages, first = [], 0
    for path, last in zip(("LL", "LR", "RL", "RR"), ends):
        stages.append(
            Stage(
                first, last, path, make_plan(stage_problem(p, first, last, path), "accpar-topdown")
            )
        )
        first = last + 1
    plan = PipelinePlan(tuple(stages))
    memo: dict = {}
    a, b = evaluate_pipeline(p, plan), evaluate_pipeline(p, plan, memo)
    assert b.step_time_s == a.step_time_s and dict(b.device_memory_bytes) == dict(
        a.device_memory_bytes
    )
    mid = [stage_problem(p, s.first, s.last, s.group).graph for s in stages[1:3]]
    assert structure(mid[0]) == structure(mid[1]) and len(memo) == 3


def test_tied_weights_across_stages_pay_one_exchange():
    """GPT-2's LM head shares the token table: split between two stages, the step adds one
    message of the table's gradient over the stages' link (section 11), by hand here."""
    p = Problem(get_model("gpt2"), parse_array("h100:4"), batch=16, micro_batches=4)
    cuts = cut_points(p.graph)
    n = len(p.graph.analyze().order)
    stages = [
        Stage(f, l, g, make_plan(stage_problem(p, f, l, g), "data"))
        for f, l, g in ((0, cuts[12], "L"), (cuts[12] + 1, n - 1, "R"))
    ]
    ev = evaluate_pipeline(p, PipelinePlan(tuple(stages)))
    link = p.array.link  # the root's: between the halves, on min(ports, 2, 2) ports
    table = 50257 * 768
    expected = link.latency_s + table * p.bytes_per_element / (
        link.bytes_per_s * min(link.ports, 2)
    )
    assert ev.tied_sync_s == pytest.approx(expected, rel=1e-12)
    one = [Stage(0, n - 1, "", make_plan(p, "data"))]
    assert evaluate_pipeline(p, PipelinePlan(tuple(one))).tied_sync_s == 0.0


def test_even_ends_divide_the_layers_as_evenly_as_the_cuts_allow():
    from parplan.costmodel.stages import even_ends

    g = get_model("llama3-8b")
    order, cuts = g.analyze().order, cut_points(g)
    for stages in (1, 2, 4, 8, len(cuts) + 1):
        ends = even_ends(g, stages)
        assert (
            len(ends) == stages and ends[-1] == len(order) - 1 and list(ends) == sorted(set(ends))
        )
        assert all(e in cuts for e in ends[:-1])
    # four stages of a 32-block model end after blocks 7, 15 and 23 (their second residual add)
    assert [order[e] for e in even_ends(g, 4)[:-1]] == [
        "layers.7.add2",
        "layers.15.add2",
        "layers.23.add2",
    ]
    with pytest.raises(ConfigError, match="pieces between its cut points"):
        even_ends(g, len(cuts) + 2)


@fast(100)
@given(st.integers(1, 4), st.integers(0, 5), st.integers(1, 9), st.integers(0, 2**32 - 1))
def test_stage_mip_equals_the_dp_and_enumeration(p, extra, m, seed):
    """Issue 32: the stage cuts as a MIP (formulation/stages.py, solved by SCIP): its proven
    optimum is the DP's value and brute force's, and its cuts, re-priced by the pipeline formula,
    give that value."""
    from parplan.pipeline.partitioned import exact_stages

    costs, transfers = _stage_instance(p, extra, seed)
    expected = brute_force(costs, transfers, m)
    cert = exact_stages(costs, transfers, m, backend="scip")
    if math.isinf(expected):
        assert cert.status == "infeasible" and cert.bounds == () and math.isinf(cert.value_s)
        return
    assert cert.status == "optimal" and cert.bound_s <= cert.value_s * (1 + 1e-9)
    assert cert.value_s == pytest.approx(expected, rel=1e-9)
    assert cert.value_s == pytest.approx(_dp(costs, transfers, m)[0], rel=1e-9)
    assert len(cert.bounds) == p + 1 and cert.bounds[0] == 0 and cert.bounds[-1] == p + extra
