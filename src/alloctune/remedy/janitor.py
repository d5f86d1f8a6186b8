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
from dataclasses import replace
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Iterator

from alloctune.analysis.core import Analysis
from alloctune.remedy.model import Remedy, activity_of, simulated, uncapped_run
from alloctune.remedy.release import repetition_ends, with_empty_cache
from alloctune.trace.model import Trace, reserved_delta

if TYPE_CHECKING:
    from alloctune.sim.replay import SimResult

POLICIES: tuple[tuple[str, dict[str, Any], bool], ...] = (
    # (name, Janitor keyword arguments, whether the service passes each request's size)
    ("janitor", {}, False),
    ("janitor_by_size", {}, True),
)


class _Reserved:
    """Reserved bytes before each request index of an uncapped replay (and after the last), read from
    its segment events (in request order) at the indices asked."""

    def __init__(self, run: SimResult) -> None:
        self.run = run
        self._index = [e.request_index for e in run.segment_events]
        self._level = list(accumulate((reserved_delta(e) for e in run.segment_events), initial=0))

    def before(self, i: int) -> int:
        """Reserved bytes once every event of the requests before index i has happened."""
        return self._level[bisect.bisect_left(self._index, i)]


# The uncapped replays of the recording with clean-ups before the given request indices (key: the
# sorted indices): the Janitor's passes, shared by its policies and by the remedy each one becomes.
Replays = dict[tuple[int, ...], tuple[Trace, _Reserved]]


def _replayed(replays: Replays, trace: Trace, conf: str, points: list[int]) -> tuple[Trace, _Reserved]:
    """`trace` with an `empty_cache()` before each of `points` and its reserved levels, replayed once."""
    key = tuple(points)
    if key not in replays:
        t = with_empty_cache(trace, points) if points else trace
        replays[key] = (t, _Reserved(uncapped_run(t, conf, trace)))
    return replays[key]


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


def janitor_points(an: Analysis, conf: str, kwargs: dict[str, Any], by_size: bool,
                   replays: Replays | None = None, ends: list[int] | None = None) -> list[int]:
    """Request indices (of the recording) before which `Janitor(**kwargs)` empties the cache
    (`replays`: the passes already made, which this one adds to; `ends`: `repetition_ends`)."""
    from alloctune.guard.janitor import Janitor

    trace, lb = an.trace, an.live_before
    replays = {} if replays is None else replays
    ends = repetition_ends(an) if ends is None else ends
    sizes = repetition_sizes(an, ends) if by_size else []
    points: list[int] = []
    with _private_counters():
        for _ in range(len(ends) + 1):  # each pass adds a clean-up, or ends
            lvl = _replayed(replays, trace, conf, points)[1]
            mem = _Memory()
            jan = Janitor(**kwargs, stats_fn=mem.stats, empty_cache=mem.empty_cache, clock=lambda: 0.0)
            if by_size:
                jan.before(sizes[0])  # nothing reserved yet: it only learns the first size
            new = None
            for k, e in enumerate(ends):
                q = e + bisect.bisect_left(points, e)  # where request e (or the clean-up before it) now sits
                planned = e in points
                mem.reserved, mem.allocated = lvl.before(q), lb[e]
                mem.after, mem.cleaned = (lvl.before(q + 1) if planned else None), False
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


def janitor_remedies(an: Analysis, base: int | None, conf: str, base_run: SimResult | None = None,
                     ends: list[int] | None = None) -> list[Remedy]:
    """The Janitor's policies on the recorded program, simulated (needs two repetitions or more);
    `base_run`: the recording's `uncapped_run` under `conf`, `ends`: its `repetition_ends`, when at
    hand. Policies that decide the same clean-ups share one simulation."""
    if len(an.repeats.starts) < 2:
        return []
    trace = an.trace
    ends = repetition_ends(an) if ends is None else ends
    replays: Replays = {} if base_run is None else {(): (trace, _Reserved(base_run))}
    base_act = activity_of(_replayed(replays, trace, conf, [])[1].run)
    out: list[Remedy] = []
    found: dict[tuple[int, ...], Remedy] = {}
    for name, kwargs, by_size in POLICIES:
        points = janitor_points(an, conf, kwargs, by_size, replays, ends)
        t, lvl = _replayed(replays, trace, conf, points)
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        use = "with janitor.request(size):  # size: the request's length" if by_size else "with janitor:"
        what = ("the Janitor, told each request's size (empties the cache before a request larger than any "
                "since the last clean-up)" if by_size else
                "the Janitor (empties the cache when reserved grows past 1.1 x the need learned from a clean start)")
        how_to = f"janitor = alloctune.guard.Janitor({args}); around each request: {use}"
        policy = {"args": dict(kwargs), "use": "janitor.request(size)" if by_size else "janitor"}
        notes = ("decided on the uncapped replay: under a cap the allocator's own retries also free cached "
                 "blocks, so the Janitor's clean-ups there may differ",)
        same = found.get(tuple(points))
        if same is None:
            same = found[tuple(points)] = simulated(name, what, t, conf, trace, base, base_act, how_to,
                                                    uncapped=lvl.run, cleanups=len(points), janitor=policy,
                                                    notes=notes)
        out.append(replace(same, name=name, what=what, how_to=how_to, cleanups=len(points), janitor=policy,
                           notes=notes))
    return out
