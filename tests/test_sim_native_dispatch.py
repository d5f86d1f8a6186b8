"""Choosing the replay core: automatic, forced either way, and said once when the native one is missing."""

from __future__ import annotations

import logging

import pytest

from alloctune.errors import ConfigError
from alloctune.sim import native
from alloctune.sim.replay import replay
from alloctune.trace.model import ALLOC, FREE, RequestStream, Trace


def _trace() -> Trace:
    rs = RequestStream()
    rs.append(ALLOC, 3 << 20, 1, 0, 0)
    rs.append(FREE, -1, 1, 0, 1)
    return Trace("t", 0, rs, [], {})


def test_missing_native_core_falls_back_and_says_so_once(monkeypatch, caplog):
    monkeypatch.setattr(native, "_MODULE", None)
    monkeypatch.setattr(native, "_warned", False)
    monkeypatch.delenv("ALLOCTUNE_SIM", raising=False)
    with caplog.at_level(logging.WARNING, logger="alloctune.sim"):
        a = replay(_trace(), addresses="model")
        b = replay(_trace(), addresses="model")
    assert a.to_dict() == b.to_dict() and a.completed
    notes = [r for r in caplog.records if "native simulator core" in r.getMessage()]
    assert len(notes) == 1


def test_forcing_a_core(monkeypatch):
    monkeypatch.setenv("ALLOCTUNE_SIM", "python")
    assert native.core() is None
    monkeypatch.setenv("ALLOCTUNE_SIM", "fast")
    with pytest.raises(ConfigError, match="ALLOCTUNE_SIM"):
        native.core()
    monkeypatch.setattr(native, "_MODULE", None)
    monkeypatch.setenv("ALLOCTUNE_SIM", "native")
    with pytest.raises(ConfigError, match="not built"):
        replay(_trace())


@pytest.mark.skipif(not native.available(), reason="native simulator core not built")
def test_auto_picks_the_native_core(monkeypatch):
    monkeypatch.delenv("ALLOCTUNE_SIM", raising=False)
    assert native.core() is native._MODULE is not None
