"""``parplan calibrate``: measure the local device with torch and write a device file whose
figures make the cost model reproduce the measured times (docs/calibration.md; the figures
are docs/costmodel.md section 5's).

Example (needs torch; a quick CPU run takes a few seconds):
    >>> from parplan.calibration import calibrate
    >>> c = calibrate(device="cpu", scope="quick")       # doctest: +SKIP
    >>> print(c.text)                                    # doctest: +SKIP
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from parplan.calibration.fit import DeviceFit, Measurement, device_file_text, fit_device, fit_link
from parplan.calibration.measure import OPS, Host, host, measure_allreduce, measure_ops
from parplan.costmodel.hardware import DeviceKind, load_devices
from parplan.errors import ConfigError

#: Device kinds recognised from the name torch reports (substring, lower case -> built-in kind).
KNOWN = (("h200", "h200"), ("h100", "h100"), ("a100", "a100"), ("v100", "v100"))


@dataclass(frozen=True)
class Calibration:
    """A calibration's measurements, fit and device file."""

    host: Host
    like: DeviceKind | None
    measurements: tuple[Measurement, ...]
    fit: DeviceFit
    name: str
    text: str

    def table(self):
        """Per measurement: op, shape, measured and predicted ms, ratio (a pandas DataFrame)."""
        import pandas as pd

        rows = [
            (
                m.op,
                m.shape,
                m.flops,
                m.bytes_,
                m.kernels,
                m.seconds * 1e3,
                self.fit.predict(m) * 1e3 if m.op != "allreduce" else float("nan"),
            )
            for m in self.measurements
        ]
        df = pd.DataFrame(
            rows,
            columns=["op", "shape", "flops", "bytes", "kernels", "measured_ms", "predicted_ms"],
        )
        df["ratio"] = df["predicted_ms"] / df["measured_ms"]
        return df


def known_kind(device_name: str, kinds=None) -> DeviceKind | None:
    """The built-in kind whose name appears in ``device_name`` (torch's name of the GPU)."""
    kinds = kinds or load_devices()
    low = device_name.lower()
    return next((kinds[k] for key, k in KNOWN if key in low and k in kinds), None)


def calibrate(
    device: str = "auto",
    dtype: str = "auto",
    scope: str = "full",
    like: str | None = None,
    name: str | None = None,
    processes: int = 1,
    ops=OPS,
    devices_file=None,
    progress=None,
) -> Calibration:
    """Measure ``ops`` (and an all-reduce over ``processes`` local processes when >= 2), fit
    section 5's figures against the peaks of kind ``like`` (default: the built-in kind torch's
    device name names; none on a CPU, whose peaks are then the best measured) and return the
    device file text for kind ``name``."""
    if scope not in ("full", "quick"):
        raise ConfigError(f"scope must be full or quick (got {scope!r})")
    h = host(device, dtype)
    kinds = load_devices(devices_file)
    if like is not None:
        if like.lower() not in kinds:
            raise ConfigError(
                f"--like: unknown device '{like}'; valid devices: {', '.join(sorted(kinds))}"
            )
        base = kinds[like.lower()]
    else:
        base = known_kind(h.name, kinds) if h.device != "cpu" else None
    ms = measure_ops(h, scope, ops, progress)
    if processes >= 2:
        ms += measure_allreduce(processes, h.device, scope, progress)
    fit = fit_device(
        [m for m in ms if m.op != "allreduce"],
        base.flops_per_s if base else None,
        base.memory_bytes_per_s if base else None,
    )
    link_bw, link_lat = (base.link_bytes_per_s, base.link_latency_s) if base else (5e9, 20e-6)
    link_note = (
        f"link figures: {base.name}'s datasheet"
        if base
        else "link figures: the cpu kind's (not measured)"
    )
    if processes >= 2:
        link_bw, link_lat = fit_link(ms, processes)
        link_note = f"link figures: ring all-reduce fitted over {processes} local processes"
    name = name or f"{(base.name if base else h.device.split(':')[0])}-measured"
    peaks = (
        f"peaks: {base.name}'s datasheet"
        if base
        else "peaks: the best measured rates (no datasheet)"
    )
    notes = [
        f"parplan calibrate, {datetime.date.today().isoformat()}: {h.name} ({h.device}), {h.dtype}, "
        f"torch {h.torch_version}, scope {scope}",
        peaks,
        link_note,
        "median |predicted / measured - 1| by op: "
        + ", ".join(f"{op} {err:.1%}" for op, err in fit.errors.items()),
    ]
    if fit.clamped:
        notes.append(f"clamped to 1 (measured above the datasheet peak): {', '.join(fit.clamped)}")
    description = f"{h.name} measured by parplan calibrate ({h.dtype}, torch {h.torch_version})"
    memory = base.memory_bytes if base else h.memory_bytes
    text = device_file_text(name, fit, memory, link_bw, link_lat, description, notes)
    return Calibration(h, base, tuple(ms), fit, name, text)


__all__ = [
    "Calibration",
    "calibrate",
    "known_kind",
    "Measurement",
    "DeviceFit",
    "fit_device",
    "fit_link",
]
