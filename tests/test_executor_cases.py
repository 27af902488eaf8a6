"""Random small DAGs and plans for the executor tests (tests/test_executor.py, test_schedule.py)."""

from hypothesis import strategies as st

from parplan.costmodel.graph import (
    Activation,
    Add,
    Bias,
    Concat,
    Conv2d,
    Flatten,
    Graph,
    Linear,
    Mul,
    Norm,
    Pool2d,
    Scale,
    Shape,
)
from parplan.costmodel.problem import Plan, Split

SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
BATCH = 8


@st.composite
def dags(draw):
    """A small CNN built from blocks: conv (+relu, + a learned scale or bias), residual add,
    two-branch concat or add, a product of two branches, a squeeze-and-excitation gate (a
    per-channel vector times the tensor), an RMS norm, optionally ending in pooling, flatten and
    a linear layer. (A join never joins a concat's output with a conv's: the executor rejects
    joins of different column structures.)"""
    layers = []
    last, channels = "input", 4
    weighted = 0
    target = draw(st.integers(2, 6))
    k = 0

    def conv(src, out, name=None):
        nonlocal k, weighted
        k += 1
        weighted += 1
        kernel = draw(st.sampled_from((1, 3)))
        name = name or f"c{k}"
        layers.append(
            Conv2d(name, (src,), out_channels=out, kernel=kernel, padding=kernel // 2, bias=False)
        )
        return name

    while weighted < target:
        block = draw(
            st.sampled_from(("conv", "residual", "concat", "fork_add", "product", "gate", "rms"))
        )
        if block in ("residual", "gate") and last.startswith("cat"):
            block = "fork_add"
        if block == "conv" or target - weighted < 2:
            out = draw(st.sampled_from((4, 8)))
            last, channels = conv(last, out), out
            extra = draw(st.sampled_from(("relu", "silu", "scale", "bias", None)))
            if extra is not None:
                k += 1
                if extra == "scale":
                    layers.append(Scale(f"s{k}", (last,)))
                elif extra == "bias":
                    layers.append(Bias(f"s{k}", (last,), full=draw(st.booleans())))
                else:
                    layers.append(Activation(f"s{k}", (last,), function=extra))
                last = f"s{k}"
        elif block == "residual":
            body = conv(last, channels)
            k += 1
            layers.append(Add(f"add{k}", (last, body)))
            last = f"add{k}"
        elif block == "concat":
            a, b = conv(last, 4), conv(last, 4)
            k += 1
            layers.append(Concat(f"cat{k}", (a, b)))
            last, channels = f"cat{k}", 8
        elif block == "product":
            a, b = conv(last, channels), conv(last, channels)
            k += 1
            layers.append(Activation(f"g{k}", (a,), function="sigmoid"))
            layers.append(Mul(f"mul{k}", (f"g{k}", b)))
            last = f"mul{k}"
        elif (
            block == "gate"
        ):  # squeeze and excitation: pool to 1 x 1, a 1 x 1 conv, sigmoid, times x
            k += 1
            layers.append(Pool2d(f"sq{k}", (last,), mode="avg", output_size=(1, 1)))
            gate = conv(f"sq{k}", channels)
            layers.append(Activation(f"sig{k}", (gate,), function="sigmoid"))
            layers.append(Mul(f"se{k}", (last, f"sig{k}")))
            last = f"se{k}"
        elif block == "rms":
            last = conv(last, channels)
            k += 1
            layers.append(Norm(f"rms{k}", (last,), kind="rms"))
            last = f"rms{k}"
        else:
            a, b = conv(last, channels), conv(last, channels)
            k += 1
            layers.append(Add(f"add{k}", (a, b)))
            last = f"add{k}"
    if draw(st.booleans()):
        layers.append(Pool2d("pool", (last,), mode="max", kernel=2))
        layers.append(Flatten("flat", ("pool",)))
        layers.append(Linear("fc", ("flat",), out_features=4, bias=False))
    return Graph("random", Shape(4, 4, 4), tuple(layers))


@st.composite
def plans(draw, problem):
    splits = {}
    for path, _ in problem.array.inner_nodes():
        nodes = problem.planning.nodes
        choices = tuple(draw(st.sampled_from(n.choices)) for n in nodes)
        shares = tuple(draw(st.sampled_from(SHARES)) for _ in nodes)
        splits[path] = Split(choices, shares)
    return Plan(splits)
