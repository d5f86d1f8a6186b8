"""Rule-by-rule tests of the allocator model against the spec's verified GPU probes (§2–§6, §12)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from alloctune.sim.allocator import CachingAllocator
from alloctune.sim.driver import Device, DriverVA
from alloctune.sim.replay import cap_from_budget
from alloctune.sim.settings import SimSettings

MiB = 1 << 20
GiB = 1 << 30


def make(cap: int | None = None, **kw) -> CachingAllocator:
    return CachingAllocator(SimSettings(**kw), cap=cap)


def segs(a: CachingAllocator) -> list[tuple[str, int]]:
    return [(e.action, e.size) for e in a.events if e.action != "oom"]


def test_worked_example_sizes_and_splits():
    """Spec §2.3: 1000 B, 1.5 MiB, 12 MiB+1, 25 MiB on an empty allocator."""
    a = make()
    b1 = a.malloc(1000)
    assert b1.size == 1024
    b2 = a.malloc(int(1.5 * MiB))
    b3 = a.malloc(12 * MiB + 1)
    assert b3.size == 12 * MiB + 512
    assert b3.seg is b2.seg  # reused the 18.5 MiB remainder of the 20 MiB segment
    b4 = a.malloc(25 * MiB)
    assert b4.size == 26 * MiB  # the 1 MiB tail is not split off (must be > 1 MiB)
    assert segs(a) == [("segment_alloc", 2 * MiB), ("segment_alloc", 20 * MiB), ("segment_alloc", 26 * MiB)]
    st_ = a.stats.as_dict()
    assert st_["reserved_bytes.all.current"] == 48 * MiB
    assert st_["allocated_bytes.all.current"] == 41_420_288
    assert st_["requested_bytes.all.current"] == 1000 + int(1.5 * MiB) + 12 * MiB + 1 + 25 * MiB
    assert st_["inactive_split.all.current"] == 2
    assert st_["inactive_split_bytes.all.current"] == 8_911_360
    assert st_["segment.all.current"] == 3
    a.check()


def test_empty_cache_frees_idle_segments_large_ascending_then_small():
    a = make()
    blocks = [a.malloc(n) for n in (1000, 30 * MiB, 12 * MiB)]
    for b in blocks:
        a.free(b)
    a.check()
    assert a.stats.inactive_split == 0
    a.events.clear()
    a.empty_cache()
    assert segs(a) == [("segment_free", 12 * MiB), ("segment_free", 30 * MiB), ("segment_free", 2 * MiB)]
    assert a.stats.reserved == 0 and a.stats.num_device_free == 3 and a.stats.num_sync_all_streams == 1


def test_split_remainder_rules_small_vs_large():
    a = make()
    s = a.malloc(2 * MiB - 512)  # small? no: > 1 MiB -> large pool, 20 MiB segment
    assert not s.seg.small and s.seg.size == 20 * MiB
    t = a.malloc(1 * MiB)  # small pool: 2 MiB segment split, remainder 1 MiB >= 512 B
    assert t.seg.small and t.size == MiB and t.next is not None and t.next.size == MiB
    # large: 19 MiB + 1 KiB in a 20 MiB segment leaves < 1 MiB: not split
    a2 = make()
    u = a2.malloc(19 * MiB + 1024)
    assert u.size == 20 * MiB and u.next is None


@pytest.mark.parametrize(
    "size,expected",
    [(1200, 1536), (2049, 2560), (3 * MiB + 1, 3 * MiB + MiB // 2), (100 * MiB + 1, 112 * MiB), (100, 512), (4096, 4096)],
)
def test_roundup_single_form(size, expected):
    assert make(roundup_power2_divisions=(4,) * 16).round_size(size) == expected


@pytest.mark.parametrize(
    "size_mb,expected",
    [(100, 100 * MiB + 512), (300, 300 * MiB + 512), (600, 768 * MiB), (1100, 1280 * MiB), (2100, 2304 * MiB)],
)
def test_roundup_list_form(size_mb, expected):
    # [256:1,512:2,1024:4,>:8] as torch 2.10+ builds the table
    table = (1,) * 9 + (2, 4) + (8,) * 5
    assert make(roundup_power2_divisions=table).round_size(size_mb * MiB + 1) == expected


def test_default_rounding_is_512_multiple():
    a = make()
    assert [a.round_size(n) for n in (1, 511, 512, 513, 10 * MiB + 1)] == [512, 512, 512, 1024, 10 * MiB + 512]


def _cached_200(a: CachingAllocator):
    b = a.malloc(200 * MiB)
    a.free(b)
    a.events.clear()


def test_max_split_rules_a_and_b():
    """§12 probe max_split (100 MiB): 185 reuses the cached 200, 150 does not, 50 never takes it."""
    a = make(max_split_size=100 * MiB)
    _cached_200(a)
    b = a.malloc(185 * MiB)
    assert segs(a) == [] and b.size == 200 * MiB  # whole block, no split (oversize)
    a.free(b)
    b = a.malloc(150 * MiB)
    assert segs(a) == [("segment_alloc", 150 * MiB)]
    a.free(b)
    a.events.clear()
    c = a.malloc(50 * MiB)  # rule A: not from oversize blocks
    assert segs(a) == [("segment_alloc", 50 * MiB)] and c.seg.size == 50 * MiB


def test_max_non_split_rounding():
    a = make(max_split_size=100 * MiB, max_non_split_rounding=60 * MiB)
    _cached_200(a)
    a.malloc(150 * MiB)
    assert segs(a) == []


def test_large_segment_size_211_only():
    assert make(large_segment_size=12 * MiB).malloc(int(1.5 * MiB)).seg.size == 12 * MiB
    old = CachingAllocator(SimSettings(large_segment_size=12 * MiB, torch=(2, 10)))
    assert old.malloc(int(1.5 * MiB)).seg.size == 20 * MiB


def test_cap_uses_segment_size_and_ooms():
    """A 5 MiB request with 10 MiB headroom fails: the cap check uses the 20 MiB alloc_size."""
    a = make(cap=100 * MiB)
    big = a.malloc(90 * MiB)
    assert big is not None
    assert a.malloc(5 * MiB) is None
    oom = a.oom
    assert oom.alloc_size == 20 * MiB and oom.rounded == 5 * MiB and oom.reserved == 90 * MiB
    assert a.stats.num_ooms == 1 and a.stats.num_alloc_retries == 1
    assert a.events[-1].action == "oom" and a.events[-1].size == 5 * MiB


def _scenario(mss):
    a = make(cap=GiB, max_split_size=mss)
    x, y, s = a.malloc(300 * MiB), a.malloc(300 * MiB), a.malloc(1000)
    for b in (x, y, s):
        a.free(b)
    a.events.clear()
    return a


def test_release_available_frees_just_the_oversize_blocks():
    a = _scenario(200 * MiB)
    assert a.malloc(500 * MiB) is not None
    assert segs(a) == [("segment_free", 300 * MiB), ("segment_free", 300 * MiB), ("segment_alloc", 500 * MiB)]
    assert a.stats.num_alloc_retries == 0


def test_release_all_without_max_split():
    a = _scenario(None)
    assert a.malloc(500 * MiB) is not None
    assert sorted(segs(a)[:3]) == [("segment_free", 2 * MiB), ("segment_free", 300 * MiB), ("segment_free", 300 * MiB)]
    assert segs(a)[3] == ("segment_alloc", 500 * MiB)
    assert a.stats.num_alloc_retries == 1 and a.stats.num_sync_all_streams == 1


def test_gc_frees_all_blocks_of_equal_age():
    """§12 probe gc: cap 8 GiB, threshold 0.5, 10 idle 500 MiB segments, 600 MiB request."""
    a = make(cap=8 * GiB, garbage_collection_threshold=0.5)
    blocks = [a.malloc(500 * MiB) for _ in range(10)]
    for b in blocks:
        a.free(b)
    a.events.clear()
    a.malloc(600 * MiB)
    assert segs(a) == [("segment_free", 500 * MiB)] * 10 + [("segment_alloc", 600 * MiB)]
    assert a.stats.segments == 1


def test_gc_needs_a_cap_below_total_from_210():
    total = 150_109_880_320
    assert cap_from_budget(total, total, (2, 11)) is None  # fraction 1.0: no cap, so no GC
    assert cap_from_budget(total, total, (2, 9)) == total
    assert cap_from_budget(8 * GiB, total, (2, 11)) == int((8 * GiB / total) * total)


def _tie(torch):
    """Two equal free 30 MiB blocks: the newer segment sits at the lower address (H200)."""
    a = CachingAllocator(SimSettings(torch=torch), device=Device(addresses=DriverVA()))
    old = a.malloc(30 * MiB)
    new = a.malloc(30 * MiB)
    assert new.addr < old.addr
    a.free(old)
    a.free(new)
    return a.malloc(30 * MiB).seg, old.seg, new.seg


def test_tiebreak_lowest_address_211_oldest_segment_213():
    chosen, old, new = _tie((2, 11))
    assert chosen is new
    chosen, old, new = _tie((2, 13))
    assert chosen is old


def test_streams_do_not_share_blocks():
    a = make()
    b = a.malloc(30 * MiB, stream=0)
    a.free(b)
    a.events.clear()
    c = a.malloc(30 * MiB, stream=7)
    assert segs(a) == [("segment_alloc", 30 * MiB)] and c.seg.stream == 7


def test_expandable_probe():
    """§6 verified probe: map 20 MiB pages, extend the free tail, small pool 2 MiB, unmap on empty_cache."""
    a = make(expandable_segments=True)
    x = a.malloc(int(1.5 * MiB))
    assert segs(a) == [("segment_map", 20 * MiB)]
    assert a.stats.reserved == 20 * MiB and a.stats.segments == 0
    y = a.malloc(30 * MiB)
    assert segs(a)[1:] == [("segment_map", 20 * MiB)]
    assert a.stats.reserved == 40 * MiB
    assert (x.size, y.size, y.next.size, y.next.allocated) == (int(1.5 * MiB), 30 * MiB, int(8.5 * MiB), False)
    assert y.addr == x.addr + x.size
    z = a.malloc(1000)
    assert segs(a)[2:] == [("segment_map", 2 * MiB)] and a.stats.reserved == 42 * MiB
    a.check()
    for b in (x, y, z):
        a.free(b)
    a.events.clear()
    a.empty_cache()
    assert segs(a) == [("segment_unmap", 40 * MiB), ("segment_unmap", 2 * MiB)]
    assert a.stats.reserved == 0 and a.stats.num_device_free == 2
    assert a.segments == {}  # whole virtual ranges released


def test_expandable_unmaps_only_whole_free_pages():
    a = make(expandable_segments=True)
    x = a.malloc(30 * MiB)  # 2 pages mapped (40 MiB)
    y = a.malloc(5 * MiB)  # fits in the 10 MiB tail
    a.free(x)
    a.events.clear()
    a.empty_cache()
    # x occupied [0, 30): only page 0 lies wholly inside the free range
    assert segs(a) == [("segment_unmap", 20 * MiB)]
    assert a.stats.reserved == 20 * MiB
    a.check()
    a.free(y)
    a.empty_cache()
    assert a.stats.reserved == 0


def test_device_full_triggers_release_and_retry():
    dev = Device(total_memory=1 * GiB, overhead=0)
    a = CachingAllocator(SimSettings(), device=dev)
    b = a.malloc(600 * MiB)
    a.free(b)
    a.events.clear()
    assert a.malloc(700 * MiB) is not None
    assert segs(a) == [("segment_free", 600 * MiB), ("segment_alloc", 700 * MiB)]
    assert a.stats.num_alloc_retries == 1
    assert a.malloc(400 * MiB) is None and a.oom.device_free == 1 * GiB - 700 * MiB


@hsettings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(1, 40 * MiB), st.integers(0, 1), st.integers(0, 10**6)),
        min_size=1,
        max_size=120,
    ),
    st.sampled_from([{}, {"max_split_size": 20 * MiB}, {"expandable_segments": True},
                     {"roundup_power2_divisions": (4,) * 16}]),
)
def test_random_sequences_keep_invariants(ops, kw):
    a = make(**kw)
    live = []
    for is_alloc, size, stream, pick in ops:
        if is_alloc or not live:
            b = a.malloc(size, stream)
            assert b is not None and b.size >= size
            live.append(b)
        else:
            a.free(live.pop(pick % len(live)))
        a.check()
    for b in live:
        a.free(b)
    a.empty_cache()
    a.check()
    assert a.stats.reserved == 0 and a.stats.allocated == 0 and a.stats.inactive_split_bytes == 0


@hsettings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 9), st.integers(1, 60 * MiB), st.integers(0, 1), st.integers(0, 10**6)),
        min_size=1,
        max_size=150,
    ),
    st.sampled_from([
        {"garbage_collection_threshold": 0.5, "max_split_size": 20 * MiB},
        {"garbage_collection_threshold": 0.8},
        {"max_split_size": 40 * MiB, "expandable_segments": True},
        {"expandable_segments": True},
        {},
    ]),
)
def test_slow_paths_under_a_cap_keep_invariants(ops, kw):
    """Under a tight cap every path runs (GC, oversize release, release-all, OOM); state stays sound."""
    a = make(cap=200 * MiB, **kw)
    # the cap check uses the cudaMalloc-sized request; expandable segments then map whole
    # 20 MiB pages, so PyTorch itself can end up to a page above the cap
    limit = 200 * MiB + (20 * MiB if kw.get("expandable_segments") else 0)
    live = []
    for kind, size, stream, pick in ops:
        if kind == 0:
            a.empty_cache()
        elif kind <= 5 or not live:
            b = a.malloc(size, stream)
            if b is None:
                assert a.oom is not None and a.oom.size == size
                assert a.stats.reserved <= limit
            else:
                live.append(b)
        else:
            a.free(live.pop(pick % len(live)))
        a.check()
        assert a.stats.reserved <= limit
    for b in live:
        a.free(b)
    a.empty_cache()
    a.check()
    assert a.stats.reserved == 0
