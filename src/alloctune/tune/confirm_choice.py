"""The confirm flow's choices (`tune.confirm`): which candidate to run, at which budgets, and what
the simulation and the runs so far say about each (its likely need, whether the GPU contradicted
it, whether a rival could beat it, whether the default needs a run at all).

A mixin of `ConfirmFlow`: pure decisions over the flow's state, no run is started here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from alloctune.run.trial import TrialRequest, TrialResult
from alloctune.tune.bracket import Bracket, floor_low, half_width, next_budget, tolerance
from alloctune.tune.candidates import DEFAULT, Candidate
from alloctune.tune.model import align_down, align_up
from alloctune.units import format_size

if TYPE_CHECKING:
    from alloctune.tune.model import Sweep


class FlowState:
    """The confirm flow's state, declared once for the parts that read it (`ConfirmFlow.__init__` sets it)."""

    t: "Sweep"
    s: Any
    baseline: TrialResult
    cands: list[Candidate]
    budget: int
    sim: Any
    est: dict[str, int | None]
    brackets: dict[str, Bracket]
    at_budget: dict[str, TrialResult]
    refused: dict[str, str]
    samples: dict[str, list[float]]
    alone: set[str]
    hints: dict[str, int | None]
    floors: dict[str, int | None]
    calibrated: bool


class ChoiceMixin(FlowState):
    """Where to run next and what the evidence says; `ConfirmFlow` holds the state."""

    def _opening(self, c: Candidate, exclusive: bool = False) -> list[TrialRequest]:
        """The first runs of a candidate, independent of each other (side by side):

        * a simulation that is exact about this program: just above and just below the
          estimate (a pass and a failure within the tolerance prove it);
        * a range (workspace-shaped requests the program may give up): `opening_probes` runs
          from the optimistic end down, one tolerance apart -- measured on convolution
          workloads, the real need lies at or a few % under it, so one batch usually proves
          the bracket. The lowest is recorded while a calibration could teach the simulator.

        `exclusive`: the top run (the likeliest pass) has the GPU alone, as a throughput sample.
        """
        b = self._bracket(c)
        b.lo_tried = True
        top = next_budget(self.t, b, self.budget)
        if top is None:
            return []
        if b.floor is not None:  # from the optimistic end down, one tolerance apart
            top = min(self.budget, align_up(b.floor))
            budgets, lowest = [top], floor_low(self.t, b)
            while len(budgets) < max(2, self.s.opening_probes):
                nxt = max(align_up(budgets[-1] - tolerance(self.t, budgets[-1])), lowest)
                if nxt >= budgets[-1] or nxt <= 0:
                    break
                budgets.append(nxt)
            purpose = "best: at the optimistic simulated min_budget"
        else:  # just above and just below the estimate
            budgets = [top]
            low = align_down(b.est - half_width(self.t, b.est)) if b.est is not None and top >= b.est else 0
            if 0 < low < top:
                budgets.append(low)
            purpose = "best: just above the simulated min_budget" if b.est is not None else "best: at the budget (not simulated)"
        reqs = [TrialRequest(c.conf, top, exclusive=exclusive, ensure_cap=self._gc(c), purpose=purpose)]
        for k, x in enumerate(budgets[1:], 1):
            last = k == len(budgets) - 1
            why = "below the optimistic simulated min_budget" if b.floor is not None else "just below the simulated min_budget"
            reqs.append(
                TrialRequest(c.conf, x, ensure_cap=self._gc(c), record=last and self._want_calibration(), purpose=f"best: {why}")
            )
        return reqs

    def _below(self, c: Candidate) -> list[TrialRequest]:
        """Runs under `c`'s tested pass, one tolerance apart (one batch, side by side), down to
        where its need can lie (the optimistic end less `floor_margin`, else just under the
        estimate): for a challenger that passed where the best failed."""
        b = self._bracket(c)
        if b.passed is None:
            return []
        lo = b.failed or 0
        if b.floor is not None:
            lowest = floor_low(self.t, b)
        elif b.est is not None:
            lowest = align_down(b.est - half_width(self.t, b.est))
        else:
            lowest = 0
        budgets: list[int] = []
        x = b.passed
        while len(budgets) < max(2, self.s.opening_probes) and x > lowest:
            nxt = align_up(x - tolerance(self.t, x))
            if nxt <= lo or nxt >= x:
                break
            budgets.append(nxt)
            x = nxt
        if budgets:
            b.lo_tried = True
        return [TrialRequest(c.conf, x, ensure_cap=self._gc(c), purpose=f"under where {c.label} passed") for x in budgets]

    def _hinted(self, c: Candidate, budget: int) -> bool:
        """Whether `budget` is one of the two runs around the re-simulated estimate."""
        hint = self.hints.get(c.conf)
        if hint is None:
            return False
        h = half_width(self.t, hint)
        return budget in (align_down(hint - h), align_up(hint + h), min(self.budget, align_up(hint + h)))

    def _hint_pair(self, c: Candidate, b: Bracket) -> list[int]:
        """Both runs around the re-simulated estimate at once, when it lies inside a tested bracket
        and neither run has been made: one side by side batch instead of two in a row."""
        hint = self.hints.get(c.conf)
        if hint is None or b.passed is None or b.failed is None or not b.failed < hint < b.passed:
            return []
        h = half_width(self.t, hint)
        pair = [align_down(hint - h), align_up(hint + h)]
        return pair if all(b.failed < x < b.passed for x in pair) and pair[0] < pair[1] else []

    def _want_calibration(self) -> bool:
        """Record capped runs until one has shown how the program adapts (then the simulator knows),
        and only while the recording has requests a calibration could explain (`can_learn`)."""
        return not self.calibrated and hasattr(self.sim, "calibrate") and bool(getattr(self.sim, "can_learn", True))

    @staticmethod
    def _gc(c: Candidate) -> bool:
        return "garbage_collection_threshold:" in c.conf

    def _closest(self, order: list[Candidate]) -> Candidate | None:
        """The setting simulated to need the least (none fits). On a tie (within the tolerance) a
        setting other than the default: the default's need comes from replaying its own recording,
        so its run would say the least that is new."""
        known = [c for c in order if c.conf not in self.refused and self._likely(c) is not None]
        if not known:
            return None
        low = min(self._likely(c) for c in known)  # type: ignore[type-var]
        near = [c for c in known if self._likely(c) <= low + tolerance(self.t, low)]  # type: ignore[operator]
        return next((c for c in near if c.knob != DEFAULT), near[0])

    def _default_fails(self) -> str | None:
        """Why the default needs no run at the budget because it cannot complete there, or None:
        the baseline recorded the default itself, and replaying that very recording at the budget
        (with every workspace-shaped request given up, as a program that adapts could) runs out of
        memory (`Simulator.completes`: the recording shows the default's outcome, #28.5); with a
        simulator that cannot replay at a budget, its min budget (optimistic end) is above the budget
        by more than the tolerance."""
        default = next((c for c in self.cands if c.knob == DEFAULT), None)
        if default is None or default.conf in self.refused:
            return None
        need = self._likely(default)
        if need is None or need <= self.budget:
            return None
        completes = getattr(self.sim, "completes", None)
        if completes is not None:
            try:
                if not completes(default.conf, self.budget):
                    return (
                        f"the default does not complete at the budget: replaying its own recording at "
                        f"{format_size(self.budget)} runs out of memory, even with every workspace-shaped request "
                        f"given up (its simulated need: {format_size(need)}; not run on the GPU)"
                    )
                return None  # it replays to the end there: run it
            except Exception:  # noqa: BLE001 - the margin rule below decides
                pass
        if need <= self.budget + tolerance(self.t, self.budget):
            return None  # a thin margin: run it
        return (
            f"the default does not complete at the budget: replaying its own recording needs {format_size(need)}, "
            f"{format_size(need - self.budget)} more than {format_size(self.budget)} (not run on the GPU)"
        )

    def _may_beat(self, c: Candidate, focus: Candidate, at_budget: int | None = None) -> bool:
        """Whether `c` could complete at `at_budget` (default: where `focus` failed), given how far
        the simulation was off for `focus` (the same relative error, in the direction that helps `c`)."""
        if c not in self.cands or c.conf in self.refused:
            return False
        b, fb = self._bracket(c), self._bracket(focus)
        where = at_budget if at_budget is not None else fb.failed
        if where is None or (b.failed is not None and b.failed >= where):
            return False
        at = self.at_budget.get(c.conf)
        if at is not None and not at.passed and self.budget >= where:
            return False  # it already failed at a larger budget
        mine, theirs = self._likely(c), self._latest(focus) if fb.floor is None else fb.floor
        if mine is None or not theirs:
            return False
        seen = fb.passed if fb.passed is not None else where  # at least this far off
        err = abs(seen - theirs) / seen
        return mine * (1 - err) < where

    def _contradicted(self, c: Candidate) -> bool:
        """Whether the GPU's bracket for `c` disagrees with the simulation: the estimate outside
        it or, for a program that adapts, the bracket outside [optimistic end less the margin,
        estimate]."""
        b = self._bracket(c)
        if b.failed is None or b.passed is None:
            return False
        est = self._latest(c)
        if b.floor is None:
            return est is not None and not b.failed < est <= b.passed
        return b.passed <= floor_low(self.t, b) or (b.est is not None and b.failed >= b.est)

    def _likely(self, c: Candidate) -> int | None:
        """Where the candidate's real min_budget most likely lies: the optimistic end when the
        recording holds workspace-shaped requests that matter (measured on six workloads: the
        optimistic replay within 3 % of the real min_budget in 33 of 38 cases, the replay as
        recorded in 13; bench/results/fallible_gpu.md), else the estimate."""
        floor = self._floor(c)
        return floor if floor is not None else self.est.get(c.conf)

    def _est_key(self, c: Candidate) -> tuple[bool, int]:
        e = self._likely(c)
        return (e is None or e > self.budget, e or 0)

    def _default_proven(self) -> str | None:
        """Why the default needs no run at the budget, or None: the baseline ran it uncapped (or
        capped at least as high) and reserved no more than the budget, and a cap above a run's
        peak reserved changes nothing the allocator does."""
        base = self.baseline
        if base.conf or not base.passed or base.peak_reserved is None or base.peak_reserved > self.budget:
            return None
        if base.budget is not None and base.budget < self.budget:
            return None
        return (
            f"the default completes at the budget: the baseline reserved at most {format_size(base.peak_reserved)} "
            f"of {format_size(self.budget)}, and a cap above a run's peak changes nothing the allocator does "
            "(not run again)"
        )
