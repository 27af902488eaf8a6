"""Device figures fitted to measured op times, and the device file they go in
(docs/calibration.md; the figures are docs/costmodel.md section 5's).

Every measurement is one training step of one op: its model FLOPs and HBM bytes counted by
the cost model's own rules, the kernels it runs, and the measured seconds. The model of its
time is section 5's roofline

    t = max(FLOPs / (e_kind * C), bytes / (m * H), kernels * t0)

(the roofline with its launch roof) with the peak ``C`` and HBM bandwidth ``H`` of a datasheet
(or the best measured, when the device has none). :func:`fit_device` minimises the summed
squared *relative* error, so small and large ops count alike.

Example (synthetic measurements from known figures are recovered):
    >>> ms = [Measurement("linear", f"{n}", 6.0 * n**3, 6.0 * n * n, 3, max(6.0 * n**3 / (0.5 * 1e12), 3e-5))
    ...       for n in (64, 256, 1024, 4096)]
    >>> ms += [Measurement("memory", f"{n}", 0.0, 8.0 * n, 2, max(8.0 * n / (0.8 * 1e11), 2e-5))
    ...        for n in (2**12, 2**24)]
    >>> f = fit_device(ms, peak_flops_per_s=1e12, peak_memory_bytes_per_s=1e11)
    >>> round(f.efficiency, 3), round(f.memory_efficiency, 3), round(f.kernel_overhead_s * 1e6, 2)
    (0.5, 0.8, 10.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from parplan.costmodel.dims import Device, roofline_seconds
from parplan.errors import ConfigError

#: Which device-file efficiency each measured op class fits.
OP_FIGURE = {"linear": "efficiency", "conv": "conv_efficiency", "attention": "attention_efficiency"}
#: Efficiencies tried by the one-dimensional searches (then refined around the best).
_GRID = np.geomspace(1e-4, 1.0, 2001)
#: Launch times tried (seconds).
_LAUNCH_GRID = np.concatenate([[0.0], np.geomspace(1e-8, 1e-2, 2001)])


@dataclass(frozen=True)
class Measurement:
    """One op's training step as measured: model FLOPs and HBM bytes (the cost model's
    counts), kernels run, seconds (median of repeats)."""

    op: str  # "linear", "conv", "attention", "memory" or "allreduce"
    shape: str
    flops: float
    bytes_: float
    kernels: int
    seconds: float


@dataclass(frozen=True)
class DeviceFit:
    """Fitted section 5 figures, with each op class's median absolute relative error."""

    flops_per_s: float
    memory_bytes_per_s: float
    efficiency: float
    conv_efficiency: float | None
    attention_efficiency: float | None
    memory_efficiency: float
    kernel_overhead_s: float
    errors: dict[str, float] = field(default_factory=dict)
    #: Figures the fit clamped to 1 (measured faster than the datasheet peak).
    clamped: tuple[str, ...] = ()

    def device(self) -> Device:
        return Device(
            self.flops_per_s,
            self.memory_bytes_per_s,
            self.efficiency,
            self.conv_efficiency,
            self.attention_efficiency,
            self.memory_efficiency,
            self.kernel_overhead_s,
        )

    def predict(self, m: Measurement) -> float:
        """Section 5's time of measurement ``m`` on the fitted device."""
        return predict_seconds(m, self.device())


def predict_seconds(m: Measurement, device: Device) -> float:
    """Section 5's time of measurement ``m`` on ``device`` (the product's roofline)."""
    kind = {"conv": "conv", "attention": "attention"}.get(m.op, "gemm")
    return roofline_seconds(m.flops, m.bytes_, device, kind, m.kernels)


def _search(loss, grid: np.ndarray = _GRID, hi: float = 1.0) -> float:
    """argmin over ``grid`` (capped at ``hi``) of a one-dimensional ``loss`` that takes an array
    of candidates and returns their losses, refined on a finer grid around the best."""
    grid = np.minimum(grid, hi)
    best = grid[int(np.argmin(loss(grid)))]
    fine = np.linspace(best * 0.99, min(hi, best * 1.01), 201)
    return float(fine[int(np.argmin(loss(fine)))])


def _arrays(ms: list[Measurement]):
    return (
        np.array([m.flops for m in ms]),
        np.array([m.bytes_ for m in ms]),
        np.array([float(m.kernels) for m in ms]),
        np.array([m.seconds for m in ms]),
    )


def fit_device(
    measurements: list[Measurement],
    peak_flops_per_s: float | None = None,
    peak_memory_bytes_per_s: float | None = None,
    rounds: int = 12,
) -> DeviceFit:
    """Section 5's figures from measured ops (see the module docstring). Without a datasheet
    peak, the best achieved rate measured stands in for it (its efficiency is then 1).

    One launch time ``t0`` serves every op, as in the model. Coordinate descent from the
    shortest time per kernel measured: each round fits the HBM efficiency on the streaming
    ops, each op class's efficiency, then ``t0`` over all measurements, each with the others
    fixed (each step lowers the summed squared relative error, so the rounds converge)."""
    by_op: dict[str, list[Measurement]] = {}
    for m in measurements:
        if not (m.seconds > 0 and math.isfinite(m.seconds)):
            raise ConfigError(
                f"measurement {m.op} {m.shape}: seconds must be a finite number > 0 (got {m.seconds})"
            )
        if m.op not in OP_FIGURE and m.op != "memory":
            raise ConfigError(
                f"measurement {m.op} {m.shape}: unknown op class (valid: {', '.join(OP_FIGURE)}, memory)"
            )
        by_op.setdefault(m.op, []).append(m)
    if not by_op.get("linear"):
        raise ConfigError(
            "calibration needs matrix-product (linear) measurements to fit the efficiency"
        )
    compute = [m for op in OP_FIGURE for m in by_op.get(op, [])]
    peak = peak_flops_per_s or max(m.flops / m.seconds for m in compute)
    streams = by_op.get("memory", [])
    hbm = peak_memory_bytes_per_s or max(m.bytes_ / m.seconds for m in (streams or compute))
    data = {op: _arrays(ms) for op, ms in by_op.items()}

    def roof(op, eff, mem, t0):
        """Modelled seconds of ``op``'s measurements (columns) at each candidate (rows)."""
        f, b, k, _ = data[op]
        eff, mem, t0 = (np.atleast_1d(v)[:, None] for v in (eff, mem, t0))
        return np.maximum(
            np.maximum(f / (eff * peak) if op != "memory" else 0.0, b / (mem * hbm)), k * t0
        )

    def loss(ops, eff, mem, t0):
        return sum(
            np.sum(
                (roof(op, eff if op != "memory" else 1.0, mem, t0) / data[op][3] - 1.0) ** 2, axis=1
            )
            for op in ops
        )

    figures = {op: 1.0 for op in data}
    t0 = min(float(np.min(s / k)) for _, _, k, s in data.values())
    for _ in range(rounds):
        if streams:
            figures["memory"] = _search(lambda x: loss(["memory"], 1.0, x, t0))
        mem = figures.get("memory", 1.0)
        for op in OP_FIGURE:
            if op in data:
                figures[op] = _search(lambda x: loss([op], x, mem, t0))

        def all_ops(x):
            return sum(
                np.sum(
                    (roof(op, figures[op] if op != "memory" else 1.0, mem, x) / data[op][3] - 1.0)
                    ** 2,
                    axis=1,
                )
                for op in data
            )

        t0 = _search(all_ops, _LAUNCH_GRID, hi=1.0)
    mem = figures.get("memory", 1.0)
    clamped = tuple(
        OP_FIGURE.get(op, "memory_efficiency")
        for op, value in figures.items()
        if value > 1.0 - 1e-6 and (peak_memory_bytes_per_s if op == "memory" else peak_flops_per_s)
    )
    fit = DeviceFit(
        peak,
        hbm,
        figures["linear"],
        figures.get("conv"),
        figures.get("attention"),
        mem,
        t0,
        clamped=clamped,
    )
    errors = {
        op: float(np.median([abs(fit.predict(m) / m.seconds - 1.0) for m in ms]))
        for op, ms in by_op.items()
    }
    return DeviceFit(**{**fit.__dict__, "errors": errors})


def fit_link(measurements: list[Measurement], processes: int) -> tuple[float, float]:
    """(bus bandwidth in bytes/s, per-message latency in s) of a ring all-reduce fitted to
    measured all-reduces: ``t = 2 (n - 1) (latency + bytes / (n * bandwidth))`` (each of the
    ``2 (n - 1)`` steps sends ``1 / n`` of the tensor), least squares in relative error."""
    ms = [m for m in measurements if m.op == "allreduce"]
    if len(ms) < 2 or processes < 2:
        raise ConfigError(
            "fitting a link needs all-reduce measurements of at least 2 sizes on >= 2 processes"
        )
    steps = 2.0 * (processes - 1)
    s = np.array([m.seconds for m in ms])
    a = (
        np.stack(
            [np.full(len(ms), steps), steps * np.array([m.bytes_ for m in ms]) / processes], axis=1
        )
        / s[:, None]
    )
    (latency, inverse), *_ = np.linalg.lstsq(a, np.ones(len(ms)), rcond=None)
    if inverse <= 0:
        raise ConfigError("the all-reduce times do not grow with the size: cannot fit a bandwidth")
    return 1.0 / float(inverse), max(0.0, float(latency))


def device_file_text(
    name: str,
    fit: DeviceFit,
    memory_bytes: float,
    link_bytes_per_s: float,
    link_latency_s: float,
    description: str,
    notes: list[str],
) -> str:
    """A device file (docs/formats.md) holding kind ``name`` with the fitted figures; ``notes``
    become comment lines above it (what was measured, where, the fit's errors)."""
    if not name or any(c in name for c in "[]\"'=:,@ \t\n"):
        raise ConfigError(
            f"device name {name!r} must be non-empty, without spaces or any of []\"'=:,@"
        )
    lines = [f"# {n}" for n in notes]
    lines += [
        f"[{name}]",
        f"description = {_quote(description)}",
        f"flops_per_s = {fit.flops_per_s:.6g}",
        f"memory_bytes = {memory_bytes:.0f}",
        f"memory_bytes_per_s = {fit.memory_bytes_per_s:.6g}",
        f"link_bytes_per_s = {link_bytes_per_s:.6g}",
        f"link_latency_s = {link_latency_s:.6g}",
        f"efficiency = {fit.efficiency:.4f}",
    ]
    for key in ("conv_efficiency", "attention_efficiency"):
        value = getattr(fit, key)
        if value is not None:
            lines.append(f"{key} = {min(1.0, value):.4f}")
    lines += [
        f"memory_efficiency = {fit.memory_efficiency:.4f}",
        f"kernel_overhead_s = {fit.kernel_overhead_s:.4g}",
    ]
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


__all__ = [
    "Measurement",
    "DeviceFit",
    "fit_device",
    "predict_seconds",
    "fit_link",
    "device_file_text",
    "OP_FIGURE",
]
