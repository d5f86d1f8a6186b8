"""The traces shipped inside the package (real H200 recordings) load from the package alone,
and the simulator reproduces each one's recorded segment events exactly under its own setting."""

from __future__ import annotations

import pytest

from alloctune.demo.core import shipped_trace_path, shipped_traces
from alloctune.sim import compare, replay
from alloctune.sim.settings import SimSettings
from alloctune.trace import load_trace

NAMES = shipped_traces()


def test_every_workload_is_shipped_under_three_settings():
    expected = {"rvc_h200_ec1.atrace"} | {
        f"{wl}_h200{suffix}.atrace"
        for wl in ("rvc", "diffusion", "llm", "train")
        for suffix in ("", "_expandable", "_max_split_128")
    }
    assert expected <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_replay_reproduces_the_recording(name):
    trace = load_trace(shipped_trace_path(name))
    assert len(trace.requests) > 10_000
    assert str(trace.meta.get("torch", "")).startswith("2.11")
    settings = SimSettings.from_allocator_settings(trace.allocator_settings)
    result = replay(trace, settings, addresses="recorded")
    assert result.completed
    fidelity = compare(result, trace)
    assert fidelity.events_match, fidelity.first_difference
    recorded_allocs = [e.size for e in trace.segment_events if e.action == "segment_alloc"]
    simulated_allocs = [e.size for e in result.segment_events if e.action == "segment_alloc"]
    assert simulated_allocs == recorded_allocs


# The prediction a user makes with one recording: the default run's request stream *and its
# addresses* (the only ones a user has), replayed under another setting, checked against that
# setting's real run. Measured on the shipped traces (bench/fidelity.py --shipped): event for
# event in 5 of 8 pairs; llm max_split_128 differs from segment event #94 (where a 20 MiB segment
# lands decides a tie between equal free blocks; its peak reserved is 6 MiB higher), and rvc's
# two pairs differ because their request streams are not default's (an inferred empty_cache()
# that released nothing leaves no trace) -- yet their peaks reserved are equal.
PREDICTION_MISSES = {("llm", "max_split_128"), ("rvc", "expandable"), ("rvc", "max_split_128")}
PEAK_MISSES = {("llm", "max_split_128")}


@pytest.mark.parametrize("workload", ["diffusion", "llm", "train", "rvc"])
@pytest.mark.parametrize("variant", ["expandable", "max_split_128"])
def test_one_recording_predicts_the_other_settings(workload, variant):
    from alloctune.sim.addresses import PREDICTION, TRACE, fidelity_kind, replay_addresses

    default = load_trace(shipped_trace_path(f"{workload}_h200.atrace"))
    real = load_trace(shipped_trace_path(f"{workload}_h200_{variant}.atrace"))
    settings = SimSettings.from_allocator_settings(real.allocator_settings)
    assert settings != SimSettings.from_allocator_settings(default.allocator_settings)
    addresses, reference = replay_addresses(TRACE, default, real)
    assert reference is default  # nothing of the run being predicted is used
    assert fidelity_kind(TRACE, default, real) == PREDICTION
    result = replay(default, settings, addresses=addresses, reference=reference)
    fidelity = compare(result, real, stream_trace=default)
    assert fidelity.exact == ((workload, variant) not in PREDICTION_MISSES), fidelity.verdict
    recorded_peak = fidelity.stats["reserved_bytes.all.peak"][0]
    assert (result.peak_reserved == recorded_peak) == ((workload, variant) not in PEAK_MISSES)
    assert abs(result.peak_reserved - recorded_peak) <= 8 * 2**20


def test_demo_list_names_each_trace_with_its_workload_and_setting():
    from alloctune.demo.core import shipped_trace_info

    rows = {r["name"]: r for r in shipped_trace_info()}
    assert rows["train_h200_expandable"]["setting"] == "expandable_segments:True"
    assert rows["llm_h200_max_split_128"]["setting"] == "max_split_size_mb:128"
    assert rows["rvc_h200"]["setting"] == "(default)" and rows["rvc_h200"]["workload"].startswith("rvc")
    # the listing agrees with what the simulator reads from each file
    for name, row in rows.items():
        trace = load_trace(shipped_trace_path(name + ".atrace"))
        expandable = SimSettings.from_allocator_settings(trace.allocator_settings).expandable_segments
        assert expandable == ("expandable_segments:True" in row["setting"])
