"""``parplan calibrate`` (docs/calibration.md): the fit recovers known figures from times made
by the independent reference's section 5 formula; the device file it writes loads and prices;
the torch measurements run on CPU; bad input ends in one line."""

import math
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parplan.calibration.fit import Measurement, device_file_text, fit_device, fit_link
from parplan.costmodel.hardware import load_devices, parse_array
from parplan.errors import ConfigError
from reference_model import _roof

torch_missing = False
try:
    import torch  # noqa: F401
except ImportError:  # the README's plain environment: the measuring tests skip
    torch_missing = True
needs_torch = pytest.mark.skipif(torch_missing, reason="needs torch")

PEAK, HBM = 1e15, 3e12
KINDS = {"linear": "gemm", "conv": "conv", "attention": "attention", "memory": "gemm"}


class _Dev:
    """A device with known section 5 figures, for the reference's roofline."""

    def __init__(self, e, e_conv, e_att, m, t0):
        self.flops_per_s, self.memory_bytes_per_s = PEAK, HBM
        self.efficiency, self.conv_efficiency, self.attention_efficiency = e, e_conv, e_att
        self.memory_efficiency, self.kernel_overhead_s = m, t0


def _synthetic(dev, sizes):
    """Measurements timed by the reference formula: products of n^3, convolutions and
    attention cores of comparable work, streaming ops over n^2 elements."""
    ms = []
    for n in sizes:
        for op, flops, bytes_, kernels in (
            ("linear", 6.0 * n**3, 6.0 * n * n, 3),
            ("conv", 54.0 * n**3, 8.0 * n * n, 3),
            ("attention", 12.0 * n**3, 8.0 * n * n, 2),
            ("memory", 0.0, 64.0 * n * n, 2),
        ):
            ms.append(
                Measurement(
                    op,
                    str(n),
                    flops,
                    bytes_,
                    kernels,
                    _roof(flops, bytes_, dev, KINDS[op], kernels),
                )
            )
    return ms


@settings(max_examples=15)
@given(
    st.floats(0.2, 0.95),
    st.floats(0.1, 0.9),
    st.floats(0.1, 0.9),
    st.floats(0.3, 0.95),
    st.sampled_from([0.0, 2e-6, 1e-5, 4e-5]),
)
def test_fit_recovers_the_figures_that_made_the_times(e, e_conv, e_att, m, t0):
    dev = _Dev(e, e_conv, e_att, m, t0)
    ms = _synthetic(dev, [16, 64, 256, 1024, 4096, 8192, 16384])
    fit = fit_device(ms, PEAK, HBM)
    for got, want in (
        (fit.efficiency, e),
        (fit.conv_efficiency, e_conv),
        (fit.attention_efficiency, e_att),
        (fit.memory_efficiency, m),
    ):
        assert math.isclose(got, want, rel_tol=0.01), (got, want)
    if t0 > 0:  # the 16-wide ops sit on the launch roof: it is measured, and recovered
        assert any(
            _roof(m.flops, m.bytes_, dev, KINDS[m.op], m.kernels) == m.kernels * t0 for m in ms
        )
        assert math.isclose(fit.kernel_overhead_s, t0, rel_tol=0.02)
    else:  # no roof in the times: any t0 under every op's own time fits them, none above
        assert all(m.kernels * fit.kernel_overhead_s <= m.seconds * 1.01 for m in ms)
    assert all(err < 0.01 for err in fit.errors.values()), fit.errors


def test_fit_without_a_datasheet_takes_the_best_measured_rates_as_peaks():
    fit = fit_device(_synthetic(_Dev(0.5, None, None, 0.8, 0.0), [256, 4096]))
    assert math.isclose(fit.efficiency, 1.0, rel_tol=1e-3)
    assert math.isclose(fit.flops_per_s, 0.5 * PEAK, rel_tol=1e-9)
    assert math.isclose(fit.memory_bytes_per_s, 0.8 * HBM, rel_tol=1e-9) and fit.clamped == ()


def test_a_device_faster_than_its_datasheet_is_clamped_and_said():
    fit = fit_device(_synthetic(_Dev(0.9, None, None, 0.8, 0.0), [1024, 4096]), PEAK / 2, HBM)
    assert fit.efficiency == 1.0 and "efficiency" in fit.clamped


def test_fit_link_recovers_a_ring_all_reduce():
    n, bw, lat = 4, 40e9, 3e-6
    ms = [
        Measurement("allreduce", str(b), 0.0, float(b), 6, 6 * (lat + b / (n * bw)))
        for b in (1e3, 1e6, 1e8, 1e9)
    ]
    got_bw, got_lat = fit_link(ms, n)
    assert math.isclose(got_bw, bw, rel_tol=1e-6) and math.isclose(got_lat, lat, rel_tol=1e-6)
    with pytest.raises(ConfigError, match="at least 2 sizes"):
        fit_link(ms[:1], n)


def test_bad_measurements_are_refused():
    with pytest.raises(ConfigError, match="needs matrix-product"):
        fit_device([Measurement("memory", "1", 0.0, 1e6, 2, 1e-3)])
    with pytest.raises(ConfigError, match="seconds must be a finite number > 0"):
        fit_device([Measurement("linear", "1", 1e9, 1e6, 3, 0.0)])
    with pytest.raises(ConfigError, match="unknown op class"):
        fit_device([Measurement("gemv", "1", 1e9, 1e6, 3, 1e-3)])


def test_the_device_file_loads_and_prices_with_the_fitted_figures(tmp_path):
    dev = _Dev(0.6, 0.4, 0.3, 0.9, 1e-5)
    fit = fit_device(_synthetic(dev, [256, 1024, 4096]), PEAK, HBM)
    text = device_file_text(
        "gpu-measured", fit, 80e9, 450e9, 2e-6, 'a "quoted" GPU', ["measured here", "fit: fine"]
    )
    path = tmp_path / "gpu.toml"
    path.write_text(text)
    kind = load_devices(path)["gpu-measured"]
    assert kind.description == 'a "quoted" GPU'
    assert math.isclose(kind.efficiency, fit.efficiency, rel_tol=1e-3)
    assert math.isclose(kind.conv_efficiency, fit.conv_efficiency, rel_tol=1e-3)
    assert math.isclose(kind.kernel_overhead_s, fit.kernel_overhead_s, rel_tol=1e-3)
    # the array's device prices one measurement as the fit predicted it
    device = parse_array("gpu-measured:2", devices=load_devices(path)).left.as_device
    m = Measurement("linear", "4096", 6.0 * 4096**3, 6.0 * 4096**2, 3, 1.0)
    assert math.isclose(_roof(m.flops, m.bytes_, device, "gemm", 3), fit.predict(m), rel_tol=1e-3)
    with pytest.raises(ConfigError, match="device name"):
        device_file_text("a b", fit, 1, 1, 0, "", [])


@needs_torch
def test_calibrate_on_this_cpu_writes_a_usable_device_file(tmp_path):
    from parplan.calibration import calibrate
    from parplan.costmodel.problem import Problem
    from parplan.models.zoo import get_model
    from parplan.solvers.planners import make_plan
    from parplan.costmodel.evaluate import evaluate

    c = calibrate(device="cpu", scope="quick", name="here")
    ops = {m.op for m in c.measurements}
    assert ops == {"linear", "conv", "attention", "memory"}
    assert all(m.seconds > 0 for m in c.measurements)
    assert (
        0 < c.fit.efficiency <= 1
        and 0 < c.fit.memory_efficiency <= 1
        and c.fit.kernel_overhead_s >= 0
    )
    table = c.table()
    assert len(table) == len(c.measurements) and (table.predicted_ms > 0).all()
    path = tmp_path / "here.toml"
    path.write_text(c.text)
    kinds = load_devices(path)
    p = Problem(get_model("lenet"), parse_array("here:2", devices=kinds), batch=8)
    assert evaluate(p, make_plan(p, "accpar")).step_time_s > 0


@needs_torch
def test_collectives_are_measured_over_local_processes():
    from parplan.calibration.measure import measure_allreduce

    ms = measure_allreduce(2, "cpu", "quick")
    assert [m.bytes_ for m in ms] == sorted(m.bytes_ for m in ms) and all(m.seconds > 0 for m in ms)
    bw, lat = fit_link(ms, 2)
    assert bw > 0 and lat >= 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ops", "linear,gemv"], "--ops: unknown op class 'gemv'"),
        (["--ops", "conv"], "--ops must include linear"),
        (["--dtype", "int8"], "--dtype must be one of"),
        (["--device", "tpu"], "--device must be auto, cpu, cuda"),
        (["--like", "nope"], "--like: unknown device 'nope'"),
    ],
)
def test_bad_calibrate_input_is_one_line(args, message, capsys):
    from parplan.cli import main

    if torch_missing and args[0] != "--ops":
        pytest.skip("needs torch")
    device = [] if "--device" in args else ["--device", "cpu"]
    assert main(["calibrate", "--quick", *device, *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_the_recorded_h200_file_is_the_fit_of_its_recorded_measurements():
    """parplan/data/calibration: refitting the recorded op times gives the recorded figures."""
    from importlib import resources

    import pandas as pd

    folder = resources.files("parplan").joinpath("data/calibration")
    ops = pd.read_csv(str(folder.joinpath("calibration.csv")))
    kind = load_devices(str(folder.joinpath("h200-measured.toml")))["h200-measured"]
    ms = [
        Measurement(r.op, r.shape, r.flops, r.bytes, int(r.kernels), r.measured_ms / 1e3)
        for r in ops.itertuples()
    ]
    fit = fit_device(ms, kind.flops_per_s, kind.memory_bytes_per_s)
    for key in (
        "efficiency",
        "conv_efficiency",
        "attention_efficiency",
        "memory_efficiency",
        "kernel_overhead_s",
    ):
        assert math.isclose(getattr(fit, key), getattr(kind, key), rel_tol=1e-3), key


def _recorded_memory(name):
    from importlib import resources

    import pandas as pd

    return pd.read_csv(str(resources.files("parplan").joinpath(f"data/calibration/{name}")))


@pytest.mark.parametrize(
    "case", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)]
)
def test_section_6_stores_what_a_compiled_llama_step_keeps(case):
    """docs/calibration.md "Memory on one GPU": the activations a compiled Llama-class decoder
    left allocated for backward on an H200 are section 1's stored elements to within 10%, and
    its weights, gradients and AdamW state are the model's less one token table (the model gives
    each of its two readers a copy)."""
    pytest.importorskip("transformers")
    from parplan.calibration.steps import predict_memory_bytes

    r = _recorded_memory("memory_compiled.csv").iloc[case]
    assert r.model.startswith("hf:llama") and not r.checkpoint
    state, act, _ = predict_memory_bytes(r.model, int(r.batch))
    assert 0.9 < act / (r.saved_bytes - r.output_bytes) < 1.0
    hidden = int(r.model.split("hidden_size=")[1].split(",")[0])
    table = 32000 * hidden * 8  # bf16 weight and gradient, two bf16 moments
    assert state - table == pytest.approx(r.params * 8, rel=0.01)
    # the measured side is that too, with up to a few percent of other live tensors (RoPE's, inputs)
    assert r.params * 8 <= r.state_bytes + r.grad_bytes <= r.params * 8 * 1.1


def test_section_6_3_checkpoints_blocks_as_the_frameworks_do():
    """The recorded per-block checkpointing runs of the Llama decoders: what the model keeps
    between forward and backward plus the largest block held again in backward is what the GPU
    held to within 15%."""
    pytest.importorskip("transformers")
    from parplan.calibration.steps import predict_memory_bytes

    rows = _recorded_memory("memory.csv")
    r = rows[(rows.checkpoint == 1) & rows.model.str.startswith("hf:llama")].iloc[0]
    _, kept, again = predict_memory_bytes(r.model, int(r.batch), recompute=True)
    measured_kept = r.saved_bytes - r.output_bytes
    measured_again = r.peak_bytes - r.saved_bytes - r.grad_bytes
    assert 0.85 < (kept + again) / (measured_kept + measured_again) < 1.15
    assert kept < measured_kept  # HF keeps fp32 copies of the last norm besides the checkpoints


def test_memory_measurement_needs_a_gpu(tmp_path, capsys):
    from parplan.calibration.steps import main

    assert main(["--memory", "--device", "cpu", "--out", str(tmp_path / "m.csv")]) == 2
    assert "--device must be cuda" in capsys.readouterr().err


def test_recomputation_costs_what_a_checkpointed_step_measured():
    """The recorded per-block checkpointing steps of the 4096-wide Llama decoders on an H200:
    section 6.3's forward again prices them within 10% on the calibrated kind."""
    pytest.importorskip("transformers")
    from importlib import resources

    from parplan.calibration.steps import predict_step_seconds

    folder = resources.files("parplan").joinpath("data/calibration")
    rows = _recorded_memory("steps_checkpointed.csv")
    r = rows[rows.model.str.contains("hidden_size=4096") & rows.model.str.contains("seq=4096")]
    assert len(r) == 1 and r.iloc[0]["mode"] == "eager, checkpointed"
    model, batch, measured = r.iloc[0].model, int(r.iloc[0].batch), r.iloc[0].fwd_bwd_ms / 1e3
    device = str(folder.joinpath("h200-measured.toml"))
    with_it = predict_step_seconds(model, batch, "h200-measured", device, recompute=True)
    without = predict_step_seconds(model, batch, "h200-measured", device)
    assert abs(with_it / measured - 1) < 0.1
    assert 1.25 < with_it / without < 1.35  # a third of the blocks' step again
