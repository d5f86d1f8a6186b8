"""Replay a recorded request stream through the simulated allocator: `replay()` -> `SimResult`.

The stream is what the program asked for (alloc / free / empty_cache, and the requests
that failed on the GPU); the allocator model decides everything else. A FAILED_ALLOC is
expected to fail again: it is replayed, counted, and the replay continues past it as the
program did. A failure the recording did not have ends the replay: that is the OOM point.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Literal, cast

from alloctune.sim import native
from alloctune.sim.allocator import CachingAllocator, OOMInfo
from alloctune.sim.driver import DEFAULT_OVERHEAD, H200_TOTAL, AddressModel, Device, DriverVA, RecordedAddresses
from alloctune.sim.settings import SimSettings
from alloctune.sim.stats import Stats
from alloctune.trace.model import (
    ALLOC,
    EMPTY_CACHE,
    FAILED_ALLOC,
    FREE,
    RequestStream,
    SegmentEvent,
    Trace,
    reserved_by_mark,
)

if TYPE_CHECKING:
    from alloctune.sim._native import ReplayResult
    from alloctune.sim.blocks import Block, SimAction

SCHEMA = "alloctune.sim_result/1"
Addresses = Literal["model", "recorded"]


@dataclass(frozen=True)
class SimResult:
    """What one replay produced. Bytes are ints; `to_dict()` is the JSON form."""

    source: str
    settings: dict[str, Any]
    budget: int | None  # the cap as given (bytes), None = uncapped
    cap: int | None  # allowed_memory_maximum the allocator enforced
    total_memory: int
    completed: bool  # False: an allocation the recording did not fail failed here (see oom)
    requests: int  # length of the stream
    requests_done: int  # requests replayed (== requests when completed)
    peak_reserved: int
    peak_allocated: int
    peak_requested: int
    stats: dict[str, Any]
    segment_events: tuple[SegmentEvent, ...]
    oom: OOMInfo | None  # the failure that ended the replay
    expected_failures: tuple[int, ...] = ()  # request indices of FAILED_ALLOCs that failed again
    unexpected_successes: tuple[int, ...] = ()  # FAILED_ALLOCs that fit in the simulation
    failures: tuple[OOMInfo, ...] = ()  # allocator state at each expected failure (same order)
    timeline: dict[str, list[int]] = field(default_factory=dict)  # index/reserved/allocated, downsampled
    adapted: tuple[int, ...] = ()  # fallible requests that failed and were served by a fallback size
    address_divergence: int | None = None  # recorded addresses: first segment whose size differs
    addresses: str = "model"  # "recorded:<source>" | "model" | "custom": where addresses came from

    @property
    def utilization(self) -> float:
        """Peak allocated / peak reserved (the GMLake / STAlloc metric)."""
        return self.peak_allocated / self.peak_reserved if self.peak_reserved else 1.0

    @property
    def fragmentation(self) -> float:
        return 1.0 - self.utilization

    @property
    def num_alloc_retries(self) -> int:
        return int(self.stats.get("num_alloc_retries", 0))

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "source": self.source,
            "settings": self.settings,
            "budget": self.budget,
            "cap": self.cap,
            "total_memory": self.total_memory,
            "completed": self.completed,
            "requests": self.requests,
            "requests_done": self.requests_done,
            "peak_reserved": self.peak_reserved,
            "peak_allocated": self.peak_allocated,
            "peak_requested": self.peak_requested,
            "utilization": self.utilization,
            "num_alloc_retries": self.num_alloc_retries,
            "stats": self.stats,
            "oom": self.oom.to_dict() if self.oom else None,
            "expected_failures": list(self.expected_failures),
            "unexpected_successes": list(self.unexpected_successes),
            "failures": [f.to_dict() for f in self.failures],
            "timeline": self.timeline,
            "adapted": list(self.adapted),
            "segment_events": [e.to_dict() for e in self.segment_events],
            "address_divergence": self.address_divergence,
            "addresses": self.addresses,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SimResult":
        oom = d.get("oom")
        return cls(
            source=d["source"],
            settings=d["settings"],
            budget=d.get("budget"),
            cap=d.get("cap"),
            total_memory=d["total_memory"],
            completed=d["completed"],
            requests=d["requests"],
            requests_done=d["requests_done"],
            peak_reserved=d["peak_reserved"],
            peak_allocated=d["peak_allocated"],
            peak_requested=d["peak_requested"],
            stats=d["stats"],
            segment_events=tuple(SegmentEvent(**e) for e in d.get("segment_events", [])),
            oom=OOMInfo(**oom) if oom else None,
            expected_failures=tuple(d.get("expected_failures", ())),
            unexpected_successes=tuple(d.get("unexpected_successes", ())),
            failures=tuple(OOMInfo(**f) for f in d.get("failures", ())),
            timeline=d.get("timeline", {}),
            adapted=tuple(d.get("adapted", ())),
            address_divergence=d.get("address_divergence"),
            addresses=d.get("addresses", "model"),
        )


def cap_from_budget(budget: int | None, total_memory: int, torch: tuple[int, int] = (2, 11)) -> int | None:
    """The `allowed_memory_maximum` a budget becomes via `set_per_process_memory_fraction`.

    The fraction goes through a double: (size_t)(budget / total * total). From 2.10 a
    fraction >= 1 means no cap at all (and so no garbage collection).
    """
    if budget is None:
        return None
    fraction = budget / total_memory
    if torch >= (2, 10) and fraction >= 1.0:
        return None
    return int(fraction * total_memory)


def allocator_cap(settings: SimSettings, budget: int | None, total_memory: int) -> int | None:
    """The cap the allocator enforces: the budget's, else the `per_process_memory_fraction` key's."""
    cap = cap_from_budget(budget, total_memory, settings.torch)
    frac = settings.per_process_memory_fraction
    if budget is None and frac is not None and frac < 1.0:
        # the config key caps the allocator at construction; an API budget would replace it
        cap = int(frac * total_memory)
    return cap


def make_allocator(
    settings: SimSettings,
    *,
    budget: int | None = None,
    total_memory: int = H200_TOTAL,
    overhead: int = DEFAULT_OVERHEAD,
    addresses: AddressModel | None = None,
    record_events: bool = True,
) -> CachingAllocator:
    device = Device(total_memory, overhead, addresses or DriverVA())
    return CachingAllocator(settings, allocator_cap(settings, budget, total_memory), device, record_events)


@dataclass
class _Run:
    """What a replay loop produced, whichever core ran it (internal: `replay` turns it into a SimResult)."""

    done: int
    stats: Stats
    events: list[tuple[SimAction, int, int, int, int]] | None  # (action, addr, size, stream, request_index)
    oom: OOMInfo | None  # the last failed ALLOC (after its fallbacks)
    expected: list[int]
    failures: list[OOMInfo]
    surprises: list[int]
    adapted: list[int]
    t_index: list[int]
    t_alloc: list[int]
    cap: int | None


def replay(
    trace: Trace,
    config: Any = None,
    budget: int | None = None,
    total_memory: int | None = None,
    torch: str | None = None,
    *,
    addresses: Addresses | AddressModel = "recorded",
    reference: Trace | None = None,
    overhead: int | None = None,
    timeline_points: int = 1000,
    record_events: bool = True,
    stop_at_oom: bool = True,
) -> SimResult:
    """Replay `trace`'s request stream under `config` (an `AllocatorConfig`, `SimSettings`,
    or None for the defaults) with an optional per-process `budget` in bytes.

    Segment addresses (they decide ties between equal-size free blocks on torch <= 2.11):
    `addresses="recorded"` (default) places the k-th new segment where `reference` (default:
    `trace` itself) placed its k-th segment — exact when `reference` was recorded under the
    simulated setting, the best available guess otherwise (the `DriverVA` model takes over
    for a segment whose recorded range is taken); `"model"` uses only the model.
    `torch=None` keeps a `SimSettings`' own version (else 2.11).

    The loop runs in the native core when it is built (`sim/native.py`), else in the Python
    model; both give identical results.
    """
    settings = SimSettings.from_config(config, torch)
    total = int(total_memory or trace.total_memory or H200_TOTAL)
    model = _address_model(trace, addresses, reference)
    rec = model if isinstance(model, RecordedAddresses) else None
    device = Device(total, DEFAULT_OVERHEAD if overhead is None else overhead, model)
    cap = allocator_cap(settings, budget, total)
    n = len(trace.requests)
    step = max(1, n // max(1, timeline_points))
    run = _run_native(trace.requests, settings, cap, device, record_events, stop_at_oom, step)
    if run is None:
        alloc = CachingAllocator(settings, cap, device, record_events)
        run = _run_python(alloc, trace.requests, n, stop_at_oom, step)
    done = run.done
    events = tuple(SegmentEvent(a, addr, size, stream, -1, ri) for a, addr, size, stream, ri in (run.events or ()))
    timeline = {
        "index": run.t_index,
        "allocated": run.t_alloc,
        "reserved": reserved_by_mark(events, run.t_index) if record_events else [],  # rebuilt from events
    }
    oom = run.oom
    if oom is not None and oom.request_index in run.expected:
        oom = None
    if oom is not None:
        oom = replace(oom, expected=False)
    st = run.stats
    return SimResult(
        source=trace.source,
        settings=settings.to_dict(),
        budget=budget,
        cap=run.cap,
        total_memory=total,
        completed=oom is None or not stop_at_oom,
        requests=n,
        requests_done=done,
        peak_reserved=st.reserved_peak,
        peak_allocated=st.allocated_peak,
        peak_requested=st.requested_peak,
        stats=st.as_dict(),
        segment_events=events,
        oom=oom,
        expected_failures=tuple(run.expected),
        unexpected_successes=tuple(run.surprises),
        failures=tuple(run.failures),
        timeline=timeline,
        adapted=tuple(run.adapted),
        address_divergence=rec.diverged_at if rec is not None else None,
        addresses=(
            f"recorded:{(reference or trace).source}" if addresses == "recorded"
            else "model" if addresses == "model" else "custom"
        ),
    )


def _run_native(
    req: RequestStream, settings: SimSettings, cap: int | None, device: Device,
    record_events: bool, stop_at_oom: bool, step: int,
) -> _Run | None:
    """The loop in the native core; None when it is not available (or a value does not fit it)."""
    mod = native.core()
    if mod is None:
        return None
    cols = native.columns(req)
    table = settings.roundup_power2_divisions
    if cols is None or len(table) != 16 or not all(
        -(1 << 63) <= x < (1 << 63) for sizes in req.fallbacks.values() for x in sizes
    ):
        return None  # a value beyond int64 (or an odd table): the Python model replays it
    s = (
        cap,
        float(settings.garbage_collection_threshold),
        settings.max_split_size,
        settings.nsr,
        settings.segment_size_mid,
        settings.expandable_segments,
        tuple(int(d) for d in table) if any(d > 1 for d in table) else None,
        settings.seg_id_tiebreak,
    )
    va = device.va
    out: ReplayResult = mod.replay(
        *cols, req.fallbacks, s, (device.total_memory, device.overhead),
        (device.addresses.alloc, device.addresses.free, va.alloc, va.free),
        (record_events, stop_at_oom, step),
    )
    done, stats, events, oom, expected, failures, surprises, adapted, t_index, t_alloc = out
    st = Stats()
    for name, value in zip(Stats.__slots__, stats):
        setattr(st, name, value)
    acts = native.ACTIONS
    return _Run(
        done=done,
        stats=st,
        events=None if events is None else [(acts[e[0]], e[1], e[2], e[3], e[4]) for e in events],
        oom=OOMInfo(*oom) if oom is not None else None,
        expected=expected,
        failures=[OOMInfo(*f, expected=True) for f in failures],
        surprises=surprises,
        adapted=adapted,
        t_index=t_index,
        t_alloc=t_alloc,
        cap=cap,
    )


def _run_python(alloc: CachingAllocator, req: RequestStream, stop: int, stop_at_oom: bool, step: int) -> _Run:
    """The replay loop of the Python model: requests [0, stop) through `alloc` (the specification
    the native core follows). Also `state_at`'s loop."""
    ops, sizes, rids, streams = req.ops, req.sizes, req.rids, req.streams
    fallbacks = req.fallbacks
    live: dict[int, Block] = {}  # rid -> the block the program holds
    malloc, free, st = alloc.malloc, alloc.free, alloc.stats
    adapted: list[int] = []
    t_index: list[int] = []
    t_alloc: list[int] = []
    bucket_max = 0
    next_mark = step
    expected: list[int] = []
    surprises: list[int] = []
    failure_info: list[OOMInfo] = []
    oom: OOMInfo | None = None
    done = stop
    # The loop makes ~10^6 small objects linked in cycles (prev/next); the cyclic GC would
    # rescan them again and again for nothing, so it is paused for the loop.
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for i in range(stop):
            if i == next_mark:
                t_index.append(i)
                t_alloc.append(bucket_max)
                bucket_max = st.allocated
                next_mark += step
            op = ops[i]
            if op == ALLOC:
                alloc.request_index = i  # (frees make no segment events: not needed there)
                b = malloc(sizes[i], streams[i])
                if b is None and i in fallbacks:
                    b = _fall_back(malloc, fallbacks[i], streams[i])
                    if b is not None:
                        adapted.append(i)
                if b is None:
                    oom = alloc.oom
                    if stop_at_oom:
                        done = i
                        break
                    continue
                live[rids[i]] = b
                if st.allocated > bucket_max:
                    bucket_max = st.allocated
            elif op == FREE:
                b = live.pop(rids[i], None)
                if b is not None:
                    free(b)
            elif op == EMPTY_CACHE:
                alloc.request_index = i
                alloc.empty_cache()
            elif op == FAILED_ALLOC:
                alloc.request_index = i
                b = malloc(sizes[i], streams[i])
                if b is None:
                    expected.append(i)
                    failure_info.append(replace(cast(OOMInfo, alloc.oom), expected=True))  # set by the failure
                else:  # it fits here although it did not on the GPU: the program never got it
                    surprises.append(i)
                    free(b)
    finally:
        if gc_was_on:
            gc.enable()
    t_index.append(done)
    t_alloc.append(bucket_max)
    events = None
    if alloc.events is not None:
        events = [(e.action, e.addr, e.size, e.stream, e.request_index) for e in alloc.events]
    return _Run(done, st, events, oom, expected, failure_info, surprises, adapted, t_index, t_alloc, alloc.cap)


def _fall_back(malloc: Callable[[int, int], Block | None], sizes: tuple[int, ...], stream: int) -> Block | None:
    """A fallible request failed: ask for its fallback sizes in order, as the program does
    (each failed try is an OOM the allocator counts); the first block that fits, or None."""
    for size in sizes:
        b = malloc(size, stream)
        if b is not None:
            return b
    return None


def _address_model(trace: Trace, addresses: Addresses | AddressModel, reference: Trace | None) -> AddressModel:
    if addresses == "recorded":
        ref = reference or trace
        return RecordedAddresses((e.size, e.addr) for e in ref.segment_events if e.action == "segment_alloc")
    if addresses == "model":
        return DriverVA()
    if isinstance(addresses, str):
        raise ValueError(f"addresses must be 'recorded', 'model' or an address model, not {addresses!r}")
    return addresses


def state_at(
    trace: Trace,
    config: Any = None,
    request_index: int = 0,
    *,
    budget: int | None = None,
    total_memory: int | None = None,
    torch: str | None = None,
    addresses: Addresses | AddressModel = "recorded",
    reference: Trace | None = None,
) -> CachingAllocator:
    """The simulated allocator just before request `request_index` (for inspecting a mismatch:
    `.segment_table()`, `.stats`, `.events`). Always the Python model: its state is the object."""
    settings = SimSettings.from_config(config, torch)
    total = int(total_memory or trace.total_memory or H200_TOTAL)
    alloc = make_allocator(settings, budget=budget, total_memory=total,
                           addresses=_address_model(trace, addresses, reference))
    req = trace.requests
    _run_python(alloc, req, min(request_index, len(req)), True, max(1, len(req)))
    return alloc
