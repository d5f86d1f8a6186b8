"""Throughput from the allocator's side: what the simulated driver work can cost, and the flow
that only measures throughput when that work cannot rule a slowdown out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from alloctune.tune.candidates import parse_knobs
from alloctune.tune.strategy import Tuner, TuneSettings
from alloctune.tune.throughput import AllocatorActivity, overhead_bound
from alloctune.tune.executors.base import wall_in_runs
from tune_fakes import COMMAND, GiB, MiB, BatchRecorder, FakeEvaluator, FakeSimulator, split_need

A = AllocatorActivity(device_calls=30, syncs=0, fallbacks=0, completed=True)


def bound(b, run_s=10.0, tol=0.03):
    return overhead_bound(A, b, run_s, call_s=0.002, sync_s=0.02, tolerance=tol)


def test_a_few_more_driver_calls_cannot_slow_a_run_measurably():
    ob = bound(AllocatorActivity(device_calls=80, syncs=1, fallbacks=0, completed=True))
    assert ob.extra_calls == 50 and ob.extra_syncs == 1
    assert ob.seconds == pytest.approx(50 * 0.002 + 0.02) and ob.fraction == pytest.approx(0.012)
    assert ob.rules_out and "not measured" in ob.text


def test_less_allocator_work_is_never_a_slowdown():
    ob = bound(AllocatorActivity(device_calls=10, syncs=0, fallbacks=0, completed=True), run_s=0.01)
    assert ob.extra_calls == 0 and ob.seconds == 0 and ob.rules_out


@pytest.mark.parametrize("act,why", [
    (AllocatorActivity(device_calls=400, syncs=0, fallbacks=0, completed=True), "measured"),
    (AllocatorActivity(device_calls=30, syncs=0, fallbacks=3, completed=True), "only a measurement"),
    (AllocatorActivity(device_calls=30, syncs=0, fallbacks=0, completed=False), "not to complete"),
])
def test_what_the_bound_cannot_rule_out_is_measured(act, why):
    ob = bound(act)
    assert not ob.rules_out and why in ob.text


def test_a_short_run_makes_the_same_calls_matter():
    b = AllocatorActivity(device_calls=80, syncs=0, fallbacks=0, completed=True)
    assert bound(b, run_s=10.0).rules_out and not bound(b, run_s=1.0).rules_out


class Counting(FakeSimulator):
    """An exact simulator that also counts allocator work: `extra` more calls for every non-default setting."""

    def __init__(self, ev, extra=0, span=10.0):
        super().__init__(ev)
        self.extra, self.gpu_span_s, self.asked_activity = extra, span, []

    def activity(self, confs, budget):
        self.asked_activity.append((tuple(confs), budget))
        return {c: AllocatorActivity(30 + (self.extra if c else 0), 0, 0, budget >= self.evaluator.need(c)) for c in confs}


def tune(ev, sim, budget=None, **kw):
    s = TuneSettings(command=COMMAND, budget=budget, knobs=parse_knobs(None), platform="linux", **kw)
    rec = BatchRecorder(ev)
    return Tuner(ev, s, simulator_factory=lambda b: sim, executor=rec).run(), rec.batches


def test_whole_card_budget_and_no_extra_allocator_work_two_side_by_side_runs_prove_the_answer():
    ev = FakeEvaluator(total=8 * GiB)  # the uncapped baseline reserves 3000 MiB: the default fits the card
    res, batches = tune(ev, Counting(ev))
    assert len(ev.calls) - 1 == 2  # just above and just below the estimate; the default is not run again
    assert [(r.conf, r.exclusive) for r in batches[1]] == [("max_split_size_mb:32", False)] * 2
    assert not any(c[0] == "" and c[1] is not None for c in ev.calls)
    assert any("the default completes at the budget: the baseline reserved at most" in n for n in res.notes)
    best = res.ranking.best
    assert best.candidate.conf == "max_split_size_mb:32" and best.verified
    assert "no more allocator driver work than the default" in best.note
    default = next(s for s in res.summaries if s.candidate.conf == "")
    assert default.feasible and "shown by the baseline" in default.note


def test_when_the_setting_adds_driver_work_that_could_matter_throughput_is_measured_alone():
    ev = FakeEvaluator(total=8 * GiB)
    res, batches = tune(ev, Counting(ev, extra=4000, span=10.0))  # 4000 calls ≥ 0.4 s of a 10 s run
    opening = batches[1]
    assert ("", 8 * GiB, True) in [(r.conf, r.budget, r.exclusive) for r in opening]  # the default's sample
    assert [r.exclusive for r in opening] == sorted(r.exclusive for r in opening)  # side by side ones first
    top = max((r for r in opening if r.conf == "max_split_size_mb:32"), key=lambda r: r.budget)
    assert top.exclusive
    best = res.ranking.best
    assert best.throughput is not None and "4000 more" not in (best.note or "")


def test_throughput_measure_forces_samples_even_without_extra_work():
    ev = FakeEvaluator(total=8 * GiB)
    res, batches = tune(ev, Counting(ev), throughput_check="measure")
    assert ("", 8 * GiB, True) in [(r.conf, r.budget, r.exclusive) for r in batches[1]]


def test_a_default_that_reserved_more_than_the_budget_is_not_shown_to_fit_by_the_baseline():
    # the default needs 3000 MiB (its replay of its own recording says so): not run at 2600
    ev = FakeEvaluator(total=8 * GiB)
    res, batches = tune(ev, Counting(ev), budget=2600 * MiB)
    assert "" not in [r.conf for r in batches[1]]
    assert not any("shown by the baseline" in (s.note or "") for s in res.summaries)
    assert any("replaying its own recording needs" in n for n in res.notes)
    assert res.ranking.best.candidate.conf == "max_split_size_mb:32"
    assert res.ranking.best.min_budget >= split_need(32)


def test_when_the_default_fails_at_the_budget_nothing_needs_the_gpu_alone_and_that_is_said():
    # the default needs 3000 MiB (replaying its own recording) of 2600: it has no rate at this budget.
    # max_split_size_mb:32 adds driver work that could cost 4 % of the run, which would have put its
    # likely pass alone on the GPU (one run after the other: 3 runs of wall time after the baseline's 1)
    ev = FakeEvaluator(total=8 * GiB)
    res, batches = tune(ev, Counting(ev, extra=4000, span=10.0), budget=2600 * MiB)
    assert len(ev.calls) == 3 and len(batches) == 2  # the recording, then one batch of two
    assert [(r.conf, r.exclusive) for r in batches[1]] == [("max_split_size_mb:32", False)] * 2
    assert wall_in_runs(batches) == 2
    best = res.ranking.best
    assert best.candidate.conf == "max_split_size_mb:32" and best.verified
    assert best.throughput is None and best.throughput_samples == 0  # a side by side run is no sample
    note = next(n for n in res.notes if n.startswith("throughput of max_split_size_mb:32"))
    assert "not compared: the default does not complete at 2.54 GiB" in note
    assert "its rate was not measured (--throughput measure samples it alone)" in note
    # what the simulation says instead: the work it adds over the default with the whole card
    assert "4000 more cudaMalloc/cudaFree" in note and "than the default with the whole card" in note
    assert "more than the tolerance" in note and ": measured" not in note
    assert "not compared" in best.note


def test_when_the_default_fails_a_forced_measure_still_samples_the_best_alone():
    ev = FakeEvaluator(total=8 * GiB)
    res, batches = tune(ev, Counting(ev), budget=2600 * MiB, throughput_check="measure")
    assert len(ev.calls) == 3  # no run of the default: it has no rate at the budget either way
    opening = batches[1]
    assert [r.exclusive for r in opening] == [False, True]  # the side by side one first, then the pass alone
    assert max(opening, key=lambda r: r.budget).exclusive
    assert wall_in_runs(batches) == 3
    best = res.ranking.best
    assert best.throughput_samples == 1 and best.throughput == 100.0
    note = next(n for n in res.notes if n.startswith("throughput of max_split_size_mb:32"))
    assert "not compared" in note and "max_split_size_mb:32 alone on the GPU: 100 items/s (1 sample)" in note
    assert "no more allocator driver work than the default with the whole card" in note

    class Silent(FakeEvaluator):  # a workload that prints no rate: a run alone is still no sample
        def __call__(self, conf, budget, **kw):
            return replace(super().__call__(conf, budget, **kw), throughput=None)

    ev2 = Silent(total=8 * GiB)
    res2, _ = tune(ev2, Counting(ev2), budget=2600 * MiB, throughput_check="measure")
    assert res2.ranking.best.throughput_samples == 0
    assert any("ran alone on the GPU, but the workload reported no throughput" in n for n in res2.notes)


class Cached(FakeEvaluator):
    """The uncapped baseline reserves more than the program needs (the cache keeps what it freed)."""

    def __call__(self, conf, budget, **kw):
        res = super().__call__(conf, budget, **kw)
        return res if budget is not None else replace(res, peak_reserved=res.peak_reserved + 200 * MiB)


def test_a_default_in_doubt_runs_side_by_side_first_and_samples_follow_only_if_it_completes():
    # the default is simulated to need 3000 MiB of 2960 (within the tolerance: run it); the best's
    # driver work could matter. It fails: no sample alone is made, one batch of three side by side
    ev = FakeEvaluator(total=8 * GiB)
    res, batches = tune(ev, Counting(ev, extra=4000), budget=2960 * MiB)
    assert [(r.conf, r.exclusive) for r in batches[1]] == [("max_split_size_mb:32", False)] * 2 + [("", False)]
    assert len(batches) == 2 and wall_in_runs(batches) == 2
    assert any("throughput is sampled alone on the GPU only if it completes" in n for n in res.notes)
    assert "not compared: the default's run at 2.89 GiB did not complete (oom)" in res.ranking.best.note
    # it completes (2950 MiB; the baseline reserved 3150, so that did not show it): the samples alone follow,
    # the same wall time as sampling in the opening (3 runs: the pair side by side, then each sample alone)
    ev2 = Cached({**ev.needs, "": 2950 * MiB}, total=8 * GiB)
    res2, batches2 = tune(ev2, Counting(ev2, extra=4000), budget=2960 * MiB)
    assert not any(r.exclusive for r in batches2[1]) and len(batches2[1]) == 3
    assert sorted((r.conf, r.budget, r.exclusive) for r in batches2[2]) == [
        ("", 2960 * MiB, True), ("max_split_size_mb:32", 2960 * MiB, True)]
    assert wall_in_runs(batches2) == 1 + 1 + 2
    best = res2.ranking.best
    assert best.throughput_samples >= 1 and "not compared" not in (best.note or "")


def test_a_default_simulated_within_the_tolerance_of_the_budget_still_runs_there():
    # a thin margin (3000 MiB needed, 2960 given: under 2 %) is not trusted to the simulation
    ev = FakeEvaluator(total=8 * GiB)
    res, batches = tune(ev, Counting(ev), budget=2960 * MiB)
    assert ("", 2960 * MiB, False) in [(r.conf, r.budget, r.exclusive) for r in batches[1]]
    assert not any("replaying its own recording needs" in n for n in res.notes)


def test_unknown_throughput_check_is_an_input_error():
    from alloctune.errors import InputError

    with pytest.raises(InputError, match="--throughput 'sometimes'"):
        TuneSettings(command=COMMAND, throughput_check="sometimes")


def test_two_samples_a_side_need_a_t_quantile_not_a_normal_one():
    from alloctune.tune.throughput import compare, t95

    # rvc on the H200 (batch 15): 2 + 2 samples, a 7.7 % gap with ±3.4 % standard error looked
    # "clear of the noise" at z = 2; with df ≈ 2 the 95 % quantile is 4.3 and it is not
    a, b = [0.60, 0.56], [0.55, 0.53]
    assert compare(a, b).slower is None
    assert compare(a * 4, b * 4).slower is True  # the same spread with 8 samples a side is a real difference
    assert t95(2) == 4.30 and t95(2.9) == 4.30 and t95(11) == 2.23 and t95(1000) == 1.96


def test_a_job_of_ranks_is_as_slow_as_its_slowest_rank():
    # rank 0 adds nothing, rank 1 adds enough driver work to matter: throughput is measured
    ev = FakeEvaluator(total=8 * GiB)

    class Ranked(FakeSimulator):
        def __init__(self, ev):
            super().__init__(ev)
            self.ranks = {0: Counting(ev, extra=0), 1: Counting(ev, extra=4000)}

    res, batches = tune(ev, Ranked(ev))
    assert ("", 8 * GiB, True) in [(r.conf, r.budget, r.exclusive) for r in batches[1]]
    assert any("throughput of max_split_size_mb:32: 4000 more" in n for n in res.notes)
    ev2 = FakeEvaluator(total=8 * GiB)

    class Quiet(FakeSimulator):
        def __init__(self, ev):
            super().__init__(ev)
            self.ranks = {0: Counting(ev), 1: Counting(ev)}

    res2, batches2 = tune(ev2, Quiet(ev2))
    assert not any(r.exclusive for r in batches2[1]) and len(ev2.calls) - 1 == 2


def test_confirm_runs_side_by_side_by_default_when_nvml_reads_free_memory(tmp_path, monkeypatch):
    from alloctune.tune.executors import gpuinfo
    from alloctune.tune.executors.local import LocalExecutor
    from alloctune.tune.session import CONFIRM_JOBS, prepare

    from alloctune.tune.executors import local

    h200 = [gpuinfo.GpuInfo("0", "H200", 140 * GiB, 139 * GiB)]
    monkeypatch.setattr(gpuinfo, "probe", lambda env=None: h200)
    asked = []  # the executor is handed the free memory read once, not made to read it again
    monkeypatch.setattr(local, "probe", lambda env=None: asked.append(1) or h200)
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    session = prepare(["python3", "-c", "pass"], store=tmp_path / "s.jsonl")
    ex = session.tuner.executor
    assert isinstance(ex, LocalExecutor) and ex.jobs == CONFIRM_JOBS
    assert ex.memory == local.usable_memory(139 * GiB) and not asked
    # every rank of a torchrun job holds the cap: once the baseline shows 2 processes, trials are booked at two caps
    from alloctune.run.trial import TrialResult

    session.tuner._book_ranks(TrialResult(COMMAND, "", None, "ok", 0, 1.0, processes=2))
    assert ex.processes == 2
    monkeypatch.setattr(gpuinfo, "probe", lambda env=None: [])  # no NVML, no GPU: one run after another
    assert not isinstance(prepare(["python3", "-c", "pass"], store=tmp_path / "t.jsonl").tuner.executor, LocalExecutor)
    # the exhaustive strategy keeps its serial default
    monkeypatch.setattr(gpuinfo, "probe", lambda env=None: h200)
    old = prepare(["python3", "-c", "pass"], store=tmp_path / "u.jsonl", strategy="exhaustive")
    assert not isinstance(old.tuner.executor, LocalExecutor)
