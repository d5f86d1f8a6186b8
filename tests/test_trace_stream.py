"""Request-stream rules (trace/stream.py) on hand-made histories and on the shared H200 traces."""

from __future__ import annotations

import re

import pytest

from alloctune.trace import ALLOC, EMPTY_CACHE, FAILED_ALLOC, FREE, load_trace
from alloctune.trace.stream import build_stream, requested_live_peak

MiB = 1024 * 1024
A, B, C = 0x1000_0000, 0x2000_0000, 0x3000_0000


def ev(action, addr=0, size=0, stream=0, **extra):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0, **extra}


def ops(built):
    return list(zip(built.requests.ops, built.requests.sizes, built.requests.rids))


def test_free_is_taken_at_free_completed_not_free_requested():
    # record_stream: the block is freed by the program first, returned to the pool later.
    events = [
        ev("segment_alloc", A, 20 * MiB),
        ev("alloc", A, 3 * MiB),
        ev("free_requested", A, 3 * MiB),
        ev("alloc", A + 3 * MiB, 100),
        ev("free_completed", A, 3 * MiB),
    ]
    b = build_stream(events)
    assert ops(b) == [(ALLOC, 3 * MiB, 0), (ALLOC, 100, 1), (FREE, 3 * MiB, 0)]
    assert b.requests.event_index == [1, 3, 4]


def test_rids_follow_address_reuse_and_streams_are_kept():
    events = [
        ev("segment_alloc", A, 2 * MiB, stream=0),
        ev("segment_alloc", B, 2 * MiB, stream=7),
        ev("alloc", A, 512, stream=0),
        ev("alloc", B, 512, stream=7),
        ev("free_completed", B, 512, stream=7),
        ev("alloc", B, 100, stream=7),
        ev("free_completed", A, 512, stream=0),
    ]
    b = build_stream(events)
    assert ops(b) == [(ALLOC, 512, 0), (ALLOC, 512, 1), (FREE, 512, 1), (ALLOC, 100, 2), (FREE, 512, 0)]
    assert b.requests.streams == [0, 7, 7, 7, 0]
    assert b.unmatched_frees == 0


def test_oom_becomes_failed_alloc_with_its_segment_event():
    events = [
        ev("segment_alloc", A, 20 * MiB),
        ev("alloc", A, 5 * MiB),
        {"action": "oom", "device_free": 1234, "size": 63776768, "stream": 0, "time_us": 0},
    ]
    b = build_stream(events)
    assert ops(b) == [(ALLOC, 5 * MiB, 0), (FAILED_ALLOC, 63776768, -1)]
    oom = b.segment_events[-1]
    assert (oom.action, oom.addr, oom.size, oom.request_index, oom.event_index) == ("oom", 0, 63776768, 1, 2)
    assert oom.device_free == 1234 and oom.to_dict()["device_free"] == 1234


def _cache_then(follow):
    """Two idle segments are released, then `follow` happens."""
    return [
        ev("segment_alloc", A, 20 * MiB),
        ev("segment_alloc", B, 20 * MiB),
        ev("alloc", A, 10),
        ev("free_completed", A, 10),
        ev("alloc", B, 10),
        ev("free_completed", B, 10),
        ev("segment_free", A, 20 * MiB),
        ev("segment_free", B, 20 * MiB),
        *follow,
    ]


def test_release_burst_followed_by_a_cached_alloc_is_empty_cache():
    b = build_stream(_cache_then([ev("alloc", C, 10)]))
    assert [o for o, _, _ in ops(b)] == [ALLOC, FREE, ALLOC, FREE, EMPTY_CACHE, ALLOC]
    assert b.empty_cache_bursts == [4]
    assert [e.request_index for e in b.segment_events] == [0, 0, 4, 4]
    assert b.requests.sizes[4] == -1 and b.requests.rids[4] == -1


def test_release_burst_at_end_of_trace_is_empty_cache():
    assert build_stream(_cache_then([])).requests.ops[-1] == EMPTY_CACHE


def test_release_burst_before_a_segment_the_run_could_hold_is_empty_cache():
    # The run once held 60 MiB; 40 MiB held before the second burst + a new 20 MiB segment = 60 MiB:
    # cudaMalloc cannot have failed there, so the allocator had no reason to release anything.
    events = [
        ev("segment_alloc", A, 20 * MiB),
        ev("segment_alloc", B, 20 * MiB),
        ev("segment_alloc", C, 20 * MiB),
        ev("alloc", C, 10),
        ev("free_completed", C, 10),
        ev("segment_free", C, 20 * MiB),  # first empty_cache(): a cached alloc follows
        ev("alloc", A, 10),
        ev("free_completed", A, 10),
        ev("segment_free", A, 20 * MiB),  # second empty_cache(): a new segment follows
        ev("segment_free", B, 20 * MiB),
        ev("segment_alloc", C, 20 * MiB),
        ev("alloc", C, 5 * MiB),
    ]
    b = build_stream(events)
    assert b.requests.ops == [ALLOC, FREE, EMPTY_CACHE, ALLOC, FREE, EMPTY_CACHE, ALLOC]
    assert [e.request_index for e in b.segment_events] == [0, 0, 0, 2, 5, 5, 6]


def test_release_burst_before_a_segment_beyond_the_peak_is_the_allocators():
    # 40 MiB reserved before the burst + 60 MiB > 40 MiB peak: the retry-after-release path.
    b = build_stream(_cache_then([ev("segment_alloc", C, 60 * MiB), ev("alloc", C, 59 * MiB)]))
    assert EMPTY_CACHE not in b.requests.ops
    assert [e.request_index for e in b.segment_events][-3:] == [4, 4, 4]  # all belong to the new alloc
    assert b.requests.ops[4] == ALLOC


def test_release_burst_with_gc_enabled_stays_with_the_allocator():
    follow = [ev("segment_alloc", C, 20 * MiB), ev("alloc", C, 5 * MiB)]
    b = build_stream(_cache_then(follow), {"garbage_collection_threshold": 0.7})
    assert EMPTY_CACHE not in b.requests.ops


def test_release_burst_before_oom_is_the_allocators():
    oom = {"action": "oom", "device_free": 0, "size": 30 * MiB, "stream": 0, "time_us": 0}
    b = build_stream(_cache_then([oom]))
    assert b.requests.ops[-1] == FAILED_ALLOC and EMPTY_CACHE not in b.requests.ops
    assert [e.request_index for e in b.segment_events][-3:] == [4, 4, 4]


def test_expandable_unmap_burst_is_empty_cache():
    events = [
        ev("segment_map", A, 20 * MiB),
        ev("alloc", A, 10),
        ev("free_completed", A, 10),
        ev("segment_unmap", A, 20 * MiB),
        ev("free_requested", 0, 0),
    ]
    assert build_stream(events).requests.ops == [ALLOC, FREE, EMPTY_CACHE]


def test_requested_live_peak():
    b = build_stream(_cache_then([ev("alloc", C, 7), ev("alloc", C + 512, 9), ev("free_completed", C, 7)]))
    assert requested_live_peak(b.requests) == 16


# ---- the shared H200 traces ------------------------------------------------------------------


def test_rvc_ec1_infers_one_empty_cache_per_chunk(traces_dir):
    t = load_trace(traces_dir / "rvc_ec1" / "default.pickle.xz")
    req = t.requests
    positions = [i for i, op in enumerate(req.ops) if op == EMPTY_CACHE]
    assert len(positions) == 16 == t.meta["items_done"]
    # Each call sits between chunks: the program still holds its model and frees the chunk's leftovers next.
    for p in positions:
        assert req.ops[p - 1] == FREE
        assert t.events[req.event_index[p]]["action"] == "segment_free"
    # Every recorded release belongs to one of those calls (no malloc ever had to free memory here).
    released = [e for e in t.segment_events if e.action == "segment_free"]
    assert len(released) == 102
    assert {e.request_index for e in released} == set(positions)


def test_rvc_ec0_infers_none(traces_dir):
    t = load_trace(traces_dir / "rvc_ec0" / "default.pickle.xz")
    assert t.requests.count(EMPTY_CACHE) == 0
    ec1 = load_trace(traces_dir / "rvc_ec1" / "default.pickle.xz")
    without = [(o, s, r) for o, s, r, _ in ec1.requests if o != EMPTY_CACHE]
    assert without == [(o, s, r) for o, s, r, _ in t.requests]  # same program minus the calls


RVC = [f"{w}/{n}" for w in ("rvc_ec0", "rvc_ec1") for n in (
    "default", "default_cap85", "default_cap95", "expandable", "expandable_cap85", "expandable_cap95",
    "gc07_split256_cap115a", "max_split_128", "max_split_512", "roundup4", "roundup_intervals")]


@pytest.mark.parametrize("name", RVC + ["llm/default_cap85", "llm/gc07_split256_cap115a"])
def test_inferred_calls_and_recorded_counts_match_memory_stats(traces_dir, name):
    """empty_cache() calls = num_sync_all_streams - num_alloc_retries (each call or retry syncs once)."""
    t = load_trace(traces_dir / f"{name}.pickle.xz")
    stats = t.meta["stats"]
    assert t.requests.count(EMPTY_CACHE) == stats["num_sync_all_streams"] - stats["num_alloc_retries"]
    assert t.requests.count(FAILED_ALLOC) == stats["num_ooms"]
    grows = sum(e.action in ("segment_alloc", "segment_map") for e in t.segment_events)
    releases = sum(e.action in ("segment_free", "segment_unmap") for e in t.segment_events)
    assert (grows, releases) == (stats["num_device_alloc"], stats["num_device_free"])
    assert requested_live_peak(t.requests) == stats["requested_bytes.all.peak"]


def test_oom_size_is_the_rounded_request(traces_dir):
    """`oom.size` = round_size(request): a multiple of 512 whose 2 MiB alloc_size is the message's number."""
    t = load_trace(traces_dir / "llm" / "default_cap85.pickle.xz")
    (oom,) = [e for e in t.segment_events if e.action == "oom"]
    assert oom.size == 63776768 and oom.size % 512 == 0
    assert oom.device_free == 94043897856
    alloc_size = -(-oom.size // (2 * MiB)) * 2 * MiB
    tried = re.search(r"Tried to allocate ([\d.]+) MiB", t.meta["oom_message"]).group(1)
    assert f"{alloc_size / MiB:.2f}" == tried == "62.00"
    assert t.requests.ops[oom.request_index] == FAILED_ALLOC
    assert t.requests.sizes[oom.request_index] == oom.size
    many = load_trace(traces_dir / "rvc_ec1" / "default_cap85.pickle.xz")
    sizes = [e.size for e in many.segment_events if e.action == "oom"]
    assert len(sizes) == 1881 and all(s % 512 == 0 for s in sizes)


# ---- limit-aware inference and the agent's marks (#18.6) -------------------------------------
from alloctune.trace.stream import Limit, stream_context  # noqa: E402

GiB = 1024 * MiB
H200 = 150109880320


def test_uncapped_empty_cache_before_a_larger_segment_is_the_programs():
    # 40 MiB held, a 60 MiB segment follows: beyond the run's peak, but far within an H200, whose
    # cudaMalloc could not have failed -- so the allocator had no reason to release anything.
    follow = [ev("segment_alloc", C, 60 * MiB), ev("alloc", C, 59 * MiB)]
    b = build_stream(_cache_then(follow), limit=Limit(total_memory=H200, capped=False))
    assert b.requests.ops[4] == EMPTY_CACHE and b.empty_cache_bursts == [4]
    assert [e.request_index for e in b.segment_events][-3:] == [4, 4, 5]


def test_under_a_cap_the_burst_is_the_allocators_only_beyond_the_cap():
    follow = [ev("segment_alloc", C, 60 * MiB), ev("alloc", C, 59 * MiB)]
    tight = build_stream(_cache_then(follow), limit=Limit(cap=80 * MiB, capped=True))  # 40 + 60 > 80
    assert EMPTY_CACHE not in tight.requests.ops
    roomy = build_stream(_cache_then(follow), limit=Limit(cap=100 * MiB, capped=True))  # 40 + 60 <= 100
    assert EMPTY_CACHE in roomy.requests.ops


def test_gc_releases_only_under_a_cap_and_above_its_threshold():
    follow = [ev("segment_alloc", C, 20 * MiB), ev("alloc", C, 5 * MiB)]
    gc = {"garbage_collection_threshold": 0.7}
    uncapped = build_stream(_cache_then(follow), gc, limit=Limit(total_memory=H200, capped=False))
    assert EMPTY_CACHE in uncapped.requests.ops  # GC never runs without a cap
    below = build_stream(_cache_then(follow), gc, limit=Limit(cap=100 * MiB, capped=True))  # 40 <= 70
    assert EMPTY_CACHE in below.requests.ops
    above = build_stream(_cache_then(follow), gc, limit=Limit(cap=50 * MiB, capped=True))  # 40 > 35
    assert EMPTY_CACHE not in above.requests.ops


def test_limit_from_the_run_record():
    assert Limit.from_meta({"cap": 0, "total_memory": H200}).bytes == H200 - 512 * MiB
    assert Limit.from_meta({"cap": 3 * GiB, "total_memory": H200}).bytes == 3 * GiB
    assert Limit.from_meta({}).bytes is None and Limit.from_meta({}).capped is None


def _timed(events):
    return [{**e, "time_us": 1000 * (k + 1)} for k, e in enumerate(events)]


def test_marks_place_a_call_that_released_nothing():
    events = _timed([ev("segment_alloc", A, 20 * MiB), ev("alloc", A, 10), ev("free_completed", A, 10),
                     ev("alloc", A, 20)])
    inferred = build_stream(events)
    assert EMPTY_CACHE not in inferred.requests.ops  # invisible without marks
    b = build_stream(events, marks=[[3100, 3150]])  # called between the free (3000) and the alloc (4000)
    assert b.marked and b.unmatched_marks == 0
    assert b.requests.ops == [ALLOC, FREE, EMPTY_CACHE, ALLOC] and b.marked_calls == [2]
    assert build_stream(events, marks=[[5000, 5001]]).requests.ops[-1] == EMPTY_CACHE  # after the last event


def test_marks_decide_every_burst_before_a_new_segment():
    # Two bursts, each right before a new segment: the ambiguous case. The generous device limit
    # makes the inference call both the program's; the marks say only the first one was.
    first = _cache_then([ev("segment_alloc", C, 20 * MiB), ev("alloc", C, 10), ev("free_completed", C, 10)])
    events = _timed(first + [ev("segment_free", C, 20 * MiB), ev("segment_alloc", A, 20 * MiB), ev("alloc", A, 10)])
    limit = Limit(total_memory=H200, capped=False)
    assert build_stream(events, limit=limit).requests.count(EMPTY_CACHE) == 2
    b = build_stream(events, limit=limit, marks=[[7000, 8000]])  # the first burst: events 7-8 (time 7000, 8000)
    assert b.requests.count(EMPTY_CACHE) == 1 and b.empty_cache_bursts == b.marked_calls == [4]
    none = build_stream(events, limit=limit, marks=[])  # the agent saw no call: both are the allocator's
    assert none.requests.count(EMPTY_CACHE) == 0


def test_with_marks_a_burst_no_malloc_follows_stays_the_programs():
    events = _timed(_cache_then([ev("alloc", C, 10)]))  # released, then a cached alloc: no malloc slow path
    b = build_stream(events, marks=[])
    assert b.requests.count(EMPTY_CACHE) == 1 and b.marked_calls == []


def test_malformed_marks_are_one_trace_error():
    from alloctune.errors import TraceError

    with pytest.raises(TraceError, match="start_us, end_us"):
        stream_context({"alloctune_empty_cache_calls": [[1, "x"]]}, {})
    assert stream_context({}, {"cap": 0})["marks"] is None


# ---- the ambiguous burst, decided by the recording's own layout (`_CacheView`) ---------------------------------
PLAIN = {"max_split_size": -1, "expandable_segments": False}


def _held_then_burst(seg_a=100 * MiB, stream_a=0, request=50 * MiB, settings=PLAIN, live_in_a=10 * MiB):
    """A (seg_a, one live allocation at its start unless live_in_a is 0) and an idle B are held; B is
    released just before a new segment C whose request would fit A's free block."""
    events = [ev("segment_alloc", A, seg_a, stream_a)]
    if live_in_a:
        events.append(ev("alloc", A, live_in_a, stream_a))
    events += [
        ev("segment_alloc", B, 20 * MiB),
        ev("alloc", B, 10),
        ev("free_completed", B, 10),
        ev("segment_free", B, 20 * MiB),
        ev("segment_alloc", C, -(-request // (2 * MiB)) * 2 * MiB),
        ev("alloc", C, request),
    ]
    return build_stream(events, settings)


def test_a_burst_before_a_request_a_cached_block_could_serve_is_empty_cache():
    """The allocator releases only after its search of the cache failed; A's 90 MiB free block fits the 50 MiB
    request, so the release before it is the program's, though reserved + the new segment is past the peak."""
    assert EMPTY_CACHE in _held_then_burst().requests.ops
    assert EMPTY_CACHE not in _held_then_burst(settings={}).requests.ops  # settings unknown: nothing proven


def test_a_cached_block_of_another_stream_proves_nothing():
    assert EMPTY_CACHE not in _held_then_burst(stream_a=7).requests.ops


def test_a_gap_after_an_allocation_counts_its_possible_unsplit_tail():
    # 60 MiB segment, 10 MiB live: a 50 MiB gap may be 49 MiB of free block (the tail of the live block)
    assert EMPTY_CACHE not in _held_then_burst(seg_a=60 * MiB, request=50 * MiB - 4096).requests.ops
    assert EMPTY_CACHE in _held_then_burst(seg_a=60 * MiB, request=48 * MiB).requests.ops


def test_the_split_rules_decide_which_cached_block_a_request_may_take():
    split = {"max_split_size": 64 * MiB, "expandable_segments": False}
    # a request at or above the split limit takes a whole block only under its size + 20 MiB
    assert EMPTY_CACHE not in _held_then_burst(seg_a=100 * MiB, request=70 * MiB, settings=split,
                                               live_in_a=0).requests.ops
    assert EMPTY_CACHE in _held_then_burst(seg_a=80 * MiB, request=70 * MiB, settings=split,
                                           live_in_a=0).requests.ops
    # a request below the limit never takes a block at or above it
    assert EMPTY_CACHE not in _held_then_burst(seg_a=100 * MiB, request=30 * MiB, settings=split,
                                               live_in_a=0).requests.ops


def test_garbage_collection_never_frees_a_small_pool_segment():
    # the run held 82 MiB, then 42 (D released by an empty_cache() a cached alloc follows); the burst frees
    # B and, in one case, the small segment C, then a new 20 MiB segment stays within what the run held:
    # with GC on, a burst GC could have made stays with the allocator, one that frees a small segment does not
    D = 0x4000_0000

    def burst(small: bool):
        events = [ev("segment_alloc", A, 20 * MiB), ev("segment_alloc", B, 20 * MiB),
                  ev("segment_alloc", C, 2 * MiB), ev("alloc", C, 512), ev("free_completed", C, 512),
                  ev("segment_alloc", D, 40 * MiB), ev("alloc", D, 30 * MiB), ev("free_completed", D, 30 * MiB),
                  ev("segment_free", D, 40 * MiB), ev("alloc", A, 10), ev("free_completed", A, 10),
                  ev("alloc", B, 10), ev("free_completed", B, 10)]
        events += [ev("segment_free", C, 2 * MiB)] if small else []
        events += [ev("segment_free", B, 20 * MiB), ev("segment_alloc", B, 20 * MiB), ev("alloc", B, 5 * MiB)]
        return build_stream(events, {"garbage_collection_threshold": 0.7})
    assert burst(small=True).requests.ops.count(EMPTY_CACHE) == 2
    assert burst(small=False).requests.ops.count(EMPTY_CACHE) == 1  # D's release only


@pytest.mark.parametrize("name", ["default_cap90", "gc06_split64_cap100"])
def test_capped_random_recordings_replay_exactly(name):
    """A seeded random program on two streams with empty_cache() calls, recorded on an H100 under a cap by
    `python bench/gpu.py simulate` (bench/gpu_trace.py synth): replayed with its own stream, every segment
    event and the recorded statistics agree. Before the layout rule and the small-pool rule, each had one
    empty_cache() read as the allocator's release and diverged there (segment events #661 and #1777)."""
    from pathlib import Path

    from alloctune.sim import SimSettings
    from alloctune.sim.addresses import replay_addresses
    from alloctune.sim.compare import compare
    from alloctune.sim.replay import replay

    t = load_trace(Path(__file__).parent / "data" / "synth_cap" / f"{name}.pickle.xz")
    addresses, reference = replay_addresses("trace", t, t)
    res = replay(t, SimSettings.from_allocator_settings(t.allocator_settings), budget=t.meta["cap"],
                 addresses=addresses, reference=reference)
    fid = compare(res, t, explain=False)
    assert fid.exact, fid.verdict
    assert res.peak_reserved == t.meta["stats"]["reserved_bytes.all.peak"]


def test_a_call_that_released_nothing_does_not_claim_the_allocators_burst_after_it():
    # The program calls empty_cache() while its one segment is in use (nothing to release), frees the
    # tensor, then asks for more: the allocator releases the idle segment before cudaMalloc. The
    # release lies within the clocks' tolerance of the call, but a request of the program separates them.
    events = [ev("segment_alloc", A, 20 * MiB), ev("alloc", A, 10), ev("free_completed", A, 10),
              ev("segment_free", A, 20 * MiB), ev("segment_alloc", B, 40 * MiB), ev("alloc", B, 30 * MiB)]
    times = [1000, 1010, 1100, 1150, 1160, 1160]
    events = [{**e, "time_us": t} for e, t in zip(events, times)]
    b = build_stream(events, marks=[[1050, 1052]])
    assert b.requests.ops == [ALLOC, EMPTY_CACHE, FREE, ALLOC] and b.marked_calls == [1]
    assert [e.request_index for e in b.segment_events] == [0, 3, 3]  # the release is the malloc's


def test_a_mark_takes_the_burst_inside_it_over_one_just_before():
    # Two bursts within the tolerance of one call: the allocator's, 195 us before the call began, and
    # the call's own, inside its interval.
    follow = [ev("segment_alloc", C, 60 * MiB), ev("alloc", C, 59 * MiB), ev("free_completed", C, 59 * MiB),
              ev("segment_free", C, 60 * MiB)]
    events = _cache_then(follow)
    times = [1000, 1001, 1002, 1003, 1004, 1005, 2085, 2085, 2090, 2090, 2100, 2290]
    events = [{**e, "time_us": t} for e, t in zip(events, times)]
    b = build_stream(events, marks=[[2280, 2300]])
    assert b.requests.count(EMPTY_CACHE) == 1 and b.marked_calls == [len(b.requests.ops) - 1]
