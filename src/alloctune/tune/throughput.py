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

# A gap counts when it exceeds the two-sided 95 % Student t quantile times the standard error
# of the difference (Welch): with two samples a side the noise itself is barely known, so a
# normal quantile (1.96) would call a difference far too often.
_T95 = {
    1: 12.71,
    2: 4.30,
    3: 3.18,
    4: 2.78,
    5: 2.57,
    6: 2.45,
    7: 2.36,
    8: 2.31,
    9: 2.26,
    10: 2.23,
    12: 2.18,
    15: 2.13,
    20: 2.09,
    30: 2.04,
}


def t95(df: float) -> float:
    """Two-sided 95 % quantile of Student's t with `df` degrees of freedom (rounded down: conservative)."""
    d = max(1, int(df))
    return next((_T95[k] for k in sorted(_T95, reverse=True) if k <= d), 12.71) if d <= 30 else 1.96


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
    va, vb = ra.noise**2 / ra.samples, rb.noise**2 / rb.samples
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (ra.samples - 1) + vb**2 / (rb.samples - 1)) if va + vb > 0 else math.inf
    margin = (t95(df) if math.isfinite(df) else 1.96) * se
    if abs(ra.mean - rb.mean) <= margin:
        return Comparison(
            ra, rb, gap, None, f"no measurable difference ({gap:+.1%}, noise ±{margin / ra.mean:.1%}): decided on memory"
        )
    return Comparison(
        ra, rb, gap, gap > 0, f"{abs(gap):.1%} {'slower' if gap > 0 else 'faster'}, clear of the noise (±{margin / ra.mean:.1%})"
    )


# ---- what the allocator alone could cost ---------------------------------------------------
# An allocator setting changes no kernel: it can slow a program only through the allocator's own
# driver work (cudaMalloc / cudaFree / expandable mappings, synchronising retries) and, under a
# cap, through requests the program gives up and replaces (a cuDNN workspace fallback picks a
# slower algorithm). The first is counted by the simulator and bounded below; the second is not
# bounded, so it is always measured. Costs: `TuneSettings.driver_call_s`, `driver_mib_s`, `sync_s`.


@dataclass(frozen=True)
class AllocatorActivity:
    """A setting's simulated allocator work over one run at the user's budget."""

    device_calls: int  # cudaMalloc + cudaFree (expandable: map + unmap)
    syncs: int  # synchronising retries and stream syncs
    fallbacks: int  # fallible requests that failed and were replaced
    completed: bool
    device_bytes: int = 0  # bytes those calls reserved plus bytes they released


@dataclass(frozen=True)
class OverheadBound:
    """At most how much slower the allocator alone can make `b` than `a` (fraction of the run)."""

    extra_calls: int
    extra_syncs: int
    extra_fallbacks: int
    seconds: float | None  # None: not bounded (fallbacks, or b does not complete)
    fraction: float | None
    rules_out: bool  # the bound is within the tolerance: no throughput runs needed
    text: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def overhead_bound(
    a: AllocatorActivity,
    b: AllocatorActivity,
    run_s: float | None,
    *,
    call_s: float,
    sync_s: float,
    tolerance: float,
    mib_s: float = 0.0,
    against: str = "the default",
) -> OverheadBound:
    """How much the allocator work `b` does beyond `a` can cost, against a run of `run_s` seconds:
    `call_s` per driver call plus `mib_s` per MiB it reserves or releases, `sync_s` per retry.
    `against`: what `a` is, in the text.

    Only work `b` adds counts (less work cannot make it slower). Fallbacks that `b` adds are
    not bounded: a replaced workspace means a different kernel, whose speed only a run shows.
    """
    calls = max(0, b.device_calls - a.device_calls)
    mib = max(0, b.device_bytes - a.device_bytes) / (1 << 20)
    syncs = max(0, b.syncs - a.syncs)
    falls = max(0, b.fallbacks - a.fallbacks)
    if not b.completed:
        return OverheadBound(calls, syncs, falls, None, None, False, "simulated not to complete at the budget")
    if falls:
        return OverheadBound(
            calls,
            syncs,
            falls,
            None,
            None,
            False,
            f"{falls} more workspace request(s) given up at the budget (a slower kernel may replace "
            "each): only a measurement can say",
        )
    seconds = calls * call_s + mib * mib_s + syncs * sync_s
    if not run_s or run_s <= 0:
        return OverheadBound(
            calls,
            syncs,
            falls,
            seconds,
            None,
            seconds == 0,
            "no allocator work added" if seconds == 0 else "run time unknown: measured instead",
        )
    frac = seconds / run_s
    what = (
        f"{calls} more cudaMalloc/cudaFree ({mib / 1024:.1f} GiB more reserved or released) and {syncs} more "
        f"synchronising retries than {against} (simulated): at most {seconds * 1e3:.1f} ms = {frac:.1%} of the "
        f"{run_s:.3g} s the run used the GPU"
    )
    if not calls and not syncs and not mib:
        what = f"no more allocator driver work than {against} (simulated)"
    if frac <= tolerance:
        return OverheadBound(
            calls,
            syncs,
            falls,
            seconds,
            frac,
            True,
            f"{what}: no measurable slowdown possible (tolerance {tolerance:.0%}), not measured",
        )
    return OverheadBound(calls, syncs, falls, seconds, frac, False, f"{what}: measured")
