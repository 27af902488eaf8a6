"""Node costs: the exact share optimiser against a dense grid, memory, scaling (SPEC 4-5)."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from parplan.costmodel.cost import (
    Objective, ShareMode, SideSpec, best_share, exchanges, node_comm, node_cost, node_memory,
    scale_for_sides, split_time,
)
from parplan.costmodel.dims import LayerDims
from parplan.costmodel.layout import JOIN_LAYOUTS, PartitionType

TYPES = list(PartitionType)
CHOICES = TYPES + list(JOIN_LAYOUTS)


def dims_strategy():
    return st.builds(
        LayerDims,
        batch=st.integers(1, 512).map(float),
        in_features=st.integers(1, 4096).map(float),
        out_features=st.integers(1, 4096).map(float),
        in_spatial=st.sampled_from([1, 49, 196, 3136]),
        out_spatial=st.sampled_from([1, 49, 196, 3136]),
        kernel=st.sampled_from([1, 9]),
    )


sides = st.builds(
    SideSpec,
    flops_per_s=st.tuples(st.floats(1e9, 1e15), st.floats(1e9, 1e15)),
    bytes_per_s=st.floats(1e6, 1e12),
    latency_s=st.sampled_from([0.0, 1e-6, 1e-4]),
    bytes_per_element=st.sampled_from([2.0, 4.0]),
)


@settings(max_examples=300, deadline=None)
@given(dims_strategy(), st.sampled_from(TYPES), st.lists(st.sampled_from(CHOICES), max_size=2), sides)
def test_best_share_is_the_global_minimum_over_a_dense_grid(dims, choice, preds, side):
    e1, e2 = node_comm(dims, choice, tuple(preds), tuple([1.0] * len(preds)))
    ex = exchanges(e1, e2, choice)
    a, t = best_share(dims.flops, e1, e2, ex, side)
    assert 0.0 <= a <= 1.0
    assert math.isclose(split_time(dims.flops, e1, e2, ex, side, a), t, rel_tol=1e-12)
    grid = np.linspace(0.0, 1.0, 2001)
    grid_min = min(split_time(dims.flops, e1, e2, ex, side, g) for g in grid)
    assert t <= grid_min * (1 + 1e-9)


def test_no_communication_share_is_compute_proportional():
    d = LayerDims(64, 256, 256, 1, 1, 1)
    side = SideSpec((45e12, 123e12), 1e30, 0.0, 2.0)
    e1, e2 = node_comm(d, PartitionType.BATCH, (), ())
    a, _ = best_share(d.flops, e1, e2, False, side)
    assert math.isclose(a, 45 / (45 + 123), rel_tol=1e-9)


def test_fixed_shares_and_communication_objective():
    d = LayerDims(8, 100, 50, 1, 1, 1)
    side = SideSpec((1e12, 3e12), 1e9, 0.0, 2.0)
    a, value = node_cost(d, PartitionType.IN, (PartitionType.BATCH,), (1.0,), side,
                         Objective.COMMUNICATION, ShareMode.HALF)
    # intra |F_out| per side + BATCH->IN a(1-a)*2A per side, both sides
    assert a == 0.5 and math.isclose(value, 2 * (8 * 50) + 2 * (0.25 * 2 * 8 * 100))
    a, _ = node_cost(d, PartitionType.IN, (), (), side, Objective.TIME, ShareMode.PROPORTIONAL)
    assert math.isclose(a, 0.25)


@settings(max_examples=100, deadline=None)
@given(dims_strategy(), st.sampled_from(TYPES), st.floats(0.0, 1.0))
def test_memory_equals_twice_weights_plus_input_of_the_dims_each_side_keeps(dims, choice, a):
    m1, m2 = node_memory(dims, choice)
    d1, d2 = scale_for_sides(dims, choice, a)
    for m, d in ((m1.at(a), d1), (m2.at(a), d2)):
        assert math.isclose(m, 2 * d.weight_elements + d.in_elements, rel_tol=1e-9, abs_tol=1e-6)


def test_scaling_by_type():
    d = LayerDims(10, 20, 30, 4, 4, 9)
    l, r = scale_for_sides(d, PartitionType.BATCH, 0.3)
    assert math.isclose(l.batch, 3) and math.isclose(r.batch, 7) and l.in_features == 20
    l, r = scale_for_sides(d, PartitionType.IN, 0.3)
    assert math.isclose(l.in_features, 6) and l.out_features == 30
    l, r = scale_for_sides(d, PartitionType.OUT, 0.3)
    assert math.isclose(r.out_features, 21) and r.batch == 10
    # FLOPs split exactly by the share whatever the type
    for t in TYPES:
        l, r = scale_for_sides(d, t, 0.3)
        assert math.isclose(l.flops + r.flops, d.flops) and math.isclose(l.flops, 0.3 * d.flops)
