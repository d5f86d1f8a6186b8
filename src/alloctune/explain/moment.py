"""The moment `explain` looks at, and the allocator's memory map there.

The moment is a point between two requests: "after request m". By default it is the peak
of reserved memory as the recording's own segment events give it; within the stretch of
requests where reserved stays at that peak, the point where the program holds the most live
bytes (that is what the peak had to hold). A recording that ends in an OOM is looked at
where the failed request met the allocator (before it). `at` picks an event index of the
recording, or a time (`"12.5s"`, seconds after its first event).

The allocator's state there comes from one place, `alloctune.memory_map`: its totals
(`totals_after_request`: the exact simulator's statistics after replaying the requests up to
the moment, the native core when built) and its full map (`map_after_request`, for views that
draw segments). Both are checked against the recording (reserved bytes from the recorded
segment events, live requested bytes from the request stream) and fall back to the recorded
addresses (`replay_history`, the map `diagnose --snapshot` reads) when the simulation does not
reproduce the recording and the raw events are at hand.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Sequence

from alloctune.errors import TraceError
from alloctune.memory_map.model import MemoryMap
from alloctune.trace.model import FAILED_ALLOC, SegmentEvent, Trace, reserved_delta


@dataclass(frozen=True)
class Moment:
    """After request `after` (-1: before the first). `event` is the recording's event index."""

    after: int
    event: int
    reason: str  # "peak" | "oom" | "at"
    reserved: int  # recorded reserved bytes at the moment
    time_us: int | None = None


def reserved_after(trace: Trace) -> list[int]:
    """Recorded reserved bytes after each request (from the segment events' request indices)."""
    return reserved_levels(len(trace.requests), trace.segment_events)


def reserved_levels(n: int, seg: Sequence[SegmentEvent]) -> list[int]:
    """Reserved bytes after each of n requests by segment events `seg`: request r sees, in list order,
    every event up to the first one whose request index exceeds r. The level is written a stretch at a
    time between the requests where events happen (a million requests, a few hundred events)."""
    out = [0] * n
    k, cur, at = 0, 0, 0  # next event, the level, the first request not yet written
    while k < len(seg):
        r = max(at, seg[k].request_index)  # the request the next event is seen at
        if r >= n:
            break
        out[at:r] = [cur] * (r - at)
        while k < len(seg) and seg[k].request_index <= r:
            cur += reserved_delta(seg[k])
            k += 1
        at = r
    out[at:n] = [cur] * (n - at)
    return out


def ends_in_oom(trace: Trace) -> int | None:
    """The request index of the OOM a recording ends in, or None.

    "Ends in" = the run record says the outcome was an OOM (the last failed request), or,
    without a record, the last failed request lies in the final 1 % of the requests (a capped
    run whose cuDNN fell back and went on is not an OOM ending).
    """
    ops = trace.requests.ops
    if FAILED_ALLOC not in ops:
        return None
    last = len(ops) - 1 - ops[::-1].index(FAILED_ALLOC)
    outcome = (trace.meta or {}).get("outcome")
    if outcome == "oom":
        return last
    if outcome is None and last >= len(ops) - max(1, len(ops) // 100):
        return last
    return None


def pick_moment(trace: Trace, live_before: Sequence[int], at: Any = None) -> Moment:
    """The moment to explain (module doc). `live_before[i]`: live requested bytes before request i."""
    req = trace.requests
    n = len(req)
    if n == 0:
        raise TraceError(f"{trace.source}: the recording holds no requests; nothing to explain")
    res = reserved_after(trace)
    evi = req.event_index
    if at is not None:
        event = _event_of(trace, at)
        m = bisect.bisect_right(evi, event) - 1
        return Moment(m, event, "at", res[m] if m >= 0 else 0, _time_of(trace, event))
    oom = ends_in_oom(trace)
    if oom is not None:
        m = oom - 1
        return Moment(m, evi[oom], "oom", res[m] if m >= 0 else 0, _time_of(trace, evi[oom]))
    peak = max(res)
    # every stretch at the peak; the point holding the most live bytes (the first of equals)
    m = max((r for r, level in enumerate(res) if level == peak), key=lambda r: live_before[r + 1])
    return Moment(m, evi[m], "peak", peak, _time_of(trace, evi[m]))


def _event_of(trace: Trace, at: Any) -> int:
    """An event index from `at`: an int (event index) or a time in seconds (`"12.5s"`)."""
    if isinstance(at, str) and at.strip().endswith("s"):
        try:
            secs = float(at.strip()[:-1])
        except ValueError:
            raise TraceError(f"--at {at!r}: expected an event index or a time like 12.5s") from None
        times = _times(trace)
        if not times:
            raise TraceError(
                f"{trace.source}: the recording keeps no event times (a compact trace); give --at an event index instead"
            )
        t = times[0] + int(secs * 1e6)
        return max(0, bisect.bisect_right(times, t) - 1)
    try:
        event = int(at)
    except (TypeError, ValueError):
        raise TraceError(f"--at {at!r}: expected an event index or a time like 12.5s") from None
    last = trace.requests.event_index[-1]
    if not 0 <= event <= last:
        raise TraceError(f"--at {event}: the recording's events run from 0 to {last}")
    return event


def _times(trace: Trace) -> list[int]:
    try:
        evs = trace.events
        if not evs:
            return []
        return [int(e.get("time_us", 0) or 0) for e in evs]
    except (TraceError, OSError):
        return []


def _time_of(trace: Trace, event: int) -> int | None:
    evs = trace.events
    if not isinstance(evs, list) or not evs:
        return None  # lazily loaded raw events (a cached snapshot): not worth a load for a timestamp
    if 0 <= event < len(evs):
        t = evs[event].get("time_us")
        return int(t) if isinstance(t, int) else None
    return None


def totals_at(trace: Trace, moment: Moment) -> tuple[Any, str]:
    """The allocator's totals after request `moment.after` (`memory_map.build.MomentTotals`)."""
    from alloctune.memory_map.build import totals_after_request

    return totals_after_request(trace, moment.after, moment.reserved, _event_after(trace, moment))


def map_at(trace: Trace, moment: Moment) -> tuple[MemoryMap, str]:
    """The memory map after request `moment.after` (the one place: `alloctune.memory_map`)."""
    from alloctune.memory_map.build import map_after_request

    return map_after_request(trace, moment.after, moment.reserved, _event_after(trace, moment))


def _event_after(trace: Trace, moment: Moment) -> int:
    """The recording's event of request `moment.after` (the map is taken right after it; at an OOM
    `moment.event` is the failed request's, whose release burst comes before it)."""
    return trace.requests.event_index[moment.after] if moment.after >= 0 else -1
