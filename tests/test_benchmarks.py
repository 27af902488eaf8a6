"""Benchmarks: quick variants (tiny inputs, columns and cross-checks), executors, CLI.

The full runs are marked ``slow`` (excluded by default; ``pytest -m slow``).
"""

import io
import json
import math

import numpy as np
import pandas as pd
import pytest

from parplan.bench import BENCHMARKS
from parplan.bench import ablations, accpar, dp_vs_exact, hypar, scaling
from parplan.bench.common import (
    ExecutorSpec,
    Task,
    TaskError,
    fit_exponent,
    geomean,
    make_array,
    run_kwargs,
    run_tasks,
)
from parplan.errors import ConfigError

SERIAL = ExecutorSpec("serial")


def _outputs(out, name):
    for ext in ("csv", "png", "md"):
        path = out / f"{name}.{ext}"
        assert path.is_file() and path.stat().st_size > 0, path
    return pd.read_csv(out / f"{name}.csv")


def _has_columns(frame, columns):
    missing = [c for c in columns if c not in frame.columns]
    assert not missing, f"missing columns {missing}"


# --------------------------------------------------------------------------- executor


def test_run_tasks_serial_keeps_task_order_and_reports_progress(capsys):
    import sys

    tasks = [Task(f"t{i}", pow, {"base": i, "exp": 2}, cost=i) for i in range(4)]
    assert run_tasks("demo", tasks, SERIAL, log=sys.stderr) == [0, 1, 4, 9]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4
    assert err[0].startswith("[bench demo] 1/4 t3 done (") and err[0].endswith(
        " s)"
    )  # largest cost first


def test_run_tasks_local_pool_matches_serial():
    tasks = [Task(f"t{i}", pow, {"base": i, "exp": 3}) for i in range(5)]
    assert run_tasks("demo", tasks, ExecutorSpec("local", workers=2), log=None) == [
        i**3 for i in range(5)
    ]


def _nap(secs):
    import time

    time.sleep(secs)
    return secs


def test_local_pool_reports_each_task_when_it_finishes():
    import time

    class Clock:
        def __init__(self):
            self.t0, self.lines = time.perf_counter(), []

        def write(self, text):
            if text.strip():
                self.lines.append((time.perf_counter() - self.t0, text.strip()))

        def flush(self):
            pass

    clock = Clock()
    tasks = [Task("slow", _nap, {"secs": 1.2}, cost=2), Task("fast", _nap, {"secs": 0.05}, cost=1)]
    assert run_tasks("demo", tasks, ExecutorSpec("local", workers=2), log=clock) == [1.2, 0.05]
    (t_fast, first), (t_slow, second) = clock.lines
    assert "fast done" in first and "slow done" in second
    assert t_slow - t_fast > 0.5  # the fast task was reported while the slow one still ran


def test_failing_task_names_the_benchmark_and_task():
    tasks = [Task("ok", pow, {"base": 2, "exp": 2}), Task("bad", pow, {"base": 0, "exp": -1})]
    for spec in (SERIAL, ExecutorSpec("local", workers=2)):
        with pytest.raises(TaskError, match=r"\[bench demo\] task 'bad' failed: ZeroDivisionError"):
            run_tasks("demo", tasks, spec, log=None)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kind": "mpi"}, "executor must be one of local, dask, serial (got 'mpi')"),
        ({"workers": 0}, "workers must be an integer >= 1 (got 0)"),
        (
            {"kind": "local", "scheduler": "tcp://x:8786"},
            "a scheduler address needs --executor dask",
        ),
    ],
)
def test_executor_spec_errors(kwargs, message):
    with pytest.raises(ConfigError) as err:
        ExecutorSpec(**kwargs)
    assert message in str(err.value)


def test_dask_local_cluster_gives_the_serial_results(tmp_path):
    pytest.importorskip("dask.distributed")
    kw = dict(quick=True, models=("alexnet",), variants=("share-half", "flat-split"))
    serial = ablations.run(tmp_path / "serial", executor=SERIAL, **kw)
    dask = ablations.run(tmp_path / "dask", executor=ExecutorSpec("dask", workers=2), **kw)
    pd.testing.assert_frame_equal(serial.drop(columns="wall_s"), dask.drop(columns="wall_s"))


# --------------------------------------------------------------------------- helpers


def test_fit_exponent_and_geomean_known_answers():
    k, _ = fit_exponent([1, 2, 4, 8], [3, 6, 12, 24])
    assert math.isclose(k, 1.0, rel_tol=1e-9)
    k, _ = fit_exponent([1, 2, 4], [1, 4, 16])
    assert math.isclose(k, 2.0, rel_tol=1e-9)
    assert math.isclose(geomean([2.0, 8.0]), 4.0, rel_tol=1e-12)
    assert math.isnan(geomean([]))


def test_make_array_scales_every_link():
    base = make_array("tpu-v2:2,tpu-v3:2", bandwidth_gbps=10)
    scaled = make_array("tpu-v2:2,tpu-v3:2", bandwidth_gbps=10, scale=0.1)
    links = [(p, n.link.bytes_per_s) for p, n in base.inner_nodes()]
    assert [(p, bw * 0.1) for p, bw in links] == [
        (p, n.link.bytes_per_s) for p, n in scaled.inner_nodes()
    ]
    assert math.isclose(scaled.link.bytes_per_s, 1e9, rel_tol=1e-12)


def test_synthetic_graphs_have_the_requested_size_and_are_seeded():
    chain = scaling.synthetic_chain(40, seed=3)
    assert len(chain.weighted_layers()) == 40
    assert chain == scaling.synthetic_chain(40, seed=3)
    assert chain != scaling.synthetic_chain(40, seed=4)
    dag = scaling.synthetic_dag(40, seed=3)
    from parplan.costmodel.planning import planning_graph

    pg = planning_graph(dag)
    assert 40 <= len(pg.nodes) < 44
    assert not pg.is_chain and sum(n.is_join for n in pg.nodes) >= 10


def test_accpar_explanation_names_the_term_that_makes_hypar_slower():
    row = {
        "speedup_owt": 4.0,
        "speedup_hypar": 3.0,
        "speedup_accpar": 5.0,
        "data_compute_fraction": 0.1,
        "activation_weight_ratio": 10.0,
        "fc_weight_fraction": 0.9,
        "accpar_compute_fraction": 0.5,
        "hypar_compute_s": 4e-3,
        "owt_compute_s": 2e-3,
        "hypar_other_s": 1e-3,
        "owt_other_s": 1e-3,
        "hypar_comm_bytes": 1e9,
        "owt_comm_bytes": 1e9,
    }
    out = accpar.explain(row)
    assert not out["paper_order"]
    assert out["ordering"] == "HyPar 3.00x < OWT 4.00x < AccPar 5.00x"
    assert "HyPar < OWT: its compute time is 4.00 ms vs 2.00 ms" in out["note"]
    assert out["dominant_term"].startswith("communication")


def test_exact_top_down_certifies_every_split_and_stops_on_budget():
    from parplan.costmodel.problem import Problem
    from parplan.models.zoo import get_model

    from parplan.bench.common import exact_top_down

    problem = Problem(get_model("lenet"), make_array("tpu-v2:2,tpu-v3:2"), batch=64)
    row = exact_top_down(problem, "scip", time_limit_s=20)
    assert row["status"] == "split-optimal" and row["splits"] == row["splits_optimal"] == 3
    assert row["root_bound"] <= row["step_time_s"] * (1 + 1e-9) and 0.0 <= row["gap"] < 1.0
    stopped = exact_top_down(problem, "scip", time_limit_s=20, budget_s=1e-3)
    assert (
        stopped["status"] == "budget"
        and math.isnan(stopped["step_time_s"])
        and stopped["splits"] == 0
    )
    assert "budget of 0.001 s used after 0 splits" in stopped["message"]


# --------------------------------------------------------------------------- quick variants


def test_accpar_quick(tmp_path):
    table = accpar.run(tmp_path, quick=True, executor=SERIAL)
    csv = _outputs(tmp_path, "accpar")
    _has_columns(
        csv,
        [
            "bandwidth",
            "bandwidth_gbps",
            "primary",
            "model",
            "array",
            "devices",
            "levels",
            "batch",
            "speedup_owt",
            "speedup_hypar",
            "speedup_accpar",
            "speedup_topdown",
            "speedup_exact",
            "speedup_bound",
            "exact_status",
            "exact_gap",
            "speedup_data_half",
            "data_compute_fraction",
            "ordering",
            "paper_order",
            "dominant_term",
            "note",
            "data_step_s",
            "accpar_step_s",
            "accpar_comm_bytes",
            "hypar_compute_s",
        ],
    )
    summary = pd.read_csv(tmp_path / "accpar_summary.csv")
    _has_columns(summary, ["bandwidth", "planner", "geomean", "arithmean", "paper"])
    assert len(table) == len(accpar.QUICK["models"]) * (1 + len(accpar.QUICK["sweep_gbps"]))
    prim = table[table.primary]
    # the exact column exists at the primary bandwidth only, and every split is certified
    assert prim.speedup_exact.notna().all() and table[~table.primary].speedup_exact.isna().all()
    assert set(prim.exact_status) <= {"optimal", "split-optimal"}
    # the bound is a bound, and AccPar (a portfolio containing the data plan) never loses to data parallelism
    assert (table.speedup_bound >= table.speedup_accpar * (1 - 1e-9)).all()
    assert (table.speedup_accpar >= 1 - 1e-9).all()
    md = (tmp_path / "accpar.md").read_text()
    # the quick run is not the paper's setup: no paper row, no replication claimed (issue 36)
    assert (
        "paper (mean)" not in md
        and "no replication is claimed" in md
        and "Per model: ordering and why" in md
    )
    assert not accpar.paper_setup(table.array.iloc[0], table.batch.iloc[0])
    assert accpar.paper_setup(accpar.DEFAULT_ARRAY, accpar.DEFAULT_BATCH)
    # the published C++'s own networks: its plan and parplan's, each priced by both models
    cpp = pd.read_csv(tmp_path / "accpar_compat.csv")
    assert list(cpp.model) == ["alexnet", "resnet18"]
    # parplan's plan is never slower by parplan's model (its portfolio contains data parallelism,
    # and the C++ plan is one plan it could have chosen); on one split of a chain without
    # shortcuts the C++'s DP minimises exactly its count, so its plan never moves more by it
    assert (cpp.parplan_step_s <= cpp.data_step_s * (1 + 1e-9)).all()
    alex = cpp[cpp.model == "alexnet"].iloc[0]
    assert alex.cpp_cpp_elements <= alex.parplan_cpp_elements * (1 + 1e-9)
    assert "published C++'s plans next to parplan's" in md


def test_hypar_quick(tmp_path):
    table = hypar.run(tmp_path, quick=True, executor=ExecutorSpec("local", workers=2))
    csv = _outputs(tmp_path, "hypar")
    _has_columns(
        csv,
        [
            "bandwidth",
            "primary",
            "model",
            "label",
            "devices",
            "levels",
            "batch",
            "bytes_per_element",
            "speedup_hypar",
            "speedup_model",
            "speedup_accpar",
            "data_comm_bytes",
            "hypar_comm_bytes",
            "model_comm_bytes",
            "comm_reduction_hypar",
            "hypar_plan",
        ],
    )
    levels = pd.read_csv(tmp_path / "hypar_levels.csv")
    _has_columns(
        levels,
        ["model", "planner", "level", "letters", "model_parallel_layers", "level_comm_bytes"],
    )
    assert (table.bytes_per_element == 8).all()
    prim = table[table.primary]
    # per-level traffic adds up to the total the evaluator reports
    for m in prim.model:
        lv = levels[(levels.model == m) & (levels.planner == "hypar")]
        assert len(lv) == prim.levels.iloc[0]
        total = float(prim[prim.model == m].hypar_comm_bytes.iloc[0])
        assert math.isclose(lv.level_comm_bytes.sum(), total, rel_tol=1e-9)
    sfc = prim[prim.model == "sfc"].iloc[0]
    assert set(sfc.hypar_plan.replace("/", "")) <= {"B", "I"} and "I" in sfc.hypar_plan


def test_dp_vs_exact_quick(tmp_path):
    table = dp_vs_exact.run(tmp_path, quick=True, executor=SERIAL)
    csv = _outputs(tmp_path, "dp-vs-exact")
    _has_columns(
        csv,
        [
            "model",
            "nodes",
            "depth",
            "devices",
            "backend",
            "dp_wall_s",
            "dp_step_s",
            "exact_wall_s",
            "exact_step_s",
            "status",
            "root_objective",
            "root_bound",
            "root_gap",
            "gap",
            "root_match",
            "dp_minus_exact_rel",
            "splits",
            "splits_optimal",
        ],
    )
    q = dp_vs_exact.QUICK
    assert len(table) == len(q["models"]) * len(q["depths"]) * len(q["backends"])
    assert set(table.status) <= {"optimal", "split-optimal"}
    # certificate cross-check: on one split the DP is exact, so a continuous-share backend agrees with it,
    # and no backend beats the DP there (CP-SAT's share grid can only cost more)
    one = table[table.depth == 1]
    assert one[one.backend == "scip"].root_match.all()
    assert (one.dp_minus_exact_rel <= 1e-6).all()
    assert (table.root_bound <= table.exact_step_s * (1 + 1e-9)).all()


@pytest.mark.slow  # times planners on growing chains (3 s)
def test_scaling_quick(tmp_path):
    table = scaling.run(tmp_path, quick=True, executor=SERIAL)
    csv = _outputs(tmp_path, "scaling")
    _has_columns(
        csv,
        [
            "series",
            "study",
            "kind",
            "planner",
            "backend",
            "size",
            "layers",
            "depth",
            "devices",
            "splits_solved",
            "wall_s",
            "cpu_s",
            "status",
        ],
    )
    fits = pd.read_csv(tmp_path / "scaling_fits.csv")
    _has_columns(fits, ["study", "series", "exponent_wall", "exponent_cpu", "at_most_linear"])
    assert set(table.study) == {"layers", "depth", "exact"}
    assert (table.wall_s > 0).all()


def test_ablations_quick(tmp_path):
    table = ablations.run(tmp_path, quick=True, executor=SERIAL)
    csv = _outputs(tmp_path, "ablations")
    _has_columns(
        csv,
        [
            "model",
            "variant",
            "removed",
            "step_s",
            "rel_to_accpar",
            "rel_to_topdown",
            "speedup_over_data",
            "comm_bytes",
        ],
    )
    assert set(table.variant) == set(ablations.VARIANTS)
    ref = table[table.variant == "accpar"]
    assert (ref.rel_to_accpar == 1.0).all()
    slower_links = table[table.variant == "bandwidth-x0.1"]
    assert (slower_links.rel_to_accpar > 1.0).all()
    collective = table[table.variant.str.startswith("allreduce-")]
    assert len(collective) == 3 * 2 and collective.pairwise_plan_step_s.gt(0).all()
    assert table[~table.variant.str.startswith("allreduce-")].pairwise_plan_step_s.isna().all()


def test_ablations_allreduce_variants_replan_exactly_on_one_split(tmp_path):
    """On one split the DP is exact under any all-reduce model, so the replanned AccPar can be no
    slower than the default model's plan repriced, nor than data parallelism (both in its space)."""
    table = ablations.run(
        tmp_path,
        executor=SERIAL,
        models=("alexnet", "resnet18"),
        array="tpu-v2:1,tpu-v3:1",
        batch=64,
        variants=tuple(ablations._COLLECTIVE),
    )
    sub = table[table.variant.isin(ablations._COLLECTIVE)]
    assert len(sub) == 6
    assert (sub.step_s <= sub.pairwise_plan_step_s * (1 + 1e-9)).all()
    assert (sub.step_s <= sub.data_step_s * (1 + 1e-9)).all()
    # the all-reduce replaces the default exchange: some price must differ from the default model's
    default = table[table.variant == "accpar"].set_index("model").step_s
    assert not np.allclose(sub.step_s.to_numpy(), sub.model.map(default).to_numpy(), rtol=1e-9)


# --------------------------------------------------------------------------- CLI


def test_cli_bench_runs_a_benchmark_and_prints_its_summary(tmp_path, capsys):
    from parplan.cli import main

    assert (
        main(
            [
                "bench",
                "ablations",
                "--quick",
                "--executor",
                "serial",
                "--models",
                "alexnet",
                "--variants",
                "share-half",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert "# AccPar ablations" in captured.out
    assert "[bench ablations] wrote" in captured.err
    assert (tmp_path / "ablations.csv").is_file()


def test_cli_bench_allreduce_uses_the_existing_benchmark(tmp_path, capsys):
    from parplan.cli import main

    assert main(["bench", "allreduce", "--quick", "--out", str(tmp_path)]) == 0
    assert "All-reduce" in capsys.readouterr().out
    assert (tmp_path / "allreduce.png").is_file()


def test_cli_bench_user_errors_are_one_line(tmp_path, capsys):
    from parplan.cli import main

    assert main(["bench", "accpar", "--quick", "--models", "nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("parplan: error: unknown model 'nope'") and "Traceback" not in err
    assert (
        main(["bench", "accpar", "--quick", "--planners", "owt,zap", "--out", str(tmp_path)]) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("parplan: error: bench accpar: unknown planner 'zap' in --planners")
    assert "owt, hypar, accpar" in err and not list(tmp_path.iterdir())


def test_accpar_planners_option_runs_only_those(tmp_path):
    """--planners accpar: data parallelism (the baseline) and AccPar only; the left-out planners'
    columns are empty and absent from the write-up, and the speedups equal the full run's."""
    table = accpar.run(
        tmp_path,
        models=("lenet",),
        array="h100:2",
        batch=32,
        sweep_gbps=(),
        exact=False,
        compat=False,
        executor=SERIAL,
        planners=("accpar-topdown", "AccPar"),
    )
    row = table.iloc[0]
    assert row.speedup_owt != row.speedup_owt and row.speedup_hypar != row.speedup_hypar  # NaN
    assert "owt_step_s" not in table and "hypar_wall_s" not in table
    full = accpar.planner_task("lenet", "h100:2", 32, None, "scip", 10.0)
    assert row.speedup_accpar == pytest.approx(
        full["data_step_s"] / full["accpar_step_s"], rel=1e-12
    )
    assert row.speedup_topdown == pytest.approx(
        full["data_step_s"] / full["topdown_step_s"], rel=1e-12
    )
    md = (tmp_path / "accpar.md").read_text()
    per_model = md.split("## Per model at links")[1].split("\n\n")[1]
    assert "| model | AccPar | AccPar top-down |" in per_model and "OWT" not in per_model
    assert "planners compared: AccPar" in row.note


def test_every_benchmark_is_registered_and_its_options_map_to_run():
    import argparse
    import importlib

    from parplan.cli.bench import BENCH_HELP, add_bench_parser

    assert set(BENCH_HELP) == set(BENCHMARKS)
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["bench", "accpar", "--bandwidth", "10", "--sweep", "1,100", "--no-exact"]
    )
    kw = run_kwargs(accpar.run, args)
    assert (
        kw["bandwidth_gbps"] == 10.0 and kw["sweep_gbps"] == (1.0, 100.0) and kw["exact"] is False
    )
    for name, module in BENCHMARKS.items():
        mod = importlib.import_module(module)
        assert callable(mod.run)


# --------------------------------------------------------------------------- full runs (slow)


@pytest.mark.slow
def test_accpar_full_run(tmp_path):
    import time

    t0 = time.perf_counter()
    table = accpar.run(tmp_path)
    assert time.perf_counter() - t0 < 300
    assert len(table[table.primary]) == len(accpar.MODELS)


@pytest.mark.slow
def test_scaling_full_run_dp_is_at_most_linear(tmp_path):
    scaling.run(tmp_path)
    fits = pd.read_csv(tmp_path / "scaling_fits.csv")
    dp = fits[fits.series.str.startswith("dp ")]
    assert len(dp) == 2 and dp.exponent_wall.between(0.3, 1.2).all() and dp.at_most_linear.all()


@pytest.mark.slow
@pytest.mark.parametrize("module", [hypar, ablations, dp_vs_exact])
def test_other_full_runs(tmp_path, module):
    table = module.run(tmp_path)
    assert len(table) > 0


def test_speed_quick_reports_ratios_against_the_cpp(tmp_path):
    from parplan.bench.speed import RECORDED_CPP_MS, run

    table = run(tmp_path, quick=True)
    dp = table[table.what.str.startswith("DP")]
    assert len(dp) == 4 and (dp.ratio > 0).all()  # the planner's DP, and the C++'s DP loop alone
    assert all(
        math.isclose(
            r.ratio, r.parplan_ms / RECORDED_CPP_MS[(r.model, r.what.split("(")[1].split(",")[0])]
        )
        for r in dp.itertuples()
    )
    assert sorted(table.what[table.what.str.startswith("DP loop only")]) == [
        "DP loop only (accpar, 7 levels)",
        "DP loop only (hypar, 7 levels)",
    ]
    rules = table[table.what.str.startswith("C++ rules")]
    assert len(rules) == 2 and (rules.ratio > 0).all()
    md = (tmp_path / "speed.md").read_text()
    assert md.startswith("# Planner speed") and "`C++ rules` does exactly the C++'s work" in md
    assert "`DP loop only` times the C++'s DP recursion alone" in md
    # whole processes are timed by their own CPU time and peak memory, and all finished
    procs = table[table.cpp_ms.isna()]
    assert list(procs.what) == ["parplan --help (process)", "README first plan (process)"]
    assert (procs.parplan_ms > 0).all() and (procs.peak_gib > 0).all() and procs.finished.all()
    assert (procs.status == "ok").all()


def test_speed_summarises_a_sweep_of_every_torchvision_model():
    """``bench speed --vision all``: the write-up counts the models within the goal and names
    the slower ones and the ones that did not plan."""
    import pandas as pd

    from parplan.bench.speed import _markdown

    rows = [
        ("resnet18 / h100:8", 3000.0, "ok", True, True),
        ("googlenet / h100:8", 7000.0, "ok", True, True),
        ("densenet201 / h100:8", 12000.0, "ok", True, False),
        (
            "swin_v2_t / h100:8",
            float("nan"),
            "failed: no | way. Supported operators: x",
            False,
            False,
        ),
    ]
    table = pd.DataFrame(
        [
            {
                "what": "torchvision model, whole process",
                "model": m,
                "parplan_ms": ms,
                "cpp_ms": float("nan"),
                "ratio": float("nan"),
                "goal": 10000.0,
                "peak_gib": 0.5,
                "finished": done,
                "status": status,
                "meets_goal": meets,
            }
            for m, ms, status, done, meets in rows
        ]
    ).astype({"finished": object})  # as run() leaves it, defaults filled in
    md = _markdown(table, "recorded")
    assert "| failed: no / way. |" in md  # the error up to the importer's list, no table break
    assert (
        "Torchvision: 2 of 4 classification models plan on `h100:8` within 10 s of CPU, import "
        "included; slower: densenet201 / h100:8; not planned: swin_v2_t / h100:8." in md
    )


def test_geomean_leaves_out_non_positive_values():
    from parplan.bench.common import geomean

    assert geomean([0.0, 4.0, 1.0, float("nan")]) == pytest.approx(2.0)
    assert math.isnan(geomean([0.0, -1.0]))


def test_pipeline_quick(tmp_path):
    from parplan.bench import pipeline

    table = pipeline.run(tmp_path, quick=True, executor=SERIAL)
    csv = _outputs(tmp_path, "pipeline")
    _has_columns(
        csv,
        [
            "profile",
            "machine",
            "devices",
            "plan",
            "stages",
            "code_s",
            "parplan_s",
            "code_speedup_vs_dp",
            "parplan_speedup_vs_dp",
            "code_dp_s",
            "parplan_dp_s",
        ],
    )
    assert len(table) == 2 * len(pipeline.QUICK["profiles"]) * len(pipeline.QUICK["machines"])
    code, mine = table[table.plan == "pipedream-code"], table[table.plan == "parplan"]
    # each model's own plan is the best under that model (chains: every plan is priced by both)
    assert (code.code_s.values <= mine.code_s.values * (1 + 1e-12)).all()
    assert (mine.parplan_s.values <= code.parplan_s.values * (1 + 1e-12)).all()
    # the optimizer's printed VGG-16 speedup on 4 machines at 1 GB/s
    row = code[(code.profile == "vgg16") & (code.machine == "4 @ 1 GB/s")].iloc[0]
    assert row.code_speedup_vs_dp == pytest.approx(3.3187143555086274, rel=1e-12)
    assert "released optimizer's plans next to parplan's" in (tmp_path / "pipeline.md").read_text()


def test_bound_quick(tmp_path):
    from parplan.bench import bound

    table = bound.run(tmp_path, quick=True, executor=SERIAL)
    csv = _outputs(tmp_path, "bound")
    _has_columns(
        csv,
        [
            "model",
            "array",
            "accpar_step_s",
            "best_step_s",
            "bound_s",
            "gap",
            "root_gap",
            "meets_goal",
            "top_excess_layer",
            "top_excess_share",
        ],
    )
    assert len(table) == len(bound.QUICK["models"]) * len(bound.QUICK["arrays"])
    assert (table.bound_s <= table.best_step_s * (1 + 1e-9)).all() and (table.gap >= 0).all()
    assert (table.best_step_s <= table.accpar_step_s).all()
    assert "how far from optimal" in (tmp_path / "bound.md").read_text()
    # the layer named furthest above its own bound, recomputed from the evaluator and the bound
    from parplan.costmodel.evaluate import evaluate
    from parplan.costmodel.hardware import parse_array
    from parplan.costmodel.problem import Problem
    from parplan.models.zoo import get_model
    from parplan.solvers.bound import hierarchy_bound
    from parplan.solvers.planners import make_plan

    row = table.iloc[0]
    p = Problem(get_model(row["model"]), parse_array(row["array"]), batch=int(row["batch"]))
    times = evaluate(p, make_plan(p, "accpar")).node_time_s
    excess = {
        n.name: max(0.0, t - b)
        for n, t, b in zip(p.planning.nodes, times, hierarchy_bound(p).node_s)
    }
    assert row["top_excess_layer"] == max(excess, key=excess.get)
    assert row["top_excess_share"] == pytest.approx(
        max(excess.values()) / sum(excess.values()), rel=1e-9
    )
    # the excess split in two: the plan's states and the transfers between layers add up to it
    assert (table.states_excess_s >= 0).all() and (table.transfers_excess_s >= 0).all()
    assert (table.states_excess_s + table.transfers_excess_s).tolist() == pytest.approx(
        (table.accpar_step_s - table.per_node_bound_s).tolist(), rel=1e-9
    )
    assert "excess: states / transfers / charged" in (tmp_path / "bound.md").read_text()


def test_bound_priced_as_the_cli(tmp_path, capsys):
    """``--pricing cli``: the bound benchmark priced as ``parplan plan --bound`` is by default
    (the devices' own fabric, overlap), written beside the papers' setting as bound_cli.*; its
    plan is the CLI's plan and its bound is ``plan --bound``'s."""
    from parplan.bench import bound
    from parplan.cli import main

    table = bound.run(
        tmp_path, quick=True, executor=SERIAL, models=("lenet",), arrays=("h100:4",), pricing="cli"
    )
    _outputs(tmp_path, "bound_cli")
    assert not (tmp_path / "bound.csv").exists()
    assert "Priced as `parplan plan --bound`" in (tmp_path / "bound_cli.md").read_text()
    capsys.readouterr()
    argv = ["plan", "--model", "lenet", "--array", "h100:4", "--batch", "64", "--bound"]
    assert main([*argv, "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    row = table.iloc[0]
    assert row["accpar_step_s"] == pytest.approx(shown["step_time_s"], rel=1e-12)
    assert row["bound_s"] == pytest.approx(shown["global_bound_s"], rel=1e-12)
    assert row["bound_s"] <= row["best_step_s"] * (1 + 1e-9)
    with pytest.raises(ValueError, match="pricing must be one of papers, cli"):
        bound.run(tmp_path, quick=True, executor=SERIAL, pricing="paper")


def test_joint_quick(tmp_path):
    from parplan.bench import joint

    table = joint.run(tmp_path, quick=True, executor=SERIAL)
    csv = _outputs(tmp_path, "joint")
    _has_columns(
        csv,
        [
            "model",
            "array",
            "shares",
            "accpar_step_s",
            "status",
            "joint_step_s",
            "joint_bound_s",
            "global_bound_s",
            "dp_over_joint",
            "joint_over_bound",
            "portfolio_step_s",
            "portfolio_over_joint",
        ],
    )
    assert len(table) == len(joint.QUICK["models"]) * len(joint.QUICK["arrays"])
    # the portfolio tries the top-down DP first, and no plan beats the global bound
    assert (table.portfolio_step_s <= table.accpar_step_s * (1 + 1e-12)).all()
    assert (table.global_bound_s <= table.portfolio_step_s * (1 + 1e-9)).all()
    assert (table.status == "optimal").all()
    # the joint optimum (started from the DP plan) is no slower than it, and no faster than either bound
    assert (table.joint_step_s <= table.accpar_step_s * (1 + 1e-9)).all()
    assert (table.joint_bound_s <= table.joint_step_s * (1 + 1e-9)).all()
    assert (table.global_bound_s <= table.joint_step_s * (1 + 1e-9)).all()
    assert "Which side of the gap is slack" in (tmp_path / "joint.md").read_text()
    # the model's size by depth: the cells built, and fewer with equal frames shared
    sizes = pd.read_csv(tmp_path / "joint_size.csv")
    assert list(sizes.depth) == [0, 1, 2] and list(sizes.cells_built) == [9, 81, 729]
    assert (sizes.frames_alternating <= sizes.cells_built).all()
    assert (sizes.frames_leftmost <= sizes.frames_alternating).all()
    assert (
        "## Why the joint model stops at 8-16 devices (lenet, `h100:8`"
        in (tmp_path / "joint.md").read_text()
    )


def test_a_worker_killed_by_the_system_is_reported_plainly():
    """A worker process that dies (the system kills it, e.g. for lack of memory) is reported as a
    parplan error naming the task and what to do, which the CLI prints without a traceback."""
    import os

    from parplan.bench.common import ExecutorSpec, Task, WorkerLost, run_tasks
    from parplan.errors import ParplanError

    with pytest.raises(
        WorkerLost, match="worker process died while running '(also )?dies'.*--workers 1"
    ) as info:
        run_tasks(
            "t",
            [Task("dies", os.abort), Task("also dies", os.abort)],
            ExecutorSpec("local", workers=2),
            log=None,
        )
    assert isinstance(info.value, ParplanError)


def test_memory_quick(tmp_path):
    from parplan.bench import memory

    table = memory.run(tmp_path, quick=True, executor=SERIAL)
    assert {"free_step_s", "fit_step_s", "fit_peak_gib", "zero_stage", "megatron_step_s"} <= set(
        table.columns
    )
    vgg = table[table.model == "vgg16"].iloc[0]
    # VGG-16 at batch 2048 does not fit two 32 GiB V100s with memory ignored; the default plan fits
    assert not vgg.free_fits and vgg.fit_peak_gib <= vgg.device_memory_gib
    assert vgg.fit_step_s >= vgg.free_step_s * (1 - 1e-12)  # fitting never comes for free here
    assert (tmp_path / "memory.md").read_text().startswith("# Plans that fit")
    assert (tmp_path / "memory.csv").exists() and (tmp_path / "memory.png").exists()


def test_calibration_quick(tmp_path):
    """The recorded H200 run: the calibrated kind predicts ResNet-50's measured step closer than
    the datasheet peak does."""
    pytest.importorskip("torch")
    from parplan.bench import calibration

    table = calibration.run(tmp_path, quick=True, executor=SERIAL)
    row = table.iloc[0]
    assert row.model == "tv:resnet50" and row.measured_ms > 0
    assert abs(row.calibrated_ratio - 1) < abs(row.datasheet_ratio - 1)
    assert math.isclose(
        row.calibrated_ms / row.datasheet_ms,
        row.calibrated_ratio / row.datasheet_ratio,
        rel_tol=1e-9,
    )
    md = (tmp_path / "calibration.md").read_text()
    assert md.startswith("# Calibrated devices") and "| linear | 24 |" in md
    # the memory section: ResNet-50's recorded activations, over-counted by the ReLU / input alias
    mem = pd.read_csv(tmp_path / "calibration_memory.csv")
    assert list(mem.model) == ["tv:resnet50"] and "## Memory of one training step" in md
    assert 1.3 < mem.activations_ratio.iloc[0] < 1.7
    assert math.isclose(
        mem.activations_model_gib.iloc[0] / mem.activations_measured_gib.iloc[0],
        mem.activations_ratio.iloc[0],
        rel_tol=1e-9,
    )


def test_calibration_bench_refuses_a_folder_without_measurements(tmp_path):
    from parplan.bench import calibration

    with pytest.raises(ConfigError, match="needs calibration.csv, steps.csv and one device file"):
        calibration.run(tmp_path, quick=True, executor=SERIAL, measured=str(tmp_path))


def test_stages_quick(tmp_path):
    from parplan.bench import stages

    table = stages.run(tmp_path, quick=True, executor=SERIAL)
    assert len(table) == len(stages.QUICK)
    row = table.iloc[0]
    # the joint plan fits its limit and is never slower than its special cases
    assert row.joint_peak_gib <= row.limit_gib
    assert row.joint_step_s <= row.one_stage_step_s and row.joint_step_s <= row.data_stages_step_s
    assert row.stages >= 1 and "Pipeline x partition" in (tmp_path / "stages.md").read_text()


def test_sweep_rows_carry_their_axes_and_failures(tmp_path, capsys):
    from parplan.bench.sweep import COLUMNS, sweep
    from parplan.cli import main

    t = sweep(
        ["lenet", "nope"],
        ["h100:2"],
        planners=["accpar", "data"],
        batches=[32, 64],
        bandwidths=[None, 5.0],
        executor=SERIAL,
        log=None,
    )
    assert list(t.columns) == list(COLUMNS) and len(t) == 2 * 2 * 2 * 2
    ok, bad = t[t.error.isna()], t[t.error.notna()]
    assert len(ok) == len(bad) == 8 and bad.error.str.contains("unknown model 'nope'").all()
    assert set(ok.bandwidth_gb_per_s.dropna()) == {5.0} and set(ok.batch) == {32, 64}
    # a slower link never makes the same plan faster; accpar never loses to data parallelism
    assert (ok.step_time_s <= ok.data_parallel_step_time_s * (1 + 1e-12)).all()
    out = tmp_path / "s.csv"
    assert (
        main(
            [
                "sweep",
                "--models",
                "lenet",
                "--arrays",
                "h100:2,h100:4",
                "--latencies",
                "1,10",
                "--executor",
                "serial",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    table = pd.read_csv(out)
    assert len(table) == 4 and set(table.latency_us) == {1.0, 10.0} and table.error.isna().all()
    with pytest.raises(ConfigError, match="unknown planner"):
        sweep(["lenet"], ["h100:2"], planners=["nope"], log=None)
    assert main(["sweep", "--models", "lenet", "--arrays", "h100:2", "--bandwidths", "x"]) == 2
    assert "comma-separated numbers" in capsys.readouterr().err


def test_plan_outputs_carry_the_inputs_they_ran_with(capsys):
    from parplan.cli import main

    assert (
        main(
            [
                "plan",
                "--model",
                "lenet",
                "--array",
                "h100:2",
                "--bandwidth",
                "10",
                "--latency",
                "3",
                "--format",
                "json",
            ]
        )
        == 0
    )
    inputs = json.loads(capsys.readouterr().out)["inputs"]
    assert (
        inputs["bandwidth_gb_per_s"] == 10
        and inputs["latency_us"] == 3
        and inputs["memory_limit"] == "device"
    )
    assert (
        main(
            [
                "plan",
                "--model",
                "lenet",
                "--array",
                "h100:2",
                "--bandwidth",
                "10",
                "--format",
                "csv",
            ]
        )
        == 0
    )
    frame = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert (frame.bandwidth_gb_per_s == 10).all() and (frame.array_source == "h100:2").all()


# --------------------------------------------------------------------------- validation (issue 31)


def test_validation_cases_are_published_runs_from_two_sources():
    """The shipped cases: at least 10 held out from at least 2 sources, each source cited in
    sources.toml and fitted on at least one case; every configuration makes a plan."""
    from parplan.bench import validate

    cases = validate.read_cases()
    sources = validate.read_sources()
    held = [c for c in cases if not c["fit"]]
    assert len(held) >= 10 and len({c["source"] for c in held}) >= 2
    for source in {c["source"] for c in cases}:
        assert sources[source]["where"].startswith("https://github.com/")
        assert any(c["fit"] for c in cases if c["source"] == source)
    # the 8B case as torchtitan ran it: 8,030,261,248 parameters, FSDP over 64 GPUs
    first = cases[0]
    assert validate.case_graph(first).parameter_count() == 8030261248
    assert first["gpus"] == 64 and first["zero"] == 3


def test_validate_quick_fits_one_case_and_reports_the_other(tmp_path):
    from parplan.bench import validate

    table = validate.run(tmp_path, quick=True, executor=SERIAL)
    csv = _outputs(tmp_path, "validate")
    _has_columns(
        csv,
        [
            "case",
            "source",
            "fit",
            "efficiency",
            "measured_tokens_per_s_per_gpu",
            "predicted_tokens_per_s_per_gpu",
            "ratio",
            "error",
            "datasheet_ratio",
            "step_s",
        ],
    )
    fitted, held = table[table.fit].iloc[0], table[~table.fit].iloc[0]
    assert fitted.ratio == pytest.approx(1.0, abs=1e-6)  # the fit reproduces its own case
    assert 0.3 < fitted.efficiency < 1.0  # an A100 reaches part of its datasheet peak
    # the held-out case is priced at the same efficiency, and its ratio is what the table says
    again = validate.predict(validate.read_cases()[2], fitted.efficiency)
    assert held.predicted_tokens_per_s_per_gpu == pytest.approx(again["tokens_per_s_per_gpu"])
    assert held.error == pytest.approx(held.ratio - 1)
    md = (tmp_path / "validate.md").read_text()
    assert "Held-out cases: 1 from 1 sources" in md and "torchtitan docs/performance.md" in md


def test_validate_refuses_unknown_cases_and_broken_files(tmp_path):
    from parplan.bench import validate

    with pytest.raises(ConfigError, match="unknown case\\(s\\) nope"):
        validate.run(tmp_path, cases=("nope",), executor=SERIAL)
    bad = tmp_path / "bad.csv"
    bad.write_text("case,source\nx,y\n")
    with pytest.raises(ConfigError, match="missing column\\(s\\) system, precision, model"):
        validate.read_cases(bad)
    good = (validate.resources.files("parplan") / validate.DATA / "published.csv").read_text()
    broken = tmp_path / "broken.csv"
    broken.write_text(good.replace(",64,bf16,llama,32,", ",sixty-four,bf16,llama,32,", 1))
    with pytest.raises(ConfigError, match="line 2: invalid literal for int"):
        validate.read_cases(broken)


@pytest.mark.slow
def test_validate_full_run_meets_issue_31s_goal(tmp_path):
    """Issue 31: median |error| <= 15% on the held-out published runs."""
    from parplan.bench import validate

    s = validate.summary(validate.run(tmp_path, executor=SERIAL))
    assert s["held_out"] >= 10 and s["sources"] >= 2 and s["median_abs_error"] <= 0.15
