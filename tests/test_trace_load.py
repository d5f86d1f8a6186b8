"""load_snapshot / load_trace: device choice, sidecar, and every error case on small generated files."""

from __future__ import annotations

import json
import lzma
import pickle

import pytest

from alloctune.errors import TraceError, UnsafePickleError
from alloctune.trace import ALLOC, FREE, load_snapshot, load_trace

MiB = 1024 * 1024


def ev(action, addr=0, size=0, stream=0, **extra):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0, **extra}


def small_run():
    """One segment, two tensors: the smallest complete history."""
    return [
        ev("segment_alloc", 0x1000_0000, 2 * MiB),
        ev("alloc", 0x1000_0000, 1000),
        ev("alloc", 0x1000_0200, 24),
        ev("free_requested", 0x1000_0000, 1000),
        ev("free_completed", 0x1000_0000, 1000),
        ev("snapshot", 0, 512),
    ]


def write_snapshot(path, device_traces, settings=None, compress=True, **top):
    snap = {"segments": [], "device_traces": device_traces, "allocator_settings": settings or {}, **top}
    raw = pickle.dumps(snap, protocol=4)
    path.write_bytes(lzma.compress(raw) if compress else raw)
    return path


def test_load_small_trace(tmp_path):
    path = write_snapshot(tmp_path / "run.pickle.xz", [small_run()], {"expandable_segments": False})
    t = load_trace(path)
    assert t.device == 0
    assert t.requests.ops == [ALLOC, ALLOC, FREE]
    assert t.requests.sizes == [1000, 24, 1000]
    assert t.requests.rids == [0, 1, 0]
    assert t.requests.event_index == [1, 2, 4]
    assert [(e.action, e.size, e.request_index) for e in t.segment_events] == [("segment_alloc", 2 * MiB, 0)]
    assert t.allocator_settings == {"expandable_segments": False}
    assert t.meta == {} and t.total_memory is None
    assert len(t.events) == 6
    assert load_snapshot(path)["device_traces"][0] == small_run()


def test_sidecar_becomes_meta_and_total_memory(tmp_path):
    path = write_snapshot(tmp_path / "run.pickle.xz", [small_run()])
    (tmp_path / "run.json").write_text(json.dumps({"workload": "w", "total_memory": 123 * MiB}))
    t = load_trace(path)
    assert t.meta["workload"] == "w"
    assert t.total_memory == 123 * MiB


def test_uncompressed_pickle(tmp_path):
    path = write_snapshot(tmp_path / "run.pickle", [small_run()], compress=False)
    assert len(load_trace(path).requests) == 3


def test_only_device_with_events_is_chosen(tmp_path):
    path = write_snapshot(tmp_path / "s.pickle.xz", [[], [], small_run()])
    assert load_trace(path).device == 2


def test_several_devices_need_a_choice(tmp_path):
    other = [ev("segment_alloc", 0x2000_0000, 2 * MiB), ev("alloc", 0x2000_0000, 7)]
    path = write_snapshot(tmp_path / "s.pickle.xz", [small_run(), [], other])
    with pytest.raises(TraceError, match=r"several devices \(0, 2\).*--device"):
        load_trace(path)
    t = load_trace(path, device=2)
    assert t.device == 2 and t.requests.sizes == [7]
    with pytest.raises(TraceError, match=r"device 5 is out of range: the snapshot has 3 device\(s\)"):
        load_trace(path, device=5)
    with pytest.raises(TraceError, match="device 1 has no recorded events; devices with events: 0, 2"):
        load_trace(path, device=1)


def test_empty_history_says_how_to_record(tmp_path):
    for traces in ([], [[], []]):
        path = write_snapshot(tmp_path / "empty.pickle.xz", traces)
        with pytest.raises(TraceError, match=r"no allocation history.*_record_memory_history"):
            load_trace(path)


def test_wrapped_history_says_raise_max_entries(tmp_path):
    # The ring buffer kept only the tail: frees of blocks allocated before the first kept entry.
    tail = [
        ev("free_requested", 0x3000_0000, 4096),
        ev("free_completed", 0x3000_0000, 4096),
        ev("segment_free", 0x3000_0000, 20 * MiB),
    ] + small_run()
    path = write_snapshot(tmp_path / "wrapped.pickle.xz", [tail])
    with pytest.raises(TraceError, match=r"incomplete: 1 free\(s\) and 1 segment release\(s\).*max_entries") as info:
        load_trace(path)
    assert "first at event 1" in str(info.value)
    t = load_trace(path, partial=True)
    assert t.requests.ops[-3:] == [ALLOC, ALLOC, FREE]


def test_not_a_snapshot(tmp_path):
    path = tmp_path / "list.pickle"
    path.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(TraceError, match=r"not a memory snapshot \(found list"):
        load_trace(path)
    path.write_bytes(pickle.dumps({"segments": []}))
    with pytest.raises(TraceError, match="no 'device_traces'"):
        load_snapshot(path)


def test_truncated_xz_snapshot(tmp_path):
    path = write_snapshot(tmp_path / "t.pickle.xz", [small_run() * 50])
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(TraceError, match="truncated or corrupt"):
        load_trace(path)


def test_damaged_event_is_a_trace_error(tmp_path):
    path = write_snapshot(tmp_path / "d.pickle.xz", [[{"action": "alloc", "size": 3}]])
    with pytest.raises(TraceError, match="entry is malformed"):
        load_trace(path)
    path = write_snapshot(tmp_path / "d2.pickle.xz", [["alloc", 5]])
    with pytest.raises(TraceError, match="entry is malformed"):
        load_trace(path)


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "nope.pickle.xz")


def test_hostile_snapshot_through_load_trace(tmp_path):
    import os

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"device_traces": [[Evil()]]}))
    with pytest.raises(UnsafePickleError):
        load_trace(path)
    assert not marker.exists()


# ---- the shared H200 traces ------------------------------------------------------------------


def test_shared_llm_trace_loads(traces_dir):
    t = load_trace(traces_dir / "llm" / "default.pickle.xz")
    assert len(t.events) == 965648
    assert t.requests.count(ALLOC) == 321941
    assert t.requests.count(FREE) == 321791
    assert t.streams == [0]
    assert t.total_memory == 150109880320
    assert t.meta["workload"] == "llm"
    assert t.allocator_settings["max_split_size"] == -1


def test_uncapped_request_streams_are_identical_across_settings(traces_dir):
    """The README's claim, through our loader: settings change the allocator's events, not the requests."""
    base = load_trace(traces_dir / "rvc_ec1" / "default.pickle.xz").requests
    for name in ("max_split_128", "expandable", "roundup4"):
        other = load_trace(traces_dir / "rvc_ec1" / f"{name}.pickle.xz").requests
        assert other.ops == base.ops and other.sizes == base.sizes and other.rids == base.rids, name


def test_trace_package_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, alloctune.trace, alloctune.trace.summary, alloctune.cli.trace_cmd; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_wrapped_history_detected_from_a_segment_release_alone(tmp_path):
    # Reserved never goes negative here (a bigger segment exists), but segment 0x5000_0000 was never allocated.
    events = [
        ev("segment_alloc", 0x1000_0000, 100 * MiB),
        ev("segment_free", 0x5000_0000, 2 * MiB),
        ev("alloc", 0x1000_0000, 5),
    ]
    path = write_snapshot(tmp_path / "w.pickle.xz", [events])
    with pytest.raises(TraceError, match=r"0 free\(s\) and 1 segment release\(s\).*first at event 1"):
        load_trace(path)


def test_load_snapshot_explains_compact_traces(tmp_path, traces_dir):
    """A compact trace is a request stream, not a snapshot: commands that need the memory map say so."""
    from alloctune.trace import load_trace
    from alloctune.trace.compact import save_compact
    from alloctune.trace.load import load_snapshot

    path = tmp_path / "t.atrace"
    save_compact(load_trace(traces_dir / "rvc_ec1" / "default.pickle.xz"), path)
    with pytest.raises(TraceError, match="compact trace keeps the request stream"):
        load_snapshot(path)


@pytest.mark.parametrize("unshared", [1000, 0])
def test_stack_ids_follow_the_frames_content_whatever_objects_carry_it(tmp_path, monkeypatch, unshared):
    """torch shares one dict per frame line among events; a file may as well carry equal frames in
    separate objects. Either way equal content is one stack, ids in order of first appearance (also
    once lookups by object are off, `UNSHARED`), and a frames value that is not a list drops the table."""
    import alloctune.trace.stacks as stacks

    monkeypatch.setattr(stacks, "UNSHARED", unshared)
    monkeypatch.setenv("ALLOCTUNE_CACHE", "0")
    f1 = {"filename": "a.py", "line": 1, "name": "f"}
    f2 = {"filename": "b.py", "line": 2, "name": "g"}
    run = [
        ev("segment_alloc", 0x1000_0000, 2 * MiB),
        ev("alloc", 0x1000_0000, 512, frames=[f1, f2]),
        ev("alloc", 0x1000_0200, 512, frames=[dict(f1), dict(f2)]),  # equal content, other objects
        ev("alloc", 0x1000_0400, 512, frames=[f2]),
        ev("alloc", 0x1000_0600, 512, frames=[f1, f2]),
    ]
    req = load_trace(write_snapshot(tmp_path / "s.pickle.xz", [run])).requests
    assert [req.stack_ids[r] for r in range(len(req.ops)) if req.ops[r] == ALLOC] == [0, 0, 1, 0]
    assert req.stack_table.frames == [("a.py", 1, "f"), ("b.py", 2, "g")]
    assert [tuple(s) for s in req.stack_table.stacks] == [(0, 1), (1,)]
    bad = run + [ev("alloc", 0x1000_0800, 512, frames=(f1, f2))]  # a tuple, not a list
    req = load_trace(write_snapshot(tmp_path / "b.pickle.xz", [bad])).requests
    assert req.stack_table.dropped and "not a list" in req.stack_table.dropped
