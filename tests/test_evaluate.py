"""The one evaluator: hand-computed prices, agreement with the DP's own objective, errors."""

import math

import pytest

from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.graph import Flatten, Graph, Linear, Shape
from parplan.costmodel.hardware import parse_array
from parplan.costmodel.layout import Layout, PartitionType
from parplan.costmodel.problem import Plan, Problem, Split
from parplan.errors import ConfigError
from parplan.solvers.dp import PlanOptions, SplitProblem, frontier_dp
from parplan.solvers.planners import make_plan, planner_options
from parplan.zoo import get_model

B, I, O = PartitionType.BATCH, PartitionType.IN, PartitionType.OUT


def mlp():
    return Graph("mlp", Shape(100), (
        Linear("fc1", ("input",), out_features=50, bias=False),
        Linear("fc2", ("fc1",), out_features=20, bias=False),
    ))


def test_hand_computed_two_layer_plan():
    # two devices of 1 GFLOP/s, 1 GB/s link, no latency, 2 bytes per element, batch 8
    p = Problem(mlp(), parse_array("h100:2", bandwidth_bytes_per_s=1e9, latency_s=0.0), batch=8)
    c = p.array.left.flops_per_s
    plan = Plan({"": Split((B, I), (0.5, 0.25))})
    ev = evaluate(p, plan)
    f1 = 6 * 8 * 100 * 50
    f2 = 6 * 8 * 50 * 20
    # fc1 BATCH at 1/2: compute f1/2/c, intra |W| = 5000 elements per side
    t1 = 0.5 * f1 / c + 2 * 5000 / 1e9
    # fc2 IN at a = 1/4 after BATCH: intra |F_out| = 8*20 per side; rows->cols a(1-a)*2*|F_in|, |F_in| = 8*50
    comm = 8 * 20 + 0.25 * 0.75 * 2 * 8 * 50
    t2 = max(0.25 * f2 / c, 0.75 * f2 / c) + 2 * comm / 1e9
    assert math.isclose(ev.node_time_s[0], t1, rel_tol=1e-12)
    assert math.isclose(ev.node_time_s[1], t2, rel_tol=1e-12)
    assert math.isclose(ev.step_time_s, t1 + t2, rel_tol=1e-12)
    assert math.isclose(ev.communication_elements, 2 * 5000 + 2 * comm, rel_tol=1e-12)


def test_data_parallel_closed_form_on_a_homogeneous_hierarchy():
    g = get_model("vgg11")
    p = Problem(g, parse_array("h100:4", bandwidth_bytes_per_s=50e9, latency_s=1e-6), batch=64)
    ev = evaluate(p, make_plan(p, "data-half"))
    c = p.array.left.left.flops_per_s
    expected = sum(d.flops / (4 * c) + 2 * (1e-6 + 2 * d.weight_elements / 50e9) for d in p.root_dims())
    assert math.isclose(ev.step_time_s, expected, rel_tol=1e-12)
    # per-device memory: every device keeps all weights and gradients and a quarter of the inputs
    mem = 2 * sum(2 * d.weight_elements + d.in_elements / 4 for d in p.root_dims())
    assert set(ev.device_memory_bytes) == {"LL", "LR", "RL", "RR"}
    assert all(math.isclose(m, mem, rel_tol=1e-12) for m in ev.device_memory_bytes.values())


@pytest.mark.parametrize("model", ["alexnet", "vgg16", "resnet18", "resnet50", "sfc", "cifar-c"])
@pytest.mark.parametrize("planner", ["accpar", "hypar", "owt", "data"])
def test_dp_objective_equals_the_evaluator_price_on_one_split(model, planner):
    p = Problem(get_model(model), parse_array("tpu-v2:1,tpu-v3:1", bandwidth_bytes_per_s=20e9), batch=256)
    opts = planner_options(planner)
    value, split = frontier_dp(SplitProblem.root(p), opts)
    ev = evaluate(p, Plan({"": split}))
    got = ev.communication_elements if opts.objective.value == "communication" else ev.step_time_s
    assert math.isclose(value, got, rel_tol=1e-9)


def test_plan_for_another_array_is_refused_with_a_clear_message():
    p2 = Problem(mlp(), parse_array("h100:2"), batch=8)
    p4 = Problem(mlp(), parse_array("h100:4"), batch=8)
    with pytest.raises(ConfigError, match="plan has no split for group 'L'"):
        evaluate(p4, make_plan(p2, "data"))


def test_bad_choice_and_bad_length_are_refused():
    p = Problem(mlp(), parse_array("h100:2"), batch=8)
    with pytest.raises(ConfigError, match="has 1 choices but model 'mlp' has 2 planning nodes"):
        evaluate(p, Plan({"": Split((B,), (0.5,))}))
    with pytest.raises(ConfigError, match="node 'fc1' cannot take choice 'rows'"):
        evaluate(p, Plan({"": Split((Layout.ROWS, B), (0.5, 0.5))}))
    with pytest.raises(ConfigError, match=r"shares must lie in \[0, 1\]"):
        Split((B, B), (0.5, 1.5))


def test_breakdown_rows_cover_every_split_and_node():
    p = Problem(get_model("resnet18"), parse_array("tpu-v2:2,tpu-v3:2"), batch=128)
    ev = evaluate(p, make_plan(p, "accpar"))
    n = len(p.planning.nodes)
    assert len(ev.breakdown) == 3 * n
    root = ev.breakdown[ev.breakdown.level == ""]
    assert math.isclose(root.time_s.sum(), ev.step_time_s, rel_tol=1e-12)
    assert ev.peak_memory_bytes > 0
