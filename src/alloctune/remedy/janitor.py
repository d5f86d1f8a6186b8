"""The Janitor's policies, simulated: where `guard.Janitor` would empty the cache in the
recorded program, and what that buys.

Why the real class: the policy (headroom over the learned clean-start need, or "a request larger
than any since the last clean-up") depends on the memory state its own earlier clean-ups left, so
no fixed list of points reproduces it. The real `Janitor` is driven here with statistics from the
simulated allocator instead of `torch.cuda.memory_stats()`: at each repetition's end (where
`repetition_ends` puts a service's "between requests") it is asked `step()` -- and, for the size
policy, `before(size)` of the next repetition -- and each clean-up it decides is inserted into the
request stream; the stream is replayed again from there (a clean-up changes everything after it,
nothing before), until the Janitor decides nothing new.

A repetition's "size" for `before(size)` is its peak live bytes above where it started: the quantity
a service's own size (audio seconds, tokens) stands in for. Decisions are made on the uncapped replay;
under a cap the allocator's own retries free cached blocks too, so the Janitor's decisions there can
differ (said in the remedy's notes).
"""

from __future__ import annotations

import bisect
import contextlib
from typing import Any, Iterator

from alloctune.analysis.core import Analysis
from alloctune.remedy.model import Remedy, activity, simulated
from alloctune.remedy.release import repetition_ends, with_empty_cache
from alloctune.trace.model import Trace, reserved_delta

POLICIES: tuple[tuple[str, dict[str, Any], bool], ...] = (
    # (name, Janitor keyword arguments, whether the service passes each request's size)
    ("janitor", {}, False),
    ("janitor_by_size", {}, True),
)


def _levels(trace: Trace, conf: str, reference: Trace) -> list[int]:
    """Reserved bytes before each request index of `trace` (and after the last), uncapped."""
    from alloctune.sim.replay import replay

    events = replay(trace, conf or None, reference=reference).segment_events
    n = len(trace.requests)
    out = [0] * (n + 1)
    cur, k = 0, 0
    for i in range(n + 1):
        while k < len(events) and events[k].request_index < i:
            cur += reserved_delta(events[k])
            k += 1
        out[i] = cur
    return out


def repetition_sizes(an: Analysis, ends: list[int]) -> list[int]:
    """Each repetition's peak live bytes above its starting level (repetition k runs from ends[k-1]
    to ends[k]; the first from the first repetition's start, the last to the recording's end)."""
    lb = an.live_before
    bounds = [an.repeats.starts[0]] + ends + [len(lb) - 1]
    return [max(lb[a:b + 1]) - lb[a] for a, b in zip(bounds, bounds[1:])]


@contextlib.contextmanager
def _private_counters() -> Iterator[None]:
    """The Janitor adds its clean-ups to the process's guard counters; simulated ones must not count."""
    from alloctune.guard import janitor as jmod
    from alloctune.guard.counters import GuardStats

    real = jmod.guard_stats
    jmod.guard_stats = GuardStats()
    try:
        yield
    finally:
        jmod.guard_stats = real


class _Memory:
    """The statistics the Janitor reads, from the simulated allocator (its `stats_fn` and `empty_cache`)."""

    def __init__(self) -> None:
        self.reserved = self.allocated = 0
        self.after: int | None = None  # reserved after a clean-up already in the stream, else unknown
        self.cleaned = False

    def stats(self) -> dict[str, int]:
        from alloctune.guard.janitor import ALLOCATED, RESERVED

        return {RESERVED: self.reserved, ALLOCATED: self.allocated}

    def empty_cache(self) -> None:
        self.cleaned = True
        if self.after is not None:
            self.reserved = self.after


def janitor_points(an: Analysis, conf: str, kwargs: dict[str, Any], by_size: bool) -> list[int]:
    """Request indices (of the recording) before which `Janitor(**kwargs)` empties the cache."""
    from alloctune.guard.janitor import Janitor

    trace, lb = an.trace, an.live_before
    ends = repetition_ends(an)
    sizes = repetition_sizes(an, ends) if by_size else []
    points: list[int] = []
    with _private_counters():
        for _ in range(len(ends) + 1):  # each pass adds a clean-up, or ends
            t = with_empty_cache(trace, points) if points else trace
            lvl = _levels(t, conf, trace)
            mem = _Memory()
            jan = Janitor(**kwargs, stats_fn=mem.stats, empty_cache=mem.empty_cache, clock=lambda: 0.0)
            if by_size:
                jan.before(sizes[0])  # nothing reserved yet: it only learns the first size
            new = None
            for k, e in enumerate(ends):
                q = e + bisect.bisect_left(points, e)  # where request e (or the clean-up before it) now sits
                planned = e in points
                mem.reserved, mem.allocated = lvl[q], lb[e]
                mem.after, mem.cleaned = (lvl[q + 1] if planned else None), False
                jan.step()
                if by_size:
                    if mem.cleaned:  # just emptied: nothing idle, it only learns the next size
                        mem.allocated = mem.reserved
                    jan.before(sizes[k + 1])
                if mem.cleaned and not planned:
                    new = e
                    break
            if new is None:
                return points
            bisect.insort(points, new)
    return points


def janitor_remedies(an: Analysis, base: int | None, conf: str) -> list[Remedy]:
    """The Janitor's policies on the recorded program, simulated (needs two repetitions or more)."""
    if len(an.repeats.starts) < 2:
        return []
    trace = an.trace
    base_act = activity(trace, conf, trace)
    out = []
    for name, kwargs, by_size in POLICIES:
        points = janitor_points(an, conf, kwargs, by_size)
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        use = "with janitor.request(size):  # size: the request's length" if by_size else "with janitor:"
        what = ("the Janitor, told each request's size (empties the cache before a request larger than any "
                "since the last clean-up)" if by_size else
                "the Janitor (empties the cache when reserved grows past 1.1 x the need learned from a clean start)")
        out.append(simulated(
            name, what, with_empty_cache(trace, points) if points else trace, conf, trace, base, base_act,
            f"janitor = alloctune.guard.Janitor({args}); around each request: {use}",
            cleanups=len(points), janitor={"args": dict(kwargs), "use": "janitor.request(size)" if by_size else "janitor"},
            notes=("decided on the uncapped replay: under a cap the allocator's own retries also free cached "
                   "blocks, so the Janitor's clean-ups there may differ",)))
    return out
