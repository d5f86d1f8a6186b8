"""Program-level remedies, simulated (#29): release points, the Janitor's policies, workspace caps.

The field's standard advice ("call empty_cache() now and then", "run the Janitor", "cap the cuBLAS
workspace") is a number here: the recording's request stream rewritten the way the remedy would
change it, fed to `sim.sweep` for its min budget, and replayed once uncapped for its peak reserved
and the driver calls it adds (each released segment is a cudaFree now and a cudaMalloc later).

* release points: an `empty_cache()` where each chosen repetition ends (every one, every Nth);
* the Janitor (`explain.janitor_sim`): the real `guard.Janitor` policy decides, at each
  repetition's end, from the simulated memory state, where it would empty the cache;
* workspace caps (`explain.workspaces`): cuBLAS workspaces shrunk to what the environment
  variable allows (simulated exactly: a fixed request of another size); cuDNN's choices are not
  in the model, so those candidates carry the command of their confirming run.

The time cost is an upper bound from the driver-call figures measured on the H200
(bench/driver_cost.py: 0.1 ms a call plus 2 µs per MiB, the same constants `tune` bounds
throughput with).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from alloctune.explain.core import Analysis
from alloctune.explain.repeats import loop_tops
from alloctune.explain.what_if import WHAT_IF_ABS_TOL, WHAT_IF_REL_TOL, recorded_conf, rewritten
from alloctune.trace.model import EMPTY_CACHE, RequestStream, Trace
from alloctune.units import utilization

# Driver work, as measured on the H200 (bench/results/driver_cost.md); tune's TuneSettings defaults.
DRIVER_CALL_S = 1e-4
DRIVER_MIB_S = 2e-6
EVERY = (1, 2, 4)
SIMULATED, MEASURED, UNCONFIRMED = "simulated", "measured", "needs a confirming run"


@dataclass(frozen=True)
class Remedy:
    """One program-level remedy and what it buys, for the user's own program.

    `name`: a stable key (`empty_cache_each_repetition`, `janitor`, `no_grad`, ...); `what`: the
    sentence; `method`: simulated (replayed on the recording), measured (a run of the program
    with it), or "needs a confirming run" (`confirm` says which); `min_budget`: for the latter,
    None (`bound` may hold the simulated lower bound)."""

    name: str
    what: str
    min_budget: int | None
    saving: int | None  # the min budget without it minus with it (negative: it costs memory)
    peak_reserved: int | None  # uncapped
    peak_allocated: int | None
    extra_driver_calls: int  # cudaMalloc + cudaFree beyond the recording's, uncapped
    extra_seconds: float  # upper bound on the time those calls add
    how_to: str  # what to write (or set) to get it
    method: str = SIMULATED
    conf: str = ""  # the allocator setting it was simulated / measured under
    confirm: str | None = None  # the command of the run that would confirm it
    bound: int | None = None  # a simulated lower bound on min_budget, when only that is known
    cleanups: int | None = None  # empty_cache() calls it makes (release policies)
    # how a service gets it: {"args": guard.Janitor(...) keyword arguments, "use": "janitor" (`with janitor:`
    # around each request) or "janitor.request(size)" (`with janitor.request(size):`)}
    janitor: dict[str, Any] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    trace: Any = field(default=None, repr=False, compare=False)  # the rewritten recording (not in JSON)

    @property
    def utilization(self) -> float | None:
        """peak allocated ÷ peak reserved (`units.utilization`)."""
        return utilization(self.peak_allocated, self.peak_reserved)

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("trace")
        d["notes"] = list(self.notes)
        d["utilization"] = self.utilization
        d["code"] = self.how_to  # the line to write, under the name every remedy row shares
        if self.bound is not None and self.min_budget is not None and self.bound < self.min_budget:
            d["min_budget_range"] = [self.bound, self.min_budget]
        return d


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


def activity(trace: Trace, conf: str, reference: Trace) -> tuple[int, int, int, int]:
    """(peak reserved, peak allocated, driver calls, MiB reserved or released) of an uncapped replay."""
    from alloctune.sim.replay import replay

    r = replay(trace, conf or None, reference=reference)
    calls = int(r.stats.get("num_device_alloc", 0)) + int(r.stats.get("num_device_free", 0))
    moved = sum(e.size for e in r.segment_events if e.action != "oom")
    return r.peak_reserved, r.peak_allocated, calls, moved >> 20


def min_budget(trace: Trace, conf: str, reference: Trace) -> int | None:
    """The min budget of a rewritten recording, to 0.2 % or 1 MiB (a remedy's saving is often a few
    percent, finer than the default bisection resolution)."""
    from alloctune.sim.sweep import sweep

    return sweep(trace, [conf], find_min=True, reference=reference, rel_tol=WHAT_IF_REL_TOL,
                 abs_tol=WHAT_IF_ABS_TOL).rows[0].min_budget


def simulated(name: str, what: str, t: Trace, conf: str, reference: Trace, base: int | None,
              base_activity: tuple[int, int, int, int], how_to: str, **extra: Any) -> Remedy:
    """A remedy whose rewritten recording is `t`: its min budget, peaks and added driver work."""
    mb = min_budget(t, conf, reference)
    peak, peak_alloc, calls, mib = activity(t, conf, reference)
    extra_calls = max(0, calls - base_activity[2])
    seconds = extra_calls * DRIVER_CALL_S + max(0, mib - base_activity[3]) * DRIVER_MIB_S
    return Remedy(name, what, mb, None if mb is None or base is None else base - mb, peak, peak_alloc,
                  extra_calls, seconds, how_to, SIMULATED, conf, trace=t, **extra)


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
