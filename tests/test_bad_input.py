"""Malformed and hostile input never crashes and never yields nonsense.

A corpus of bad inputs over every reader, the CLI and the Python API. Each case must end in a
clean error (exit status 2, one ``parplan: error:`` line naming the input, no traceback) or in
a correct answer with finite figures; none may run over 10 s.
"""

import json
import math
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parplan.cli import main
from parplan.errors import ParplanError

BASE = ["plan", "--model", "lenet", "--array", "h100:2", "--batch", "8"]
BAD_NUMBERS = ["nan", "inf", "-inf", "-1", "0", "1e400", "abc", ""]


def _run(capsys, argv):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse rejects the value itself (usage + one error line)
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _check(capsys, argv, must_fail: bool = True, message: str | None = None):
    # no wall-clock assertion: the machines are shared (how long bad input takes is a benchmark's question)
    code, out, err = _run(capsys, argv)
    assert "Traceback" not in err, (argv, err)
    if code == 0:
        assert not must_fail, (argv, "accepted", out[-300:])
        for token in ("nan", " inf"):
            assert token not in out.lower(), (argv, out[-300:])
        return out
    assert code == 2, (argv, code, err)
    last = err.strip().splitlines()[-1]
    assert last.startswith("parplan: error:") or ": error: argument" in last, (argv, err)
    if message:
        assert message in err, (argv, err)
    return err


# ----------------------------------------------------------------- numbers on the command line


@pytest.mark.parametrize(
    "option",
    [
        "--bandwidth",
        "--latency",
        "--bytes-per-element",
        "--optimizer-bytes",
        "--batch",
        "--share-grid",
        "--memory-limit",
    ],
)
@pytest.mark.parametrize("value", BAD_NUMBERS)
def test_bad_numbers_on_plan(capsys, option, value):
    fine = {
        ("--latency", "0"),
        ("--optimizer-bytes", "0"),
    }  # zero latency / no optimizer state are valid
    _check(capsys, BASE + [option, value], must_fail=(option, value) not in fine)


@pytest.mark.parametrize(
    "option, value",
    [
        ("--time-limit", "nan"),
        ("--time-limit", "-5"),
        ("--time-limit", "0"),
        ("--threads", "0"),
        ("--threads", "100000"),
        ("--seed", "-3"),
        ("--backend", "gurobi"),
        ("--planner", "fast"),
        ("--objective", "speed"),
        ("--shares", "some"),
        ("--memory-limit", "inf"),
        ("--memory-limit", "lots"),
    ],
)
def test_bad_solver_options(capsys, option, value):
    _check(
        capsys, ["solve", "--model", "lenet", "--array", "h100:2", "--batch", "8", option, value]
    )


def test_huge_but_valid_solver_numbers_work(capsys):
    out = _check(
        capsys,
        [
            "solve",
            "--model",
            "lenet",
            "--array",
            "h100:2",
            "--batch",
            "8",
            "--time-limit",
            "1e300",
            "--seed",
            "99999999999999999999999",
        ],
        must_fail=False,
    )
    assert "optimal" in out


# ----------------------------------------------------------------- arrays


@pytest.mark.parametrize(
    "array",
    [
        "",
        " ",
        ",",
        "h100:",
        ":4",
        "h100:0",
        "h100:-2",
        "h100:2.5",
        "h100:x",
        "nochip:2",
        "h100:2,,a100:2",
        "h100:100000000000000000000",
        "h100:70000",
        "h100:2@",
        "h100:2@ring",
        "h100:2@bogus:torus",
        "h100:2@ring:cube",
        "h100:2@ring:torus:9",
        "h100:2048@multitree:torus",
        "h100:2@ring:torus:x",
    ],
)
def test_bad_array_specs(capsys, array):
    _check(capsys, ["plan", "--model", "lenet", "--array", array])


TREES = {
    "nonutf8.json": b"\xff\xfe\x00",
    "deep.json": b"[" * 100000 + b"]" * 100000,
    "empty.json": b"",
    "list.json": b"[1, 2]",
    "string_bw.json": json.dumps(
        {"left": {"device": "h100"}, "right": {"device": "h100"}, "gb_per_s": "fast"}
    ).encode(),
    "nan_bw.toml": b"gb_per_s = nan\n[left]\ndevice='h100'\n[right]\ndevice='h100'\n",
    "inf_lat.toml": b"latency_us = inf\n[left]\ndevice='h100'\n[right]\ndevice='h100'\n",
    "neg_bw.json": json.dumps(
        {"left": {"device": "h100"}, "right": {"device": "h100"}, "gb_per_s": -1}
    ).encode(),
    "zero_right.json": json.dumps(
        {"left": {"device": "h100"}, "right": {"device": "h100"}, "gb_per_s_right": 0}
    ).encode(),
    "bool_bw.json": json.dumps(
        {"left": {"device": "h100"}, "right": {"device": "h100"}, "gb_per_s": True}
    ).encode(),
    "one_child.json": json.dumps({"left": {"device": "h100"}}).encode(),
    "num_device.json": json.dumps({"device": 5}).encode(),
    "unknown_device.json": json.dumps(
        {"left": {"device": "h200x"}, "right": {"device": "h100"}}
    ).encode(),
    "leaf_list.json": json.dumps({"left": [], "right": {"device": "h100"}}).encode(),
    "too_many.json": json.dumps(
        {"left": {"devices": "h100:40000"}, "right": {"devices": "h100:40000"}}
    ).encode(),
    "bad_toml.toml": b"left = [\n",
}


def test_array_file_that_is_a_directory(capsys, tmp_path):
    d = tmp_path / "tree.json"
    d.mkdir()
    _check(capsys, ["plan", "--model", "lenet", "--array", str(d)], message="is a directory")


# ----------------------------------------------------------------- device files

_REST = "memory_bytes=1e9\nmemory_bytes_per_s=1e9\nlink_bytes_per_s=1e9\nlink_latency_s=0\n"
DEVICES = {
    "nan.toml": "[x]\nflops_per_s = nan\n" + _REST,
    "inf.toml": "[x]\nflops_per_s = inf\n" + _REST,
    "string.toml": "[x]\nflops_per_s = 'fast'\n" + _REST,
    "missing.toml": "[x]\nflops_per_s = 1e12\n",
    "negative.toml": "[x]\nflops_per_s = -1e12\n" + _REST,
    "eff.toml": "[x]\nflops_per_s = 1e12\n" + _REST + "efficiency=2\n",
    "notable.toml": "x = 5\n",
    "broken.toml": "[x\n",
}


@pytest.mark.parametrize("name", sorted(DEVICES))
def test_bad_device_files(capsys, tmp_path, name):
    path = tmp_path / name
    path.write_text(DEVICES[name])
    _check(capsys, ["plan", "--model", "lenet", "--array", "x:2", "--devices", str(path)])


@pytest.mark.parametrize("content", [b"\xff\xfe", None])
def test_unreadable_device_files(capsys, tmp_path, content):
    path = tmp_path / "dev.toml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    _check(capsys, ["devices", "--devices", str(path)], message="device file")


# ----------------------------------------------------------------- model files and layer tables

MODELS = {
    "nonutf8.toml": b"\xff\xfe\x00",
    "nonutf8.json": b"\xff\xfe\x00",
    "nonutf8.csv": b"\xff\xfe\x00",
    "deep.json": b"[" * 100000 + b"]" * 100000,
    "list.json": b"[1, 2, 3]",
    "empty.toml": b"",
    "nolayers.toml": b'name = "x"\ninput = [3, 8, 8]\n',
    "badinput.toml": b'input = "big"\n[[layer]]\nname = "c"\ntype = "conv"\nout_channels = 4\nkernel = 3\n',
    "negin.toml": b'input = [-3, 8, 8]\n[[layer]]\nname = "c"\ntype = "conv"\nout_channels = 4\nkernel = 3\n',
    "strchan.toml": b'input = [3, 8, 8]\n[[layer]]\nname = "c"\ntype = "conv"\nout_channels = "many"\nkernel = 3\n',
    "zerochan.toml": b'input = [3, 8, 8]\n[[layer]]\nname = "c"\ntype = "conv"\nout_channels = 0\nkernel = 3\n',
    "hugechan.toml": b'input = [3, 8, 8]\n[[layer]]\nname = "c"\ntype = "conv"\n'
    b"out_channels = 100000000000000000000\nkernel = 3\n",
    "floatchan.toml": b'input = [3, 8, 8]\n[[layer]]\nname = "c"\ntype = "conv"\nout_channels = 4.5\nkernel = 3\n',
    "bigkernel.toml": b'input = [3, 8, 8]\n[[layer]]\nname = "c"\ntype = "conv"\nout_channels = 4\nkernel = 30\n',
    "unknowntype.toml": b'input = [3, 8, 8]\n[[layer]]\nname = "c"\ntype = "quantum"\n',
    "cycle.toml": (
        b'input = [3, 8, 8]\n[[layer]]\nname = "a"\ntype = "relu"\ninputs = ["b"]\n'
        b'[[layer]]\nname = "b"\ntype = "relu"\ninputs = ["a"]\n'
    ),
    "dangling.toml": b'input = [3, 8, 8]\n[[layer]]\nname = "a"\ntype = "relu"\ninputs = ["ghost"]\n',
    "dup.toml": (
        b'input = [3, 8, 8]\n[[layer]]\nname = "a"\ntype = "relu"\n'
        b'[[layer]]\nname = "a"\ntype = "relu"\n'
    ),
    "addmismatch.toml": (
        b'input = [3, 8, 8]\n[[layer]]\nname = "c"\ntype = "conv"\nout_channels = 4\nkernel = 3\n'
        b'[[layer]]\nname = "s"\ntype = "add"\ninputs = ["c", "input"]\n'
    ),
    "noname.toml": b'input = [3, 8, 8]\n[[layer]]\ntype = "relu"\n',
    "layerlist.json": json.dumps({"input": [3, 8, 8], "layers": [5]}).encode(),
    "table_fields.csv": b"name,type,in_channels,out_channels,in_h,in_w,out_h,out_w,kernel\nc1,conv,3,8\n",
    "table_type.csv": b"c1,rnn,3,8,32,32,32,32,3\n",
    "table_neg.csv": b"c1,conv,3,-8,32,32,32,32,3\n",
    "table_chain.csv": b"c1,conv,3,8,32,32,32,32,3\nc2,conv,9,8,32,32,32,32,3\n",
    "table_grow.csv": b"c1,conv,3,8,32,32,16,16,3\nc2,conv,8,8,32,32,32,32,3\n",
    "table_header.csv": b"name,kind,a,b\n",
    "table_empty.csv": b"# nothing\n",
    "table_huge.csv": b"c1,conv,3,99999999999999999999999,32,32,32,32,3\n",
    "model.yaml": b"layers: []\n",
}


@pytest.mark.parametrize(
    "spec", ["nope", "", "missing.toml", "missing.onnx", "missing.py:build", "x.py:", "tests:build"]
)
def test_bad_model_names(capsys, spec):
    _check(capsys, ["plan", "--model", spec, "--array", "h100:2"])


def test_model_file_that_is_a_directory(capsys, tmp_path):
    d = tmp_path / "net.toml"
    d.mkdir()
    _check(capsys, ["plan", "--model", str(d), "--array", "h100:2"], message="net.toml")


# ----------------------------------------------------------------- collectives and pipelines


@pytest.mark.parametrize(
    "argv",
    [
        ["--topology", "torus", "--dims", "1000x1000"],
        ["--topology", "torus", "--dims", "0x4"],
        ["--topology", "torus", "--dims", "4"],
        ["--topology", "torus", "--dims", "axb"],
        ["--topology", "ring", "--nodes", "1"],
        ["--topology", "ring", "--nodes", "99999999999"],
        ["--topology", "ring", "--nodes", "8", "--bytes", "1e400"],
        ["--topology", "ring", "--nodes", "8", "--bytes", "nan"],
        ["--topology", "ring", "--nodes", "8", "--bytes", "-5MB"],
        ["--topology", "ring", "--nodes", "8", "--bytes", "5XB"],
        ["--topology", "ring", "--nodes", "8", "--bandwidth", "0"],
        ["--topology", "ring", "--nodes", "8", "--bandwidth", "nan"],
        ["--topology", "ring", "--nodes", "8", "--latency", "-1"],
        ["--topology", "ring", "--nodes", "8", "--latency", "inf"],
        ["--topology", "ring", "--nodes", "8", "--ports", "9"],
        ["--topology", "hypercube", "--nodes", "8"],
        ["--topology", "missing_edges.txt"],
        ["--topology", "fattree", "--nodes", "100000000"],
    ],
)
def test_bad_allreduce_inputs(capsys, argv):
    _check(capsys, ["allreduce", *argv])


TOPOLOGIES = {
    "nonutf8.txt": b"\xff\xfe",
    "words.txt": b"a b c d e\n",
    "selfloop.txt": b"0 0\n",
    "negbw.txt": b"0 1 -5\n1 0 5\n",
    "nanbw.txt": b"0 1 nan\n",
    "empty.txt": b"# nothing\n",
    "disconnected.txt": b"0 1\n2 3\n",
}


PROFILES = {
    "nonutf8.txt": b"\xff\xfe",
    "empty.txt": b"",
    "garbage.txt": b"this is not a profile\n",
    "nan.txt": b"node1 -- Conv2d -- forward_compute_time=nan, backward_compute_time=1.0, activation_size=1.0, "
    b"parameter_size=1.0\n",
}


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "lenet", "--array", "v100:4", "--bandwidth", "nan"],
        ["--model", "lenet", "--array", "v100:4", "--memory-limit", "-1"],
        ["--model", "lenet", "--array", "v100:4", "--batch", "0"],
        ["--model", "lenet", "--array", "nochip:4"],
    ],
)
def test_bad_pipeline_options(capsys, argv):
    _check(capsys, ["pipeline", *argv])


# ----------------------------------------------------------------- every bad file, through its command

FILE_ARGV = {
    "array": lambda path: ["plan", "--model", "lenet", "--array", path],
    "model": lambda path: ["plan", "--model", path, "--array", "h100:2", "--batch", "8"],
    "topology": lambda path: ["allreduce", "--topology", path, "--bytes", "1MB"],
    "profile": lambda path: ["pipeline", "--profile", path, "--array", "v100:4"],
}
FILES = {"array": TREES, "model": MODELS, "topology": TOPOLOGIES, "profile": PROFILES}


@pytest.mark.parametrize(
    "kind, name", [(k, n) for k, files in FILES.items() for n in sorted(files)]
)
def test_bad_files(capsys, tmp_path, kind, name):
    path = tmp_path / name
    path.write_bytes(FILES[kind][name])
    _check(capsys, FILE_ARGV[kind](str(path)), message=name if kind == "array" else None)


# ----------------------------------------------------------------- output paths


@pytest.mark.parametrize("option", ["--plot", "--save"])
def test_bad_output_paths(capsys, tmp_path, option):
    _check(capsys, BASE + [option, str(tmp_path)], message="is a directory")
    _check(capsys, BASE + [option, str(tmp_path / "missing" / "x")], message="does not exist")


@pytest.mark.parametrize("option", ["--write-lp", "--write-mps", "--save"])
def test_bad_solve_output_paths(capsys, tmp_path, option):
    _check(
        capsys,
        ["solve", "--model", "lenet", "--array", "h100:2", option, str(tmp_path / "no" / "m.lp")],
        message="does not exist",
    )


def test_bad_bench_out(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    _check(capsys, ["bench", "allreduce", "--quick", "--out", str(f)], message="is a file")


# ----------------------------------------------------------------- the Python API


def _api_cases():
    import parplan
    from parplan.costmodel.problem import Plan, Split

    p = parplan.Problem(parplan.load_model("lenet"), parplan.parse_array("h100:2"), batch=8)
    return [
        lambda: parplan.Problem(
            parplan.load_model("lenet"), parplan.parse_array("h100:2"), batch="8"
        ),
        lambda: parplan.Problem(
            parplan.load_model("lenet"), parplan.parse_array("h100:2"), batch=8.0
        ),
        lambda: parplan.Problem(
            parplan.load_model("lenet"), parplan.parse_array("h100:2"), batch=-1
        ),
        lambda: parplan.Problem(
            parplan.load_model("lenet"),
            parplan.parse_array("h100:2"),
            batch=8,
            bytes_per_element=float("nan"),
        ),
        lambda: parplan.Problem(parplan.load_model("lenet"), "h100:2", batch=8),
        lambda: parplan.Problem("lenet", parplan.parse_array("h100:2"), batch=8),
        lambda: parplan.parse_array(5),
        lambda: parplan.parse_array(None),
        lambda: parplan.parse_array("h100:2", bandwidth_bytes_per_s=float("inf")),
        lambda: parplan.parse_array("h100:2", latency_s="slow"),
        lambda: parplan.load_model(7),
        lambda: parplan.load_model(None),
        lambda: parplan.plan(p, 5),
        lambda: parplan.plan(p, "accpar", share_grid=0),
        lambda: parplan.plan("lenet", "accpar"),
        lambda: parplan.evaluate(p, "plan"),
        lambda: parplan.evaluate(p, Plan({"": Split((parplan.PartitionType.BATCH,), (0.5,))})),
        lambda: parplan.evaluate(p, Plan({})),
        lambda: parplan.solve(p, "gurobi"),
        lambda: parplan.solve(p, "scip", time_limit_s=-1),
        lambda: parplan.solve(p, "scip", memory_limit_bytes="lots"),
        lambda: Split((parplan.PartitionType.BATCH,), (1.5,)),
        lambda: Split((parplan.PartitionType.BATCH,), (float("nan"),)),
    ]


@pytest.mark.parametrize("index", range(23))
def test_api_wrong_arguments_raise_parplan_errors(index):
    case = _api_cases()[index]
    with pytest.raises(ParplanError):
        case()


def test_numpy_integers_are_integers():
    import parplan

    p = parplan.Problem(
        parplan.load_model("lenet"), parplan.parse_array("h100:2"), batch=np.int64(8)
    )
    plan = parplan.plan(p, "accpar", share_grid=np.int32(4))
    assert parplan.evaluate(p, plan).step_time_s > 0


# ----------------------------------------------------------------- property: finite, non-negative times


@settings(max_examples=25)
@given(
    model=st.sampled_from(["lenet", "alexnet", "resnet18", "sfc"]),
    array=st.sampled_from(["h100:2", "tpu-v2:1,tpu-v3:1", "v100:2,h100:2", "h100:4@ring:ring"]),
    batch=st.integers(min_value=1, max_value=2**20),
    bandwidth=st.one_of(st.none(), st.floats(min_value=1e-3, max_value=1e6)),
    latency=st.one_of(st.none(), st.floats(min_value=0.0, max_value=1e4)),
    bpe=st.floats(min_value=0.125, max_value=64),
    planner=st.sampled_from(["accpar", "hypar", "owt", "data", "model"]),
)
def test_accepted_inputs_give_finite_non_negative_times(
    model, array, batch, bandwidth, latency, bpe, planner
):
    import parplan

    arr = parplan.parse_array(
        array,
        bandwidth_bytes_per_s=None if bandwidth is None else bandwidth * 1e9,
        latency_s=None if latency is None else latency * 1e-6,
    )
    p = parplan.Problem(parplan.load_model(model), arr, batch=batch, bytes_per_element=bpe)
    ev = parplan.evaluate(p, parplan.plan(p, planner, share_grid=4))
    assert math.isfinite(ev.step_time_s) and ev.step_time_s > 0
    assert all(math.isfinite(t) and t >= 0 for t in ev.node_time_s)
    assert math.isfinite(ev.communication_bytes) and ev.communication_bytes >= 0
    assert math.isfinite(ev.peak_memory_bytes) and ev.peak_memory_bytes > 0


# ----------------------------------------------------------------- ONNX files and pipes


@pytest.mark.parametrize("kind", ["no_nodes", "no_inputs", "garbage"])
def test_bad_onnx_files(capsys, tmp_path, kind):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    path = tmp_path / f"{kind}.onnx"
    if kind == "garbage":
        path.write_bytes(b"\x00\x01not a protobuf")
    else:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
        inputs = [x] if kind == "no_nodes" else []
        onnx.save(
            helper.make_model(helper.make_graph([], kind, inputs, [x] if inputs else [])), str(path)
        )
    _check(capsys, ["plan", "--model", str(path), "--array", "h100:2"])


def test_output_piped_into_a_closed_reader_ends_quietly():
    import subprocess
    import sys

    # `parplan allreduce ... --show-steps | head -1`: 110 kB of output, more than a pipe holds;
    # the reader closes the pipe after one line.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "parplan.cli",
            "allreduce",
            "--topology",
            "torus",
            "--dims",
            "8x8",
            "--algorithm",
            "ring",
            "--bytes",
            "1MB",
            "--show-steps",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_model_files_that_fail_and_hub_specs_without_torch_are_one_line(
    tmp_path, monkeypatch, capsys
):
    """A user's model file with a syntax error, a failing import or a factory that raises, and
    hf:/tv: specs where torch is missing: one error line naming the file, line or extra."""
    from parplan.cli import main

    cases = {
        "syntax.py": ("def f(:\n    pass\n", "SyntaxError at line 1"),
        "raises.py": (
            "def f():\n    raise ValueError('bad width')\n",
            "f() raised ValueError: bad width (line 2",
        ),
        "needs.py": (
            "import torch\ndef f():\n    pass\n",
            "it imports torch, which is not installed",
        ),
    }
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        assert main(["plan", "--model", f"{path}:f", "--array", "h100:2"]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    for spec, extra in (("hf:gpt2", "hf"), ("tv:resnet18", "vision")):
        assert main(["plan", "--model", spec, "--array", "h100:2"]) == 2
        err = capsys.readouterr().err
        assert f'is built with torch, which is not installed: pip install -e ".[{extra}]"' in err, (
            err
        )


def test_bound_under_compat_rules_is_refused_before_planning(capsys, monkeypatch):
    """``plan --bound --compat accpar-code`` is refused with a clear message before any planning
    (it used to plan, then fail without printing the plan)."""
    import parplan.solvers.fit as fit
    import parplan.solvers.planners as planners

    def no_planning(*args, **kwargs):
        raise AssertionError("planned before refusing --bound")

    monkeypatch.setattr(planners, "make_plan", no_planning)
    monkeypatch.setattr(fit, "fit_plan", no_planning)
    argv = ["plan", "--model", "alexnet", "--array", "h100:8", "--compat", "accpar-code"]
    _check(capsys, argv + ["--bound"], message="--bound: the global bound is for parplan's own")
