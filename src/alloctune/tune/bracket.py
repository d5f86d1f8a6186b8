"""The confirm flow's arithmetic over one candidate: what the GPU proved, and the next budget to try.

A `Bracket` holds the smallest budget that passed and the largest that failed; `next_budget`
says where to run next (around the simulated estimate first, then widening in doubling steps
where the GPU contradicts it, then bisecting) and when the bracket is proven (`tolerance`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from alloctune.tune.model import ALIGN, align_down, align_up

if TYPE_CHECKING:
    from alloctune.tune.model import Sweep


@dataclass
class Bracket:
    """What the GPU showed about one candidate: the smallest pass and the largest failure."""

    est: int | None
    floor: int | None = None  # simulated min_budget if every untagged workspace could be given up
    passed: int | None = None
    failed: int | None = None
    widen: int = 0
    anchor: int | None = None  # where the widening steps start (fixed, so the steps double)
    runs: int = 0
    lo_tried: bool = False

    def record(self, budget: int, ok: bool) -> None:
        self.runs += 1
        if ok:
            self.passed = budget if self.passed is None else min(self.passed, budget)
        else:
            self.failed = budget if self.failed is None else max(self.failed, budget)

    def agrees(self) -> bool | None:
        """Whether the simulated estimate lies inside the measured bracket (None: not settled)."""
        if self.est is None or self.passed is None or self.failed is None:
            return None
        return self.failed < self.est <= self.passed


def tolerance(tuner: "Sweep", around: int) -> int:
    """How wide a proven bracket may be at `around` bytes: `confirm_rel_tol` of it (2 %: the
    measured min_budget is then within 2 % of the setting's real need), at least
    `confirm_abs_tol` (4 MiB: the 2 MiB granularity of a cap makes a narrower one cost runs)."""
    s = tuner.settings
    return max(s.confirm_abs_tol, int(s.confirm_rel_tol * around), 2 * ALIGN)


def half_width(tuner: "Sweep", around: int) -> int:
    """How far above / below the estimate the first two runs go (their gap is within `tolerance`)."""
    return max(ALIGN, tolerance(tuner, around) // 2 - ALIGN)


def next_budget(tuner: "Sweep", b: Bracket, budget: int, hint: int | None = None) -> int | None:
    """The next budget to try for `b`, or None when the bracket is proven (or cannot move).

    First just above the estimate, then just below it (for a program that adapts, just
    under the optimistic end). When the GPU contradicts: widen away from the tested end in
    steps that double (`widen_start` of it, then twice that, ...), up to the user's budget
    or down towards zero; once a pass and a failure are known, bisect (one run when the
    bracket is within twice the tolerance). `hint` (a re-simulated estimate after a
    calibration) is tried first when it lies in the range still open.
    """
    if b.passed is not None and b.failed is not None:
        lo, hi = b.failed, b.passed
        tol = tolerance(tuner, hi)
        if hi - lo <= tol:
            return None
        if hint is not None and lo < hint < hi:  # close in around the re-simulated estimate
            h = half_width(tuner, hint)
            for cand in (align_down(hint - h), align_up(hint + h)):
                if lo < cand < hi:
                    return cand
        if hi - lo <= 2 * tol:  # one run proves it either way: a failure there or a pass there closes the bracket
            cand = align_up(hi - tol)
            if lo < cand < hi and cand - lo <= tol:
                return cand
        mid = align_down((lo + hi) // 2)
        return mid if lo < mid < hi else None
    center = b.est if b.est is not None else budget
    h = half_width(tuner, center)
    if b.passed is None:  # nothing passed yet: go up
        if b.failed is not None and b.failed >= budget:
            return None  # fails at the user's budget: infeasible
        if hint is not None and hint < budget and (b.failed is None or hint > b.failed):
            return min(budget, align_up(hint + half_width(tuner, hint)))
        if b.failed is None:
            return min(budget, align_up(center + h))
        if b.anchor is None:  # widen from the tested failure (a range: from its optimistic end up)
            b.anchor = b.failed if b.floor is not None else max(center, b.failed)
        base = b.anchor
        # a range's recorded end (the program giving nothing up) should pass: never step past it
        ceiling = align_up(center + h) if b.floor is not None and align_up(center + h) > b.failed else None
        while True:
            b.widen += 1
            nxt = min(budget, align_up(base + _step(tuner, base, h, b.widen)))
            if ceiling is not None:
                nxt = min(nxt, ceiling)
            if nxt > b.failed:
                return nxt
    # everything so far passed: go down
    if b.est is None:  # no estimate to widen around: halve (a failure is needed to bisect)
        nxt = align_down(b.passed // 2)
        return nxt if nxt > 0 else None
    if b.floor is not None and not b.lo_tried:  # a program that adapts: its real need lies near the optimistic end
        b.lo_tried = True
        low = floor_low(tuner, b)
        if 0 < low < b.passed:
            return low
    if hint is not None and hint < b.passed:
        cand = align_down(hint - half_width(tuner, hint))
        if 0 < cand < b.passed:
            return cand
    first = align_down(center - h)
    if not b.lo_tried and 0 < first < b.passed:
        b.lo_tried = True
        return first
    if b.anchor is None:  # widen from the tested pass once it lies below the estimate
        b.anchor = min(center, b.passed)
    base = b.anchor
    while True:
        b.widen += 1
        nxt = align_down(base - _step(tuner, base, h, b.widen))
        if nxt <= 0:
            nxt = align_down(b.passed // 2)
            return nxt if nxt > 0 else None
        if nxt < b.passed:
            return nxt


def floor_low(tuner: "Sweep", b: Bracket) -> int:
    """The low run around the optimistic end: `floor_margin` under it (`b.floor` must be set)."""
    return align_down(int(b.floor * (1 - tuner.settings.floor_margin)))


def _step(tuner: "Sweep", center: int, h: int, k: int) -> int:
    return max(2 * h, int(center * tuner.settings.widen_start)) << (k - 1)
