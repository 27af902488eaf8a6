"""Device kinds and array trees."""

import math

import pytest

from parplan.costmodel.hardware import load_devices, parse_array
from parplan.errors import ConfigError, HardwareError


def test_published_tpu_figures():
    d = load_devices()
    assert d["tpu-v3"].flops_per_s == 123e12 and d["tpu-v3"].memory_bytes == 32 * 2**30
    assert d["tpu-v2"].flops_per_s == 45e12 and d["tpu-v2"].memory_bytes == 16 * 2**30
    assert d["tpu-v2"].memory_bytes_per_s == 600e9 and d["tpu-v3"].memory_bytes_per_s == 900e9
    assert {"v100", "a100", "h100"} <= set(d)


def test_short_forms_build_balanced_trees():
    a = parse_array("tpu-v2:128,tpu-v3:128")
    assert a.count == 256 and a.depth == 8
    assert {d.name for d in a.left.devices()} == {"tpu-v2"} and {
        d.name for d in a.right.devices()
    } == {"tpu-v3"}
    assert math.isclose(a.left.flops_per_s, 128 * 45e12)
    h = parse_array("h100:8")
    assert h.count == 8 and h.depth == 3 and len(list(h.inner_nodes())) == 7
    odd = parse_array("a100:3")
    assert odd.count == 3 and odd.left.count == 2


def test_link_defaults_and_overrides():
    a = parse_array("tpu-v2:1,tpu-v3:1")
    assert a.link.bytes_per_s == 62.5e9  # the slower side's link
    b = parse_array("tpu-v2:1,tpu-v3:1", bandwidth_bytes_per_s=1e9, latency_s=5e-6)
    assert b.link.bytes_per_s == 1e9 and b.link.latency_s == 5e-6


def test_user_device_file_and_tree_file(tmp_path):
    f = tmp_path / "dev.toml"
    f.write_text(
        "[mychip]\nflops_per_s = 1e12\nmemory_bytes = 1e9\nmemory_bytes_per_s = 1e11\n"
        "link_bytes_per_s = 1e10\nlink_latency_s = 0\n"
    )
    kinds = load_devices(f)
    assert parse_array("mychip:4", devices=kinds).flops_per_s == 4e12
    tree = tmp_path / "arr.json"
    tree.write_text(
        '{"left": {"devices": "h100:2"}, "right": {"device": "a100"}, "gb_per_s": 25, "latency_us": 3}'
    )
    t = parse_array(str(tree))
    assert t.count == 3 and t.link.bytes_per_s == 25e9 and math.isclose(t.link.latency_s, 3e-6)


@pytest.mark.parametrize(
    "spec,msg",
    [
        ("h100:0", "count must be > 0"),
        ("foo:2", "unknown device 'foo'"),
        ("", "array must be a string"),
    ],
)
def test_bad_arrays(spec, msg):
    with pytest.raises(HardwareError, match=msg):
        parse_array(spec)


def test_bad_device_file(tmp_path):
    f = tmp_path / "d.toml"
    f.write_text("[x]\nflops_per_s = -1\n")
    with pytest.raises(HardwareError, match="device 'x': missing"):
        load_devices(f)


def test_group_at_a_path():
    a = parse_array("tpu-v2:2,tpu-v3:2")
    assert a.at("") is a and a.at("LR") is a.left.right and a.at("R").count == 2
    for bad in ("LRL", "X"):
        with pytest.raises(ConfigError, match="has no group"):
            a.at(bad)


def test_interchangeable_halves(tmp_path):
    """Same devices in the same tree and the same link each way; never a leaf."""
    assert (
        parse_array("h100:8").interchangeable_halves
        and parse_array("h100:8").left.interchangeable_halves
    )
    assert not parse_array("tpu-v2:1,tpu-v3:1").interchangeable_halves  # different devices
    assert not parse_array("h100:3").interchangeable_halves  # one device against two
    assert not parse_array("h100:1").interchangeable_halves
    tree = tmp_path / "asym.json"
    tree.write_text(
        '{"left": {"device": "h100"}, "right": {"device": "h100"}, "gb_per_s_left": 1, "gb_per_s_right": 100}'
    )
    assert not parse_array(str(tree)).interchangeable_halves  # a link faster one way


def _links(spec, **kw):
    """Per split path: (one port's GB/s, ports, latency us) of parse_array(spec)."""
    return {
        p: (n.link.bytes_per_s / 1e9, n.link.ports, round(n.link.latency_s * 1e6, 3))
        for p, n in parse_array(spec, **kw).inner_nodes()
    }


def test_switched_nodes_and_network_rails_give_a_port_per_device():
    """docs/costmodel.md section 4.1, written out: inside an H100 node every split has a port per
    device of the smaller half at 450 GB/s; between nodes, a 50 GB/s rail per GPU of the smaller
    half; mixed kinds one link; ``fabric="papers"`` one link everywhere."""
    one = _links("h100:8")
    assert (
        one[""] == (450.0, 4, 2.0) and one["L"] == (450.0, 2, 2.0) and one["LL"] == (450.0, 1, 2.0)
    )
    two = _links("h100:16")
    assert (
        two[""] == (50.0, 8, 5.0) and two["L"] == (450.0, 4, 2.0) and two["RRR"] == (450.0, 1, 2.0)
    )
    three = _links("h100:24")  # nodes split 2 | 1: the one node's 8 rails
    assert (
        three[""] == (50.0, 8, 5.0)
        and three["L"] == (50.0, 8, 5.0)
        and three["R"] == (450.0, 4, 2.0)
    )
    assert _links("h100:8,h100:8") == two  # two parts of one switched kind: two nodes
    assert _links("a100:16")[""] == (25.0, 8, 5.0)
    assert _links("h100:6")[""] == (450.0, 3, 2.0) and _links("h100:6")["L"] == (450.0, 1, 2.0)
    assert set(_links("tpu-v2:4", fabric="papers").values()) == {(62.5, 1, 1.0)}
    assert _links("h100:4,a100:4")[""] == (300.0, 1, 2.0)  # different kinds: one link
    assert set(_links("h100:16", fabric="papers").values()) == {(450.0, 1, 2.0)}
    over = _links("h100:16", bandwidth_bytes_per_s=10e9, latency_s=1e-6)  # overrides set one port
    assert over[""] == (10.0, 8, 1.0) and over["L"] == (10.0, 4, 1.0)
    assert parse_array("h100:16").link.side_bytes_per_s == (400e9, 400e9)
    with pytest.raises(HardwareError, match="fabric must be one of devices, papers"):
        parse_array("h100:2", fabric="nvlink")


def test_tree_files_take_ports_and_device_files_take_a_fabric(tmp_path):
    tree = tmp_path / "t.toml"
    tree.write_text(
        'gb_per_s = 50\nports = 4\n[left]\ndevices = "h100:4"\n[right]\ndevices = "h100:4"\n'
    )
    assert _links(str(tree))[""] == (50.0, 4, 2.0)
    tree.write_text(
        'gb_per_s = 50\nports = 5\n[left]\ndevices = "h100:4"\n[right]\ndevices = "h100:4"\n'
    )
    with pytest.raises(
        HardwareError, match="'ports' must be an integer from 1 to the smaller half's 4 devices"
    ):
        parse_array(str(tree))
    dev = tmp_path / "d.toml"
    base = (
        "[x]\nflops_per_s = 1e12\nmemory_bytes = 1e9\nmemory_bytes_per_s = 1e9\nlink_bytes_per_s = 1e9\n"
        "link_latency_s = 0\n"
    )
    dev.write_text(base + "switch_devices = 2\nnic_bytes_per_s = 1e8\n")
    links = _links("x:4", devices=load_devices(dev))
    assert links[""] == (0.1, 2, 0.0) and links["L"] == (1.0, 1, 0.0)  # no nic latency: the link's
    for bad, message in (
        ("switch_devices = 1.5", "switch_devices must be an integer >= 0"),
        ("switch_devices = true", "switch_devices must be an integer >= 0"),
        ("nic_bytes_per_s = 0", "nic_bytes_per_s must be > 0"),
        ("nic_latency_s = -1", "nic_latency_s must be >= 0"),
    ):
        dev.write_text(base + bad + "\n")
        with pytest.raises(HardwareError, match=message):
            load_devices(dev)


def test_bad_device_names_and_collectives_are_one_clear_error(tmp_path):
    from parplan.costmodel.collective import parse_collective

    figures = "flops_per_s=1e12\nmemory_bytes=1e9\nmemory_bytes_per_s=1e9\nlink_bytes_per_s=1e9\nlink_latency_s=0\n"
    for name in ('""', '"a b"', '"x:2"'):
        path = tmp_path / "d.toml"
        path.write_text(f"[{name}]\n{figures}")
        with pytest.raises(HardwareError, match="must be non-empty, without spaces"):
            load_devices(path)
    with pytest.raises(HardwareError, match="collective must be a string"):
        parse_collective(None)


def test_machine_names_count_nodes():
    """``dgx-h100:N`` is N nodes of 8 H100s (issue 31's built-in machines)."""
    assert _links("dgx-h100:2") == _links("h100:16")
    assert (
        parse_array("dgx-a100:3").count == 24 and parse_array("hgx-h200:1").describe() == "h200:8"
    )
    assert parse_array("DGX-H100:1,tpu-v3:8").count == 16


def test_tpu_chips_form_a_torus_and_a_split_uses_every_link_its_cut_crosses():
    """TPU v2/v3 (torus_dims = 2; docs/costmodel.md section 4.1): 16 chips are a 4 x 4 torus;
    the root cut crosses 4 links twice (wrap-around), then 2 x 4 with one side still wrapping
    (4 links), 2 x 2 (2), 1 x 2 (1). The papers' hierarchical exchange of a gradient then costs
    |W| / BW * (1/8 + 1/4 + 1/2 + 1), a ring all-reduce's 2 * 15/16 * |W| / BW."""
    from parplan.costmodel.hardware import torus_shape

    links = _links("tpu-v3:16")
    ports = {len(path): links[path][1] for path in links}
    assert ports == {0: 8, 1: 4, 2: 2, 3: 1} and links[""][0] == 82.0
    assert len({links[p] for p in links if len(p) == 2}) == 1  # every group of a level alike
    ring = 2 * 15 / 16
    assert sum(1 / ports[d] for d in ports) == pytest.approx(ring)
    assert torus_shape(128, 2) == (16, 8) and torus_shape(8, 3) == (2, 2, 2)
    assert _links("tpu-v3:64")[""][1] == 16  # an 8 x 8 torus's bisection
    # different kinds, or the papers' fabric: one link per split, as before
    assert _links("tpu-v2:2,tpu-v3:2")[""][1] == 1
    assert set(p for _, p, _ in _links("tpu-v3:16", fabric="papers").values()) == {1}
    with pytest.raises(HardwareError, match="torus_dims must be one of 0, 1, 2, 3"):
        from parplan.costmodel.hardware import _check_kind

        _check_kind(
            "x",
            {
                "flops_per_s": 1e12,
                "memory_bytes": 1e9,
                "memory_bytes_per_s": 1e9,
                "link_bytes_per_s": 1e9,
                "link_latency_s": 0,
                "torus_dims": 5,
            },
        )
