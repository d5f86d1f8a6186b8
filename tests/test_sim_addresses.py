"""One vocabulary for where replay addresses come from, and what a check therefore shows (#18.2)."""

from __future__ import annotations

import pytest

from alloctune.sim.addresses import (
    ADDRESS_SOURCES, COMPARED, DEFAULT_SOURCE, MODEL, MODELLED, PREDICTION, REPLAY, TRACE, check_source,
    fidelity_kind, replay_addresses,
)
from alloctune.trace.model import RequestStream, Trace


def _trace(source: str) -> Trace:
    return Trace(source=source, device=0, requests=RequestStream(), segment_events=[], allocator_settings={})


def test_default_is_the_replayed_traces_own_addresses():
    stream, other = _trace("a.pickle"), _trace("b.pickle")
    assert DEFAULT_SOURCE == TRACE and ADDRESS_SOURCES == (TRACE, COMPARED, MODEL)
    assert replay_addresses(DEFAULT_SOURCE, stream, other) == ("recorded", stream)
    assert fidelity_kind(DEFAULT_SOURCE, stream, other) == PREDICTION


def test_borrowing_the_compared_runs_addresses_is_labelled_replay():
    stream, other = _trace("a.pickle"), _trace("b.pickle")
    assert replay_addresses(COMPARED, stream, other) == ("recorded", other)
    assert fidelity_kind(COMPARED, stream, other) == REPLAY
    with pytest.raises(ValueError, match="needs a recording"):
        replay_addresses(COMPARED, stream, None)


def test_own_stream_is_a_replay_and_model_a_modelled_prediction():
    a = _trace("a.pickle")
    assert fidelity_kind(TRACE, a, _trace("a.pickle")) == REPLAY
    assert fidelity_kind(MODEL, a, a) == MODELLED
    assert replay_addresses(MODEL, a, a) == ("model", None)


def test_unknown_source_names_the_vocabulary():
    with pytest.raises(ValueError, match="trace, compared, model"):
        check_source("auto")
