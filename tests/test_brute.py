"""Random small DAGs and chains: exact (MIP) == brute force == DP, and all backends agree.

Graphs mix convolutions, pass-through activations, residual adds and concats; arrays are
random pairs of devices with random links; options cover AccPar, HyPar (communication
objective), OWT and data parallelism (fixed shares, restricted types).
"""

import math

import numpy as np

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parplan.costmodel.cost import Objective, ShareMode, share_points
from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.graph import (
    Activation,
    Add,
    Concat,
    Conv2d,
    Graph,
    Mul,
    Scan,
    Shape,
    Slice,
)
from parplan.costmodel.hardware import parse_array
from parplan.costmodel.problem import Plan, Problem, Split
from parplan.errors import ConfigError
from parplan.solvers.backends import available_backends
from parplan.solvers.brute import brute_force, brute_force_split
from parplan.solvers.dp import PlanOptions, SplitProblem, frontier_dp, min_states
from parplan.solvers.exact import price_of, solve_exact, solve_split_exact
from parplan.solvers.planners import planner_options
from parplan.models.zoo import get_model

DEVICES = ("tpu-v2", "tpu-v3", "v100", "a100", "h100")
TOL = {"scip": 1e-9, "cbc": 1e-8, "highs": 1e-9, "cpsat": 1e-6}


def fast(examples: int):
    """Deterministic (derandomized), no deadline: the examples are fixed and reproducible."""
    return settings(max_examples=examples)


@st.composite
def graphs(draw, max_weighted=6, max_joins=3, chain=False, slices=False):
    """A random DAG (or chain) of convolutions with optional adds and concats; ``slices``: a
    convolution may read half of a tensor's channels (a :class:`Slice`), and a join may be a
    product with a per-position gate (a one-channel convolution: its layouts ROWS and WHOLE)
    or a selective scan (Mamba's: its B and C two slices of one convolution's output, its gate
    optional; ROWS and WHOLE too); a convolution may be causal."""
    spatial = draw(st.sampled_from([1, 2, 4, 7]))
    c0 = draw(st.integers(1, 48))
    tensors: list[tuple[str, int]] = [("input", c0)]
    layers = []
    n_weighted = draw(st.integers(1, max_weighted))
    n_joins = 0 if chain else draw(st.integers(0, max_joins))
    ops = ["w"] + draw(st.permutations(["w"] * (n_weighted - 1) + ["j"] * n_joins))
    for i, op in enumerate(ops):
        if op == "j" and slices and draw(st.integers(0, 3)) == 0:
            a = draw(st.sampled_from([n for n, _ in tensors]))
            c = dict(tensors)[a]
            same = [n for n, ch in tensors if ch == c and n != a]
            if same:  # dt: another tensor of x's size, or a new 1 x 1 convolution
                dt = draw(st.sampled_from(same))
            else:
                dt = f"dt{i}"
                src = draw(st.sampled_from(tensors))[0]
                layers.append(Conv2d(dt, (src,), out_channels=c, kernel=1))
                tensors.append((dt, c))
            even = [n for n, ch in tensors if ch % 2 == 0]
            if even:  # B and C: the two halves of one tensor
                bc = draw(st.sampled_from(even))
                state = dict(tensors)[bc] // 2
            else:
                bc, state = a, 1
                layers.append(Conv2d(f"bc{i}", (a,), out_channels=2, kernel=1))
                bc = f"bc{i}"
            layers += [
                Slice(f"b{i}", (bc,), start=0, stop=state),
                Slice(f"c{i}", (bc,), start=state, stop=2 * state),
            ]
            ins = (a, dt, f"b{i}", f"c{i}")
            gates = [n for n, ch in tensors if ch == c and n not in (a, dt)]
            if gates and draw(st.booleans()):
                ins += (draw(st.sampled_from(gates)),)
            skip, bias = draw(st.booleans()), draw(st.booleans())
            layers.append(Scan(f"scan{i}", ins, state=state, skip=skip, dt_bias=bias))
            tensors.append((f"scan{i}", c))
            continue
        if op == "j" and slices and draw(st.integers(0, 2)) == 0:
            a = draw(st.sampled_from([n for n, _ in tensors]))
            layers.append(
                Conv2d(f"gate{i}", (draw(st.sampled_from(tensors))[0],), out_channels=1, kernel=1)
            )
            layers.append(Mul(f"mul{i}", (a, f"gate{i}")))
            tensors.append((f"mul{i}", dict(tensors)[a]))
            continue
        if op == "j":
            same = {}
            for name, c in tensors:
                same.setdefault(c, []).append(name)
            pairs = [names for names in same.values() if len(names) >= 2]
            if pairs and draw(st.booleans()):
                names = draw(st.sampled_from(pairs))
                a, b = draw(st.permutations(names))[:2]
                layers.append(Add(f"add{i}", (a, b)))
                tensors.append((f"add{i}", dict(tensors)[a]))
            else:
                a, b = (
                    draw(st.permutations([n for n, _ in tensors]))[:2]
                    if len(tensors) > 1
                    else ("input", "input")
                )
                layers.append(Concat(f"cat{i}", (a, b)))
                tensors.append((f"cat{i}", dict(tensors)[a] + dict(tensors)[b]))
            continue
        src = tensors[-1][0] if chain else draw(st.sampled_from([n for n, _ in tensors]))
        c_src = dict(tensors)[src]
        if slices and c_src >= 2 and c_src % 2 == 0 and draw(st.booleans()):
            half = draw(st.integers(0, 1)) * c_src // 2
            layers.append(Slice(f"slice{i}", (src,), start=half, stop=half + c_src // 2))
            tensors.append((f"slice{i}", c_src // 2))
            src = f"slice{i}"
        out = draw(st.one_of(st.integers(1, 64), st.sampled_from([c for _, c in tensors])))
        k = draw(st.sampled_from([1, 3])) if spatial >= 3 else 1
        if slices and k == 3 and draw(st.integers(0, 3)) == 0:  # causal over the rows
            conv = Conv2d(
                f"w{i}", (src,), out_channels=out, kernel=(3, 1), padding=(2, 0), causal=True
            )
        else:
            conv = Conv2d(f"w{i}", (src,), out_channels=out, kernel=k, padding=k // 2)
        layers.append(conv)
        name = f"w{i}"
        if draw(st.booleans()):
            layers.append(Activation(f"relu{i}", (name,)))
            name = f"relu{i}"
        tensors.append((name, out))
    return Graph("random", Shape(c0, spatial, spatial), tuple(layers))


@st.composite
def problems(draw, chain=False, max_weighted=4):
    g = draw(graphs(chain=chain, max_weighted=max_weighted, max_joins=2, slices=True))
    left, right = draw(st.sampled_from(DEVICES)), draw(st.sampled_from(DEVICES))
    array = parse_array(
        f"{left}:1,{right}:1",
        bandwidth_bytes_per_s=draw(st.sampled_from([1e9, 1e10, 1e11, 1e12])),
        latency_s=draw(st.sampled_from([0.0, 1e-6, 1e-5])),
    )
    batch = draw(st.sampled_from([1, 8, 64, 512]))
    # the memory techniques change what a split costs (ZeRO-3's gathers, recomputation's forward,
    # micro-batches' latencies and weight reads): every solver must agree on them too
    return Problem(
        g,
        array,
        batch=batch,
        bytes_per_element=draw(st.sampled_from([2.0, 4.0])),
        zero_stage=draw(st.sampled_from([0, 0, 2, 3])),
        recompute=draw(st.booleans()),
        micro_batches=draw(st.sampled_from([1, 1, 4])) if batch > 1 else 1,
        overlap=draw(st.booleans()),
    )


#: Free shares on a coarse grid keep brute force (states ^ nodes) small.
OPTIONS = st.sampled_from(
    [
        PlanOptions(share_grid=2),
        PlanOptions(share_grid=3),
        planner_options("hypar"),
        planner_options("owt"),
        planner_options("data"),
        planner_options("data-half"),
        PlanOptions(Objective.TIME, ShareMode.HALF),
        PlanOptions(Objective.COMMUNICATION, ShareMode.PROPORTIONAL),
        planner_options("hypar", objective="time", shares="free", share_grid=2),
    ]
)


def same(a: float, b: float, rel: float) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)


@fast(50)
@given(problems(), OPTIONS)
def test_exact_equals_brute_force_on_random_dags(p, options):
    sp = SplitProblem.root(p)
    brute_value, brute_split = brute_force_split(sp, options)
    dp_value, _ = frontier_dp(sp, options)
    assert same(brute_value, dp_value, 1e-9)
    brute_price = price_of(evaluate(p, Plan({"": brute_split})), options)
    assert same(brute_price, brute_value, 1e-9)  # the split objective is the evaluator's price
    r = solve_exact(p, "scip", options)
    cert = r.certificate
    assert cert.status == "optimal"
    assert same(cert.objective, brute_price, 1e-9)
    assert cert.bound <= brute_price * (1 + 1e-9) + 1e-15


@fast(60)
@given(problems(chain=True, max_weighted=10), OPTIONS)
def test_exact_equals_dp_on_random_chains(p, options):
    assert p.planning.is_chain
    dp_value, dp_split = frontier_dp(SplitProblem.root(p), options)
    dp_price = price_of(evaluate(p, Plan({"": dp_split})), options)
    cert = solve_exact(p, "scip", options).certificate
    assert cert.status == "optimal" and same(cert.objective, dp_price, 1e-9)


@fast(2)
@given(problems(max_weighted=4), OPTIONS)
def test_all_backends_agree_on_random_dags(p, options):
    sp = SplitProblem.root(p)
    reference, _ = brute_force_split(sp, options)
    for name in available_backends():
        split, cert = solve_split_exact(sp, name, options)
        assert cert.status == "optimal", (name, cert.status, cert.notes)
        assert same(cert.objective, reference, TOL[name]), name
        assert cert.bound <= reference * (1 + TOL[name]) + 1e-15, name


def test_brute_force_top_down_matches_the_dp_planner():
    p = Problem(get_model("lenet"), parse_array("tpu-v2:2,tpu-v3:2"), batch=64)
    opts = PlanOptions(share_grid=2)
    plan, ev = brute_force(p, opts)
    from parplan.solvers.planners import make_plan

    assert same(
        ev.step_time_s, evaluate(p, make_plan(p, "accpar-topdown", options=opts)).step_time_s, 1e-9
    )
    assert set(plan.splits) == {"", "L", "R"}


def test_brute_force_refuses_large_graphs():
    sp = SplitProblem.root(Problem(get_model("vgg11"), parse_array("tpu-v2:1,tpu-v3:1"), batch=8))
    with pytest.raises(ConfigError, match="brute force would enumerate 8.59e\\+09 assignments"):
        brute_force_split(sp, PlanOptions(share_grid=2))


def test_generator_makes_joins():
    """Guard against a generator that silently stopped producing adds and concats."""
    seen = set()

    @fast(60)
    @given(graphs())
    def collect(g):
        seen.update(type(layer).__name__ for layer in g.layers)

    collect()
    assert {"Add", "Concat", "Conv2d", "Activation"} <= seen


def _split_problems(p, data):
    """The root's split problem and, below a random split, its left child's (regions cut, a
    floor per node from the sibling): the places the DP prunes states."""
    from dataclasses import replace

    from parplan.solvers.hierarchy import child_dims

    top = SplitProblem.root(p)
    sps = [top]
    if not p.array.is_leaf:
        choices = tuple(data.draw(st.sampled_from(n.choices)) for n in p.planning.nodes)
        shares = tuple(data.draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])) for _ in choices)
        split = Split(choices, shares)
        left, _ = child_dims(top.dims, split)
        regions, _ = top.child_regions(split)
        floors = tuple(data.draw(st.sampled_from([0.0, 1e-6, 1e-4])) for _ in choices)
        sps.append(
            SplitProblem(
                top.planning,
                left,
                top.side,
                "L",
                floors,
                None,
                regions,
                top.dims,
                False,
                top.child_cuts(split),
            )
        )
    sps.append(replace(top, floor_s=tuple(1e-5 * (v % 3) for v in range(len(top.dims)))))
    return sps


@fast(40)
@given(problems(), OPTIONS, st.data())
def test_states_dropped_as_equivalent_price_as_the_state_kept(p, options, data):
    """``StateTable.distinct`` drops a state only where an earlier state of the same node has,
    bit for bit, the same slice of every factor and the same per-state figures, at the root and
    below it (regions cut by a random split above): so the DP over the whole tables and over
    the distinct ones find the same optimum and the same states."""
    from parplan.costmodel.split import _tables, floorless_factor, split_tables

    sps = _split_problems(p, data)
    shares = share_points(sps[0].side, options.shares, options.share_grid)
    for sp in sps:
        full = _tables(sp, [options.choices(n) for n in sp.planning.nodes], [shares] * len(sp.dims))
        kept = split_tables(sp, options)
        factors = [floorless_factor(sp, full, u, options) for u in range(len(full))]
        for v, (whole, mine) in enumerate(zip(full, kept)):
            index = [
                next(s for s in range(whole.size) if whole.choices[s] == c and whole.lo[s] == a)
                for c, a in zip(mine.choices, mine.lo)
            ]
            assert index == sorted(index)  # kept in order: ties resolve as before

            def alike(s, t, whole=whole, v=v):
                """States s and t of node v: the same figures and factor slices, bit for bit."""
                for name in (
                    "compute",
                    "memory",
                    "intra",
                    "wintra",
                    "steps",
                    "activations",
                    "gathered",
                ):
                    a = getattr(whole, name)
                    if not np.array_equal(a[:, s], a[:, t]):
                        return False
                if whole.extra[s] != whole.extra[t]:
                    return False
                for scope, raw, _ in factors:
                    if v in scope:
                        ax = scope.index(v)
                        if not np.array_equal(np.take(raw, s, axis=ax), np.take(raw, t, axis=ax)):
                            return False
                return True

            for s in sorted(set(range(whole.size)) - set(index)):
                assert any(alike(s, t) for t in index if t < s), (v, whole.choices[s], whole.lo[s])
        a, b = min_states(sp, options, full), min_states(sp, options, kept)
        assert a[0] == b[0]
        assert [(full[v].choices[i], full[v].lo[i]) for v, i in enumerate(a[1])] == [
            (kept[v].choices[i], kept[v].lo[i]) for v, i in enumerate(b[1])
        ]


@fast(40)
@given(problems(), OPTIONS, st.data())
def test_own_values_bound_every_cell_of_the_factors(p, options, data):
    """The premise of the DP's pruning (docs/costmodel.md section 8, "States no optimum has"):
    a node's factor, floored and memory-priced, is at least its ``own_values`` at its state in
    every cell, on point and interval tables, at the root and below it. Bit for bit: nothing
    received can lower a node's value."""
    from dataclasses import replace

    from parplan.costmodel.cost import floored_time
    from parplan.costmodel.split import floorless_factor, own_values, split_tables

    if options.objective is Objective.TIME and data.draw(st.booleans()):
        options = replace(options, memory_price=data.draw(st.sampled_from([1e-6, 1e-3])))
    relaxed = options.shares is ShareMode.FREE and data.draw(st.booleans())
    for sp in _split_problems(p, data):
        tables = split_tables(sp, options, relaxed)
        own = own_values(sp, tables, options)
        for u, t in enumerate(tables):
            scope, raw, floor = floorless_factor(sp, tables, u, options)
            values = floored_time(raw, floor)
            assert own[u].shape == (t.size,)
            assert (values >= own[u].reshape((-1,) + (1,) * (len(scope) - 1))).all()


@fast(40)
@given(problems(), OPTIONS, st.data())
def test_dropping_states_keeps_the_dp_optimum_and_its_states(p, options, data):
    """The DP with the states no optimum has dropped (forced on every split here, however
    small) returns the same value, bit for bit, and the same state of every node as the DP over
    the whole tables: with floors, memory prices and interval tables."""
    from dataclasses import replace
    from unittest import mock

    from parplan.costmodel.split import split_tables
    from parplan.solvers import dp

    if options.objective is Objective.TIME and data.draw(st.booleans()):
        options = replace(options, memory_price=data.draw(st.sampled_from([1e-6, 1e-3])))
    relaxed = options.shares is ShareMode.FREE and data.draw(st.booleans())
    for sp in _split_problems(p, data):
        tables = split_tables(sp, options, relaxed)
        whole = min_states(sp, options, tables, prune=False)
        with mock.patch.object(dp, "PRUNE_MIN_CELLS", 0), mock.patch.object(dp, "PRUNE_KEEP", 1.0):
            kept = dp.live_states(sp, options, tables)
            pruned = min_states(sp, options, tables)
        assert pruned[0] == whole[0]
        assert pruned[1] == whole[1]
        if kept is not None:  # the optimum's states are among those kept
            assert all(k is None or s in k for s, k in zip(whole[1], kept))


def test_the_dp_drops_most_states_of_resnet50():
    """On ResNet-50's root split of ``h100:8`` (its forks' factors are 47^3 cells) the DP keeps
    about a third of the states and an eighth of the cells, and finds the whole tables'
    optimum."""
    from parplan.costmodel.split import factor_cells, split_tables
    from parplan.solvers.dp import live_states

    sp = SplitProblem.root(Problem(get_model("resnet50"), parse_array("h100:8"), batch=64))
    options = PlanOptions()
    tables = split_tables(sp, options)
    kept = live_states(sp, options, tables)
    assert kept is not None
    sizes = [t.size if k is None else len(k) for t, k in zip(tables, kept)]
    assert sum(sizes) < 0.4 * sum(t.size for t in tables)
    assert factor_cells(sp, sizes).sum() < 0.15 * factor_cells(sp, tables).sum()
    assert min_states(sp, options, tables) == min_states(sp, options, tables, prune=False)


@fast(40)
@given(problems(), OPTIONS, st.data())
def test_a_group_with_nothing_to_price_gets_the_dps_split(p, options, data):
    """``solve_split`` skips the DP where every factor is 0 at the nodes' first states (a group
    with no work: every node on the other side of the split above), and returns what the DP
    over the whole tables returns, there and everywhere else."""
    from parplan.costmodel.split import split_tables
    from parplan.solvers.dp import _first_states_free, solve_split
    from parplan.solvers.hierarchy import child_dims

    top = SplitProblem.root(p)
    nothing = Split(tuple(n.choices[0] for n in p.planning.nodes), (0.0,) * len(top.dims))
    left, _ = child_dims(top.dims, nothing)
    regions, _ = top.child_regions(nothing)
    floors = tuple(data.draw(st.sampled_from([0.0, 1e-5])) for _ in left)
    idle = SplitProblem(
        top.planning, left, top.side, "L", floors, None, regions, top.dims, False, None
    )
    for sp in _split_problems(p, data) + [idle]:
        tables = split_tables(sp, options)
        assert solve_split(sp, options) == frontier_dp(sp, options, tables=tables)[1]
    if options.memory_price == 0.0 and any(t.size > 1 for t in split_tables(idle, options)):
        assert _first_states_free(idle, options, split_tables(idle, options))


def test_alexnet_on_128_devices_skips_the_dp_at_idle_groups():
    """AlexNet / ``h100:128`` plans many splits at groups with no work; they are taken without
    a DP, and the plan is the one the DP at every split makes."""
    from unittest import mock

    from parplan.solvers import dp
    from parplan.solvers.planners import make_plan

    p = Problem(get_model("alexnet"), parse_array("h100:128"), batch=64)
    taken = []
    free = dp._first_states_free

    def spy(*args):
        taken.append(free(*args))
        return taken[-1]

    with mock.patch.object(dp, "_first_states_free", spy):
        fast_plan = make_plan(p, "accpar-topdown")
    with mock.patch.object(dp, "_first_states_free", lambda *args: False):
        slow_plan = make_plan(p, "accpar-topdown")
    assert sum(taken) >= 10 and not all(taken)
    assert fast_plan.splits == slow_plan.splits
