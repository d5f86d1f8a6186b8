"""Fit one request's byte count as an exact function of the input size.

Tensor sizes are products of shape dimensions, and the dimensions a program derives from
its input size are, in the common cases, linear in it (activations, a KV cache) or
quadratic (attention scores). So each request's size is fitted as a polynomial of degree
0, 1 or 2 with *rational* coefficients that passes exactly through every recorded point —
never a least-squares guess. The lowest degree that fits wins; a fit is *verified* when
more points were recorded than the polynomial has coefficients (the extra points had the
chance to refute it). A request that no such polynomial explains (a workspace chosen by
shape, a padded dimension) becomes a *table* law: the recorded points, linear in between,
flagged inexact so an answer built on it says so.

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
    """size(x) for one request. kind "poly": sum(coef[d] * x**d); kind "table": piecewise linear."""

    kind: str  # "poly" | "table"
    coef: tuple[Fraction, ...] = ()  # poly: c0, c1, c2 (trailing zeros dropped)
    points: tuple[tuple[Fraction, int], ...] = ()  # table: (x, size), x ascending
    grain: int = 1  # sizes are multiples of this (power of two <= 512)
    verified: bool = False  # poly: more points than coefficients, all on it

    @property
    def degree(self) -> int:
        return len(self.coef) - 1 if self.kind == "poly" else -1

    @property
    def exact(self) -> bool:
        return self.kind == "poly"

    def __call__(self, x: Fraction) -> int:
        if self.kind == "poly":
            value = sum((c * x**d for d, c in enumerate(self.coef)), Fraction(0))
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
        return ["t", self.grain, 0, *[[_num(x), y] for x, y in self.points]]

    @classmethod
    def from_json(cls, row: list[Any]) -> "Law":
        kind, grain, verified = row[0], int(row[1]), bool(row[2])
        if kind == "p":
            den = int(row[3])
            return cls("poly", tuple(Fraction(int(c), den) for c in row[4:]), grain=grain, verified=verified)
        if kind == "t":
            return cls("table", points=tuple((Fraction(str(x)), int(y)) for x, y in row[3:]), grain=grain)
        raise ValueError(f"unknown law kind {kind!r}")


def fit(xs: Sequence[Fraction], ys: Sequence[int]) -> Law:
    """The lowest-degree exact polynomial (degree <= 2) through all points, else a table law."""
    pts = sorted(zip(xs, ys))
    grain = _grain(ys)
    if len({y for _, y in pts}) == 1:
        return Law("poly", (Fraction(pts[0][1]),), verified=len(pts) > 1)
    for degree in range(1, min(MAX_DEGREE, len(pts) - 1) + 1):
        coef = _through(_spread(pts, degree + 1))
        if all(sum((c * x**d for d, c in enumerate(coef)), Fraction(0)) == y for x, y in pts):
            while len(coef) > 1 and coef[-1] == 0:
                coef = coef[:-1]
            return Law("poly", tuple(coef), verified=len(pts) > degree + 1)
    return Law("table", points=tuple((x, int(y)) for x, y in pts), grain=grain)


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
    """Piecewise linear through the points; outside them, the nearest segment's line."""
    if len(points) == 1:
        return Fraction(points[0][1])
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            break
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


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
