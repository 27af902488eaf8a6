"""BATCH gradient exchange priced by an all-reduce on a topology (array option '@ALG:TOPO')."""

import math
from dataclasses import replace

import pytest

from parplan.collectives.allreduce import allreduce_seconds
from parplan.collectives.topology import ring, torus2d
from parplan.costmodel.collective import parse_collective
from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.hardware import load_devices, parse_array
from parplan.costmodel.problem import Problem
from parplan.errors import HardwareError
from parplan.solvers.planners import make_plan
from parplan.models.zoo import get_model


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
