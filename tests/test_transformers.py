"""Transformer zoo: published parameter counts, the batch x sequence view, the Megatron pattern."""

import doctest
import math

import pytest

import parplan.models.transformers as transformers_module
from parplan.costmodel.dims import layer_dims
from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.graph import INPUT, Attention, Conv2d, Embedding, Linear, Shape
from parplan.costmodel.hardware import parse_array
from parplan.costmodel.layout import PartitionType, transition_table
from parplan.costmodel.split import PlanOptions
from parplan.costmodel.problem import Problem
from parplan.errors import GraphError
from parplan.solvers.exact import solve_exact
from parplan.solvers.planners import make_plan
from parplan.models.transformers import (
    GPT3_SIZES,
    TRANSFORMER_MODELS,
    TRANSFORMER_TITLES,
    TiedGraph,
    bert_config,
    gpt3,
    gpt_config,
    llama_config,
)

B, I, O = PartitionType.BATCH, PartitionType.IN, PartitionType.OUT

# Hugging Face's counts (sum of p.numel() over BertModel / GPT2LMHeadModel parameters, the LM
# head tied to the token embedding) and the papers' rounded figures.
PARAMS = {
    "bert-base": (109_482_240, 110e6),
    "bert-large": (335_141_888, 340e6),
    "gpt2": (124_439_808, 124e6),
    "gpt2-medium": (354_823_168, 355e6),
    "gpt2-large": (774_030_080, 774e6),
    "gpt2-xl": (1_557_611_200, 1558e6),
    # Hugging Face model cards / torchvision (the configs' own sums, to the parameter)
    "llama3-8b": (8_030_261_248, 8.03e9),
    "llama3-70b": (70_553_706_496, 70.6e9),
    "mistral-7b": (7_241_732_096, 7.24e9),
    "mixtral-8x7b": (46_702_792_704, 46.7e9),
    "vit-b16": (86_567_656, 86.6e6),
}
# (layers, hidden, seq)
CONFIGS = {
    "bert-base": (12, 768, 512),
    "bert-large": (24, 1024, 512),
    "gpt2": (12, 768, 1024),
    "gpt2-medium": (24, 1024, 1024),
    "gpt2-large": (36, 1280, 1024),
    "gpt2-xl": (48, 1600, 1024),
}


def test_doctests():
    assert doctest.testmod(transformers_module).failed == 0


def test_registry_names_and_titles():
    assert list(TRANSFORMER_MODELS) == list(PARAMS)
    assert set(TRANSFORMER_TITLES) == set(TRANSFORMER_MODELS)
    for name, build in TRANSFORMER_MODELS.items():
        assert build().name == name


@pytest.mark.parametrize("name", list(PARAMS))
def test_parameter_counts_match_published(name):
    exact, published = PARAMS[name]
    count = TRANSFORMER_MODELS[name]().parameter_count()
    assert count == exact
    assert math.isclose(count, published, rel_tol=0.02)  # the papers round (BERT-large: "340M")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_structure(name):
    layers, hidden, seq = CONFIGS[name]
    g = TRANSFORMER_MODELS[name]()
    assert g.input_shape == Shape(1, seq, 1)
    # qkv, proj, fc1, fc2 per block, plus the LM head (GPT) or the pooler (BERT)
    assert len(g.weighted_layers()) == 4 * layers + 1
    assert sum(isinstance(layer, Attention) for layer in g.layers) == layers
    info = g.analyze()
    prefix = "h0" if name.startswith("gpt") else "layer0"
    assert info.out_shape[f"{prefix}.qkv"] == Shape(3 * hidden, seq, 1)
    assert info.out_shape[f"{prefix}.attn"] == Shape(hidden, seq, 1)
    assert info.out_shape[f"{prefix}.fc1"] == Shape(4 * hidden, seq, 1)
    for layer in g.layers:
        if isinstance(layer, Linear) and not layer.name.startswith("pooler"):
            assert layer.per_position


def test_llama_family_structure():
    g = TRANSFORMER_MODELS["llama3-8b"]()
    info = g.analyze()
    attn = g.layer("layers.0.attn")
    assert (attn.heads, attn.kv_heads, attn.rotary) == (32, 8, True)
    assert info.out_shape["layers.0.qkv"] == Shape((32 + 2 * 8) * 128, 2048, 1)  # q, k, v fused
    assert info.out_shape["layers.0.attn"] == Shape(4096, 2048, 1)
    assert info.out_shape["layers.0.glu"] == Shape(14336, 2048, 1)
    assert g.layer("layers.0.norm1").kind == "rms"
    # grouped-query attention costs what its query heads cost: 12 B S^2 (heads x d)
    flops = attn.attention_flops(list(info.in_shapes["layers.0.attn"]), 1.0)
    assert flops == 12 * 2048 * 2048 * 4096
    # the token table reaches the first q/k/v projection through an RMS norm and the first
    # residual add directly: both readers hold a partial table gradient (docs/costmodel.md section 2)
    small = llama_config(2, 64, 4, 2, 128, 16, 500)
    assert (
        layer_dims(small, "layers.0.qkv", 1).tables
        == layer_dims(small, "layers.0.add1", 1).tables
        == 500
    )
    assert layer_dims(small, "layers.1.qkv", 1).tables == 0
    moe = TRANSFORMER_MODELS["mixtral-8x7b"]()
    dense = TRANSFORMER_MODELS["mistral-7b"]()
    up = moe.layer("layers.0.gate_up")
    assert (up.experts, up.top_k) == (8, 2)
    # two of eight experts per token: twice the dense FLOPs, eight times the weights
    d_m, d_d = layer_dims(moe, "layers.0.gate_up", 1), layer_dims(dense, "layers.0.gate_up", 1)
    assert d_m.flops == 2 * d_d.flops and d_m.weight_elements == 8 * d_d.weight_elements


def test_gpt2_head_is_tied_and_bias_free():
    g = TRANSFORMER_MODELS["gpt2"]()
    assert isinstance(g, TiedGraph) and g.tied == (("lm_head", "wte"),)
    head = g.layer("lm_head")
    assert not head.bias and head.out_features == 50257
    untied = sum(
        g.layer(n).weight_elements(list(g.analyze().in_shapes[n])) for n in g.analyze().order
    )
    assert untied - g.parameter_count() == 50257 * 768


def test_projection_batch_is_batch_times_sequence():
    """A token-wise projection is one fully connected layer with B = batch x sequence (docs/costmodel.md section 1)."""
    g = gpt_config(layers=1, hidden=64, heads=4, seq=32, vocab=100)
    d = layer_dims(g, "h0.fc1", batch=3)
    assert (d.in_features, d.out_features, d.kernel) == (64, 256, 1)
    assert d.in_elements == 3 * 32 * 64 and d.out_elements == 3 * 32 * 256
    assert d.weight_elements == 64 * 256
    assert d.flops == 6 * (3 * 32) * 64 * 256


def test_gpt3_175b_and_sizes():
    assert math.isclose(gpt3("175b").parameter_count(), 175e9, rel_tol=0.005)
    assert math.isclose(gpt3("6.7b").parameter_count(), 6.7e9, rel_tol=0.01)
    for size in GPT3_SIZES:
        layers, hidden, heads = GPT3_SIZES[size]
        assert hidden % heads == 0
    with pytest.raises(GraphError, match=r"unknown GPT-3 size '7b'; valid sizes: small, medium"):
        gpt3("7b")


def test_config_errors_name_the_rule():
    with pytest.raises(
        GraphError, match=r"model 'x': hidden \(100\) must be divisible by heads \(3\)"
    ):
        gpt_config(2, 100, 3, 16, name="x")
    with pytest.raises(GraphError, match=r"seq \(2048\) exceeds the 1024 learned positions"):
        gpt_config(2, 64, 4, 2048, positions=1024)
    with pytest.raises(GraphError, match=r"layers must be a positive int \(got 0\)"):
        bert_config(0, 64, 4)


def test_tied_graph_rejects_mismatched_ties():
    layers = (
        Embedding("wte", (INPUT,), num=100, dim=16),
        Linear("head", ("wte",), out_features=99, bias=False, per_position=True),
    )
    with pytest.raises(
        GraphError,
        match=r"layer 'head': tied to 'wte' but has 1584 shared weights where 'wte' has 1600",
    ):
        TiedGraph("lm", Shape(1, 8, 1), layers, tied=(("head", "wte"),)).parameter_count()
    conv = (
        Conv2d("c", (INPUT,), out_channels=4, kernel=1),
        Linear("f", ("c",), out_features=4, per_position=True),
    )
    with pytest.raises(
        GraphError, match=r"layer 'c': a Conv2d can share weights only with a layer of its own type"
    ):
        TiedGraph("t", Shape(4, 2, 2), conv, tied=(("c", "f"),)).parameter_count()


def test_module_reuse_counts_every_parameter_once():
    layers = (
        Linear("a", (INPUT,), out_features=8, per_position=True),
        Linear("b", ("a",), out_features=8, per_position=True),
    )
    g = TiedGraph("reuse", Shape(8, 4, 1), layers, tied=(("b", "a"),))
    assert g.parameter_count() == 8 * 8 + 8


# --------------------------------------------------------------------------- Megatron pattern


def _root(problem, plan):
    names = [n.name for n in problem.planning.nodes]
    return {n: (c, a) for n, c, a in zip(names, plan.root.choices, plan.root.shares)}


def test_out_to_in_relayout_is_free():
    for a in (0.1, 0.24, 0.5, 0.9):
        assert transition_table(O, I, a) == (0.0, 0.0)


@pytest.mark.parametrize("array", ["h100:2", "a100:1,h100:1"])
def test_megatron_when_weights_outweigh_activations(array):
    """Hidden 4096, 128 tokens per step: |W| = 16h^2 per MLP >> |F| = B*S*h, so column then row split."""
    p = Problem(gpt_config(1, 4096, 32, 128, vocab=1000), parse_array(array), batch=1)
    opts = PlanOptions(share_grid=4)
    plan = make_plan(p, "accpar", options=opts)
    root = _root(p, plan)
    assert root["h0.fc1"][0] is O and root["h0.fc2"][0] is I  # column split, then row split
    assert root["h0.qkv"][0] is O and root["h0.proj"][0] is I  # the same pattern for attention
    ev = evaluate(p, plan)
    rows = ev.breakdown[ev.breakdown.level == ""].set_index("node")
    # between the two halves of a block only a share change moves data (charged to the producer,
    # docs section 3): cols(a) -> cols(a') moves |a - a'| of the tensor each way
    for first, second in (("h0.fc1", "h0.fc2"), ("h0.qkv", "h0.proj")):
        moved = rows.loc[first, "transition_elements_1"] + rows.loc[first, "transition_elements_2"]
        tensor = p.root_dims()[p.planning.index(second)].in_elements
        assert math.isclose(moved, 2 * abs(root[first][1] - root[second][1]) * tensor, abs_tol=1e-6)
    # the exact solver (one split: exact) agrees
    exact = solve_exact(p, backend="highs", options=opts)
    assert exact.certificate.status == "optimal"
    exact_root = _root(p, exact.plan)  # ties (e.g. the embedding add's layout) may differ
    assert [exact_root[n][0] for n in ("h0.qkv", "h0.proj", "h0.fc1", "h0.fc2")] == [O, I, O, I]
    assert math.isclose(exact.evaluation.step_time_s, ev.step_time_s, rel_tol=1e-6)


def test_data_parallel_when_activations_outweigh_weights():
    """Hidden 256, 64 x 1024 tokens per step: activations dwarf |W|, so every layer is BATCH."""
    p = Problem(gpt_config(1, 256, 4, 1024, vocab=1000), parse_array("a100:1,h100:1"), batch=64)
    root = _root(p, make_plan(p, "accpar"))
    for name in ("h0.qkv", "h0.proj", "h0.fc1", "h0.fc2"):
        assert root[name][0] is B, name
    # the share lies between the compute ratio and the HBM ratio (a small layer is near the roofline's knee)
    assert 312 / (312 + 989) <= root["h0.fc1"][1] <= 2039 / (2039 + 3350)


def test_gpt2_plans_with_both_planners():
    p = Problem(TRANSFORMER_MODELS["gpt2"](), parse_array("a100:2,h100:2"), batch=8)
    acc = evaluate(p, make_plan(p, "accpar"))
    dp = evaluate(p, make_plan(p, "data"))
    assert acc.step_time_s <= dp.step_time_s * (1 + 1e-12)
    small = Problem(TRANSFORMER_MODELS["gpt2"](), parse_array("a100:1,h100:1"), batch=8)
    exact = solve_exact(small, backend="cbc", options=PlanOptions(share_grid=2))
    assert exact.certificate.status == "optimal"
    dp = evaluate(small, make_plan(small, "accpar", share_grid=2)).step_time_s
    assert math.isclose(exact.evaluation.step_time_s, dp, rel_tol=1e-9)


def test_importer_core_doctests():
    """The importers' shared builder needs neither torch nor onnx."""
    import parplan.models.importers as importers

    assert doctest.testmod(importers).failed == 0


def test_tied_graphs_survive_pickling():
    """Worker processes receive graphs by pickle: the ties must come along."""
    import pickle

    g = TRANSFORMER_MODELS["gpt2"]()
    h = pickle.loads(pickle.dumps(g))
    assert isinstance(h, TiedGraph) and h.tied == g.tied and h.parameter_count() == 124_439_808
