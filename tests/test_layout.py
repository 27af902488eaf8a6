"""The layout algebra reproduces SPEC section 2-3's tables and the published HyPar/AccPar entries."""

import math

import pytest

from parplan.costmodel.layout import (
    JOIN_LAYOUTS, Layout, PartitionType, ShareExpr, Tensor, conversion, intra, transition,
)

B, I, O = PartitionType.BATCH, PartitionType.IN, PartitionType.OUT

# SPEC section 3, side 1, in units of A = |F[l]| = |E[l]|, same share a on both layers.
SPEC_TABLE = {
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


@pytest.mark.parametrize("pair", list(SPEC_TABLE))
@pytest.mark.parametrize("a", [0.0, 0.1, 0.268, 0.5, 0.9, 1.0])
def test_transition_table_matches_spec_for_any_share(pair, a):
    side1, side2 = transition(*pair)
    assert math.isclose(side1.at(a), SPEC_TABLE[pair](a), abs_tol=1e-15)
    # side 2: swap a and 1 - a
    assert math.isclose(side2.at(a), SPEC_TABLE[pair](1 - a), abs_tol=1e-15)


def test_half_share_equals_published_hypar_table():
    # HyPar (dp = BATCH, mp = IN): dp-dp 0, dp-mp 0.25|F|+0.25|E|, mp-mp 0.5|E|, mp-dp 0.5|E|
    published = {(B, B): 0.0, (B, I): 0.25 + 0.25, (I, I): 0.5, (I, B): 0.5}
    for pair, amount in published.items():
        s1, s2 = transition(*pair)
        assert s1.at(0.5) == amount and s2.at(0.5) == amount


def test_accpar_free_relayouts_between_in_and_out():
    # consecutive FC layers alternate IN and OUT because these re-layouts are free (SPEC 3)
    for pair in ((I, O), (O, I)):
        s1, s2 = transition(*pair)
        assert s1.is_zero and s2.is_zero


@pytest.mark.parametrize("t,tensor", [(B, Tensor.WEIGHT), (I, Tensor.OUTPUT), (O, Tensor.INPUT)])
def test_intra_layer_amount_is_the_whole_tensor_per_side_independent_of_share(t, tensor):
    got, (s1, s2) = intra(t)
    assert got is tensor
    for a in (0.0, 0.3, 1.0):
        assert s1.at(a) == 1.0 and s2.at(a) == 1.0


def test_conversion_rules():
    a = 0.3
    rc1, rc2 = conversion(Layout.ROWS, Layout.COLS)
    assert math.isclose(rc1.at(a), a * (1 - a)) and math.isclose(rc2.at(a), a * (1 - a))
    sw1, sw2 = conversion(Layout.COLS, Layout.WHOLE)
    assert math.isclose(sw1.at(a), 1 - a) and math.isclose(sw2.at(a), a)
    for dst in (Layout.ROWS, Layout.COLS, Layout.WHOLE):
        z1, z2 = conversion(Layout.WHOLE, dst)
        assert z1.is_zero and z2.is_zero
    ps1, ps2 = conversion(Layout.PARTIAL, Layout.ROWS)  # reduce-scatter into own slice
    assert math.isclose(ps1.at(a), a) and math.isclose(ps2.at(a), 1 - a)
    with pytest.raises(ValueError):
        conversion(Layout.ROWS, Layout.PARTIAL)


def test_join_layouts_only_pay_when_layouts_differ():
    for lay in JOIN_LAYOUTS:
        s1, s2 = transition(lay, lay)
        assert s1.is_zero and s2.is_zero
    # a BATCH producer into a ROWS join is free; into a WHOLE join costs (1-a) and a
    s1, s2 = transition(B, Layout.WHOLE)
    assert math.isclose(s1.at(0.25), 0.75) and math.isclose(s2.at(0.25), 0.25)


def test_quadratic_coefficient_is_symmetric_for_every_pair():
    # best_share relies on it
    choices = (B, I, O, *JOIN_LAYOUTS)
    for p in choices:
        for c in choices:
            s1, s2 = transition(p, c)
            assert s1.q == s2.q


def test_share_expr_arithmetic():
    e = ShareExpr(1.0, -1.0) + ShareExpr(q=2.0) * 3
    assert math.isclose(e.at(0.5), 0.5 + 6 * 0.25)
