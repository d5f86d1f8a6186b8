"""The confirm flow's report (`tune.confirm`): throughput only where it could matter, each
candidate's summary (measured, simulated, refused, not run and why), and the next steps when no
setting fits.

A mixin of `ConfirmFlow` (throughput runs go through its `_run`), plus `next_steps`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from alloctune.tune.bracket import tolerance
from alloctune.tune.candidates import DEFAULT, Candidate
from alloctune.tune.confirm_choice import FlowState
from alloctune.tune.executors.base import TrialRequest
from alloctune.tune.objective import CandidateSummary
from alloctune.tune.throughput import OverheadBound, compare, overhead_bound, rate
from alloctune.units import MiB, format_size


class ReportMixin(FlowState):
    """Throughput checks and the candidates' summaries; `ConfirmFlow` holds the state."""

    # its own part of the flow's state
    bounds: dict[str, OverheadBound | None]
    verdict: str | None
    default_proof: str | None
    default_fails: str | None

    def _bound(self, default: Candidate, best: Candidate, *, uncapped: bool = False) -> OverheadBound | None:
        """How much slower the allocator work alone can make `best` than the default at the
        budget (simulated), or None when the simulator cannot say. A job of several ranks is as
        slow as its slowest: each rank is bounded on its own recording and the worst one kept.
        `uncapped`: against the default with the whole card (as the baseline ran it), for a
        default that does not complete at the budget -- its replay there stops at its OOM, and
        the work it did until then is no reference."""
        key = f"{best.conf}\0uncapped" if uncapped else best.conf
        if key in self.bounds:
            return self.bounds[key]
        sims = list(getattr(self.sim, "ranks", {}).values()) or [self.sim]
        found: list[OverheadBound] = []
        for sim in sims:
            activity = getattr(sim, "activity", None)
            if activity is None:
                found = []
                break
            try:
                if uncapped:  # two replays, each at its own budget
                    card = max(self.baseline.total_memory or 2 * max(self.budget, self.baseline.peak_reserved or 0), self.budget)
                    act = {**activity([default.conf], card), **activity([best.conf], self.budget)}
                else:
                    act = activity([default.conf, best.conf], self.budget)
                span = getattr(sim, "gpu_span_s", None) or self.baseline.wall_s
                found.append(
                    overhead_bound(
                        act[default.conf],
                        act[best.conf],
                        span,
                        call_s=self.s.driver_call_s,
                        mib_s=self.s.driver_mib_s,
                        sync_s=self.s.sync_s,
                        tolerance=self.s.throughput_tolerance,
                        against="the default with the whole card" if uncapped else "the default",
                    )
                )
            except Exception as exc:  # noqa: BLE001 - measure instead
                if not uncapped:
                    self.t.notes.append(f"allocator work not simulated ({type(exc).__name__}: {exc}): throughput measured")
                found = []
                break
        bound = max(found, key=lambda b: (not b.rules_out, b.fraction or 0.0)) if found else None
        if bound is not None and not bound.rules_out and not uncapped:
            self.t.notes.append(f"throughput of {best.label}: {bound.text}")
        self.bounds[key] = bound
        return bound

    def _must_measure(self, default: Candidate, best: Candidate | None) -> bool:
        """Whether `best`'s throughput against the default needs runs that have the GPU alone.
        Never (unless `--throughput measure`) when the default is shown not to complete at the
        budget (`default_fails`): the default has no rate there, so a sample alone compares
        with nothing and only costs wall time (the opening pair would run one after the other).
        Always when a completing run of `best` caught OOMs (fallbacks to slower algorithms)."""
        if best is None or best.knob == DEFAULT:
            return False
        if self.s.throughput_check == "measure":
            return True
        if self.default_fails is not None:
            return False
        if any(t.result.conf == best.conf and t.result.passed and t.result.num_ooms for t in self.t.trials):
            return True  # it completed by cuDNN's slower fallbacks: timed alone at the budget, where it may have none
        bound = self._bound(default, best)
        return bound is None or not bound.rules_out

    def _unpaired(self, default: Candidate, best: Candidate, ran: Any) -> None:
        """The default does not complete at the budget: say what is and is not known about
        `best`'s throughput (the verdict on its summary, and a note), without a comparison that
        cannot be made. `ran`: the default's run at the budget, if it had one."""
        if ran is not None:
            why = f"the default's run at {format_size(self.budget)} did not complete ({ran.outcome})"
        else:
            why = f"the default does not complete at {format_size(self.budget)} (simulated from its own recording, not run)"
        unit = next(
            (
                t.result.throughput_unit
                for t in reversed(self.t.trials)
                if t.result.conf == best.conf and t.result.throughput_unit
            ),
            None,
        )
        r = rate(self.samples.get(best.conf, []), unit)
        if r is not None:
            sampled = f"{best.label} alone on the GPU: {r.text()}"
        elif best.conf in self.alone:
            sampled = f"{best.label} ran alone on the GPU, but the workload reported no throughput"
        else:
            sampled = (
                f"no run of {best.label} had the GPU alone, so its rate was not measured (--throughput measure samples it alone)"
            )
        bound = self._bound(default, best, uncapped=True)
        cost = ""
        if bound is not None and bound.seconds is not None:
            text = bound.text.removesuffix(": measured")
            cost = f"; allocator work: {text}" + ("" if bound.rules_out else ", more than the tolerance")
        elif bound is not None and bound.fraction is None and bound.extra_fallbacks == 0 and self._floor(best) is not None:
            cost = (
                "; its allocator work is not bounded by the simulation: replayed as recorded it does not complete at "
                "the budget, it fits by giving up workspace-shaped requests, and only a run alone can time what "
                "replaces them"
            )
        elif bound is not None:
            cost = f"; its allocator work is not bounded by the simulation ({bound.text})"
        self.verdict = f"not compared: {why}, so there is no default rate at this budget; {sampled}{cost}"
        self.t.notes.append(f"throughput of {best.label}: {self.verdict}")

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
            if ok_default is not None or self.default_fails is not None:
                self._unpaired(default, best, ok_default)  # no alternative to compare with: say so
            return
        if not self._must_measure(default, best):
            bound = self.bounds.get(best.conf)
            if bound is not None:
                self.verdict = bound.text
            return
        unit = ok_default.throughput_unit
        # a repeat number of their own: a run at the budget made side by side is no sample
        unsampled = [(conf, c) for conf, c in (("", default), (best.conf, best)) if not self.samples.get(conf)]
        ran = [t.result for t in self.t.trials if t.result.conf == best.conf and t.result.passed]
        if self.samples.get(best.conf) and ran and all(r.num_ooms for r in ran) and not any(r.budget == self.budget for r in ran):
            unsampled.append((best.conf, best))  # its samples ran on fallbacks below the budget, where it may have none
        missing = [
            TrialRequest(
                conf,
                self.budget,
                repeat=self.s.ab_pairs + 1,
                exclusive=True,
                ensure_cap=self._gc(c),
                purpose="throughput sample (alone on the GPU)",
            )
            for conf, c in unsampled
        ]
        if missing:
            self._run(missing)
        pairs = 0
        while True:
            cmp_ = compare(
                self.samples.get("", []), self.samples.get(best.conf, []), tolerance=self.s.throughput_tolerance, unit=unit
            )
            self.verdict = cmp_.text
            self.comparison = cmp_
            if cmp_.slower is not None or cmp_.gap is None or cmp_.gap <= self.s.throughput_tolerance:
                return
            if pairs >= self.s.ab_pairs or self.t.fresh_runs_after_baseline() + 2 > self.s.max_gpu_runs:
                self.verdict = f"{cmp_.text}; no measurable difference after {pairs} A/B pair(s): decided on memory"
                return
            pairs += 1
            rep = pairs
            self._run(
                [
                    TrialRequest("", self.budget, repeat=rep, exclusive=True, purpose="throughput A/B"),
                    TrialRequest(
                        best.conf, self.budget, repeat=rep, exclusive=True, ensure_cap=self._gc(best), purpose="throughput A/B"
                    ),
                ]
            )

    def _summaries(self, default: Candidate, focus: Candidate | None, order: list[Candidate]) -> list[CandidateSummary]:
        out = []
        focus_b = self.brackets.get(focus.conf) if focus is not None else None
        cmp_ = getattr(self, "comparison", None)
        for rank_no, c in enumerate(order, 1):
            est = self.hints.get(c.conf, self.est.get(c.conf))  # the latest simulation (after calibration)
            b = self.brackets.get(c.conf)
            at = self.at_budget.get(c.conf)
            r = rate(self.samples.get(c.conf, []))
            base = dict(
                sim_min_budget=est,
                sim_as_recorded=self.est.get(c.conf),
                sim_optimistic=self._floor(c),
                throughput=r.mean if r else None,
                throughput_noise=r.noise if r else None,
                throughput_samples=r.samples if r else 0,
            )
            if c.conf in self.refused:
                out.append(
                    CandidateSummary(
                        c, feasible=None, note=f"refused: the setting did not take effect ({self.refused[c.conf]})", **base
                    )
                )
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
                    c,
                    feasible=feasible,
                    outcome=(at.outcome if at else ("ok" if b.passed else "oom")),
                    min_budget=b.passed,
                    infeasible_below=b.failed,
                    verified=verified,
                    sim_agrees=None if b.agrees() is None else not self._contradicted(c),
                    wall_s=at.wall_s if at else None,
                    peak_reserved=at.peak_reserved if at else None,
                    peak_allocated=at.peak_allocated if at else None,
                    note=note,
                    **base,
                )
                if c is focus and cmp_ is not None and cmp_.slower:
                    sm = replace(sm, measurably_slower=True, note=f"throughput: {cmp_.text}")
                elif c is focus and self.verdict:  # kept beside what the bracket says (e.g. not proven)
                    sm = replace(sm, note="; ".join(x for x in (note, f"throughput vs the default: {self.verdict}") if x))
                out.append(sm)
                continue
            if at is not None:  # run at the budget only (the default, usually)
                note = f"completes at the budget; min_budget not measured (simulated {_fmt(est)})" if at.passed else None
                if at is self.baseline and self.default_proof:
                    note = f"completes at the budget, shown by the baseline; min_budget not measured (simulated {_fmt(est)})"
                out.append(
                    CandidateSummary(
                        c,
                        feasible=at.passed,
                        outcome=at.outcome,
                        wall_s=at.wall_s,
                        peak_reserved=at.peak_reserved,
                        peak_allocated=at.peak_allocated,
                        note=note,
                        **base,
                    )
                )
                continue
            if c.knob == DEFAULT and self.default_fails:
                why = self.default_fails
            elif est is None or est > self.budget:
                over = est is None or est > self.budget
                why = f"simulated: does not complete under the budget {format_size(self.budget)}" if over else ""
                if est is not None:
                    why += f" (simulated min_budget {format_size(est)})"
            elif focus_b is not None and focus_b.passed is not None:
                why = (
                    f"simulated min_budget {format_size(est)} (rank {rank_no}), not below what "
                    f"{focus.label} was measured to need ({format_size(focus_b.passed)}): not run on the GPU"
                )
            else:
                why = f"simulated min_budget {format_size(est)} (rank {rank_no}): not run on the GPU"
            out.append(CandidateSummary(c, feasible=None, note=why, **base))
        return out


def next_steps(
    recording: str | None, budget: int, need: int, command: tuple[str, ...], training: bool = False
) -> tuple[str, ...]:
    """What can help when no allocator setting fits: see where the memory goes (explain: sites,
    what-ifs, remedies), give the budget the closest setting needs, and, last, the next command: find
    the largest input that fits (plan) or split a service's inputs (guard.chunked)."""
    from alloctune.diagnose.snapshot import shortage_next_steps

    at_least = f"{-(-need // MiB)}MiB"  # rounded up: the closest setting's need
    budget_line = (
        f"or a budget of at least {at_least} (the closest setting's simulated need): alloctune tune --budget {at_least} ..."
    )
    return tuple(
        shortage_next_steps(
            recording or "REC.pickle", budget, " ".join(command) if command else "CMD", before=(budget_line,), training=training
        )
    )


def _fmt(n: int | None) -> str:
    return "-" if n is None else format_size(n)
