"""Graph IR: shape inference, FLOPs, and errors that name the layer."""

import pytest

from parplan.costmodel.dims import layer_dims, layer_profiles
from parplan.costmodel.graph import (
    Activation,
    Add,
    Attention,
    Concat,
    Conv2d,
    Embedding,
    Flatten,
    Graph,
    Linear,
    Pool2d,
    Shape,
)
from parplan.costmodel.planning import planning_graph
from parplan.errors import GraphError


def test_conv_shape_flops_and_sizes():
    g = Graph(
        "g",
        Shape(3, 224, 224),
        (Conv2d("c", ("input",), out_channels=64, kernel=11, stride=4, padding=2),),
    )
    info = g.analyze()
    assert info.out_shape["c"] == Shape(64, 55, 55)
    d = layer_dims(g, "c", 8)
    assert d.flops == 3 * 2 * 8 * 64 * 55 * 55 * 3 * 121
    assert d.weight_elements == 3 * 64 * 121 and d.in_elements == 8 * 3 * 224 * 224


def test_grouped_conv_divides_weights_and_flops():
    g = Graph(
        "g",
        Shape(8, 4, 4),
        (Conv2d("c", ("input",), out_channels=8, kernel=3, padding=1, groups=8),),
    )
    d = layer_dims(g, "c", 1)
    assert d.weight_elements == 8 * 8 * 9 / 8
    assert g.parameter_count() == 8 * 9 + 8


@pytest.mark.parametrize(
    "layers,msg",
    [
        (
            (Linear("fc", ("input",), out_features=0),),
            "layer 'fc': out_features must be > 0 (got 0)",
        ),
        ((Conv2d("c", ("nope",), out_channels=4),), "layer 'c': unknown input 'nope'"),
        ((Conv2d("a", ("b",), out_channels=4), Conv2d("b", ("a",), out_channels=4)), "has a cycle"),
        (
            (Conv2d("c", ("input",), out_channels=4, kernel=9),),
            "layer 'c': kernel (9, 9) does not fit input 4x4",
        ),
        ((Linear("fc", ("input",), out_features=3),), "layer 'fc': Linear needs a feature vector"),
        (
            (
                Conv2d("a", ("input",), out_channels=4, kernel=1),
                Conv2d("b", ("input",), out_channels=5, kernel=1),
                Add("s", ("a", "b")),
            ),
            "layer 's': Add inputs must have equal shapes",
        ),
        (
            (
                Conv2d("a", ("input",), out_channels=4, kernel=1),
                Conv2d("a", ("input",), out_channels=4, kernel=1),
            ),
            "duplicate layer name 'a'",
        ),
        (
            (Conv2d("c", ("input",), out_channels=4, stride=0),),
            "layer 'c': stride must be > 0 (got 0)",
        ),
    ],
)
def test_errors_name_the_layer(layers, msg):
    with pytest.raises(GraphError) as exc:
        Graph("g", Shape(2, 4, 4), layers).analyze()
    assert msg in str(exc.value)


def test_bad_input_shape():
    with pytest.raises(GraphError, match=r"input height must be in \[1, "):
        Graph("g", Shape(3, 0, 4), (Activation("r", ("input",)),)).analyze()


def test_planning_graph_folds_pass_through_layers_and_keeps_joins():
    g = Graph(
        "g",
        Shape(4, 8, 8),
        (
            Conv2d("a", ("input",), out_channels=4, kernel=3, padding=1),
            Activation("r", ("a",)),
            Pool2d("p", ("r",)),
            Conv2d("b", ("p",), out_channels=4, kernel=1),
            Conv2d("c", ("p",), out_channels=2, kernel=1),
            Concat("cat", ("b", "c")),
            Flatten("f", ("cat",)),
            Linear("fc", ("f",), out_features=10),
        ),
    )
    pg = planning_graph(g)
    assert [n.name for n in pg.nodes] == ["a", "b", "c", "cat", "fc"]
    cat = pg.nodes[3]
    assert cat.is_join and cat.preds == (1, 2) and cat.fractions == (4 / 6, 2 / 6)
    assert pg.nodes[1].preds == (0,) and "p" in pg.nodes[1].absorbed
    assert pg.nodes[4].is_fc and pg.nodes[4].dims.in_features == 6 * 4 * 4
    assert pg.succs[0] == (1, 2) and not pg.is_chain


def test_transformer_layers():
    g = Graph(
        "t",
        Shape(1, 16, 1),
        (
            Embedding("wte", ("input",), num=100, dim=32),
            Linear("qkv", ("wte",), out_features=96, per_position=True),
            Attention("attn", ("qkv",), heads=4),
            Linear("proj", ("attn",), out_features=32, per_position=True),
            Add("res", ("wte", "proj")),
        ),
    )
    info = g.analyze()
    assert info.out_shape["attn"] == Shape(32, 16, 1)
    d = layer_dims(g, "qkv", 2)
    assert d.flops == 6 * 2 * 96 * 16 * 32  # B x seq tokens, Di x Do weights
    assert g.parameter_count() == 100 * 32 + (32 * 96 + 96) + (32 * 32 + 32)
    with pytest.raises(GraphError, match=r"must be \(heads \+ 2 kv_heads\) x head size"):
        Graph("t", Shape(10, 4, 1), (Attention("a", ("input",), heads=3),)).analyze()


def test_layer_profiles_cover_every_layer():
    g = Graph(
        "g",
        Shape(4, 8, 8),
        (Conv2d("a", ("input",), out_channels=4, kernel=3, padding=1), Activation("r", ("a",))),
    )
    prof = layer_profiles(g, 2)
    assert (
        [p.name for p in prof] == ["a", "r"]
        and prof[1].flops == 0
        and prof[0].weight_elements == 4 * 4 * 9 + 4
    )
