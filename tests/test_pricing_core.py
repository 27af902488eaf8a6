"""The compiled pricing core (parplan/costmodel/_pricing.c) against the Python it replaced
(tests/pricing_oracle.py), bit for bit: random state tables, regions, tensors, index grids and
sides; whole plans evaluated through either; and the planners' tables. The independent model
(tests/reference_model.py) is checked against the product in test_costmodel.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import pricing_oracle as oracle
from parplan.costmodel import _pricing, cost
from parplan.costmodel import split as split_module
from parplan.costmodel.cost import (
    Objective,
    ShareMode,
    SideSpec,
    StateTable,
    node_terms,
    node_value,
    node_values,
    share_intervals,
    share_points,
)
from parplan.costmodel.dims import Device, LayerDims
from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.layout import (
    JOIN_LAYOUTS,
    TYPE_ORDER,
    Layout,
    PartitionType,
    transition_table,
)
from parplan.costmodel.regions import EMPTY, Region
from parplan.costmodel.split import PlanOptions, SplitProblem, factor_scope, split_tables
from test_costmodel import plan_cases


def fast(n):
    return settings(
        max_examples=n, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
    )


COORD = st.sampled_from([0.0, 0.125, 0.25, 1 / 3, 0.5, 0.75, 1.0])


@st.composite
def intervals(draw):
    a, b = sorted((draw(COORD), draw(COORD)))
    return (a, b) if b > a else (a, min(a + 0.25, 1.0)) if a < 1.0 else (0.75, 1.0)


@st.composite
def regions(draw):
    if draw(st.integers(0, 9)) == 0:
        return EMPTY
    return Region(draw(intervals()), draw(intervals()), draw(intervals()))


@st.composite
def sides(draw):
    dev = st.sampled_from(
        [Device(1e12, 1e11), Device(3e12, 2e12, efficiency=0.5, kernel_overhead_s=5e-6)]
    )
    bw = st.sampled_from([1e9, 5e10, 4.5e11])
    return SideSpec(
        (draw(dev), draw(dev)),
        (draw(bw), draw(bw)),
        latency_s=draw(st.sampled_from([0.0, 1e-6, 2e-5])),
        bytes_per_element=draw(st.sampled_from([2.0, 4.0])),
        zero_stage=draw(st.sampled_from([0, 1, 2, 3])),
        micro_batches=draw(st.sampled_from([1, 1, 2, 8])),
        overlap=draw(st.booleans()),
    )


@st.composite
def tables_for(draw, side, join: bool, relaxed: bool):
    d = LayerDims(
        batch=draw(st.sampled_from([1, 8, 64])),
        in_features=draw(st.sampled_from([16, 96])),
        out_features=draw(st.sampled_from([16, 96])),
        in_spatial=draw(st.sampled_from([1, 49])),
        out_spatial=1,
        kernel=1,
    )
    choices = draw(
        st.lists(
            st.sampled_from(JOIN_LAYOUTS if join else TYPE_ORDER),
            min_size=1,
            max_size=3,
            unique=True,
        )
    )
    shares = share_points(side, ShareMode.FREE, draw(st.sampled_from([1, 2, 4])))
    if relaxed:
        shares = share_intervals(shares)
    above = (draw(st.booleans()), draw(st.booleans()))
    return StateTable.build(d, draw(st.booleans()), tuple(choices), shares, side, None, above)


@st.composite
def terms_cases(draw):
    """One node's terms: a producer, 1-4 consumers in 1-2 tensors, regions (or the root), and an
    index grid (full, or some members fixed at one state, as local search asks)."""
    side = draw(sides())
    relaxed = draw(st.booleans())
    k = draw(st.integers(1, 5))  # scope size: producer + consumers
    tables = [draw(tables_for(side, draw(st.booleans()), relaxed)) for _ in range(k)]
    consumers = list(range(1, k))
    groups = []
    if consumers:
        cut = draw(st.integers(1, len(consumers)))
        for part in (consumers[:cut], consumers[cut:]):
            if part:
                size = float(draw(st.sampled_from([1.0, 4096.0, 3.0e6])))
                # the forward part once, or twice when a recomputed block sends it again
                groups.append((size, tuple(part), float(draw(st.sampled_from([1.0, 2.0])))))
    regs = None
    if draw(st.booleans()):
        base = draw(regions())
        regs = [base if draw(st.booleans()) else draw(regions()) for _ in range(k)]
        # the consumers often read exactly what the producer holds (the closed-form path)
        if draw(st.booleans()) and not base.empty:
            regs = [Region(base.rows, base.outs, base.outs) if j else base for j in range(k)]
    idx = {}
    for j in range(k):
        if draw(st.integers(0, 3)) == 0:
            idx[j] = np.asarray(draw(st.integers(0, tables[j].size - 1)))
        else:
            idx[j] = np.arange(tables[j].size).reshape([-1 if i == j else 1 for i in range(k)])
    return tables, side, groups, idx, regs, draw(st.booleans())


def _same(a, b, shape):
    return np.array_equal(
        np.broadcast_to(np.asarray(a, dtype=float), shape),
        np.broadcast_to(np.asarray(b, dtype=float), shape),
    )


@seed(3507)
@fast(300)
@given(terms_cases())
def test_core_equals_the_oracle_bit_for_bit(case):
    tables, side, groups, idx, regs, leaf_pair = case
    got = node_terms(tables, side, groups, 0, idx, regs, leaf_pair)
    want = oracle.node_terms(tables, side, groups, 0, idx, regs, leaf_pair)
    shape = np.broadcast_shapes(
        *(np.shape(x) for x in (*got.received, *want.received, *got.comm, *want.comm))
    )
    for name in ("received", "comm", "weight", "intra", "compute"):
        for g, w in zip(getattr(got, name), getattr(want, name)):
            assert _same(g, w, shape), name
    assert (got.steps is None) == (want.steps is None)
    # the planners' one-pass values are the evaluator's node_value of the oracle's terms
    for objective in (Objective.TIME, Objective.COMMUNICATION):
        values = node_values(tables, side, groups, 0, idx, regs, leaf_pair, objective)
        assert _same(values, node_value(want, objective), shape), objective


@seed(3518)
@fast(150)
@given(terms_cases(), st.data())
def test_a_line_of_states_prices_as_the_grid_does(case, data):
    """The local search's calls (every member at one state but one, along its states) take the
    core's short path for points and lines: the same bits as the general index grid and the
    oracle."""
    tables, side, groups, _, regs, leaf_pair = case
    k = len(tables)
    j = data.draw(st.integers(0, k - 1))
    at = [data.draw(st.integers(0, t.size - 1)) for t in tables]
    line = {w: np.asarray(at[w]) for w in range(k)}
    line[j] = np.arange(tables[j].size)
    grid = dict(line)
    grid[j] = np.arange(tables[j].size).reshape(-1, 1)  # two axes: the general path
    for objective in (Objective.TIME, Objective.COMMUNICATION):
        got = node_values(tables, side, groups, 0, line, regs, leaf_pair, objective)
        want = node_values(tables, side, groups, 0, grid, regs, leaf_pair, objective)
        oracle_value = node_value(
            oracle.node_terms(tables, side, groups, 0, line, regs, leaf_pair), objective
        )
        assert got.shape == (tables[j].size,)
        assert np.array_equal(got, want.reshape(-1)), objective
        assert _same(got, oracle_value, got.shape), objective


def _with_oracle(monkeypatch):
    """Route the product's pricing through the oracle (and forget memoised terms)."""
    split_module.clear_memo()
    monkeypatch.setattr(split_module, "node_terms", oracle.node_terms)


@seed(3508)
@fast(120)
@given(plan_cases())
def test_plans_price_the_same_through_the_oracle(case):
    p, plan = case
    split_module.clear_memo()
    got = evaluate(p, plan)
    with pytest.MonkeyPatch.context() as mp:
        _with_oracle(mp)
        want = evaluate(p, plan)
    split_module.clear_memo()
    assert got.step_time_s == want.step_time_s
    assert got.communication_elements == want.communication_elements
    assert got.node_time_s == want.node_time_s
    assert got.device_memory_bytes == want.device_memory_bytes


@seed(3509)
@fast(40)
@given(plan_cases(), st.booleans())
def test_dp_tables_are_the_same_through_the_oracle(case, relaxed):
    """Every factor table the DP builds at every group of a plan's hierarchy."""
    p, plan = case
    sp = SplitProblem.root(p)
    tables = split_tables(sp, PlanOptions(share_grid=2), relaxed)
    for u in range(len(tables)):
        scope = factor_scope(sp.planning, u)
        k = len(scope)
        idx = {
            w: np.arange(tables[w].size).reshape([-1 if j == i else 1 for j in range(k)])
            for i, w in enumerate(scope)
        }
        got = node_terms(tables, sp.side, sp.groups(u), u, idx, *sp.frames)
        want = oracle.node_terms(tables, sp.side, sp.groups(u), u, idx, *sp.frames)
        shape = tuple(tables[w].size for w in scope)
        for g, w in zip((*got.received, *got.comm), (*want.received, *want.comm)):
            assert _same(g, w, shape)


def test_transition_table_and_receive_are_the_closed_forms():
    """HyPar's table at 1/2 and the ends of the share range, through the core's scalar entries."""
    B, I = PartitionType.BATCH, PartitionType.IN
    assert transition_table(B, I, 0.5) == (0.5, 0.5)
    assert transition_table(I, B, 1.0, 0.5) == (
        0.5,
        0.5,
    )  # side 2 needs rows only side 1 holds; E back
    assert transition_table(Layout.ROWS, Layout.ROWS, 0.25, 0.75) == (0.5, 0.5)
    side = SideSpec(
        (Device(1e12, 1e12),) * 2,
        (1e9, 2e9),
        latency_s=1e-6,
        bytes_per_element=2.0,
        micro_batches=4,
        zero_stage=2,
    )
    # 1000 elements, 600 of them a per-step exchange that pays its latency per micro-batch at ZeRO-2
    assert math.isclose(
        cost.receive_seconds(side, 1, 1000.0, 600.0), 4e-6 + 1000 * 2 / 2e9, rel_tol=1e-15
    )
    assert cost.receive_seconds(side, 0, 0.0) == 0.0
    assert cost.receive_seconds(side, 0, 1000.0, 600.0) == oracle.receive_seconds(
        side, 0, 1000.0, 600.0
    )


def test_malformed_calls_raise_errors_not_crashes():
    t = StateTable.build(
        LayerDims(batch=4, in_features=8, out_features=8, in_spatial=1, out_spatial=1, kernel=1),
        False,
        (PartitionType.BATCH,),
        (0.5,),
        SideSpec((Device(1e12, 1e12),) * 2, (1e9, 1e9), 0.0, 2.0),
    )
    side = (2.0, 1e9, 1e9, 0.0, 1.0, 0.0, 0.0, 1.0)
    out = np.empty((6, 1))
    zero = np.zeros(1, dtype=np.int64)
    with pytest.raises(IndexError):
        _pricing.relayout(
            (t.packed,), (np.array([5], dtype=np.int64),), (), (), np.array([0.0]), side, out
        )
    with pytest.raises(ValueError):  # a consumer position outside the scope
        _pricing.relayout(
            (t.packed,), (zero,), (), (), np.array([1.0, 10.0, 0.0, 1.0, 3.0]), side, out
        )
    with pytest.raises(ValueError):  # an output too small
        _pricing.relayout((t.packed,), (zero,), (), (), np.array([0.0]), side, np.empty((5, 1)))
    with pytest.raises(TypeError):
        _pricing.relayout([t.packed], (zero,), (), (), np.array([0.0]), side, out)


def _naive_order(scopes, n):
    """The min-degree order as first written: a linear scan per step."""
    adj = [set() for _ in range(n)]
    for scope in scopes:
        for a in scope:
            adj[a].update(b for b in scope if b != a)
    left, order = set(range(n)), []
    while left:
        v = min(left, key=lambda x: (len(adj[x]), x))
        order.append(v)
        left.remove(v)
        for a in adj[v]:
            adj[a].update(b for b in adj[v] if b != a)
            adj[a].discard(v)
    return order


@seed(3510)
@fast(200)
@given(
    st.integers(1, 30).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.lists(st.lists(st.integers(0, n - 1), min_size=1, max_size=4), max_size=40),
        )
    )
)
def test_heap_elimination_order_is_the_linear_scans(case):
    from parplan.solvers.dp import elimination_order

    n, scopes = case
    scopes = [tuple(sorted(set(s))) for s in scopes]
    assert elimination_order(scopes, n) == _naive_order(scopes, n)


def _numpy_eliminate(mine, scope, shape, axis):
    """The elimination step as the DP first wrote it, in numpy."""
    from parplan.costmodel.cost import REL_TOL

    total = np.zeros(shape)
    for s, table in mine:
        total = total + np.asarray(table).reshape(
            [shape[scope.index(w)] if w in s else 1 for w in scope]
        )
    best = total.min(axis=axis, keepdims=True)
    arg = np.argmax(total <= best + REL_TOL * np.abs(best), axis=axis)
    return np.squeeze(best, axis=axis), arg


@seed(3511)
@fast(300)
@given(st.data())
def test_compiled_elimination_is_numpys(data):
    from parplan.solvers.dp import eliminate

    k = data.draw(st.integers(1, 4))
    scope = tuple(
        sorted(data.draw(st.lists(st.integers(0, 9), min_size=k, max_size=k, unique=True)))
    )
    shape = tuple(data.draw(st.integers(1, 5)) for _ in scope)
    axis = data.draw(st.integers(0, k - 1))
    values = st.sampled_from(
        [0.0, 1.0, 1.0 + 1e-13, 2.5, -3.0, 1e-9, 7.0]
    )  # ties within REL_TOL too
    mine = []
    for _ in range(data.draw(st.integers(1, 3))):
        s = tuple(w for w in scope if data.draw(st.booleans())) or (scope[axis],)
        sub = tuple(shape[scope.index(w)] for w in s)
        mine.append(
            (
                s,
                np.array(
                    data.draw(
                        st.lists(values, min_size=int(np.prod(sub)), max_size=int(np.prod(sub)))
                    ),
                    dtype=float,
                ).reshape(sub),
            )
        )
    best, arg = eliminate(mine, scope, shape, axis)
    want_best, want_arg = _numpy_eliminate(mine, scope, shape, axis)
    assert np.array_equal(best, want_best) and np.array_equal(arg, want_arg)


@seed(3517)
@fast(200)
@given(st.data())
def test_the_compiled_elimination_finds_the_least_sum_of_the_factors(data):
    """_pricing.solve (dp.min_states' elimination in one call) against brute force over every
    joint state: its value is the least sum of the floored factors, and its states reach it."""
    import itertools

    from parplan.solvers.dp import elimination_order

    n = data.draw(st.integers(1, 5))
    sizes = [data.draw(st.integers(1, 4)) for _ in range(n)]
    values = st.sampled_from([0.0, 1.0, 1.0 + 1e-13, 2.5, 3.0, 1e-9, 7.0])
    scopes, tables, floors = [], [], []
    for u in range(n):
        others = [w for w in range(n) if w != u and data.draw(st.booleans())]
        scope = (u, *data.draw(st.permutations(others)))
        shape = tuple(sizes[w] for w in scope)
        cells = int(np.prod(shape))
        tables.append(
            np.array(data.draw(st.lists(values, min_size=cells, max_size=cells))).reshape(shape)
        )
        scopes.append(scope)
        floors.append(data.draw(st.sampled_from([0.0, 1.0, 2.5])))
    order = tuple(elimination_order(scopes, n))
    value, states = _pricing.solve(
        tuple(scopes), tuple(tables), tuple(floors), tuple(sizes), order, 1e9
    )

    def total(state):
        return sum(
            float(oracle.floored_time(t[tuple(state[w] for w in sc)], f))
            for sc, t, f in zip(scopes, tables, floors)
        )

    least = min(total(x) for x in itertools.product(*(range(k) for k in sizes)))
    assert math.isclose(value, least, rel_tol=1e-12, abs_tol=1e-15)
    assert math.isclose(total(states), value, rel_tol=1e-12, abs_tol=1e-15)
    assert all(0 <= x < k for x, k in zip(states, sizes))
    # a step over more cells than the limit names its node instead
    if max(np.prod([sizes[w] for w in sc]) for sc in scopes) > 1:
        got = _pricing.solve(tuple(scopes), tuple(tables), tuple(floors), tuple(sizes), order, 1.0)
        assert got[0] is None and 0 <= got[1] < n and got[2] > 1.0


@st.composite
def layer_dims(draw):
    """Sizes with carried ops of every kind, experts, tables, groups, recomputation and
    micro-batches (the fields the compiled compute, memory and state tables read)."""
    from parplan.costmodel.dims import ElementOp

    op = st.builds(
        ElementOp,
        st.just("op"),
        st.sampled_from([0.0, 5.0, 1e3]),
        st.sampled_from([0.0, 2.0, 7.5]),
        st.sampled_from([0.0, 1.0, 3.0]),
        st.sampled_from([0.0, 4.0]),
        st.sampled_from(["", "attention"]),
    )
    kernel = draw(st.sampled_from([0, 1, 9]))
    return LayerDims(
        batch=draw(st.sampled_from([1.0, 8.0, 0.375])),
        in_features=draw(st.sampled_from([16.0, 96.0, 4.5])),
        out_features=draw(st.sampled_from([16.0, 96.0])),
        in_spatial=draw(st.sampled_from([1, 49])),
        out_spatial=draw(st.sampled_from([1, 49])),
        kernel=kernel,
        groups=draw(st.sampled_from([1, 4])) if kernel else 1,
        out_ops=tuple(draw(st.lists(op, max_size=3))),
        in_ops=tuple(draw(st.lists(op, max_size=2))),
        tables=draw(st.sampled_from([0.0, 1000.0])),
        experts=draw(st.sampled_from([1, 8])),
        active=draw(st.sampled_from([1, 2])),
        replica=draw(st.sampled_from([1.0, 0.25])),
        recompute=draw(st.booleans()),
        micro_batches=draw(st.sampled_from([1, 4])),
    )


DEVICES = st.sampled_from(
    [
        Device(1e12, 1e11),
        Device(
            9.89e14,
            3.35e12,
            efficiency=0.67,
            conv_efficiency=0.64,
            attention_efficiency=0.44,
            memory_efficiency=0.86,
            kernel_overhead_s=5.6e-5,
        ),
    ]
)


@seed(3512)
@fast(400)
@given(layer_dims(), DEVICES, st.sampled_from([2.0, 4.0]), st.sampled_from([0, 1, 2, 3]))
def test_compute_memory_and_intra_equal_the_oracle(d, dev, bpe, zero):
    assert d.compute_seconds(dev, bpe) == oracle.compute_seconds(d, dev, bpe)
    assert d.memory_bytes(bpe, 12.0, zero) == oracle.memory_bytes(d, bpe, 12.0, zero)
    assert d.gathered_bytes(bpe, zero) == oracle.gathered_bytes(d, bpe, zero)
    for c in (*TYPE_ORDER, *JOIN_LAYOUTS):
        assert cost.intra_elements(d, c) == oracle.intra_elements(d, c)
    for op in d.out_ops:
        from parplan.costmodel.dims import op_seconds

        assert op_seconds(op, 3.0, dev, bpe, d.micro_batches, d.recompute) == oracle.op_seconds(
            op, 3.0, dev, bpe, d.micro_batches, d.recompute
        )


@seed(3513)
@fast(150)  # 7.6 s at 300: the default suite's third-largest test
@given(layer_dims(), sides(), st.booleans(), st.booleans(), st.booleans(), st.booleans(), st.data())
def test_state_tables_equal_the_oracle(d, side, join, relaxed, covered, collective, data):
    from dataclasses import replace

    from parplan.costmodel.collective import parse_collective

    if collective:
        side = replace(side, collective=parse_collective("ring:ring"), hosts=4)
    choices = tuple(
        data.draw(
            st.lists(
                st.sampled_from(JOIN_LAYOUTS if join else TYPE_ORDER),
                min_size=1,
                max_size=3,
                unique=True,
            )
        )
    )
    shares = share_points(side, ShareMode.FREE, data.draw(st.sampled_from([1, 2, 16])))
    if relaxed:
        shares = share_intervals(shares)
    above = (data.draw(st.booleans()), data.draw(st.booleans()))
    red = data.draw(st.sampled_from([None, 77.0]))
    got = StateTable._build(d, covered, choices, shares, side, red, above)
    want = oracle.build_table(d, covered, choices, shares, side, red, above)
    assert got.choices == want.choices
    for f in (
        "lo",
        "hi",
        "has",
        "give",
        "need",
        "compute",
        "memory",
        "intra",
        "extra",
        "steps",
        "wintra",
        "activations",
        "gathered",
    ):
        a, b = getattr(got, f), getattr(want, f)
        assert a.dtype == b.dtype and np.array_equal(a, b), f


@seed(3514)
@fast(40)
@given(plan_cases(), st.data())
def test_bound_recursion_equals_the_oracle(case, data):
    """The compiled per-node bound (LB_g of docs/costmodel.md section 8) over random arrays,
    sizes and shares, and each half's bound per state as raised_tables reads it."""
    from parplan.costmodel.cost import side_dims
    from parplan.solvers.bound import _Bound

    p, _ = case
    if p.array.is_leaf:
        return
    grid = data.draw(st.sampled_from([4, 1024]))
    ours, theirs = _Bound(p, grid), oracle.OracleBound(p, grid)
    groups = [p.array, p.array.left, p.array.right]
    for v, node in enumerate(p.planning.nodes):
        d = p.root_dims()[v]
        ours.use(d, node.choices)
        theirs.use(d, node.choices)
        for g in groups:
            c = data.draw(st.sampled_from(node.choices))
            part = side_dims(
                d,
                c,
                data.draw(st.sampled_from([0.125, 0.5, 0.75])),
                data.draw(st.sampled_from([0, 1])),
                True,
            )
            assert ours.lb(g, part, node.choices) == theirs.lb(g, part, node.choices)
        t = StateTable.build(
            d,
            False,
            node.choices,
            share_intervals(share_points(p.side_spec(p.array), ShareMode.FREE, 4)),
            p.side_spec(p.array),
        )
        got = ours.states(p.array, d, t)
        for s, c in enumerate(t.choices):
            for i, (half, share) in enumerate(((p.array.left, t.lo[s]), (p.array.right, t.hi[s]))):
                want = theirs.lb(
                    half, side_dims(d, c, float(share), i, bool(t.has[i][s])), node.choices
                )
                assert got[i][s] == want


@seed(3515)
@fast(200)
@given(
    st.lists(st.sampled_from([0.0, 1e-9, 3e-4, 0.5, 2.0, 7.25]), min_size=1, max_size=20),
    st.sampled_from([0.0, 1e-9, 3e-4, 1.0]),
)
def test_floored_time_equals_the_oracle(times, floor):
    got = cost.floored_time(np.array(times), floor)
    assert np.array_equal(got, oracle.floored_time(np.array(times), floor))
    assert float(cost.floored_time(times[0], floor)) == float(oracle.floored_time(times[0], floor))


def test_a_node_read_by_many_consumers_prices_without_overflow():
    """DenseNet's concatenations: one tensor read by 40 consumers (the product of their state
    counts overflows 64 bits); local search asks for one consumer's states, the rest fixed."""
    side = SideSpec((Device(1e12, 1e12),) * 2, (1e9, 2e9), latency_s=1e-6, bytes_per_element=2.0)
    d = LayerDims(batch=8, in_features=32, out_features=32, in_spatial=1, out_spatial=1, kernel=1)
    shares = share_points(side, ShareMode.FREE, 4)
    tables = [StateTable.build(d, False, TYPE_ORDER, shares, side)] + [
        StateTable.build(d, False, JOIN_LAYOUTS, shares, side) for _ in range(40)
    ]
    groups = [(256.0, tuple(range(1, 41)), 1.0)]
    idx = {w: np.asarray(w % tables[w].size) for w in range(41)}
    idx[7] = np.arange(tables[7].size)
    for leaf_pair in (True, False):
        got = node_terms(tables, side, groups, 0, idx, None, leaf_pair)
        want = oracle.node_terms(tables, side, groups, 0, idx, None, leaf_pair)
        for g, w in zip((*got.received, *got.comm), (*want.received, *want.comm)):
            assert _same(g, w, (tables[7].size,))


def deep_chain(depth: int) -> dict:
    """An array file's tree: one H100 and, on the other side, the same again ``depth`` deep."""
    return (
        {"device": "h100"}
        if depth == 0
        else {"left": {"device": "h100"}, "right": deep_chain(depth - 1), "gb_per_s": 100}
    )


def test_the_bound_recursion_stops_at_its_budget(monkeypatch):
    """An unbalanced tree many levels deep makes the per-node bound exponential in its depth
    (issue 36: a 40-level array file hung); past its budget it raises TableTooLarge, which the
    planners' look-ahead criteria catch, and an exhausted tree stays refused at once."""
    import parplan
    import parplan.solvers.bound as bound
    from parplan.errors import TableTooLarge

    monkeypatch.setattr(bound, "BOUND_BUDGET", 2_000)
    import json
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "deep.json"
        path.write_text(json.dumps(deep_chain(12)))
        array = parplan.parse_array(str(path))
    p = parplan.Problem(parplan.load_model("vgg11"), array, batch=8)
    b = bound._Bound(p, 1024)
    node, d = p.planning.nodes[0], p.root_dims()[0]
    with pytest.raises(TableTooLarge, match="more than 2e\\+03 bounds"):
        b.lb(p.array, d, node.choices)
    with pytest.raises(TableTooLarge):
        b.lb(p.array.right, d, node.choices)


@seed(3516)
@fast(200)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0.0, 1e-9, 3e-4, 0.5, 2.0]),
            st.sampled_from([0.0, 1e-6, 0.25, 3.0]),
            st.sampled_from([0.0, 1e-6, 0.1, 5.0]),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_overlap_time_equals_the_oracle(rows):
    work, comm, weight = (np.array(x) for x in zip(*rows))
    assert np.array_equal(
        cost.overlap_time(work, comm, weight), oracle.overlap_time(work, comm, weight)
    )
    assert cost.overlap_time(work[0], comm[0], 0.0) == oracle.overlap_time(work[0], comm[0], 0.0)
    # broadcasting a column against a row, as the interval states do
    assert np.array_equal(
        cost.overlap_time(work[:, None], comm[None, :], weight[:, None]),
        oracle.overlap_time(work[:, None], comm[None, :], weight[:, None]),
    )
