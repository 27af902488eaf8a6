"""Pipeline planner (PipeDream): profile parsing, the DP, its exhaustive cross-check, the CLI."""

import argparse
import doctest
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import parplan.pipeline.planner as planner_module
import parplan.pipeline.profile as profile_module
from parplan.costmodel.dims import layer_profiles
from parplan.costmodel.graph import Activation, Add, Conv2d, Flatten, Graph, Linear, Shape
from parplan.costmodel.hardware import parse_array
from parplan.errors import ConfigError, GraphError, InfeasibleError, ParplanError
from parplan.pipeline import (
    Level,
    LevelPlan,
    PipelineOptions,
    PipelineProfile,
    ProfiledLayer,
    Stage,
    SyncModel,
    evaluate_plan,
    flat_machine,
    hierarchical_machine,
    machine_from_array,
    parse_profile,
    plan_exhaustive,
    plan_pipeline,
    profile_from_graph,
    read_profile,
    sync_seconds,
    transfer_seconds,
)

DATA = Path(__file__).resolve().parents[1] / "parplan" / "data" / "pipedream"
REL = 1e-9


def chain(compute, params=None, acts=None, name="chain"):
    """A chain profile; compute in seconds (split 1/3 forward, 2/3 backward)."""
    n = len(compute)
    params = params or [0.0] * n
    acts = acts or [0.0] * n
    layers = tuple(
        ProfiledLayer(f"l{i}", "", c / 3, 2 * c / 3, a, p)
        for i, (c, p, a) in enumerate(zip(compute, params, acts))
    )
    return PipelineProfile(name, layers, tuple((f"l{i}", f"l{i + 1}") for i in range(n - 1)))


# ----------------------------------------------------------------------------------------------
# Profiles


def test_doctests():
    for mod in (profile_module, planner_module):
        assert doctest.testmod(mod).failed == 0


def test_vgg16_profile_parses_into_seconds_and_bytes():
    p = read_profile(DATA / "vgg16.graph.txt")
    assert p.name == "vgg16" and len(p.layers) == 41
    by_name = {layer.name: layer for layer in p.layers}
    conv = by_name["node4"]  # Conv2d(64, 64): 46.201 ms forward, 113.330 ms backward
    assert math.isclose(conv.forward_seconds, 0.046201, rel_tol=REL)
    assert math.isclose(conv.backward_seconds, 0.113330, rel_tol=REL)
    assert conv.activation_bytes == 1644167168.0 and conv.parameter_bytes == 147712.0
    assert conv.description.startswith("Conv2d(64, 64")
    # Topological order, ties by node number: node1 (input) first, node41 (classifier) last.
    assert p.layers[0].name == "node1" and p.layers[-1].name == "node41"
    pos = {layer.name: i for i, layer in enumerate(p.layers)}
    assert all(pos[u] < pos[v] for u, v in p.edges)
    # node32 feeds node33 (Size) and node34 (View): a branch, so the profile is linearized.
    assert not p.is_chain and any("linearized" in n for n in p.notes)
    # Parameter bytes: VGG-16 has 138,357,544 fp32 parameters.
    assert p.total_parameter_bytes == 4 * 138_357_544


def test_resnet50_profile_has_residual_cuts():
    p = read_profile(DATA / "resnet50.graph.txt")
    assert len(p.layers) == 177
    cuts = p.cut_bytes()
    assert len(cuts) == 176
    # Inside a residual block the block input stays live, so some cut carries more than the
    # activation of the layer just before it.
    assert any(c > p.layers[s].activation_bytes for s, c in enumerate(cuts))
    assert all(c >= 0 for c in cuts)


def test_cut_bytes_counts_every_live_tensor_once():
    text = "\n".join(
        [
            "a -- in -- forward_compute_time=1, backward_compute_time=1, activation_size=10, parameter_size=0",
            "b -- left -- forward_compute_time=1, backward_compute_time=1, activation_size=20, parameter_size=0",
            "c -- right -- forward_compute_time=1, backward_compute_time=1, activation_size=40, parameter_size=0",
            "d -- add -- forward_compute_time=1, backward_compute_time=1, activation_size=80, parameter_size=0",
            "\ta -- b",
            "\ta -- c",
            "\tb -- d",
            "\tc -- d",
            "\ta -- d",
        ]
    )
    p = parse_profile(text, source="diamond")
    assert [layer.name for layer in p.layers] == ["a", "b", "c", "d"]
    # After a: a's output (to b, c, d) once = 10. After b: a (to c, d) + b (to d) = 30.
    # After c: a (to d) + b + c = 70.
    assert p.cut_bytes() == (10.0, 30.0, 70.0)


def test_list_activation_sizes_are_summed():
    line = (
        "n1 -- LSTM(2, 2) -- forward_compute_time=3.0, backward_compute_time=5.0, "
        "activation_size=[6291456.0; 131072.0; 131072.0], parameter_size=8.0"
    )
    p = parse_profile(line)
    assert p.layers[0].activation_bytes == 6291456.0 + 2 * 131072.0
    assert math.isclose(p.layers[0].compute_seconds, 0.008, rel_tol=REL)


NODE = "{} -- I -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=0"


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "node1 -- Input -- forward_compute_time=1.0, backward_compute_time=x, activation_size=1, parameter_size=0",
            "profile 'bad.txt' line 1: backward_compute_time must be a number (got 'x')",
        ),
        (
            "\n\nnode1 -- Input -- forward_compute_time=1.0, activation_size=1, parameter_size=0",
            "profile 'bad.txt' line 3: missing backward_compute_time",
        ),
        (
            NODE.format("node1").replace("activation_size=1", "activation_size=-1"),
            "profile 'bad.txt' line 1: activation_size must be a finite number >= 0 (got -1)",
        ),
        (
            NODE.format("node1").replace("activation_size", "speed=1, activation_size"),
            "profile 'bad.txt' line 1: unknown field 'speed'",
        ),
        (
            "node1 Input forward_compute_time=1.0",
            "profile 'bad.txt' line 1: expected 'nodeID -- description -- forward_compute_time=<ms>",
        ),
        (
            NODE.format("node1") + "\n\tnode1 -- node9",
            "profile 'bad.txt' line 2: edge node1 -- node9 names undeclared node 'node9'; declare it with a node line",
        ),
        (
            NODE.format("node1") + "\n\tnode1 node2",
            "profile 'bad.txt' line 2: an indented line must be an edge '<TAB>src -- dst' (got 'node1 node2')",
        ),
        (
            NODE.format("node1") + "\n" + NODE.format("node1"),
            "profile 'bad.txt' line 2: node 'node1' is already declared on line 1",
        ),
        (
            NODE.format("a") + "\n" + NODE.format("b") + "\n\ta -- b\n\tb -- a",
            "profile 'bad.txt': the edges form a cycle",
        ),
        ("", "profile 'bad.txt': no node lines found"),
    ],
)
def test_malformed_profiles_name_file_and_line(text, message):
    with pytest.raises(GraphError) as err:
        parse_profile(text, source="bad.txt")
    assert str(err.value).startswith(message)


def test_missing_profile_file():
    with pytest.raises(ConfigError, match="profile file 'no/such/graph.txt' does not exist"):
        read_profile("no/such/graph.txt")


def test_profile_from_graph_matches_layer_profiles():
    g = Graph(
        "res",
        Shape(8, 8, 8),
        (
            Conv2d("c1", ("input",), out_channels=8, kernel=3, padding=1),
            Activation("r1", ("c1",)),
            Conv2d("c2", ("r1",), out_channels=8, kernel=3, padding=1),
            Add("add", ("c2", "r1")),
            Flatten("flat", ("add",)),
            Linear("fc", ("flat",), out_features=10),
        ),
    )
    p = profile_from_graph(g, batch=4, device=1e12, bytes_per_element=2)
    ref = {lp.name: lp for lp in layer_profiles(g, 4)}
    for layer in p.layers:
        assert math.isclose(layer.compute_seconds, ref[layer.name].flops / 1e12, rel_tol=REL)
        assert math.isclose(layer.forward_seconds * 2, layer.backward_seconds, rel_tol=REL)
        assert layer.activation_bytes == 2 * ref[layer.name].out_elements
        assert layer.parameter_bytes == 2 * ref[layer.name].weight_elements
    # c1 = 6 * B * Co * HW * Ci * k^2 = 6*4*8*64*8*9 FLOPs.
    assert math.isclose(p.layers[0].compute_seconds, 6 * 4 * 8 * 64 * 8 * 9 / 1e12, rel_tol=REL)
    assert not p.is_chain  # the residual edge r1 -> add skips c2
    assert p.cut_bytes()[2] == 2 * 2 * 4 * 8 * 64  # after c2: c2's and r1's outputs


def test_profile_on_a_device_is_the_cost_models_compute_time():
    """One compute formula: a graph profiled on an array's device takes, layer by layer summed,
    what the cost model's nodes take on that device (rooflines; element-wise layers by HBM)."""
    from parplan.costmodel.problem import Problem
    from parplan.models.zoo import get_model

    g = get_model("resnet-2block")
    machine = machine_from_array(parse_array("a100:2"))
    p = profile_from_graph(g, batch=16, device=machine.device, bytes_per_element=2)
    nodes = Problem(g, parse_array("a100:2"), batch=16).planning.nodes
    expected = sum(n.dims.scaled(16).compute_seconds(machine.device, 2) for n in nodes)
    assert math.isclose(sum(layer.compute_seconds for layer in p.layers), expected, rel_tol=1e-12)
    relu = [layer for layer in p.layers if layer.description == "Activation"][0]
    assert relu.compute_seconds > 0  # memory-bound, as in the cost model


# ----------------------------------------------------------------------------------------------
# Machines and cost primitives


def test_machine_levels_from_arrays():
    m = machine_from_array(parse_array("a100:16", fabric="papers"))
    assert [(lvl.machines, lvl.bytes_per_s) for lvl in m.levels] == [(16, 300e9)]
    assert any("merged" in n for n in m.notes)
    nodes = machine_from_array(
        parse_array("a100:16")
    )  # two DGX A100s: NVSwitch inside, a 25 GB/s rail each
    assert [(lvl.machines, lvl.bytes_per_s, lvl.latency_s) for lvl in nodes.levels] == [
        (8, 300e9, 2e-6),
        (2, 25e9, 5e-6),
    ]
    unmerged = machine_from_array(parse_array("a100:16"), merge_equal_levels=False)
    assert [lvl.machines for lvl in unmerged.levels] == [2, 2, 2, 2] and unmerged.devices == 16
    het = machine_from_array(parse_array("tpu-v2:4,tpu-v3:4"))
    assert het.device_flops_per_s == 45e12
    assert any("slowest, tpu-v2" in n for n in het.notes)
    odd = machine_from_array(parse_array("a100:6"))
    assert [lvl.machines for lvl in odd.levels] == [6]
    assert any("not a perfect binary tree" in n for n in odd.notes)


def test_hierarchy_with_distinct_levels(tmp_path):
    tree = {"left": {"devices": "v100:4"}, "right": {"devices": "v100:4"}, "gb_per_s": 1.25}
    path = tmp_path / "two_servers.json"
    path.write_text(json.dumps(tree))
    m = machine_from_array(parse_array(str(path)))
    assert [(lvl.machines, lvl.bytes_per_s) for lvl in m.levels] == [(4, 150e9), (2, 1.25e9)]
    assert m.devices_below(1) == 4


def test_sync_and_transfer_known_values():
    lvl = Level(1, 8, bytes_per_s=1e9, latency_s=1e-3)
    # Ring: 2 (m-1)/m * bytes / B + 2 (m-1) latency.
    assert math.isclose(sync_seconds(4e9, 4, lvl), 2 * 3 / 4 * 4 + 2 * 3 * 1e-3, rel_tol=REL)
    assert math.isclose(sync_seconds(4e9, 4, lvl, SyncModel.PIPEDREAM), 2 * 3 * 4, rel_tol=REL)
    assert sync_seconds(4e9, 1, lvl) == 0.0
    assert math.isclose(transfer_seconds(5e8, lvl), 2 * (1e-3 + 0.5), rel_tol=REL)


def test_bad_options_and_levels():
    with pytest.raises(ConfigError, match=r"memory limit must be > 0 bytes \(got 0\)"):
        PipelineOptions(memory_limit_bytes=0)
    with pytest.raises(
        ParplanError, match=r"level 1: link bandwidth must be > 0 bytes/s \(got 0\)"
    ):
        flat_machine(4, 0)


# ----------------------------------------------------------------------------------------------
# Known answers


def test_hand_computed_two_stage_plan():
    # Layers of 3 s and 1 s; huge weights make replication useless; 2 devices.
    p = chain([3.0, 1.0, 2.0], params=[0, 0, 8e9], acts=[1e8, 1e8, 1e8])
    m = flat_machine(2, bytes_per_s=1e9)
    res = plan_pipeline(p, m)
    assert [(s.first, s.last, s.replicas) for s in res.stages] == [(0, 0, 1), (1, 2, 1)]
    # max(3, 1 + 2, transfer 2 * 1e8 / 1e9 = 0.2) = 3.
    assert math.isclose(res.seconds_per_minibatch, 3.0, rel_tol=REL)
    assert res.bottleneck == "stage 0"
    assert math.isclose(res.single_device_seconds, 6.0, rel_tol=REL)
    # Data parallel: max(6, 2 * 1/2 * 8e9 / 1e9 = 8) / 2 = 4.
    assert math.isclose(res.data_parallel_seconds, 4.0, rel_tol=REL)
    assert math.isclose(res.speedup_vs_data_parallel, 4 / 3, rel_tol=REL)
    assert math.isclose(res.stages[0].cut_seconds, 0.2, rel_tol=REL)
    # 1F1B: input stage holds 2 minibatches (NOAM = ceil(2 / 1)), the last one 1.
    assert res.noam == 2 and [s.in_flight for s in res.stages] == [2, 1]
    assert res.stages[1].weight_stash_bytes == 8e9 and res.stages[0].activation_stash_bytes == 2e8


def test_in_flight_counts_follow_1f1b():
    p = chain([1.0] * 4)
    m = flat_machine(4, 1e9)
    plan = LevelPlan(1, (Stage(0, 1, 2), Stage(2, 2, 1), Stage(3, 3, 1)))
    res = evaluate_plan(p, m, plan)
    assert [s.in_flight for s in res.stages] == [2, 2, 1]  # ceil(4/2), ceil(2/1), ceil(1/1)
    straight = evaluate_plan(p, m, LevelPlan(1, tuple(Stage(i, i, 1) for i in range(4))))
    assert [s.in_flight for s in straight.stages] == [4, 3, 2, 1]


def test_transfer_bottleneck_is_reported():
    p = chain([1.0, 1.0], acts=[4e9, 0])
    res = evaluate_plan(p, flat_machine(2, 1e9), LevelPlan(1, (Stage(0, 0, 1), Stage(1, 1, 1))))
    assert math.isclose(res.seconds_per_minibatch, 8.0, rel_tol=REL)
    assert res.bottleneck == "transfer after stage 0 (level 1)"


def test_evaluator_rejects_malformed_plans():
    p = chain([1.0] * 3)
    m = flat_machine(3, 1e9)
    with pytest.raises(
        ConfigError, match="stages must cover the layers contiguously; stage 2..2 breaks at 1"
    ):
        evaluate_plan(p, m, LevelPlan(1, (Stage(0, 0, 1), Stage(2, 2, 2))))
    with pytest.raises(ConfigError, match="stages use 2 machines; level 1 has exactly 3"):
        evaluate_plan(p, m, LevelPlan(1, (Stage(0, 0, 1), Stage(1, 2, 1))))
    with pytest.raises(ConfigError, match="is replicated but replication is off"):
        evaluate_plan(
            p, m, LevelPlan(1, (Stage(0, 0, 2), Stage(1, 2, 1))), PipelineOptions(replication=False)
        )
    ok = evaluate_plan(
        p, m, LevelPlan(1, (Stage(0, 0, 1), Stage(1, 2, 1))), PipelineOptions(allow_idle=True)
    )
    assert ok.devices_used == 2


def test_straight_pipeline_needs_enough_layers():
    p = chain([1.0, 2.0])
    with pytest.raises(
        InfeasibleError,
        match="a straight pipeline needs one layer per device but has 2 layers for 4",
    ):
        plan_pipeline(p, flat_machine(4, 1e9), PipelineOptions(replication=False))
    res = plan_pipeline(
        p, flat_machine(4, 1e9), PipelineOptions(replication=False, allow_idle=True)
    )
    assert res.devices_used == 2 and math.isclose(res.seconds_per_minibatch, 2.0, rel_tol=REL)


def test_memory_limit_is_respected_and_infeasibility_explained():
    p = chain([1.0] * 4, params=[1e9] * 4, acts=[1e9] * 4)
    m = flat_machine(4, 1e9)
    free = plan_pipeline(p, m)
    limited = plan_pipeline(p, m, PipelineOptions(memory_limit_bytes=4.5e9))
    assert limited.memory_fits and max(s.memory_bytes for s in limited.stages) <= 4.5e9
    assert limited.seconds_per_minibatch >= free.seconds_per_minibatch - 1e-12
    with pytest.raises(
        InfeasibleError,
        match=r"no pipeline fits the memory limit of 1 GiB per device \(the largest",
    ):
        plan_pipeline(p, m, PipelineOptions(memory_limit_bytes=2**30))


# ----------------------------------------------------------------------------------------------
# DP == exhaustive


@st.composite
def instances(draw, multi_level: bool):
    n = draw(st.integers(1, 6))
    compute = draw(st.lists(st.floats(0.0, 2.0, allow_nan=False), min_size=n, max_size=n))
    params = draw(st.lists(st.sampled_from([0.0, 1e8, 5e8, 2e9, 6e9]), min_size=n, max_size=n))
    acts = draw(st.lists(st.sampled_from([0.0, 1e7, 3e8, 1e9]), min_size=n, max_size=n))
    if multi_level:
        machine = hierarchical_machine(
            [
                (draw(st.integers(1, 3)), draw(st.sampled_from([2e9, 1e10])), 0.0),
                (
                    draw(st.integers(1, 3)),
                    draw(st.sampled_from([2e8, 1e9])),
                    draw(st.sampled_from([0.0, 1e-3])),
                ),
            ]
        )
        memory = draw(st.sampled_from([None, 4e9, 1e10, 3e10]))
    else:
        machine = flat_machine(
            draw(st.integers(1, 5)),
            draw(st.sampled_from([2e8, 1e9, 5e9])),
            draw(st.sampled_from([0.0, 1e-3])),
        )
        memory = draw(st.sampled_from([None, 3e9, 8e9, 2e10]))
    options = PipelineOptions(
        memory_limit_bytes=memory,
        replication=draw(st.booleans()),
        # Idle devices with a memory limit on two levels are conservative (tested separately).
        allow_idle=draw(st.booleans()) and not (multi_level and memory is not None),
        sync=draw(st.sampled_from(list(SyncModel))),
    )
    return chain(compute, params, acts), machine, options


def _solve(fn, *args):
    try:
        return fn(*args)
    except InfeasibleError:
        return None


def _check_certificates(res):
    # The solver's objective equals the evaluator's price, and the flattened stage and cut
    # terms reproduce it (the nested recurrence and the flat view agree).
    assert math.isclose(res.objective_seconds, res.seconds_per_minibatch, rel_tol=REL)
    flat = max([s.seconds_per_minibatch for s in res.stages] + [s.cut_seconds for s in res.stages])
    assert math.isclose(flat, res.seconds_per_minibatch, rel_tol=REL)


@settings(max_examples=400)
@given(instances(multi_level=False))
def test_dp_equals_exhaustive_on_random_chains(instance):
    profile, machine, options = instance
    dp = _solve(plan_pipeline, profile, machine, options)
    ex = _solve(plan_exhaustive, profile, machine, options)
    assert (dp is None) == (ex is None)
    if dp is None:
        return
    _check_certificates(dp)
    assert dp.memory_fits
    assert math.isclose(
        dp.seconds_per_minibatch, ex.seconds_per_minibatch, rel_tol=REL, abs_tol=1e-12
    )
    if options.replication and options.memory_limit_bytes is None:
        # Data parallelism is one of the candidate plans.
        assert dp.seconds_per_minibatch <= dp.data_parallel_seconds * (1 + REL)


@settings(max_examples=200)
@given(instances(multi_level=True))
def test_dp_equals_exhaustive_on_two_level_machines(instance):
    profile, machine, options = instance
    dp = _solve(plan_pipeline, profile, machine, options)
    ex = _solve(plan_exhaustive, profile, machine, options)
    assert (dp is None) == (ex is None)
    if dp is None:
        return
    _check_certificates(dp)
    assert math.isclose(
        dp.seconds_per_minibatch, ex.seconds_per_minibatch, rel_tol=REL, abs_tol=1e-12
    )


def test_two_level_memory_limit_is_exact():
    # A case where assuming every stage could be the input stage (in-flight = all devices)
    # would reject every plan; the exact 1F1B count finds the optimum.
    profile = chain([2.0, 2.0, 0.5], params=[2e9, 3e9, 2e9], acts=[2e9, 2e9, 5e8])
    machine = hierarchical_machine([(2, 1e10, 0.0), (2, 1e9, 0.0)])
    options = PipelineOptions(memory_limit_bytes=8e9)
    dp = plan_pipeline(profile, machine, options)
    ex = plan_exhaustive(profile, machine, options)
    assert dp.memory_fits and ex.memory_fits
    assert math.isclose(dp.seconds_per_minibatch, ex.seconds_per_minibatch, rel_tol=REL)
    assert math.isclose(dp.seconds_per_minibatch, 3.5, rel_tol=REL)


def test_memory_with_idle_devices_on_two_levels_is_safe():
    profile = chain([1.0, 1.0, 2.0, 1.0], params=[2e9, 1e9, 3e9, 3e9], acts=[1e9, 2e9, 1e9, 1e9])
    machine = hierarchical_machine([(2, 1e10, 0.0), (3, 1e9, 0.0)])
    options = PipelineOptions(memory_limit_bytes=1e10, allow_idle=True)
    dp = plan_pipeline(profile, machine, options)
    ex = plan_exhaustive(profile, machine, options)
    assert dp.memory_fits and ex.memory_fits
    # Known gap of this one combination: 3.0 s found, 2.0 s possible.
    assert math.isclose(dp.seconds_per_minibatch, 3.0, rel_tol=REL)
    assert math.isclose(ex.seconds_per_minibatch, 2.0, rel_tol=REL)
    assert any("assume the machines after them use all their devices" in n for n in dp.notes)


def test_exhaustive_refuses_huge_instances():
    with pytest.raises(ConfigError, match="more than 10 plans"):
        plan_exhaustive(chain([1.0] * 6), flat_machine(4, 1e9), max_plans=10)


# ----------------------------------------------------------------------------------------------
# Real profiles and zoo models


@pytest.mark.parametrize("name", ["vgg16", "resnet50"])
@pytest.mark.parametrize(
    "array, kwargs",
    [
        ("a100:16", {}),
        ("a100:16", {"merge_equal_levels": False}),
    ],
)
def test_pipedream_profiles_plan_on_16_devices(name, array, kwargs):
    profile = read_profile(DATA / f"{name}.graph.txt")
    machine = machine_from_array(parse_array(array, fabric="papers"), **kwargs)
    res = plan_pipeline(profile, machine)
    assert res.devices_used == 16
    _check_certificates(res)
    # Fast NVLink everywhere: plain data parallelism is optimal (weight sync hides under compute).
    assert math.isclose(res.seconds_per_minibatch, res.data_parallel_seconds, rel_tol=REL)
    assert math.isclose(res.speedup_vs_single, 16.0, rel_tol=1e-6)


@pytest.mark.parametrize("name", ["vgg16", "resnet50"])
def test_pipedream_profiles_pipeline_on_slow_interconnect(name):
    # 4 servers x 4 GPUs, 10 GB/s inside, 1.25 GB/s (10 Gbit/s) between: PipeDream's setting.
    profile = read_profile(DATA / f"{name}.graph.txt")
    machine = hierarchical_machine([(4, 10e9, 5e-6), (4, 1.25e9, 20e-6)])
    options = PipelineOptions(sync=SyncModel.PIPEDREAM)
    res = plan_pipeline(profile, machine, options)
    _check_certificates(res)
    assert len(res.stages) >= 2 and res.speedup_vs_data_parallel > 1.5
    assert res.devices_used == 16 and res.noam == -(-16 // res.stages[0].replicas)
    table = res.to_table()
    assert "linearized in topological order" in table and "NOAM" in table
    json.dumps(res.to_dict())


def test_memory_limit_on_vgg16_profile():
    profile = read_profile(DATA / "vgg16.graph.txt")
    machine = flat_machine(16, 1.25e9)
    free = plan_pipeline(profile, machine)
    limit = 0.6 * max(s.memory_bytes for s in free.stages)
    res = plan_pipeline(profile, machine, PipelineOptions(memory_limit_bytes=limit))
    assert res.memory_fits and max(s.memory_bytes for s in res.stages) <= limit
    assert res.seconds_per_minibatch >= free.seconds_per_minibatch * (1 - REL)


def test_zoo_vgg16_on_heterogeneous_array():
    zoo = pytest.importorskip("parplan.models.zoo")
    graph = zoo.get_model("vgg16")
    machine = machine_from_array(parse_array("tpu-v2:8,tpu-v3:8"))
    profile = profile_from_graph(graph, batch=64, device=machine.device_flops_per_s)
    res = plan_pipeline(profile, machine)
    _check_certificates(res)
    # Cross-check: the single-device time is the model's training FLOPs on a TPU-v2.
    flops = sum(lp.flops for lp in layer_profiles(graph, 64))
    assert math.isclose(res.single_device_seconds, flops / 45e12, rel_tol=1e-9)
    assert any("heterogeneous" in n for n in res.notes)
    straight = plan_pipeline(profile, machine, PipelineOptions(replication=False))
    assert [s.replicas for s in straight.stages] == [1] * 16
    assert [s.in_flight for s in straight.stages] == list(range(16, 0, -1))


# ----------------------------------------------------------------------------------------------
# CLI


def _parser():
    from parplan.cli.pipeline import add_collectives_parser, add_pipeline_parser

    parser = argparse.ArgumentParser(prog="parplan")
    sub = parser.add_subparsers()
    add_pipeline_parser(sub)
    add_collectives_parser(sub)
    return parser


def test_cli_pipeline_profile_json(capsys):
    args = _parser().parse_args(
        [
            "pipeline",
            "--profile",
            str(DATA / "vgg16.graph.txt"),
            "--array",
            "v100:16",
            "--bandwidth",
            "1.25",
            "--memory-limit",
            "24",
            "--format",
            "json",
        ]
    )
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "vgg16" and out["machine"]["devices"] == 16
    assert out["options"]["memory_limit_bytes"] == 24 * 2**30
    assert all(s["memory_bytes"] <= 24 * 2**30 for s in out["stages"])
    assert sum(s["replicas"] for s in out["stages"]) == 16
    assert out["noam"] == out["stages"][0]["in_flight"]


def test_cli_pipeline_pipedream_code(capsys):
    args = _parser().parse_args(
        [
            "pipeline",
            "--profile",
            str(DATA / "vgg16.graph.txt"),
            "--array",
            "v100:4",
            "--bandwidth",
            "1",
            "--cost-model",
            "pipedream-code",
            "--format",
            "json",
        ]
    )
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    # the optimizer prints (0, 15) x3, (15, 40) x1 and 0.175732624 s per minibatch on these settings
    assert out["levels"] == [
        [{"start": 0, "end": 15, "replicas": 3}, {"start": 15, "end": 40, "replicas": 1}]
    ]
    assert out["seconds_per_minibatch"] == pytest.approx(0.175732624, rel=1e-9)
    assert [p["plan"] for p in out["plans"]] == ["pipedream-code", "parplan"]
    args = _parser().parse_args(
        [
            "pipeline",
            "--profile",
            str(DATA / "vgg16.graph.txt"),
            "--array",
            "v100:4",
            "--bandwidth",
            "1",
            "--cost-model",
            "pipedream-code",
        ]
    )
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "[0, 15)  x3" in text and "pipedream-code        2        175.733" in text


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--cost-model", "pipedream-code", "--memory-limit", "8"],
            "reproduces the optimizer's defaults",
        ),
        (["--compression", "2"], "--compression is an option of --cost-model pipedream-code"),
        (["--cost-model", "pipedream-code", "--compression", "0"], "compression ratio must be > 0"),
    ],
)
def test_cli_pipeline_pipedream_code_refuses(extra, message):
    args = _parser().parse_args(
        ["pipeline", "--profile", str(DATA / "vgg16.graph.txt"), "--array", "v100:4", *extra]
    )
    with pytest.raises(ConfigError, match=message):
        args.func(args)


def test_cli_pipeline_model_table(capsys):
    pytest.importorskip("parplan.models.zoo")
    args = _parser().parse_args(
        ["pipeline", "--model", "vgg16", "--array", "a100:4", "--no-replication"]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "pipeline plan for vgg16" in out and "replication off (straight pipeline)" in out


def test_cli_pipeline_user_errors_are_parplan_errors():
    parser = _parser()
    args = parser.parse_args(["pipeline", "--profile", "missing.txt", "--array", "a100:4"])
    with pytest.raises(ConfigError, match="profile file 'missing.txt' does not exist"):
        args.func(args)
    args = parser.parse_args(
        [
            "pipeline",
            "--profile",
            str(DATA / "vgg16.graph.txt"),
            "--array",
            "a100:4",
            "--memory-limit",
            "-1",
        ]
    )
    with pytest.raises(ConfigError, match=r"--memory-limit must be > 0 GiB \(got -1.0\)"):
        args.func(args)


def test_a_level_too_wide_for_the_dp_is_refused_at_once():
    """Issue 36: ``pipeline --array v100:65536`` ran for ever (the DP's table loop is quadratic in
    the machines of a level); it is a one-line error now, before any table is built."""
    from parplan.pipeline.dp import MAX_LEVEL_MACHINES

    with pytest.raises(ConfigError, match=f"limit {MAX_LEVEL_MACHINES}"):
        plan_pipeline(chain([1.0, 2.0]), flat_machine(MAX_LEVEL_MACHINES + 1, bytes_per_s=1e9))
