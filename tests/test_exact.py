"""Exact solving with certificates: DP == exact on the zoo, memory limits, hierarchy, joint model, CLI."""

import math
import time
from dataclasses import replace

import pytest

from parplan.cli import main
from parplan.costmodel.cost import Objective, node_comm, share_candidates, side_times
from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.hardware import parse_array
from parplan.costmodel.layout import PartitionType
from parplan.costmodel.problem import Problem
from parplan.errors import ConfigError, InfeasibleError
from parplan.formulation.joint import build_joint
from parplan.formulation.mip import GIB, Constraint, MemoryLimit, build_mip, memory_need_model
from parplan.solvers.backends import SolveOptions, get_backend
from parplan.solvers.dp import PlanOptions, SplitProblem, frontier_dp
from parplan.solvers.exact import price_of, require_plan, solve_exact
from parplan.solvers.planners import make_plan, planner_options
from parplan.zoo import MODELS, get_model

PAIR = "tpu-v2:1,tpu-v3:1"
CHAINS = [m for m in MODELS if Problem(get_model(m), parse_array(PAIR), batch=512).planning.is_chain]
DAGS = [m for m in MODELS if m not in CHAINS]


def problem(name, array=PAIR, batch=512):
    return Problem(get_model(name), parse_array(array), batch=batch)


def dp_price(p, planner="accpar"):
    plan = make_plan(p, planner)
    return price_of(evaluate(p, plan), planner_options(planner))


@pytest.mark.parametrize("name", CHAINS)
def test_exact_equals_dp_on_zoo_chains(name):
    p = problem(name)
    r = solve_exact(p, "scip")
    cert = r.certificate
    assert cert.status == "optimal" and cert.scope == "split"
    dp = dp_price(p)
    assert abs(cert.objective - dp) <= 1e-9 * dp
    assert cert.objective == r.evaluation.step_time_s  # the certificate prices with the evaluator
    assert math.isclose(cert.model_objective, cert.objective, rel_tol=1e-9)
    assert cert.bound <= cert.objective * (1 + 1e-9) and cert.gap <= 1e-6


@pytest.mark.parametrize("name", DAGS)
def test_resnets_dp_never_beats_exact_and_gap_is_reported(name):
    p = problem(name)
    start = time.perf_counter()
    cert = solve_exact(p, "scip").certificate
    assert time.perf_counter() - start < 10.0
    dp = dp_price(p)
    assert cert.status == "optimal"
    assert dp >= cert.objective * (1 - 1e-9)
    assert cert.bound <= dp * (1 + 1e-9)
    assert cert.gap is not None and cert.gap <= 1e-6
    # the frontier DP is exact on DAGs too: equal, not just bounded
    assert abs(dp - cert.objective) <= 1e-9 * dp


@pytest.mark.parametrize("planner", ["hypar", "owt", "data", "data-half", "model"])
def test_restricted_types_fixed_shares_and_communication_objective(planner):
    p = problem("resnet18", batch=128)
    opts = planner_options(planner)
    cert = solve_exact(p, "scip", opts).certificate
    assert cert.status == "optimal"
    assert cert.unit == ("elements" if opts.objective is Objective.COMMUNICATION else "s")
    assert math.isclose(cert.objective, dp_price(p, planner), rel_tol=1e-9)


@pytest.mark.parametrize("name", ["alexnet", "resnet18"])
def test_epigraph_form_agrees_with_folded_form(name):
    sp = SplitProblem.root(problem(name))
    folded, _ = build_mip(sp, PlanOptions())
    epi, dec = build_mip(sp, PlanOptions(), max_form="epigraph")
    assert "epigraph" in epi.families() and "segment" in epi.families()
    r = get_backend("scip").solve(epi, SolveOptions())
    value, _ = frontier_dp(sp, PlanOptions())
    assert math.isclose(r.objective / epi.objective_scale, value, rel_tol=1e-9)
    split = dec(r)
    assert split.choices == dec(r).choices


def test_an_epigraph_over_mixed_candidates_would_underestimate():
    """Why the epigraph form needs segment binaries where the time has a q*a(1-a) term: mixing the
    ends a = 0 and a = 1 meets the balance value of the linear parts without paying q*a(1-a)."""
    p = problem("alexnet")
    sp = SplitProblem.root(p)
    v = 6  # classifier.4, an FC layer; IN after BATCH re-lays rows into columns (q > 0)
    e1, e2 = node_comm(sp.dims[v], PartitionType.IN, (PartitionType.BATCH,), p.planning.nodes[v].fractions)
    assert e1.q > 0
    side = sp.side
    cands = share_candidates(sp.dims[v].flops, e1, e2, side)
    true_min = min(max(side_times(sp.dims[v].flops, e1, e2, True, side, a)) for a in cands)
    t0, t1 = side_times(sp.dims[v].flops, e1, e2, True, side, 0.0), side_times(sp.dims[v].flops, e1, e2, True, side, 1.0)
    lam = (t0[1] - t0[0]) / ((t1[0] - t0[0]) - (t1[1] - t0[1]))  # where the mixed sides are equal
    mixed = (1 - lam) * t0[0] + lam * t1[0]
    assert mixed < true_min * (1 - 1e-6)


def test_memory_limit_changes_the_plan_and_it_fits():
    p = problem("vgg16")
    free = solve_exact(p, "scip")
    limit = 5 * GIB
    assert free.evaluation.peak_memory_bytes > limit  # the unconstrained optimum does not fit
    r = solve_exact(p, "scip", memory_limit_bytes=limit)
    assert r.plan is not None and r.evaluation.peak_memory_bytes <= limit * (1 + 1e-9)
    assert r.plan.root.choices != free.plan.root.choices or r.plan.root.shares != free.plan.root.shares
    cert = r.certificate
    assert cert.status in ("optimal", "feasible")
    assert cert.bound <= cert.objective * (1 + 1e-9)
    assert cert.objective >= free.certificate.objective
    assert "memory 2" in cert.model_size


def test_memory_too_small_says_which_family_and_how_much():
    p = problem("vgg16")
    r = solve_exact(p, "scip", memory_limit_bytes=3 * GIB)
    cert = r.certificate
    assert r.plan is None and cert.status == "infeasible" and cert.failed_family == "memory"
    assert "memory: the split of the 2-device group (45 | 123 TFLOP/s) needs at least" in cert.message
    assert "GiB" in cert.message
    with pytest.raises(InfeasibleError, match="needs at least"):
        require_plan(r)
    # the stated need is enough: a limit just above it is feasible
    factor = float(cert.message.split("needs at least ")[1].split("x")[0])
    assert solve_exact(p, "scip", memory_limit_bytes=3 * GIB * factor * 1.0002).plan is not None


def test_memory_limit_with_cpsat_claims_no_continuous_bound():
    p = problem("vgg16")
    cert = solve_exact(p, "cpsat", memory_limit_bytes=5 * GIB, time_limit_s=5).certificate
    assert cert.status in ("feasible", "time_limit") and cert.bound is None
    assert any("grid only" in n for n in cert.notes)


def test_memory_need_model_recovers_the_capacity_factor():
    sp = SplitProblem.root(problem("vgg16"))
    model, _ = build_mip(sp, PlanOptions(), memory=MemoryLimit((2 * GIB, 2 * GIB)), share_grid=8)
    r = get_backend("scip").solve(memory_need_model(model), SolveOptions())
    assert r.termination.value == "optimal" and r.objective > 1.0
    with pytest.raises(ConfigError, match="unknown constraint families"):
        model.without("memroy")


def test_hierarchy_level_by_level_certificate():
    p = problem("alexnet", "tpu-v2:2,tpu-v3:2")
    r = solve_exact(p, "scip")
    cert = r.certificate
    assert set(cert.splits) == {"", "L", "R"} and all(c.status == "optimal" for c in cert.splits.values())
    assert cert.scope == "level-by-level"
    dp = dp_price(p)
    assert cert.bound <= min(dp, cert.objective)  # the root bound holds for every plan of the hierarchy
    assert cert.status == "feasible" and cert.gap > 1e-6
    assert any("level-by-level" in n for n in cert.notes)


def test_device_memory_limit_checks_every_device():
    p = Problem(get_model("vgg16"), parse_array("tpu-v2:2,tpu-v3:2"), batch=2048)
    r = solve_exact(p, "scip", memory_limit_bytes="device")
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


@pytest.mark.parametrize("name,array", [("resnet18", "tpu-v2:2,tpu-v3:2"), ("vgg11", "tpu-v2:1,tpu-v3:2")])
def test_joint_model_prices_a_fixed_plan_like_the_evaluator(name, array):
    """Fix the joint model's options to the level-by-level plan: its objective and per-device
    memory rows must equal the evaluator's (the joint model is exact for its shares)."""
    p = problem(name, array)
    plan = make_plan(p)
    ev = evaluate(p, plan)
    model, dec = build_joint(p, include=plan, memory_limit_bytes=1e15)
    fixes = []
    for path, per_node in dec.options.items():
        split = plan.splits[path]
        for v, opts in enumerate(per_node):
            (var,) = [o[2] for o in opts if o[0] == split.choices[v] and o[1] == split.shares[v]]
            fixes.append(Constraint(f"fix_{var}", "one_hot", ((var, 1.0),), "==", 1.0))
    r = get_backend("scip").solve(replace(model, constraints=model.constraints + tuple(fixes)), SolveOptions())
    assert math.isclose(r.objective / model.objective_scale, ev.step_time_s, rel_tol=1e-9)
    assert dec(r).splits == plan.splits
    for c in model.constraints:
        if c.family == "memory":
            used = sum(a * r.values[i] for i, a in c.coeffs) * GIB
            assert math.isclose(used, ev.device_memory_bytes[c.name.split("_")[1]], rel_tol=1e-9)


def test_joint_never_worse_than_level_by_level():
    p = problem("lenet-c", "tpu-v2:1,tpu-v3:2")
    lbl = solve_exact(p, "scip")
    joint = solve_exact(p, "highs", joint=True, share_grid=2)
    cert = joint.certificate
    assert cert.scope == "joint" and joint.plan is not None
    assert cert.objective <= lbl.certificate.objective * (1 + 1e-9)
    assert math.isclose(cert.model_objective, cert.objective, rel_tol=1e-9)
    assert cert.bound <= cert.objective
    assert any("joint vs level-by-level" in n for n in cert.notes)


def test_joint_refuses_deep_arrays_and_cpsat():
    with pytest.raises(ConfigError, match="limited to 3 levels"):
        build_joint(problem("lenet", "tpu-v2:8,tpu-v3:8"))
    with pytest.raises(ConfigError, match="backend 'cpsat' cannot solve it"):
        solve_exact(problem("lenet", "tpu-v2:1,tpu-v3:1"), "cpsat", joint=True)


def test_time_limit_on_a_hard_planning_instance_is_not_optimal():
    p = problem("vgg11", "tpu-v2:2,tpu-v3:2")
    r = solve_exact(p, "scip", joint=True, time_limit_s=1.0)
    cert = r.certificate
    assert cert.status == "time_limit" and not cert.is_optimal
    assert r.plan is not None  # the best plan found (or the level-by-level one) is kept
    assert cert.bound is None or cert.bound <= cert.objective


def test_cli_certify_and_solve(capsys, tmp_path):
    assert main(["certify", "--model", "alexnet", "--array", PAIR, "--backend", "cbc"]) == 0
    out = capsys.readouterr().out
    assert "status      optimal" in out and "DP - exact  0.000e+00" in out
    lp = tmp_path / "m.lp"
    assert main(["solve", "--model", "lenet", "--array", PAIR, "--write-lp", str(lp)]) == 0
    out = capsys.readouterr().out
    assert "certificate" in out and "status          optimal" in out and lp.exists()
    assert main(["solve", "--model", "vgg16", "--array", PAIR, "--memory-limit", "3"]) == 1
    assert "needs at least" in capsys.readouterr().out
    assert main(["solve", "--model", "lenet", "--array", PAIR, "--backend", "gurobi"]) == 2
    assert "unknown backend 'gurobi'" in capsys.readouterr().err
    assert main(["solve", "--model", "lenet", "--array", PAIR, "--memory-limit", "lots"]) == 2
    assert "--memory-limit must be a number of GiB" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("backend", ["scip", "cbc"])
def test_certify_every_zoo_model_under_10_s(name, backend):
    p = problem(name)
    start = time.perf_counter()
    cert = solve_exact(p, backend).certificate
    assert time.perf_counter() - start < 10.0
    assert cert.status == "optimal"
    assert abs(dp_price(p) - cert.objective) <= 1e-9 * cert.objective
