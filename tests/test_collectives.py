"""Collectives: topologies, all-reduce schedules (ring, dbtree, 2D ring, MultiTree), validator,
time model, benchmark and CLI."""

import argparse
import dataclasses
import doctest
import json
import math

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import parplan.collectives.allreduce as allreduce_module
import parplan.collectives.topology as topology_module
from parplan.collectives import (
    Algorithm,
    Topology,
    allreduce_seconds,
    build_schedule,
    fat_tree,
    from_edge_list,
    lower_bound_steps,
    mesh2d,
    parse_topology,
    ring,
    schedule_seconds,
    torus2d,
    validate_schedule,
)
from parplan.collectives.allreduce import Op, Schedule
from parplan.errors import ConfigError

REL = 1e-9
MB64 = 64 * 2**20


def test_doctests():
    for mod in (topology_module, allreduce_module):
        assert doctest.testmod(mod).failed == 0


# ----------------------------------------------------------------------------------------------
# Topologies


def test_topology_shapes():
    r = ring(8)
    assert r.size == 8 and r.graph.number_of_edges() == 16 and r.ports == 2
    m = mesh2d(4, 4)
    assert m.graph.number_of_edges() == 2 * (2 * 4 * 3) and m.ports == 4
    assert sorted(d for _, d in m.graph.out_degree())[:4] == [2, 2, 2, 2]  # corners
    t = torus2d(8, 8)
    assert all(d == 4 for _, d in t.graph.out_degree()) and t.graph.number_of_edges() == 4 * 64
    f = fat_tree(16)
    assert f.size == 16 and f.ports == 1 and f.switched
    assert sum(1 for n in f.graph if isinstance(n, str) and n.startswith("spine")) == 4
    assert all(f.graph.out_degree(h) == 1 for h in f.hosts)


def test_routes_are_shortest_and_deterministic():
    t = torus2d(8, 8)
    for src, dst in [(0, 63), (9, 14), (5, 61)]:
        route = t.route(src, dst)
        assert route[0][0] == src and route[-1][1] == dst
        assert len(route) == nx.shortest_path_length(t.graph, src, dst)
    m = mesh2d(4, 4)
    assert m.route(0, 15) == ((0, 1), (1, 2), (2, 3), (3, 7), (7, 11), (11, 15))  # X then Y
    f = fat_tree(16)
    assert f.route(0, 1) == ((0, "leaf0"), ("leaf0", 1))
    assert f.route(1, 14)[1] == ("leaf0", "spine2")  # destination mod 4


def test_parse_topology_and_errors():
    assert parse_topology("torus", dims="4x4").name == "torus4x4"
    assert parse_topology("mesh:2x8", ports=2).ports == 2
    assert parse_topology("torus", nodes=16).dims == (4, 4)
    assert parse_topology("fattree:32").size == 32
    with pytest.raises(ConfigError, match=r"topology 'torus' needs dimensions: --dims RxC"):
        parse_topology("torus")
    with pytest.raises(ConfigError, match=r"topology 'ring' needs a node count: --nodes N"):
        parse_topology("ring")
    with pytest.raises(
        ConfigError, match="topology 'hypercube': not one of ring, mesh, torus, fattree"
    ):
        parse_topology("hypercube")
    with pytest.raises(ConfigError, match=r"dims '4by4': expected ROWSxCOLS or XxYxZ, as in '4x4'"):
        parse_topology("mesh", dims="4by4")
    with pytest.raises(
        ConfigError, match=r"topology 'ring8': ports must be an integer from 1 to 4 \(got 5\)"
    ):
        ring(8, ports=5)
    with pytest.raises(ConfigError, match=r"fat tree: 10 hosts do not divide into leaves of 4"):
        fat_tree(10, hosts_per_leaf=4)


def test_edge_list_file(tmp_path):
    path = tmp_path / "star.txt"
    path.write_text("# a switch with 4 hosts\nswitch s\n0 s 100\n1 s 100\n2 s 50 2\n3 s\n")
    t = from_edge_list(path)
    assert t.hosts == ("0", "1", "2", "3") and t.switched and t.ports == 1
    assert t.link("s", "2") == (50e9, 2e-6)
    assert t.route("0", "3") == (("0", "s"), ("s", "3"))
    for alg in Algorithm:
        assert validate_schedule(build_schedule(alg, t)).ok
    bad = tmp_path / "bad.txt"
    bad.write_text("0 1\n1 2 fast\n")
    with pytest.raises(
        ConfigError,
        match=r"topology file '.*bad.txt' line 2: bandwidth and latency must be numbers",
    ):
        from_edge_list(bad)
    for line in ("0 1 10 nan", "0 1 inf", "0 1 0"):
        bad.write_text(line + "\n")
        with pytest.raises(
            ConfigError, match="need a finite GB/s > 0 and a finite latency_us >= 0"
        ):
            from_edge_list(bad)
    apart = tmp_path / "apart.txt"
    apart.write_text("0 1\n2 3\n")
    with pytest.raises(ConfigError, match="the network is not connected"):
        from_edge_list(apart)


# ----------------------------------------------------------------------------------------------
# Schedules: validity on every topology


TOPOLOGIES = {
    "ring16": lambda: ring(16),
    "ring16-1port": lambda: ring(16, ports=1),
    "mesh4x4": lambda: mesh2d(4, 4),
    "mesh8x8": lambda: mesh2d(8, 8),
    "mesh3x5-2port": lambda: mesh2d(3, 5, ports=2),
    "torus4x4": lambda: torus2d(4, 4),
    "torus8x8": lambda: torus2d(8, 8),
    "torus4x4-1port": lambda: torus2d(4, 4, ports=1),
    "torus3x3-3port": lambda: torus2d(3, 3, ports=3),
    "fattree16": lambda: fat_tree(16),
    "fattree16-2port": lambda: fat_tree(16, ports=2),
}


@pytest.fixture(scope="module")
def topologies():
    return {name: make() for name, make in TOPOLOGIES.items()}


@pytest.mark.parametrize("name", list(TOPOLOGIES))
@pytest.mark.parametrize("algorithm", [a.value for a in Algorithm])
def test_every_schedule_is_valid(topologies, name, algorithm):
    topo = topologies[name]
    sched = build_schedule(algorithm, topo)
    check = validate_schedule(sched)
    assert check.ok, check.problems
    assert check.max_link_uses == 1 and check.max_port_uses <= topo.ports
    assert sched.steps > 0


@pytest.mark.parametrize("pieces", [2, 8])
def test_pipelined_dbtree_is_valid(topologies, pieces):
    sched = build_schedule("dbtree", topologies["torus4x4"], pieces=pieces)
    assert validate_schedule(sched).ok and len(sched.chunk_fractions) == 2 * pieces


def test_ring_and_2d_ring_step_counts(topologies):
    for name in ("ring16", "torus4x4", "mesh4x4", "fattree16"):
        assert build_schedule("ring", topologies[name]).phase_steps == (15, 15)
    assert build_schedule("ring", topologies["torus8x8"]).phase_steps == (63, 63)
    # 2D ring on an R x C torus: (C-1) + (R-1) steps per phase.
    assert build_schedule("2dring", topologies["torus4x4"]).phase_steps == (6, 6)
    assert build_schedule("2dring", topologies["torus8x8"]).phase_steps == (14, 14)


def test_multitree_builds_one_spanning_tree_per_root(topologies):
    topo = topologies["torus4x4"]
    sched = build_schedule("multitree", topo)
    T = sched.phase_steps[0]
    for root in topo.hosts:
        copies = [t for t in sched.transfers if t.op is Op.COPY and t.chunks == (root,)]
        tree = nx.DiGraph([(t.src, t.dst) for t in copies])
        assert len(copies) == topo.size - 1
        assert nx.is_arborescence(tree) and [n for n, d in tree.in_degree() if d == 0] == [root]
        # Every tree edge is a physical link, used down in all-gather step t and up in step T+1-t.
        ups = {
            (t.dst, t.src): t.step
            for t in sched.transfers
            if t.op is Op.REDUCE and t.chunks == (root,)
        }
        for t in copies:
            assert topo.graph.has_edge(t.src, t.dst)
            assert ups[(t.src, t.dst)] == 2 * T + 1 - t.step


@pytest.mark.parametrize("k, expected_bound", [(4, 4), (8, 16)])
def test_multitree_steps_on_torus_near_lower_bound(topologies, k, expected_bound):
    topo = topologies[f"torus{k}x{k}"]
    n = k * k
    assert lower_bound_steps(topo) == expected_bound == math.ceil((n - 1) / 4)
    mt = build_schedule("multitree", topo)
    rg = build_schedule("ring", topo)
    assert mt.phase_steps[0] == mt.phase_steps[1]
    assert expected_bound <= mt.phase_steps[0] <= expected_bound + 2
    assert rg.phase_steps[0] == n - 1 and mt.phase_steps[0] <= (n - 1) / 3


def test_multitree_is_optimal_where_the_bound_is_tight(topologies):
    # A ring with 2 ports needs ceil((N-1)/2); a mesh corner has 2 links, so ceil((N-1)/2).
    for name, steps in (("ring16", 8), ("mesh8x8", 32)):
        topo = topologies[name]
        assert build_schedule("multitree", topo).phase_steps[0] == steps == lower_bound_steps(topo)
    assert build_schedule("multitree", topologies["fattree16"]).phase_steps[0] == 15


@settings(max_examples=25)
@given(
    n=st.integers(3, 12),
    extra=st.integers(0, 10),
    ports=st.integers(1, 4),
    seed=st.integers(0, 10_000),
)
def test_random_graphs_get_valid_schedules(n, extra, ports, seed):
    g = (
        nx.random_labeled_tree(n, seed=seed)
        if hasattr(nx, "random_labeled_tree")
        else nx.random_tree(n, seed=seed)
    )
    rng = __import__("random").Random(seed)
    for _ in range(extra):
        u, v = rng.sample(range(n), 2)
        g.add_edge(u, v)
    dg = nx.DiGraph()
    for u, v in g.edges:
        dg.add_edge(u, v, bytes_per_s=rng.choice([10e9, 25e9]), latency_s=1e-6)
        dg.add_edge(v, u, bytes_per_s=dg.edges[u, v]["bytes_per_s"], latency_s=1e-6)
    topo = Topology(f"random{seed}", "custom", dg, tuple(range(n)), ports)
    for alg in Algorithm:
        sched = build_schedule(alg, topo)
        check = validate_schedule(sched)
        assert check.ok, (alg, check.problems)
    mt = build_schedule("multitree", topo)
    assert mt.phase_steps[0] >= lower_bound_steps(topo)


# ----------------------------------------------------------------------------------------------
# Validator catches broken schedules


def _replace(sched: Schedule, transfers) -> Schedule:
    return dataclasses.replace(sched, transfers=tuple(transfers))


def test_validator_reports_contention_ports_and_missing_data():
    topo = ring(4, ports=1)
    good = build_schedule("ring", topo)
    assert validate_schedule(good).ok
    first = good.transfers[0]
    # The same transfer twice in a step: its link is used twice and its sender's port too.
    dup = validate_schedule(_replace(good, list(good.transfers) + [first]))
    assert not dup.ok
    assert any(
        f"link {first.route[0][0]}->{first.route[0][1]} used 2 times" in p for p in dup.problems
    )
    assert any("uses 2 ports (has 1)" in p for p in dup.problems)
    assert any("adds contributions twice" in p for p in dup.problems)
    # Dropping the last all-gather step leaves hosts without the full result.
    short = validate_schedule(_replace(good, [t for t in good.transfers if t.step < good.steps]))
    assert not short.ok and "end incomplete" in short.problems[-1]
    # A route that is not a path between its ends.
    bad_route = dataclasses.replace(first, route=((first.src, (first.src + 2) % 4),))
    broken = validate_schedule(_replace(good, [bad_route] + list(good.transfers[1:])))
    assert any("is not a path" in p or "does not exist" in p for p in broken.problems)


# ----------------------------------------------------------------------------------------------
# Time model


def test_time_model_matches_closed_forms():
    bw, lat, data = 10e9, 2e-6, 8e9
    topo = ring(8, bytes_per_s=bw, latency_s=lat, ports=1)
    # Ring: 2 (N-1) steps of latency + D/N / B.
    assert math.isclose(
        allreduce_seconds("ring", topo, data), 2 * 7 * (lat + data / 8 / bw), rel_tol=REL
    )
    t = torus2d(4, 4, bytes_per_s=bw, latency_s=lat)
    mt = build_schedule("multitree", t)
    expected = mt.steps * (lat + data / 16 / bw)
    assert math.isclose(schedule_seconds(mt, data), expected, rel_tol=REL)
    # Fat tree: a step's time is its longest route (4 hops between leaves).
    f = fat_tree(4, hosts_per_leaf=2, bytes_per_s=bw, latency_s=lat, ports=1)
    assert math.isclose(
        allreduce_seconds("ring", f, data), 2 * 3 * (4 * lat + data / 4 / bw), rel_tol=REL
    )


def test_time_grows_with_size_and_algorithm_names_are_checked(topologies):
    topo = topologies["torus4x4"]
    for alg in Algorithm:
        small, big = allreduce_seconds(alg, topo, 32 * 2**10), allreduce_seconds(alg, topo, MB64)
        assert 0 < small < big
    message = "unknown all-reduce algorithm 'butterfly'; valid: ring, dbtree, 2dring, multitree"
    with pytest.raises(ConfigError, match=message):
        allreduce_seconds("butterfly", topo, 1.0)
    with pytest.raises(ConfigError, match=r"all-reduce size must be >= 0 bytes \(got -1\)"):
        allreduce_seconds("ring", topo, -1)


@pytest.mark.parametrize(
    "name", ["ring16", "mesh4x4", "mesh8x8", "torus4x4", "torus8x8", "fattree16"]
)
def test_multitree_no_slower_than_ring_at_64mb(topologies, name):
    topo = topologies[name]
    assert allreduce_seconds("multitree", topo, MB64) <= allreduce_seconds("ring", topo, MB64) * (
        1 + REL
    )


def test_tree_beats_ring_for_small_messages(topologies):
    topo = topologies["mesh8x8"]
    assert allreduce_seconds("dbtree", topo, 32 * 2**10) < allreduce_seconds(
        "ring", topo, 32 * 2**10
    )


# ----------------------------------------------------------------------------------------------
# Benchmark and CLI


def _load_benchmark():
    from parplan.bench import allreduce

    return allreduce


def test_benchmark_quick(tmp_path):
    df = _load_benchmark().run(tmp_path, quick=True)
    for name in ("allreduce.csv", "allreduce.png", "allreduce.md"):
        assert (tmp_path / name).stat().st_size > 0
    assert set(df.algorithm) == {a.value for a in Algorithm}
    assert df.valid.all()
    ring_rows = df[df.algorithm == "ring"]
    assert (ring_rows.speedup_vs_ring == 1.0).all()
    largest = df[(df.algorithm == "multitree") & (df.bytes == df.bytes.max())]
    assert (largest.speedup_vs_ring >= 1 - REL).all()
    assert "2.3x" in (tmp_path / "allreduce.md").read_text()


def _parser():
    from parplan.cli.pipeline import add_collectives_parser, add_pipeline_parser

    parser = argparse.ArgumentParser(prog="parplan")
    sub = parser.add_subparsers()
    add_pipeline_parser(sub)
    add_collectives_parser(sub)
    return parser


def test_cli_allreduce_table_and_json(capsys, tmp_path):
    args = _parser().parse_args(
        ["allreduce", "--topology", "torus", "--dims", "4x4", "--ports", "4"]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "all-reduce of 64 MiB on torus4x4" in out and "multitree" in out and "False" not in out
    args = _parser().parse_args(
        [
            "allreduce",
            "--topology",
            "ring:8",
            "--algorithm",
            "multitree",
            "--bytes",
            "32KB",
            "--format",
            "json",
        ]
    )
    assert args.func(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bytes"] == 32768 and data["results"][0]["algorithm"] == "multitree"
    assert data["results"][0]["valid"] and data["results"][0]["phase_steps"] == [4, 4]


def test_cli_allreduce_user_errors():
    parser = _parser()
    args = parser.parse_args(["allreduce", "--topology", "mesh"])
    with pytest.raises(ConfigError, match="topology 'mesh' needs dimensions"):
        args.func(args)
    args = parser.parse_args(["allreduce", "--topology", "ring", "--nodes", "8", "--ports", "7"])
    with pytest.raises(ConfigError, match="ports must be an integer from 1 to 4"):
        args.func(args)
    with pytest.raises(SystemExit):
        parser.parse_args(["allreduce", "--topology", "ring", "--bytes", "lots"])


# ------------------------------------------------- MultiTree's neighbour order and the ring floor


def _multitree_phase_steps(topo):
    from parplan.collectives.allreduce import build_schedule

    sched = build_schedule("multitree", topo)
    assert validate_schedule(sched).ok
    return sched.phase_steps[0], dict(sched.params)


@pytest.mark.parametrize("k", [4, 5, 6, 7, 8])
def test_multitree_on_a_1_port_torus_takes_n_minus_1_steps(k):
    steps, params = _multitree_phase_steps(torus2d(k, k, ports=1))
    assert steps == k * k - 1 and params == {"order": "nswe"}


@pytest.mark.slow
@pytest.mark.parametrize("k", range(9, 17))
def test_multitree_on_larger_1_port_tori_takes_n_minus_1_steps(k):
    assert _multitree_phase_steps(torus2d(k, k, ports=1))[0] == k * k - 1


@pytest.mark.slow
def test_multitree_on_a_4_port_16x16_torus_takes_at_most_64_steps():
    assert _multitree_phase_steps(torus2d(16, 16, ports=4))[0] <= 64


def test_multitree_neighbour_order_is_a_parameter():
    from parplan.collectives.allreduce import multitree_schedule

    t = torus2d(4, 4, ports=1)
    assert multitree_schedule(t).phase_steps[0] == 15
    assert multitree_schedule(t, "ensw").phase_steps[0] >= 15
    assert multitree_schedule(t, None).phase_steps[0] == 16  # the topology's own order
    with pytest.raises(ConfigError, match="permutation of 'nswe'"):
        multitree_schedule(t, "nsx")


@settings(max_examples=30)
@given(
    kind=st.sampled_from(["ring", "mesh", "torus", "fattree"]),
    rows=st.integers(2, 5),
    cols=st.integers(2, 5),
    ports=st.integers(1, 4),
)
def test_multitree_never_takes_more_steps_than_ring(kind, rows, cols, ports):
    from parplan.collectives.allreduce import build_schedule

    n = rows * cols
    topo = {
        "ring": lambda: ring(n, ports=min(ports, 2)),
        "mesh": lambda: mesh2d(rows, cols, ports=ports),
        "torus": lambda: torus2d(rows, cols, ports=ports),
        "fattree": lambda: fat_tree(max(n, 4), ports=ports),
    }[kind]()
    multi, flat = build_schedule("multitree", topo), build_schedule("ring", topo)
    assert validate_schedule(multi).ok
    assert multi.steps <= flat.steps
    if dict(multi.params).get("fallback") == "ring":
        assert multi.transfers == flat.transfers


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_ring_closed_form_is_the_ring_schedule(n):
    """One ring all-reduce cost: the closed form the pipeline planner uses equals the explicit
    schedule's time on a ring of n hosts."""
    from parplan.collectives.allreduce import ring_allreduce_seconds
    from parplan.collectives.topology import ring
    from parplan.pipeline.planner import Level, sync_seconds

    t = ring(n, bytes_per_s=2e9, latency_s=3e-6)
    simulated = allreduce_seconds("ring", t, 64e6)
    assert math.isclose(ring_allreduce_seconds(n, 64e6, 2e9, 3e-6), simulated, rel_tol=1e-12)
    assert math.isclose(sync_seconds(64e6, n, Level(1, n, 2e9, 3e-6)), simulated, rel_tol=1e-12)


@pytest.mark.parametrize("kind", ["torus", "mesh"])
def test_3d_grids_build_and_every_algorithm_runs_validly(kind):
    """3-D tori (TPU pods) and meshes: the right links, and every all-reduce valid on them."""
    from parplan.collectives.allreduce import Algorithm, best_schedule, validate_schedule

    t = parse_topology(kind, dims="4x3x2")
    assert t.size == 24 and t.name == f"{kind}4x3x2"
    # links per host: two along each axis longer than 2 (every host on a torus, inner ones on a
    # mesh), one along the axis of 2; a mesh's corner has one per axis
    degree = {h: len(t.neighbors(h)) for h in t.hosts}
    assert max(degree.values()) == 2 + 2 + 1 and t.ports == 4
    assert (min(degree.values()) == 5) == (kind == "torus")
    if kind == "mesh":
        assert degree[0] == 3
    for alg in Algorithm:
        sched, seconds = best_schedule(alg, t, 2**20)
        assert validate_schedule(sched).ok and seconds > 0
