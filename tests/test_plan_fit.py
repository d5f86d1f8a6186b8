"""Exact size laws: the polynomial through every point, or an honest table."""

import math
from fractions import Fraction as F

import pytest

from alloctune.plan.fit import Law, fit

XS = [F(x) for x in (7, 14, 28, 56)]


def test_constant_linear_quadratic_are_recovered_exactly():
    const = fit(XS, [4096] * 4)
    assert const.kind == "poly" and const.degree == 0 and const.verified
    lin = fit(XS, [2048 * int(x) + 512 for x in XS])
    assert lin.coef == (F(512), F(2048)) and lin.verified
    quad = fit(XS, [6 * int(x) ** 2 + 100 * int(x) + 512 for x in XS])
    assert quad.coef == (F(512), F(100), F(6)) and quad.verified
    assert quad(F(10)) == 6 * 100 + 1000 + 512


def test_rational_coefficients_stay_exact():
    # 16 kHz audio in 320-sample frames: bytes = 2 * 768 * 50 * seconds (+ a header)
    xs = [F(3, 2), F(3), F(6)]
    law = fit(xs, [int(1536 * 50 * x) + 64 for x in xs])
    assert law.degree == 1 and law.verified
    assert law(F(9, 2)) == 1536 * 225 + 64


def test_three_points_fit_a_quadratic_but_unverified():
    law = fit(XS[:3], [1000, 1000, 5000])
    assert law.kind == "poly" and law.degree == 2 and not law.verified


def test_step_function_becomes_a_table_law():
    law = fit(XS, [1000, 1000, 5000, 5000])
    assert law.kind == "table" and not law.exact
    assert law(F(14)) == 1000 and law(F(28)) == 5000
    assert 1000 < law(F(21)) < 5000  # linear in between, flagged inexact


def test_conv_length_rounding_is_a_floor_law():
    # bytes of a conv output: 8192 per frame, frames = floor((seconds + 6) * 100 / 32) + 1
    def size(x):
        return 8192 * (math.floor((x + 6) * 100 / 32) + 1) + 4624

    xs = [F(x) for x in (10, 20, 30, 40, 50, 60)]
    law = fit(xs, [size(x) for x in xs])
    assert law.kind == "floor" and law.exact and law.verified
    assert all(law(F(x)) == size(x) for x in range(1, 300))
    assert Law.from_json(law.to_json()) == law


def test_table_law_follows_the_curve_between_points_and_never_overshoots_a_jump():
    # a workspace of 192 * side^2 bytes plus an algorithm-dependent header: no single law
    xs = [F(x) for x in (256, 512, 640, 768, 896)]
    ys = [192 * 256**2 + 16] + [192 * int(x) ** 2 + 147 for x in xs[1:]]
    law = fit(xs, ys)
    assert law.kind == "table"
    assert abs(law(F(384)) - 192 * 384**2) < 512  # a straight line would be 11 % high
    jump = fit(XS, [1000, 1000, 5000, 5000])
    assert all(1000 <= jump(F(x)) <= 5000 for x in range(7, 57))


def test_floor_law_is_not_a_step_function():
    assert fit(XS, [1000, 1000, 5000, 5000]).kind == "table"
    assert fit(XS, [1000, 5000, 9000, 9000]).kind == "table"


def test_poly_is_exact_table_keeps_granularity_and_nothing_goes_negative():
    law = fit([F(2), F(4)], [1024, 2048])  # 512 * x: exact, even where x * 512 is not a multiple of 512
    assert law(F(3, 2)) == 768
    table = fit(XS, [1024, 1024, 8192, 8192])
    assert table.grain == 512 and table(F(20)) % 512 == 0
    down = fit([F(10), F(20)], [100, 50])
    assert down(F(100)) == 0


@pytest.mark.parametrize("ys", [[5] * 4, [3 * int(x) for x in XS], [1000, 1000, 5000, 5000]])
def test_json_round_trip(ys):
    law = fit(XS, ys)
    assert Law.from_json(law.to_json()) == law
