"""Which allocator settings a sweep tries, and the `max_split_size_mb` values worth trying.

Pure data: no torch, no processes. A candidate is an allocator string plus the knob it
varies, so tables and explanations can say "expandable_segments" rather than a raw string.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from alloctune.config.standard import setting_label
from alloctune.errors import InputError
from alloctune.units import MiB

DEFAULT = "default"
EXPANDABLE = "expandable_segments"
MAX_SPLIT = "max_split_size_mb"
GC = "garbage_collection_threshold"
ROUNDUP = "roundup_power2_divisions"
KNOBS: tuple[str, ...] = (EXPANDABLE, MAX_SPLIT, GC, ROUNDUP)

ALIASES = {
    "expandable": EXPANDABLE,
    "expandable_segments": EXPANDABLE,
    "max_split": MAX_SPLIT,
    "max_split_size": MAX_SPLIT,
    "max_split_size_mb": MAX_SPLIT,
    "gc": GC,
    "garbage_collection_threshold": GC,
    "roundup": ROUNDUP,
    "roundup_power2_divisions": ROUNDUP,
}

# Values tried when `--knobs` names a knob without values. max_split_size_mb has none: its
# values come from the workload's own segment sizes (see `split_grid`).
DEFAULT_VALUES: dict[str, tuple[str, ...]] = {
    EXPANDABLE: ("True",),
    GC: ("0.6",),
    ROUNDUP: ("4",),
    MAX_SPLIT: (),
}

# Smallest max_split_size_mb every release accepts (≤2.9 needs > 20, 2.10 ≥ 20, 2.11 ≥ 20 by default).
MIN_SPLIT_MB = 21


@dataclass(frozen=True)
class Candidate:
    """One allocator setting to try: `conf` is the string given to the child ("" = default)."""

    conf: str
    knob: str = DEFAULT
    value: str | None = None

    @property
    def label(self) -> str:
        return setting_label(self.conf)

    def to_dict(self) -> dict[str, Any]:
        return {"conf": self.conf, "knob": self.knob, "value": self.value}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Candidate":
        return cls(conf=data["conf"], knob=data.get("knob", DEFAULT), value=data.get("value"))


def make(knob: str, value: str) -> Candidate:
    """A one-knob candidate, validated and written canonically (`0.60` → `0.6`).

    Canonical text matters: it is what the child gets, what the allocator reports back, and
    part of the results-store key.
    """
    from alloctune.config import AllocatorConfig

    conf = AllocatorConfig.parse(f"{knob}:{value}").format()
    return Candidate(conf=conf, knob=knob, value=conf.partition(":")[2])


def parse_knobs(specs: Sequence[str] | None) -> dict[str, tuple[str, ...]]:
    """`["gc=0.6/0.8", "expandable", "max_split"]` or `["gc=0.6/0.8,roundup"]` → {knob: values}.

    No `--knobs` means every knob with its default values. A knob without `=` gets its
    default values; `max_split_size_mb` accepts explicit MB values instead of the automatic
    range (`max_split=128/256`).
    """
    if not specs:
        return dict(DEFAULT_VALUES)
    out: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        for item in _split_items(spec):
            name, _, values = item.partition("=")
            knob = ALIASES.get(name.strip().lower())
            if knob is None:
                raise InputError(
                    f"unknown knob {name.strip()!r} in --knobs: use one of {', '.join(KNOBS)} "
                    "(or expandable, max_split, gc, roundup), optionally with values: gc=0.6/0.8"
                )
            vals = tuple(v.strip() for v in values.split("/") if v.strip()) if values else DEFAULT_VALUES[knob]
            out[knob] = vals
    return out


def _split_items(spec: str) -> list[str]:
    """Split on commas that separate knobs (a value list uses `/`, so commas are safe)."""
    return [p.strip() for p in spec.split(",") if p.strip()]


def fixed_candidates(knobs: Mapping[str, Sequence[str]]) -> list[Candidate]:
    """The default plus every knob value except the automatic max_split range."""
    out = [Candidate("")]
    for knob in KNOBS:
        if knob not in knobs:
            continue
        if knob == MAX_SPLIT:
            out.extend(make(MAX_SPLIT, v) for v in knobs[knob])  # explicit values only
            continue
        out.extend(make(knob, v) for v in knobs[knob])
    return out


@dataclass(frozen=True)
class SplitGrid:
    """The max_split_size_mb values worth testing for one workload, ascending (MiB).

    `noop_from_mb`: any value at or above it marks no block of the run oversize, i.e. behaves
    exactly like the default (blocks are parts of segments, and no segment reached it);
    `largest_segment` is the evidence.
    """

    values_mb: tuple[int, ...]
    noop_from_mb: int | None
    largest_segment: int | None
    dropped: int = 0  # distinct sizes left out to keep the grid small

    def to_dict(self) -> dict[str, Any]:
        return {
            "values_mb": list(self.values_mb),
            "noop_from_mb": self.noop_from_mb,
            "largest_segment": self.largest_segment,
            "dropped": self.dropped,
        }


def split_grid(
    segment_sizes: Sequence[tuple[int, int]] | Sequence[int] | None,
    *,
    min_mb: int = 32,
    max_points: int = 8,
) -> SplitGrid:
    """Candidate `max_split_size_mb` values from the segment sizes a default run made.

    The range is the workload's own: from `min_mb` up to its largest segment. Above the
    largest segment nothing is ever oversize (blocks are parts of segments), so such a
    value is a no-op, reported instead of tested. Inside the range the values are the ones
    people try by hand — powers of two — plus the largest segment itself (the "start
    high" point, where only the biggest blocks become oversize). More than `max_points`
    values are thinned evenly on a log scale, keeping both ends.
    """
    sizes = sorted({int(s[0]) if isinstance(s, (tuple, list)) else int(s) for s in segment_sizes or ()})
    if not sizes:
        return SplitGrid((), None, None)
    largest = sizes[-1]
    noop = largest // MiB + 1  # the smallest value v with v MiB > every segment
    top = largest // MiB  # v = top marks exactly the largest segments oversize
    if top < max(min_mb, MIN_SPLIT_MB):
        return SplitGrid((), noop, largest)
    values = [1 << k for k in range(5, 64) if min_mb <= (1 << k) < top] + [top]
    if len(values) <= max_points:
        return SplitGrid(tuple(values), noop, largest)
    picked = _log_thin(values, max_points)
    return SplitGrid(tuple(picked), noop, largest, dropped=len(values) - len(picked))


def _log_thin(values: list[int], n: int) -> list[int]:
    """n values of `values` (sorted) spread evenly in log space, ends included."""
    lo, hi = math.log(values[0]), math.log(values[-1])
    chosen: list[int] = []
    for i in range(n):
        target = lo + (hi - lo) * i / (n - 1)
        best = min(values, key=lambda v: (abs(math.log(v) - target), v))
        if best not in chosen:
            chosen.append(best)
    for v in values:  # duplicates collapsed: fill up with the nearest unused values
        if len(chosen) >= n:
            break
        if v not in chosen:
            chosen.append(v)
    return sorted(chosen)
