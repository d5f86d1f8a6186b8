"""Release points, simulated (#29.1): what `torch.cuda.empty_cache()` at the end of every repetition
(or every Nth) would do to the min budget, and what it costs in driver calls.

The field's standard advice ("call empty_cache() now and then") is a number here: the recording's
request stream with an `empty_cache()` inserted where each chosen repetition ends (just before the
next one begins), fed to `sim.sweep` for its min budget, and replayed once uncapped for the driver
calls it adds (each released segment is a cudaFree now and a cudaMalloc later). The cost is an upper
bound from the driver-call figures measured on the H200 (bench/driver_cost.py: 0.1 ms a call plus
2 µs per MiB, the same constants `tune` bounds throughput with); `guard.Janitor(every_n=N)` makes a
service do the same between its requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from alloctune.explain.core import Analysis
from alloctune.explain.what_if import WHAT_IF_ABS_TOL, WHAT_IF_REL_TOL, recorded_conf, rewritten
from alloctune.explain.repeats import loop_tops
from alloctune.trace.model import EMPTY_CACHE, RequestStream, Trace

# Driver work, as measured on the H200 (bench/results/driver_cost.md); tune's TuneSettings defaults.
DRIVER_CALL_S = 1e-4
DRIVER_MIB_S = 2e-6
EVERY = (1, 2, 4)


@dataclass(frozen=True)
class Remedy:
    """One program-level remedy, simulated on the recording."""

    name: str
    min_budget: int | None
    saving: int | None  # the recording's own min budget minus this one (negative: it costs memory)
    peak_reserved: int | None  # uncapped
    extra_driver_calls: int  # cudaMalloc + cudaFree beyond the recording's, uncapped
    extra_seconds: float  # upper bound on the time those calls add
    code: str  # what to write to get it
    method: str = "simulated"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


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


def _activity(trace: Trace, conf: str, reference: Trace) -> tuple[int, int, int]:
    """(peak reserved, driver calls, MiB reserved or released) of an uncapped replay."""
    from alloctune.sim.replay import replay

    r = replay(trace, conf or None, reference=reference)
    calls = int(r.stats.get("num_device_alloc", 0)) + int(r.stats.get("num_device_free", 0))
    moved = sum(e.size for e in r.segment_events if e.action != "oom")
    return r.peak_reserved, calls, moved >> 20


def release_points(an: Analysis, base_min_budget: int | None, every: Sequence[int] = EVERY) -> list[Remedy]:
    """`empty_cache()` where every Nth repetition ends, for N in `every`, simulated."""
    from alloctune.sim.sweep import sweep

    starts = list(an.repeats.starts)
    if len(starts) < 2:
        return []
    trace = an.trace
    conf = recorded_conf(trace)
    _, calls0, mib0 = _activity(trace, conf, trace)
    ends = repetition_ends(an)
    out = []
    for n in every:
        points = ends[n - 1::n]  # where every Nth repetition ends
        if not points:
            continue
        t = with_empty_cache(trace, points)
        mb = sweep(t, [conf], find_min=True, reference=trace, rel_tol=WHAT_IF_REL_TOL,
                   abs_tol=WHAT_IF_ABS_TOL).rows[0].min_budget
        peak, calls, mib = _activity(t, conf, trace)
        extra = max(0, calls - calls0)
        seconds = extra * DRIVER_CALL_S + max(0, mib - mib0) * DRIVER_MIB_S
        what = "every repetition" if n == 1 else f"every {n} repetitions"
        out.append(Remedy(
            f"empty_cache() at the end of {what}", mb,
            None if mb is None or base_min_budget is None else base_min_budget - mb, peak, extra, seconds,
            f"torch.cuda.empty_cache() after {what}, or between a service's requests: "
            f"alloctune.guard.Janitor(every_n={n})"))
    return out
