"""The traces shipped inside the package (real H200 recordings) load from the package alone,
and the simulator reproduces each one's recorded segment events exactly under its own setting."""

from __future__ import annotations

import pytest

from alloctune.demo import shipped_trace_path, shipped_traces
from alloctune.sim import compare, replay
from alloctune.sim.settings import SimSettings
from alloctune.trace import load_trace

NAMES = shipped_traces()


def test_all_four_recordings_are_shipped():
    assert {"rvc_h200_ec1.atrace", "rvc_h200.atrace", "diffusion_h200.atrace", "llm_h200.atrace"} <= set(NAMES)


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
