"""The region algebra (docs/costmodel.md section 3): the published tables at equal shares,
share changes, the ends of the share range, forks and joins."""

import math

import pytest

from parplan.costmodel.layout import Layout, PartitionType, transition_table
from pricing_oracle import (
    backward_received,
    forward_received,
    hold_extent,
    intersect_holds,
    need_extent,
    union_needs,
)

B, I, O = PartitionType.BATCH, PartitionType.IN, PartitionType.OUT

# Side 1, in units of A = |F[l]| = |E[l]|, the same share a on both layers (0 < a < 1).
EQUAL_SHARE_TABLE = {
    (B, B): lambda a: 0.0,
    (B, I): lambda a: a * (1 - a) * 2,
    (B, O): lambda a: 1 - a,
    (I, B): lambda a: 1 - a,
    (I, I): lambda a: 1 - a,
    (I, O): lambda a: 0.0,
    (O, B): lambda a: a * (1 - a) * 2,
    (O, I): lambda a: 0.0,
    (O, O): lambda a: 1 - a,
}


@pytest.mark.parametrize("pair", list(EQUAL_SHARE_TABLE))
@pytest.mark.parametrize("a", [0.1, 0.268, 0.5, 0.9])
def test_equal_shares_give_the_classic_table(pair, a):
    side1, side2 = transition_table(*pair, a)
    assert math.isclose(side1, EQUAL_SHARE_TABLE[pair](a), abs_tol=1e-15)
    assert math.isclose(
        side2, EQUAL_SHARE_TABLE[pair](1 - a), abs_tol=1e-15
    )  # side 2: swap a and 1 - a


def test_half_share_equals_published_hypar_table():
    # HyPar (dp = BATCH, mp = IN): dp-dp 0, dp-mp 0.25|F|+0.25|E|, mp-mp 0.5|E|, mp-dp 0.5|E|
    published = {(B, B): 0.0, (B, I): 0.25 + 0.25, (I, I): 0.5, (I, B): 0.5}
    for pair, amount in published.items():
        assert transition_table(*pair, 0.5) == (amount, amount)


@pytest.mark.parametrize("a,b", [(0.25, 0.5), (0.5, 0.25), (0.0, 0.75), (0.3, 1.0)])
def test_share_change_between_equal_layouts_moves_the_difference(a, b):
    # rows(a) -> rows(b): side 1 receives F rows [a, b) forward and returns E rows [b, a) backward
    s1, s2 = transition_table(B, B, a, b)
    assert math.isclose(s1, abs(a - b)) and math.isclose(s2, abs(a - b))


def test_a_side_without_work_needs_nothing_and_holds_nothing():
    # IN at share 1 on side 1: side 2 computes nothing, holds no output; a BATCH consumer at
    # 1/2 then needs side 2's rows of a tensor only side 1 has
    s1, s2 = transition_table(I, B, 1.0, 0.5)
    assert (s1, s2) == (0.5, 0.5)  # side 2 gets F rows [1/2, 1); side 1 gets E rows [1/2, 1) back
    # the same producer split at 1/2 holds the output whole on both sides: forward is free
    assert transition_table(I, B, 0.5, 0.5) == (0.5, 0.5)


def test_join_at_share_zero_is_no_free_converter():
    # rows(1/2) -> join rows(0) -> cols(1/2) costs at least the direct rows -> cols re-layout
    direct = sum(transition_table(B, I, 0.5, 0.5))
    via = sum(transition_table(B, Layout.ROWS, 0.5, 0.0)) + sum(
        transition_table(Layout.ROWS, I, 0.0, 0.5)
    )
    assert via >= direct


def test_fork_sends_a_tensor_once_and_gradients_are_presummed():
    hold = hold_extent(Layout.ROWS, 0.5)
    rows, whole = need_extent(Layout.ROWS, 0.5), need_extent(Layout.WHOLE, 0.5)
    # two consumers, one needs rows (held) and one the whole tensor: the missing half moves once
    assert float(forward_received(union_needs([rows, whole]), hold)) == 0.5
    assert float(forward_received(union_needs([whole, whole]), hold)) == 0.5
    # gradients: both consumers hold E in rows -> nothing to send; one holds cols -> the rows part
    # of it that the other side computed
    cons_rows, cons_cols = hold_extent(Layout.ROWS, 0.5), hold_extent(Layout.COLS, 0.5)
    assert float(backward_received(hold, intersect_holds([cons_rows, cons_rows]))) == 0.0
    assert float(backward_received(hold, intersect_holds([cons_rows, cons_cols]))) == 0.25


def test_extents_broadcast_over_layout_codes():
    import numpy as np

    x, y = hold_extent(np.array([0, 1, 2, 2]), np.array([0.25, 0.25, 0.25, 0.0]))
    assert x.tolist() == [0.25, 1.0, 1.0, 0.0] and y.tolist() == [1.0, 0.25, 1.0, 0.0]
