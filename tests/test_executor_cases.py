"""Random small DAGs and plans for the executor tests (tests/test_executor.py, test_schedule.py)."""

from hypothesis import strategies as st

from parplan.costmodel.graph import Activation, Add, Concat, Conv2d, Flatten, Graph, Linear, Pool2d, Shape
from parplan.costmodel.problem import Plan, Split

SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
BATCH = 8


@st.composite
def dags(draw):
    """A small CNN built from blocks: conv (+relu), residual add, two-branch concat or add,
    optionally ending in pooling, flatten and a linear layer. (An add never joins a concat's
    output with a conv's: the executor rejects joins of different column structures.)"""
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
        layers.append(Conv2d(name, (src,), out_channels=out, kernel=kernel, padding=kernel // 2, bias=False))
        return name

    while weighted < target:
        block = draw(st.sampled_from(("conv", "residual", "concat", "fork_add")))
        if block == "residual" and last.startswith("cat"):
            block = "fork_add"
        if block == "conv" or target - weighted < 2:
            out = draw(st.sampled_from((4, 8)))
            last, channels = conv(last, out), out
            if draw(st.booleans()):
                k += 1
                layers.append(Activation(f"r{k}", (last,), function="relu"))
                last = f"r{k}"
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
