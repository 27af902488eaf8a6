"""The box formulas of the pricing oracle (tests/pricing_oracle.py, which the compiled core is
checked against bit for bit) against exact areas by coordinate
compression (tests/reference_model.py's ``area_where``) on random rectangles."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from pricing_oracle import backward_area as backward_received
from pricing_oracle import backward_presummed, union_area
from pricing_oracle import forward_area as forward_received
from reference_model import area_where

coord = st.sampled_from([0.0, 0.125, 0.25, 0.375, 0.5, 0.75, 1.0])


@st.composite
def rect(draw, within=(0.0, 1.0, 0.0, 1.0)):
    x0, x1, y0, y1 = within
    a, b = sorted((x0 + draw(coord) * (x1 - x0), x0 + draw(coord) * (x1 - x0)))
    c, d = sorted((y0 + draw(coord) * (y1 - y0), y0 + draw(coord) * (y1 - y0)))
    return (a, b, c, d)


def _sets(*rects):
    return [[r] if r[1] > r[0] and r[3] > r[2] else [] for r in rects]


@settings(max_examples=150)
@given(st.lists(rect(), min_size=1, max_size=4), rect())
def test_union_area(rects, within):
    want = area_where(lambda m: any(m[:-1]) and m[-1], *_sets(*rects, within))
    assert math.isclose(float(union_area(rects, within)), want, abs_tol=1e-12)


@st.composite
def split_case(draw):
    """A producer's region at a group and its two sides' parts, and k consumers' likewise."""
    g = draw(rect())
    h = [draw(rect(g)), draw(rect(g))]
    k = draw(st.integers(1, 3))
    m = [draw(rect()) for _ in range(k)]
    p = [draw(rect(mv)) for mv in m]
    q = [draw(rect(mv)) for mv in m]
    return g, h, m, p, q


@settings(max_examples=150)
@given(split_case())
def test_transfer_formulas(case):
    g, h, m, p, q = case
    k = len(m)
    f0 = area_where(lambda x: any(x[:k]) and x[k] and not x[k + 1], *_sets(*p, g, h[0]))
    f1 = area_where(
        lambda x: any(x[:k]) and not x[k] and (x[k + 1] or any(x[k + 2 :])), *_sets(*q, h[1], g, *p)
    )
    assert math.isclose(float(forward_received(g, h, p, q, 0)), f0, abs_tol=1e-12)
    assert math.isclose(float(forward_received(g, h, p, q, 1)), f1, abs_tol=1e-12)
    for j in range(k):
        b0 = area_where(lambda x: x[0] and x[1] and not x[2], *_sets(h[0], m[j], p[j]))
        b1 = area_where(
            lambda x: x[0] and not x[1] and (x[2] or x[3]), *_sets(h[1], q[j], m[j], h[0])
        )
        assert math.isclose(float(backward_received(h, m[j], p[j], q[j], 0)), b0, abs_tol=1e-12)
        assert math.isclose(float(backward_received(h, m[j], p[j], q[j], 1)), b1, abs_tol=1e-12)
    s0 = area_where(
        lambda x: x[0] and any(x[1 + j] and not x[1 + k + j] for j in range(k)),
        *_sets(h[0], *m, *p),
    )
    s1 = area_where(
        lambda x: x[0] and any(not x[2 + k + j] and (x[2 + j] or x[1]) for j in range(k)),
        *_sets(h[1], h[0], *m, *q),
    )
    assert math.isclose(float(backward_presummed(h, m, p, q, 0)), s0, abs_tol=1e-12)
    assert math.isclose(float(backward_presummed(h, m, p, q, 1)), s1, abs_tol=1e-12)
