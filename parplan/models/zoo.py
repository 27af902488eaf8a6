"""Model zoo: standard DNNs as per-sample layer graphs (docs/formats.md lists every way to give a model).

Every function returns a fresh :class:`~parplan.costmodel.graph.Graph` at the model's
standard input size. The batch size is not part of a graph: the planner takes it separately.

- Torchvision layouts (3x224x224, 1000 classes), parameter counts equal to torchvision's:
  :func:`alexnet`, :func:`vgg11`, :func:`vgg13`, :func:`vgg16`, :func:`vgg19` (without batch
  norm), :func:`resnet18`, :func:`resnet34`, :func:`resnet50`, :func:`resnet101`,
  :func:`resnet152` (the real residual DAGs: BasicBlock / Bottleneck v1.5, 1x1 conv + BN
  downsample shortcuts, :class:`Add` joins).
- The classic LeNet-5 (:func:`lenet`) and HyPar's small models: :func:`sfc`, :func:`lenet_c`,
  :func:`cifar_c`, :func:`vgg_c`.

Layer names follow torchvision (``features.0``, ``classifier.1``, ``layer1.0.conv1``,
``layer1.0.downsample.0``) or Caffe (``conv1``, ``pool1``, ``ip1``). Because torchvision
reuses one ReLU module per block, the block's ReLUs are named ``relu1``, ``relu2`` (after the
convolutions) and ``relu`` (after the join ``add``). Pair attributes (kernel, stride,
padding, output size) are stored as ``(h, w)`` tuples, the form
:func:`parplan.models.modelfile.graph_from_dict` produces, so a graph loaded from a model file can be
compared with ``==`` to one built here.

Example:
    >>> g = get_model("ResNet50")
    >>> g.parameter_count()
    25557032
    >>> len(g.weighted_layers())
    54
    >>> g.layer("layer1.0.add").inputs
    ('layer1.0.bn3', 'layer1.0.downsample.1')
    >>> g.analyze().out_shape["fc"]
    Shape(channels=1000, height=1, width=1)
"""

from __future__ import annotations

import difflib
from typing import Callable, Sequence

from parplan.costmodel.graph import (
    INPUT,
    Activation,
    Add,
    Conv2d,
    Flatten,
    Graph,
    Layer,
    Linear,
    Norm,
    Pool2d,
    Shape,
)
from parplan.errors import ConfigError

__all__ = [
    "MODELS",
    "alexnet",
    "canonical_name",
    "cifar_c",
    "get_model",
    "lenet",
    "lenet_c",
    "list_models",
    "unknown_model_message",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "resnet_2block",
    "sfc",
    "vgg11",
    "vgg13",
    "vgg16",
    "vgg19",
    "vgg_c",
]

_PAIR_ATTRS = ("kernel", "stride", "padding", "output_size")


def _as_pair(value):
    return (value, value) if isinstance(value, int) else tuple(value)


class _Chain:
    """Collects layers; each new layer reads the previous one unless ``inputs`` is given."""

    def __init__(self, src: str = INPUT) -> None:
        self.layers: list[Layer] = []
        self.last = src

    def add(self, cls: type[Layer], name: str, inputs: Sequence[str] | None = None, **attrs) -> str:
        for key in _PAIR_ATTRS:
            if attrs.get(key) is not None:
                attrs[key] = _as_pair(attrs[key])
        self.layers.append(cls(name, tuple(inputs) if inputs else (self.last,), **attrs))
        self.last = name
        return name

    def graph(self, name: str, input_shape: Shape) -> Graph:
        return Graph(name, input_shape, tuple(self.layers))


# --------------------------------------------------------------------------- LeNet / HyPar


def lenet() -> Graph:
    """LeNet-5 (LeCun et al. 1998) on a 1x32x32 input: 61,706 parameters.

    C1 conv 6@5x5 -> tanh -> S2 avgpool 2 -> C3 conv 16@5x5 -> tanh -> S4 avgpool 2 -> C5 conv
    120@5x5 (output 120x1x1) -> tanh -> F6 fc 84 -> tanh -> fc 10. As in the usual modern
    rendering, C3 connects to all six S2 maps (the paper's sparse connection table gives 1,516
    instead of 2,416 weights) and S2/S4 are plain average pools (the paper's trainable
    subsampling coefficients are omitted), so the count is 61,706 rather than the paper's
    60,000.

    Example:
        >>> lenet().parameter_count()
        61706
    """
    c = _Chain()
    c.add(Conv2d, "conv1", out_channels=6, kernel=5)
    c.add(Activation, "tanh1", function="tanh")
    c.add(Pool2d, "pool1", mode="avg", kernel=2, stride=2)
    c.add(Conv2d, "conv2", out_channels=16, kernel=5)
    c.add(Activation, "tanh2", function="tanh")
    c.add(Pool2d, "pool2", mode="avg", kernel=2, stride=2)
    c.add(Conv2d, "conv3", out_channels=120, kernel=5)
    c.add(Activation, "tanh3", function="tanh")
    c.add(Flatten, "flatten")
    c.add(Linear, "fc1", out_features=84)
    c.add(Activation, "tanh4", function="tanh")
    c.add(Linear, "fc2", out_features=10)
    return c.graph("lenet", Shape(1, 32, 32))


def sfc() -> Graph:
    """HyPar's SFC: fully connected 784-8192-8192-8192-10 on a flattened 1x28x28 input.

    4 weighted layers, 140,746,762 parameters.

    Example:
        >>> sfc().parameter_count()
        140746762
    """
    c = _Chain()
    c.add(Flatten, "flatten")
    for i, width in enumerate((8192, 8192, 8192), start=1):
        c.add(Linear, f"fc{i}", out_features=width)
        c.add(Activation, f"relu{i}", function="relu")
    c.add(Linear, "fc4", out_features=10)
    return c.graph("sfc", Shape(1, 28, 28))


def lenet_c() -> Graph:
    """HyPar's Lenet-c: Caffe's MNIST LeNet on 1x28x28 (431,080 parameters).

    conv1 20@5x5 -> pool1 max 2/2 -> conv2 50@5x5 -> pool2 max 2/2 -> ip1 fc 500 -> relu1 ->
    ip2 fc 10 (Caffe layer names; ``flatten`` makes Caffe's implicit reshape explicit).

    Example:
        >>> lenet_c().parameter_count()
        431080
    """
    c = _Chain()
    c.add(Conv2d, "conv1", out_channels=20, kernel=5)
    c.add(Pool2d, "pool1", mode="max", kernel=2, stride=2)
    c.add(Conv2d, "conv2", out_channels=50, kernel=5)
    c.add(Pool2d, "pool2", mode="max", kernel=2, stride=2)
    c.add(Flatten, "flatten")
    c.add(Linear, "ip1", out_features=500)
    c.add(Activation, "relu1", function="relu")
    c.add(Linear, "ip2", out_features=10)
    return c.graph("lenet-c", Shape(1, 28, 28))


def cifar_c() -> Graph:
    """HyPar's Cifar-c: Caffe's ``cifar10_quick`` on 3x32x32 (145,578 parameters).

    conv1 32@5x5 pad 2 -> pool1 max 3/2 -> relu1 -> conv2 32@5x5 pad 2 -> relu2 -> pool2 avg
    3/2 -> conv3 64@5x5 pad 2 -> relu3 -> pool3 avg 3/2 -> ip1 fc 64 -> ip2 fc 10. Pooling
    rounds up as Caffe does (``ceil_mode=True``): 32 -> 16 -> 8 -> 4.

    Example:
        >>> g = cifar_c()
        >>> g.parameter_count()
        145578
        >>> g.analyze().out_shape["pool3"]
        Shape(channels=64, height=4, width=4)
    """
    c = _Chain()
    c.add(Conv2d, "conv1", out_channels=32, kernel=5, padding=2)
    c.add(Pool2d, "pool1", mode="max", kernel=3, stride=2, ceil_mode=True)
    c.add(Activation, "relu1", function="relu")
    c.add(Conv2d, "conv2", out_channels=32, kernel=5, padding=2)
    c.add(Activation, "relu2", function="relu")
    c.add(Pool2d, "pool2", mode="avg", kernel=3, stride=2, ceil_mode=True)
    c.add(Conv2d, "conv3", out_channels=64, kernel=5, padding=2)
    c.add(Activation, "relu3", function="relu")
    c.add(Pool2d, "pool3", mode="avg", kernel=3, stride=2, ceil_mode=True)
    c.add(Flatten, "flatten")
    c.add(Linear, "ip1", out_features=64)
    c.add(Linear, "ip2", out_features=10)
    return c.graph("cifar-c", Shape(3, 32, 32))


# --------------------------------------------------------------------------- AlexNet / VGG


def alexnet() -> Graph:
    """Torchvision AlexNet on 3x224x224: 5 conv + 3 fc, 61,100,840 parameters.

    ``features.0..12`` (conv 64@11x11/4 pad 2, conv 192@5x5 pad 2, conv 384, 256, 256 @3x3
    pad 1, max pools 3/2), ``avgpool`` (adaptive 6x6), ``flatten``, ``classifier.0..6``
    (dropout, fc 4096, relu, dropout, fc 4096, relu, fc 1000).

    Example:
        >>> alexnet().parameter_count()
        61100840
    """
    c = _Chain()
    convs = {
        0: (64, 11, 4, 2),
        3: (192, 5, 1, 2),
        6: (384, 3, 1, 1),
        8: (256, 3, 1, 1),
        10: (256, 3, 1, 1),
    }
    for i in range(13):
        name = f"features.{i}"
        if i in convs:
            out, k, s, p = convs[i]
            c.add(Conv2d, name, out_channels=out, kernel=k, stride=s, padding=p)
        elif i in (2, 5, 12):
            c.add(Pool2d, name, mode="max", kernel=3, stride=2)
        else:
            c.add(Activation, name, function="relu")
    c.add(Pool2d, "avgpool", mode="avg", output_size=6)
    c.add(Flatten, "flatten")
    _classifier(c, dropout_first=True)
    return c.graph("alexnet", Shape(3, 224, 224))


def _classifier(c: _Chain, dropout_first: bool) -> None:
    """Torchvision's 3-layer classifier head (AlexNet puts dropout before each fc, VGG after)."""
    if dropout_first:
        kinds = ("dropout", "fc4096", "relu", "dropout", "fc4096", "relu", "fc1000")
    else:
        kinds = ("fc4096", "relu", "dropout", "fc4096", "relu", "dropout", "fc1000")
    for i, kind in enumerate(kinds):
        name = f"classifier.{i}"
        if kind.startswith("fc"):
            c.add(Linear, name, out_features=int(kind[2:]))
        else:
            c.add(Activation, name, function=kind)


#: VGG configurations (Simonyan & Zisserman 2015, table 1): an int is a 3x3 conv with that
#: many channels, (channels, 1) a 1x1 conv (config C), "M" a 2x2 max pool.
_VGG_CFGS: dict[str, tuple] = {
    "A": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "B": (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "C": (
        64,
        64,
        "M",
        128,
        128,
        "M",
        256,
        256,
        (256, 1),
        "M",
        512,
        512,
        (512, 1),
        "M",
        512,
        512,
        (512, 1),
        "M",
    ),
    "D": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    "E": (
        64,
        64,
        "M",
        128,
        128,
        "M",
        256,
        256,
        256,
        256,
        "M",
        512,
        512,
        512,
        512,
        "M",
        512,
        512,
        512,
        512,
        "M",
    ),
}


def _vgg(name: str, cfg: str) -> Graph:
    c = _Chain()
    index = 0
    for item in _VGG_CFGS[cfg]:
        if item == "M":
            c.add(Pool2d, f"features.{index}", mode="max", kernel=2, stride=2)
            index += 1
            continue
        out, k = item if isinstance(item, tuple) else (item, 3)
        c.add(Conv2d, f"features.{index}", out_channels=out, kernel=k, padding=k // 2)
        c.add(Activation, f"features.{index + 1}", function="relu")
        index += 2
    c.add(Pool2d, "avgpool", mode="avg", output_size=7)
    c.add(Flatten, "flatten")
    _classifier(c, dropout_first=False)
    return c.graph(name, Shape(3, 224, 224))


def vgg11() -> Graph:
    """Torchvision VGG-11 (config A, no batch norm) on 3x224x224: 8 conv + 3 fc, 132,863,336 params."""
    return _vgg("vgg11", "A")


def vgg13() -> Graph:
    """Torchvision VGG-13 (config B, no batch norm) on 3x224x224: 10 conv + 3 fc, 133,047,848 params."""
    return _vgg("vgg13", "B")


def vgg16() -> Graph:
    """Torchvision VGG-16 (config D, no batch norm) on 3x224x224: 13 conv + 3 fc, 138,357,544 params.

    Example:
        >>> g = vgg16()
        >>> g.parameter_count()
        138357544
        >>> g.analyze().out_shape["avgpool"]
        Shape(channels=512, height=7, width=7)
    """
    return _vgg("vgg16", "D")


def vgg19() -> Graph:
    """Torchvision VGG-19 (config E, no batch norm) on 3x224x224: 16 conv + 3 fc, 143,667,240 params."""
    return _vgg("vgg19", "E")


def vgg_c() -> Graph:
    """HyPar's VGG-C (config C): VGG-16 whose last conv in blocks 3, 4 and 5 is 1x1 (pad 0).

    Same layout and names as :func:`vgg16` (torchvision style); 13 conv + 3 fc,
    133,638,952 parameters (the paper's "134 M").

    Example:
        >>> g = vgg_c()
        >>> g.parameter_count()
        133638952
        >>> g.layer("features.14").kernel
        (1, 1)
    """
    return _vgg("vgg-c", "C")


# --------------------------------------------------------------------------- ResNet


def _basic_block(c: _Chain, prefix: str, in_channels: int, planes: int, stride: int) -> int:
    """Torchvision BasicBlock (expansion 1); returns its output channels."""
    src = c.last
    c.add(
        Conv2d,
        f"{prefix}.conv1",
        out_channels=planes,
        kernel=3,
        stride=stride,
        padding=1,
        bias=False,
    )
    c.add(Norm, f"{prefix}.bn1", kind="batch")
    c.add(Activation, f"{prefix}.relu1", function="relu")
    c.add(Conv2d, f"{prefix}.conv2", out_channels=planes, kernel=3, padding=1, bias=False)
    main = c.add(Norm, f"{prefix}.bn2", kind="batch")
    _join(c, prefix, src, main, in_channels, planes, stride)
    return planes


def _bottleneck(c: _Chain, prefix: str, in_channels: int, planes: int, stride: int) -> int:
    """Torchvision Bottleneck v1.5 (stride on the 3x3 conv, expansion 4); returns its output channels."""
    out = planes * 4
    src = c.last
    c.add(Conv2d, f"{prefix}.conv1", out_channels=planes, kernel=1, bias=False)
    c.add(Norm, f"{prefix}.bn1", kind="batch")
    c.add(Activation, f"{prefix}.relu1", function="relu")
    c.add(
        Conv2d,
        f"{prefix}.conv2",
        out_channels=planes,
        kernel=3,
        stride=stride,
        padding=1,
        bias=False,
    )
    c.add(Norm, f"{prefix}.bn2", kind="batch")
    c.add(Activation, f"{prefix}.relu2", function="relu")
    c.add(Conv2d, f"{prefix}.conv3", out_channels=out, kernel=1, bias=False)
    main = c.add(Norm, f"{prefix}.bn3", kind="batch")
    _join(c, prefix, src, main, in_channels, out, stride)
    return out


def _join(
    c: _Chain, prefix: str, src: str, main: str, in_channels: int, out: int, stride: int
) -> None:
    """Shortcut (identity, or 1x1 conv + BN when shape changes), ``add`` join and final ReLU."""
    shortcut = src
    if stride != 1 or in_channels != out:
        c.add(
            Conv2d,
            f"{prefix}.downsample.0",
            inputs=(src,),
            out_channels=out,
            kernel=1,
            stride=stride,
            bias=False,
        )
        shortcut = c.add(Norm, f"{prefix}.downsample.1", kind="batch")
    c.add(Add, f"{prefix}.add", inputs=(main, shortcut))
    c.add(Activation, f"{prefix}.relu", function="relu")


def _resnet(name: str, block: Callable[..., int], depths: tuple[int, int, int, int]) -> Graph:
    c = _Chain()
    c.add(Conv2d, "conv1", out_channels=64, kernel=7, stride=2, padding=3, bias=False)
    c.add(Norm, "bn1", kind="batch")
    c.add(Activation, "relu", function="relu")
    c.add(Pool2d, "maxpool", mode="max", kernel=3, stride=2, padding=1)
    channels = 64
    for stage, (planes, depth) in enumerate(zip((64, 128, 256, 512), depths), start=1):
        for i in range(depth):
            stride = 2 if stage > 1 and i == 0 else 1
            channels = block(c, f"layer{stage}.{i}", channels, planes, stride)
    c.add(Pool2d, "avgpool", mode="avg", output_size=1)
    c.add(Flatten, "flatten")
    c.add(Linear, "fc", out_features=1000)
    return c.graph(name, Shape(3, 224, 224))


def resnet_2block() -> Graph:
    """A two-block ResNet on 3x32x32 (CIFAR-sized): a 3x3 stem of 16 channels, a BasicBlock
    16->16 (identity shortcut), a BasicBlock 16->32 with stride 2 (1x1 downsample shortcut),
    global average pooling and a 10-way fc; 6 conv + 1 fc, small enough for ``parplan run``.

    Example:
        >>> resnet_2block().parameter_count()
        19994
    """
    c = _Chain()
    c.add(Conv2d, "conv1", out_channels=16, kernel=3, padding=1, bias=False)
    c.add(Norm, "bn1", kind="batch")
    c.add(Activation, "relu", function="relu")
    channels = _basic_block(c, "layer1.0", 16, 16, 1)
    channels = _basic_block(c, "layer2.0", channels, 32, 2)
    c.add(Pool2d, "avgpool", mode="avg", output_size=1)
    c.add(Flatten, "flatten")
    c.add(Linear, "fc", out_features=10)
    return c.graph("resnet-2block", Shape(3, 32, 32))


def resnet18() -> Graph:
    """Torchvision ResNet-18 on 3x224x224: BasicBlocks [2, 2, 2, 2]; 20 conv + 1 fc, 11,689,512 params."""
    return _resnet("resnet18", _basic_block, (2, 2, 2, 2))


def resnet34() -> Graph:
    """Torchvision ResNet-34 on 3x224x224: BasicBlocks [3, 4, 6, 3]; 36 conv + 1 fc, 21,797,672 params."""
    return _resnet("resnet34", _basic_block, (3, 4, 6, 3))


def resnet50() -> Graph:
    """Torchvision ResNet-50 on 3x224x224: Bottlenecks [3, 4, 6, 3]; 53 conv + 1 fc, 25,557,032 params."""
    return _resnet("resnet50", _bottleneck, (3, 4, 6, 3))


def resnet101() -> Graph:
    """Torchvision ResNet-101 on 3x224x224: Bottlenecks [3, 4, 23, 3]; 104 conv + 1 fc, 44,549,160 params."""
    return _resnet("resnet101", _bottleneck, (3, 4, 23, 3))


def resnet152() -> Graph:
    """Torchvision ResNet-152 on 3x224x224: Bottlenecks [3, 8, 36, 3]; 155 conv + 1 fc, 60,192,808 params."""
    return _resnet("resnet152", _bottleneck, (3, 8, 36, 3))


# --------------------------------------------------------------------------- registry

#: Zoo name -> graph builder. Names are lower case; :func:`get_model` ignores case.
MODELS: dict[str, Callable[[], Graph]] = {
    "lenet": lenet,
    "alexnet": alexnet,
    "vgg11": vgg11,
    "vgg13": vgg13,
    "vgg16": vgg16,
    "vgg19": vgg19,
    "resnet18": resnet18,
    "resnet34": resnet34,
    "resnet50": resnet50,
    "resnet101": resnet101,
    "resnet152": resnet152,
    "sfc": sfc,
    "lenet-c": lenet_c,
    "cifar-c": cifar_c,
    "vgg-c": vgg_c,
    "resnet-2block": resnet_2block,
}

_TITLES: dict[str, str] = {
    "lenet": "LeNet-5 (LeCun 1998, full C3, tanh, avg pools)",
    "alexnet": "AlexNet (torchvision)",
    "vgg11": "VGG-11, config A (torchvision, no BN)",
    "vgg13": "VGG-13, config B (torchvision, no BN)",
    "vgg16": "VGG-16, config D (torchvision, no BN)",
    "vgg19": "VGG-19, config E (torchvision, no BN)",
    "resnet-2block": "ResNet with two BasicBlocks (16, 32 channels; for parplan run)",
    "resnet18": "ResNet-18 (torchvision, BasicBlock 2-2-2-2)",
    "resnet34": "ResNet-34 (torchvision, BasicBlock 3-4-6-3)",
    "resnet50": "ResNet-50 (torchvision, Bottleneck 3-4-6-3)",
    "resnet101": "ResNet-101 (torchvision, Bottleneck 3-4-23-3)",
    "resnet152": "ResNet-152 (torchvision, Bottleneck 3-8-36-3)",
    "sfc": "HyPar SFC: fully connected 784-8192-8192-8192-10",
    "lenet-c": "HyPar Lenet-c: Caffe MNIST LeNet",
    "cifar-c": "HyPar Cifar-c: Caffe cifar10_quick",
    "vgg-c": "HyPar VGG-C: VGG config C (1x1 convs in blocks 3-5)",
}

# Transformers (BERT, GPT-2) live in their own module; the registry is one.
from parplan.models.transformers import TRANSFORMER_MODELS, TRANSFORMER_TITLES  # noqa: E402

MODELS.update(TRANSFORMER_MODELS)
_TITLES.update(TRANSFORMER_TITLES)


def canonical_name(name: str) -> str:
    """The registry spelling of a model name: trimmed, lower case, ``_`` read as ``-``."""
    return name.strip().lower().replace("_", "-")


def get_model(name: str) -> Graph:
    """The zoo graph called ``name`` (case-insensitive; ``_`` and ``-`` are interchangeable).

    Raises :class:`~parplan.errors.ConfigError` listing the valid names for an unknown one.

    Example:
        >>> get_model("VGG16").name
        'vgg16'
        >>> get_model("lenet_c").name
        'lenet-c'
        >>> get_model("resnet51")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        parplan.errors.ConfigError: unknown model 'resnet51' (did you mean 'resnet50'?); valid names: lenet, ...
    """
    key = canonical_name(name) if isinstance(name, str) else None
    if key not in MODELS:
        raise ConfigError(unknown_model_message(name))
    return MODELS[key]()


def unknown_model_message(name: object) -> str:
    """Error text for an unknown zoo name: the name, a close match if any, and every valid name."""
    hint = ""
    if isinstance(name, str):
        close = difflib.get_close_matches(canonical_name(name), list(MODELS), n=1)
        if close:
            hint = f" (did you mean '{close[0]}'?)"
    return f"unknown model {name!r}{hint}; valid names: {', '.join(MODELS)}"


def list_models() -> list[tuple[str, str]]:
    """``(name, description)`` for every zoo model, in registry order.

    The description gives the model, its per-sample input shape (C x H x W), its weighted
    layer count and its trainable parameter count; it builds every graph, so it
    takes a fraction of a second.

    Example:
        >>> dict(list_models())["vgg16"]
        'VGG-16, config D (torchvision, no BN); input 3x224x224; 16 weighted layers; 138,357,544 params'
    """
    rows = []
    for name, build in MODELS.items():
        g = build()
        s = g.input_shape
        rows.append(
            (
                name,
                f"{_TITLES[name]}; input {s.channels}x{s.height}x{s.width}; "
                f"{len(g.weighted_layers())} weighted layers; {g.parameter_count():,} params",
            )
        )
    return rows
