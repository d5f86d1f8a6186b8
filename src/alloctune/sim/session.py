"""Replays that pause: run up to a request index, read the allocator there, put an
`empty_cache()` in or change the cap, copy the state, and run on.

Why: two answers need a replay's state between requests rather than at its end.

* A policy that decides clean-ups from the allocator's statistics (`remedy.janitor`: the real
  Janitor driven by the simulated allocator) puts each clean-up in where it decides it, in one
  run, instead of replaying the recording again after each decision.
* A min-budget bisection (`sim.budget`) replays one trace under many caps, and the allocator
  uses the cap in one comparison only (reserved + segment size > cap, when it asks the driver
  for memory). Until the first comparison a cap fails, a capped run *is* the uncapped one, so
  each capped run can start from a copy of a state of the uncapped run: a state at request i
  of a run whose comparisons have all passed (`diverged` false; `vmax` the largest value one
  passed) is the state at i of the run under any cap >= that `vmax` (garbage collection aside:
  with a threshold set the cap also decides when that runs, so such runs share nothing).

`replay.start` opens a paused replay: the native core's `Session` when the core is built (copies
with `clone`, only where the address models are its native twins), else `PySession`, the Python
model's loop -- the specification; `replay()` is `start` run to the end. Both hold the same
results: `tests/test_sim_native.py` compares them. The native core runs requests and makes copies
without holding the GIL (where no fallback or address model of Python is called), so replays in
another thread go on meanwhile (`remedy.model.Shared`). `Checkpoints` keeps the shared states of
one trace, setting and address source: an uncapped `replay(..., keep_states=True)` lays them down,
and the bisections that start from that replay (`sim.budget`) start their probes there.
"""

from __future__ import annotations

import gc
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Protocol, cast

from alloctune.sim import native
from alloctune.sim.allocator import CachingAllocator, OOMInfo
from alloctune.sim.driver import AddressModel, Device
from alloctune.sim.settings import SimSettings
from alloctune.sim.stats import Stats
from alloctune.trace.model import ALLOC, EMPTY_CACHE, FAILED_ALLOC, FREE, RequestStream

if TYPE_CHECKING:
    from alloctune.sim._native import Session as NativeSession
    from alloctune.sim.blocks import Block, SimAction


class Session(Protocol):
    """What both cores' paused replays answer (`NativeSession` also copies and re-caps)."""

    @property
    def pos(self) -> int: ...  # the next request to run
    @property
    def failed(self) -> bool: ...  # stopped at an allocation that failed (stop_at_oom)
    @property
    def reserved(self) -> int: ...  # reserved bytes now
    def run(self, stop: int) -> None: ...  # run the requests before index `stop`
    def empty_cache(self) -> None: ...  # an empty_cache() call now, between two requests


@dataclass
class RunOutput:
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
    address_divergence: int | None = None  # set by the native core when it placed recorded addresses


CHECKPOINTS = 16  # states an uncapped run keeps (each a copy of the allocator's state: ~35 k requests' replay)
MIN_GAP = 4096  # requests between two of them, at least


class Checkpoints:
    """Where the capped runs of one trace (`columns`), setting and address source stand at a few
    requests, read off their uncapped run.

    `states`: the uncapped run paused at every `1/CHECKPOINTS` of the trace, each with its `vmax`
    there: the state at that request of the run under any cap >= that `vmax`, whatever the trace's
    fallbacks (no allocation has failed before it). `top`: the largest value a cap comparison of the
    uncapped run took; a cap at or above it is never refused, so the run under it *is* the uncapped
    run (`completed`). Probes from several threads are safe: a state is copied by one at a time."""

    def __init__(self, columns: native.Columns, n: int) -> None:
        self.columns, self.n = columns, n
        self.every = max(MIN_GAP, n // CHECKPOINTS)
        self.states: list[tuple[int, NativeSession]] = []  # (vmax, paused run), in request order
        self.top = 0
        self.completed = False
        self._copying = threading.Lock()  # a copy marks its source busy

    def lay(self, run: NativeSession) -> None:
        """Run the uncapped `run` to its end, keeping the states."""
        while not run.failed and run.pos < self.n:
            stop = (run.pos // self.every + 1) * self.every
            run.run(stop)
            if stop < self.n and run.pos == stop and not run.failed:
                self.states.append((run.vmax, run.clone(events=False)))
        run.run(self.n)
        self.top, self.completed = run.vmax, not run.failed

    def completes(self, cap: int | None, fallbacks: dict[int, tuple[int, ...]], fresh: Callable[[], Any]) -> bool:
        """Whether the run under `cap` completes (the trace's `fallbacks`; `fresh`: a new native session
        at request 0, for a cap below every kept state's `vmax`)."""
        if cap is None or cap >= self.top:
            return self.completed  # never refused: the uncapped run itself
        usable = [state for vmax, state in self.states if vmax <= cap]
        if usable:
            with self._copying:
                run: NativeSession = usable[-1].clone(events=False, fallbacks=fallbacks)
        else:
            run = fresh()
        run.set_cap(cap)
        run.run(self.n)
        return not run.failed


class PySession:
    """The replay loop of the Python model, resumable: requests [pos, stop) through `alloc` (the
    specification the native core follows). Also `replay.state_at`'s loop."""

    def __init__(self, alloc: CachingAllocator, req: RequestStream, stop_at_oom: bool, step: int) -> None:
        self.alloc, self.req = alloc, req
        self.stop_at_oom, self.step = stop_at_oom, step
        self.live: dict[int, Block] = {}  # rid -> the block the program holds
        self.adapted: list[int] = []
        self.t_index: list[int] = []
        self.t_alloc: list[int] = []
        self.expected: list[int] = []
        self.surprises: list[int] = []
        self.failures: list[OOMInfo] = []
        self.bucket_max = 0
        self.next_mark = step
        self.oom: OOMInfo | None = None
        self.pos = 0
        self.done: int | None = None  # where an OOM stopped it
        self.failed = False

    @property
    def reserved(self) -> int:
        return self.alloc.stats.reserved

    def empty_cache(self) -> None:
        if not self.failed:
            self.alloc.request_index = self.pos
            self.alloc.empty_cache()

    def run(self, stop: int) -> None:
        """Run requests [pos, stop) (fewer when an allocation fails and `stop_at_oom`)."""
        alloc, req = self.alloc, self.req
        ops, sizes, rids, streams = req.ops, req.sizes, req.rids, req.streams
        fallbacks, live, adapted = req.fallbacks, self.live, self.adapted
        malloc, free, st = alloc.malloc, alloc.free, alloc.stats
        bucket_max, next_mark, step = self.bucket_max, self.next_mark, self.step
        stop = min(stop, len(req))
        # The loop makes ~10^6 small objects linked in cycles (prev/next); the cyclic GC would
        # rescan them again and again for nothing, so it is paused for the loop.
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            for i in range(self.pos, stop if not self.failed else self.pos):
                if i == next_mark:
                    self.t_index.append(i)
                    self.t_alloc.append(bucket_max)
                    bucket_max = st.allocated
                    next_mark += step
                op = ops[i]
                if op == ALLOC:
                    alloc.request_index = i  # (frees make no segment events: not needed there)
                    b = malloc(sizes[i], streams[i])
                    if b is None and i in fallbacks:
                        b = fall_back(malloc, fallbacks[i], streams[i])
                        if b is not None:
                            adapted.append(i)
                    if b is None:
                        self.oom = alloc.oom
                        if self.stop_at_oom:
                            self.done, self.failed, stop = i, True, i
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
                        self.expected.append(i)
                        self.failures.append(replace(cast(OOMInfo, alloc.oom), expected=True))  # set by the failure
                    else:  # it fits here although it did not on the GPU: the program never got it
                        self.surprises.append(i)
                        free(b)
        finally:
            if gc_was_on:
                gc.enable()
        self.bucket_max, self.next_mark = bucket_max, next_mark
        self.pos = max(self.pos, stop)

    def output(self) -> RunOutput:
        """The run's results, once it has run to its end or stopped at an OOM."""
        alloc = self.alloc
        done = self.pos if self.done is None else self.done
        events = None
        if alloc.events is not None:
            events = [(e.action, e.addr, e.size, e.stream, e.request_index) for e in alloc.events]
        return RunOutput(
            done,
            alloc.stats,
            events,
            self.oom,
            self.expected,
            self.failures,
            self.surprises,
            self.adapted,
            [*self.t_index, done],
            [*self.t_alloc, self.bucket_max],
            alloc.cap,
        )


def fall_back(malloc: Callable[[int, int], Block | None], sizes: tuple[int, ...], stream: int) -> Block | None:
    """A fallible request failed: ask for its fallback sizes in order, as the program does
    (each failed try is an OOM the allocator counts); the first block that fits, or None."""
    for size in sizes:
        b = malloc(size, stream)
        if b is not None:
            return b
    return None


def _native_spec(model: AddressModel) -> tuple[Any, ...]:
    """A model's native twin (`AddressModel.native_spec`), else the model itself called back."""
    spec = getattr(model, "native_spec", None)
    found = spec() if callable(spec) else None
    return found if found is not None else ("py", model.alloc, model.free)


def native_session(
    req: RequestStream, settings: SimSettings, cap: int | None, device: Device, record_events: bool, stop_at_oom: bool, step: int
) -> NativeSession | None:
    """The native core's paused replay at request 0; None when the core is not available (or a
    value does not fit it: then the Python model replays)."""
    mod = native.core()
    if mod is None:
        return None
    cols = native.columns(req)
    table = settings.roundup_power2_divisions
    if (
        cols is None
        or len(table) != 16
        or not all(-(1 << 63) <= x < (1 << 63) for sizes in req.fallbacks.values() for x in sizes)
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
    session: NativeSession = mod.session(
        *cols,
        req.fallbacks,
        s,
        (device.total_memory, device.overhead),
        (_native_spec(device.addresses), _native_spec(device.va)),
        (record_events, stop_at_oom, step),
    )
    return session


def native_output(session: NativeSession, cap: int | None) -> RunOutput:
    """A finished native session's results in the Python model's shapes."""
    done, stats, events, oom, expected, failures, surprises, adapted, t_index, t_alloc = session.result()
    st = Stats()
    for name, value in zip(Stats.__slots__, stats):
        setattr(st, name, value)
    acts = native.ACTIONS
    return RunOutput(
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
        address_divergence=session.address_divergence,
    )
