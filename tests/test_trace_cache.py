"""Loaded snapshots are cached in compact form by content: the second load skips the pickle
and gives the same trace (and the same replay)."""

from __future__ import annotations

import shutil

import pytest

from alloctune.sim.replay import replay
import alloctune.trace.load as load
from alloctune.errors import TraceError
from alloctune.trace import load_trace


@pytest.fixture
def snapshot(traces_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ALLOCTUNE_CACHE", raising=False)
    monkeypatch.delenv("ALLOCTUNE_CACHE_DIR", raising=False)
    src = traces_dir / "rvc_ec0" / "default_cap85.pickle.xz"
    dst = tmp_path / "run.pickle.xz"
    shutil.copy(src, dst)
    shutil.copy(src.with_name("default_cap85.json"), tmp_path / "run.json")
    return dst


def _entries(tmp_path):
    root = tmp_path / "xdg" / "alloctune"
    return sorted(root.glob("*.atrace")) if root.is_dir() else []


def test_second_load_comes_from_the_cache_and_is_the_same_trace(snapshot, tmp_path, monkeypatch):
    first = load_trace(snapshot)
    assert len(_entries(tmp_path)) == 1

    def no_pickle(*a, **k):
        raise AssertionError("the snapshot was loaded again")

    monkeypatch.setattr(load, "_load_trace", no_pickle)
    again = load_trace(snapshot)
    for col in ("ops", "sizes", "streams", "event_index"):
        assert getattr(again.requests, col) == getattr(first.requests, col)
    assert again.segment_events == first.segment_events
    assert (again.source, again.device, again.allocator_settings, again.meta, again.total_memory) == (
        first.source, first.device, first.allocator_settings, first.meta, first.total_memory)
    assert again.meta.get("cap")  # the sidecar is still read
    assert replay(again, "", budget=first.meta["cap"]).to_dict() == replay(first, "", budget=first.meta["cap"]).to_dict()


def test_raw_events_of_a_cached_trace_load_on_first_use(snapshot, tmp_path):
    first = load_trace(snapshot)
    again = load_trace(snapshot)
    assert repr(again.events) == "LazyEvents(not loaded)"
    assert len(again.events) == len(first.events) and again.events[5] == first.events[5]
    stale = load_trace(snapshot)
    with open(snapshot, "ab") as f:
        f.write(b"\0")
    with pytest.raises(TraceError, match="changed"):
        stale.events[0]


def test_off_switch_and_changed_content(snapshot, tmp_path, monkeypatch):
    monkeypatch.setenv("ALLOCTUNE_CACHE", "0")
    load_trace(snapshot)
    assert _entries(tmp_path) == []
    monkeypatch.delenv("ALLOCTUNE_CACHE")
    load_trace(snapshot)
    other = tmp_path / "other.pickle.xz"
    shutil.copy(snapshot, other)
    load_trace(other)  # same bytes, same key
    assert len(_entries(tmp_path)) == 1
    with open(other, "ab") as f:
        f.write(b"\0")  # different bytes: a different key (and here a damaged file)
    with pytest.raises(TraceError):
        load_trace(other)
    assert len(_entries(tmp_path)) == 1


def test_a_damaged_entry_is_replaced_by_a_full_load(snapshot, tmp_path):
    first = load_trace(snapshot)
    (entry,) = _entries(tmp_path)
    entry.write_bytes(b"garbage")
    again = load_trace(snapshot)
    assert again.requests.sizes == first.requests.sizes
    assert entry.read_bytes() != b"garbage"
