"""The sweep's logic against a fake workload whose memory needs are known exactly."""

from __future__ import annotations

import math

import pytest

from alloctune.errors import InputError
from alloctune.tune.candidates import parse_knobs
from alloctune.tune.recommend import recommend
from alloctune.tune.strategy import ALIGN, TrialCrashed, Tuner, TuneSettings
from tune_fakes import COMMAND, GiB, MiB, FakeEvaluator, FakeSimulator, split_need

BUDGET = 2600 * MiB


def settings(**kw):
    kw.setdefault("budget", BUDGET)
    kw.setdefault("knobs", parse_knobs(None))
    kw.setdefault("strategy", "exhaustive")
    kw.setdefault("platform", "linux")
    return TuneSettings(command=COMMAND, **kw)


def by_conf(result):
    return {s.candidate.conf: s for s in result.summaries}


def test_auto_finds_expandable_and_explains_the_rest():
    ev = FakeEvaluator()
    result = Tuner(ev, settings()).run()
    s = by_conf(result)
    # baseline first: default, no budget, recorded
    assert ev.calls[0] == ("", None, 0, True, False)
    assert s[""].feasible is False and s[""].outcome == "oom"
    assert s["roundup_power2_divisions:4"].feasible is False
    best = result.ranking.best
    assert best.candidate.conf == "expandable_segments:True"
    # min_budget bisection: brackets the true need, within 1 % / 16 MiB, on 2 MiB steps
    need = 2100 * MiB
    assert best.infeasible_below < need <= best.min_budget
    assert best.min_budget - best.infeasible_below <= max(16 * MiB, int(0.01 * best.min_budget))
    assert best.min_budget % ALIGN == 0
    # GC has the lowest min_budget but is 10 % slower: it loses on the throughput guard
    gc = s["garbage_collection_threshold:0.6"]
    assert gc.feasible and gc.min_budget < best.min_budget
    assert "10.0 % below the best" in result.ranking.reasons["garbage_collection_threshold:0.6"]
    assert "does not complete at the budget" in result.ranking.reasons[""]
    rec = recommend(result)
    assert rec.conf == "expandable_segments:True"
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in rec.lines["bash"]
    assert "the default does not complete there" in rec.summary


def test_gc_trials_ask_for_an_active_cap():
    ev = FakeEvaluator()
    Tuner(ev, settings()).run()
    gc_calls = [c for c in ev.calls if c[0].startswith("garbage_collection_threshold")]
    assert gc_calls and all(c[4] for c in gc_calls)
    assert not any(c[4] for c in ev.calls if not c[0].startswith("garbage_collection_threshold"))


def test_max_split_bisection_keeps_largest_passing_value_and_skips_noop():
    ev = FakeEvaluator()
    result = Tuner(ev, settings(knobs=parse_knobs(["max_split"]))).run()
    # powers of two from 32 MiB up to the largest segment (1024 MiB); 1025+ is a no-op
    assert result.grid.values_mb == (32, 64, 128, 256, 512, 1024)
    assert result.grid.noop_from_mb == 1025
    split_at_budget = [c[0] for c in ev.calls if c[0].startswith("max_split") and c[1] == BUDGET]
    # start high (fails), lowest (passes), then halve: 128 passes, 256 passes, 512 fails → 256
    assert split_at_budget == [
        "max_split_size_mb:1024",
        "max_split_size_mb:32",
        "max_split_size_mb:128",
        "max_split_size_mb:256",
        "max_split_size_mb:512",
    ]
    assert len(split_at_budget) <= 2 + math.ceil(math.log2(len(result.grid.values_mb) - 1))
    s = by_conf(result)
    assert s["max_split_size_mb:256"].min_budget >= split_need(256)
    assert s["max_split_size_mb:128"].min_budget is None and "kept the largest" in s["max_split_size_mb:128"].note
    assert s["max_split_size_mb:512"].feasible is False
    noop = s["max_split_size_mb:1025"]
    assert noop.feasible is None and "no-op" in noop.note and noop.trials == 0
    assert not any(c[0] == "max_split_size_mb:1025" for c in ev.calls)
    assert result.ranking.best.candidate.conf == "max_split_size_mb:256"


def test_bisection_bounds_start_at_peak_allocated_and_the_budget():
    ev = FakeEvaluator()
    result = Tuner(ev, settings(knobs=parse_knobs(["expandable"]))).run()
    budgets = [c[1] for c in ev.calls if c[0] == "expandable_segments:True"]
    assert budgets[0] == BUDGET
    lo, hi = 1900 * MiB - ALIGN, BUDGET  # baseline peak allocated (aligned, minus one step) and the budget
    assert budgets[1] == ((lo + hi) // 2 // ALIGN) * ALIGN
    assert all(lo < b < hi for b in budgets[1:])
    assert len(budgets) - 1 <= math.ceil(math.log2((hi - lo) / (16 * MiB)))
    assert result.ranking.best.min_budget == min(b for b in budgets if b >= 2100 * MiB)


def test_grid_tests_every_value_and_simulate_first_needs_fewer_trials():
    auto_ev, grid_ev, sim_ev = FakeEvaluator(), FakeEvaluator(), FakeEvaluator()
    auto = Tuner(auto_ev, settings()).run()
    grid = Tuner(grid_ev, settings(strategy="grid")).run()
    sim = Tuner(sim_ev, settings(simulate_first=True), simulator_factory=lambda b: FakeSimulator(sim_ev)).run()
    grid_split = {c[0] for c in grid_ev.calls if c[0].startswith("max_split") and c[1] == BUDGET}
    assert grid_split == {f"max_split_size_mb:{v}" for v in (32, 64, 128, 256, 512, 1024)}
    # the grid's best is the smallest split value; simulate-first verifies only the top three
    assert grid.ranking.best.candidate.conf == "max_split_size_mb:32"
    assert sim.ranking.best.candidate.conf == "max_split_size_mb:32"
    assert abs(sim.ranking.best.min_budget - grid.ranking.best.min_budget) <= 16 * MiB
    verified = {c[0] for c in sim_ev.calls[1:]}
    assert len(verified) == 3
    assert len(sim_ev.calls) < len(auto_ev.calls) < len(grid_ev.calls)
    not_run = [s for s in sim.summaries if s.feasible is None and s.sim_min_budget is not None]
    assert not_run and all("not run on the GPU" in s.note for s in not_run)


def test_simulate_first_recovers_from_a_wrong_estimate():
    ev = FakeEvaluator()
    # the simulator is 300 MiB optimistic: the bracket must widen, not return a failing budget
    res = Tuner(ev, settings(knobs=parse_knobs(["expandable"]), simulate_first=True),
                simulator_factory=lambda b: FakeSimulator(ev, error=-300 * MiB)).run()
    best = res.ranking.best
    assert best.candidate.conf == "expandable_segments:True"
    assert best.infeasible_below < 2100 * MiB <= best.min_budget


def test_repeat_runs_each_point_n_times_and_stops_at_first_failure():
    ev = FakeEvaluator()
    Tuner(ev, settings(knobs=parse_knobs(["expandable"]), repeat=2)).run()
    at_budget = [c for c in ev.calls if c[0] == "expandable_segments:True" and c[1] == BUDGET]
    assert [c[2] for c in at_budget] == [0, 1]
    default = [c for c in ev.calls if c[0] == "" and c[1] == BUDGET]
    assert [c[2] for c in default] == [0]  # failed at repeat 0: no second run


def test_crash_stops_the_sweep_with_that_error():
    ev = FakeEvaluator(crash_on="roundup_power2_divisions:4")
    tuner = Tuner(ev, settings())
    with pytest.raises(TrialCrashed, match="not for lack of memory: ValueError: bad input"):
        tuner.run()
    assert tuner.trials[-1].result.outcome == "crash"
    assert ev.calls[-1][0] == "roundup_power2_divisions:4"


def test_timeout_counts_as_not_completing():
    ev = FakeEvaluator(timeout_on="expandable_segments:True")
    result = Tuner(ev, settings()).run()
    s = by_conf(result)["expandable_segments:True"]
    assert s.feasible is False and s.outcome == "timeout"


def test_budget_larger_than_card_is_a_one_line_input_error():
    with pytest.raises(InputError, match="larger than the card"):
        Tuner(FakeEvaluator(total=2 * GiB), settings()).run()


def test_nothing_fits():
    ev = FakeEvaluator()
    result = Tuner(ev, settings(budget=1000 * MiB)).run()
    assert result.ranking.best is None
    rec = recommend(result)
    assert rec.conf is None and "no tested setting completes" in rec.summary


def test_default_wins_when_it_needs_least():
    needs = {"": 2000 * MiB, "expandable_segments:True": 2400 * MiB}
    ev = FakeEvaluator(needs)
    result = Tuner(ev, settings(knobs=parse_knobs(["expandable"]))).run()
    rec = recommend(result)
    assert rec.conf == "" and rec.lines == {} and "keep the default" in rec.summary


def test_candidate_that_allocates_less_than_the_baseline_gets_a_tested_bracket():
    # expandable needs 1500 MiB, below the baseline's peak allocated (1900 MiB): the assumed
    # lower bound passes, so the search moves down until a budget fails
    ev = FakeEvaluator(dict(FakeEvaluator().needs, **{"expandable_segments:True": 1500 * MiB}))
    res = Tuner(ev, settings(knobs=parse_knobs(["expandable"]))).run()
    best = res.ranking.best
    assert best.candidate.conf == "expandable_segments:True"
    assert best.infeasible_below < 1500 * MiB <= best.min_budget
    tried = {c[1] for c in ev.calls if c[0] == "expandable_segments:True"}
    assert best.infeasible_below in tried and best.min_budget in tried


def test_budget_below_peak_allocated_still_bisects_below_the_budget():
    ev = FakeEvaluator(dict(FakeEvaluator().needs, **{"expandable_segments:True": 1500 * MiB}))
    res = Tuner(ev, settings(budget=1800 * MiB, knobs=parse_knobs(["expandable"]))).run()
    assert all(c[1] <= 1800 * MiB for c in ev.calls[1:])
    assert res.ranking.best.infeasible_below < 1500 * MiB <= res.ranking.best.min_budget


def test_simulate_first_keeps_verifying_when_the_top_three_fail_on_the_gpu():
    ev = FakeEvaluator()

    class Liar(FakeSimulator):  # claims roundup and the default fit best; both fail at the budget
        def min_budget(self, conf):
            fake = {"roundup_power2_divisions:4": 1000 * MiB, "": 1100 * MiB, "garbage_collection_threshold:0.6": 1200 * MiB}
            return fake.get(conf, super().min_budget(conf))

    ev.needs["garbage_collection_threshold:0.6"] = 3000 * MiB
    res = Tuner(ev, settings(simulate_first=True), simulator_factory=lambda b: Liar(ev)).run()
    assert res.ranking.best is not None and res.ranking.best.candidate.conf == "max_split_size_mb:32"
    order = []
    for conf, *_ in ev.calls[1:]:
        if conf not in order:
            order.append(conf)
    # the three the simulator liked (all fail), then the next one in its ranking, which passes
    assert order == ["roundup_power2_divisions:4", "", "garbage_collection_threshold:0.6", "max_split_size_mb:32"]


def test_workload_with_only_small_segments_skips_max_split_with_a_note(monkeypatch):
    import tune_fakes

    monkeypatch.setattr(tune_fakes, "SEGMENTS", [(2 * MiB, 30), (20 * MiB, 4)])
    ev = FakeEvaluator()
    res = Tuner(ev, settings(knobs=parse_knobs(["max_split"]))).run()
    assert res.grid.values_mb == () and res.grid.noop_from_mb == 21
    assert any("no segment of 32 MiB or more" in n for n in res.notes)
    assert not any(c[0].startswith("max_split") for c in ev.calls)


def test_the_time_with_a_run_going_is_the_union_of_the_runs_spans():
    """`in_runs_s`: runs side by side count once, the gaps between them (alloctune's own work) not at all,
    and trials from the store not at all."""
    from dataclasses import replace

    from alloctune.tune.model import TrialRecord

    ev = FakeEvaluator(needs={"": 3 * GiB, "expandable_segments:True": 2 * GiB})
    res = Tuner(ev, settings(budget=int(2.5 * GiB), knobs=parse_knobs(["expandable"]))).run()
    base = res.trials[0].result

    def rec(wall, ended, reused=False):
        return TrialRecord(replace(base, wall_s=wall), "p", reused=reused, ended_at_s=None if reused else ended)

    trials = (rec(10.0, 10.0), rec(9.5, 20.0), rec(4.0, 15.0), rec(3.0, 0.0, reused=True), rec(1.0, 25.0))
    assert replace(res, trials=trials).in_runs_s == 10.0 + 9.5 + 1.0  # 0-10, 10.5-20 (11-15 inside it), 24-25
    assert res.to_dict()["in_runs_s"] == res.in_runs_s >= 0
