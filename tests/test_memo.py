"""The memo of node terms (parplan/costmodel/split.py) and the local frame it keys on
(parplan/costmodel/regions.py: ``local_frame``).

- Moving every region a node's terms read (all rows together; the producer's output columns
  with its consumers' input columns) gives the same local frame, to the last bit, and moving
  a local frame changes nothing.
- Random plans on random DAGs and arrays: the evaluator with a warm memo, a cold one and
  none (``MEMO_MAX_CELLS = 0``) gives the same times to the last bit; so does the DP,
  on zoo models over homogeneous and mixed arrays.
- Sibling groups share entries: planning a homogeneous array prices fewer node terms than
  the DP asks for.
"""

from contextlib import contextmanager

import pytest
from hypothesis import given
from hypothesis import strategies as st

import parplan.costmodel.split as split
from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.hardware import parse_array
from parplan.costmodel.problem import Problem
from parplan.costmodel.regions import EMPTY, Region, local_frame
from parplan.models.zoo import get_model
from parplan.solvers.planners import make_plan
from parplan.costmodel.layout import JOIN_LAYOUTS, TYPE_ORDER
from parplan.costmodel.problem import Plan, Split
from test_bound import random_plans
from test_brute import fast, graphs

#: Dyadic coordinates and offsets: every sum and difference below is exact in binary.
coord = st.integers(0, 32).map(lambda k: k / 32)


@st.composite
def box(draw):
    if draw(st.integers(0, 9)) == 0:
        return EMPTY
    axes = [sorted((draw(coord), draw(coord))) for _ in range(3)]
    return Region(*(tuple(a) for a in axes))


def _moved(r: Region, dr: float, dc: float, producer: bool) -> Region:
    if r.empty:
        return r
    rows = (r.rows[0] + dr, r.rows[1] + dr)
    if producer:
        return Region(rows, r.ins, (r.outs[0] + dc, r.outs[1] + dc))
    return Region(rows, (r.ins[0] + dc, r.ins[1] + dc), r.outs)


@fast(150)
@given(st.lists(box(), min_size=2, max_size=4), coord, coord)
def test_translates_share_one_local_frame(regions, dr, dc):
    consumers = tuple(range(1, len(regions)))
    moved = [_moved(r, dr, dc, i == 0) for i, r in enumerate(regions)]
    frame = local_frame(regions, 0, consumers)
    assert local_frame(moved, 0, consumers) == frame
    assert local_frame(frame, 0, consumers) == frame
    full = [w for w in frame if not frame[w].empty]
    if full:
        assert min(frame[w].rows[0] for w in full) == 0.0
        assert min(frame[w].outs[0] if w == 0 else frame[w].ins[0] for w in full) == 0.0
        for w in full:  # sizes and emptiness stay
            for ax in ("rows", "ins", "outs"):
                lo, hi = getattr(frame[w], ax)
                assert hi - lo == getattr(regions[w], ax)[1] - getattr(regions[w], ax)[0]


@contextmanager
def memo_limit(cells: int):
    """Run with ``MEMO_MAX_CELLS = cells`` (0: no memo), memo cleared."""
    old = split.MEMO_MAX_CELLS
    split.clear_memo()
    split.MEMO_MAX_CELLS = cells
    try:
        yield
    finally:
        split.MEMO_MAX_CELLS = old
        split.clear_memo()


def assert_memo_changes_nothing(p, plan):
    """The evaluator's every row is the same from a cold memo, a warm one and none."""
    split.clear_memo()
    cold = evaluate(p, plan)
    warm = evaluate(p, plan)
    with memo_limit(0):
        bare = evaluate(p, plan)
    assert cold.rows == warm.rows == bare.rows
    assert cold.node_time_s == bare.node_time_s


@fast(40)
@given(random_plans())
def test_the_memo_never_changes_a_price(case):
    assert_memo_changes_nothing(*case)


@st.composite
def level_plans(draw):
    """Random plans on homogeneous arrays where every group of a depth has one split, at shares
    0, 1/2 or 1: groups of a depth then have the same sizes and state tables, and their regions
    differ (translates or not), so the memo is asked for the same tables in many frames."""
    g = draw(graphs(max_weighted=4, max_joins=2))
    p = Problem(
        g,
        parse_array(draw(st.sampled_from(["h100:4", "h100:8", "v100:8@ring:ring"]))),
        batch=draw(st.sampled_from([8, 64])),
    )
    by_depth = {}
    splits = {}
    for path, _ in p.array.inner_nodes():
        if len(path) not in by_depth:
            choices = tuple(
                draw(st.sampled_from(JOIN_LAYOUTS if n.is_join else TYPE_ORDER))
                for n in p.planning.nodes
            )
            shares = tuple(draw(st.sampled_from([0.0, 0.5, 0.5, 1.0])) for _ in p.planning.nodes)
            by_depth[len(path)] = Split(choices, shares)
        splits[path] = by_depth[len(path)]
    return p, Plan(splits, planner="random")


@fast(60)
@given(level_plans())
def test_groups_of_a_depth_are_priced_in_their_own_frames(case):
    assert_memo_changes_nothing(*case)


@pytest.mark.parametrize(
    "model,array",
    [
        ("vgg11", "h100:16"),
        ("resnet-2block", "tpu-v2:2,tpu-v3:2"),
        ("alexnet", "tpu-v2:4,tpu-v3:4"),
    ],
)
def test_plans_do_not_depend_on_the_memo(model, array):
    p = Problem(get_model(model), parse_array(array), batch=256)
    split.clear_memo()
    first = make_plan(p, "accpar")
    again = make_plan(p, "accpar")  # warm
    with memo_limit(0):
        bare = make_plan(p, "accpar")
    assert first.splits == again.splits == bare.splits
    assert evaluate(p, first).step_time_s == evaluate(p, bare).step_time_s


def test_sibling_groups_share_entries(monkeypatch):
    calls = []
    real = split.node_terms
    monkeypatch.setattr(split, "node_terms", lambda *a, **k: calls.append(1) or real(*a, **k))
    p = Problem(get_model("vgg11"), parse_array("h100:16"), batch=256)
    split.clear_memo()
    plan = make_plan(p, "accpar-topdown", objective="communication", shares="half")
    asked = (
        len(plan.splits) * len(p.planning.nodes) * 2
    )  # a factor and the chosen split's terms per node
    assert 0 < len(calls) < asked / 2


def test_planning_gc_raises_the_collector_thresholds_and_restores_them():
    import gc

    from parplan.costmodel.collector import PLANNING_GC_THRESHOLDS, planning_gc

    before = gc.get_threshold()
    with planning_gc():
        assert gc.get_threshold() == PLANNING_GC_THRESHOLDS
    assert gc.get_threshold() == before
    try:
        with planning_gc():
            raise KeyError("x")
    except KeyError:
        pass
    assert gc.get_threshold() == before  # also when planning fails


def test_repeated_blocks_share_state_tables_and_terms():
    """An element-wise op's name takes no part in equality: the same op in every block prices
    the same, so a transformer's blocks share their tables and memoised terms (llama3-70b's root
    split: 481 nodes, 11 distinct terms), while each node still names its own ops."""
    from parplan.costmodel.split import PlanOptions, SplitProblem, _memo_key, split_tables

    p = Problem(get_model("llama3-70b"), parse_array("h100:8"), batch=8)
    sp, options = SplitProblem.root(p), PlanOptions()
    tables = split_tables(sp, options)
    pg = p.planning
    keys = {_memo_key(sp, tables, u, options.objective)[1] for u in range(len(pg.nodes))}
    assert len(pg.nodes) == 481
    assert len(keys) == 11
    names = [n.name for n in pg.nodes]
    a, b = names.index("layers.1.add1"), names.index("layers.2.add1")
    assert tables[a] is tables[b]
    assert [op.name for op in pg.nodes[a].dims.out_ops] == ["layers.1.add1", "layers.1.norm2"]
    assert [op.name for op in pg.nodes[b].dims.out_ops] == ["layers.2.add1", "layers.2.norm2"]


def test_alike_nodes_share_one_root_dims_object():
    """Equal dims at the root are one object (the memos keyed on identities meet them once):
    llama3-70b's 481 nodes have 8 distinct dims, and every node's root dims equal its own dims
    scaled to the batch, whose ops keep their names."""
    from dataclasses import replace

    p = Problem(get_model("llama3-70b"), parse_array("h100:8"), batch=8)
    dims, nodes = p.root_dims(), p.planning.nodes
    assert len({id(d) for d in dims}) == len(set(dims)) == 8
    for node, d in zip(nodes, dims):
        assert d == replace(node.dims, batch=node.dims.batch * 8, replica=1.0)
    a, b = (next(v for v, n in enumerate(nodes) if n.name == f"layers.{k}.add1") for k in (1, 2))
    assert dims[a] is dims[b] and nodes[a].dims is not nodes[b].dims


def test_scaled_dims_hash_as_equal_dims_do():
    """A scaled copy of hashed dims hashes by its own fields (it carried its source's cached
    hash: equal dims then hashed apart, so the memos keyed on them missed)."""
    from dataclasses import fields

    from parplan.costmodel.dims import LayerDims

    d = Problem(get_model("vgg11"), parse_array("h100:8"), batch=512).root_dims()[0]
    hash(d)
    s = d.scaled(0.5, 1.0, 0.25)
    fresh = LayerDims(**{f.name: getattr(s, f.name) for f in fields(LayerDims)})
    assert s == fresh and hash(s) == hash(fresh) and s != d
    assert {fresh: 1}[s] == 1


@pytest.mark.parametrize("collide", [False, True])
def test_row_classes_are_the_classes_of_equal_rows(collide, monkeypatch):
    """The alike-node classes (``split._row_classes``: rows hashed, then checked) are those of
    ``np.unique`` over the rows, each represented by its first row; with every hash forced equal
    (a collision) the check sends it to ``np.unique`` and the answer stays exact."""
    import numpy as np

    if collide:
        monkeypatch.setattr(split, "_ROW_WEIGHTS", np.zeros(64, dtype=np.uint64))
    rng = np.random.default_rng(7)
    for trial in range(60):
        n, m = int(rng.integers(1, 200)), int(rng.integers(1, 9))
        keys = rng.integers(0, 3, size=(n, m)).astype(np.int64) * (2**41 + 1 if trial % 2 else 1)
        first, inverse = split._row_classes(keys)
        _, want, _ = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        assert sorted(first.tolist()) == sorted(want.tolist())  # the first row of each class
        assert np.array_equal(keys[first][inverse], keys)
        for c, row in enumerate(first.tolist()):
            assert not (inverse[:row] == c).any()


def test_by_identity_reuses_only_the_very_same_arguments():
    """``dims.by_identity`` answers again only for the same objects: an equal tuple that is
    another object is computed anew, and the memo is cleared past its size in node entries."""
    from parplan.costmodel import dims

    memo: dict = {}
    calls = []
    a = tuple(range(300))
    b = tuple(range(300))  # equal, another object
    for args in ((a,), (a,), (b,)):
        dims.by_identity(memo, args, len(args[0]), lambda: calls.append(1) or len(calls))
    assert len(calls) == 2
    assert dims.by_identity(memo, (a,), 300, lambda: -1) == 1
    c = tuple(range(300))  # a third object, of too many nodes: the memo starts again
    dims.by_identity(memo, (c,), dims.IDENTITY_MAX_ITEMS, lambda: 0)
    assert len(memo) == 1
