"""Janitor: empties the cache only when a trigger fires; counts clean-ups and bytes released."""

from __future__ import annotations

import logging

import pytest

from alloctune.guard import Janitor, JanitorStep, JanitorTotals, stats
from alloctune.units import GiB, MiB


pytestmark = pytest.mark.usefixtures("fresh_guard_stats")


class FakeCache:
    """Stands in for the CUDA caching allocator's counters (`torch.cuda.memory_stats()` keys).

    `empty_cache()` releases the idle bytes that are not inactive split blocks: those sit in
    segments that still hold live tensors and cannot be returned, as in the real allocator.
    """

    def __init__(self, reserved=0, allocated=0, inactive_split=0, peak=None):
        self.reserved = reserved
        self.allocated = allocated
        self.inactive_split = inactive_split
        self.peak = allocated if peak is None else peak
        self.empty_calls = 0

    def stats(self):
        return {
            "reserved_bytes.all.current": self.reserved,
            "allocated_bytes.all.current": self.allocated,
            "allocated_bytes.all.peak": self.peak,
            "inactive_split_bytes.all.current": self.inactive_split,
        }

    def empty_cache(self):
        self.empty_calls += 1
        self.reserved = self.allocated + self.inactive_split


def janitor(cache: FakeCache, **kw) -> Janitor:
    return Janitor(stats_fn=cache.stats, empty_cache=cache.empty_cache, **kw)


def test_leaves_the_cache_alone_below_the_thresholds():
    cache = FakeCache(reserved=3 * GiB, allocated=2 * GiB + 600 * MiB)
    j = janitor(cache, max_cached="512MiB", max_inactive_ratio=0.5)
    for _ in range(50):
        step = j.step()
    assert step == JanitorStep(50, False, None, 3 * GiB, 2 * GiB + 600 * MiB, 0, 3 * GiB, 0)
    assert cache.empty_calls == 0
    assert j.totals == JanitorTotals(50, 0, 0, {})


def test_max_cached_trigger_and_bytes_released(caplog):
    cache = FakeCache(reserved=6 * GiB, allocated=1 * GiB)
    j = janitor(cache, max_cached="1GiB")
    with caplog.at_level(logging.INFO, logger="alloctune.guard"):
        step = j.step()
    assert (step.cleaned, step.reason, step.released, step.reserved_after) == (True, "max_cached", 5 * GiB, 1 * GiB)
    assert cache.empty_calls == 1
    assert j.step().cleaned is False  # nothing idle any more
    assert (j.cleanups, j.bytes_released, j.requests) == (1, 5 * GiB, 2)
    snap = stats.snapshot()
    assert (snap.cleanups, snap.janitor_cleanups, snap.bytes_released) == (1, 1, 5 * GiB)
    msgs = [r.getMessage() for r in caplog.records if r.name == "alloctune.guard"]
    assert msgs == ["janitor: empty_cache after request 1 (max_cached): reserved 6.00 GiB -> 1024.00 MiB, released 5.00 GiB"]


def test_inactive_split_ratio_trigger_releases_only_what_can_be_released():
    cache = FakeCache(reserved=10 * GiB, allocated=6 * GiB, inactive_split=3 * GiB)
    j = janitor(cache, max_inactive_ratio=0.25)
    step = j.step()
    assert (step.reason, step.inactive_split, step.released) == ("max_inactive_ratio", 3 * GiB, 1 * GiB)
    cache2 = FakeCache(reserved=10 * GiB, allocated=6 * GiB, inactive_split=2 * GiB)
    assert janitor(cache2, max_inactive_ratio=0.25).step().cleaned is False  # 20 % < 25 %


def test_cached_ratio_is_relative_to_peak_allocated():
    cache = FakeCache(reserved=1 * GiB + 100 * MiB, allocated=1 * GiB, peak=2 * GiB)
    j = janitor(cache, max_cached_ratio=0.1)
    assert j.step().cleaned is False  # 100 MiB idle <= 10 % of the 2 GiB peak
    cache.reserved = 1 * GiB + 300 * MiB
    step = j.step()
    assert (step.reason, step.released) == ("max_cached_ratio", 300 * MiB)


def test_reserved_ratio_is_relative_to_peak_allocated():
    cache = FakeCache(reserved=2 * GiB + 100 * MiB, allocated=100 * MiB, peak=2 * GiB)
    j = janitor(cache, max_reserved_ratio=1.1)
    assert j.step().cleaned is False  # the cache fits the peak need: keep it for the next request
    cache.reserved = 2 * GiB + 400 * MiB
    step = j.step()
    assert (step.reason, step.released, step.reserved_after) == ("max_reserved_ratio", 2348 * MiB, 100 * MiB)


def test_every_n_requests():
    cache = FakeCache(reserved=2 * GiB, allocated=1 * GiB)
    j = janitor(cache, every_n=5)
    cleaned = []
    for i in range(1, 16):
        cache.reserved = 2 * GiB  # each request leaves 1 GiB in the cache
        if j.step().cleaned:
            cleaned.append(i)
    assert cleaned == [5, 10, 15]
    assert j.totals.reasons == {"every_n": 3}
    assert j.bytes_released == 3 * GiB


def test_every_s_with_an_injected_clock():
    now = [100.0]
    cache = FakeCache(reserved=2 * GiB, allocated=1 * GiB)
    j = janitor(cache, every_s=30, clock=lambda: now[0])
    now[0] = 129.0
    assert j.step().cleaned is False
    now[0] = 130.0
    assert j.step().reason == "every_s"
    cache.reserved = 2 * GiB
    now[0] = 159.0
    assert j.step().cleaned is False  # the timer restarted at the clean-up
    now[0] = 160.5
    assert j.step().cleaned is True


def test_min_release_skips_cleanups_not_worth_a_sync():
    cache = FakeCache(reserved=1 * GiB + 50 * MiB, allocated=1 * GiB, inactive_split=1 * GiB)
    j = janitor(cache, max_inactive_ratio=0.1, min_release="64MiB")
    assert j.step().cleaned is False
    cache.reserved += 100 * MiB
    assert j.step().cleaned is True


def test_default_policy_is_the_learned_headroom():
    j = janitor(FakeCache())
    assert (j.headroom, j.max_cached, j.max_cached_ratio, j.max_reserved_ratio, j.max_inactive_ratio, j.every_n,
            j.every_s) == (1.1, None, None, None, None, None, None)


def test_headroom_learns_the_clean_start_need_and_cleans_only_above_it():
    cache = FakeCache(reserved=0, allocated=0)  # fresh process: the first request starts clean
    j = janitor(cache)
    cache.allocated, cache.reserved = 100 * MiB, 1000 * MiB  # weights + what request 1 built
    assert j.step().cleaned is False and j.need == 1000 * MiB
    cache.reserved = 1090 * MiB  # a dirty-start request grew the cache by 9 %: within the headroom
    assert j.step().cleaned is False and j.need == 1000 * MiB
    cache.reserved = 1150 * MiB  # 15 % above anything a request needed from scratch
    step = j.step()
    assert (step.cleaned, step.reason, step.released) == (True, "headroom", 1050 * MiB)
    cache.reserved = 1200 * MiB  # this request began from the emptied cache: a new, larger need
    assert j.step().cleaned is False and j.need == 1200 * MiB
    assert j.totals.need == 1200 * MiB and j.totals.reasons == {"headroom": 1}


def test_a_janitor_made_after_warm_up_calibrates_once():
    cache = FakeCache(reserved=3 * GiB, allocated=1 * GiB)  # warmed up: the start is not clean
    j = janitor(cache)
    cache.reserved = 3 * GiB
    first = j.step()
    assert (first.cleaned, first.reason, j.need) == (True, "calibrate", None)
    cache.reserved = 2 * GiB  # the next request starts from the emptied cache
    assert j.step().cleaned is False and j.need == 2 * GiB


def test_before_cleans_only_for_a_request_larger_than_any_since_the_last_cleanup(caplog):
    cache = FakeCache(reserved=0, allocated=100 * MiB)
    j = janitor(cache)
    assert j.before(30) is None  # nothing idle yet
    cache.reserved = 700 * MiB
    j.step()
    assert j.before(10) is None and j.before(30) is None  # served by the blocks cached for 30
    with caplog.at_level(logging.INFO, logger="alloctune.guard"):
        step = j.before(45)
    assert (step.cleaned, step.reason, step.request, step.released) == (True, "larger_request", 2, 600 * MiB)
    assert "before request 2 (size 45)" in caplog.text
    assert j.before(45) is None and j.before(20) is None


def test_request_context_calls_before_and_step_also_on_failure():
    cache = FakeCache(reserved=0, allocated=0)
    j = janitor(cache)
    with j.request(5):
        cache.reserved = 500 * MiB
    with pytest.raises(RuntimeError):
        with j.request(9):  # larger: the idle cache is emptied first
            cache.reserved = 800 * MiB
            raise RuntimeError("failed request")
    assert j.requests == 2 and j.totals.reasons == {"larger_request": 1}


def test_context_manager_and_decorator_step_also_after_a_failed_request():
    cache = FakeCache(reserved=4 * GiB, allocated=1 * GiB)
    j = janitor(cache, max_cached="1GiB")
    with j:
        pass
    assert cache.empty_calls == 1

    @j
    def handle(ok):
        cache.reserved = 4 * GiB
        if not ok:
            raise ValueError("bad request")
        return "done"

    assert handle(True) == "done"
    with pytest.raises(ValueError):
        handle(False)
    assert (j.requests, j.cleanups, cache.empty_calls) == (3, 3, 3)


def test_empty_stats_never_clean():
    """No CUDA (memory_stats() empty): nothing is reserved, nothing to do."""
    calls = []
    j = Janitor(stats_fn=lambda: {}, empty_cache=lambda: calls.append(1), every_n=1)
    assert j.step().cleaned is False
    assert calls == []


def test_default_stats_on_a_machine_without_cuda_initialised():
    j = Janitor(every_n=1)  # real torch.cuda.memory_stats path; CUDA not initialised here
    assert j.step().cleaned is False


def test_fewer_cleanups_than_after_every_request_on_a_mixed_run():
    """A service replay: requests leave cached blocks of varying size; compare policies."""
    import random

    rng = random.Random(0)
    sizes = [rng.choice([64, 128, 256, 512, 2048]) * MiB for _ in range(200)]

    def replay(policy):
        cache = FakeCache(reserved=0, allocated=512 * MiB)
        peak_reserved = 0
        j = janitor(cache, **policy) if policy else None
        for need in sizes:
            idle = cache.reserved - cache.allocated
            cache.reserved += max(0, need - idle)  # reuse the idle cache, grow for the rest
            peak_reserved = max(peak_reserved, cache.reserved)
            cache.peak = max(cache.peak, cache.allocated + need)
            if j is not None:
                j.step()
            else:
                cache.empty_cache()
        return peak_reserved, cache.empty_calls

    peak_every, calls_every = replay(None)
    peak_janitor, calls_janitor = replay({"max_cached_ratio": 0.1})
    assert calls_every == 200
    assert peak_every == peak_janitor == 2560 * MiB  # the 2 GiB request on top of 512 MiB weights
    assert calls_janitor == 79  # after each request that left > 256 MiB (10 % of the peak) idle


@pytest.mark.parametrize("opts", [dict(every_n=0), dict(every_s=0), dict(max_cached="lots"), dict(max_inactive_ratio=-1),
                                  dict(headroom=0.9)])
def test_bad_options(opts):
    with pytest.raises(Exception):
        Janitor(**opts)


def test_reports_round_trip():
    s = JanitorStep(3, True, "every_n", 10, 5, 1, 6, 4)
    assert JanitorStep.from_dict(s.to_dict()) == s
    t = JanitorTotals(3, 1, 4, {"every_n": 1})
    assert JanitorTotals.from_dict(t.to_dict()) == t
    t = JanitorTotals(3, 1, 4, {"headroom": 1}, need=5 * GiB, clean_start_ratio=1.4)
    assert JanitorTotals.from_dict(t.to_dict()) == t


def test_a_cache_holding_only_unreleasable_pieces_counts_as_clean():
    """Right after empty_cache() the free pieces of segments that hold the weights stay reserved;
    that is as clean as the cache gets, so no calibration clean-up is needed."""
    cache = FakeCache(reserved=120 * MiB, allocated=100 * MiB, inactive_split=20 * MiB)
    j = janitor(cache)
    cache.reserved = 900 * MiB
    assert j.step().cleaned is False and j.need == 900 * MiB


@pytest.mark.parametrize("conf, warned", [("", True), ("expandable_segments:True", False)])
def test_says_once_when_a_request_fragments_memory_by_itself(monkeypatch, caplog, conf, warned):
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", conf)
    cache = FakeCache(reserved=0, allocated=0)
    j = janitor(cache)
    cache.allocated, cache.peak, cache.reserved = 100 * MiB, 700 * MiB, 1000 * MiB  # from an empty cache
    with caplog.at_level(logging.WARNING, logger="alloctune.guard"):
        j.step()
        cache.reserved = 1200 * MiB
        j.step()  # dirty start, over the headroom: cleaned
        cache.reserved = 1100 * MiB
        j.step()  # a clean start with a larger need: the ratio is updated, the advice not repeated
    assert j.totals.clean_start_ratio == pytest.approx(1100 / 700)
    advice = [r for r in caplog.records if "expandable_segments:True" in r.getMessage()]
    assert len(advice) == (1 if warned else 0)
    if warned:
        assert "1.43 x its peak allocated" in advice[0].getMessage()
