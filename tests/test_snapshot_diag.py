"""Flight-recorder diagnosis: memory maps rebuilt from history, and OOMs explained from snapshots."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from alloctune.diagnose.snapshot import (
    HistoryGap,
    MemoryMap,
    SizeRules,
    SnapshotDiagnosis,
    allocation_size,
    diagnose_snapshot,
    map_from_snapshot_segments,
    replay_history,
    verify_against_segments,
)
from alloctune.errors import TraceError
from alloctune.units import MiB, format_size

A = 0x7F0000000000  # a plausible device address for synthetic histories


def ev(action, addr=0, size=0, **kw):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 0, **kw}


def load(traces_dir, name):
    from alloctune.trace import load_snapshot

    return load_snapshot(traces_dir / f"{name}.pickle.xz")


def sidecar(traces_dir, name):
    return json.loads((traces_dir / f"{name}.json").read_text())


# ---- allocator arithmetic -------------------------------------------------------------------


def test_round_size_matches_the_spec_examples():
    rules = SizeRules()
    assert rules.round_size(1) == 512
    assert rules.round_size(1000) == 1024
    assert rules.round_size(12 * MiB + 1) == 12 * MiB + 512
    four = SizeRules.from_settings({"roundup_power2_divisions": {str(1 << i): 4 for i in range(16)}})
    assert four.round_size(1200) == 1536  # guard size > 512*d keeps the plain 512 rounding
    assert four.round_size(5 * MiB) == 5 * MiB  # on a division already (4 MiB floor, 1 MiB steps)
    assert four.round_size(5 * MiB + 1) == 6 * MiB
    assert four.round_size(4 * MiB) == 4 * MiB  # powers of two stay


def test_allocation_size_is_what_the_oom_message_prints():
    assert allocation_size(1024) == 2 * MiB
    assert allocation_size(1536 * 1024) == 20 * MiB
    assert allocation_size(63776768) == 62 * MiB  # "Tried to allocate 62.00 MiB" in llm/default_cap85


def test_should_split_rules():
    rules = SizeRules()
    assert rules.should_split("large", 25 * MiB, 1 * MiB) is False  # must be > 1 MiB
    assert rules.should_split("large", 25 * MiB, 1 * MiB + 512) is True
    assert rules.should_split("small", 1024, 512) is True
    capped = SizeRules.from_settings({"max_split_size": 128 * MiB})
    assert capped.should_split("large", 200 * MiB, 50 * MiB) is False  # oversize blocks are never split
    assert SizeRules.from_settings({"expandable_segments": True}).should_split("large", 30 * MiB, 512) is True


# ---- replay of synthetic histories ---------------------------------------------------------


def test_unsplit_remainder_belongs_to_the_block():
    # Spec §2.3 step 4: 25 MiB in a new 26 MiB segment keeps the 1 MiB tail in the block.
    events = [ev("segment_alloc", A, 26 * MiB), ev("alloc", A, 25 * MiB)]
    rp = replay_history(events)
    (seg,) = rp.final.segments
    assert [(b.size, b.allocated) for b in seg.blocks] == [(26 * MiB, True)]
    assert rp.final.allocated == 26 * MiB


def test_split_free_gaps_and_segment_release():
    events = [
        ev("segment_alloc", A, 20 * MiB),
        ev("alloc", A, 1536 * 1024),  # 1.5 MiB: remainder 18.5 MiB is split off
        ev("alloc", A + 1536 * 1024, 12 * MiB + 1),  # best fit in the remainder
        ev("free_completed", A, 1536 * 1024),
        ev("segment_alloc", A + 64 * MiB, 2 * MiB),  # a small-pool segment
        ev("alloc", A + 64 * MiB, 1000),
        ev("free_completed", A + 64 * MiB, 1000),
        ev("segment_free", A + 64 * MiB, 2 * MiB),
    ]
    rp = replay_history(events, capture=[4])
    big = rp.final.segments[0]
    assert [(b.addr - A, b.size, b.allocated) for b in big.blocks] == [
        (0, 1536 * 1024, False),
        (1536 * 1024, 12 * MiB + 512, True),
        (1536 * 1024 + 12 * MiB + 512, 20 * MiB - 1536 * 1024 - 12 * MiB - 512, False),
    ]
    assert len(rp.final.segments) == 1
    assert rp.peak_reserved == 22 * MiB
    assert rp.maps[4].reserved == 20 * MiB  # captured before event 4 was applied
    assert rp.final.free_blocks("large") == [6815232, 1536 * 1024]


def test_expandable_runs_merge_and_split():
    events = [
        ev("segment_map", A, 20 * MiB),
        ev("alloc", A, 1536 * 1024),
        ev("segment_map", A + 20 * MiB, 20 * MiB),  # grows the same run
        ev("alloc", A + 1536 * 1024, 30 * MiB),
        ev("free_completed", A + 1536 * 1024, 30 * MiB),
        ev("segment_unmap", A + 20 * MiB, 20 * MiB),
    ]
    rp = replay_history(events, {"expandable_segments": True}, capture=[4])
    (run,) = rp.maps[4].segments
    assert run.size == 40 * MiB and run.expandable
    assert [(b.size, b.allocated) for b in run.blocks] == [(1536 * 1024, True), (30 * MiB, True), (40 * MiB - 1536 * 1024 - 30 * MiB, False)]
    (after,) = rp.final.segments
    assert after.size == 20 * MiB and rp.final.reserved == 20 * MiB


def test_history_that_starts_mid_run_is_refused():
    with pytest.raises(HistoryGap):
        replay_history([ev("free_completed", A, 4096)])


# ---- the shared H200 traces -----------------------------------------------------------------

FAST = [f"rvc_ec{k}/{n}" for k in (0, 1) for n in (
    "default", "default_cap85", "default_cap95", "expandable", "expandable_cap85", "max_split_128",
    "max_split_512", "roundup4", "roundup_intervals", "gc07_split256_cap115a")]


@pytest.mark.parametrize("name", FAST + ["llm/default_cap85"])
def test_replay_reproduces_the_recorded_final_state_and_peaks(traces_dir, name):
    snap = load(traces_dir, name)
    rp = replay_history(snap["device_traces"][0], snap["allocator_settings"])
    recorded = map_from_snapshot_segments(snap["segments"])
    assert verify_against_segments(rp.final, recorded) == []
    assert rp.final.reserved == recorded.reserved
    assert rp.final.allocated == recorded.allocated
    stats = sidecar(traces_dir, name)["stats"]
    assert rp.peak_reserved == stats["reserved_bytes.all.peak"]
    assert rp.peak_allocated == stats["allocated_bytes.all.peak"]


def test_llm_cap85_oom_explained_with_the_numbers_of_its_message(traces_dir):
    name = "llm/default_cap85"
    d = diagnose_snapshot(traces_dir / f"{name}.pickle.xz", candidates=None)
    msg = sidecar(traces_dir, name)["oom_message"]
    # The rebuilt map agrees with what PyTorch printed at the OOM.
    m = re.search(r"Tried to allocate (\S+ \S+)\..*Of the allocated memory (\S+ \S+) is allocated by PyTorch, "
                  r"and (\S+ \S+) is reserved by PyTorch but unallocated", msg)
    assert m is not None
    assert format_size(d.alloc_size) == m.group(1) == "62.00 MiB"
    assert format_size(d.allocated) == m.group(2) == "2.52 GiB"
    assert format_size(d.reserved_free) == m.group(3) == "410.59 MiB"
    # What the message cannot say.
    assert d.state_source == "replayed-history"
    assert d.verdict == "fragmentation"
    assert d.request == 63776768
    assert d.largest_free == 41820160 < d.request
    assert d.free_blocks == 58
    assert d.pinned_count == 2 and d.pinned_free == 2 * 41820160
    assert all(p.live_blocks == 1 and p.size == 62 * MiB for p in d.pinned)
    assert d.budget == 3197947084 and d.budget_source == "recorded cap"
    assert d.budget - d.reserved < d.alloc_size  # no room for a new 62 MiB segment under the cap


def test_snapshot_written_at_the_oom_is_read_directly(traces_dir):
    """The agent's `--on-oom snapshot` case: `segments` is the state at the OOM, history ends there."""
    snap = load(traces_dir, "llm/default_cap85")
    events = snap["device_traces"][0]
    oom_i = next(i for i, e in enumerate(events) if e["action"] == "oom")
    at_oom = replay_history(events, snap["allocator_settings"], capture=[oom_i]).maps[oom_i]
    fake = {
        "segments": [_snapshot_segment(s) for s in at_oom.segments],
        "device_traces": [events[oom_i - 1000 : oom_i + 1]],  # a wrapped ring: its start is missing
        "allocator_settings": snap["allocator_settings"],
    }
    d = diagnose_snapshot(fake, budget=3197947084, candidates=None)
    assert d.state_source == "snapshot-at-oom"
    assert (d.reserved, d.allocated, d.largest_free, d.pinned_count) == (3135242240, 2704705536, 41820160, 2)
    # The same ring without the final segments cannot be replayed: a clear error, not a guess.
    fake["device_traces"] = [events[oom_i - 1000 :]]
    with pytest.raises(TraceError, match="write the snapshot at the OOM"):
        diagnose_snapshot(fake, candidates=None)


def _snapshot_segment(s):
    return {
        "device": 0,
        "address": s.addr,
        "total_size": s.size,
        "stream": s.stream,
        "segment_type": s.pool,
        "is_expandable": s.expandable,
        "blocks": [
            {"address": b.addr, "size": b.size, "requested_size": b.requested,
             "state": "active_allocated" if b.allocated else "inactive"}
            for b in s.blocks
        ],
    }


def test_what_if_replays_find_the_setting_that_serves_the_request(traces_dir):
    d = diagnose_snapshot(traces_dir / "rvc_ec1/default_cap85.pickle.xz")
    by = {w.config: w for w in d.what_if}
    assert d.what_if[0].config == ""  # the recorded setting first, and the simulator reproduces its OOM
    assert by[""].avoids_oom is False and "reproduces" in by[""].note
    assert by["expandable_segments:True"].avoids_oom is True
    assert by["max_split_size_mb:512"].avoids_oom is False
    assert d.recommendation == "expandable_segments:True"
    # Round trip of the whole diagnosis through its JSON form.
    again = SnapshotDiagnosis.from_dict(json.loads(json.dumps(d.to_dict())))
    assert again == d


def test_snapshot_without_oom_is_a_clear_error(traces_dir):
    with pytest.raises(TraceError, match="no `oom` entry"):
        diagnose_snapshot(traces_dir / "rvc_ec1/default.pickle.xz", candidates=None)


def test_memory_map_round_trip():
    rp = replay_history([ev("segment_alloc", A, 20 * MiB), ev("alloc", A, 3 * MiB)])
    assert MemoryMap.from_dict(json.loads(json.dumps(rp.final.to_dict()))) == rp.final


def test_cli_diagnose_snapshot(traces_dir, tmp_path):
    exe = [sys.executable, "-m", "alloctune"]
    out = subprocess.run(exe + ["diagnose", "--snapshot", str(traces_dir / "llm/default_cap85.pickle.xz"), "--json",
                                "--no-what-if"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["schema"] == "alloctune.snapshot-diagnosis/1"
    assert data["verdict"] == "fragmentation" and data["largest_free"] == 41820160
    bad = tmp_path / "x.pickle"
    bad.write_bytes(b"not a pickle")
    out = subprocess.run(exe + ["diagnose", "--snapshot", str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.startswith("alloctune: error: ") and out.stderr.count("\n") == 1


def _pinned_pattern_snapshot(budget_mib=1024):
    """What `bench/gpu_monitor.sh`'s OOM phase records: 14 segments of 64 MiB, each pinned by a
    24 MiB live block with 40 MiB free behind it, then a 200 MiB request under a 1 GiB cap."""
    events, t = [], [0]

    def e(action, addr, size):
        t[0] += 1
        events.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t[0]})

    base = A + 4096 * MiB
    for i in range(14):
        s = base - i * 64 * MiB  # the driver hands out decreasing addresses
        e("segment_alloc", s, 64 * MiB)
        e("alloc", s, 64 * MiB)
        e("free_requested", s, 64 * MiB)
        e("free_completed", s, 64 * MiB)
        e("alloc", s, 24 * MiB)
        e("alloc", s + 24 * MiB, 40 * MiB)
    for i in range(14):
        s = base - i * 64 * MiB
        e("free_requested", s + 24 * MiB, 40 * MiB)
        e("free_completed", s + 24 * MiB, 40 * MiB)
    events.append({"action": "oom", "device_free": 100 * 1024 * MiB, "size": 200 * MiB, "stream": 0, "time_us": t[0]})
    at_oom = replay_history(events, capture=[len(events) - 1]).maps[len(events) - 1]
    return {"segments": [_snapshot_segment(s) for s in at_oom.segments], "device_traces": [events],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "expandable_segments": False}}


def test_pinned_pattern_of_the_gpu_script():
    d = diagnose_snapshot(_pinned_pattern_snapshot(), budget=1024 * MiB)
    assert d.state_source == "snapshot-at-oom"
    assert d.verdict == "fragmentation"
    assert (d.reserved, d.allocated, d.reserved_free) == (896 * MiB, 336 * MiB, 560 * MiB)
    assert d.request == 200 * MiB and d.largest_free == 40 * MiB and d.free_blocks == 14
    assert d.pinned_count == 14 and d.pinned_free == 560 * MiB
    w = {x.config: x for x in d.what_if}
    assert w[""].avoids_oom is False  # the simulator reproduces the OOM under the recorded setting
    # Only expandable segments can give the free pages behind the pinned blocks back to the driver.
    assert [c for c, x in w.items() if x.avoids_oom] == ["expandable_segments:True"]
    assert d.recommendation == "expandable_segments:True"


def test_wrapped_ring_still_diagnosed_but_not_replayed():
    """A ring that lost its start: the map comes from `segments`, the replays are declined with the reason."""
    snap = _pinned_pattern_snapshot()
    events = snap["device_traces"][0]
    snap["device_traces"] = [events[40:]]  # the first segments' history is gone
    d = diagnose_snapshot(snap, budget=1024 * MiB)
    assert d.state_source == "snapshot-at-oom" and d.pinned_count == 14
    assert all(w.avoids_oom is None and "history not replayable" in w.note for w in d.what_if)
    assert d.recommendation is None
    assert any(line.startswith("no what-if replays: history not replayable") for line in d.evidence)
