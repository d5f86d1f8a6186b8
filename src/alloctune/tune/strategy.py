"""The sweep: which trials to run, in what order, and when to stop.

Pure logic over an `Executor` of trials (allocator string + budget → `TrialResult`): on the
GPU the runner, in tests a fake. The default strategy, `confirm`, lets the simulator decide
and the GPU confirm (`tune.confirm`). The exhaustive strategy (`--strategy exhaustive`, or
`grid` to test every `max_split_size_mb` value) measures everything on the GPU:

1. **Baseline**: the default setting, no budget, allocator history recorded. It gives the
   card's size, the workload's peak allocated bytes (no budget below it can work: the lower
   bisection bound) and the sizes of the segments it made (the `max_split_size_mb` range).
2. **Feasibility at the user's budget** for every candidate. For `max_split_size_mb` the
   manual recipe — start high, lower while it fails, keep the largest value that passes —
   done by bisection over the workload's own segment sizes (`--strategy grid`: every value).
3. **min_budget** of every feasible candidate by bisection between the peak allocated bytes
   (assumed to fail) and the user's budget (known to pass), to 1 % or 16 MiB, on 2 MiB steps
   (segments are 2 MiB multiples, so caps inside one step behave alike).
4. **Rank** (`objective.rank`).

`--simulate-first` replaces 2–3: the simulator ranks every candidate from the baseline's
trace, and only the top three are run, starting in a narrow bracket (± 2 %) around the
simulated `min_budget`; a pass at its upper end also settles feasibility at the budget
(a smaller cap), so an accurate simulator needs about three GPU trials per candidate.

A trial that crashes for a reason other than memory stops the sweep (`TrialCrashed`); a
timeout counts as "does not complete".
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

from alloctune.errors import InputError, WorkloadFailed
from alloctune.run.trial import TrialRequest, TrialResult, raise_for_environment
from alloctune.tune.candidates import (
    GC,
    MAX_SPLIT,
    Candidate,
    SplitGrid,
    fixed_candidates,
    make,
    split_grid,
)
from alloctune.tune.executors.base import Executor, SerialExecutor
from alloctune.tune.executors.stored import request_key
from alloctune.tune.model import (  # noqa: F401 (TuneSettings.. re-exported: the sweep's public face)
    ALIGN,
    Evaluator,
    Simulator,
    TrialCrashed,
    TrialRecord,
    TuneResult,
    TuneSettings,
    align_down,
    align_up,
)
from alloctune.tune.objective import CandidateSummary, rank
from alloctune.tune.platform import filter_candidates, is_async_backend
from alloctune.tune.store import TrialStore
from alloctune.units import format_size


class Tuner:
    """Runs one sweep. `trials` holds every trial so far, also after an error or Ctrl-C."""

    def __init__(
        self,
        evaluator: Evaluator,
        settings: TuneSettings,
        *,
        store: TrialStore | None = None,
        simulator_factory: Callable[[TrialResult], Simulator] | None = None,
        on_trial_start: Callable[[str, int | None, str], None] | None = None,
        on_trial_end: Callable[[TrialRecord], None] | None = None,
        executor: Executor | None = None,
    ):
        self.evaluator = evaluator
        self.executor = executor if executor is not None else SerialExecutor(evaluator)
        self.settings = settings
        self.store = store
        self.simulator_factory = simulator_factory
        self.on_trial_start = on_trial_start
        self.on_trial_end = on_trial_end
        self.trials: list[TrialRecord] = []
        self.notes: list[str] = []
        self.started = time.monotonic()  # `run` sets it again: trials' `ended_at_s` count from there

    # ---- trials ------------------------------------------------------------------------------
    def _trial(self, conf: str, budget: int | None, purpose: str, *, repeat: int = 0, record: bool = False) -> TrialResult:
        req = TrialRequest(conf, budget, repeat=repeat, record=record, ensure_cap=f"{GC}:" in conf, purpose=purpose)
        return self.batch([req])[0]

    def batch(self, requests: Sequence[TrialRequest]) -> list[TrialResult]:
        """Run independent trials (through the executor, so possibly side by side); results in
        request order. Trials already in the store are reused; every fresh one is stored as
        soon as it finishes, so an interruption loses nothing."""
        found: dict[int, TrialResult] = {}
        todo: list[tuple[int, TrialRequest]] = []
        keys = [request_key(self.settings.command, r) for r in requests]
        for k, (req, key) in enumerate(zip(requests, keys)):
            hit = self.store.get(key) if self.store is not None else None
            if hit is not None and req.record and (not hit.snapshot or not Path(hit.snapshot).exists()):
                hit = None  # the recorded trace is gone: record it again
            if hit is not None:
                found[k] = hit
            else:
                todo.append((k, req))
        for k, req in enumerate(requests):
            if k in found:
                self._done(req, found[k], reused=True)
        if todo:
            index = {id(req): k for k, req in todo}
            for req in (r for _, r in todo):
                if self.on_trial_start:
                    self.on_trial_start(req.conf, req.budget, req.purpose)
            for req, result in self.executor.run([r for _, r in todo]):
                k = index[id(req)]
                if self.store is not None:
                    self.store.append(keys[k], result)
                found[k] = result
                self._done(req, result, reused=False)
        out = [found[k] for k in range(len(requests))]
        for req, r in zip(requests, out):
            if req.remedy:  # a remedy's confirming run: a program that needs autograd may fail, the sweep goes on
                raise_for_environment(r)
            else:
                self._check(r)
        return out

    def _done(self, req: TrialRequest, result: TrialResult, *, reused: bool) -> None:
        ended = None if reused else round(time.monotonic() - self.started, 3)
        rec = TrialRecord(result, req.purpose, reused=reused, ended_at_s=ended)
        self.trials.append(rec)
        if self.on_trial_end:
            self.on_trial_end(rec)

    def fresh_runs_after_baseline(self) -> int:
        """GPU runs made after the baseline (store hits do not count)."""
        return sum(1 for t in self.trials[1:] if not t.reused)

    def _check(self, result: TrialResult) -> None:
        raise_for_environment(result)
        if result.outcome == "crash":
            where = f"; output in {result.log}" if result.log else ""
            raise TrialCrashed(
                f"trial {result.conf or '(default)'} at {_fmt_budget(result.budget)} crashed, not for lack of memory: "
                f"{result.error or 'exit code ' + str(result.exit_code)}{where}"
            )

    def _point(self, conf: str, budget: int, purpose: str) -> tuple[bool, TrialResult]:
        """All repeats at one (setting, budget); stops at the first failure."""
        last = None
        for r in range(self.settings.repeat):
            last = self._trial(conf, budget, purpose, repeat=r)
            if not last.passed:
                return False, last
        return True, last

    # ---- the sweep ---------------------------------------------------------------------------
    def run(self) -> TuneResult:
        """The sweep; under the confirm flow the runs after the recording start beside it where the
        executor can (`run.warm`: held at their first CUDA call until the simulation has chosen them)."""
        self.started = time.monotonic()
        ahead = self.settings.strategy == "confirm"
        if ahead:
            start = getattr(self.executor, "start_ahead", None)
            if callable(start):
                start()
        try:
            return self._run()
        finally:
            self._close_ahead()

    def _close_ahead(self) -> None:
        """End the held processes no trial took; say why runs were not started ahead, where they were not."""
        close = getattr(self.executor, "close_ahead", None)
        note = close() if self.settings.strategy == "confirm" and callable(close) else None
        if isinstance(note, str) and note not in self.notes:
            self.notes.append(note)

    def _run(self) -> TuneResult:
        s = self.settings
        baseline = self._trial("", None, "baseline: default, no budget, recorded", record=True)
        if baseline.outcome == "timeout":
            raise WorkloadFailed("the baseline trial (default setting, no budget) hit the timeout: raise --timeout")
        total = baseline.total_memory
        budget = s.budget if s.budget is not None else total
        if budget is None:
            raise WorkloadFailed("the baseline trial reported no device memory size: give --budget")
        if total is not None and budget > total:
            raise InputError(
                f"budget {format_size(budget)} is larger than the card ({format_size(total)}"
                f"{', ' + baseline.device_name if baseline.device_name else ''}): give a smaller --budget"
            )
        if baseline.outcome == "oom":
            self.notes.append("the default setting runs out of memory even without a budget")
        self._book_ranks(baseline)
        lo_bound = align_down(baseline.peak_allocated) - ALIGN if baseline.peak_allocated else 0
        lo_bound = max(0, lo_bound)
        grid = split_grid(baseline.segment_sizes, max_points=s.max_split_points)
        auto_split = MAX_SPLIT in s.knobs and not s.knobs[MAX_SPLIT]
        if auto_split and not grid.values_mb:
            self.notes.append(
                "max_split_size_mb skipped: the baseline made no segment of 32 MiB or more"
                if grid.largest_segment
                else "max_split_size_mb skipped: the baseline recorded no segment sizes"
            )
        fixed = fixed_candidates(s.knobs)
        async_backend = is_async_backend(baseline.allocator_settings)
        fixed, platform_notes = filter_candidates(fixed, s.platform, async_backend=async_backend)
        self.notes.extend(platform_notes)
        if async_backend:
            auto_split = False
        shortfall = flow = None
        if s.strategy == "confirm":
            from alloctune.tune.confirm import ConfirmFlow, SimulationUnavailable

            cands = list(fixed)
            if auto_split:
                cands += [make(MAX_SPLIT, str(v)) for v in grid.values_mb]
            try:
                flow = ConfirmFlow(self, baseline, cands, budget)
                summaries = flow.run()
                shortfall = flow.shortfall
            except SimulationUnavailable as exc:
                self.notes.append(
                    f"the simulator could not use the baseline's recording ({exc}): every candidate "
                    "was measured on the GPU instead (the exhaustive strategy)"
                )
                summaries = self._measure(fixed, grid if auto_split else None, budget, lo_bound)
        elif s.simulate_first:
            summaries = self._simulate_then_verify(baseline, fixed, grid if auto_split else None, budget, lo_bound)
        else:
            summaries = self._measure(fixed, grid if auto_split else None, budget, lo_bound)
        if auto_split and grid.noop_from_mb is not None:
            summaries.append(
                CandidateSummary(
                    # not validated on purpose: below torch's minimum (20) every valid value is a no-op
                    Candidate(f"{MAX_SPLIT}:{grid.noop_from_mb}", MAX_SPLIT, str(grid.noop_from_mb)),
                    feasible=None,
                    note=(
                        f"no-op: max_split_size_mb ≥ {grid.noop_from_mb} is above every segment the run made "
                        f"(largest {format_size(grid.largest_segment or 0)}), so it behaves exactly like the default; not tested"
                    ),
                )
            )
        counts: dict[str, int] = {}
        for t in self.trials[1:]:
            remedy_run = t.result.no_grad or t.result.cudnn_benchmark_set is not None or t.result.checkpointing is not None
            if not remedy_run:  # a remedy's confirming run is no trial of its setting
                counts[t.result.conf or ""] = counts.get(t.result.conf or "", 0) + 1
        summaries = [_replace(sm, trials=counts.get(sm.candidate.conf, 0)) for sm in summaries]
        ranking = rank(summaries, budget, throughput_tolerance=s.throughput_tolerance, noise_rule=s.strategy == "confirm")
        report = None
        if flow is not None and flow.sim is not None and s.remedies:
            report, shortfall = self._remedies(flow, ranking, summaries, shortfall)
        self._close_ahead()
        return TuneResult(
            s,
            budget,
            total,
            baseline,
            grid,
            tuple(summaries),
            ranking,
            tuple(self.trials),
            tuple(self.notes),
            shortfall=shortfall,
            remedies=report,
        )

    def _remedies(self, flow: Any, ranking: Any, summaries: list[CandidateSummary], shortfall: Any) -> tuple[Any, Any]:
        """The remedies beside the best setting (or, where none fits, the closest), and the shortfall
        with the remedies that would fit first in its next steps."""
        from alloctune.remedy.measured import checkpointing_measured, cudnn_remedy, no_grad_remedy
        from alloctune.tune.remedies import shortfall_with_remedies, tune_remedies

        best = ranking.best
        conf = best.candidate.conf if best is not None else shortfall.conf if shortfall is not None else ""
        command = " ".join(self.settings.command)
        ng = None
        if flow.no_grad is not None:  # against the same simulator's need of the recording with autograd on
            ng_conf, trial = flow.no_grad
            ng = no_grad_remedy(trial, ng_conf, flow.est.get(ng_conf), self.simulator_factory, command)
        measured = []
        if flow.cudnn is not None:  # the cuDNN switch, run the other way than the recording
            cd_conf, trial = flow.cudnn
            measured.append(cudnn_remedy(trial, cd_conf, flow.est.get(cd_conf), self.simulator_factory, command))
        if flow.checkpointing is not None:  # activation checkpointing, switched on by the agent
            from alloctune.remedy.training import checkpointing_code
            from alloctune.tune.remedies import _trace

            ck_conf, trial = flow.checkpointing
            trace = _trace(flow.sim, flow.baseline)  # the recording the simulator holds, else loaded
            code = checkpointing_code(trace) if trace is not None else "model.gradient_checkpointing_enable()"
            measured.append(checkpointing_measured(trial, ck_conf, flow.est.get(ck_conf), self.simulator_factory, command, code))
        # simulated beside the GPU runs, unless a capped run taught fallbacks since (then again, with them)
        early = flow.early_remedies() if not flow.calibrated else None
        report = tune_remedies(flow.sim, flow.baseline, conf, summaries, ng, command, early=early, measured=measured)
        self.notes.extend(report.notes)
        if ng is not None:
            self.notes.append(f"inference ran with autograd on and no backward: {ng.notes[0]}; the line to add: {ng.how_to}")
        if shortfall is not None:
            shortfall = shortfall_with_remedies(shortfall, report)
        return report, shortfall

    def _book_ranks(self, baseline: TrialResult) -> None:
        """A job of several processes on this one GPU (torchrun): each holds the cap, so trials
        side by side are booked at that many caps (known only once the baseline ran)."""
        from alloctune.tune.executors.local import LocalExecutor

        procs = baseline.processes or 1
        if isinstance(self.executor, LocalExecutor) and procs > self.executor.processes:
            self.executor.processes = procs

    def _feasible(self, c: Candidate, budget: int) -> CandidateSummary:
        ok, res = self._point(c.conf, budget, "feasibility at the budget")
        return _summary(c, ok, res)

    def _measure(self, fixed: list[Candidate], grid: SplitGrid | None, budget: int, lo_bound: int) -> list[CandidateSummary]:
        summaries = [self._feasible(c, budget) for c in fixed]
        if grid is not None and grid.values_mb:
            if self.settings.strategy == "grid":
                summaries += [self._feasible(make(MAX_SPLIT, str(v)), budget) for v in grid.values_mb]
            else:
                summaries += self._split_bisection(grid, budget)
        out = []
        for sm in summaries:
            if sm.feasible and sm.min_budget is None and sm.note is None:
                hi, lo, n = self._min_budget(sm.candidate, budget, lo_bound)
                sm = _replace(sm, min_budget=hi, infeasible_below=lo)
            out.append(sm)
        return out

    def _split_bisection(self, grid: SplitGrid, budget: int) -> list[CandidateSummary]:
        """Largest max_split_size_mb of the grid that completes at the budget, by bisection.

        Assumes smaller values help more (they keep big cached blocks whole and releasable);
        values outside the tested ones are not claimed either way.
        """
        vals = grid.values_mb
        tested: dict[int, CandidateSummary] = {}

        def test(i: int) -> bool:
            tested[vals[i]] = self._feasible(make(MAX_SPLIT, str(vals[i])), budget)
            return bool(tested[vals[i]].feasible)

        hi = len(vals) - 1
        best = None
        if test(hi):
            best = hi
        elif hi > 0 and test(0):
            lo = 0
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if test(mid):
                    lo = mid
                else:
                    hi = mid
            best = lo
        out = []
        for v, sm in sorted(tested.items()):
            if best is not None and sm.feasible and v != vals[best]:
                sm = _replace(sm, note=f"completes, but the larger max_split_size_mb:{vals[best]} does too (kept the largest)")
            out.append(sm)
        return out

    def _min_budget(self, c: Candidate, hi: int, lo: int, *, first: Sequence[int] = ()) -> tuple[int, int, int]:
        """Bisection: `hi` completes, `lo` is assumed to fail. Returns (hi, lo, trials).

        `first`: budgets to try before halving (the bracket around a simulated estimate).
        The assumed `lo` (the baseline's peak allocated) is a true bound only if the
        workload allocates the same under every setting; one that adapts (cuDNN picking a
        smaller workspace after an OOM) can complete below it. So when every tried budget
        passed, `lo` itself is tried, and the bracket moves down (halving) until a budget
        fails: the reported bracket is always a tested pass and a tested failure (or 0).
        """
        n = 0
        purpose = "min_budget bisection"
        lo_seen = False
        if lo >= hi:  # the workload allocated more without a budget than this candidate is given
            lo = align_down(hi // 2)

        def probe(budget: int) -> bool:
            nonlocal n
            n += 1
            return self._point(c.conf, budget, purpose)[0]

        for b in first:
            if lo < b < hi:
                if probe(b):
                    hi = b
                else:
                    lo, lo_seen = b, True
        while True:
            while hi - lo > max(self.settings.abs_tol, int(self.settings.rel_tol * hi)):
                mid = align_down((lo + hi) // 2)
                if mid <= lo:
                    mid = lo + ALIGN
                if mid >= hi:
                    break
                if probe(mid):
                    hi = mid
                else:
                    lo, lo_seen = mid, True
            if lo_seen or lo <= 0:
                return hi, lo, n
            if probe(lo):  # the assumed lower bound completes: look further down
                hi, lo = lo, align_down(lo // 2)
            else:
                lo_seen = True

    def _simulate_then_verify(
        self,
        baseline: TrialResult,
        fixed: list[Candidate],
        grid: SplitGrid | None,
        budget: int,
        lo_bound: int,
    ) -> list[CandidateSummary]:
        if self.simulator_factory is None or not baseline.snapshot:
            raise WorkloadFailed("--simulate-first needs the baseline's recorded trace, and none was written")
        sim = self.simulator_factory(baseline)
        cands = list(fixed)
        if grid is not None:
            cands += [make(MAX_SPLIT, str(v)) for v in grid.values_mb]
        estimates = dict(sim.estimates([c.conf for c in cands]))
        order = sorted(
            cands, key=lambda c: (estimates[c.conf] is None or estimates[c.conf] > budget, estimates[c.conf] or 0, c.conf)
        )
        out = []
        verified = 0
        any_ok = False
        for rank_no, c in enumerate(order, 1):
            est = estimates[c.conf]
            # The top N; past them only while nothing has passed yet and the simulator still
            # expects the candidate to fit (a simulator that is off must not end the sweep empty).
            wanted = verified < self.settings.verify_top or (not any_ok and est is not None and est <= budget)
            if not wanted:
                out.append(
                    CandidateSummary(
                        c,
                        feasible=None,
                        sim_min_budget=est,
                        note=f"simulator rank {rank_no} (min_budget {_fmt_budget(est)}): not run on the GPU",
                    )
                )
                continue
            # Start at the estimate (+margin): a pass there is also a pass at the budget (a
            # smaller cap), so the separate feasibility trial is needed only when it fails.
            hi0 = budget if est is None else min(budget, align_up(int(est * (1 + self.settings.sim_margin))))
            lo = lo_bound
            ok, res = self._point(c.conf, hi0, "verify near the simulated min_budget")
            if not ok and hi0 < budget:
                lo = hi0
                ok, res = self._point(c.conf, budget, "feasibility at the budget")
                hi0 = budget
            sm = _summary(c, ok, res, sim_min_budget=est)
            verified += 1
            any_ok = any_ok or ok
            if ok:
                first = [] if est is None else [max(lo_bound, align_down(int(est * (1 - self.settings.sim_margin))))]
                hi, lo, _ = self._min_budget(c, hi0, lo, first=first)
                sm = _replace(sm, min_budget=hi, infeasible_below=lo)
            out.append(sm)
        return out


def _replace(sm: CandidateSummary, **kw: Any) -> CandidateSummary:
    from dataclasses import replace

    return replace(sm, **kw)


def _fmt_budget(budget: int | None) -> str:
    return "no budget" if budget is None else format_size(budget)


def _summary(c: Candidate, ok: bool, res: Any, **extra: Any) -> CandidateSummary:
    """A candidate's summary from the trial at its budget (outcome, throughput, peaks)."""
    return CandidateSummary(
        c,
        feasible=ok,
        outcome=res.outcome,
        throughput=res.throughput,
        wall_s=res.wall_s,
        peak_reserved=res.peak_reserved,
        peak_allocated=res.peak_allocated,
        **extra,
    )
