"""Throughput you can trust: a difference counts only when it clears the measured noise.

Why: measured under load, single samples of the same setting differed by 16-39 %, enough
to move a recommendation away from the setting that needs the least memory. So a sample
is the workload's own rate (time per item when it reports items, which leaves start-up
out), throughput comparisons use runs that had the GPU to themselves, and two settings are
called different only when the gap is larger than both the tolerance and the noise seen
between repeats of the same setting. Otherwise: "no measurable difference", and memory
decides. Pure functions over numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

# A gap must exceed this many standard errors of the difference to count.
Z = 2.0


@dataclass(frozen=True)
class Rate:
    """Mean of the samples and their noise (sample standard deviation; None with one sample)."""

    mean: float
    noise: float | None
    samples: int
    unit: str | None = None

    def text(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        if self.noise is None:
            return f"{self.mean:.4g}{unit} (1 sample)"
        return f"{self.mean:.4g} ± {self.noise:.2g}{unit} (n={self.samples})"

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "noise": self.noise, "samples": self.samples, "unit": self.unit}


def rate(samples: Sequence[float], unit: str | None = None) -> Rate | None:
    """The samples' mean and standard deviation (None when there is no sample)."""
    xs = [float(x) for x in samples if x is not None]
    if not xs:
        return None
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return Rate(mean, None, 1, unit)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return Rate(mean, math.sqrt(var), len(xs), unit)


@dataclass(frozen=True)
class Comparison:
    """B against A: `slower` is True/False when the gap is measurable, None when it is not."""

    a: Rate | None
    b: Rate | None
    gap: float | None  # (a - b) / a: how much slower B is (negative: faster)
    slower: bool | None
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a.to_dict() if self.a else None,
            "b": self.b.to_dict() if self.b else None,
            "gap": self.gap,
            "slower": self.slower,
            "text": self.text,
        }


def compare(a: Sequence[float], b: Sequence[float], *, tolerance: float = 0.03, unit: str | None = None) -> Comparison:
    """Is B slower than A by more than `tolerance`, beyond the noise?

    Needs at least two samples on each side to know the noise; with fewer, a gap that
    would matter is "not yet measurable" (`slower` None) so the caller can repeat.
    """
    ra, rb = rate(a, unit), rate(b, unit)
    if ra is None or rb is None or ra.mean <= 0:
        return Comparison(ra, rb, None, None, "no throughput reported: decided on memory")
    gap = (ra.mean - rb.mean) / ra.mean
    if abs(gap) <= tolerance:
        return Comparison(ra, rb, gap, False, f"within {tolerance:.0%} ({gap:+.1%}): no difference that matters")
    if ra.noise is None or rb.noise is None:
        return Comparison(ra, rb, gap, None, f"{gap:+.1%} from single samples: noise not measured yet")
    se = math.sqrt(ra.noise ** 2 / ra.samples + rb.noise ** 2 / rb.samples)
    if abs(ra.mean - rb.mean) <= Z * se:
        return Comparison(ra, rb, gap, None,
                          f"no measurable difference ({gap:+.1%}, noise ±{Z * se / ra.mean:.1%}): decided on memory")
    return Comparison(ra, rb, gap, gap > 0,
                      f"{abs(gap):.1%} {'slower' if gap > 0 else 'faster'}, clear of the noise (±{Z * se / ra.mean:.1%})")
