"""Replay a recorded request stream through the simulated allocator: `replay()` -> `SimResult`.

The stream is what the program asked for (alloc / free / empty_cache, and the requests
that failed on the GPU); the allocator model decides everything else. A FAILED_ALLOC is
expected to fail again: it is replayed, counted, and the replay continues past it as the
program did. A failure the recording did not have ends the replay: that is the OOM point.
`start` opens the same replay paused before its first request (`sim.session`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Union

from alloctune.sim import native
from alloctune.sim.allocator import CachingAllocator, OOMInfo
from alloctune.sim.driver import DEFAULT_OVERHEAD, H200_TOTAL, AddressModel, Device, DriverVA, RecordedAddresses
from alloctune.sim.session import Checkpoints, PySession, native_output, native_session
from alloctune.sim.settings import SimSettings
from alloctune.trace.model import SegmentEvent, Trace, reserved_by_mark

if TYPE_CHECKING:
    from alloctune.sim._native import Session as NativeSession

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
    # `keep_states=True`: states of this run a min-budget bisection of the same trace, setting and
    # addresses starts its probes from (`sim.session.Checkpoints`); not a result (not in `to_dict`)
    states: Checkpoints | None = field(default=None, compare=False, repr=False)

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
    keep_states: bool = False,
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
    model; both give identical results. `keep_states` (an uncapped run): also keep where capped
    runs would leave this one, for `sim.budget.min_budget(uncapped=...)` (`SimResult.states`;
    native core, its address models, no garbage collection).
    """
    op = _open(
        trace, config, budget, total_memory, torch, addresses, reference, overhead, timeline_points, record_events, stop_at_oom
    )
    settings, total, n, rec = op.settings, op.total, len(trace.requests), op.recorded
    states = None
    if (
        keep_states
        and stop_at_oom
        and op.cap is None
        and not isinstance(op.session, PySession)
        and op.session.cloneable
        and settings.garbage_collection_threshold <= 0
    ):
        cols = native.columns(trace.requests)
        if cols is not None:
            states = Checkpoints(cols, n)
            states.lay(op.session)
    op.session.run(n)
    run = op.session.output() if isinstance(op.session, PySession) else native_output(op.session, op.cap)
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
        address_divergence=rec.diverged_at if rec is not None and rec.asked else run.address_divergence,
        addresses=(
            f"recorded:{(reference or trace).source}"
            if addresses == "recorded"
            else "model"
            if addresses == "model"
            else "custom"
        ),
        states=states,
    )


Paused = Union[PySession, "NativeSession"]


@dataclass(frozen=True)
class _Opened:
    """A replay opened at request 0 and what `replay` reports of its setup."""

    session: Paused
    settings: SimSettings
    total: int
    cap: int | None
    recorded: RecordedAddresses | None  # the recorded address model, when that places segments


def _open(
    trace: Trace,
    config: Any,
    budget: int | None,
    total_memory: int | None,
    torch: str | None,
    addresses: Addresses | AddressModel,
    reference: Trace | None,
    overhead: int | None,
    timeline_points: int,
    record_events: bool,
    stop_at_oom: bool,
) -> _Opened:
    settings = SimSettings.from_config(config, torch)
    total = int(total_memory or trace.total_memory or H200_TOTAL)
    model = _address_model(trace, addresses, reference)
    device = Device(total, DEFAULT_OVERHEAD if overhead is None else overhead, model)
    cap = allocator_cap(settings, budget, total)
    step = max(1, len(trace.requests) // max(1, timeline_points))
    session: Paused | None = native_session(trace.requests, settings, cap, device, record_events, stop_at_oom, step)
    if session is None:
        session = PySession(CachingAllocator(settings, cap, device, record_events), trace.requests, stop_at_oom, step)
    return _Opened(session, settings, total, cap, model if isinstance(model, RecordedAddresses) else None)


def start(
    trace: Trace,
    config: Any = None,
    budget: int | None = None,
    total_memory: int | None = None,
    torch: str | None = None,
    *,
    addresses: Addresses | AddressModel = "recorded",
    reference: Trace | None = None,
    record_events: bool = False,
    stop_at_oom: bool = True,
) -> Paused:
    """`replay`'s run of `trace` (same arguments), paused before its first request: `run(stop)`,
    read `reserved`, put in `empty_cache()`, and (native core) `clone()` / `set_cap()`; see
    `sim.session`. The native core's session when it is built, else the Python model's."""
    return _open(trace, config, budget, total_memory, torch, addresses, reference, None, 1, record_events, stop_at_oom).session


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
    alloc = make_allocator(settings, budget=budget, total_memory=total, addresses=_address_model(trace, addresses, reference))
    req = trace.requests
    PySession(alloc, req, True, max(1, len(req))).run(min(request_index, len(req)))
    return alloc
