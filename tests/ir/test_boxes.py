"""The test of a condition on a box of positions (ir/boxes.py), which the ring's tile skipping
and the generated key spans share: where it says a condition holds on a box, it holds at
every point of it (checked point by point on random boxes), and it tells a box inside a
window from one across its edge."""

import itertools
import random

import sympy

from indexattn.ir.boxes import bounds, holds_on_box

T, K, W, C = sympy.symbols("tau tau_p w C", integer=True)
CONDITIONS = [
    sympy.And(T >= K, W > T - K),  # a causal window
    sympy.Or(T < K, T - K >= W),  # its negation
    sympy.And(T >= K, sympy.Eq(sympy.floor(T / C), sympy.floor(K / C))),  # chunks
    sympy.Or(T >= K, K < 7),  # a prefix
    sympy.Ne(sympy.floor(T / 4), sympy.floor(K / 4)),
    2 * T - 3 * K + W > 0,
]


def test_where_the_test_holds_every_point_of_the_box_does():
    draw = random.Random(0)
    told = 0
    for cond in CONDITIONS:
        for _ in range(300):
            t0, k0 = draw.randrange(40), draw.randrange(40)
            box = {T: (t0, t0 + draw.randrange(6)), K: (k0, k0 + draw.randrange(6))}
            fixed = {W: draw.randrange(1, 9), C: draw.randrange(1, 9)}
            if holds_on_box(cond.subs(fixed), box) is not sympy.true:
                continue
            told += 1
            points = itertools.product(*(range(box[s][0], box[s][1] + 1) for s in (T, K)))
            assert all(cond.subs(fixed | {T: t, K: k}) for t, k in points)
    assert told > 100


def test_a_box_inside_the_window_against_one_across_its_edge():
    window = CONDITIONS[0].subs(W, 4)
    inside = {T: (10, 12), K: (9, 10)}
    assert holds_on_box(window, inside) is sympy.true
    across = {T: (10, 12), K: (6, 10)}  # key 6 is 6 back from query 12
    assert holds_on_box(window, across) is sympy.false


def test_a_sawtooth_is_not_taken_for_two_monotone_parts():
    """τ - C floor(τ / C) rises and falls: no bounds from its ends; floor(τ / C) alone has."""
    box = {T: (0, 9)}
    assert bounds(T - 4 * sympy.floor(T / 4), box) is None
    assert bounds(sympy.floor(T / 4), box) == (0, 2)
