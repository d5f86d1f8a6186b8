"""The Janitor against the simulator's exact model of the caching allocator (no GPU).

A decoder-like service: 200 requests of random length, each a chain of stage tensors that grow
with the length (as in RVC's NSF decoder), with temporaries freed in between. The Janitor
reads the model's `memory_stats()` counters and calls its `empty_cache()`.
"""

from __future__ import annotations

import random

import pytest

from alloctune.guard import Janitor
from alloctune.sim.replay import make_allocator
from alloctune.sim.settings import SimSettings
from alloctune.units import MiB

CHANNELS = (256, 128, 64, 32, 16)
UPSAMPLE = (1, 12, 120, 240, 480)


pytestmark = pytest.mark.usefixtures("fresh_guard_stats")


def serve(alloc, frames: int) -> None:
    """One request: per stage three residual blocks (two temporaries each), then upsample."""
    sizes = [c * u * frames * 2 for c, u in zip(CHANNELS, UPSAMPLE)]  # fp16
    x = alloc.malloc(sizes[0])
    for k, size in enumerate(sizes):
        for _ in range(3):
            t1, t2 = alloc.malloc(size), alloc.malloc(size)
            alloc.free(t1)
            y = alloc.malloc(size)
            alloc.free(t2)
            alloc.free(x)
            x = y
        if k + 1 < len(sizes):
            y = alloc.malloc(sizes[k + 1])
            alloc.free(x)
            x = y
    alloc.free(x)


def run(policy: str, frames: list[int], conf: str = "") -> tuple[int, int, int]:
    """(peak reserved, peak allocated, empty_cache calls) of one service run."""
    alloc = make_allocator(SimSettings.from_config(conf), record_events=False)
    alloc.malloc(30 * MiB)  # the weights
    janitor = Janitor(stats_fn=alloc.stats.as_dict, empty_cache=alloc.empty_cache)
    calls = 0
    for n in frames:
        if policy == "sized":
            with janitor.request(n):
                serve(alloc, n)
            continue
        serve(alloc, n)
        if policy == "every":
            alloc.empty_cache()
            calls += 1
        elif policy == "janitor":
            janitor.step()
    if policy in ("janitor", "sized"):
        calls = janitor.cleanups
    return alloc.stats.reserved_peak, alloc.stats.allocated_peak, calls


def lengths(seed: int, longest_first: bool = False) -> list[int]:
    rng = random.Random(seed)
    frames = [int(100 * rng.uniform(2, 60)) for _ in range(200)]
    if longest_first:
        frames[0] = 6000
    return frames


@pytest.mark.parametrize("seed", [7, 8])
def test_sized_janitor_keeps_the_every_request_peak_with_a_few_cleanups(seed):
    frames = lengths(seed)
    never, _, _ = run("never", frames)
    every, allocated, every_calls = run("every", frames)
    sized, sized_allocated, sized_calls = run("sized", frames)
    assert every_calls == 200
    assert never > 1.5 * every  # the cache fills with layouts no request can use
    assert sized <= 1.02 * every  # rebuilt once per new largest length: the floor, within 2 %
    assert sized_allocated == allocated
    records = sum(1 for i, n in enumerate(frames) if n > max(frames[:i], default=0))
    assert 1 <= sized_calls <= records  # at most once per new longest request


def test_sized_janitor_never_cleans_when_the_longest_request_came_first():
    frames = lengths(7, longest_first=True)
    sized, _, calls = run("sized", frames)
    every, _, _ = run("every", frames)
    assert calls == 0 and sized <= 1.02 * every


def test_unsized_janitor_bounds_the_idle_cache_with_few_cleanups():
    """Without sizes the learned-need trigger caps what stays cached between requests (not the
    growth inside the next request): well below never, above the every-request floor."""
    frames = lengths(7)
    never, _, _ = run("never", frames)
    every, _, _ = run("every", frames)
    peak, _, calls = run("janitor", frames)
    assert calls < 40
    assert every < peak < 0.6 * never


def test_with_expandable_segments_the_cache_barely_grows_and_the_janitor_cleans_rarely():
    frames = lengths(7)
    never, _, _ = run("never", frames, "expandable_segments:True")
    every, _, _ = run("every", frames, "expandable_segments:True")
    peak, _, calls = run("janitor", frames, "expandable_segments:True")
    assert never <= 1.05 * every
    assert peak <= 1.05 * every and calls < 25
