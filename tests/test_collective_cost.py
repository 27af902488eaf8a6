"""BATCH gradient exchange priced by an all-reduce on a topology (array option '@ALG:TOPO')."""

import math
from dataclasses import replace

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from parplan.collectives.allreduce import allreduce_seconds
from parplan.collectives.topology import ring, torus2d
from parplan.costmodel.collective import parse_collective
from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.hardware import load_devices, parse_array
from parplan.costmodel.layout import JOIN_LAYOUTS, TYPE_ORDER
from parplan.costmodel.problem import Problem, Split
from parplan.errors import HardwareError
from parplan.solvers.planners import make_plan
from parplan.models.zoo import get_model
from test_bound import random_plans
from test_brute import fast


@pytest.mark.parametrize(
    "array,topo",
    [
        ("h100:16@ring:ring", lambda bw: ring(16, bytes_per_s=bw, latency_s=1e-6)),
        ("h100:16@multitree:torus", lambda bw: torus2d(4, 4, bytes_per_s=bw, latency_s=1e-6)),
    ],
)
def test_pure_data_parallel_pays_exactly_one_allreduce_per_layer(array, topo):
    bw = 10e9
    kinds = {
        k: replace(d, memory_bytes_per_s=1e30) for k, d in load_devices().items()
    }  # compute-bound
    p = Problem(
        get_model("vgg11"),
        parse_array(array, bandwidth_bytes_per_s=bw, latency_s=1e-6, devices=kinds),
        batch=128,
    )
    ev = evaluate(p, make_plan(p, "data-half"))
    c = p.array.devices()[0].flops_per_s
    alg = p.array.collective.algorithm
    expected = sum(
        d.flops / (16 * c) + allreduce_seconds(alg, topo(bw), 2 * d.weight_elements)
        for d in p.root_dims()
    )
    assert math.isclose(ev.step_time_s, expected, rel_tol=1e-9)


def test_multitree_beats_ring_for_data_parallelism_on_a_torus():
    times = {}
    for alg in ("ring", "multitree"):
        p = Problem(
            get_model("resnet18"),
            parse_array(f"a100:16@{alg}:torus", bandwidth_bytes_per_s=25e9),
            batch=256,
        )
        times[alg] = evaluate(p, make_plan(p, "data")).step_time_s
    assert times["multitree"] < times["ring"]


def test_accpar_with_a_collective_is_not_worse_than_data_parallelism():
    p = Problem(
        get_model("resnet50"),
        parse_array("h100:8@multitree:torus", bandwidth_bytes_per_s=25e9),
        batch=512,
    )
    assert evaluate(p, make_plan(p, "accpar")).step_time_s <= evaluate(
        p, make_plan(p, "data")
    ).step_time_s * (1 + 1e-9)
    assert p.array.describe() == "h100:8@multitree:torus"


@pytest.mark.parametrize(
    "text,msg",
    [
        ("multitree", "expected ALGORITHM:TOPOLOGY"),
        ("fastest:torus", "unknown algorithm 'fastest'"),
        ("ring:hypercube", "unknown topology 'hypercube'"),
        ("ring:torus:9", "ports must be 1-4"),
    ],
)
def test_bad_collectives(text, msg):
    with pytest.raises(HardwareError, match=msg):
        parse_collective(text)


@fast(60)
@given(random_plans(), st.data())
def test_a_node_on_one_side_prices_alike_under_every_choice(case, data):
    """A share of 0 or 1 runs the node on one side: its choice is no split of it (section 2),
    so rewriting that choice leaves time, traffic and memory as they were. On collective
    arrays a BATCH split at share 0 once marked its subtree covered by an all-reduce it never
    priced (AlexNet on ``h100:8@ring:ring``: 0.487 ms against 0.990 ms)."""
    p, plan = case
    splits = dict(plan.splits)
    changed = False
    for path, split in plan.splits.items():
        choices = list(split.choices)
        for v, (c, a) in enumerate(zip(split.choices, split.shares)):
            if a in (0.0, 1.0):
                pool = JOIN_LAYOUTS if p.planning.nodes[v].is_join else TYPE_ORDER
                choices[v] = data.draw(st.sampled_from(pool))
                changed |= choices[v] != c
        splits[path] = Split(tuple(choices), split.shares)
    assume(changed)
    before, after = evaluate(p, plan), evaluate(p, replace(plan, splits=splits))
    assert after.step_time_s == pytest.approx(before.step_time_s, rel=1e-12, abs=0.0)
    assert after.communication_bytes == pytest.approx(
        before.communication_bytes, rel=1e-12, abs=1e-9
    )
    for dev, need in before.device_memory_bytes.items():
        assert after.device_memory_bytes[dev] == pytest.approx(need, rel=1e-12, abs=0.0)


def test_data_parallel_below_a_one_sided_batch_root_pays_its_allreduces():
    p = Problem(get_model("alexnet"), parse_array("h100:8@ring:ring"), batch=256)
    plan = make_plan(p, "data")
    n = len(p.planning.nodes)
    times = []
    for choice in TYPE_ORDER:
        splits = dict(plan.splits, **{"": Split((choice,) * n, (0.0,) * n)})
        times.append(evaluate(p, replace(plan, splits=splits)).step_time_s)
    assert times[0] == pytest.approx(times[1], rel=1e-12) == pytest.approx(times[2], rel=1e-12)
    # what runs is data parallelism on the four devices of one half, all-reduces included
    half = Problem(get_model("alexnet"), parse_array("h100:4@ring:ring"), batch=256)
    assert times[0] == pytest.approx(evaluate(half, make_plan(half, "data")).step_time_s, rel=1e-12)
