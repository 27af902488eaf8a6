"""Model zoo: parameter counts against published figures, layer counts, shapes, DAG structure."""

import doctest

import pytest

import parplan.models.zoo as zoo_module
from parplan.costmodel.graph import Add, Conv2d, Linear, Norm, Pool2d, Shape
from parplan.errors import ConfigError
from parplan.models.zoo import MODELS, get_model, list_models

# Torchvision's published counts (sum of p.numel() over parameters) and the HyPar / Caffe
# models' counts derived by hand in each builder's docstring.
PARAMS = {
    "lenet": 61_706,
    "alexnet": 61_100_840,
    "vgg11": 132_863_336,
    "vgg13": 133_047_848,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
    "sfc": 140_746_762,
    "lenet-c": 431_080,
    "cifar-c": 145_578,
    "vgg-c": 133_638_952,
    "resnet-2block": 19_994,
}

# (conv layers, fc layers); ResNet conv counts include the downsample 1x1 convs.
WEIGHTED = {
    "lenet": (3, 2),
    "alexnet": (5, 3),
    "vgg11": (8, 3),
    "vgg13": (10, 3),
    "vgg16": (13, 3),
    "vgg19": (16, 3),
    "resnet18": (20, 1),
    "resnet34": (36, 1),
    "resnet50": (53, 1),
    "resnet101": (104, 1),
    "resnet152": (155, 1),
    "sfc": (0, 4),
    "lenet-c": (2, 2),
    "cifar-c": (3, 2),
    "vgg-c": (13, 3),
    "resnet-2block": (6, 1),
}

INPUTS = {
    "resnet-2block": Shape(3, 32, 32),
    "lenet": Shape(1, 32, 32),
    "sfc": Shape(1, 28, 28),
    "lenet-c": Shape(1, 28, 28),
    "cifar-c": Shape(3, 32, 32),
}

# (residual blocks, of which with a downsample shortcut)
RESNET_BLOCKS = {
    "resnet18": (8, 3),
    "resnet34": (16, 3),
    "resnet50": (16, 4),
    "resnet101": (33, 4),
    "resnet152": (50, 4),
}


def test_registry_keys_are_the_documented_names():
    from parplan.models.transformers import TRANSFORMER_MODELS

    assert list(MODELS) == list(PARAMS) + list(TRANSFORMER_MODELS)


@pytest.mark.parametrize("name", list(PARAMS))
def test_parameter_count_matches_published_figure(name):
    assert get_model(name).parameter_count() == PARAMS[name]


@pytest.mark.parametrize("name", list(WEIGHTED))
def test_weighted_layer_counts(name):
    g = get_model(name)
    kinds = [type(g.layer(n)) for n in g.weighted_layers()]
    assert (kinds.count(Conv2d), kinds.count(Linear)) == WEIGHTED[name]
    assert len(kinds) == sum(WEIGHTED[name])


@pytest.mark.parametrize("name", list(PARAMS))
def test_input_and_output_shapes(name):
    g = get_model(name)
    info = g.analyze()
    assert g.name == name
    assert g.input_shape == INPUTS.get(name, Shape(3, 224, 224))
    sinks = [n for n in info.order if not info.consumers[n]]
    classes = 10 if name in ("lenet", "sfc", "lenet-c", "cifar-c", "resnet-2block") else 1000
    assert len(sinks) == 1
    assert info.out_shape[sinks[0]] == Shape(classes, 1, 1)


def test_builders_return_fresh_equal_graphs():
    a, b = get_model("resnet18"), get_model("resnet18")
    assert a == b and a is not b


@pytest.mark.parametrize("name", list(RESNET_BLOCKS))
def test_resnet_residual_joins(name):
    g = get_model(name)
    info = g.analyze()
    blocks, downsampled = RESNET_BLOCKS[name]
    adds = [layer for layer in g.layers if isinstance(layer, Add)]
    assert len(adds) == blocks
    for add in adds:
        assert len(add.inputs) == 2
        a, b = (info.out_shape[i] for i in add.inputs)
        assert a == b == info.out_shape[add.name]
    downsample_convs = [n for n in g.weighted_layers() if n.endswith(".downsample.0")]
    assert len(downsample_convs) == downsampled
    # torchvision: every conv without bias, every conv followed by a BN (2 affine params/channel)
    convs = [g.layer(n) for n in g.weighted_layers() if isinstance(g.layer(n), Conv2d)]
    assert all(not c.bias for c in convs)
    assert g.layer("fc").bias
    norms = [layer for layer in g.layers if isinstance(layer, Norm)]
    assert len(norms) == len(convs) and all(n.kind == "batch" and n.affine for n in norms)


def test_resnet50_shapes_and_names():
    g = get_model("resnet50")
    info = g.analyze()
    out = info.out_shape
    assert out["conv1"] == Shape(64, 112, 112)
    assert out["maxpool"] == Shape(64, 56, 56)
    assert out["layer1.0.downsample.0"] == Shape(256, 56, 56)
    assert out["layer2.0.conv2"] == Shape(128, 28, 28)  # v1.5: the stride sits on the 3x3 conv
    assert g.layer("layer2.0.conv1").stride == (1, 1)
    assert out["layer4.2.relu"] == Shape(2048, 7, 7)
    assert out["avgpool"] == Shape(2048, 1, 1)
    assert info.in_shapes["fc"] == (Shape(2048, 1, 1),)
    assert g.layer("layer1.0.add").inputs == ("layer1.0.bn3", "layer1.0.downsample.1")
    assert g.layer("layer1.1.add").inputs == ("layer1.1.bn3", "layer1.0.relu")  # identity shortcut


def test_resnet18_basic_block_structure():
    g = get_model("resnet18")
    out = g.analyze().out_shape
    assert "layer1.0.downsample.0" not in {layer.name for layer in g.layers}
    assert g.layer("layer2.0.downsample.0").kernel == (1, 1)
    assert g.layer("layer2.0.downsample.0").stride == (2, 2)
    assert out["layer2.0.add"] == Shape(128, 28, 28)
    assert out["layer4.1.relu"] == Shape(512, 7, 7)


def test_alexnet_layout():
    g = get_model("alexnet")
    out = g.analyze().out_shape
    assert [out[f"features.{i}"] for i in (0, 2, 3, 5, 6, 8, 10, 12)] == [
        Shape(64, 55, 55),
        Shape(64, 27, 27),
        Shape(192, 27, 27),
        Shape(192, 13, 13),
        Shape(384, 13, 13),
        Shape(256, 13, 13),
        Shape(256, 13, 13),
        Shape(256, 6, 6),
    ]
    assert g.analyze().in_shapes["classifier.1"] == (Shape(9216),)
    assert [g.layer(f"classifier.{i}").function for i in (0, 2, 3, 5)] == [
        "dropout",
        "relu",
        "dropout",
        "relu",
    ]


def test_vgg16_layout():
    g = get_model("vgg16")
    info = g.analyze()
    convs = [g.layer(n) for n in g.weighted_layers()][:13]
    assert all(c.kernel == (3, 3) and c.padding == (1, 1) and c.bias for c in convs)
    assert info.out_shape["features.30"] == Shape(512, 7, 7)
    assert info.in_shapes["classifier.0"] == (Shape(25088),)
    assert [g.layer(f"classifier.{i}").function for i in (1, 2, 4, 5)] == [
        "relu",
        "dropout",
        "relu",
        "dropout",
    ]


def test_vgg_c_has_1x1_convs_in_the_last_three_blocks():
    g = get_model("vgg-c")
    convs = [n for n in g.weighted_layers() if isinstance(g.layer(n), Conv2d)]
    one_by_one = [n for n in convs if g.layer(n).kernel_elements() == 1]
    assert one_by_one == ["features.14", "features.21", "features.28"]
    assert all(g.layer(n).padding == (0, 0) for n in one_by_one)
    # VGG-16 minus 8/9 of the three 3x3 weight tensors that became 1x1
    assert PARAMS["vgg16"] - PARAMS["vgg-c"] == 8 * (256 * 256 + 2 * 512 * 512)


def test_small_models_layouts():
    out = get_model("cifar-c").analyze().out_shape
    assert [out[p] for p in ("pool1", "pool2", "pool3")] == [
        Shape(32, 16, 16),
        Shape(32, 8, 8),
        Shape(64, 4, 4),
    ]
    pools = [layer for layer in get_model("cifar-c").layers if isinstance(layer, Pool2d)]
    assert [(p.mode, p.ceil_mode) for p in pools] == [("max", True), ("avg", True), ("avg", True)]
    out = get_model("lenet-c").analyze().out_shape
    assert out["pool2"] == Shape(50, 4, 4) and out["ip1"] == Shape(500)
    out = get_model("lenet").analyze().out_shape
    assert out["conv3"] == Shape(120, 1, 1) and out["fc1"] == Shape(84)
    g = get_model("sfc")
    assert g.analyze().in_shapes["fc1"] == (Shape(784),)
    assert [g.layer(n).out_features for n in g.weighted_layers()] == [8192, 8192, 8192, 10]


@pytest.mark.parametrize("spelling", ["ResNet50", "RESNET50", " resnet50 "])
def test_get_model_is_case_insensitive(spelling):
    assert get_model(spelling).name == "resnet50"


def test_get_model_accepts_underscores_for_hyphens():
    assert get_model("Cifar_C").name == "cifar-c"


def test_get_model_unknown_name_lists_valid_names():
    with pytest.raises(ConfigError) as err:
        get_model("resnet51")
    assert str(err.value) == (
        "unknown model 'resnet51' (did you mean 'resnet50'?); valid names: lenet, alexnet, vgg11, vgg13, "
        "vgg16, vgg19, resnet18, resnet34, resnet50, resnet101, resnet152, sfc, lenet-c, cifar-c, vgg-c, "
        "resnet-2block, "
        "bert-base, bert-large, gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama3-8b, llama3-70b, mistral-7b, "
        "mixtral-8x7b, vit-b16"
    )


def test_list_models():
    rows = list_models()
    assert [name for name, _ in rows] == list(MODELS)
    descriptions = dict(rows)
    assert descriptions["resnet50"] == (
        "ResNet-50 (torchvision, Bottleneck 3-4-6-3); input 3x224x224; 54 weighted layers; 25,557,032 params"
    )
    assert (
        "input 3x32x32" in descriptions["cifar-c"] and "145,578 params" in descriptions["cifar-c"]
    )


def test_module_docstring_examples_run():
    result = doctest.testmod(zoo_module)
    assert result.attempted > 0 and result.failed == 0
