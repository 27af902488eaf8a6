"""Exact backends: registry, conformance on known-answer models, time limits, the PuLP traps."""

import importlib.util
import math
import random

import pytest

from parplan.costmodel.hardware import parse_array
from parplan.costmodel.problem import Problem
from parplan.errors import ConfigError, SolverError
from parplan.formulation.mip import ModelBuilder, MipModel, build_mip
from parplan.solvers.backends.cbc import import_pulp, to_pulp
from parplan.solvers.backends import (
    BACKENDS,
    SolveOptions,
    Termination,
    available_backends,
    get_backend,
)
from parplan.solvers.backends import registry
from parplan.solvers.backends.cbc import parse_cbc_log
from parplan.solvers.dp import PlanOptions, SplitProblem, frontier_dp
from parplan.solvers.exact import solve_split_exact
from parplan.models.zoo import get_model

ALL = available_backends()
CONTINUOUS = [b for b in ALL if BACKENDS[b].supports_continuous]
#: Per-backend relative tolerance on objectives (CP-SAT's integer model rounds times).
TOL = {"scip": 1e-9, "cbc": 1e-8, "highs": 1e-9, "cpsat": 1e-6}
pulp = import_pulp()


def test_registry_flags_and_status_maps():
    assert set(BACKENDS) == {"scip", "cbc", "highs", "cpsat"}
    assert set(ALL) == set(BACKENDS), "every backend's library is a project dependency"
    assert not BACKENDS["cpsat"].supports_continuous
    for spec in BACKENDS.values():
        values = set(spec.status_map().values())
        assert Termination.OPTIMAL in values and Termination.INFEASIBLE in values


def test_unknown_backend_names_the_valid_ones():
    with pytest.raises(
        ConfigError, match="unknown backend 'gurobi'; valid backends: scip, cbc, highs, cpsat"
    ):
        get_backend("gurobi")


def test_missing_library_is_reported_without_importing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "highspy" else real(name, *a)
    )
    assert not BACKENDS["highs"].available
    assert "highs" not in registry.available_backends()
    with pytest.raises(
        SolverError, match=r"backend 'highs' needs the Python modules \['highspy'\]"
    ):
        get_backend("highs")


def knapsack() -> tuple[MipModel, float]:
    """max 5a + 4b + 3c s.t. 2a + 3b + c <= 5, 4a + b + 2c <= 11, 3a + 4b + 2c <= 8, integers >= 0
    (Chvatal's example): optimum 13 at (2, 0, 1)."""
    b = ModelBuilder("knapsack")
    x = [b.var(n, 0, 10, True) for n in "abc"]
    for i, (coefs, rhs) in enumerate((((2, 3, 1), 5), ((4, 1, 2), 11), ((3, 4, 2), 8))):
        b.constraint("one_hot", f"c{i}", zip(x, coefs), "<=", rhs)
    for i, c in zip(x, (5, 4, 3)):
        b.objective(i, -c)
    return b.build(), -13.0


def mixed() -> tuple[MipModel, float]:
    """min y + 2z, y >= 1.5 - 3x, z >= x - 0.25, x binary, y, z >= 0 continuous: x = 0 -> 1.5; x = 1 -> 1.5."""
    b = ModelBuilder("mixed")
    x, y, z = b.var("x", 0, 1, True), b.var("y", 0, 10), b.var("z", 0, 10)
    b.constraint("edge_link", "c1", [(y, 1.0), (x, 3.0)], ">=", 1.5)
    b.constraint("edge_link", "c2", [(z, 1.0), (x, -1.0)], ">=", -0.25)
    b.objective(y, 1.0)
    b.objective(z, 2.0)
    return b.build(), 1.5


def infeasible() -> MipModel:
    b = ModelBuilder("infeasible")
    x, y = b.var("x", 0, 1, True), b.var("y", 0, 1, True)
    b.constraint("one_hot", "sum", [(x, 1.0), (y, 1.0)], "==", 1.0)
    b.constraint("memory", "cap", [(x, 2.0), (y, 2.0)], "<=", 1.0)
    b.objective(x, 1.0)
    return b.build()


def market_split(m: int = 4, n: int = 36, seed: int = 7) -> MipModel:
    """Cornuejols-Dawande market split: sum_j a_ij x_j + s+_i - s-_i = floor(sum_j a_ij / 2), min
    total slack. Notoriously hard for branch and bound at n = 10 (m - 1) and beyond."""
    rng = random.Random(seed)
    b = ModelBuilder("market_split")
    x = [b.var(f"x{j}", 0, 1, True) for j in range(n)]
    for i in range(m):
        a = [rng.randint(0, 99) for _ in range(n)]
        sp, sm = b.var(f"sp{i}", 0, 10**4, True), b.var(f"sm{i}", 0, 10**4, True)
        b.constraint(
            "one_hot", f"row{i}", list(zip(x, a)) + [(sp, 1.0), (sm, -1.0)], "==", sum(a) // 2
        )
        b.objective(sp, 1.0)
        b.objective(sm, 1.0)
    return b.build()


@pytest.mark.parametrize("name", ALL)
def test_conformance_integer_known_answer(name):
    model, answer = knapsack()
    r = get_backend(name).solve(model, SolveOptions())
    assert r.termination is Termination.OPTIMAL and r.has_solution
    assert math.isclose(r.objective, answer, rel_tol=TOL[name])
    assert r.bound <= r.objective + 1e-9 * abs(answer)
    assert math.isclose(model.objective_value(r.values), answer, rel_tol=TOL[name])
    assert max(model.violations(r.values).values()) <= 1e-6
    assert r.version and r.solver and r.wall_s >= 0


@pytest.mark.parametrize("name", ALL)
def test_conformance_infeasible(name):
    r = get_backend(name).solve(infeasible(), SolveOptions())
    assert r.termination is Termination.INFEASIBLE
    assert not r.has_solution and r.values is None and r.objective is None


@pytest.mark.parametrize("name", CONTINUOUS)
def test_conformance_mixed_continuous(name):
    model, answer = mixed()
    r = get_backend(name).solve(model, SolveOptions())
    assert r.termination is Termination.OPTIMAL
    assert math.isclose(r.objective, answer, rel_tol=1e-7)


def test_cpsat_refuses_continuous_models():
    model, _ = mixed()
    with pytest.raises(ConfigError, match="backend 'cpsat' needs an integer model"):
        get_backend("cpsat").solve(model, SolveOptions())


@pytest.mark.parametrize("name", ALL)
def test_time_limit_is_never_called_optimal(name):
    model = market_split()
    r = get_backend(name).solve(model, SolveOptions(time_limit_s=1.0))
    assert r.termination is Termination.TIME_LIMIT
    if r.has_solution:  # the best plan found and its true (non-zero) gap
        assert r.bound is None or r.bound < r.objective
        assert max(model.violations(r.values).values()) <= 1e-6


def test_solvers_survive_highspy_loaded_first():
    """Once highspy is in the process OR-Tools cannot load there: SCIP / CP-SAT solve in a child."""
    import subprocess
    import sys

    code = (
        "import highspy\n"
        "from parplan.solvers.backends import get_backend, SolveOptions\n"
        "from tests.test_backends import knapsack\n"
        "m, a = knapsack()\n"
        "for b in ('scip', 'cpsat', 'cbc', 'highs'):\n"
        "    r = get_backend(b).solve(m, SolveOptions())\n"
        "    assert r.termination.value == 'optimal' and abs(r.objective - a) < 1e-9, b\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.stdout.strip() == "ok", out.stderr


def test_pulp_trap_cbc_time_limit_reported_optimal_by_pulp():
    """The trap this backend avoids: PuLP calls a time-limit stop with a solution 'Optimal'."""
    prob, _ = to_pulp(market_split())
    prob.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=1))
    if prob.sol_status == pulp.LpSolutionIntegerFeasible:  # CBC found a solution before the limit
        assert pulp.LpStatus[prob.status] == "Optimal"
    r = get_backend("cbc").solve(market_split(), SolveOptions(time_limit_s=1.0))
    assert r.termination is Termination.TIME_LIMIT


def test_cbc_log_parser():
    log = (
        "Result - Stopped on time limit\n\nObjective value:                12.5\n"
        "Lower bound:                    10.25\nGap:                            0.22\n"
    )
    out = parse_cbc_log(log)
    assert out["result"] == "Stopped on time limit"
    assert out["objective"] == 12.5 and not out["no_solution"]
    assert out["bound"] == pytest.approx(10.245, abs=1e-12)  # 10.25 printed: less half a last digit
    assert (
        parse_cbc_log(
            "Cbc0038I No solution found this major pass\nResult - Optimal solution found\n"
            "Objective value: 3\n"
        )["no_solution"]
        is False
    )


# Excerpts of real CBC 2.10.3 logs (PuLP's bundled binary), one per way a run can end optimal.
COMPLETED = (
    "Cbc0010I After 0 nodes, 1 on tree, -932.73154 best solution, best possible -947.52242 (0.01 seconds)\n"
    "Cbc0001I Search completed - best objective -932.7315413250599, took 241 iterations and 34 nodes\n"
    "Result - Optimal solution found\n\nObjective value:                932.73154133\n"
)
INTEGRAL = (
    "Cutoff increment increased from 1e-05 to 0.9999\n"
    "Cbc0001I Search completed - best objective -841, took 44 iterations and 2 nodes (0.01 seconds)\n"
    "Result - Optimal solution found\n\nObjective value:                841.00000000\n"
)
GAP_EXIT = (
    "Cbc0011I Exiting as integer gap of 961.01944 less than 1e-10 or 2%\n"
    "Cbc0001I Search completed - best objective -89442.726980305, took 0 iterations and 0 nodes\n"
    "Result - Optimal solution found (within gap tolerance)\n\n"
    "Objective value:                -89442.72698031\nLower bound:                    -90403.746\n"
)


def test_cbc_bound_is_read_from_the_log_never_from_the_requested_gap():
    from parplan.solvers.backends.cbc import STATUS_MAP, optimal_bound

    # A completed search proves the best objective less CBC's cutoff increment (1e-5 default).
    assert optimal_bound(parse_cbc_log(COMPLETED)) == pytest.approx(
        -932.7315413250599 - 1e-5, abs=1e-12
    )
    # Integral objective: CBC raised the increment below the objective's step, so V itself.
    assert optimal_bound(parse_cbc_log(INTEGRAL)) == -841.0
    # Exited on the gap: CBC's printed lower bound, rounded down by half its last digit.
    assert STATUS_MAP["Optimal solution found (within gap tolerance)"] is Termination.OPTIMAL
    assert optimal_bound(parse_cbc_log(GAP_EXIT)) == pytest.approx(-90403.7465, abs=1e-9)
    no_lower = GAP_EXIT.replace("Lower bound:                    -90403.746\n", "")
    assert optimal_bound(parse_cbc_log(no_lower)) == pytest.approx(
        -89442.726980305 - 961.019445, abs=1e-9
    )
    # Preprocessing left an LP: its optimum; otherwise the root relaxation is still a bound.
    lp = (
        "Continuous objective value is 450000 - 0.00 seconds\nCbc3007W No integer variables - nothing to do\n"
        "Result - Optimal solution found\n\nObjective value:                450000.00000000\n"
    )
    assert optimal_bound(parse_cbc_log(lp)) == pytest.approx(450000 - 5e-9, abs=1e-9)
    assert optimal_bound(parse_cbc_log(lp.replace("Cbc3007W", "Cbc0000X"))) == 449999.5
    # Nothing that proves a bound: none (the certificate cannot then say optimal).
    assert (
        optimal_bound(parse_cbc_log("Result - Optimal solution found\nObjective value: 3\n"))
        is None
    )


def test_cbc_bound_includes_the_objective_constant():
    import dataclasses

    b = ModelBuilder("const")
    x = b.var("x", 0, 3, True)
    y = b.var("y", 0, 3, False)
    b.objective(x, -1.0)
    b.objective(y, 0.37)
    b.constraint("one_hot", "c", [(x, 2.0), (y, -1.0)], "<=", 5.5)
    model = dataclasses.replace(b.build(), objective_constant=100.0)
    r = get_backend("cbc").solve(model, SolveOptions())
    assert r.termination is Termination.OPTIMAL
    assert r.objective == pytest.approx(97.185, abs=1e-9)
    assert r.objective - 2e-5 <= r.bound <= r.objective


def test_options_are_validated():
    with pytest.raises(ConfigError, match="time limit must be a number > 0 of seconds"):
        SolveOptions(time_limit_s=0)
    with pytest.raises(ConfigError, match=r"threads must be an integer in \[1, 1024\]"):
        SolveOptions(threads=0)


@pytest.mark.parametrize("model_name", ["lenet", "alexnet"])
def test_all_backends_agree_on_zoo_splits(model_name):
    p = Problem(get_model(model_name), parse_array("tpu-v2:1,tpu-v3:1"), batch=512)
    sp = SplitProblem.root(p)
    opts = PlanOptions(share_grid=4 if model_name != "resnet18" else 2)
    dp, _ = frontier_dp(sp, opts)
    for name in ALL:
        split, cert = solve_split_exact(sp, name, opts)
        assert cert.status == "optimal", (name, cert)
        assert math.isclose(cert.objective, dp, rel_tol=TOL[name]), name
        assert cert.bound <= dp * (1 + TOL[name])


def test_lp_and_mps_files_round_trip(tmp_path):
    """Files written without PuLP read back into two other solvers with the same optimum."""
    import subprocess
    import sys

    p = Problem(get_model("alexnet"), parse_array("tpu-v2:1,tpu-v3:1"), batch=64)
    model, _ = build_mip(SplitProblem.root(p), PlanOptions(share_grid=2))
    lp, mps = model.write_lp(tmp_path / "m.lp"), model.write_mps(tmp_path / "m.mps")
    text = lp.read_text()
    assert "Minimize" in text and "one_hot_0" in text and "Generals" in text
    direct = get_backend("scip").solve(model, SolveOptions())
    _, back = pulp.LpProblem.fromMPS(str(mps))  # PuLP reads the MPS file: same size
    assert len(back.variables()) == model.n_vars and len(back.constraints) == model.n_constraints
    # HiGHS (in a child process: its library must not meet OR-Tools') solves both files
    code = (
        "import highspy, sys\n"
        "for f in sys.argv[1:]:\n"
        "    h = highspy.Highs(); h.setOptionValue('output_flag', False); h.readModel(f); h.run()\n"
        "    print('objective', h.getInfo().objective_function_value)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(lp), str(mps)], capture_output=True, text=True, check=True
    )
    values = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("objective ")]
    assert len(values) == 2, out.stdout
    for value in values:
        assert math.isclose(float(value), direct.objective, rel_tol=1e-6), (value, direct.objective)


def test_a_solver_child_past_its_time_limit_is_a_time_limit_not_an_error(monkeypatch):
    """Issue 30: under load HiGHS's child process outlived its limit and parplan raised
    SolverError; it is a time limit without a plan, and the certificate says so."""
    import subprocess

    from parplan.solvers.backends.base import SolveOptions, Termination, solve_in_subprocess
    from parplan.solvers.certificate import Status
    from parplan.solvers.exact import _default_message

    def late(*args, **kwargs):
        raise subprocess.TimeoutExpired("child", 1)

    monkeypatch.setattr(subprocess, "run", late)
    model, _ = knapsack()
    raw = solve_in_subprocess(
        "parplan.solvers.backends.highs", model, SolveOptions(time_limit_s=2.0)
    )
    assert raw.termination is Termination.TIME_LIMIT and not raw.has_solution
    # issue 36: the message names the solver, the limit it overran and the model's size (HiGHS's
    # presolve ran 155 s past a 2 s limit on resnet18's 1.1 M-column root split)
    assert raw.message.startswith(
        "the highs solver overran its 2 s time limit and had not answered 122 s after the solve "
        f"began (a model of {model.n_vars:,} variables and {model.n_constraints:,} constraints"
    )
    no_words = raw.__class__(
        Termination.ERROR, False, None, None, None, "CP-SAT", "9", 0.5, "UNKNOWN"
    )
    assert "UNKNOWN" in _default_message(Status.ERROR, no_words, SolveOptions())
    assert "before finding a plan" in _default_message(
        Status.TIME_LIMIT, no_words, SolveOptions(time_limit_s=3)
    )


def test_a_killed_or_failed_solver_child_says_why_and_exits_3(monkeypatch, capsys):
    """A solver child killed by the system (SIGKILL: most often out of memory) or failing is
    named as such, not by the last line of its banner, and the CLI exits 3 (not the code of a
    user's mistake)."""
    import signal

    from parplan.cli import main
    from parplan.errors import SolverError
    from parplan.solvers.backends.base import child_failure

    banner = (
        "Running HiGHS 1.11\nIncludes third-party software components, see THIRD_PARTY_NOTICES.md"
    )
    killed = child_failure("parplan.solvers.backends.highs", -signal.SIGKILL, banner)
    assert "killed by SIGKILL" in killed and "memory" in killed and "THIRD_PARTY" not in killed
    failed = child_failure(
        "parplan.solvers.backends.highs", 1, banner + "\nTraceback...\nMemoryError: out"
    )
    assert failed.endswith("MemoryError: out") and "exit status 1" in failed

    def boom(*args, **kwargs):
        raise SolverError(killed)

    monkeypatch.setattr("parplan.solvers.exact.solve_exact", boom)
    code = main(["solve", "--model", "lenet", "--array", "h100:2", "--backend", "highs"])
    err = capsys.readouterr().err
    assert code == 3 and "parplan: solver failure:" in err and "SIGKILL" in err
