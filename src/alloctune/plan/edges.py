"""The edges of `plan`'s search: bisection between a size that completes and one that fails, and what the
allocator's non-monotonicity makes of an answer near the edge — the sizes right below it that fail (a band
of residues the 2 % scan steps over), the sizes right above its first failing one that fit again, and
whether a range's optimistic end differs from the conservative search's own bisection. Kept apart from
`plan.answer` (the search itself) so each stays small; a prober is anything with `completes(x, st, t)`."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

SCAN_RATIO = Fraction(102, 100)  # the monotonicity check probes sizes 2 % apart
BEYOND = 4  # sizes just above the first failing one probed for completing again
BEYOND_STEPS = 12  # then at most this many SCAN_RATIO steps up to where sizes stop completing


WINDOW = 8  # consecutive grid sizes at and below an answer checked (`Largest.strict`)


def _window(probe: Any, st: Any, t: Any, grid: Fraction, best: Fraction) -> tuple[Fraction | None, Fraction | None]:
    """The answer lowered until the `WINDOW` consecutive grid sizes at and below it all complete, and
    the lowest failing size met on the way (None: the first window was clean).

    Why: the monotonicity scan probes sizes 2 % apart, and bisection only the sizes it halves to; near
    the edge a band of sizes can fail by residue while the sizes between fit (the simulation of a
    Llama decoder under expandable segments: 10933..10966 fail in steps of 1 and 2 mod 4; timm at sides
    757..767 that are not multiples of 4), and an answer inside the band promises a size that fails."""
    lowest = None
    for _ in range(64):
        failing = [x for x in (best - k * grid for k in range(WINDOW)) if x >= grid and not probe.completes(x, st, t)]
        if not failing:
            return best, lowest
        lowest = min(failing)
        best = lowest - grid
        if best < grid:
            return None, lowest
    return best, lowest


def _beyond(probe: Any, st: Any, t: Any, grid: Fraction, fail: Fraction, limit: Fraction) -> Fraction | None:
    """The largest size above `fail` that still completes, when one of the few sizes just above it does
    (None: they all fail, the answer is the edge).

    Why: the allocator is not monotone in the input. A size whose blocks are exact multiples of a
    segment (a prompt of 24576 tokens: 132 MiB MLP blocks) or whose activations round differently
    (an image side that is not a multiple of 4) can fail where the sizes around it fit; the
    answer stays below it (every size up to the answer completes), and this says how far the sizes
    that complete again go, so a reader sees the edge is not there (and a real run at the failing
    size can check it)."""
    start = next((x for x in (fail + k * grid for k in range(1, BEYOND + 1)) if x <= limit and probe.completes(x, st, t)), None)
    if start is None:
        return None
    ok, bad = start, None
    for _ in range(BEYOND_STEPS):
        nxt = max(ok + grid, ((ok * SCAN_RATIO) // grid) * grid)
        if nxt > limit:
            break
        if not probe.completes(nxt, st, t):
            bad = nxt
            break
        ok = nxt
    if bad is None:
        return ok
    return _bisect(probe, st, t, grid, int(ok / grid), int(bad / grid))[0]


def _bisect(probe: Any, st: Any, t: Any, grid: Fraction, lo: int, hi: int) -> tuple[Fraction, Fraction]:
    """lo * grid completes, hi * grid fails: narrow to neighbours."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if probe.completes(mid * grid, st, t):
            lo = mid
        else:
            hi = mid
    return lo * grid, hi * grid


def _optimistic_end(item: Any, hi: Any) -> str | None:
    """The optimistic end of a range, compared like with like: the optimistic search is a bisection
    without the monotonicity scan, so it is set against the conservative search's own bisection
    (`completes_again` when the scan moved the answer below it). Where the workspaces given up change
    nothing there, the answer is one number: the scan's lower answer is a size that fails with or
    without workspaces (seen on a Llama decoder under expandable segments: sizes 1 and 2 mod 4 fail
    near the edge), not a bracket that evidence about workspaces could close."""
    high: str | None = hi.largest
    if high is None or item.largest is None:
        return high
    own = _size(item.completes_again) if item.completes_again is not None else _size(item.largest)
    mine: str = item.largest
    return high if _size(high) > own else mine


def _size(text: str) -> Fraction:
    return Fraction(text)
