"""How far a `plan` answer may be off: the error bound its answers leave room for.

Why a module of its own: the bound is the one part of an answer that rests on evidence other
than the simulation (the held-back recordings), and `plan.service` builds it from those before
`plan.answer` searches with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any


@dataclass(frozen=True)
class ErrorModel:
    """How far the memory of a generated stream may be off, from what plan could check.

    `inside`: relative peak error within the recorded sizes (a held-back interior size).
    `checked`: the relative peak error of extrapolating to the largest recording from the others
    (`sizes[-2]` is then the last fitted size, `sizes[-1] - sizes[-2]` one step of distance).
    Beyond the recordings the bound grows with the cube of the distance in such steps from the
    last fitted size: a term one degree above what the fit can see grows that way, so a linear
    allowance would over-promise (measured on a program with a cubic term: it did).
    Zero when the held-back recording is reproduced exactly: every answer is then the
    simulator's own and today's exact answers stand."""

    inside: float
    checked: float
    sizes: tuple[Fraction, ...]  # the recorded sizes, ascending
    evidence: str

    def at(self, x: Fraction) -> float:
        xs, e = self.sizes, self.inside
        if x > xs[-1]:
            e += self.checked * float((x - xs[-2]) / (xs[-1] - xs[-2])) ** 3
        elif x < xs[0]:
            e += self.checked * float((xs[1] - x) / (xs[1] - xs[0])) ** 3
        return e

    def edge(self, limit: float) -> Fraction | None:
        """The size above the recordings where the bound reaches `limit` (None: it never does)."""
        if self.checked <= 0:
            return None if self.inside < limit else self.sizes[-1]
        r = max(0.0, (limit - self.inside) / self.checked) ** (1 / 3)
        xs = self.sizes
        return max(xs[-1], xs[-2] + Fraction(r).limit_denominator(1000) * (xs[-1] - xs[-2]))

    def to_dict(self) -> dict[str, Any]:
        return {"inside": self.inside, "checked": self.checked, "evidence": self.evidence}


__all__ = ["ErrorModel"]
