"""Model files (TOML / JSON), layer tables (CSV / text) and load_model dispatch."""

import doctest
import json
from pathlib import Path

import pytest

import parplan.models.modelfile as modelfile_module
from parplan.costmodel.graph import (
    Activation,
    Add,
    Concat,
    Conv2d,
    Flatten,
    Graph,
    Linear,
    Norm,
    Pool2d,
    Shape,
)
from parplan.errors import ConfigError, GraphError
from parplan.models.modelfile import (
    dumps_model_toml,
    graph_from_dict,
    graph_to_dict,
    load_layer_table,
    load_model,
    load_model_file,
    loads_model_toml,
    save_model_file,
)
from parplan.models.zoo import MODELS, alexnet, get_model, lenet_c

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ZOO_NAMES = ", ".join(MODELS)


def _conv(name, src, out, k, s=1, p=0):
    return Conv2d(
        name, (src,), out_channels=out, kernel=(k, k), stride=(s, s), padding=(p, p), bias=False
    )


def tiny_resnet_in_code() -> Graph:
    """The graph examples/tiny_resnet.toml describes, built directly."""
    layers = [
        _conv("conv1", "input", 16, 3, p=1),
        Norm("bn1", ("conv1",)),
        Activation("relu", ("bn1",)),
        _conv("block1.conv1", "relu", 16, 3, p=1),
        Norm("block1.bn1", ("block1.conv1",)),
        Activation("block1.relu1", ("block1.bn1",)),
        _conv("block1.conv2", "block1.relu1", 16, 3, p=1),
        Norm("block1.bn2", ("block1.conv2",)),
        Add("block1.add", ("block1.bn2", "relu")),
        Activation("block1.relu", ("block1.add",)),
        _conv("block2.conv1", "block1.relu", 32, 3, s=2, p=1),
        Norm("block2.bn1", ("block2.conv1",)),
        Activation("block2.relu1", ("block2.bn1",)),
        _conv("block2.conv2", "block2.relu1", 32, 3, p=1),
        Norm("block2.bn2", ("block2.conv2",)),
        _conv("block2.downsample.0", "block1.relu", 32, 1, s=2),
        Norm("block2.downsample.1", ("block2.downsample.0",)),
        Add("block2.add", ("block2.bn2", "block2.downsample.1")),
        Activation("block2.relu", ("block2.add",)),
        Pool2d("avgpool", ("block2.relu",), mode="avg", output_size=(1, 1)),
        Flatten("flatten", ("avgpool",)),
        Linear("fc", ("flatten",), out_features=10),
    ]
    return Graph("tiny_resnet", Shape(3, 32, 32), tuple(layers))


# ----------------------------------------------------------------------------- model files


def test_tiny_resnet_toml_equals_graph_built_in_code():
    g = load_model_file(EXAMPLES / "tiny_resnet.toml")
    assert g == tiny_resnet_in_code()
    info = g.analyze()
    assert info.out_shape["block2.add"] == Shape(32, 16, 16)
    assert info.out_shape["fc"] == Shape(10)
    # counted by hand: conv weights (no biases) + 2 BN affine params per channel + fc
    convs = 16 * 3 * 9 + 2 * 16 * 16 * 9 + 32 * 16 * 9 + 32 * 32 * 9 + 32 * 16
    norms = 2 * (16 + 16 + 16 + 32 + 32 + 32)
    assert g.parameter_count() == convs + norms + 32 * 10 + 10


def test_json_description_equals_graph_built_in_code(tmp_path):
    data = {
        "name": "diamond",
        "input": [4, 8, 8],
        "layers": [
            {"name": "a", "type": "conv2d", "out_channels": 6, "kernel": [3, 3], "padding": 1},
            {
                "name": "b",
                "type": "maxpool",
                "kernel": 3,
                "stride": 1,
                "padding": 1,
                "inputs": ["a"],
            },
            {
                "name": "c",
                "type": "conv",
                "out_channels": 2,
                "kernel": 1,
                "bias": False,
                "inputs": ["a"],
            },
            {"name": "cat", "type": "concat", "inputs": ["b", "c"]},
            {"name": "ln", "type": "layernorm", "affine": False},
            {"name": "drop", "type": "dropout"},
            {"name": "flat", "type": "flatten"},
            {"name": "out", "type": "fc", "out_features": 3},
        ],
    }
    path = tmp_path / "diamond.json"
    path.write_text(json.dumps(data))
    expected = Graph(
        "diamond",
        Shape(4, 8, 8),
        (
            Conv2d("a", ("input",), out_channels=6, kernel=(3, 3), padding=(1, 1)),
            Pool2d("b", ("a",), mode="max", kernel=(3, 3), stride=(1, 1), padding=(1, 1)),
            Conv2d("c", ("a",), out_channels=2, kernel=(1, 1), bias=False),
            Concat("cat", ("b", "c")),
            Norm("ln", ("cat",), kind="layer", affine=False),
            Activation("drop", ("ln",), function="dropout"),
            Flatten("flat", ("drop",)),
            Linear("out", ("flat",), out_features=3),
        ),
    )
    g = load_model_file(path)
    assert g == expected
    assert g.analyze().out_shape["cat"] == Shape(6 + 2, 8, 8)


def test_name_defaults_to_file_stem_and_inputs_to_previous_layer(tmp_path):
    path = tmp_path / "mlp.toml"
    path.write_text(
        'input = [784]\n[[layer]]\nname = "h"\ntype = "linear"\nout_features = 32\n'
        '[[layer]]\nname = "act"\ntype = "act"\nfunction = "gelu"\n'
        '[[layer]]\nname = "o"\ntype = "FC"\nout_features = 10\ninputs = "act"\n'
    )
    g = load_model_file(path)
    assert g.name == "mlp"
    assert [layer.inputs for layer in g.layers] == [("input",), ("h",), ("act",)]
    assert g.layer("act").function == "gelu"
    assert g.parameter_count() == 784 * 32 + 32 + 32 * 10 + 10


@pytest.mark.parametrize(
    "name", ["lenet", "alexnet", "vgg-c", "resnet50", "sfc", "lenet-c", "cifar-c"]
)
def test_dict_round_trip_of_zoo_models(name):
    g = get_model(name)
    assert graph_from_dict(graph_to_dict(g)) == g


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_file_round_trip(tmp_path, suffix):
    g = get_model("resnet18")
    path = save_model_file(g, tmp_path / f"r18{suffix}")
    assert load_model_file(path) == g
    assert load_model(str(path)) == g


def test_a_model_file_with_slices_round_trips():
    """``type = "slice"`` (channels ``[start, stop)``): a ShuffleNet-style unit in a model file."""
    text = """
name = "halves"
input = [3, 8, 8]
[[layer]]
name = "stem"
type = "conv"
out_channels = 16
kernel = 3
padding = 1
[[layer]]
name = "hi"
type = "slice"
start = 8
stop = 16
[[layer]]
name = "branch"
type = "conv"
out_channels = 8
kernel = 1
[[layer]]
name = "lo"
type = "slice"
inputs = ["stem"]
start = 0
stop = 8
[[layer]]
name = "cat"
type = "concat"
inputs = ["lo", "branch"]
"""
    g = loads_model_toml(text)
    assert g.analyze().out_shape["cat"].channels == 16
    assert g.layer("hi").start == 8 and loads_model_toml(dumps_model_toml(g)) == g


def test_toml_text_round_trip():
    g = get_model("cifar-c")
    assert loads_model_toml(dumps_model_toml(g)) == g


def _one_layer(**layer):
    return {"name": "m", "input": [3, 8, 8], "layer": [{"name": "x", **layer}]}


@pytest.mark.parametrize(
    "layer, message",
    [
        (
            {"type": "conv", "out_channels": 4, "kernal": 3},
            "m: layer 'x': unknown key 'kernal' for type 'conv' (did you mean 'kernel'?); "
            "valid keys: name, type, inputs, "
            "out_channels, kernel, stride, padding, groups, bias, causal",
        ),
        (
            {"type": "convolution", "out_channels": 4},
            "m: layer 'x': unknown type 'convolution'; valid types: conv, conv2d, linear, fc, pool, "
            "maxpool, avgpool, act, "
            "relu, dropout, tanh, gelu, sigmoid, norm, batchnorm, layernorm, flatten, slice, add, concat",
        ),
        (
            {"out_channels": 4},
            "m: layer 'x': missing 'type'; valid types: conv, conv2d, linear, fc, pool, maxpool, avgpool, act, relu, "
            "dropout, tanh, gelu, sigmoid, norm, batchnorm, layernorm, flatten, slice, add, concat",
        ),
        (
            {"type": "maxpool", "mode": "avg"},
            "m: layer 'x': type 'maxpool' means mode = 'max' (got 'avg'); use type 'pool' with mode = 'avg'",
        ),
        (
            {"type": "conv", "out_channels": 4, "kernel": [3, 3, 3]},
            "m: layer 'x': kernel must be an int or a pair [h, w] of ints (got [3, 3, 3])",
        ),
        (
            {"type": "conv", "out_channels": 4.0},
            "m: layer 'x': out_channels must be an int (got 4.0)",
        ),
        (
            {"type": "fc", "out_features": 4, "bias": "yes"},
            "m: layer 'x': bias must be true or false (got 'yes')",
        ),
        (
            {"type": "conv", "out_channels": 4, "inputs": ["nope"]},
            "m: layer 'x': unknown input 'nope' (not a layer of graph 'm' nor 'input')",
        ),
        ({"type": "conv", "out_channels": 0}, "m: layer 'x': out_channels must be > 0 (got 0)"),
        (
            {"type": "conv", "out_channels": 4, "inputs": []},
            "m: layer 'x': 'inputs' must be a non-empty list of layer names (got [])",
        ),
    ],
)
def test_bad_layer_messages(layer, message):
    with pytest.raises(GraphError) as err:
        graph_from_dict(_one_layer(**layer), source="m")
    assert str(err.value) == message


@pytest.mark.parametrize(
    "data, message",
    [
        (
            {"name": "m", "input": [3, 8, 8], "layer": [], "batch": 32},
            "m: unknown top-level key 'batch'; valid keys: name, input, layer, layers, description",
        ),
        (
            {"name": "m", "input": [3, 8], "layer": [{"name": "r", "type": "relu"}]},
            "m: 'input' must be [C, H, W] (or [C]) of positive ints (got [3, 8])",
        ),
        (
            {"name": "m", "input": [3, 8, 8], "layer": []},
            "m: needs a non-empty list of layers ('[[layer]]' tables in TOML, \"layer\": [...] in JSON)",
        ),
        (
            {"name": "m", "input": [3, 8, 8], "layer": [{"type": "relu"}]},
            "m: layer #1 needs a non-empty string 'name' (got None)",
        ),
        (
            {
                "name": "m",
                "input": [3, 8, 8],
                "layer": [{"name": "r", "type": "relu"}],
                "layers": [],
            },
            "m: give the layer list once, as 'layer' or as 'layers' (got both)",
        ),
    ],
)
def test_bad_description_messages(data, message):
    with pytest.raises(GraphError) as err:
        graph_from_dict(data, source="m")
    assert str(err.value) == message


def test_file_level_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(ConfigError, match=r"^model file '.*bad\.toml': not valid TOML \("):
        load_model_file(bad)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{")
    with pytest.raises(ConfigError, match=r"^model file '.*bad\.json': not valid JSON \("):
        load_model_file(bad_json)
    with pytest.raises(ConfigError) as err:
        load_model_file(tmp_path / "net.yaml")
    assert str(err.value) == (
        f"model file '{tmp_path / 'net.yaml'}': unsupported suffix '.yaml'; use one of .toml, .json, .csv, .txt"
    )
    with pytest.raises(ConfigError) as err:
        load_model_file(tmp_path / "missing.toml")
    assert str(err.value) == f"model file '{tmp_path / 'missing.toml'}': no such file"


def test_graph_errors_from_a_file_name_the_file(tmp_path):
    path = tmp_path / "net.toml"
    path.write_text('input = [3, 8, 8]\n[[layer]]\nname = "fc"\ntype = "fc"\nout_features = 10\n')
    with pytest.raises(GraphError) as err:
        load_model_file(path)
    assert str(err.value) == (
        f"model file '{path}': layer 'fc': Linear needs a feature vector, got 3x8x8; add a Flatten layer before it"
    )


# ----------------------------------------------------------------------------- layer tables


def test_alexnet_table_reproduces_alexnet_conv_and_fc_shapes():
    table = load_layer_table(EXAMPLES / "alexnet_table.csv")
    ref = alexnet()
    t_info, r_info = table.analyze(), ref.analyze()
    assert table.name == "alexnet_table"
    assert len(table.weighted_layers()) == len(ref.weighted_layers()) == 8
    for t_name, r_name in zip(table.weighted_layers(), ref.weighted_layers()):
        t, r = table.layer(t_name), ref.layer(r_name)
        assert type(t) is type(r)
        assert t_info.in_shapes[t_name] == r_info.in_shapes[r_name]
        assert t_info.out_shape[t_name] == r_info.out_shape[r_name]
        if isinstance(t, Conv2d):
            assert (t.kernel, t.stride, t.padding) == (r.kernel, r.stride, r.padding)
    pools = [layer for layer in table.layers if isinstance(layer, Pool2d)]
    assert [(p.name, p.kernel, p.stride) for p in pools] == [
        ("conv1.pool", (3, 3), (2, 2)),
        ("conv2.pool", (3, 3), (2, 2)),
        ("conv5.pool", (3, 3), (2, 2)),
    ]
    assert table.parameter_count() == 61_100_840


WHITESPACE_LENET_C = """
# Caffe LeNet as a whitespace table, columns reordered by the header
name   type  kernel in_channels out_channels in_h in_w out_h out_w
conv1  conv  5      1           20           28   28   24    24
conv2  conv  5      20          50           12   12   8     8
ip1    fc    1      50          500          4    4    1     1
ip2    fc    1      500         10           1    1    1     1
"""


def test_whitespace_table_with_header_and_fc_on_spatial_input():
    g = load_layer_table(WHITESPACE_LENET_C, name="lenet-table")
    ref = lenet_c()
    assert g.name == "lenet-table"
    assert [layer.name for layer in g.layers] == [
        "conv1",
        "conv1.pool",
        "conv2",
        "conv2.pool",
        "ip1.flatten",
        "ip1",
        "ip2",
    ]
    assert g.layer("conv1.pool").kernel == (2, 2)  # 24 -> 12: a 3-window would give 11
    info, r_info = g.analyze(), ref.analyze()
    for name in ("conv1", "conv2", "ip1", "ip2"):
        assert info.in_shapes[name] == r_info.in_shapes[name]
        assert info.out_shape[name] == r_info.out_shape[name]
    assert g.parameter_count() == ref.parameter_count() == 431_080


def test_table_text_without_header_and_strided_conv(tmp_path):
    path = tmp_path / "stem.txt"
    path.write_text("conv1 conv 3 64 224 224 112 112 7\nfc fc 64 10 1 1 1 1 1\n")
    g = load_model(str(path))
    assert (g.layer("conv1").stride, g.layer("conv1").padding) == ((2, 2), (3, 3))
    # fc with in_channels = C and in size 1x1: the 112x112 map is pooled to 1x1 first
    assert g.analyze().out_shape["conv1.pool"] == Shape(64, 1, 1)
    assert [type(layer) for layer in g.layers] == [Conv2d, Pool2d, Flatten, Linear]


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "a conv 3 8 8 8 8 8 3\nb conv 7 8 8 8 8 8 3\n",
            "layer table: row 2 'b' (line 2): in_channels 7 does not match the previous row 'a' out_channels 8",
        ),
        (
            "a conv 3 8 8 8 9 9 3\n",
            "layer table: row 1 'a' (line 1): a 3x3 convolution cannot map 8x8 to 9x9 with stride >= 1 "
            "and padding <= 1; "
            "check the sizes",
        ),
        (
            "a conv 3 8 8 8 4 4 3\nb conv 8 8 6 6 6 6 3\n",
            "layer table: row 2 'b' (line 2): input size 6x6 is larger than the previous output 4x4; only pooling is "
            "inserted between rows, and it cannot enlarge",
        ),
        (
            "a conv 3 8 8 8 4 4 3\nb fc 100 10 1 1 1 1 1\n",
            "layer table: row 2 'b' (line 2): in_channels 100 does not match the output of 'a', 8x4x4: give 128 "
            "(= 8*4*4) with in_h = in_w = 1, 8*h*w for a pooled size h x w of the same aspect ratio, or in_channels 8 "
            "with the spatial size as in_h x in_w",
        ),
        (
            "a fc 10 10 1 1 2 2 1\n",
            "layer table: row 1 'a' (line 1): fc rows have out_h = out_w = 1 and kernel 1 (or kernel = in_h = in_w) "
            "(got out 2x2, kernel 1)",
        ),
        (
            "a conv 3 8 8 8 8 8\n",
            "layer table: row 1 'a' (line 1): expected 9 fields (name, type, in_channels, out_channels, in_h, in_w, "
            "out_h, out_w, kernel), got 8",
        ),
        (
            "a pool 3 8 8 8 8 8 3\n",
            "layer table: row 1 'a' (line 1): type must be conv or fc (got 'pool')",
        ),
        (
            "a conv 3 x 8 8 8 8 3\n",
            "layer table: row 1 'a' (line 1): out_channels must be a positive int (got 'x')",
        ),
        (
            "a conv 3 8 0 8 8 8 3\n",
            "layer table: row 1 'a' (line 1): in_h must be an int in [1, 2,147,483,647] (got 0)",
        ),
        (
            "name type in_c out_c in_h in_w out_h out_w kernel\n",
            "layer table: header (line 1) must name the columns name, type, in_channels, out_channels, in_h, in_w, "
            "out_h, out_w, kernel once each, optionally also link and shortcut (got name, type, in_c, out_c, in_h, "
            "in_w, out_h, out_w, kernel)",
        ),
        (
            "name type in_channels out_channels in_h in_w out_h out_w kernel link shortcut\n"
            "a conv 3 8 8 8 8 8 3 warp -\n",
            "layer table: row 1 'a' (line 2): link must be chain or resize (got 'warp')",
        ),
        (
            "name type in_channels out_channels in_h in_w out_h out_w kernel link shortcut\n"
            "a conv 3 8 8 8 8 8 3 chain -\nb conv 8 8 8 8 8 8 3 chain z\n",
            "layer table: row 2 'b' (line 3): shortcut 'z' names no earlier row",
        ),
        (
            "name type in_channels out_channels in_h in_w out_h out_w kernel link shortcut\n"
            "a conv 3 8 8 8 8 8 3 chain -\nb conv 8 8 8 8 8 8 3 chain a\n",
            "layer table: row 2 'b' (line 3): the shortcut from 'a' carries 3x8x8, the row reads 8x8x8; "
            "give link=resize to adapt it",
        ),
        (
            "name type in_channels out_channels in_h in_w out_h out_w kernel link\n"
            "a conv 3 8 8 8 8 8 3 chain\nb conv 16 8 8 8 8 8 3 chain\n",
            "layer table: row 2 'b' (line 3): in_channels 16 does not match the previous row 'a' out_channels 8",
        ),
        (
            "a conv 3 8 8 8 8 8 3\na fc 512 10 1 1 1 1 1\n",
            "layer table: graph 'layer_table': duplicate layer name 'a'",
        ),
    ],
)
def test_bad_table_messages(text, message):
    with pytest.raises(GraphError) as err:
        load_layer_table(text)
    assert str(err.value) == message


def test_table_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(
        "# comment\nname,type,in_channels,out_channels,in_h,in_w,out_h,out_w,kernel\n"
        "c1,conv,3,8,8,8,8,8,3\n\nc2,conv,4,8,8,8,8,8,3\n"
    )
    with pytest.raises(GraphError) as err:
        load_model_file(path)
    assert str(err.value) == (
        f"layer table '{path}': row 2 'c2' (line 5): in_channels 4 does not match the previous row 'c1' "
        "out_channels 8"
    )


def test_missing_table_file():
    with pytest.raises(ConfigError) as err:
        load_layer_table("no_such_table.csv")
    assert (
        str(err.value)
        == "layer table 'no_such_table.csv': no such file (pass a path or the table's text)"
    )


# ----------------------------------------------------------------------------- load_model


def test_load_model_zoo_names_and_files():
    assert load_model("VGG16") == get_model("vgg16")
    assert load_model(str(EXAMPLES / "tiny_resnet.toml")) == tiny_resnet_in_code()
    assert load_model(EXAMPLES / "alexnet_table.csv").parameter_count() == 61_100_840


def test_load_model_unknown_spec_lists_names_and_suffixes(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_model("resnet-5O")
    assert str(err.value) == (
        f"unknown model 'resnet-5O' (did you mean 'resnet50'?); valid names: {ZOO_NAMES}; "
        "or give the path of an existing model file (.toml, .json, .csv, .txt, .onnx) or file.py:factory"
    )
    with pytest.raises(ConfigError) as err:
        load_model(str(tmp_path / "net.toml"))
    assert str(err.value) == (
        f"model file '{tmp_path / 'net.toml'}': no such file; valid zoo names: {ZOO_NAMES}; "
        "or give the path of an existing model file (.toml, .json, .csv, .txt, .onnx) or file.py:factory"
    )
    other = tmp_path / "net.xyz"
    other.write_text("")
    with pytest.raises(ConfigError) as err:
        load_model(str(other))
    assert str(err.value) == (
        f"model file '{other}' has unsupported suffix '.xyz'; valid zoo names: {ZOO_NAMES}; "
        "or give the path of an existing model file (.toml, .json, .csv, .txt, .onnx) or file.py:factory"
    )


def test_module_docstring_examples_run():
    result = doctest.testmod(modelfile_module)
    assert result.attempted > 0 and result.failed == 0


def test_resize_rows_keep_the_tables_sizes_and_shortcuts_add():
    g = load_layer_table(
        "name,type,in_channels,out_channels,in_h,in_w,out_h,out_w,kernel,link,shortcut\n"
        "a,conv,3,8,8,8,8,8,3,chain,\nb,conv,8,8,8,8,8,8,3,chain,\n"
        "c,conv,16,16,4,4,4,4,3,resize,a\nd,fc,100,10,1,1,1,1,1,resize,-\n"
    )
    info = g.analyze()
    assert info.in_shapes["c"][0] == Shape(16, 4, 4) and info.in_shapes["d"][0] == Shape(100)
    assert g.layer("c.add").inputs == ("c.resize", "c.shortcut") and g.layer(
        "c.shortcut"
    ).inputs == ("input",)
    flops, traffic, stored = g.layer("c.resize").training_cost([Shape(8, 8, 8)], Shape(16, 4, 4))
    assert (flops, traffic, stored) == (0.0, 2.0 * (512 + 256), 0.0)
