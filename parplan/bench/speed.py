"""Planner speed against the published AccPar C++, and the CLI's start-up time.

- **Planners on the C++'s own work**: the C++'s AlexNet and VGG-11 network files (as layer
  tables, ``parplan/data/accpar_cpp/``), 7 levels = 128 devices, batch 512, communication
  objective, shares 1/2: parplan's HyPar (2 types) and AccPar (3 types) DP plans, best of
  ``repeats`` wall times, in-process; and the ``accpar`` portfolio (step-time objective, free
  shares) on the same problem.
- **The C++ on the same work**: built from a checkout of github.com/linghaosong/AccPar when
  ``--accpar-source DIR`` is given and ``g++`` is present (a timing driver of ours is compiled
  against its ``src/``; nothing of it is copied here); otherwise the figures recorded below.
- **The DP recursion alone**: the C++'s DP (``cpp_dp``) over the same 7 levels with its tables
  built beforehand: the floor of any DP written in Python.
- **CLI**: wall time of ``parplan --help`` and of the README's first plan, whole process.

Ratios are parplan / C++ (how many times slower). Goals (issue 14): DP within 10x, the
``accpar`` plan within 50x, ``--help`` under 0.2 s, the first plan under 0.5 s.

Writes ``speed.csv``, ``speed.png`` and ``speed.md``. Run: ``parplan bench speed --out DIR``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

from parplan.bench.common import grouped_bars, md_table, out_dir_path, standalone_main, write_outputs

NAME = "speed"
DATA = Path(__file__).resolve().parents[1] / "data" / "accpar_cpp"
MODELS = ("alexnet", "vgg11")
#: The C++'s time per 7-level plan (ms), measured on the 2-core CI machine with its Makefile's
#: -O3 (20,000 repetitions; h_partition with 2 and 3 types; nothing else running), 2026-11-24.
RECORDED_CPP_MS = {("alexnet", "hypar"): 0.0035, ("alexnet", "accpar"): 0.0033,
                   ("vgg11", "hypar"): 0.0040, ("vgg11", "accpar"): 0.0048}
GOALS = {"dp": 10.0, "portfolio": 50.0, "help_s": 0.2, "first_plan_s": 0.5}

_DRIVER = r"""
#include <chrono>
#include <cstdio>
#include "accpar.h"
#include "helper.h"
int main(int argc, char** argv) {
  Layer* L = NULL; int n = 0; const int H = 7; const int reps = atoi(argv[2]);
  parser(argv[1], 512, L, n);
  int** P = new int*[H]; for (int h = 0; h < H; ++h) P[h] = new int[n];
  double* c = new double[H];
  for (int types = 2; types <= 3; ++types) {
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) h_partition(H, n, L, P, c, types);
    auto t1 = std::chrono::steady_clock::now();
    printf("%d %.9f\n", types, std::chrono::duration<double, std::milli>(t1 - t0).count() / reps);
  }
}
"""


def cpp_times(source: Path | None, reps: int = 20000) -> tuple[dict, str]:
    """(ms per 7-level plan by (model, hypar|accpar), where the figures come from)."""
    compiler = shutil.which("g++")
    if source is None or compiler is None or not (source / "src" / "accpar.cpp").is_file():
        why = "no --accpar-source" if source is None else ("no g++" if compiler is None else f"no src/ in {source}")
        return dict(RECORDED_CPP_MS), f"recorded figures ({why})"
    with tempfile.TemporaryDirectory() as tmp:
        driver = Path(tmp) / "driver.cpp"
        driver.write_text(_DRIVER)
        exe = Path(tmp) / "driver"
        subprocess.run([compiler, "-O3", "-w", "-I", str(source / "include"), str(driver),
                        str(source / "src" / "accpar.cpp"), str(source / "src" / "helper.cpp"), "-o", str(exe)],
                       check=True, capture_output=True)
        out = {}
        files = {"alexnet": "Alexnet.txt", "vgg11": "Vgg11.txt"}
        for model, file in files.items():
            res = subprocess.run([str(exe), str(source / "networks" / file), str(reps)], check=True,
                                 capture_output=True, text=True)
            for line in res.stdout.split("\n"):
                if line.strip():
                    types, ms = line.split()
                    out[(model, "hypar" if types == "2" else "accpar")] = float(ms)
    return out, f"built from {source} with {compiler} -O3"


def _best(fn, repeats: int) -> float:
    """Best wall time of ``fn`` over ``repeats`` runs, each with an empty memo of node terms (as
    a fresh ``parplan plan``: a warm memo would price nothing at all)."""
    from parplan.costmodel.split import clear_memo

    fn()  # warm caches (imports, planning graph)
    times = []
    for _ in range(repeats):
        clear_memo()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _dp_loop_seconds(problem, planner: str, repeats: int) -> float:
    """Best wall time of the C++'s DP recursion alone (:func:`parplan.solvers.accpar_code.cpp_dp`,
    pure Python) over the 7 levels of ``problem`` (compat ``accpar-code``), its tables built
    beforehand: what the DP costs in Python when pricing is free."""
    from parplan.solvers.accpar_code import cpp_dp, cpp_tables, cpp_view, solve_split_cpp
    from parplan.solvers.hierarchy import plan_top_down
    from parplan.solvers.planners import planner_options

    options = planner_options(planner, objective="communication", shares="half")
    work = []

    def record(sp):  # the splits the planner solves, and the C++'s tables of each
        view = cpp_view(sp.planning)
        _, intra, inter, short = cpp_tables(sp, view, options)
        work.append((intra, inter, view.shortcuts, short))
        return solve_split_cpp(sp, options)[0]

    plan_top_down(problem, record, planner)
    times = []
    for _ in range(max(repeats, 20)):
        t0 = time.perf_counter()
        for args in work:
            cpp_dp(*args)
        times.append(time.perf_counter() - t0)
    return min(times)


def _process_seconds(argv: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "parplan.cli", *argv], check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return min(times)


def run(out_dir: str | Path, quick: bool = False, executor=None, accpar_source: str | None = None,
        repeats: int = 5) -> pd.DataFrame:
    """Time the planners and the CLI; write speed.csv / .png / .md (``executor`` is unused: timings
    run serially in this process). Columns: what, model,
    parplan_ms, cpp_ms, ratio, goal."""
    from parplan.bench.common import BENCH_FABRIC
    from parplan.costmodel.hardware import parse_array
    from parplan.costmodel.problem import Problem
    from parplan.models.modelfile import load_layer_table
    from parplan.solvers.planners import make_plan

    out = out_dir_path(out_dir)
    repeats = 1 if quick else repeats
    cpp, source = cpp_times(Path(accpar_source) if accpar_source else None, reps=200 if quick else 20000)
    rows = []
    for model in MODELS[:1] if quick else MODELS:
        problem = Problem(load_layer_table(DATA / f"{model}.csv"), parse_array("h100:128", fabric=BENCH_FABRIC), batch=512)
        compat = replace(problem, compat="accpar-code")
        for planner, key in (("hypar", "hypar"), ("accpar-topdown", "accpar")):
            s = _best(lambda: make_plan(problem, planner, objective="communication", shares="half"), repeats)
            rows.append({"what": f"DP ({key}, 7 levels)", "model": model, "parplan_ms": s * 1e3,
                         "cpp_ms": cpp[(model, key)], "goal": GOALS["dp"]})
            # the C++'s own rules and frames (--compat accpar-code): exactly the C++'s work
            s = _best(lambda: make_plan(compat, planner, objective="communication", shares="half"), repeats)
            rows.append({"what": f"C++ rules ({key}, 7 levels)", "model": model, "parplan_ms": s * 1e3,
                         "cpp_ms": cpp[(model, key)], "goal": GOALS["dp"]})
            # the C++'s DP recursion alone in Python, its tables built beforehand: the floor
            s = _dp_loop_seconds(compat, planner, repeats)
            rows.append({"what": f"DP loop only ({key}, 7 levels)", "model": model, "parplan_ms": s * 1e3,
                         "cpp_ms": cpp[(model, key)], "goal": GOALS["dp"]})
        if not quick:  # the portfolio takes seconds per model
            s = _best(lambda: make_plan(problem, "accpar"), 1)
            rows.append({"what": "accpar portfolio (7 levels)", "model": model, "parplan_ms": s * 1e3,
                         "cpp_ms": cpp[(model, "accpar")], "goal": GOALS["portfolio"]})
    n = 1 if quick else 3
    rows.append({"what": "parplan --help (process)", "model": "-",
                 "parplan_ms": _process_seconds(["--help"], n) * 1e3, "cpp_ms": float("nan"),
                 "goal": GOALS["help_s"] * 1e3})
    if not quick:
        rows.append({"what": "README first plan (process)", "model": "vgg16",
                     "parplan_ms": _process_seconds(["plan", "--model", "vgg16", "--array", "tpu-v2:2,tpu-v3:2",
                                                     "--planner", "accpar"], n) * 1e3,
                     "cpp_ms": float("nan"), "goal": GOALS["first_plan_s"] * 1e3})
    table = pd.DataFrame(rows)
    table["ratio"] = table.parplan_ms / table.cpp_ms
    table["meets_goal"] = [(r.ratio <= r.goal) if r.cpp_ms == r.cpp_ms else (r.parplan_ms <= r.goal)
                           for r in table.itertuples()]
    write_outputs(out, NAME, table, lambda p: _plot(table, p), _markdown(table, source))
    return table


def _plot(table: pd.DataFrame, path: Path) -> None:
    ratios = table[table.cpp_ms.notna()].copy()
    ratios["label"] = ratios.what + " " + ratios.model
    grouped_bars(path, [("parplan time / AccPar C++ time (log)", ratios)], "label", {"ratio": "ratio"},
                 "times slower than the C++", log_y=True)


def _markdown(table: pd.DataFrame, source: str) -> str:
    from parplan.solvers.planners import PORTFOLIO, SPREAD_MAX_LEVELS

    lines = ["# Planner speed against the published AccPar C++", "",
             "Same work as the C++ (its AlexNet and VGG-11, 7 levels = 128 devices, batch 512, communication "
             f"objective, shares 1/2); best wall time in-process, every run from an empty memo of node terms. C++ figures: {source}.", ""]
    lines += md_table(table, {"what": str, "model": str, "parplan_ms": ".4g", "cpp_ms": ".4g", "ratio": ".3g",
                              "goal": ".3g", "meets_goal": str},
                      headers={"parplan_ms": "parplan ms", "cpp_ms": "C++ ms", "ratio": "parplan / C++",
                               "goal": "goal (ratio, or ms)", "meets_goal": "meets goal"})
    dp = table[table.what.str.startswith("DP (")]
    loop = table[table.what.str.startswith("DP loop")]
    rules = table[table.what.str.startswith("C++ rules")]
    lines += ["", f"The DP is {dp.ratio.min():.3g}x to {dp.ratio.max():.3g}x slower than the C++. With shares fixed at "
              "1/2 each node has 2 or 3 states, as in the C++; but the DP plans all 127 splits, not 7: sibling groups "
              "hold different parts of each tensor, so their sub-problems differ (only translated siblings share "
              "their priced terms, through the memo). The time goes to building, per split and in Python, "
              "each node's state table and its re-layout terms from the producer's layout and share to each "
              "consumer's (the region algebra of docs/costmodel.md section 3), where the C++ reads a 3x3 table. "
              f"The portfolio runs that recursion under up to {len(PORTFOLIO)} level criteria and then up to "
              f"{SPREAD_MAX_LEVELS} spread criteria with free shares (54 states per node at a grid of 16; the look-ahead "
              "and spread criteria also price each half by its own bound) and prices each whole plan. "
              "Goals not met are reported, not hidden.", ""]
    if len(rules):
        lines += [f"`C++ rules` does exactly the C++'s work (`--compat accpar-code`: every level in its own frame, so "
                  f"the 2^k groups of a level share one plan and only 7 splits are solved, with the C++'s DP, "
                  f"parplan/solvers/accpar_code.py): {rules.ratio.min():.3g}x to {rules.ratio.max():.3g}x slower than "
                  "the C++. Its costs still come from parplan's pricing code (state tables and re-layout terms per "
                  "node in Python), which is where the time goes.", ""]
    if len(loop):
        lines += [f"`DP loop only` times the C++'s DP recursion alone (parplan's `cpp_dp`, plain Python lists) over "
                  f"the 7 levels' tables, built beforehand: {loop.ratio.min():.3g}x to {loop.ratio.max():.3g}x the "
                  "C++'s whole plan, tables included. So a DP in CPython misses the 10x goal even if pricing cost "
                  "nothing: only compiled code for both the DP and the pricing could meet it (numba was measured: "
                  "importing it takes 0.24 s, so a numba kernel alone breaks the CLI's 0.5 s goal; "
                  "docs/architecture.md).", ""]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--accpar-source", default=None, metavar="DIR",
                        help="a checkout of github.com/linghaosong/AccPar to build and time (default: recorded figures)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per point, best kept (default 5)")


if __name__ == "__main__":
    sys.exit(standalone_main(__doc__, NAME, run, add_arguments))
