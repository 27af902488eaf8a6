"""Exact solving with certificates: DP == exact on the zoo, memory limits, hierarchy, joint model, CLI."""

import math
from dataclasses import replace

import pytest

from parplan.cli import main
from parplan.costmodel.cost import Objective
from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.hardware import parse_array
from parplan.costmodel.problem import Plan, Problem
from parplan.errors import ConfigError, InfeasibleError
from parplan.formulation.mip import GIB, MemoryLimit, build_mip, memory_need_model
from parplan.solvers.backends import SolveOptions, get_backend
from parplan.solvers.dp import PlanOptions, SplitProblem, frontier_dp
import parplan.solvers.exact as exact_module
from parplan.solvers.exact import price_of, require_plan, solve_exact, solve_split_exact
from parplan.solvers.planners import make_plan, planner_options
from parplan.models.zoo import MODELS, get_model

PAIR = "tpu-v2:1,tpu-v3:1"
CHAINS = [
    m for m in MODELS if Problem(get_model(m), parse_array(PAIR), batch=512).planning.is_chain
]
DAGS = [m for m in MODELS if m not in CHAINS]
#: A coarse share grid keeps the exact models of whole zoo networks small in the default run.
COARSE = PlanOptions(share_grid=4)


def problem(name, array=PAIR, batch=512):
    return Problem(get_model(name), parse_array(array), batch=batch)


def dp_price(p, planner="accpar", share_grid=None):
    plan = make_plan(p, planner, share_grid=share_grid)
    return price_of(evaluate(p, plan), planner_options(planner))


@pytest.mark.parametrize("name", ["lenet", "alexnet", "vgg11", "sfc", "cifar-c"])
def test_exact_equals_dp_on_zoo_chains(name, monkeypatch):
    monkeypatch.setattr(exact_module, "CONTINUOUS_TIME_S", 5.0)  # the product's (see conftest)
    p = problem(name, batch=8 if name == "gpt2" else 512)
    r = solve_exact(p, "cbc", COARSE)
    cert = r.certificate
    assert cert.status == "optimal" and cert.scope == "split"
    dp = dp_price(p, share_grid=4)
    assert abs(cert.objective - dp) <= 1e-9 * dp
    assert cert.objective == r.evaluation.step_time_s  # the certificate prices with the evaluator
    assert math.isclose(cert.model_objective, cert.objective, rel_tol=1e-9)
    assert cert.bound <= cert.objective * (1 + 1e-9) and cert.gap <= 1e-6
    # the search over share intervals brackets the continuous optimum below the grid's
    assert cert.continuous_bound <= cert.continuous_value <= cert.objective
    assert any("with continuous shares" in n for n in cert.notes)


@pytest.mark.parametrize("name", ["resnet18", pytest.param("resnet50", marks=pytest.mark.slow)])
def test_resnets_exact_equals_dp(name):
    p = problem(name)
    opts = PlanOptions(share_grid=2)
    cert = solve_exact(p, "cbc", opts).certificate
    dp = dp_price(p, share_grid=2)
    assert cert.status == "optimal"
    assert cert.bound <= dp * (1 + 1e-9)
    assert (
        abs(dp - cert.objective) <= 1e-9 * dp
    )  # the DP is exact on DAGs too: equal, not just bounded


@pytest.mark.parametrize("planner", ["hypar", "owt", "data", "data-half", "model"])
def test_restricted_types_fixed_shares_and_communication_objective(planner):
    p = problem("resnet18", batch=128)
    opts = planner_options(planner)
    cert = solve_exact(p, "scip", opts).certificate
    assert cert.status == "optimal"
    assert cert.unit == ("elements" if opts.objective is Objective.COMMUNICATION else "s")
    assert math.isclose(cert.objective, dp_price(p, planner), rel_tol=1e-9)


def test_memory_limit_changes_the_plan_and_it_fits():
    p = problem("vgg16")
    free = solve_exact(p, "highs", COARSE)
    limit = 0.9 * free.evaluation.peak_memory_bytes  # the unconstrained optimum does not fit
    r = solve_exact(p, "highs", COARSE, memory_limit_bytes=limit)
    assert r.plan is not None and r.evaluation.peak_memory_bytes <= limit * (1 + 1e-9)
    assert (
        r.plan.root.choices != free.plan.root.choices or r.plan.root.shares != free.plan.root.shares
    )
    cert = r.certificate
    assert cert.status == "optimal"
    assert cert.bound <= cert.objective * (1 + 1e-9)
    assert cert.objective >= free.certificate.objective
    assert "memory 2" in cert.model_size


def test_memory_too_small_says_which_family_and_how_much():
    p = problem("alexnet")
    small = 0.2 * GIB
    r = solve_exact(p, "highs", COARSE, memory_limit_bytes=small)
    cert = r.certificate
    assert r.plan is None and cert.status == "infeasible" and cert.failed_family == "memory"
    assert (
        "memory: the split of the 2-device group (45 | 123 TFLOP/s) needs at least" in cert.message
    )
    assert "GiB" in cert.message
    with pytest.raises(InfeasibleError, match="needs at least"):
        require_plan(r)
    # the stated need is enough: a limit just above it is feasible
    factor = float(cert.message.split("needs at least ")[1].split("x")[0])
    assert (
        solve_exact(p, "highs", COARSE, memory_limit_bytes=small * factor * 1.0002).plan is not None
    )


def test_memory_limit_with_cpsat_fits_and_is_bounded():
    p = problem("alexnet")
    free = solve_exact(p, "highs", COARSE).evaluation.peak_memory_bytes
    r = solve_exact(p, "cpsat", COARSE, memory_limit_bytes=0.9 * free, time_limit_s=20)
    cert = r.certificate
    assert cert.status in ("optimal", "time_limit")
    assert r.evaluation.peak_memory_bytes <= 0.9 * free * (1 + 1e-9)
    assert cert.bound is not None and cert.bound <= cert.objective * (1 + 1e-6)


def test_memory_need_model_recovers_the_capacity_factor():
    sp = SplitProblem.root(problem("vgg16"))
    model, _ = build_mip(sp, COARSE, memory=MemoryLimit((2 * GIB, 2 * GIB)))
    r = get_backend("scip").solve(
        memory_need_model(model.without("edge_link")), SolveOptions(time_limit_s=60)
    )
    assert r.termination.value == "optimal" and r.objective > 1.0
    with pytest.raises(ConfigError, match="unknown constraint families"):
        model.without("memroy")


def test_hierarchy_level_by_level_certificate():
    p = problem("alexnet", "tpu-v2:2,tpu-v3:2")
    r = solve_exact(p, "scip", COARSE)
    cert = r.certificate
    assert set(cert.splits) == {"", "L", "R"} and all(
        c.status == "optimal" for c in cert.splits.values()
    )
    assert cert.scope == "level-by-level"
    dp = dp_price(p)
    assert cert.bound <= min(
        dp, cert.objective
    )  # the root bound holds for every plan of the hierarchy
    assert cert.status == "feasible" and cert.gap > 1e-6
    assert any("level-by-level" in n for n in cert.notes)


def test_device_memory_limit_checks_every_device():
    p = Problem(get_model("vgg16"), parse_array("tpu-v2:2,tpu-v3:2"), batch=2048)
    r = solve_exact(p, "highs", COARSE, memory_limit_bytes="device")
    if r.plan is not None:
        devices = {path: d for path, d in _leaves(p.array)}
        for path, used in r.evaluation.device_memory_bytes.items():
            assert used <= devices[path].memory_bytes * (1 + 1e-9)
    else:
        assert r.certificate.failed_family == "memory"


def _leaves(group, path=""):
    if group.is_leaf:
        yield path, group.device
    else:
        yield from _leaves(group.left, path + "L")
        yield from _leaves(group.right, path + "R")


def test_joint_solve_through_solve_exact():
    """``joint=True`` solves every split at once; here no two sibling groups with splits are
    interchangeable, so the symmetric model is the full one and never above level by level."""
    from parplan.costmodel.cost import ShareMode

    p = problem("lenet", "tpu-v2:1,tpu-v3:2")
    half = PlanOptions(shares=ShareMode.HALF)
    joint = solve_exact(p, "scip", half, joint=True).certificate
    level = solve_exact(p, "scip", half).certificate
    assert joint.scope == "joint-symmetric" and joint.status == "optimal"
    assert joint.objective <= level.objective * (1 + 1e-9)


@pytest.mark.slow  # it waits for a solver's time limit
def test_time_limit_on_a_hard_planning_instance_is_not_optimal():
    p = problem("resnet18")
    r = solve_exact(p, "scip", PlanOptions(share_grid=8), time_limit_s=1.0)
    cert = r.certificate
    assert cert.status in ("time_limit", "error") and not cert.is_optimal
    assert cert.bound is None or cert.objective is None or cert.bound <= cert.objective


def test_cli_certify_and_solve(capsys, tmp_path):
    assert (
        main(
            [
                "certify",
                "--model",
                "alexnet",
                "--array",
                PAIR,
                "--backend",
                "cbc",
                "--share-grid",
                "4",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "status      optimal" in out and "DP - exact  0.000e+00" in out
    lp = tmp_path / "m.lp"
    assert (
        main(
            [
                "solve",
                "--model",
                "lenet",
                "--array",
                PAIR,
                "--write-lp",
                str(lp),
                "--share-grid",
                "4",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "certificate" in out and "status          optimal" in out and lp.exists()
    assert (
        main(
            [
                "solve",
                "--model",
                "vgg16",
                "--array",
                PAIR,
                "--memory-limit",
                "3",
                "--share-grid",
                "4",
            ]
        )
        == 1
    )
    assert "needs at least" in capsys.readouterr().out
    assert main(["solve", "--model", "lenet", "--array", PAIR, "--backend", "gurobi"]) == 2
    assert "unknown backend 'gurobi'" in capsys.readouterr().err
    assert main(["solve", "--model", "lenet", "--array", PAIR, "--memory-limit", "lots"]) == 2
    assert "--memory-limit must be a number of GiB" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("backend", ["scip", "cbc"])
def test_certify_every_zoo_model(name, backend):
    """Every zoo model's split is certified optimal where its exact model is built; above
    MAX_MODEL_CELLS (the large transformers) the certificate says so, and the plan is the
    exact DP's, certified feasible only."""
    p = problem(name, batch=8 if name.startswith(("gpt", "bert")) else 512)
    cert = solve_exact(p, backend, COARSE, time_limit_s=600).certificate
    (split,) = cert.splits.values()
    if "cell columns" in split.message:
        assert (
            cert.status == "feasible" and "the exact DP on the share grid of 1/4" in split.message
        )
    else:
        assert cert.status == "optimal"
    assert abs(dp_price(p, share_grid=4) - cert.objective) <= 1e-9 * cert.objective


def test_states_that_price_alike_are_merged_and_the_model_stays_exact():
    """merge_alike: along each axis, states with equal slices become one (with the states they
    merge), the merged table holds every distinct slice once; the MIP built on merged factors
    has fewer cell columns and the same optimum as the DP (ResNet-2block's forks: a consumer
    split by output columns needs the whole tensor at every share)."""
    import numpy as np

    import parplan.formulation.mip as mip

    costs = np.array([[1.0, 2.0, 1.0], [3.0, 4.0, 3.0], [1.0, 2.0, 1.0]])
    merged, classes = mip.merge_alike(costs)
    assert merged.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert classes == [[(0, 2), (1,)], [(0, 2), (1,)]]
    for (i, j), c in np.ndenumerate(costs):  # every cell keeps its cost
        a = next(m for m, states in enumerate(classes[0]) if i in states)
        b = next(m for m, states in enumerate(classes[1]) if j in states)
        assert merged[a, b] == c
    sp = SplitProblem.root(problem("resnet-2block", batch=64))
    options = PlanOptions(share_grid=4)
    tables = mip.split_tables(sp, options)
    assert mip.model_cells(sp, tables, options) < 0.8 * mip.model_cells(sp, tables)
    split, cert = solve_split_exact(sp, "highs", options)
    assert cert.status == "optimal"
    assert cert.objective == pytest.approx(frontier_dp(sp, options)[0], rel=1e-6)


def test_a_solver_stopped_without_a_positive_bound_is_reported_not_a_crash(monkeypatch):
    """A time-limited solver can return a plan with a best bound of 0 (the scaling benchmark hit
    it on a long chain): the certificate says so instead of dividing by the bound."""
    monkeypatch.setattr(exact_module, "CONTINUOUS_TIME_S", 5.0)  # the product's (see conftest)
    real = exact_module.get_backend

    class Stopped:
        def __init__(self, inner):
            self.inner = inner

        def solve(self, model, options):
            raw = self.inner.solve(model, options)
            return replace(raw, bound=0.0)

    monkeypatch.setattr(exact_module, "get_backend", lambda name: Stopped(real(name)))
    split, cert = solve_split_exact(
        SplitProblem.root(problem("lenet")), "highs", PlanOptions(share_grid=4)
    )
    assert split is not None and not cert.is_optimal
    assert any("with continuous shares" in n for n in cert.notes)


def test_the_time_limit_covers_building_the_model():
    """Issue 34: building a split's MIP counts against its time limit. A limit the build alone
    uses up ends as a time limit without starting the solver (and says so); otherwise the solver
    gets what is left, and the certificate's time includes the build."""
    sp = SplitProblem.root(Problem(get_model("lenet"), parse_array("h100:2"), batch=64))
    split, cert = solve_split_exact(sp, "highs", solve_options=SolveOptions(time_limit_s=1e-9))
    assert split is None and cert.status == "time_limit" and cert.wall_s > 0
    assert (
        cert.message.startswith("building the model (")
        and "the solver did not start" in cert.message
    )
    split, cert = solve_split_exact(sp, "highs", solve_options=SolveOptions(time_limit_s=60))
    assert split is not None and cert.status == "optimal"


def test_a_model_too_large_to_build_is_refused_before_it_is_built(monkeypatch):
    """A split whose exact model would have more cell columns than the limit is planned by
    the DP and certified as feasible only, with the size in the message; with a memory limit
    its plan fails it, and the message points to the memory search (issue 30: `solve
    --memory-limit` on an 8 B model ran out of memory building the model)."""
    import parplan.formulation.mip as mip
    from parplan.solvers.exact import _dp_split, _live_tables

    p = Problem(get_model("lenet"), parse_array("tpu-v2:1,tpu-v3:1"), batch=64)
    sp = SplitProblem.root(p)
    tables = mip.split_tables(sp, PlanOptions())
    cells = mip.model_cells(sp, tables, PlanOptions())  # its states that price alike merged
    assert 1000 < cells < mip.model_cells(sp, tables)
    # without a memory limit only the states an optimum may have are modelled
    live_tables = _live_tables(sp, PlanOptions(), None, _dp_split(sp, PlanOptions()))[0]
    live = mip.model_cells(sp, live_tables, PlanOptions())
    assert 10 < live < cells / 2
    monkeypatch.setattr(mip, "MAX_MODEL_CELLS", live - 1)
    split, cert = solve_split_exact(sp, "highs", PlanOptions())
    assert split is not None and cert.status.value == "feasible" and cert.bound is None
    limit = f"limit {live - 1:.3g}"
    assert f"{live:.3g} cell columns (its states that price alike merged; {limit})" in cert.message
    # without a memory limit the plan is the exact DP's on the requested grid
    assert split == frontier_dp(sp, PlanOptions())[1]
    assert "the exact DP on the share grid of 1/16" in cert.message
    need = max(evaluate(p, Plan({"": split})).device_memory_bytes.values())
    _, cert = solve_split_exact(
        sp, "highs", PlanOptions(), memory=MemoryLimit((need / 2, need / 2))
    )
    assert cert.status.value == "error" and "parplan plan --memory-limit" in cert.message
    assert f"{cells:.3g} cell columns" in cert.message  # the DP's plan does not fit: all states
    # a limit the DP's plan (planned without memory) fits: that plan, not the local search's
    fits, cert = solve_split_exact(
        sp, "highs", PlanOptions(), memory=MemoryLimit((2 * need, 2 * need))
    )
    assert fits == split and "the exact DP on the share grid of 1/16" in cert.message
    assert f"{live:.3g} cell columns" in cert.message
    # the whole problem's certificate says how its split was planned (`certify` prints it)
    whole = solve_exact(p, "highs", PlanOptions()).certificate
    assert whole.status == "feasible" and whole.message == cert.message
