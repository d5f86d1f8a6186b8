"""What a remedy is: a rewrite of the recording plus its min budget, its code line and its method.

The field's standard advice ("call empty_cache() now and then", "run the Janitor", "cap the cuBLAS
workspace", "checkpoint the layers") is a number here: the recording's request stream rewritten the
way the remedy would change the program's requests (`rewritten`), fed to `sim.sweep` for its min
budget at the one resolution (`sim.resolution`, so `simulate --min-budget` of the written file
answers the same number), and replayed once uncapped for its peak reserved and the driver calls it
adds (each released segment is a cudaFree now and a cudaMalloc later): `simulated`. Where no rewrite
is exact (autograd off, cuDNN's algorithms) the remedy is measured by a run of the program with it
(`remedy.measured`), or carries the command of the run that would confirm it.

The time cost is an upper bound from the driver-call figures measured on the H200
(bench/driver_cost.py: 0.1 ms a call plus 2 µs per MiB, the same constants `tune` bounds
throughput with).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from alloctune.sim.resolution import ABS_TOL, REL_TOL
from alloctune.trace.model import Annotation, RequestStream, Trace
from alloctune.units import utilization

# Driver work, as measured on the H200 (bench/results/driver_cost.md); tune's TuneSettings defaults.
DRIVER_CALL_S = 1e-4
DRIVER_MIB_S = 2e-6
SIMULATED, MEASURED, UNCONFIRMED = "simulated", "measured", "needs a confirming run"


@dataclass(frozen=True)
class Remedy:
    """One program-level remedy and what it buys, for the user's own program.

    `name`: a stable key (`empty_cache_each_repetition`, `janitor`, `no_grad`, ...); `what`: the
    sentence; `method`: simulated (replayed on the recording), measured (a run of the program
    with it), or "needs a confirming run" (`confirm` says which); `min_budget`: for the latter,
    None (`bound` may hold the simulated lower bound); with `bound` below it, a range."""

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
    # the low end of min_budget's range: a simulated lower bound (every workspace-shaped request no
    # evidence covers given up, `workspace_floor`), or the only number known when min_budget is None
    bound: int | None = None
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


def recorded_conf(trace: Trace) -> str:
    """The allocator string the recording ran with ("" = defaults)."""
    conf = (trace.meta or {}).get("conf")
    if isinstance(conf, str):
        return conf
    text = (trace.allocator_settings or {}).get("PYTORCH_CUDA_ALLOC_CONF")
    return text if isinstance(text, str) else ""


def rewritten(trace: Trace, out: RequestStream, new_index: list[int]) -> Trace:
    """`trace` with its requests replaced by `out`; `new_index[r]` is where old request r went (its
    fallbacks and the segment events that happened at it follow it)."""
    req = trace.requests
    new_index[len(req)] = len(out)
    out.fallbacks = {new_index[i]: v for i, v in req.fallbacks.items()}
    if req.stack_ids is not None and out.stack_ids is None:  # each kept request keeps its call site
        ids = [-1] * len(out)
        for r in range(len(req)):
            k = new_index[r]
            if k < len(out) and out.rids[k] == req.rids[r] and out.ops[k] == req.ops[r]:
                ids[k] = req.stack_ids[r]
        out.stack_ids, out.stack_table = ids, req.stack_table
    if req.annotations and not out.annotations:  # each range keeps the requests it held
        out.annotations = [Annotation(a.name, new_index[a.start], new_index[a.end]) for a in req.annotations]
    seg = [replace(e, request_index=new_index[min(e.request_index, len(req))]) for e in trace.segment_events]
    return Trace(source=trace.source, device=trace.device, requests=out, segment_events=seg,
                 allocator_settings=dict(trace.allocator_settings), events=[], meta=dict(trace.meta or {}),
                 total_memory=trace.total_memory)


def activity(trace: Trace, conf: str, reference: Trace) -> tuple[int, int, int, int]:
    """(peak reserved, peak allocated, driver calls, MiB reserved or released) of an uncapped replay."""
    from alloctune.sim.replay import replay

    r = replay(trace, conf or None, reference=reference)
    calls = int(r.stats.get("num_device_alloc", 0)) + int(r.stats.get("num_device_free", 0))
    moved = sum(e.size for e in r.segment_events if e.action != "oom")
    return r.peak_reserved, r.peak_allocated, calls, moved >> 20


def min_budget(trace: Trace, conf: str, reference: Trace) -> int | None:
    """The min budget of a (rewritten) recording under `conf`, to the one resolution (`sim.resolution`:
    0.2 % or 1 MiB, finer than a remedy's saving of a few percent), so `alloctune simulate ... --min-budget`
    of the written recording answers the same number."""
    from alloctune.sim.sweep import sweep

    return sweep(trace, [conf], find_min=True, reference=reference, rel_tol=REL_TOL,
                 abs_tol=ABS_TOL).rows[0].min_budget


def workspace_floor(trace: Trace, conf: str, reference: Trace, need: int | None) -> int | None:
    """The min budget with every workspace-shaped request no evidence covers given up
    (`trace.fallible.optimistic`), when it lies below `need` (the replay as recorded); else None.

    Why: under a cap cuDNN answers a failed workspace with another algorithm, so a recording
    without C++ frames or a calibration run only brackets the real need: as recorded is the high
    end, this the low one. On the H100's Faster R-CNN (tests/data/remedies_gpu det) the real need
    of the program with empty_cache() after every batch lay 0.04 % above this end and 9 % below
    the other."""
    from alloctune.trace.fallible import optimistic, untagged_note

    if need is None or untagged_note(trace) is None:
        return None
    low = min_budget(optimistic(trace), conf, reference)
    return low if low is not None and low < need else None


def simulated(name: str, what: str, t: Trace, conf: str, reference: Trace, base: int | None,
              base_activity: tuple[int, int, int, int], how_to: str, **extra: Any) -> Remedy:
    """A remedy whose rewritten recording is `t`: its min budget (and, where workspaces no evidence
    covers could be given up, the low end of its range as `bound`), peaks and added driver work."""
    mb = min_budget(t, conf, reference)
    peak, peak_alloc, calls, mib = activity(t, conf, reference)
    extra_calls = max(0, calls - base_activity[2])
    seconds = extra_calls * DRIVER_CALL_S + max(0, mib - base_activity[3]) * DRIVER_MIB_S
    if "bound" not in extra:
        extra["bound"] = workspace_floor(t, conf, reference, mb)
    return Remedy(name, what, mb, None if mb is None or base is None else base - mb, peak, peak_alloc,
                  extra_calls, seconds, how_to, SIMULATED, conf, trace=t, **extra)
