"""What every CLI subcommand shares: the problem options, progress lines, memory limits.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="parplan")
    >>> add_problem_arguments(parser)
    >>> args = parser.parse_args(["--model", "lenet", "--array", "h100:2"])
    >>> problem_from_args(args).array.count, problem_source(args).model
    (2, 'lenet')
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from pathlib import Path

from parplan.errors import ConfigError

#: ``--compat`` values: the published rules of ``costmodel.cost.COMPAT_RULES``, alone or both
#: (kept here as text so that the CLI starts without importing the cost model).
COMPAT_CHOICES = ("hypar", "accpar-code", "hypar+accpar-code")

GB = 1e9
GIB = 2**30
#: ``--precision`` -> (bytes per element, optimizer bytes per parameter), docs/costmodel.md
#: section 6: mixed precision keeps an fp32 master copy and Adam's two fp32 moments.
PRECISIONS = {"bf16": (2.0, 12.0), "fp16": (2.0, 12.0), "fp32": (4.0, 8.0)}
#: The planners' names for help texts, without importing the planners (the CLI's --help stays
#: fast); tests/test_cli.py checks it equals parplan.solvers.planners.PLANNERS.
PLANNER_NAMES = ("accpar", "accpar-topdown", "hypar", "owt", "data", "data-half", "model")


def add_problem_arguments(parser: argparse.ArgumentParser, model_required: bool = True) -> None:
    """--model, --array, --batch, --bandwidth, --latency, --bytes-per-element, --devices."""
    parser.add_argument(
        "--model",
        required=model_required,
        help="zoo name (see 'parplan models'), a model file (.toml/.json/.csv), an .onnx file, "
        "file.py:factory returning a Graph or (nn.Module, input shape), "
        "hf:<model type>[,key=value,...,seq=N] (Hugging Face) or tv:<name> (torchvision)",
    )
    parser.add_argument(
        "--array",
        required=True,
        help="accelerator array, e.g. 'h100:8' or 'tpu-v2:4,tpu-v3:4' or a tree file",
    )
    parser.add_argument("--batch", type=int, default=512, help="global batch size (default 512)")
    parser.add_argument(
        "--bandwidth",
        type=float,
        default=None,
        metavar="GB/s",
        help="override every link's per-direction bandwidth (GB/s; default: device data)",
    )
    parser.add_argument(
        "--latency",
        type=float,
        default=None,
        metavar="us",
        help="override every link's latency (microseconds)",
    )
    parser.add_argument(
        "--fabric",
        default=None,
        choices=("devices", "papers"),
        help="links between groups: 'devices' (default) as the device kinds' fabric gives them "
        "(a node's NVSwitch: a port per device; InfiniBand rails between nodes), 'papers' one "
        "link per split as AccPar and HyPar price it (the default under --compat; "
        "docs/costmodel.md section 4)",
    )
    parser.add_argument(
        "--overlap",
        default=None,
        choices=("yes", "no"),
        help="weight traffic (gradient exchange, ZeRO-3 gathers) runs alongside compute, as DDP and "
        "FSDP run it (docs/costmodel.md section 4.2). Default yes; no under --compat (the papers)",
    )
    parser.add_argument(
        "--precision",
        default=None,
        choices=tuple(PRECISIONS),
        help="training precision: bf16 / fp16 (2-byte weights, gradients, activations; fp32 master "
        "weights and Adam moments: 12 optimizer bytes per parameter) or fp32 (4 bytes; Adam's "
        "two moments: 8). Default bf16 (docs/costmodel.md section 6)",
    )
    parser.add_argument(
        "--bytes-per-element",
        type=float,
        default=None,
        help="bytes per tensor element (default: the precision's, 2 for bf16)",
    )
    parser.add_argument(
        "--devices",
        default=None,
        metavar="FILE",
        help="extra device kinds (TOML, same shape as the built-in devices.toml)",
    )
    parser.add_argument(
        "--optimizer-bytes",
        type=float,
        default=None,
        metavar="B",
        help="optimizer state per parameter in bytes (default: the precision's, 12 for bf16: Adam "
        "with an fp32 master copy)",
    )
    parser.add_argument(
        "--compat",
        default=None,
        choices=COMPAT_CHOICES,
        help="price with a published planner's rule where it differs from parplan's "
        "(hypar: IN reductions at the pooled size, as the HyPar paper; accpar-code: "
        "each split in its own frame, as the published AccPar code)",
    )
    parser.add_argument(
        "--share-grid",
        type=int,
        default=16,
        metavar="G",
        help="free shares are multiples of 1/G, plus the proportional share (default 16)",
    )
    parser.add_argument(
        "--zero",
        default=None,
        choices=("auto", "0", "1", "2", "3"),
        help="ZeRO stage: shard the optimizer state (1), and gradients (2), and weights (3) of "
        "data-parallel layers over their replicas (docs/costmodel.md section 6.1). Default: "
        "'auto' where a command plans against memory (the least stage that fits), else 0",
    )
    parser.add_argument(
        "--recompute",
        default=None,
        choices=("auto", "yes", "no", "block", "layer"),
        help="activation recomputation: keep checkpoints and run forward again in backward "
        "(docs/costmodel.md section 6.3); 'block': what enters each block (transformer layer, "
        "residual block), 'layer': every layer's input, 'yes': both searched. Default: 'auto' "
        "where a command plans against memory, else no",
    )
    parser.add_argument(
        "--micro-batches",
        default=None,
        metavar="N|auto",
        help="micro-batches per step (gradient accumulation; docs/costmodel.md section 6.4). "
        "Default: 'auto' where a command plans against memory (powers of two up to 32), else 1",
    )


def problem_from_args(args: argparse.Namespace):
    """Build a :class:`parplan.costmodel.problem.Problem` from :func:`add_problem_arguments` args."""
    from parplan.costmodel.hardware import load_devices, parse_array
    from parplan.costmodel.problem import Problem
    from parplan.models.modelfile import load_model

    with still_running(f"importing {args.model}", import_hint(args.model)):
        graph = load_model(args.model)
    array = parse_array(
        args.array,
        bandwidth_bytes_per_s=None if args.bandwidth is None else args.bandwidth * GB,
        latency_s=None if args.latency is None else args.latency * 1e-6,
        devices=load_devices(args.devices),
        fabric=fabric_of(args),
    )
    chosen = technique_choices(
        args
    )  # "auto" (searched by the planning commands): the plain setting
    bpe, opt = PRECISIONS[getattr(args, "precision", None) or "bf16"]
    return Problem(
        graph,
        array,
        batch=args.batch,
        bytes_per_element=bpe if args.bytes_per_element is None else args.bytes_per_element,
        optimizer_bytes_per_param=opt if args.optimizer_bytes is None else args.optimizer_bytes,
        compat=getattr(args, "compat", None),
        zero_stage=0 if chosen["zero"] == "auto" else chosen["zero"],
        recompute=chosen["recompute"] in (True, "block", "layer"),
        checkpoint="layer" if chosen["recompute"] == "layer" else "block",
        micro_batches=1 if chosen["micro_batches"] == "auto" else chosen["micro_batches"],
        overlap=overlap_of(args),
    )


def data_parallel_baseline(problem):
    """The data-parallel plan's evaluation as reports read it (its step time, for the speedup):
    without per-split rows or device memory (on Llama-3-70B / ``h100:512`` the rows alone are
    245,000 tuples)."""
    from parplan.costmodel.evaluate import evaluate
    from parplan.solvers.planners import make_plan

    return evaluate(problem, make_plan(problem, "data"), rows=False, memory=False)


def overlap_of(args: argparse.Namespace) -> bool:
    """``--overlap``, or its default: on, except under ``--compat`` (the papers price traffic
    after compute)."""
    overlap = getattr(args, "overlap", None)
    if overlap is None:
        return getattr(args, "compat", None) is None
    return overlap in ("yes", True)


def fabric_of(args: argparse.Namespace) -> str:
    """``--fabric``, or its default: the papers' one link per split under ``--compat``."""
    fabric = getattr(args, "fabric", None)
    return fabric or ("papers" if getattr(args, "compat", None) else "devices")


def micro_batches_argument(text) -> int | str | None:
    """``--micro-batches``: a positive integer, ``auto`` or None (not given)."""
    if text is None or isinstance(text, int):
        return text
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(
            f"--micro-batches must be a positive integer or 'auto' (got {text!r})"
        ) from None
    if value < 1:
        raise ConfigError(f"--micro-batches must be a positive integer or 'auto' (got {text!r})")
    return value


def technique_choices(args: argparse.Namespace) -> dict:
    """The memory techniques a planning command searches (``auto``) or fixes, as
    :func:`parplan.solvers.fit.fit_plan`'s keyword arguments."""
    zero = getattr(args, "zero", None)
    recompute = getattr(args, "recompute", None)
    micro = micro_batches_argument(getattr(args, "micro_batches", None))
    return {
        "zero": "auto" if zero in (None, "auto") else int(zero),
        "recompute": "auto"
        if recompute in (None, "auto")
        else {"yes": True, "no": False}.get(recompute, recompute),
        "micro_batches": "auto" if micro in (None, "auto") else micro,
    }


def plans_against_memory(args: argparse.Namespace) -> bool:
    """Whether a planning command plans against memory: by default yes; not with
    ``--ignore-memory``, nor under a published planner's ``--compat`` rules unless a
    ``--memory-limit`` asks for it (the papers' setting ignores memory)."""
    if getattr(args, "ignore_memory", False):
        return False
    return getattr(args, "compat", None) is None or getattr(args, "memory_limit", None) is not None


def add_memory_arguments(parser: argparse.ArgumentParser) -> None:
    """--memory-limit and --ignore-memory of the commands that plan against memory."""
    parser.add_argument(
        "--memory-limit",
        default=None,
        metavar="GiB",
        help="plan against this many GiB per device (default: each device's own memory)",
    )
    parser.add_argument(
        "--ignore-memory",
        action="store_true",
        help="plan without memory limits, as the papers do (a plan over a device's memory is "
        "then only warned about)",
    )


#: Seconds between the lines :func:`still_running` prints while a step without progress of its
#: own (a model's import) runs on.
STILL_RUNNING_S = 15.0


@contextlib.contextmanager
def still_running(what: str, hint: str = "", every_s: float | None = None):
    """Print ``[parplan] still <what> (N s)`` on stderr every ``every_s`` seconds
    (:data:`STILL_RUNNING_S`) while the block runs: a step that reports no progress of its own
    is never silent for long. ``hint`` follows the first line."""
    import threading
    import time

    every = STILL_RUNNING_S if every_s is None else every_s
    done = threading.Event()
    start = time.perf_counter()

    def report() -> None:
        first = True
        while not done.wait(every):
            line = f"[parplan] still {what} ({time.perf_counter() - start:.0f} s)"
            print(line + (f": {hint}" if first and hint else ""), file=sys.stderr, flush=True)
            first = False

    thread = threading.Thread(target=report, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def import_hint(spec) -> str:
    """What may make an import long, for :func:`still_running`."""
    if str(spec).strip().lower().startswith("hf:"):
        return (
            "a model that steps through its positions in Python (a recurrent scan: Mamba, RWKV, "
            "Jamba) traces one step per position and layer; seq=<n> in the spec shortens that"
        )
    return ""


def progress_printer(enabled: bool, after_s: float | None = None):
    """A progress callback printing ``[parplan] msg`` on stderr, or None when not ``enabled``.

    With ``after_s`` (and not ``enabled``) it stays quiet until that many seconds have passed,
    so that only long runs report progress.
    """
    if not enabled and after_s is not None:
        import time

        start = time.perf_counter()
        return lambda msg: (
            time.perf_counter() - start >= after_s
            and print(f"[parplan] {msg}", file=sys.stderr, flush=True)
        )
    return _printer(enabled)


def _printer(enabled: bool):
    if not enabled:
        return None
    return lambda msg: print(f"[parplan] {msg}", file=sys.stderr, flush=True)


def run_inputs(args: argparse.Namespace) -> dict:
    """What the user typed for the run, as columns (JSON and CSV outputs carry them, so that
    concatenated sweeps keep their axes): model and array as given, link overrides (null: the
    array's own), fabric, device file, compat profile, overlap (as in force), memory limit (GiB,
    "device" for each device's own, or "ignored")."""
    limit = getattr(args, "memory_limit", None)
    return {
        "model_source": args.model,
        "array_source": args.array,
        "bandwidth_gb_per_s": args.bandwidth,
        "latency_us": args.latency,
        "fabric": fabric_of(args),
        "devices_file": args.devices,
        "compat": getattr(args, "compat", None),
        "overlap": overlap_of(args),
        "memory_limit": "ignored" if getattr(args, "ignore_memory", False) else (limit or "device"),
    }


def problem_source(args: argparse.Namespace):
    """What the user typed for the problem (a :class:`~parplan.costmodel.planio.ProblemSource`),
    recorded in plan files."""
    from parplan.costmodel.planio import ProblemSource

    return ProblemSource(
        model=args.model,
        array=args.array,
        bandwidth_gb_per_s=args.bandwidth,
        latency_us=args.latency,
        devices_file=args.devices,
        fabric=fabric_of(args),
    )


def memory_limit(text: str | None) -> float | str | None:
    """``--memory-limit``: GiB per device -> bytes, ``device`` (each device's own), or None."""
    if text is None:
        return None
    if text.strip().lower() == "device":
        return "device"
    try:
        gib = float(text)
    except ValueError:
        raise ConfigError(
            f"--memory-limit must be a number of GiB per device or 'device' (got {text!r})"
        ) from None
    if not gib > 0 or not math.isfinite(gib):
        raise ConfigError(f"--memory-limit must be a finite number > 0 of GiB (got {text})")
    return gib * GIB


def output_path(text: str, option: str) -> Path:
    """A file to write for ``option``: not a directory, in a folder that exists."""
    path = Path(text)
    if path.is_dir():
        raise ConfigError(f"{option} '{text}' is a directory; give a file name inside it")
    if not path.parent.is_dir():
        raise ConfigError(f"{option} '{text}': folder '{path.parent}' does not exist")
    return path


def model_spec(args: argparse.Namespace, saved=None) -> str | None:
    """The model spec a command works on: ``--model``, else what the plan file ``saved`` (a
    read plan file) was made for, as the user typed it."""
    if args.model is not None or saved is None:
        return args.model
    return saved.problem.get("model_source") or saved.problem.get("model")
