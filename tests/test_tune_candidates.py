"""Candidate settings and the max_split_size_mb grid taken from the workload's own segments."""

from __future__ import annotations

import pytest

from alloctune.errors import InputError
from alloctune.tune.candidates import fixed_candidates, parse_knobs, split_grid
from alloctune.tune.objective import CandidateSummary, rank
from alloctune.tune.candidates import Candidate, make

MiB = 1 << 20


def test_default_knobs_and_canonical_strings():
    knobs = parse_knobs(None)
    confs = [c.conf for c in fixed_candidates(knobs)]
    assert confs == ["", "expandable_segments:True", "garbage_collection_threshold:0.6", "roundup_power2_divisions:4"]
    assert knobs["max_split_size_mb"] == ()  # automatic range


def test_knob_values_and_aliases():
    knobs = parse_knobs(["gc=0.60/0.8,expandable", "max_split=128/256"])
    confs = [c.conf for c in fixed_candidates(knobs)]
    assert confs == [
        "",
        "expandable_segments:True",
        "max_split_size_mb:128",
        "max_split_size_mb:256",
        "garbage_collection_threshold:0.6",
        "garbage_collection_threshold:0.8",
    ]
    with pytest.raises(InputError, match="unknown knob 'foo'"):
        parse_knobs(["foo"])
    with pytest.raises(InputError):  # torch rejects it, so do we, before any trial
        fixed_candidates(parse_knobs(["max_split=10"]))


def test_split_grid_from_segments_with_noop_bound():
    sizes = [(2 * MiB, 40), (20 * MiB, 9), (22 * MiB, 1), (100 * MiB, 3), (714 * MiB, 1)]
    g = split_grid(sizes)
    # powers of two from 32 MiB below the largest segment, then the largest segment itself
    assert g.values_mb == (32, 64, 128, 256, 512, 714)
    assert g.largest_segment == 714 * MiB
    assert g.noop_from_mb == 715  # 715 MiB > every segment: marks nothing oversize
    g2 = split_grid([(1024 * MiB, 1)])
    assert g2.values_mb == (32, 64, 128, 256, 512, 1024) and g2.noop_from_mb == 1025
    small = split_grid([(2 * MiB, 3), (20 * MiB, 2)])
    assert small.values_mb == () and small.noop_from_mb == 21  # nothing to tune: every value is a no-op
    assert split_grid(None).values_mb == ()


def test_split_grid_thins_on_a_log_scale_keeping_both_ends():
    g = split_grid([(40 * 1024 * MiB, 1)], max_points=6)  # 32 .. 32768 and 40960: 12 values
    assert len(g.values_mb) == 6
    assert g.values_mb[0] == 32 and g.values_mb[-1] == 40960
    assert g.dropped == 12 - 6
    ratios = [b / a for a, b in zip(g.values_mb, g.values_mb[1:])]
    assert max(ratios) / min(ratios) <= 2.5  # spread over the log range, no clumping


def test_rank_orders_by_feasible_then_min_budget_with_throughput_guard():
    a = CandidateSummary(Candidate(""), feasible=True, min_budget=3000 * MiB, throughput=100.0)
    b = CandidateSummary(make("expandable_segments", "True"), feasible=True, min_budget=2000 * MiB, throughput=98.0)
    c = CandidateSummary(make("garbage_collection_threshold", "0.6"), feasible=True, min_budget=1500 * MiB, throughput=96.0)
    d = CandidateSummary(make("roundup_power2_divisions", "4"), feasible=False, outcome="oom")
    r = rank([a, b, c, d], 3500 * MiB)
    assert r.best is b  # c needs less memory but is 4 % slower than the best (a)
    assert [s.candidate.conf for s in r.order][:2] == ["expandable_segments:True", ""]
    assert "4.0 % below" in r.reasons["garbage_collection_threshold:0.6"]
    assert "1000.00 MiB more" in r.reasons[""]
    assert "does not complete" in r.reasons["roundup_power2_divisions:4"]
    # a looser guard (5 %) lets the lowest min_budget win
    r2 = rank([a, b, c, d], 3500 * MiB, throughput_tolerance=0.05)
    assert r2.best is c


def test_tune_and_runner_do_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, alloctune.tune.strategy, alloctune.tune.recommend, alloctune.tune.store, alloctune.run.runner, "
        "alloctune.agent.bootstrap, alloctune.cli.run_cmd, alloctune.cli.tune_cmd; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
