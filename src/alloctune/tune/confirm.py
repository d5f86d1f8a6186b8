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
   Where the default is shown not to complete at the budget (`_default_fails`) it has no
   rate there, so nothing is compared and no run needs the GPU alone: the opening runs side
   by side, and the output says what is known instead (the driver work the best adds over
   the default with the whole card, simulated; no sample alone unless `--throughput measure`,
   which still puts the best's likely pass alone on the GPU).

With an accurate simulator that is two GPU runs after the baseline, side by side (three in
all, about two runs of wall time); where nothing fits, one. A run alone on the GPU (a
throughput sample) waits for the side by side ones and adds a run of wall time.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from alloctune.run.trial import TrialRequest, TrialResult
from alloctune.tune.bracket import Bracket, half_width, next_budget, tolerance
from alloctune.tune.candidates import DEFAULT, Candidate
from alloctune.tune.confirm_choice import ChoiceMixin
from alloctune.tune.confirm_report import ReportMixin, next_steps
from alloctune.tune.model import Shortfall, align_down, align_up
from alloctune.tune.objective import CandidateSummary
from alloctune.tune.throughput import OverheadBound
from alloctune.units import format_size

if TYPE_CHECKING:
    from alloctune.tune.model import Sweep

__all__ = ["ConfirmFlow", "SimulationUnavailable", "next_steps"]


class SimulationUnavailable(Exception):
    """The baseline's recording cannot be simulated: the tuner measures every candidate instead."""


class ConfirmFlow(ChoiceMixin, ReportMixin):
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
        self.alone: set[str] = set()  # settings with a completed run that had the GPU alone
        self.hints: dict[str, int | None] = {}
        self.verdict: str | None = None
        self.calibrated = False
        self.floors: dict[str, int | None] = {}
        self.default_proof: str | None = None  # why the default was not run at the budget
        self.bounds: dict[str, OverheadBound | None] = {}  # conf -> simulated allocator slowdown bound
        self.default_fails: str | None = None  # why the default was not run at the budget (simulated not to fit)
        self.shortfall: Shortfall | None = None  # no setting fits: the closest, how far off, what next
        self.no_grad: tuple[str, TrialResult] | None = None  # (setting, its run) confirming torch.no_grad()
        self.cudnn: tuple[str, TrialResult] | None = None  # (setting, its run) confirming the cuDNN switch
        self.checkpointing: tuple[str, TrialResult] | None = None  # (setting, its run) confirming checkpointing
        self.early: Any = None  # Future of `tune.remedies.simulate` under the planned best, run beside the GPU
        self._early_thread: Any = None  # its thread, started with the first batch (`_run`)

    # ---- GPU runs ----------------------------------------------------------------------------
    def _run(self, reqs: list[TrialRequest]) -> list[TrialResult]:
        reqs = [r for r in reqs if r.conf not in self.refused]
        self._start_early()
        out = self.t.batch(reqs)
        for req, res in zip(reqs, out):
            self._learn(req, res)
        return out

    def _learn(self, req: TrialRequest, res: TrialResult) -> None:
        if req.no_grad:  # a remedy's confirming run says nothing about the setting's bracket
            self.no_grad = (req.conf, res)
            return
        if req.cudnn_benchmark is not None:
            self.cudnn = (req.conf, res)
            return
        if req.checkpointing:
            self.checkpointing = (req.conf, res)
            return
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
        if ok and req.exclusive:
            self.alone.add(req.conf)
            if res.throughput is not None:
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
                res = self._run(
                    [
                        TrialRequest(
                            rival.conf, b.failed, ensure_cap=self._gc(rival), purpose=f"the default, where {c.label} failed"
                        )
                    ]
                )
                if res and res[0].passed:
                    self.t.notes.append(
                        f"{c.label} failed at {format_size(b.failed)}, above its simulated min_budget, "
                        f"and the default completed there: the default is measured instead"
                    )
                    return rival
            nxt = next_budget(self.t, b, self.budget, self.hints.get(c.conf))
            if nxt is None:
                return c
            if (b.passed is not None and nxt >= b.passed) or (b.failed is not None and nxt <= b.failed):
                return c  # nothing new to learn there
            pair = self._hint_pair(c, b)
            if pair and self.t.fresh_runs_after_baseline() + 2 <= self.s.max_gpu_runs:
                self._run(
                    [
                        TrialRequest(
                            c.conf, x, ensure_cap=self._gc(c), purpose="at the re-simulated min_budget (after calibration)"
                        )
                        for x in pair
                    ]
                )
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
            self._run([TrialRequest(c.conf, nxt, ensure_cap=self._gc(c), purpose=purpose, record=self._want_calibration())])
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
        """The flow (module doc): simulate, open with one batch, settle the best, challenge it."""
        self._simulate()
        order = sorted(self.cands, key=lambda c: (self._est_key(c), c.knob != DEFAULT, c.conf))
        default = next((c for c in self.cands if c.knob == DEFAULT), Candidate(""))
        fits = [c for c in order if self._likely(c) is not None and self._likely(c) <= self.budget]
        best = fits[0] if fits else None
        closest = None if best is not None else self._closest(order)
        self._simulate_remedies(best or closest)
        if closest is not None:
            # nothing is simulated to fit: one run of the closest setting at the budget says whether
            # the program asks for less under the cap than it recorded; if not, say by how much the
            # budget falls short and what can help, instead of running every candidate
            if not self._confirm_closest(closest):
                return self._summaries(default, None, order)
            best = closest
        else:
            self._open(best, default)
        if best is None and self.t.fresh_runs_after_baseline() < self.s.max_gpu_runs:
            best = self._despite_simulation(order)
        focus, tried = self._settle_best(best, default, fits)
        if focus is not None:
            focus = self._challenge(focus, default, fits, tried)
        if focus is not None and focus.knob != DEFAULT:
            self._throughput(default, focus)
        return self._summaries(default, focus, order)

    def _start_early(self) -> None:
        thread, self._early_thread = self._early_thread, None
        if thread is not None:
            thread.start()

    def early_remedies(self) -> Any:
        """The remedies simulated beside the GPU runs (`tune.remedies.simulate`'s answer), None if not asked."""
        self._start_early()
        return self.early.result() if self.early is not None else None

    def _simulate_remedies(self, c: Candidate | None) -> None:
        """Simulate the remedies under the planned best (or closest) setting in a thread: CPU work of
        seconds on a large recording, done while the GPU runs instead of after them. The thread starts
        with the first batch: until the runs are handed over, the choosing of them has the CPU."""
        if c is None or not self.s.remedies:
            return
        import threading
        from concurrent.futures import Future

        from alloctune.tune.remedies import simulate

        fut: Future = Future()

        def work() -> None:  # a daemon thread: an interrupted tune does not wait for it
            try:
                fut.set_result(simulate(self.sim, self.baseline, c.conf, " ".join(self.s.command)))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for it
                fut.set_exception(exc)

        self._early_thread = threading.Thread(target=work, name="alloctune-remedies", daemon=True)
        self.early = fut

    def _simulate(self) -> None:
        """Every candidate's simulated min_budget (and optimistic end) from the baseline's recording."""
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
                "the GPU measured where in it each one that ran lies"
            )

    def _open(self, best: Candidate | None, default: Candidate) -> None:
        """Batch 1 (independent runs, side by side): the best around where its need likely lies, and
        the default at the user's budget unless the baseline already showed it completes there or
        replaying its recording shows it cannot (when the best is the default itself, its own runs
        answer "does it fit?"). Runs that sample throughput have the GPU alone, and only when the
        simulated allocator work cannot rule a slowdown out (`_must_measure`) -- never when the
        default is shown not to complete at the budget: there is no default rate there to compare
        with, so the opening runs side by side (unless `--throughput measure`). Where the default's
        fit is in doubt (its simulated need within the tolerance of the budget), its run answers
        first, side by side; the samples alone follow only if it completes (`_throughput`): the
        same wall time when it does, two runs less when it does not."""
        proof = fails = None
        if best is None or best.knob != DEFAULT:
            proof = self._default_proven()
            fails = self._default_fails() if proof is None and best is not None else None
            if fails is not None:
                self.default_fails = fails
                self.t.notes.append(fails)
        measure = self._must_measure(default, best)
        if measure and proof is None and fails is None and self.s.throughput_check != "measure":
            measure = False
            self.t.notes.append(
                "the default may not complete at the budget (simulated within the tolerance): it runs "
                "there side by side with the best's first runs; throughput is sampled alone on the GPU "
                "only if it completes"
            )
        reqs = self._opening(best, exclusive=measure) if best is not None else []
        if best is None or best.knob != DEFAULT:
            if proof is not None and not measure:
                self.at_budget[""] = self.baseline
                self.default_proof = proof
                self.t.notes.append(proof)
            elif fails is None:
                reqs.append(TrialRequest("", self.budget, exclusive=measure, purpose="the default at the budget"))
        self._run(sorted(reqs + self._remedy_runs(best), key=lambda r: r.exclusive))  # the side by side ones first

    def _remedy_runs(self, c: Candidate | None, shortfall: bool = False) -> list[TrialRequest]:
        """The remedies that need a confirming run, under `c` at the budget, side by side with the
        flow's first batch (one run each: autograd off, when the baseline ran inference with it on; where
        no setting fits (`shortfall`), the cuDNN switch the other way, when the recording shows
        convolution workspaces whose giving up would fit the budget)."""
        if c is None or not self.s.remedies:
            return []
        from alloctune.remedy.measured import checkpointing_request, cudnn_request, no_grad_request
        from alloctune.tune.remedies import _trace

        reqs = [no_grad_request(self.baseline, c.conf, self.budget)]
        try:
            if shortfall:
                trace = _trace(self.sim, self.baseline)
                reqs.append(cudnn_request(self.baseline, trace, c.conf, self.budget))
                reqs.append(checkpointing_request(self.baseline, trace, c.conf, self.budget))
        except Exception as exc:  # noqa: BLE001 - the settings stand without the remedy
            self.t.notes.append(f"a remedy's confirming run not made ({type(exc).__name__}: {exc})")
        return [replace(r, ensure_cap=r.ensure_cap or self._gc(c)) for r in reqs if r is not None]

    def _settle_best(
        self, best: Candidate | None, default: Candidate, fits: list[Candidate]
    ) -> tuple[Candidate | None, list[Candidate]]:
        """Settle the best; if it is refused or infeasible, move down the simulator's order. Returns
        the focus (None: nothing passed) and the candidates tried."""
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
        return focus, tried

    def _challenge(self, focus: Candidate, default: Candidate, fits: list[Candidate], tried: list[Candidate]) -> Candidate:
        """The simulation was wrong for the focus: can the runner-up (or the default) beat its
        measured bracket? Returns the focus, or the challenger that beat it."""
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
        challengers = challengers[: max(0, room)]
        if not challengers or fb.failed is None:
            return focus
        out = self._run([TrialRequest(c.conf, fb.failed, ensure_cap=self._gc(c), purpose=why) for c, why in challengers])
        tried.extend(c for c, _ in challengers)
        winners = [c for (c, _), r in zip(challengers, out) if r.passed and c.conf not in self.refused]
        for c in sorted(winners, key=lambda c: c.knob != DEFAULT):
            self._settle(c)
            cb = self._bracket(c)
            if cb.passed is not None and (
                cb.passed < fb.passed - tolerance(self.t, fb.passed) or (c.knob == DEFAULT and cb.passed <= fb.passed)
            ):
                focus, fb = c, cb  # it beats the focus (the default on a tie: nothing to change)
        return focus

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
            self._run(
                [
                    TrialRequest(
                        c.conf,
                        self.budget,
                        exclusive=True,
                        ensure_cap=self._gc(c),
                        record=self._want_calibration(),
                        purpose="at the budget although simulated not to fit",
                    )
                ]
            )
            if b.passed is not None:
                self.t.notes.append(
                    f"the simulation said no setting fits {format_size(self.budget)}, but {c.label} completed there: "
                    "the program asks for less memory than its uncapped recording under this setting or cap"
                )
                return c
        return None

    def _confirm_closest(self, closest: Candidate) -> bool:
        """No setting is simulated to fit: run the closest one once at the budget. True when it
        completed (the program asks for less under a cap than it recorded: tune it as usual);
        else `shortfall` says by how much the budget falls short and what to do next."""
        b = self._bracket(closest)
        res = self._run(
            [
                TrialRequest(
                    closest.conf,
                    self.budget,
                    ensure_cap=self._gc(closest),
                    record=self._want_calibration(),
                    purpose="the closest setting at the budget (simulated not to fit): confirm",
                )
            ]
            + self._remedy_runs(closest, shortfall=True)
        )
        if b.passed is not None:
            self.t.notes.append(
                f"the simulation said no setting fits {format_size(self.budget)}, but {closest.label} completed there: "
                "the program asks for less memory under this cap than its uncapped recording"
            )
            # the simulation is off for it: start from what the passing run reserved, just above and just
            # below, side by side (a first estimate: under the default rules a cap above a run's peak
            # reserved changes nothing, under expandable segments it can; the runs decide)
            peak = res[0].peak_reserved if res else None
            b.est, b.floor = (align_up(peak), None) if peak else (None, None)
            if peak and align_up(peak) < self.budget:
                h = half_width(self.t, peak)
                b.lo_tried = True
                self._run(
                    [
                        TrialRequest(closest.conf, x, ensure_cap=self._gc(closest), purpose=why)
                        for x, why in (
                            (align_up(peak), "at the peak reserved of its pass"),
                            (align_down(peak - h), "just below the peak reserved of its pass"),
                        )
                        if 0 < x < self.budget
                    ]
                )
            return True
        need = self._likely(closest) or 0
        confirmed = closest.conf not in self.refused and b.failed is not None
        self.shortfall = Shortfall(
            closest.conf,
            need,
            self.budget,
            confirmed,
            self.baseline.snapshot,
            next_steps(
                self.baseline.snapshot,
                self.budget,
                need,
                self.t.settings.command,
                training=bool((self.baseline.autograd or {}).get("backward_calls")),
            ),
        )
        self.t.notes.append(
            f"no setting is simulated to fit {format_size(self.budget)}: the closest, {closest.label}, needs "
            f"{format_size(need)} ({format_size(self.shortfall.missing)} more)"
            + (
                "; its run at the budget ran out of memory, as simulated: the other settings were not run"
                if confirmed
                else "; its run at the budget did not settle it (the setting did not take effect)"
            )
        )
        return False
