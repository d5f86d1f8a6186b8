"""The default tune flow: the simulator decides, the GPU confirms.

Why: the simulator, given the one recording the baseline makes, predicts every setting's
smallest working budget (exactly on transformer workloads), while each GPU run costs a full
run of the user's program. Convolution programs adapt under a cap (cuDNN gives up a
workspace that does not fit), so for them the simulation is a range: from the recording
with every workspace-shaped request given up (`Simulator.floors`, where the real need was
found) to the recording as made. GPU runs only confirm what decides the answer:

1. simulate every candidate (one sweep, plus the optimistic one) and take the one whose
   need most likely lies lowest (`_likely`) and fits the budget;
2. one batch of independent runs, side by side (each is capped): the best just above and
   just below its estimate, or, for a range, two runs from its optimistic end down, one
   tolerance apart (a tested pass and a tested failure = its measured `min_budget`); and
   the default at the user's budget unless the baseline already showed it fits there, or
   replaying the baseline's own recording (the default's) needs more than the budget by more
   than the tolerance (`_default_fails`);
   where no candidate is simulated to fit, instead: one run of the closest at the budget;
   if it fails, the flow ends with the `Shortfall` (bytes missing, next steps);
3. only where a run contradicts the simulation, probe further out with steps that double
   from the tested end, then bisect; a recorded capped run is offered to the simulator as
   a calibration, and its re-simulated estimate is tried when it lies inside the bracket;
4. when the best failed above its estimate, the default runs at that budget (settings'
   errors need not go the same way) and replaces the best if it completes; the runner-up
   gets one run where the best failed when its estimate says it could beat it;
5. throughput: a setting changes no kernel, only the allocator's driver work, which the
   simulator counts (`_bound`); runs alone on the GPU and A/B repeats are made only when
   that work could cost the tolerance, until the gap clears the noise, else memory decides.

With an accurate simulator that is two GPU runs after the baseline, side by side (three in
all); where nothing fits, one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from alloctune.run.trial import TrialResult
from alloctune.tune.bracket import Bracket, floor_low, half_width, next_budget, tolerance
from alloctune.tune.candidates import DEFAULT, Candidate
from alloctune.tune.executors.base import TrialRequest
from alloctune.tune.model import Shortfall, align_down, align_up
from alloctune.tune.objective import CandidateSummary
from alloctune.tune.throughput import OverheadBound, compare, overhead_bound, rate
from alloctune.units import MiB, format_mib

if TYPE_CHECKING:
    from alloctune.tune.model import Sweep


class SimulationUnavailable(Exception):
    """The baseline's recording cannot be simulated: the tuner measures every candidate instead."""


class ConfirmFlow:
    """One run of the flow (module doc) inside a `Tuner`, which owns trials, store and notes."""

    def __init__(self, tuner: "Sweep", baseline: TrialResult, cands: list[Candidate], budget: int):
        self.t = tuner
        self.s = tuner.settings
        self.baseline = baseline
        self.cands = cands
        self.budget = budget
        self.sim: Any = None
        self.est: dict[str, int | None] = {}
        self.brackets: dict[str, Bracket] = {}
        self.at_budget: dict[str, TrialResult] = {}
        self.refused: dict[str, str] = {}
        self.samples: dict[str, list[float]] = {}
        self.hints: dict[str, int | None] = {}
        self.verdict: str | None = None
        self.calibrated = False
        self.floors: dict[str, int | None] = {}
        self.default_proof: str | None = None  # why the default was not run at the budget
        self.bounds: dict[str, OverheadBound | None] = {}  # conf -> simulated allocator slowdown bound
        self.default_fails: str | None = None  # why the default was not run at the budget (simulated not to fit)
        self.shortfall: Shortfall | None = None  # no setting fits: the closest, how far off, what next

    # ---- GPU runs ----------------------------------------------------------------------------
    def _run(self, reqs: list[TrialRequest]) -> list[TrialResult]:
        reqs = [r for r in reqs if r.conf not in self.refused]
        out = self.t.batch(reqs)
        for req, res in zip(reqs, out):
            self._learn(req, res)
        return out

    def _learn(self, req: TrialRequest, res: TrialResult) -> None:
        if res.warnings and req.conf not in self.refused:
            self.refused[req.conf] = "; ".join(res.warnings)
            return
        if req.conf in self.refused:
            return
        ok = res.passed
        if req.budget == self.budget:
            self.at_budget.setdefault(req.conf, res)
        if req.conf in self.brackets and req.budget is not None:
            self.brackets[req.conf].record(req.budget, ok)
        if ok and req.exclusive and res.throughput is not None:
            self.samples.setdefault(req.conf, []).append(res.throughput)
        if req.record and res.snapshot and self.sim is not None and hasattr(self.sim, "calibrate"):
            learned = self.sim.calibrate(res)
            if learned:  # the capped run showed how the program adapts: re-simulate every candidate
                self.calibrated = True
                try:
                    self.hints = dict(self.sim.estimates([c.conf for c in self.cands]))
                    self.t.notes.append(learned)
                except Exception as exc:  # noqa: BLE001 - keep probing without hints
                    self.t.notes.append(f"{learned}, but re-simulating failed ({type(exc).__name__}: {exc})")

    def _latest(self, c: Candidate) -> int | None:
        """The candidate's latest simulated min_budget (re-simulated after a calibration)."""
        return self.hints.get(c.conf, self.est.get(c.conf))

    def _floors(self) -> dict[str, int | None]:
        """The optimistic end of each simulated min_budget (`Simulator.floors`), where the
        simulator has one; a failure there only loses the bracket's head start."""
        floors = getattr(self.sim, "floors", None)
        if floors is None:
            return {}
        try:
            return dict(floors([c.conf for c in self.cands]))
        except Exception as exc:  # noqa: BLE001 - bracket from the estimate alone
            self.t.notes.append(f"no optimistic estimate ({type(exc).__name__}: {exc}): probing around the simulated min_budget")
            return {}

    def _floor(self, c: Candidate) -> int | None:
        est, floor = self.est.get(c.conf), self.floors.get(c.conf)
        if est is None or floor is None or floor >= est - tolerance(self.t, est):
            return None  # nothing the program could give up changes the answer
        return floor

    def _bracket(self, c: Candidate) -> Bracket:
        return self.brackets.setdefault(c.conf, Bracket(self.est.get(c.conf), self._floor(c)))

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
            reqs.append(TrialRequest(c.conf, x, ensure_cap=self._gc(c), record=last and self._want_calibration(),
                                     purpose=f"best: {why}"))
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
        return [TrialRequest(c.conf, x, ensure_cap=self._gc(c), purpose=f"under where {c.label} passed")
                for x in budgets]

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

    def _settle(self, c: Candidate, rival: Candidate | None = None) -> Candidate:
        """Probe `c` until its bracket is proven, infeasible, or out of runs; returns `c`, or
        `rival` (the default) when `c` failed above its simulated need and the default then
        completed at that very budget (no need to prove `c`'s bracket: the default beats it)."""
        b = self._bracket(c)
        challenged = rival is None or rival is c
        while self.t.fresh_runs_after_baseline() < self.s.max_gpu_runs:
            if c.conf in self.refused:
                return c
            if not challenged and b.failed is not None and self._optimistic_for(c) and self._may_beat(rival, c, b.failed):
                challenged = True
                res = self._run([TrialRequest(rival.conf, b.failed, ensure_cap=self._gc(rival),
                                              purpose=f"the default, where {c.label} failed")])
                if res and res[0].passed:
                    self.t.notes.append(f"{c.label} failed at {format_mib(b.failed)}, above its simulated min_budget, "
                                        f"and the default completed there: the default is measured instead")
                    return rival
            nxt = next_budget(self.t, b, self.budget, self.hints.get(c.conf))
            if nxt is None:
                return c
            if (b.passed is not None and nxt >= b.passed) or (b.failed is not None and nxt <= b.failed):
                return c  # nothing new to learn there
            pair = self._hint_pair(c, b)
            if pair and self.t.fresh_runs_after_baseline() + 2 <= self.s.max_gpu_runs:
                self._run([TrialRequest(c.conf, x, ensure_cap=self._gc(c), purpose="at the re-simulated min_budget (after calibration)")
                           for x in pair])
                continue
            if b.est is None:
                purpose = "halve (no simulated min_budget to start from)" if b.failed is None else "bisect"
            elif b.passed is not None and b.failed is None and b.widen == 0 and not self._hinted(c, nxt):
                purpose = "just below the simulated min_budget"
            elif self._hinted(c, nxt):
                purpose = "at the re-simulated min_budget (after calibration)"
            elif b.passed is not None and b.failed is not None:
                purpose = "bisect"
            else:
                purpose = "widen: the GPU contradicted the simulation"
            self._run([TrialRequest(c.conf, nxt, ensure_cap=self._gc(c), purpose=purpose,
                                    record=self._want_calibration())])
        if next_budget(self.t, b, self.budget, None) is not None:
            self.t.notes.append(f"{c.label}: stopped at --max-gpu-runs {self.s.max_gpu_runs} before its bracket was proven")
        return c

    def _optimistic_for(self, c: Candidate) -> bool:
        """Whether `c` failed above where the simulation put its need (for a range: above its
        recorded end), i.e. the simulation was optimistic for it."""
        b = self._bracket(c)
        likely = self._latest(c) if b.floor is None else b.est
        return b.failed is not None and likely is not None and b.failed > likely

    # ---- the flow ----------------------------------------------------------------------------
    def run(self) -> list[CandidateSummary]:
        if self.t.simulator_factory is None or not self.baseline.snapshot:
            raise SimulationUnavailable("the baseline wrote no recording")
        try:
            self.sim = self.t.simulator_factory(self.baseline)
            self.est = dict(self.sim.estimates([c.conf for c in self.cands]))
        except Exception as exc:  # noqa: BLE001 - the caller measures instead, and says why
            raise SimulationUnavailable(f"{type(exc).__name__}: {exc}") from exc
        self.floors = self._floors()
        note = getattr(self.sim, "note", None)
        if note:
            self.t.notes.append(note)
        bracketed = sum(1 for c in self.cands if self._floor(c) is not None)
        if bracketed:
            self.t.notes.append(
                f"{bracketed} candidate(s) simulated as a range: from the replay with every workspace-shaped request "
                "given up (where the real need was found on convolution workloads) to the replay as recorded; "
                "the GPU measured where in it each one that ran lies")
        order = sorted(self.cands, key=lambda c: (self._est_key(c), c.knob != DEFAULT, c.conf))
        default = next((c for c in self.cands if c.knob == DEFAULT), Candidate(""))
        fits = [c for c in order if self._likely(c) is not None and self._likely(c) <= self.budget]
        best = fits[0] if fits else None

        # batch 1 (independent runs, side by side): the best around where its need likely lies,
        # and the default at the user's budget unless the baseline already showed it completes
        # there (when the best is the default itself, its own runs answer "does it fit?").
        # Runs that sample throughput have the GPU alone, and only when the simulated allocator
        # work cannot rule a slowdown out (`_must_measure`).
        closest = None if best is not None else self._closest(order)
        if closest is not None:
            # nothing is simulated to fit: one run of the closest setting at the budget says whether
            # the program asks for less under the cap than it recorded; if not, say by how much the
            # budget falls short and what can help, instead of running every candidate
            if self._confirm_closest(closest):
                best = closest
            else:
                return self._summaries(default, None, order)
        else:
            measure = self._must_measure(default, best)
            reqs = self._opening(best, exclusive=measure) if best is not None else []
            if best is None or best.knob != DEFAULT:
                proof = self._default_proven()
                fails = self._default_fails() if proof is None else None
                if proof is not None and not measure:
                    self.at_budget[""] = self.baseline
                    self.default_proof = proof
                    self.t.notes.append(proof)
                elif fails is not None and best is not None:
                    self.default_fails = fails
                    self.t.notes.append(fails)
                else:
                    reqs.append(TrialRequest("", self.budget, exclusive=measure, purpose="the default at the budget"))
            self._run(sorted(reqs, key=lambda r: r.exclusive))  # the side by side ones first

        if best is None and self.t.fresh_runs_after_baseline() < self.s.max_gpu_runs:
            best = self._despite_simulation(order)

        # settle the best; if it is refused or infeasible, move down the simulator's order
        focus = best
        tried: list[Candidate] = []
        while focus is not None:
            tried.append(focus)
            won = self._settle(focus, rival=default if default in self.cands else None)
            if won is not focus:  # the default completed where the focus failed: prove the default's bracket
                focus = won
                tried.append(focus)
                self._run(self._below(focus))
                self._settle(focus)
            b = self._bracket(focus)
            if focus.conf not in self.refused and b.passed is not None:
                break
            focus = next((c for c in fits if c not in tried), None)
            if focus is None or self.t.fresh_runs_after_baseline() >= self.s.max_gpu_runs:
                focus = None
            else:  # the next best starts like the best did
                self._run(self._opening(focus))

        # the simulation was wrong for the focus: can the runner-up beat its measured bracket?
        if focus is not None:
            fb = self._bracket(focus)
            ef = self._latest(focus)
            wrong = self._contradicted(focus)
            runner = next((c for c in fits if c not in tried and c.knob != DEFAULT), None)
            er = self._latest(runner) if runner is not None else None
            challengers = []
            # Could the runner-up run where the focus failed? Yes if its (latest) estimate says so,
            # either as simulated or with the focus's simulation error applied to it.
            if wrong and er is not None and ef and min(er, er * fb.passed / ef) < fb.failed:
                challengers.append((runner, f"runner-up, where {focus.label} failed"))
            # The simulation erred for this program; the default (nothing to change) is checked
            # there too, since the errors of different settings need not go the same way.
            if wrong and focus.knob != DEFAULT and self._may_beat(default, focus):
                challengers.append((default, f"the default, where {focus.label} failed"))
            room = self.s.max_gpu_runs - self.t.fresh_runs_after_baseline()
            challengers = challengers[:max(0, room)]
            if challengers and fb.failed is not None:
                out = self._run([TrialRequest(c.conf, fb.failed, ensure_cap=self._gc(c), purpose=why) for c, why in challengers])
                tried.extend(c for c, _ in challengers)
                winners = [c for (c, _), r in zip(challengers, out) if r.passed and c.conf not in self.refused]
                for c in sorted(winners, key=lambda c: c.knob != DEFAULT):
                    self._settle(c)
                    cb = self._bracket(c)
                    if cb.passed is not None and (cb.passed < fb.passed - tolerance(self.t, fb.passed)
                                                  or (c.knob == DEFAULT and cb.passed <= fb.passed)):
                        focus, fb = c, cb  # it beats the focus (the default on a tie: nothing to change)

        if focus is not None and focus.knob != DEFAULT:
            self._throughput(default, focus)
        return self._summaries(default, focus, order)

    def _despite_simulation(self, order: list[Candidate]) -> Candidate | None:
        """Nothing is simulated to fit: run the candidates at the budget anyway, best estimate first.

        The simulator replays what the program asked for uncapped; a program that asks for less
        under another setting or under pressure can still fit, and an empty answer must be
        measured, not simulated.
        """
        for c in order:
            if c.knob == DEFAULT or c.conf in self.refused:
                continue  # the default already ran at the budget
            if self.t.fresh_runs_after_baseline() >= self.s.max_gpu_runs:
                break
            b = self.brackets.setdefault(c.conf, Bracket(None))
            self._run([TrialRequest(c.conf, self.budget, exclusive=True, ensure_cap=self._gc(c), record=self._want_calibration(),
                                    purpose="at the budget although simulated not to fit")])
            if b.passed is not None:
                self.t.notes.append(
                    f"the simulation said no setting fits {format_mib(self.budget)}, but {c.label} completed there: "
                    "the program asks for less memory than its uncapped recording under this setting or cap"
                )
                return c
        return None

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

    def _confirm_closest(self, closest: Candidate) -> bool:
        """No setting is simulated to fit: run the closest one once at the budget. True when it
        completed (the program asks for less under a cap than it recorded: tune it as usual);
        else `shortfall` says by how much the budget falls short and what to do next."""
        b = self._bracket(closest)
        res = self._run([TrialRequest(closest.conf, self.budget, ensure_cap=self._gc(closest), record=self._want_calibration(),
                                      purpose="the closest setting at the budget (simulated not to fit): confirm")])
        if b.passed is not None:
            self.t.notes.append(
                f"the simulation said no setting fits {format_mib(self.budget)}, but {closest.label} completed there: "
                "the program asks for less memory under this cap than its uncapped recording")
            # the simulation is off for it: start from what the passing run reserved (a cap above a
            # run's peak reserved changes nothing), just above and just below, side by side
            peak = res[0].peak_reserved if res else None
            b.est, b.floor = (align_up(peak), None) if peak else (None, None)
            if peak and align_up(peak) < self.budget:
                h = half_width(self.t, peak)
                b.lo_tried = True
                self._run([TrialRequest(closest.conf, x, ensure_cap=self._gc(closest), purpose=why) for x, why in (
                    (align_up(peak), "at the peak reserved of its pass"),
                    (align_down(peak - h), "just below the peak reserved of its pass")) if 0 < x < self.budget])
            return True
        need = self._likely(closest) or 0
        confirmed = closest.conf not in self.refused and b.failed is not None
        self.shortfall = Shortfall(closest.conf, need, self.budget, confirmed, self.baseline.snapshot,
                                   next_steps(self.baseline.snapshot, self.budget, need, self.t.settings.command))
        self.t.notes.append(
            f"no setting is simulated to fit {format_mib(self.budget)}: the closest, {closest.label}, needs "
            f"{format_mib(need)} ({format_mib(self.shortfall.missing)} more)"
            + ("; its run at the budget ran out of memory, as simulated: the other settings were not run"
               if confirmed else "; its run at the budget did not settle it (the setting did not take effect)"))
        return False

    def _default_fails(self) -> str | None:
        """Why the default needs no run at the budget because it cannot complete there, or None:
        the baseline recorded the default itself, and replaying that very recording (its optimistic
        end, for a program that adapts) needs more than the budget by more than the tolerance."""
        default = next((c for c in self.cands if c.knob == DEFAULT), None)
        if default is None or default.conf in self.refused:
            return None
        need = self._likely(default)
        if need is None or need <= self.budget + tolerance(self.t, self.budget):
            return None  # a thin margin: run it
        return (f"the default does not complete at the budget: replaying its own recording needs {format_mib(need)}, "
                f"{format_mib(need - self.budget)} more than {format_mib(self.budget)} (not run on the GPU)")

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
        return (f"the default completes at the budget: the baseline reserved at most {format_mib(base.peak_reserved)} "
                f"of {format_mib(self.budget)}, and a cap above a run's peak changes nothing the allocator does "
                "(not run again)")

    def _bound(self, default: Candidate, best: Candidate) -> OverheadBound | None:
        """How much slower the allocator work alone can make `best` than the default at the
        budget (simulated), or None when the simulator cannot say. A job of several ranks is as
        slow as its slowest: each rank is bounded on its own recording and the worst one kept."""
        if best.conf in self.bounds:
            return self.bounds[best.conf]
        sims = list(getattr(self.sim, "ranks", {}).values()) or [self.sim]
        found: list[OverheadBound] = []
        for sim in sims:
            activity = getattr(sim, "activity", None)
            if activity is None:
                found = []
                break
            try:
                act = activity([default.conf, best.conf], self.budget)
                span = getattr(sim, "gpu_span_s", None) or self.baseline.wall_s
                found.append(overhead_bound(act[default.conf], act[best.conf], span, call_s=self.s.driver_call_s,
                                            mib_s=self.s.driver_mib_s, sync_s=self.s.sync_s,
                                            tolerance=self.s.throughput_tolerance))
            except Exception as exc:  # noqa: BLE001 - measure instead
                self.t.notes.append(f"allocator work not simulated ({type(exc).__name__}: {exc}): throughput measured")
                found = []
                break
        bound = max(found, key=lambda b: (not b.rules_out, b.fraction or 0.0)) if found else None
        if bound is not None and not bound.rules_out:
            self.t.notes.append(f"throughput of {best.label}: {bound.text}")
        self.bounds[best.conf] = bound
        return bound

    def _must_measure(self, default: Candidate, best: Candidate | None) -> bool:
        """Whether `best`'s throughput against the default needs runs that have the GPU alone."""
        if best is None or best.knob == DEFAULT:
            return False
        if self.s.throughput_check == "measure":
            return True
        bound = self._bound(default, best)
        return bound is None or not bound.rules_out

    def _throughput(self, default: Candidate, best: Candidate) -> None:
        """Throughput against the default, only where it could matter.

        First the simulated allocator work (`_bound`): a setting changes no kernel, so when the
        driver calls it adds cannot cost `throughput_tolerance` of the run, nothing is run.
        Otherwise samples from runs that had the GPU alone (the default at the budget, the
        best's top probe, then runs at the budget), and A/B repeats, alternating, while the best
        may be measurably slower.
        """
        ok_default = self.at_budget.get("")
        if ok_default is None or not ok_default.passed:
            return  # the default does not complete: no alternative to compare with
        if not self._must_measure(default, best):
            bound = self.bounds.get(best.conf)
            if bound is not None:
                self.verdict = bound.text
            return
        unit = ok_default.throughput_unit
        # a repeat number of their own: a run at the budget made side by side is no sample
        missing = [TrialRequest(conf, self.budget, repeat=self.s.ab_pairs + 1, exclusive=True, ensure_cap=self._gc(c),
                                purpose="throughput sample (alone on the GPU)")
                   for conf, c in (("", default), (best.conf, best)) if not self.samples.get(conf)]
        if missing:
            self._run(missing)
        pairs = 0
        while True:
            cmp_ = compare(self.samples.get("", []), self.samples.get(best.conf, []),
                           tolerance=self.s.throughput_tolerance, unit=unit)
            self.verdict = cmp_.text
            self.comparison = cmp_
            if cmp_.slower is not None or cmp_.gap is None or cmp_.gap <= self.s.throughput_tolerance:
                return
            if pairs >= self.s.ab_pairs or self.t.fresh_runs_after_baseline() + 2 > self.s.max_gpu_runs:
                self.verdict = f"{cmp_.text}; no measurable difference after {pairs} A/B pair(s): decided on memory"
                return
            pairs += 1
            rep = pairs
            self._run([
                TrialRequest("", self.budget, repeat=rep, exclusive=True, purpose="throughput A/B"),
                TrialRequest(best.conf, self.budget, repeat=rep, exclusive=True, ensure_cap=self._gc(best),
                             purpose="throughput A/B"),
            ])

    def _summaries(self, default: Candidate, focus: Candidate | None, order: list[Candidate]) -> list[CandidateSummary]:
        out = []
        focus_b = self.brackets.get(focus.conf) if focus is not None else None
        cmp_ = getattr(self, "comparison", None)
        for rank_no, c in enumerate(order, 1):
            est = self.hints.get(c.conf, self.est.get(c.conf))  # the latest simulation (after calibration)
            b = self.brackets.get(c.conf)
            at = self.at_budget.get(c.conf)
            r = rate(self.samples.get(c.conf, []))
            base = dict(sim_min_budget=est, sim_optimistic=self._floor(c), throughput=r.mean if r else None,
                        throughput_noise=r.noise if r else None, throughput_samples=r.samples if r else 0)
            if c.conf in self.refused:
                out.append(CandidateSummary(c, feasible=None, note=f"refused: the setting did not take effect ({self.refused[c.conf]})", **base))
                continue
            if b is not None and b.runs:
                feasible = True if b.passed is not None else (False if b.failed is not None and b.failed >= self.budget else None)
                if at is not None:
                    feasible = at.passed
                verified = b.passed is not None and b.failed is not None and b.passed - b.failed <= tolerance(self.t, b.passed)
                note = None
                if b.passed is None:
                    note = f"did not complete at {_fmt(b.failed)} (simulated min_budget {_fmt(est)})"
                elif not verified:
                    note = "min_budget bracket not proven (run limit)"
                sm = CandidateSummary(
                    c, feasible=feasible, outcome=(at.outcome if at else ("ok" if b.passed else "oom")),
                    min_budget=b.passed, infeasible_below=b.failed, verified=verified,
                    sim_agrees=None if b.agrees() is None else not self._contradicted(c), wall_s=at.wall_s if at else None,
                    peak_reserved=at.peak_reserved if at else None, peak_allocated=at.peak_allocated if at else None,
                    note=note, **base)
                if c is focus and cmp_ is not None and cmp_.slower:
                    sm = replace(sm, measurably_slower=True, note=f"throughput: {cmp_.text}")
                elif c is focus and self.verdict:
                    sm = replace(sm, note=f"throughput vs the default: {self.verdict}")
                out.append(sm)
                continue
            if at is not None:  # run at the budget only (the default, usually)
                note = f"completes at the budget; min_budget not measured (simulated {_fmt(est)})" if at.passed else None
                if at is self.baseline and self.default_proof:
                    note = f"completes at the budget, shown by the baseline; min_budget not measured (simulated {_fmt(est)})"
                out.append(CandidateSummary(
                    c, feasible=at.passed, outcome=at.outcome, wall_s=at.wall_s, peak_reserved=at.peak_reserved,
                    peak_allocated=at.peak_allocated, note=note, **base))
                continue
            if c.knob == DEFAULT and self.default_fails:
                why = self.default_fails
            elif est is None or est > self.budget:
                why = f"simulated: does not complete under the budget {format_mib(self.budget)}" if est is None or est > self.budget else ""
                if est is not None:
                    why += f" (simulated min_budget {format_mib(est)})"
            elif focus_b is not None and focus_b.passed is not None:
                why = (f"simulated min_budget {format_mib(est)} (rank {rank_no}), not below what "
                       f"{focus.label} was measured to need ({format_mib(focus_b.passed)}): not run on the GPU")
            else:
                why = f"simulated min_budget {format_mib(est)} (rank {rank_no}): not run on the GPU"
            out.append(CandidateSummary(c, feasible=None, note=why, **base))
        return out


def next_steps(recording: str | None, budget: int, need: int, command: tuple[str, ...]) -> tuple[str, ...]:
    """What can help when no allocator setting fits: see where the memory goes (explain: sites,
    what-ifs, remedies), find the largest input that fits (plan), or give the budget the closest
    setting needs."""
    from alloctune.diagnose.snapshot import shortage_next_steps

    at_least = f"{-(-need // MiB)}MiB"  # rounded up: the closest setting's need
    out = shortage_next_steps(recording or "REC.pickle", budget, " ".join(command) if command else "CMD")
    out.append(f"or a budget of at least {at_least} (the closest setting's simulated need): alloctune tune --budget {at_least} ...")
    return tuple(out)


def _fmt(n: int | None) -> str:
    return "-" if n is None else format_mib(n)
