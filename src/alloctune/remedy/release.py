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
from typing import Iterable, Sequence

from alloctune.analysis.core import Analysis
from alloctune.analysis.repeats import loop_tops
from alloctune.remedy.model import Remedy, activity, recorded_conf, rewritten, simulated
from alloctune.trace.model import EMPTY_CACHE, FREE, RequestStream, Trace

EVERY = (1, 2, 4)


def with_empty_cache(trace: Trace, at: Sequence[int]) -> Trace:
    """`trace` with an `empty_cache()` request inserted before each request index in `at`."""
    req = trace.requests
    points = set(at)
    out = RequestStream()
    new_index = [0] * (len(req) + 1)
    for r in range(len(req)):
        if r in points:
            out.append(EMPTY_CACHE, -1, -1, req.streams[r], req.event_index[r])
        new_index[r] = len(out)
        out.append(req.ops[r], req.sizes[r], req.rids[r], req.streams[r], req.event_index[r])
    return rewritten(trace, out, new_index)


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


def free_at_repeat_end(an: Analysis, sites: Iterable[int]) -> Trace:
    """The recording with every block of `sites` that outlived its repetition freed where that
    repetition ends (just before the next one's first request). Allocation order is unchanged."""
    trace, life, starts = an.trace, an.life, an.repeats.starts
    wanted = set(sites)
    req = trace.requests
    moved: dict[int, list[int]] = {}  # boundary request index -> allocation ids freed there
    moved_rids: set[int] = set()
    rid_of_k = [req.rids[a] for a in life.alloc]
    for k, s in enumerate(an.site_of):
        if s in wanted and an.kept[k]:
            j = bisect.bisect_right(starts, life.alloc[k]) - 1
            if j + 1 >= len(starts):
                continue  # made in the last repetition: it ends with the recording
            moved.setdefault(starts[j + 1], []).append(k)
            moved_rids.add(rid_of_k[k])
    out = RequestStream()
    new_index = [0] * (len(req) + 1)
    for r in range(len(req)):
        for k in moved.get(r, ()):
            out.append(FREE, life.size[k], rid_of_k[k], req.streams[life.alloc[k]], req.event_index[r])
        new_index[r] = len(out)
        if req.ops[r] == FREE and req.rids[r] in moved_rids:
            continue
        out.append(req.ops[r], req.sizes[r], req.rids[r], req.streams[r], req.event_index[r])
    return rewritten(trace, out, new_index)


def release_points(an: Analysis, base_min_budget: int | None, every: Sequence[int] = EVERY,
                   conf: str | None = None) -> list[Remedy]:
    """`empty_cache()` where every Nth repetition ends, for N in `every`, simulated under `conf`
    (default: the setting the recording ran with)."""
    if len(an.repeats.starts) < 2:
        return []
    trace = an.trace
    conf = recorded_conf(trace) if conf is None else conf
    base_act = activity(trace, conf, trace)
    ends = repetition_ends(an)
    out = []
    for n in every:
        points = ends[n - 1::n]  # where every Nth repetition ends
        if not points:
            continue
        what = "every repetition" if n == 1 else f"every {n} repetitions"
        out.append(simulated(
            "empty_cache_each_repetition" if n == 1 else f"empty_cache_every_{n}_repetitions",
            f"empty_cache() at the end of {what}", with_empty_cache(trace, points), conf, trace, base_min_budget,
            base_act, f"torch.cuda.empty_cache() after {what}, or between a service's requests: "
            f"alloctune.guard.Janitor(every_n={n})", cleanups=len(points), janitor={"args": {"every_n": n}, "use": "janitor"}))
    return out
