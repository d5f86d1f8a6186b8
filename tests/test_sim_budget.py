"""`min_budget` skips the replays the trace already answers and still finds today's budgets."""

from __future__ import annotations

import pytest

from alloctune.demo.core import shipped_trace_path
from alloctune.sim.budget import MinBudget, min_budget
from alloctune.sim.replay import cap_from_budget, replay
from alloctune.sim.resolution import ABS_TOL, REL_TOL
from alloctune.trace import load_trace


def _reference(trace, config, rel_tol=REL_TOL, abs_tol=ABS_TOL) -> MinBudget:
    """min_budget as it was before the uncapped run could be reused (every probe replayed)."""

    def ok(budget):
        r = replay(trace, config, budget=budget, record_events=False, timeline_points=1)
        return r.completed, r

    done, base = ok(None)
    runs = 1
    if not done:
        return MinBudget(None, base.total_memory, runs, base.peak_reserved)
    lo = max(0, base.peak_requested - 1)
    hi = base.peak_reserved
    while True:
        good, _ = ok(hi)
        runs += 1
        if good:
            break
        lo = hi
        if hi >= base.total_memory:
            return MinBudget(None, lo, runs, base.peak_reserved)
        hi = min(base.total_memory, hi * 2)
    while hi - lo > max(abs_tol, int(rel_tol * hi)):
        mid = (lo + hi) // 2
        good, _ = ok(mid)
        runs += 1
        if good:
            hi = mid
        else:
            lo = mid
    return MinBudget(hi, lo, runs, base.peak_reserved)


@pytest.mark.parametrize("name", ["rvc_h200.atrace", "train_h200.atrace", "diffusion_h200.atrace"])
@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "max_split_size_mb:128",
                                  "garbage_collection_threshold:0.6,max_split_size_mb:256"])
def test_same_budget_as_before_with_fewer_replays(name, conf):
    trace = load_trace(shipped_trace_path(name))
    old = _reference(trace, conf)
    new = min_budget(trace, conf)
    assert (new.budget, new.infeasible_below, new.peak_reserved_uncapped) == (
        old.budget, old.infeasible_below, old.peak_reserved_uncapped)
    # the probe at the uncapped peak is proven (not run) unless GC or expandable segments are on
    # or the budget's cap rounds below that peak (budget -> fraction -> cap goes through a double)
    peak = old.peak_reserved_uncapped
    cap = cap_from_budget(peak, replay(trace, conf, record_events=False).total_memory)
    proven = "garbage" not in conf and "expandable" not in conf and (cap is None or cap >= peak)
    assert new.replays == old.replays - proven
    uncapped = replay(trace, conf)  # what `simulate` already has: reusing it saves one more
    reused = min_budget(trace, conf, uncapped=uncapped)
    assert reused.budget == old.budget and reused.replays == new.replays - 1


def test_the_proof_saves_a_replay_somewhere():
    trace = load_trace(shipped_trace_path("rvc_h200.atrace"))
    assert min_budget(trace, "").replays == _reference(trace, "").replays - 1


def test_an_uncapped_result_of_something_else_is_refused():
    trace = load_trace(shipped_trace_path("rvc_h200.atrace"))
    with pytest.raises(ValueError):
        min_budget(trace, "max_split_size_mb:128", uncapped=replay(trace, ""))
    with pytest.raises(ValueError):
        min_budget(trace, "", uncapped=replay(trace, "", budget=8 << 30))


def test_expandable_segments_get_no_proof_a_cap_at_the_uncapped_peak_can_bind():
    """Found by the plan tests: under a cap a growing expandable segment is checked against the
    whole step it maps, so the cap at the uncapped peak reserved can fail; min_budget must probe it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from plan_programs import program

    trace = program(3000)
    conf = "expandable_segments:True"
    peak = replay(trace, conf, record_events=False).peak_reserved
    assert not replay(trace, conf, record_events=False, budget=peak).completed
    mb = min_budget(trace, conf)
    assert mb.budget > peak and replay(trace, conf, record_events=False, budget=mb.budget).completed
