"""The compact trace format: exact round trip, sniffed by load_trace, clear errors."""

from __future__ import annotations

import json
import lzma
import pickle

import pytest

from alloctune.errors import TraceError
from alloctune.trace import load_trace, save_compact
from alloctune.trace.compact import SCHEMA, from_compact_dict, to_compact_dict

MiB = 1024 * 1024


def ev(action, addr=0, size=0, stream=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0}


def assert_same(a, b):
    assert a.requests.ops == b.requests.ops
    assert a.requests.sizes == b.requests.sizes
    assert a.requests.rids == b.requests.rids
    assert a.requests.streams == b.requests.streams
    assert a.requests.event_index == b.requests.event_index
    assert a.segment_events == b.segment_events
    assert a.allocator_settings == b.allocator_settings
    assert a.meta == b.meta
    assert (a.device, a.total_memory) == (b.device, b.total_memory)


def multi_stream_snapshot(tmp_path):
    events = [
        ev("segment_alloc", 0x100000, 2 * MiB, 0),
        ev("segment_alloc", 0x900000, 20 * MiB, 5),
        ev("alloc", 0x100000, 100, 0),
        ev("alloc", 0x900000, 3 * MiB, 5),
        ev("alloc", 0x100200, 700, 0),
        ev("free_completed", 0x100000, 100, 0),
        ev("free_completed", 0x900000, 3 * MiB, 5),
        {"action": "oom", "device_free": 77, "size": 40 * MiB, "stream": 5, "time_us": 0},
        ev("segment_free", 0x900000, 20 * MiB, 5),
        ev("free_requested", 0x100200, 700, 0),
    ]
    path = tmp_path / "ms.pickle.xz"
    path.write_bytes(lzma.compress(pickle.dumps({"device_traces": [[], events], "allocator_settings": {"x": 1}})))
    (tmp_path / "ms.json").write_text(json.dumps({"total_memory": 80 * 1024 * MiB, "workload": "t"}))
    return path


def test_round_trip_small_multi_stream(tmp_path):
    original = load_trace(multi_stream_snapshot(tmp_path))
    out = tmp_path / "ms.trace.xz"
    save_compact(original, out)
    back = load_trace(out)
    assert_same(original, back)
    assert back.streams == [0, 5] and back.device == 1
    assert [e.device_free for e in back.segment_events if e.action == "oom"] == [77]
    assert back.events == [] and back.source == str(out)
    assert to_compact_dict(back)["schema"] == SCHEMA


def test_shared_trace_round_trip(traces_dir, tmp_path):
    # rvc_ec1/default_cap85 has every request kind: allocs, frees, 16 empty_cache, 1881 failed allocs.
    original = load_trace(traces_dir / "rvc_ec1" / "default_cap85.pickle.xz")
    out = tmp_path / "rvc.trace.xz"
    written = save_compact(original, out)
    assert written == out.stat().st_size < 60_000
    assert_same(original, load_trace(out))


def test_schema_and_damage_errors(tmp_path):
    d = to_compact_dict(load_trace(multi_stream_snapshot(tmp_path)))
    with pytest.raises(TraceError, match="schema 99 is not supported"):
        from_compact_dict({**d, "schema": 99})
    with pytest.raises(TraceError, match="damaged"):
        from_compact_dict({**d, "requests": {**d["requests"], "sizes": d["requests"]["sizes"][:-1]}})
    path = tmp_path / "bad.trace.xz"
    path.write_bytes(lzma.compress(json.dumps({**d, "schema": 99}).encode()))
    with pytest.raises(TraceError, match="convert the original snapshot again"):
        load_trace(path)
    save_compact(load_trace(multi_stream_snapshot(tmp_path)), path)
    assert load_trace(path, device=1).device == 1
    with pytest.raises(TraceError, match="holds device 1 only"):
        load_trace(path, device=0)


# ---- property: any consistent history survives the round trip -----------------------------

from hypothesis import assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from alloctune.trace import ALLOC, EMPTY_CACHE, FREE  # noqa: E402
from alloctune.trace.load import trace_from_snapshot  # noqa: E402


@st.composite
def histories(draw):
    """Random consistent histories: allocs on 1-2 streams, frees in any order, releases and OOMs."""
    events, live, next_addr = [], [], 0x10000
    for _ in range(draw(st.integers(1, 60))):
        kind = draw(st.sampled_from(["alloc", "alloc", "free", "free", "release", "oom"]))
        stream = draw(st.sampled_from([0, 0, 0x5A5A]))
        if kind == "alloc":
            size = draw(st.integers(1, 50 * MiB))
            if draw(st.booleans()):
                events.append(ev("segment_alloc", next_addr, -(-size // (2 * MiB)) * 2 * MiB, stream))
            events.append(ev("alloc", next_addr, size, stream))
            live.append((next_addr, size, stream))
            next_addr += 64 * MiB
        elif kind == "free" and live:
            addr, size, s = live.pop(draw(st.integers(0, len(live) - 1)))
            events.append(ev("free_requested", addr, size, s))
            events.append(ev("free_completed", addr, size, s))
        elif kind == "release":  # a cached idle segment (allocated up front) is released
            events.append(ev("segment_free", next_addr, 2 * MiB, stream))
            events.insert(0, ev("segment_alloc", next_addr, 2 * MiB, stream))
            next_addr += 64 * MiB
        elif kind == "oom":
            events.append({"action": "oom", "device_free": draw(st.integers(0, 2**40)),
                           "size": 512 * draw(st.integers(1, 10**6)), "stream": stream, "time_us": 0})
    assume(events)
    return events


@settings(max_examples=60, deadline=None)
@given(histories())
def test_round_trip_property(events):
    original = trace_from_snapshot({"device_traces": [events], "allocator_settings": {}}, source="h")
    req = original.requests
    # Each FREE names an earlier ALLOC of the same stream; each alloc/free_completed became a request.
    first = {}
    for i, (op, size, rid, stream) in enumerate(req):
        if op == ALLOC:
            first[rid] = (size, stream)
        elif op == FREE:
            assert first[rid] == (size, stream)
    assert req.count(ALLOC) == sum(e["action"] == "alloc" for e in events)
    assert req.count(FREE) == sum(e["action"] == "free_completed" for e in events)
    assert req.count(EMPTY_CACHE) <= sum(e["action"] == "segment_free" for e in events)
    from alloctune.trace.compact import from_compact_dict, to_compact_dict

    assert_same(original, from_compact_dict(json.loads(json.dumps(to_compact_dict(original)))))
