"""Op times measured with torch on the local device (docs/calibration.md).

Each measurement is one *training step* of one op, as the cost model prices it
(docs/costmodel.md section 5): a linear layer's forward, backward and gradient products; a
3x3 convolution's three; an attention core's forward and backward; a streaming element-wise
op's forward and backward; and, across processes, an all-reduce. FLOPs and bytes are counted
by the cost model's rules, so the fit (``fit.py``) finds the figures that make the model
reproduce these times. Gradients are taken with ``torch.autograd.grad`` (fresh tensors, no
accumulation kernel). A time is the median of 5 trials, each long enough to hide the timer.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass

from parplan.calibration.fit import Measurement
from parplan.costmodel.dims import WEIGHTED_TRAFFIC, LayerDims
from parplan.costmodel.graph import Activation, Attention, Shape
from parplan.errors import ConfigError

#: Shapes measured per op class: (M, K, N) products, (batch, channels, height = width)
#: 3x3 convolutions, (batch, sequence, heads, head size) attention cores, element counts of
#: the streaming op, bytes all-reduced. "full" is sized for a datacenter GPU (a few seconds
#: each class); "quick" for a CPU or a test (well under a second each).
SHAPES = {
    "full": {
        "linear": [
            (m, k, n)
            for m in (256, 1024, 4096, 16384)
            for k, n in (
                (256, 256),
                (1024, 1024),
                (4096, 4096),
                (4096, 14336),
                (14336, 4096),
                (8192, 8192),
            )
        ],
        "conv": [
            (32, 64, 56),
            (256, 64, 56),
            (256, 128, 28),
            (256, 256, 14),
            (256, 512, 7),
            (512, 256, 28),
            (128, 128, 56),
            (64, 512, 14),
        ],
        "attention": [
            (8, 512, 16, 64),
            (4, 1024, 32, 128),
            (2, 2048, 32, 128),
            (1, 4096, 32, 128),
            (1, 8192, 32, 128),
            (16, 256, 12, 64),
        ],
        "memory": [2**k for k in range(16, 29, 2)],
        "allreduce": [2**k for k in range(10, 29, 3)],
    },
    "quick": {
        "linear": [(m, k, n) for m in (16, 128) for k, n in ((64, 64), (256, 256), (256, 1024))],
        "conv": [(2, 16, 16), (4, 32, 8)],
        "attention": [(2, 64, 2, 16), (1, 128, 4, 32)],
        "memory": [2**12, 2**16, 2**19],
        "allreduce": [2**12, 2**18, 2**21, 2**23],
    },
}
OPS = ("linear", "conv", "attention", "memory")
#: Element bytes of each dtype name.
DTYPES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class Host:
    """What was measured: torch device, its name, dtype, memory, torch version."""

    device: str
    name: str
    dtype: str
    memory_bytes: float
    torch_version: str

    @property
    def bytes_per_element(self) -> int:
        return DTYPES[self.dtype]


def require_torch():
    try:
        import torch
    except ImportError:
        raise ConfigError(
            "parplan calibrate measures with torch, which is not installed: "
            "pip install 'parplan[torch]'"
        ) from None
    return torch


def host(device: str = "auto", dtype: str = "auto") -> Host:
    """Resolve ``device`` ("auto", "cpu", "cuda", "cuda:N") and ``dtype`` ("auto": bf16 on a GPU,
    fp32 on a CPU, as each is trained)."""
    torch = require_torch()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"--device {device}: torch sees no CUDA device here (use --device cpu)"
            )
        try:
            props = torch.cuda.get_device_properties(torch.device(device))
        except (AssertionError, RuntimeError, ValueError) as e:
            raise ConfigError(f"--device {device}: {e}") from None
        name, memory = props.name, float(props.total_memory)
    elif device == "cpu":
        name, memory = platform.processor() or platform.machine() or "cpu", _host_memory()
    else:
        raise ConfigError(f"--device must be auto, cpu, cuda or cuda:N (got {device!r})")
    if dtype == "auto":
        dtype = "fp32" if device == "cpu" else "bf16"
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)} or auto (got {dtype!r})")
    return Host(device, name, dtype, memory, torch.__version__)


def _host_memory() -> float:
    try:
        import os

        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * 2.0**30


def _dtype(torch, name: str):
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def time_step(step, sync, min_seconds: float, trials: int = 5) -> float:
    """Median seconds of ``step()`` over ``trials`` trials, each repeating it enough times to
    last about ``min_seconds`` (after one warm-up call: allocations, kernel selection)."""
    step()
    sync()
    t = time.perf_counter()
    step()
    sync()
    once = time.perf_counter() - t
    reps = max(1, min(1000, int(min_seconds / max(once, 1e-7))))
    samples = []
    for _ in range(trials):
        sync()
        t = time.perf_counter()
        for _ in range(reps):
            step()
        sync()
        samples.append((time.perf_counter() - t) / reps)
    return statistics.median(samples)


def _weighted(dims: LayerDims, bpe: int) -> tuple[float, float]:
    """(FLOPs, HBM bytes) of one training step of a weighted layer, by the cost model's rules
    (:attr:`LayerDims.flops`, section 5's ``3 (|F_in| + |W| + |F_out|)``)."""
    return dims.flops, WEIGHTED_TRAFFIC * (
        dims.in_elements + dims.weight_elements + dims.out_elements
    ) * bpe


def _steps(torch, op: str, shape: tuple, h: Host):
    """(training step of ``op`` at ``shape``, model FLOPs, model bytes, kernels): the counts are
    the cost model's own (:class:`LayerDims`, the graph layers' ``training_cost``)."""
    import torch.nn.functional as F

    dev, dt, bpe = torch.device(h.device), _dtype(torch, h.dtype), h.bytes_per_element

    def rand(*size, grad=True, **kw):
        return torch.randn(*size, device=dev, dtype=dt, **kw).requires_grad_(grad)

    if op == "linear":
        m, k, n = shape
        x, w, g = rand(m, k), rand(n, k), rand(m, n, grad=False)
        flops, bytes_ = _weighted(LayerDims(m, k, n, 1, 1, 1), bpe)
        return (lambda: torch.autograd.grad(F.linear(x, w), (x, w), g)), flops, bytes_, 3
    if op == "conv":
        b, c, hw = shape
        fmt = torch.channels_last if h.device != "cpu" else torch.contiguous_format
        x = (
            torch.randn(b, c, hw, hw, device=dev, dtype=dt)
            .to(memory_format=fmt)
            .requires_grad_(True)
        )
        w = torch.randn(c, c, 3, 3, device=dev, dtype=dt).to(memory_format=fmt).requires_grad_(True)
        g = torch.randn(b, c, hw, hw, device=dev, dtype=dt).to(memory_format=fmt)
        flops, bytes_ = _weighted(LayerDims(b, c, c, hw * hw, hw * hw, 9), bpe)
        return (lambda: torch.autograd.grad(F.conv2d(x, w, padding=1), (x, w), g)), flops, bytes_, 3
    if op == "attention":
        b, s, heads, d = shape
        q, k, v, g = (
            rand(b, heads, s, d),
            rand(b, heads, s, d),
            rand(b, heads, s, d),
            rand(b, heads, s, d, grad=False),
        )
        core = Attention("core", ("input",), heads=heads)
        flops, traffic, _ = core.training_cost([Shape(3 * heads * d, s)], Shape(heads * d, s))
        return (
            (lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v), (q, k, v), g)),
            b * flops,
            b * traffic * bpe,
            2,
        )
    if op == "memory":
        (n,) = shape
        x, g = rand(n), rand(n, grad=False)
        # an element-wise layer's rule: forward reads x and writes y, backward reads dy and writes dx
        flops, traffic, _ = Activation("scale", ("input",), "relu").training_cost(
            [Shape(n)], Shape(n)
        )
        return (lambda: torch.autograd.grad(x * 1.5, (x,), g)), flops, traffic * bpe, 2
    raise ConfigError(f"unknown op class {op!r}; valid: {', '.join(OPS)}")


def measure_ops(h: Host, scope: str = "full", ops=OPS, progress=None) -> list[Measurement]:
    """Time every shape of ``SHAPES[scope]`` for each op class in ``ops`` on ``h``; shapes
    that do not fit in the device's memory are skipped. ``progress(text)`` hears each class."""
    torch = require_torch()
    if h.device.startswith("cuda"):
        torch.backends.cudnn.benchmark = True
        torch.cuda.set_device(torch.device(h.device).index or 0)
        sync = torch.cuda.synchronize
    else:

        def sync():
            return None

    min_seconds = 0.05 if scope == "full" else 0.005
    out = []
    for op in ops:
        shapes = SHAPES[scope][op]
        if progress:
            progress(f"{op}: {len(shapes)} shapes")
        for shape in (s if isinstance(s, tuple) else (s,) for s in shapes):
            try:
                step, flops, bytes_, kernels = _steps(torch, op, shape, h)
                seconds = time_step(step, sync, min_seconds)
            except torch.OutOfMemoryError:
                if progress:
                    progress(f"  {op} {shape}: out of memory, skipped")
                continue
            finally:
                step = None
                if h.device.startswith("cuda"):
                    torch.cuda.empty_cache()
            out.append(Measurement(op, "x".join(map(str, shape)), flops, bytes_, kernels, seconds))
    return out


def _allreduce_worker(
    rank: int, world: int, port: int, backend: str, sizes: list[int], min_seconds: float, results
) -> None:
    import torch
    import torch.distributed as dist

    try:
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        dev = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(dev)
        sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
        times = []
        for n in sizes:
            x = torch.ones(n // 4, device=dev, dtype=torch.float32)

            def step():
                dist.all_reduce(x)

            # every rank must run the same number of repeats: rank 0 decides, the others follow
            step()
            sync()
            t = time.perf_counter()
            step()
            sync()
            reps = torch.tensor(
                [max(1, min(200, int(min_seconds / max(time.perf_counter() - t, 1e-7))))]
            )
            dist.broadcast(reps, 0)
            samples = []
            for _ in range(3):
                dist.barrier()
                sync()
                t = time.perf_counter()
                for _ in range(int(reps)):
                    step()
                sync()
                samples.append((time.perf_counter() - t) / int(reps))
            times.append(statistics.median(samples))
        if rank == 0:
            results.put(("ok", times))
        dist.destroy_process_group()
    except Exception as e:  # reported to the parent, which raises it as one line
        results.put(("error", f"{type(e).__name__}: {e}"))


def measure_allreduce(
    processes: int, device: str, scope: str = "full", progress=None
) -> list[Measurement]:
    """All-reduce times of ``SHAPES[scope]['allreduce']`` bytes (fp32) over ``processes``
    local processes: gloo on CPUs, NCCL with one GPU each."""
    torch = require_torch()
    import torch.multiprocessing as mp

    backend = "gloo" if device == "cpu" else "nccl"
    if backend == "nccl" and torch.cuda.device_count() < processes:
        raise ConfigError(
            f"--processes {processes}: only {torch.cuda.device_count()} CUDA device(s) here"
        )
    if processes < 2:
        raise ConfigError(f"--processes must be >= 2 to measure collectives (got {processes})")
    sizes = SHAPES[scope]["allreduce"]
    if progress:
        progress(f"allreduce: {len(sizes)} sizes over {processes} processes ({backend})")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    from parplan.executor.launch import free_port

    args = (processes, free_port(), backend, sizes, 0.05 if scope == "full" else 0.005, results)
    procs = [
        ctx.Process(target=_allreduce_worker, args=(r, *args), daemon=True)
        for r in range(processes)
    ]
    for p in procs:
        p.start()
    try:
        status, value = results.get(timeout=600)
    except Exception:
        status, value = "error", "no answer from the processes in 600 s"
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.terminate()
    if status != "ok":
        raise ConfigError(f"all-reduce measurement failed: {value}")
    return [
        Measurement("allreduce", f"{n}", 0.0, float(n), 2 * (processes - 1), t)
        for n, t in zip(sizes, value)
    ]


__all__ = [
    "Host",
    "host",
    "measure_ops",
    "measure_allreduce",
    "time_step",
    "SHAPES",
    "OPS",
    "DTYPES",
    "require_torch",
]
