"""The joint model of the whole hierarchy (parplan/formulation/joint.py, parplan/solvers/joint.py).

- Every plan on the model's share points, written as a model solution, satisfies every row and
  has the evaluator's price as its objective (random DAGs, arrays of 2 to 8 devices, both
  objectives, collective all-reduce, memory rows): the model prices what the evaluator prices.
- Solved, the full model's optimum equals brute force over every whole-hierarchy plan on tiny
  instances; the symmetric model's equals brute force over symmetric plans and is never below
  the full model's.
- The symmetry lemma of docs/costmodel.md section 8: where the two interchangeable children's
  frames translate and their communication at the split is equal, copying one child's plan to
  the other slows no node.
"""

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from parplan.costmodel.cost import Objective, ShareMode
from parplan.costmodel.evaluate import evaluate, price_of
from parplan.costmodel.hardware import parse_array, signature
from parplan.costmodel.layout import JOIN_LAYOUTS, TYPE_ORDER
from parplan.costmodel.problem import Plan, Problem, Split
from parplan.costmodel.regions import translates
from parplan.costmodel.split import PlanOptions
from parplan.errors import ConfigError, TableTooLarge
from parplan.formulation.joint import build_joint, groups_by_path, state_classes
from parplan.models.zoo import get_model
from parplan.solvers.brute import brute_force_global
from parplan.solvers.joint import device_capacity, node_times, solve_joint, symmetrize
from parplan.solvers.planners import make_plan
from test_bound import _array
from test_brute import fast, graphs

ARRAYS = (
    "h100:2",
    "tpu-v2:1,tpu-v3:1",
    "h100:4",
    "tpu-v2:2,tpu-v3:2",
    "a100:1,h100:3",
    "v100:3",
    "tpu-v3:2,h100:2@ring:ring",
    "asymmetric",
)
OPTIONS = (
    PlanOptions(share_grid=2),
    PlanOptions(shares=ShareMode.HALF),
    PlanOptions(objective=Objective.COMMUNICATION, shares=ShareMode.HALF),
    PlanOptions(shares=ShareMode.PROPORTIONAL),
)


def random_plan(draw, p: Problem, options: PlanOptions, classes=None) -> Plan:
    """A plan on the joint model's share points (the same states in groups of one class)."""
    model, dec = build_joint(p, options, symmetric=classes is not None)
    per_class = {}
    splits = {}
    for path, group in groups_by_path(p.array).items():
        if group.is_leaf:
            continue
        k = dec.classes[path]
        if k not in per_class or classes is None:
            per_class[k] = [draw(st.sampled_from(states)) for states in dec.states[k]]
        chosen = per_class[k]
        splits[path] = Split(tuple(c for c, _ in chosen), tuple(a for _, a in chosen))
    return Plan(splits, planner="random")


@st.composite
def priced_plans(draw):
    g = draw(graphs(max_weighted=3, max_joins=2))
    array = _array(
        draw(st.sampled_from(ARRAYS)),
        draw(st.sampled_from([1e9, 1e11])),
        draw(st.sampled_from([0.0, 1e-6])),
    )
    p = Problem(g, array, batch=draw(st.sampled_from([1, 8, 512])), bytes_per_element=2.0)
    # free shares (9 states a node) only on one split: the cells grow as states ^ (scope x depth)
    options = draw(st.sampled_from(OPTIONS if p.array.depth == 1 else OPTIONS[1:]))
    symmetric = draw(st.booleans())
    return p, options, symmetric, random_plan(draw, p, options, True if symmetric else None)


@fast(25)
@given(priced_plans())
def test_the_model_prices_every_plan_as_the_evaluator(case):
    """Written as a solution, a plan satisfies every row (node times from the evaluator, cells the
    product of the states, memory rows at the evaluator's bytes) and costs its evaluated price."""
    p, options, symmetric, plan = case
    capacity = device_capacity(p, 1e15)
    model, dec = build_joint(p, options, symmetric, capacity)
    ev = evaluate(p, plan)
    x = dec.start(plan, node_times(p, ev))
    assert x is not None
    viol = model.violations(x)
    assert max(viol.values()) <= 1e-9 * max(1.0, model.objective_value(x))
    assert model.objective_value(x) / model.objective_scale == pytest.approx(
        price_of(ev, options), rel=1e-9, abs=1e-18
    )
    for c in model.constraints:
        if c.family == "memory":
            used = sum(a * x[i] for i, a in c.coeffs) * 1e15
            assert used == pytest.approx(
                ev.device_memory_bytes[c.name.removeprefix("memory_")], rel=1e-9
            )


def brute_force_plans(p: Problem, options: PlanOptions, symmetric: bool) -> tuple[float, int]:
    """(best price, number of plans) over every plan on the model's share points (in which
    groups of one class take the same states, if ``symmetric``); states enumerated here, apart
    from :func:`brute_force_global`'s enumeration."""
    _, dec = build_joint(p, options, symmetric=symmetric)
    keys = list(dec.states)
    best, count = math.inf, 0
    for combo in itertools.product(*(itertools.product(*dec.states[k]) for k in keys)):
        chosen = dict(zip(keys, combo))
        plan = Plan(
            {
                path: Split(tuple(c for c, _ in chosen[k]), tuple(a for _, a in chosen[k]))
                for path, k in dec.classes.items()
                if k in chosen
            },
            planner="brute",
        )
        best, count = min(best, price_of(evaluate(p, plan), options)), count + 1
    return best, count


def plan_count(p: Problem, options: PlanOptions, symmetric: bool) -> int:
    """How many plans brute force would enumerate; an instance whose joint model is over the
    cell limit is outside these tests (hypothesis draws another)."""
    try:
        _, dec = build_joint(p, options, symmetric=symmetric)
    except TableTooLarge:
        assume(False)
    return math.prod(len(s) for k in dec.states for s in dec.states[k])


@st.composite
def tiny(draw):
    """2-3 planning nodes on 3-4 devices (two or three splits)."""
    g = draw(graphs(max_weighted=2, max_joins=1))
    array = draw(
        st.sampled_from(["h100:1,a100:2", "tpu-v3:2,tpu-v2:1", "v100:3", "h100:4", "h100:2,a100:2"])
    )
    p = Problem(
        g,
        parse_array(
            array, bandwidth_bytes_per_s=draw(st.sampled_from([1e9, 1e11])), latency_s=1e-6
        ),
        batch=draw(st.sampled_from([8, 512])),
    )
    options = draw(
        st.sampled_from(
            [
                PlanOptions(share_grid=2),
                PlanOptions(shares=ShareMode.HALF),
                PlanOptions(objective=Objective.COMMUNICATION, shares=ShareMode.HALF),
            ]
        )
    )
    return p, options


@fast(5)
@given(tiny())
def test_joint_equals_brute_force_over_whole_hierarchy_plans(case):
    """The full model's proven optimum is brute force's over every plan of every split; the
    symmetric model's is brute force's over symmetric plans, never below the full one."""
    p, options = case
    assume(plan_count(p, options, symmetric=False) <= 3000)
    _, best = brute_force_global(p, options)
    full = solve_joint(p, "scip", options, symmetric=False)
    assert full.certificate.status == "optimal"
    assert full.certificate.objective == pytest.approx(price_of(best, options), rel=1e-7, abs=1e-15)
    sym = solve_joint(p, "scip", options, symmetric=True, start=None)
    assert sym.certificate.status == "optimal"
    if plan_count(p, options, symmetric=True) < plan_count(p, options, symmetric=False):
        assert sym.certificate.objective == pytest.approx(
            brute_force_plans(p, options, True)[0], rel=1e-7, abs=1e-15
        )
        assert sym.certificate.objective >= full.certificate.objective * (1 - 1e-9)
    else:  # no interchangeable siblings: the same model
        assert sym.certificate.objective == pytest.approx(
            full.certificate.objective, rel=1e-9, abs=1e-18
        )


@st.composite
def interchangeable(draw):
    """Two interchangeable halves, a root split at share 1/2 and random plans below."""
    g = draw(graphs(max_weighted=3, max_joins=1))
    array = parse_array(
        draw(st.sampled_from(["h100:4", "v100:8", "tpu-v2:4"])),
        bandwidth_bytes_per_s=draw(st.sampled_from([1e9, 1e11])),
        latency_s=1e-6,
    )
    p = Problem(g, array, batch=draw(st.sampled_from([8, 512])), bytes_per_element=2.0)
    rows = st.sampled_from(TYPE_ORDER[:1])  # BATCH / ROWS at the root makes the halves translate
    splits = {}
    for path, _ in p.array.inner_nodes():
        if path == "":
            choices = tuple(
                draw(st.sampled_from([JOIN_LAYOUTS[0]]) if n.is_join else rows)
                for n in p.planning.nodes
            )
            shares = (0.5,) * len(choices)
        else:
            choices = tuple(
                draw(st.sampled_from(JOIN_LAYOUTS if n.is_join else TYPE_ORDER))
                for n in p.planning.nodes
            )
            shares = tuple(draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])) for _ in p.planning.nodes)
        splits[path] = Split(choices, shares)
    return p, Plan(splits, planner="random")


@pytest.mark.parametrize(
    "widths, array, batch",
    [
        ((1024, 4096, 512), "h100:4", 64),
        ((256, 2048, 2048, 64), "h100:1,a100:2", 512),
        ((4096, 4096), "h100:2", 8),
    ],
)
def test_joint_with_overlap_equals_brute_force_and_prices_every_plan(widths, array, batch):
    """Section 4.2 in the joint MIP: each side's time is two rows (t >= below + rest, t >= all
    its traffic); its optimum is brute force's over every plan, priced by the evaluator, and
    the evaluator's times of any plan satisfy every row."""
    from test_costmodel import _chain

    p = Problem(
        _chain(widths),
        parse_array(array, bandwidth_bytes_per_s=10e9, latency_s=1e-6),
        batch=batch,
        overlap=True,
    )
    options = PlanOptions(shares=ShareMode.HALF)
    _, best = brute_force_global(p, options)
    full = solve_joint(p, "scip", options, symmetric=False)
    assert full.certificate.status == "optimal"
    assert full.certificate.objective == pytest.approx(best.step_time_s, rel=1e-7)
    model_, dec = build_joint(p, options, symmetric=False)
    plan = make_plan(p, "data-half")
    ev = evaluate(p, plan)
    x = dec.start(plan, node_times(p, ev))
    assert max(model_.violations(x).values()) <= 1e-9 * max(1.0, model_.objective_value(x))
    assert model_.objective_value(x) / model_.objective_scale == pytest.approx(
        ev.step_time_s, rel=1e-9
    )
    assert any(c.name.endswith("_overlap") for c in model_.constraints)
    no = replace(p, overlap=False)
    assert (
        evaluate(no, plan).step_time_s > ev.step_time_s
    )  # the gradient exchange hides behind compute


@fast(40)
@given(interchangeable())
def test_copying_a_translated_half_slows_no_node(case):
    """docs/costmodel.md section 8, the symmetry lemma, at the root: where the halves' frames
    translate and every node's communication at the root is the same on both sides, the plan
    with the left half's splits copied to the right half is no slower for any node."""
    from parplan.costmodel.split import SplitProblem

    p, plan = case
    assert signature(p.array.left) == signature(p.array.right)
    sp = SplitProblem.root(p)
    left, right = sp.child_regions(plan.splits[""])
    ev = evaluate(p, plan)
    root = ev.breakdown[ev.breakdown.level == ""]
    assume(translates(p.planning.succs, left, right))
    assume(
        all(
            math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
            for a, b in zip(root.comm_s_1, root.comm_s_2)
        )
    )
    copied = Plan(
        {
            path: plan.splits["L" + path[1:]] if path.startswith("R") else s
            for path, s in plan.splits.items()
        },
        planner="copied",
    )
    before = ev.node_time_s
    after = evaluate(p, copied).node_time_s
    assert all(a <= b * (1 + 1e-12) for a, b in zip(after, before))


@pytest.mark.slow  # about 5-10 s; the default run keeps the cheaper cross-checks
def test_warm_start_and_memory():
    p = Problem(get_model("alexnet"), parse_array("h100:8"), batch=256)
    half = PlanOptions(shares=ShareMode.HALF)
    r = solve_joint(p, "scip", half)
    dp = evaluate(
        p, symmetrize(make_plan(p, "accpar", options=half), state_classes(p.array, True))
    ).step_time_s
    assert r.certificate.status == "optimal" and r.certificate.objective <= dp * (1 + 1e-12)
    assert any("warm start" in n for n in r.certificate.notes)
    assert r.certificate.bound <= r.certificate.objective * (1 + 1e-9)
    # a memory limit just below the fastest plan's need: a slower plan that fits every device;
    # 20% below it no plan fits, and the solver proves it
    need = max(r.evaluation.device_memory_bytes.values())
    tight = solve_joint(p, "scip", half, memory_limit_bytes=0.99 * need)
    assert tight.certificate.status == "optimal"
    assert max(tight.evaluation.device_memory_bytes.values()) <= 0.99 * need * (1 + 1e-9)
    assert tight.certificate.objective > r.certificate.objective * (1 + 1e-3)
    none = solve_joint(p, "highs", half, memory_limit_bytes=0.8 * need)
    assert none.certificate.status == "infeasible" and none.plan is None


def test_joint_refuses_what_it_cannot_solve():
    half = PlanOptions(shares=ShareMode.HALF)
    with pytest.raises(ConfigError, match="integers only"):
        solve_joint(Problem(get_model("alexnet"), parse_array("h100:8"), batch=256), "cpsat", half)
    with pytest.raises(ConfigError, match="cell variables"):
        solve_joint(
            Problem(get_model("vgg16"), parse_array("h100:64"), batch=256), "scip", PlanOptions()
        )
    with pytest.raises(ConfigError, match="compat"):
        solve_joint(
            Problem(get_model("alexnet"), parse_array("h100:4"), batch=256, compat="hypar"),
            "scip",
            half,
        )
    with pytest.raises(ConfigError, match="one device"):
        solve_joint(Problem(get_model("alexnet"), parse_array("h100:1"), batch=256), "scip", half)


def test_cli_joint(capsys):
    from parplan.cli import main

    args = ["--model", "lenet", "--array", "h100:4", "--batch", "64", "--shares", "half"]
    assert main(["solve", *args, "--joint"]) == 0
    out = capsys.readouterr().out
    assert "scope: joint-symmetric" in out and "status          optimal" in out
    assert main(["certify", *args, "--joint", "--no-symmetry", "--backend", "highs"]) == 0
    out = capsys.readouterr().out
    assert "status      optimal" in out and "global gap" in out and "CONTRADICTION" not in out
    assert main(["solve", *args, "--no-symmetry"]) == 2
    assert "add --joint" in capsys.readouterr().err
    assert main(["solve", *args, "--joint", "--write-lp", "x.lp"]) == 2
    assert main(["solve", *args, "--joint", "--backend", "cpsat"]) == 2
    assert "integers only" in capsys.readouterr().err


def test_frame_counts_equal_the_frames_of_every_state_combination():
    """``frame_counts`` (breadth first, one frame kept per translation key) against every state
    combination above the group, enumerated whole; and a reduction once frames repeat."""
    from parplan.formulation.joint import _Builder, _frames_at, _translation_key, frame_counts

    p = Problem(get_model("lenet"), parse_array("h100:8"), batch=64)
    opts = PlanOptions(shares=ShareMode.HALF)
    b = _Builder(p, opts, True, None)
    b.declare_states()
    u = [n.name for n in p.planning.nodes].index("conv2")
    scope = (u,) + tuple(sorted(set(p.planning.succs[u])))
    for path in ("LL", "LR", "RR"):
        counts = frame_counts(p, opts, path, u)
        assert len(counts) == len(path) + 1
        for depth, (built, framed) in enumerate(counts):
            sub = path[:depth]
            per = math.prod(len(b.states[b.classes[sub]][w]) for w in scope)
            keys = {
                _translation_key(u, scope, frames)
                for _, frames in _frames_at(sub, scope, b.root, b.path_states(sub), b.collective)
            }
            assert (built, framed) == (per ** (depth + 1), len(keys) * per)
    assert frame_counts(p, opts, "LL", u)[2][1] < frame_counts(p, opts, "LL", u)[2][0]


def test_the_joint_time_limit_covers_building_the_model():
    """Issue 34: as for a split's MIP, building the joint model counts against the limit; a
    limit the build uses up ends as a time limit without starting the solver, and says so."""
    p = Problem(get_model("lenet"), parse_array("h100:4"), batch=64)
    out = solve_joint(p, "highs", PlanOptions(share_grid=2), time_limit_s=1e-9, start=None)
    assert out.certificate.status == "time_limit" and out.plan is None
    assert "building the joint model (" in out.certificate.message
    assert "the solver did not start" in out.certificate.message
