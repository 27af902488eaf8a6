"""Planner speed: issue 35's goals, and parplan against the published AccPar C++.

- **Planners on the C++'s own work**: the C++'s AlexNet and VGG-11 network files (as layer
  tables, ``parplan/data/accpar_cpp/``), 7 levels = 128 devices, batch 512, communication
  objective, shares 1/2: parplan's HyPar (2 types) and AccPar (3 types) DP plans, in-process;
  the same under the C++'s own rules (``--compat accpar-code``); and the ``accpar`` portfolio
  (step-time objective, free shares) on the same problem.
- **The C++ on the same work**: built from a checkout of github.com/linghaosong/AccPar when
  ``--accpar-source DIR`` is given and ``g++`` is present (a timing driver of ours is compiled
  against its ``src/``; nothing of it is copied here); otherwise the figures recorded below.
- **The DP recursion alone**: the C++'s DP (``cpp_dp``) over the same 7 levels with its tables
  built beforehand, in Python.
- **Whole processes** (:data:`GOAL_PLANS`): ``parplan --help``, the README's first plan, the
  default planner on ResNet-50 / ``h100:8`` and VGG-11 / ``h100:128``, a 4,096-layer chain on
  128 devices, Llama-3-70B on 512 and 1,024 H100s, and torchvision's GoogLeNet, Inception-v3
  and DenseNet-121 where torchvision is installed; each stopped after ``--timeout`` seconds.

Every figure is CPU time, best of ``repeats``, on both sides of a ratio (the C++ driver times
CPU too, best of 20 batches). Goals: issue 35's table (:data:`GOALS`, :data:`GOAL_PLANS`).

Writes ``speed.csv``, ``speed.png`` and ``speed.md``. Run: ``parplan bench speed --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

from parplan.bench.common import (
    grouped_bars,
    md_table,
    out_dir_path,
    standalone_main,
    write_outputs,
)

NAME = "speed"
DATA = Path(__file__).resolve().parents[1] / "data" / "accpar_cpp"
MODELS = ("alexnet", "vgg11")
#: The C++'s time per 7-level plan (ms), measured on the 2-core CI machine with its Makefile's
#: -O3 (20,000 repetitions; h_partition with 2 and 3 types; nothing else running), 2026-11-24,
#: as a mean of wall time; ``--accpar-source`` measures it as parplan is measured (CPU, best of N).
RECORDED_CPP_MS = {
    ("alexnet", "hypar"): 0.0035,
    ("alexnet", "accpar"): 0.0033,
    ("vgg11", "hypar"): 0.0040,
    ("vgg11", "accpar"): 0.0048,
}
GOALS = {"dp": 10.0, "portfolio": 50.0, "help_s": 0.2, "first_plan_s": 0.3}

_DRIVER = r"""
#include <ctime>
#include <cstdio>
#include "accpar.h"
#include "helper.h"
// CPU time per plan, best of 20 batches (parplan's side is timed the same way)
int main(int argc, char** argv) {
  Layer* L = NULL; int n = 0; const int H = 7; const int reps = atoi(argv[2]);
  parser(argv[1], 512, L, n);
  int** P = new int*[H]; for (int h = 0; h < H; ++h) P[h] = new int[n];
  double* c = new double[H];
  const int batches = 20, per = reps / batches > 0 ? reps / batches : 1;
  for (int types = 2; types <= 3; ++types) {
    double best = 1e300;
    for (int b = 0; b < batches; ++b) {
      std::clock_t t0 = std::clock();
      for (int r = 0; r < per; ++r) h_partition(H, n, L, P, c, types);
      double ms = 1e3 * double(std::clock() - t0) / CLOCKS_PER_SEC / per;
      if (ms < best) best = ms;
    }
    printf("%d %.9f\n", types, best);
  }
}
"""


def cpp_times(source: Path | None, reps: int = 20000) -> tuple[dict, str]:
    """(ms per 7-level plan by (model, hypar|accpar), where the figures come from)."""
    compiler = shutil.which("g++")
    if source is None or compiler is None or not (source / "src" / "accpar.cpp").is_file():
        why = (
            "no --accpar-source"
            if source is None
            else ("no g++" if compiler is None else f"no src/ in {source}")
        )
        return dict(RECORDED_CPP_MS), f"recorded figures ({why})"
    with tempfile.TemporaryDirectory() as tmp:
        driver = Path(tmp) / "driver.cpp"
        driver.write_text(_DRIVER)
        exe = Path(tmp) / "driver"
        subprocess.run(
            [
                compiler,
                "-O3",
                "-w",
                "-I",
                str(source / "include"),
                str(driver),
                str(source / "src" / "accpar.cpp"),
                str(source / "src" / "helper.cpp"),
                "-o",
                str(exe),
            ],
            check=True,
            capture_output=True,
        )
        out = {}
        files = {"alexnet": "Alexnet.txt", "vgg11": "Vgg11.txt"}
        for model, file in files.items():
            res = subprocess.run(
                [str(exe), str(source / "networks" / file), str(reps)],
                check=True,
                capture_output=True,
                text=True,
            )
            for line in res.stdout.split("\n"):
                if line.strip():
                    types, ms = line.split()
                    out[(model, "hypar" if types == "2" else "accpar")] = float(ms)
    return out, f"built from {source} with {compiler} -O3"


def _best(fn, repeats: int) -> float:
    """Best CPU time (s, this process) of ``fn`` over ``repeats`` runs, each with an empty memo
    of node terms (as a fresh ``parplan plan``: a warm memo would price nothing at all). CPU
    time, not wall time, so a loaded machine does not inflate it; the C++ is timed the same way."""
    from parplan.costmodel.split import clear_memo

    fn()  # warm caches (imports, planning graph)
    times = []
    for _ in range(repeats):
        clear_memo()
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times)


def _dp_loop_seconds(problem, planner: str, repeats: int) -> float:
    """Best CPU time of the C++'s DP recursion alone (:func:`parplan.solvers.accpar_code.cpp_dp`,
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
        t0 = time.process_time()
        for args in work:
            cpp_dp(*args)
        times.append(time.process_time() - t0)
    return min(times)


#: Runs the CLI in a child process and reports its own CPU seconds and peak memory (KiB) on
#: its last stderr line.
_CHILD = """import json, resource, sys
from parplan.cli import main
try:
    rc = main(sys.argv[1:])
except SystemExit as exc:
    rc = exc.code
r = resource.getrusage(resource.RUSAGE_SELF)
peak = r.ru_maxrss  # KiB; on Linux it counts the parent's size at fork, so prefer this process's own
try:
    peak = int([x for x in open("/proc/self/status") if x.startswith("VmHWM:")][0].split()[1])
except (OSError, IndexError, ValueError):
    pass
sys.stderr.write("\\n@@" + json.dumps([r.ru_utime + r.ru_stime, peak]) + "\\n")
sys.exit(rc or 0)
"""


def _child_env() -> dict[str, str]:
    """The children's environment: Python's bytecode cache on (as an installed package runs;
    some environments turn it off with PYTHONDONTWRITEBYTECODE, and then every run compiles
    parplan's sources again, about 0.1 s)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _compile_package() -> None:
    """parplan's bytecode, written once before the whole-process rows (``compileall``)."""
    import parplan

    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", os.path.dirname(parplan.__file__)],
        capture_output=True,
        env=_child_env(),
    )


def _process(
    argv: list[str], repeats: int, timeout_s: float | None = None
) -> tuple[float, float, str]:
    """(best CPU seconds, peak memory in GiB, status) of ``parplan ARGV`` as a whole process,
    over ``repeats`` runs. Status "ok"; "stopped" for a run past ``timeout_s`` (wall; its CPU
    figure is the wall time it had, a lower bound); "failed: ..." with the end of its error."""
    best, peak = float("inf"), 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        try:
            res = subprocess.run(
                [sys.executable, "-c", _CHILD, *argv],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env=_child_env(),
            )
        except subprocess.TimeoutExpired:
            return time.perf_counter() - t0, float("nan"), "stopped"
        line = [x for x in res.stderr.split("\n") if x.startswith("@@")]
        if res.returncode != 0 or not line or "Traceback" in res.stderr:
            last = [
                x for x in res.stderr.strip().split("\n") if x.strip() and not x.startswith("@@")
            ]
            return (
                float("nan"),
                float("nan"),
                "failed: " + (last[-1].strip() if last else f"exit {res.returncode}"),
            )
        cpu, rss_kib = json.loads(line[-1][2:])
        best, peak = min(best, cpu), max(peak, rss_kib / 2**20)
    return best, peak, "ok"


#: Problems of issue 35's goal table, as ``parplan plan`` arguments: (what, model, argv, goal
#: in ms, whether the quick run includes it).
GOAL_PLANS = (
    (
        "default accpar, whole process",
        "resnet50 / h100:8",
        ["plan", "--model", "resnet50", "--array", "h100:8", "--batch", "64"],
        100.0,
        False,
    ),
    (
        "default accpar, whole process",
        "vgg11 / h100:128",
        ["plan", "--model", "vgg11", "--array", "h100:128", "--batch", "64"],
        500.0,
        False,
    ),
    ("4,096-layer chain, whole process", "chain-4096 / h100:128", None, 5000.0, False),
    (
        "llama3-70b, whole process",
        "llama3-70b / h100:512",
        ["plan", "--model", "llama3-70b", "--array", "h100:512", "--batch", "512"],
        10000.0,
        False,
    ),
    (
        "llama3-70b, whole process",
        "llama3-70b / h100:1024",
        ["plan", "--model", "llama3-70b", "--array", "h100:1024", "--batch", "1024"],
        30000.0,
        False,
    ),
)
#: torchvision models of the goal table (timed where torchvision is installed).
VISION_GOAL = ("googlenet", "inception_v3", "densenet121")


def _chain_argv(tmp: Path) -> list[str]:
    """``parplan plan`` of scaling's 4,096-layer synthetic chain on 128 devices (as a model file)."""
    from parplan.bench.scaling import synthetic_chain

    g = synthetic_chain(4096)
    layers = []
    for layer in g.layers:
        kind = type(layer).__name__
        if kind == "Conv2d":
            layers.append(
                {
                    "name": layer.name,
                    "type": "conv",
                    "out_channels": layer.out_channels,
                    "kernel": 3,
                    "padding": 1,
                }
            )
        elif kind == "Linear":
            layers.append(
                {"name": layer.name, "type": "linear", "out_features": layer.out_features}
            )
        else:
            layers.append(
                {"name": layer.name, "type": "relu" if kind == "Activation" else "flatten"}
            )
    path = tmp / "chain-4096.json"
    path.write_text(
        json.dumps(
            {
                "name": g.name,
                "input": [g.input_shape.channels, g.input_shape.height, g.input_shape.width],
                "layers": layers,
            }
        )
    )
    return ["plan", "--model", str(path), "--array", "h100:128", "--batch", "64"]


def run(
    out_dir: str | Path,
    quick: bool = False,
    executor=None,
    accpar_source: str | None = None,
    repeats: int = 5,
    timeout_s: float = 900.0,
    vision: str = "hard",
) -> pd.DataFrame:
    """Time the planners and the CLI; write speed.csv / .png / .md (``executor`` is unused: timings
    run serially). Every figure is CPU time (in-process: ``time.process_time``; whole processes:
    the child's own user + system time), best of ``repeats``, on both sides of a ratio.
    ``vision``: the torchvision models timed where torchvision is installed, "hard" (the
    multi-branch ones of the goal table, :data:`VISION_GOAL`) or "all" (every classification
    model torchvision lists). Columns: what, model, parplan_ms, cpp_ms, ratio, goal, peak_gib,
    finished, meets_goal."""
    from parplan.bench.common import BENCH_FABRIC
    from parplan.costmodel.hardware import parse_array
    from parplan.costmodel.problem import Problem
    from parplan.models.modelfile import load_layer_table
    from parplan.solvers.planners import make_plan

    out = out_dir_path(out_dir)
    repeats = 1 if quick else repeats
    cpp, source = cpp_times(
        Path(accpar_source) if accpar_source else None, reps=200 if quick else 20000
    )
    rows = []
    nan = float("nan")
    for model in MODELS[:1] if quick else MODELS:
        problem = Problem(
            load_layer_table(DATA / f"{model}.csv"),
            parse_array("h100:128", fabric=BENCH_FABRIC),
            batch=512,
        )
        compat = replace(problem, compat="accpar-code")
        for planner, key in (("hypar", "hypar"), ("accpar-topdown", "accpar")):
            s = _best(
                lambda: make_plan(problem, planner, objective="communication", shares="half"),
                repeats,
            )
            rows.append(
                {
                    "what": f"DP ({key}, 7 levels)",
                    "model": model,
                    "parplan_ms": s * 1e3,
                    "cpp_ms": cpp[(model, key)],
                    "goal": GOALS["dp"],
                }
            )
            # the C++'s own rules and frames (--compat accpar-code): exactly the C++'s work
            s = _best(
                lambda: make_plan(compat, planner, objective="communication", shares="half"),
                repeats,
            )
            rows.append(
                {
                    "what": f"C++ rules ({key}, 7 levels)",
                    "model": model,
                    "parplan_ms": s * 1e3,
                    "cpp_ms": cpp[(model, key)],
                    "goal": GOALS["dp"],
                }
            )
            # the C++'s DP recursion alone in Python, its tables built beforehand: the floor
            s = _dp_loop_seconds(compat, planner, repeats)
            rows.append(
                {
                    "what": f"DP loop only ({key}, 7 levels)",
                    "model": model,
                    "parplan_ms": s * 1e3,
                    "cpp_ms": cpp[(model, key)],
                    "goal": GOALS["dp"],
                }
            )
        if not quick:  # the portfolio takes seconds per model
            s = _best(lambda: make_plan(problem, "accpar"), 1)
            rows.append(
                {
                    "what": "accpar portfolio (7 levels)",
                    "model": model,
                    "parplan_ms": s * 1e3,
                    "cpp_ms": cpp[(model, "accpar")],
                    "goal": GOALS["portfolio"],
                }
            )
    n = 1 if quick else 3
    _compile_package()

    def whole(what: str, model: str, argv: list[str], goal_ms: float, runs: int) -> None:
        cpu, peak, status = _process(argv, runs, timeout_s)
        rows.append(
            {
                "what": what,
                "model": model,
                "parplan_ms": cpu * 1e3,
                "cpp_ms": nan,
                "goal": goal_ms,
                "peak_gib": peak,
                "finished": status == "ok",
                "status": status,
            }
        )

    whole("parplan --help (process)", "-", ["--help"], GOALS["help_s"] * 1e3, n)
    whole(
        "README first plan (process)",
        "vgg16",
        ["plan", "--model", "vgg16", "--array", "tpu-v2:2,tpu-v3:2", "--planner", "accpar"],
        GOALS["first_plan_s"] * 1e3,
        n,
    )
    if not quick:
        with tempfile.TemporaryDirectory() as tmp:
            for what, model, argv, goal, _ in GOAL_PLANS:
                whole(what, model, argv if argv is not None else _chain_argv(Path(tmp)), goal, 1)
        if _has_torchvision():
            for name in VISION_GOAL if vision == "hard" else _vision_models():
                whole(
                    "torchvision model, whole process",
                    f"{name} / h100:8",
                    ["plan", "--model", f"tv:{name}", "--array", "h100:8", "--batch", "64"],
                    10000.0,
                    1,
                )
    table = pd.DataFrame(rows)
    for col, default in (("peak_gib", nan), ("finished", True), ("status", "ok")):
        if col not in table:
            table[col] = default
        elif col != "peak_gib":
            table[col] = table[col].where(table[col].notna(), default)
    table["ratio"] = table.parplan_ms / table.cpp_ms
    table["meets_goal"] = [
        bool(r.finished)
        and ((r.ratio <= r.goal) if r.cpp_ms == r.cpp_ms else (r.parplan_ms <= r.goal))
        for r in table.itertuples()
    ]
    write_outputs(out, NAME, table, lambda p: _plot(table, p), _markdown(table, source))
    return table


def _vision_models() -> list[str]:
    """Every classification model torchvision lists."""
    from parplan.models.importers.hub import import_torchvision

    tv = import_torchvision()
    return sorted(tv.models.list_models(tv.models))


def _has_torchvision() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchvision") is not None


def _plot(table: pd.DataFrame, path: Path) -> None:
    ratios = table[table.cpp_ms.notna()].copy()
    ratios["label"] = ratios.what + " " + ratios.model
    grouped_bars(
        path,
        [("parplan time / AccPar C++ time (log)", ratios)],
        "label",
        {"ratio": "ratio"},
        "times slower than the C++",
        log_y=True,
    )


def _markdown(table: pd.DataFrame, source: str) -> str:
    lines = [
        "# Planner speed",
        "",
        "Issue 35's goals, and planners against the published AccPar C++ on its own work (its AlexNet and "
        "VGG-11, 7 levels = 128 devices, batch 512, communication objective, shares 1/2). Every figure is CPU "
        "time, best of N on both sides of a ratio: in-process runs start from an empty memo of node terms; "
        "whole processes are timed by the child's own user + system time, with its peak memory, parplan's "
        "bytecode compiled beforehand as an installed package's is. C++ figures: "
        f"{source}.",
        "",
    ]
    shown = table.assign(
        parplan_ms=[
            f"{r.parplan_ms:.4g}"
            if r.status == "ok"
            else (f"> {r.parplan_ms:.4g} (stopped)" if r.status == "stopped" else _short(r.status))
            for r in table.itertuples()
        ]
    )
    lines += md_table(
        shown,
        {
            "what": str,
            "model": str,
            "parplan_ms": str,
            "cpp_ms": ".4g",
            "ratio": ".3g",
            "goal": ".3g",
            "peak_gib": ".3g",
            "meets_goal": str,
        },
        headers={
            "parplan_ms": "parplan CPU ms",
            "cpp_ms": "C++ CPU ms",
            "ratio": "parplan / C++",
            "goal": "goal (ratio, or ms)",
            "peak_gib": "peak GiB",
            "meets_goal": "meets goal",
        },
    )
    vision = table[table.what == "torchvision model, whole process"]
    if len(vision) > len(VISION_GOAL):
        failed = vision[vision.status != "ok"]
        slow = vision[(vision.status == "ok") & ~vision.meets_goal]
        lines += [
            "",
            f"Torchvision: {int(vision.meets_goal.sum())} of {len(vision)} classification models plan "
            f"on `h100:8` within {vision.goal.iloc[0] / 1e3:.3g} s of CPU, import included"
            + (f"; slower: {', '.join(slow.model)}" if len(slow) else "")
            + (f"; not planned: {', '.join(failed.model)}" if len(failed) else "")
            + ".",
        ]
    dp = table[table.what.str.startswith("DP (")]
    loop = table[table.what.str.startswith("DP loop")]
    rules = table[table.what.str.startswith("C++ rules")]
    lines += [
        "",
        "Pricing (re-layout amounts, receive times, factor values, state tables' compute and memory), "
        "the DP's elimination step and the per-node bound recursion run in the compiled core "
        "(docs/architecture.md, \"The compiled core\"); the hierarchy's per-level loop, building each split's "
        "problem, the memo keys, the evaluator's re-pricing of candidate plans and the memory search are still "
        "Python. "
        f"The DP is {dp.ratio.min():.3g}x to {dp.ratio.max():.3g}x the C++: it plans all 127 splits, not 7 "
        "(sibling groups hold different parts of each tensor; only translated siblings share their priced "
        "terms). Goals not met are reported, not hidden.",
        "",
    ]
    if len(rules):
        lines += [
            f"`C++ rules` does exactly the C++'s work (`--compat accpar-code`: every level in its own frame, so "
            f"the 2^k groups of a level share one plan and only 7 splits are solved, with the C++'s DP, "
            f"parplan/solvers/accpar_code.py): {rules.ratio.min():.3g}x to {rules.ratio.max():.3g}x the C++.",
            "",
        ]
    if len(loop):
        lines += [
            f"`DP loop only` times the C++'s DP recursion alone in Python (parplan's `cpp_dp`, plain lists) "
            f"over the 7 levels' tables, built beforehand: {loop.ratio.min():.3g}x to {loop.ratio.max():.3g}x "
            "the C++'s whole plan.",
            "",
        ]
    return "\n".join(lines)


def _short(status: str, limit: int = 400) -> str:
    """A failed run's error as a table cell: up to the importer's list of what it supports,
    at most ``limit`` characters."""
    text = status.split(" Supported operators:")[0].replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--accpar-source",
        default=None,
        metavar="DIR",
        help="a checkout of github.com/linghaosong/AccPar to build and time (default: recorded figures)",
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed runs per point, best kept (default 5)"
    )
    parser.add_argument(
        "--timeout",
        dest="timeout_s",
        type=float,
        default=900.0,
        help="stop a whole-process goal run after this many seconds (default 900)",
    )
    parser.add_argument(
        "--vision",
        choices=("hard", "all"),
        default="hard",
        help="torchvision models to time: the multi-branch ones of the goal table (default) or "
        "every classification model",
    )


if __name__ == "__main__":
    sys.exit(standalone_main(__doc__, NAME, run, add_arguments))
