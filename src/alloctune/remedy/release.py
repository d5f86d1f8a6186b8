"""Release points: memory given back where a repetition ends.

* `empty_cache()` where each chosen repetition ends (every one, every Nth): the field's "call
  empty_cache() now and then", placed where a program's own call after a step or between a
  service's requests sits (`repetition_ends`), and simulated on the recording (`release_points`);
  the Janitor's policies (`remedy.janitor`) decide such points themselves;
* a site's kept blocks freed where the repetition that made them ends (`free_at_repeat_end`):
  explain's per-site what-ifs, and the leak remedy (`remedy.training`).
"""

from __future__ import annotations

import bisect
from itertools import compress
from typing import Iterable, Sequence

from alloctune.analysis.core import Analysis
from alloctune.analysis.repeats import loop_tops
from alloctune.remedy.model import BaseActivity, Remedy, Row, Shared, activity, recorded_conf, simulated, spliced
from alloctune.trace.model import EMPTY_CACHE, FREE, Trace

EVERY = (1, 2, 4)


def with_empty_cache(trace: Trace, at: Sequence[int]) -> Trace:
    """`trace` with an `empty_cache()` request inserted before each request index in `at`."""
    req = trace.requests
    n = len(req)
    before = {r: [(EMPTY_CACHE, -1, -1, req.streams[r], req.event_index[r], -1)] for r in set(at) if 0 <= r < n}
    return spliced(trace, before, {})


def repetition_ends(an: Analysis) -> list[int]:
    """Where each repetition but the last ends, as a request index: the last point before the next
    repetition where live bytes are at their lowest in the repetition (its temporaries gone) -- where
    a program's own `empty_cache()` after a step or a request sits. The anchor that marks repetitions
    can fall anywhere inside one (RVC's recurring first block is allocated mid-chunk), so the
    boundary itself is not the place. With Python stacks the loop's own frame says exactly where its
    body begins again (`repeats.loop_tops`); the lowest-live rule is for recordings without them."""
    tops = loop_tops(an.trace.requests, an.repeats)
    if tops is not None:
        return tops
    starts, lb = list(an.repeats.starts), an.live_before
    out = []
    for j in range(1, len(starts)):
        lo, hi = starts[j - 1] + 1, starts[j]
        best = hi
        for r in range(hi, lo - 1, -1):  # latest index at the window's minimum
            if lb[r] < lb[best]:
                best = r
        out.append(best)
    return out


def freed_key(sites: Iterable[int]) -> tuple[str, tuple[int, ...]]:
    """`free_at_repeat_end`'s rewrite as a `Shared.rewrite` key: the same sites make the same rewrite."""
    return ("free_at_repeat_end", tuple(sorted(set(sites))))


def free_at_repeat_end(an: Analysis, sites: Iterable[int]) -> Trace:
    """The recording with every block of `sites` that outlived its repetition freed where that
    repetition ends (just before the next one's first request). Allocation order is unchanged."""
    trace, life, starts = an.trace, an.life, an.repeats.starts
    wanted = set(sites)
    req = trace.requests
    n = len(req)
    before: dict[int, list[Row]] = {}  # boundary request index -> the frees put there
    moved_rids: set[int] = set()
    kept = an.kept
    for k in compress(range(len(an.site_of)), map(wanted.__contains__, an.site_of)):
        if kept[k]:
            a = life.alloc[k]
            j = bisect.bisect_right(starts, a) - 1
            if j + 1 >= len(starts):
                continue  # made in the last repetition: it ends with the recording
            at = starts[j + 1]
            if at < n:
                before.setdefault(at, []).append((FREE, life.size[k], req.rids[a], req.streams[a], req.event_index[at], -1))
            moved_rids.add(req.rids[a])
    ops = req.ops
    dropped: dict[int, Row | None] = {  # the program's own frees of the moved blocks
        r: None for r in compress(range(n), map(moved_rids.__contains__, req.rids)) if ops[r] == FREE
    }
    return spliced(trace, before, dropped)


def release_rewrites(
    an: Analysis, conf: str, ends: list[int], every: Sequence[int] = EVERY, shared: Shared | None = None
) -> dict[int, Trace]:
    """The recording with `empty_cache()` where every Nth repetition ends (`ends`), by N; with `shared`,
    each made once and its replays under `conf` started (in `shared`'s thread)."""
    trace, out = an.trace, {}
    for n in every:
        points = ends[n - 1 :: n]
        if not points:
            continue
        if shared is None:
            out[n] = with_empty_cache(trace, points)
        else:
            out[n] = shared.rewrite(("empty_cache", tuple(points)), lambda: with_empty_cache(trace, points))
            shared.prefetch(out[n], conf)
    return out


def release_points(
    an: Analysis,
    base_min_budget: int | None,
    every: Sequence[int] = EVERY,
    conf: str | None = None,
    base_act: BaseActivity | None = None,
    ends: list[int] | None = None,
    shared: Shared | None = None,
) -> list[Remedy]:
    """`empty_cache()` where every Nth repetition ends, for N in `every`, simulated under `conf`
    (default: the setting the recording ran with); `base_act`: the recording's own `activity` under
    `conf`, `ends`: its `repetition_ends`, when at hand; `shared`: the work other remedies of the
    recording share (`remedy.model.Shared`)."""
    if len(an.repeats.starts) < 2:
        return []
    trace = an.trace
    conf = recorded_conf(trace) if conf is None else conf
    base_act = base_act or activity(trace, conf, trace)
    ends = repetition_ends(an) if ends is None else ends
    rewrites = release_rewrites(an, conf, ends, every, shared)
    out = []
    for n in every:
        points = ends[n - 1 :: n]  # where every Nth repetition ends
        if not points:
            continue
        what = "every repetition" if n == 1 else f"every {n} repetitions"
        t = rewrites[n]
        out.append(
            simulated(
                "empty_cache_each_repetition" if n == 1 else f"empty_cache_every_{n}_repetitions",
                f"empty_cache() at the end of {what}",
                t,
                conf,
                trace,
                base_min_budget,
                base_act,
                f"torch.cuda.empty_cache() after {what}, or between a service's requests: alloctune.guard.Janitor(every_n={n})",
                cleanups=len(points),
                janitor={"args": {"every_n": n}, "use": "janitor"},
                shared=shared,
            )
        )
    return out
