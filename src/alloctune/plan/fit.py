"""Fit one request's byte count as an exact function of the input size.

Tensor sizes are products of shape dimensions, and the dimensions a program derives from
its input size are, in the common cases, linear in it (activations, a KV cache) or
quadratic (attention scores). So each request's size is fitted as a polynomial of degree
0, 1 or 2 with *rational* coefficients that passes exactly through every recorded point —
never a least-squares guess. The fewest coefficients that fit win: a constant, then a
monomial c * x**d (every dimension scaled by the input), then the lowest general degree; a
fit is *verified* when more points were recorded than it has coefficients (the extra points
had the chance to refute it).

PyTorch's own rounding shows up one level down: a convolution's output length is
floor((L + 2p - k) / s) + 1, so a tensor's bytes are `unit * floor(p*x + q) + rest`
(e.g. 8192 bytes per output frame, one more frame every 3.2 input seconds). That is the
*floor* law: `unit` is the gcd of the recorded steps, and (p, q) the simplest rationals
(smallest denominators, as the program's own constants are) for which floor(p*x + q)
hits every recorded point — a 2-D feasibility problem solved exactly. A request that no
law explains (a workspace chosen by shape) becomes a *table* law: the recorded points, a
parabola through the nearest three in between, flagged inexact so an answer built on it
says so.

A polynomial law gives exact byte counts (a rational value is rounded up to a whole byte);
the allocator's own rounding (512-byte blocks, power-of-two divisions, segment sizes) is
left to the simulator, which applies it as PyTorch does. A table law only interpolates, so
its values keep the granularity the recordings showed (every recorded size a multiple of
2, 4, ... 512 bytes stays one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Sequence

MAX_DEGREE = 2
MAX_GRAIN = 512  # PyTorch rounds every block to 512 bytes; finer granularity is the program's


@dataclass(frozen=True)
class Law:
    """size(x) for one request. kind "poly": sum(coef[d] * x**d); kind "floor": unit * floor(p*x + q) + rest;
    kind "floor2": unit * floor(p*x + q)**2 + rest; kind "table": interpolated."""

    kind: str  # "poly" | "floor" | "floor2" | "table"
    coef: tuple[Fraction, ...] = ()  # poly: c0, c1, c2 (trailing zeros dropped); floor, floor2: unit, rest, p, q
    points: tuple[tuple[Fraction, int], ...] = ()  # table: (x, size), x ascending
    grain: int = 1  # sizes are multiples of this (power of two <= 512)
    verified: bool = False  # poly: more points than coefficients, all on it

    @property
    def degree(self) -> int:
        return len(self.coef) - 1 if self.kind == "poly" else -1

    @property
    def exact(self) -> bool:
        return self.kind in ("poly", "floor", "floor2")

    def __call__(self, x: Fraction) -> int:
        if self.kind == "poly":
            value = sum((c * x**d for d, c in enumerate(self.coef)), Fraction(0))
        elif self.kind == "floor":
            unit, rest, p, q = self.coef
            value = unit * math.floor(p * x + q) + rest
        elif self.kind == "floor2":
            unit, rest, p, q = self.coef
            value = unit * math.floor(p * x + q) ** 2 + rest
        else:
            value = _interpolate(self.points, x)
        return _to_bytes(value, self.grain)

    def key(self) -> tuple[Any, ...]:
        """Hashable identity (the file format stores each distinct law once)."""
        return (self.kind, self.coef, self.points, self.grain, self.verified)

    def to_json(self) -> list[Any]:
        if self.kind == "poly":
            den = math.lcm(*(c.denominator for c in self.coef)) if self.coef else 1
            return ["p", self.grain, int(self.verified), den, *[int(c * den) for c in self.coef]]
        if self.kind in ("floor", "floor2"):
            unit, rest, p, q = self.coef
            return [
                "f" if self.kind == "floor" else "f2",
                1,
                int(self.verified),
                int(unit),
                int(rest),
                p.numerator,
                p.denominator,
                q.numerator,
                q.denominator,
            ]
        return ["t", self.grain, 0, *[[_num(x), y] for x, y in self.points]]

    @classmethod
    def from_json(cls, row: list[Any]) -> "Law":
        kind, grain, verified = row[0], int(row[1]), bool(row[2])
        if kind == "p":
            den = int(row[3])
            return cls("poly", tuple(Fraction(int(c), den) for c in row[4:]), grain=grain, verified=verified)
        if kind in ("f", "f2"):
            unit, rest, pn, pd, qn, qd = (int(v) for v in row[3:9])
            return cls(
                "floor" if kind == "f" else "floor2",
                (Fraction(unit), Fraction(rest), Fraction(pn, pd), Fraction(qn, qd)),
                verified=verified,
            )
        if kind == "t":
            return cls("table", points=tuple((Fraction(str(x)), int(y)) for x, y in row[3:]), grain=grain)
        raise ValueError(f"unknown law kind {kind!r}")


def fit(xs: Sequence[Fraction], ys: Sequence[int]) -> Law:
    """The lowest-degree exact polynomial (degree <= 2) through all points, else a table law."""
    pts = sorted(zip(xs, ys))
    grain = _grain(ys)
    if len({y for _, y in pts}) == 1:
        return Law("poly", (Fraction(pts[0][1]),), verified=len(pts) > 1)
    mono = _monomial(pts)
    if mono is not None:
        return mono
    for degree in range(1, min(MAX_DEGREE, len(pts) - 1) + 1):
        coef = _through(_spread(pts, degree + 1))
        if all(sum((c * x**d for d, c in enumerate(coef)), Fraction(0)) == y for x, y in pts):
            while len(coef) > 1 and coef[-1] == 0:
                coef = coef[:-1]
            return Law("poly", tuple(coef), verified=len(pts) > degree + 1)
    floor = _fit_floor(pts)
    if floor is not None:
        return floor
    square = _fit_floor_square(pts)
    if square is not None:
        return square
    return Law("table", points=tuple((x, int(y)) for x, y in pts), grain=grain)


def _monomial(pts: list[tuple[Fraction, int]]) -> Law | None:
    """c * x**d (one coefficient, d = 1 .. MAX_DEGREE) through every point; None if none.

    Why before the general polynomials: a tensor whose every dimension the input size scales is a
    monomial (an image's activations: channels * (side / stride)**2), one free coefficient that one
    recording fixes and every further one checks. Fitting it as a general polynomial instead spends
    a coefficient per degree, so three recordings leave a quadratic unverified and two cannot see it
    at all (and a hold-out check then measures that missing degree, not the fit's error)."""
    x0, y0 = pts[-1]
    if x0 == 0:
        return None
    for degree in range(1, MAX_DEGREE + 1):
        c = Fraction(y0) / x0**degree
        if all(c * x**degree == y for x, y in pts):
            return Law("poly", (Fraction(0),) * degree + (c,), verified=len(pts) > 1)
    return None


def _fit_floor(pts: list[tuple[Fraction, int]]) -> Law | None:
    """unit * floor(p*x + q) + rest through every point, with the simplest p and q; None if none.

    For k_i = (y_i - rest) / unit the conditions k_i <= p*x_i + q < k_i + 1 bound p, pair by
    pair, to an open interval; any p inside leaves a non-empty interval for q.
    """
    if len(pts) < 3:
        return None
    unit = 0
    for (_, y0), (_, y1) in zip(pts, pts[1:]):
        unit = math.gcd(unit, y1 - y0)
    if unit == 0:
        return None
    rest = pts[0][1] % unit
    ks = [(x, (y - rest) // unit) for x, y in pts]
    # steps of at least 2 units: a step function (a workspace that jumps) is no rounded line, and no
    # law would be honest about it
    line = _floor_line(ks, 2)
    if line is None:
        return None
    p, q_lo, q_hi = line
    q = q_lo if q_lo.denominator == 1 else simplest_between(q_lo, q_hi)
    if q_lo.denominator <= q.denominator:
        q = q_lo
    return Law("floor", (Fraction(unit), Fraction(rest), p, q), verified=len(pts) > 3)


def _fit_floor_square(pts: list[tuple[Fraction, int]]) -> Law | None:
    """unit * floor(p*x + q)**2 through every point; None if none.

    Why: an image's activation is channels * H * W with H = W = a convolution's output length,
    floor((side + 2 pad - kernel) / stride) + 1 per layer; recorded at sides that are not all
    multiples of the network's stride, no polynomial passes through the points, and a table law
    only interpolates (timm ResNet-50 at nine sides: 116 requests). The side m_i of each point is
    the integer with y_i = unit * m_i**2 for the largest such unit (every y_i / y_j a square of a
    rational); then floor(p*x + q) = m_i is the floor-linear problem. Of the q that fit, the
    largest is kept (the rounding up a stride's padding gives, ceil(x / s) = floor(x/s + (s-1)/s)):
    between the recorded sides a smaller q could only say less memory than some program of the
    same points needs."""
    if len(pts) < 3 or any(y <= 0 for _, y in pts):
        return None
    y0 = pts[0][1]
    ratios = []
    for _, y in pts:
        r = math.isqrt(y * y0)
        if r * r != y * y0:
            return None  # not all of the same square class: no unit * m**2 through them
        ratios.append(Fraction(r, y0))  # m_i / m_0
    den = math.lcm(*(f.denominator for f in ratios))
    ns = [int(f * den) for f in ratios]
    g = math.gcd(*ns)
    ms = [n // g for n in ns]
    unit = Fraction(y0, ms[0] ** 2)
    if unit.denominator != 1 or any(unit * m * m != y for m, (_, y) in zip(ms, pts)):
        return None
    line = _floor_line([(x, m) for (x, _), m in zip(pts, ms)], 1)
    if line is None:
        return None
    p, q_lo, q_hi = line
    top = q_hi - Fraction(1, p.denominator * math.lcm(*(x.denominator for x, _ in pts)))
    q = top if top >= q_lo else q_lo
    return Law("floor2", (unit, Fraction(0), p, q), verified=len(pts) > 3)


def _floor_line(ks: list[tuple[Fraction, int]], min_step: int) -> tuple[Fraction, Fraction, Fraction] | None:
    """The simplest p with floor(p*x + q) = k at every point for some q, and q's interval [lo, hi).
    Every step between neighbouring points at least `min_step` (the squares' side: 1, as a deep
    layer's side grows by one between close recorded sizes; that they are squares of one unit is
    already the evidence a step function lacks)."""
    steps = [k1 - k0 for (_, k0), (_, k1) in zip(ks, ks[1:])]
    if not (all(d >= min_step for d in steps) or all(d <= -min_step for d in steps)):
        return None
    lo: Fraction | None = None
    hi: Fraction | None = None
    for i, (xi, ki) in enumerate(ks):
        for xj, kj in ks[i + 1 :]:
            span = xj - xi
            a, b = Fraction(kj - ki - 1) / span, Fraction(kj - ki + 1) / span
            lo = a if lo is None or a > lo else lo
            hi = b if hi is None or b < hi else hi
    if lo is None or hi is None or not lo < hi:
        return None
    p = simplest_between(lo, hi)
    q_lo = max(k - p * x for x, k in ks)
    q_hi = min(k + 1 - p * x for x, k in ks)
    return (p, q_lo, q_hi) if q_lo < q_hi else None


def simplest_between(lo: Fraction, hi: Fraction) -> Fraction:
    """The rational with the smallest denominator strictly between lo < hi (continued fractions)."""
    fl = math.floor(lo)
    if fl + 1 < hi:
        return Fraction(fl + 1) if fl + 1 > lo else Fraction(fl + 2)
    if lo == fl:  # (fl, hi) with hi <= fl + 1: fl + 1/n for the smallest n that fits
        return fl + Fraction(1, math.floor(1 / (hi - fl)) + 1)
    return fl + 1 / simplest_between(1 / (hi - fl), 1 / (lo - fl))


def _spread(pts: list[tuple[Fraction, int]], k: int) -> list[tuple[Fraction, int]]:
    """k points spread over the range (first, last, middle): the best-conditioned choice."""
    if k >= len(pts):
        return pts
    idx = sorted({round(i * (len(pts) - 1) / (k - 1)) for i in range(k)})
    return [pts[i] for i in idx]


def _through(pts: list[tuple[Fraction, int]]) -> list[Fraction]:
    """Coefficients (c0..c_{k-1}) of the polynomial through k points (Lagrange, exact arithmetic)."""
    k = len(pts)
    coef = [Fraction(0)] * k
    for i, (xi, yi) in enumerate(pts):
        basis = [Fraction(1)]  # product of (x - xj) / (xi - xj), as coefficients
        for j, (xj, _) in enumerate(pts):
            if j == i:
                continue
            scale = xi - xj
            nxt = [Fraction(0)] * (len(basis) + 1)
            for d, b in enumerate(basis):
                nxt[d] -= b * xj / scale
                nxt[d + 1] += b / scale
            basis = nxt
        for d, b in enumerate(basis):
            coef[d] += b * yi
    return coef


def _interpolate(points: tuple[tuple[Fraction, int], ...], x: Fraction) -> Fraction:
    """Inside the recorded range, the parabola through the three recorded points nearest x, held
    inside the two neighbours' values so a jump (a workspace that changes algorithm) cannot
    overshoot; outside, the line through the two nearest ends (a parabola extrapolates wildly). Sizes grow like
    polynomials between
    jumps, which a straight line between neighbours gets wrong (a quadratic activation at the
    midpoint of 256 and 512 is 62 %, not 100 %, of the way up)."""
    if len(points) == 1:
        return Fraction(points[0][1])
    if not points[0][0] <= x <= points[-1][0]:  # outside: the line through the two nearest ends
        (x0, y0), (x1, y1) = points[:2] if x < points[0][0] else points[-2:]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    near = sorted(points, key=lambda p: (abs(p[0] - x), -p[0]))[:3]
    near.sort()
    value = sum((c * x**d for d, c in enumerate(_through(near))), Fraction(0))
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return min(max(value, Fraction(min(y0, y1))), Fraction(max(y0, y1)))
    return value


def _grain(ys: Sequence[int]) -> int:
    g = 0
    for y in ys:
        g = math.gcd(g, int(y))
    if g == 0:
        return 1
    return min(MAX_GRAIN, g & -g)  # largest power of two dividing every size


def _to_bytes(value: Fraction, grain: int) -> int:
    """Round up to the grain (never below zero): a smaller tensor than the program's would flatter."""
    if value <= 0:
        return 0
    return -(-math.ceil(value) // grain) * grain


def _num(x: Fraction) -> int | str:
    return int(x) if x.denominator == 1 else str(x)
