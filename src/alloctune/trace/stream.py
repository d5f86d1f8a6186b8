"""Turn one device's recorded allocator events into the program's request stream.

The snapshot mixes two voices: what the *program* asked for (allocations, frees,
`empty_cache()` calls) and what the *allocator* did about it (cudaMalloc/cudaFree,
expandable map/unmap, OOM). The simulator replays the first and must reproduce the
second, so this module separates them.

Rules (tested on hand-made histories and the shared H200 traces, tests/test_trace_stream.py;
tests/test_trace_gpu.py checks them against programs whose calls are known):

* `alloc` -> ALLOC with a fresh allocation id (rid, counting from 0); `size` is the
  requested byte count before rounding, exactly what the program asked for.
* `free_completed` -> FREE of the rid allocated at that (address, stream). The allocator
  returns a block to its pool at `free_completed`, not at `free_requested`: the two differ
  only for blocks used on other streams (`record_stream`) or freed during graph capture,
  whose reuse must wait for recorded CUDA events. `free_requested` is therefore skipped.
* `oom` -> FAILED_ALLOC. Its `size` is the *rounded* request (`round_size`, a multiple
  of 512 bytes; spec section 3.7 and 9.2), not the user's byte count and not the 2 MiB / 20 MiB
  `alloc_size` that the error message prints. Rounding is idempotent, so replaying it as a
  request of that size asks the allocator for the same block. Checked on the data: every
  `oom` size is a multiple of 512 and its `alloc_size` equals "Tried to allocate" in the
  sidecar's `oom_message`.
* `torch.cuda.empty_cache()` leaves no entry of its own; it shows up only as a burst of
  `segment_free` / `segment_unmap` events (or nothing at all when there was nothing to
  release). The allocator's own malloc slow path releases segments too (garbage
  collection, release of oversize blocks with `max_split_size_mb`, release-all-and-retry),
  and always *before* it maps memory for, or gives up on, the request that triggered it:
  such a burst is immediately followed by the `segment_alloc` / `segment_map` or the
  `oom` of that request. An `empty_cache()` burst is followed by anything else (the
  program's next `alloc` that reuses cached memory, a free, the end of the trace).

  The one ambiguous case is an `empty_cache()` directly followed by an allocation that
  needs a new segment. Release-all-and-retry and release of oversize blocks run only
  after a cudaMalloc failed, i.e. when reserved + the new segment exceeds the limit: the
  cap (`set_per_process_memory_fraction`) when one was set, else the device (its memory
  less the CUDA context, assuming no other process takes memory during the run). So when
  `reserved before the burst + next segment size <= max(limit, highest reserved level
  reached so far)` the burst is the program's `empty_cache()`. The limit comes from the
  run's record (`cap`, `total_memory` of the sidecar); without it only the level already
  reached proves anything (a run cannot fail below a level it has held). Garbage
  collection needs no failure but runs only under a cap, and releases nothing unless
  reserved exceeds `garbage_collection_threshold` x cap: with GC on and the cap unknown,
  such bursts stay with the allocator -- unless the burst frees a small-pool segment (2 MiB),
  which GC never does (it walks the large pool only). Every one of the allocator's releases
  comes after its search of the cache found no block for the request (`get_free_block`), so
  where the recording's own layout just before the burst shows a cached block the request
  could take (same stream and pool, at least its size, within the split rules of
  `max_split_size_mb`: `held.Held`), the burst is the program's `empty_cache()` too.
  Otherwise (a new segment beyond the limit, no such block) the burst stays with the
  allocator: an `empty_cache()` there is indistinguishable from release-and-retry. (With
  expandable segments under a cap the cap test uses the rounded segment size, not the
  mapped size, so the test is slightly optimistic there; the layout test is not made there.)

  An `empty_cache()` that releases nothing leaves no event at all and cannot be inferred.
  Recordings made by alloctune's agent carry the program's calls themselves: the agent
  wraps `torch.cuda.empty_cache` and writes each call's wall-clock interval (µs, the clock
  of the events' `time_us`) under the snapshot key `alloctune_empty_cache_calls`. With
  those marks the calls are exact: the release burst inside a call's interval is that call
  (within the clocks' tolerance, the closest burst that no request of the program separates from it),
  a call with no burst becomes an EMPTY_CACHE at its place in time, and every other burst
  directly before a malloc's segment or OOM is the allocator's (a burst that no malloc
  follows is still the program's: the allocator releases only inside malloc).

  A burst followed by an `oom` is always counted as the allocator's: if the program had
  called `empty_cache()` just before, the allocator's retry would have released the same
  segments, so replaying it either way gives the same state.

Segment events (`segment_alloc`, `segment_free`, `segment_map`, `segment_unmap`) and `oom`
are kept as `SegmentEvent`s whose `request_index` is the request they belong to: the
allocation (or failed allocation) whose malloc produced them, or the inferred EMPTY_CACHE.
An `oom` event has no address (`addr` 0); its `device_free` (cudaMemGetInfo's free bytes
at the failure) is kept in `SegmentEvent.device_free`.

Requests: ALLOC (size = requested bytes, new rid), FREE (size = the freed allocation's
requested bytes, rid of that allocation), EMPTY_CACHE (size = rid = -1; the call is
device-wide, its stream is that of the first released segment), FAILED_ALLOC (size = the
rounded request, rid = -1). `event_index` points into the raw `device_traces` list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from alloctune.errors import TraceError
from alloctune.trace.held import SMALL_SEGMENT, Held, block_rules
from alloctune.trace.model import (
    ALLOC,
    EMPTY_CACHE,
    FAILED_ALLOC,
    FREE,
    RequestStream,
    SegmentEvent,
)
from alloctune.trace.stacks import collect_stacks
from alloctune.units import MiB

RELEASE_ACTIONS = frozenset({"segment_free", "segment_unmap"})
GROW_ACTIONS = frozenset({"segment_alloc", "segment_map"})
SEGMENT_ACTIONS = RELEASE_ACTIONS | GROW_ACTIONS
# Events that end a malloc slow path: the burst before them belongs to that malloc.
_MALLOC_CONTINUATION = GROW_ACTIONS | {"oom"}
# Snapshot key under which the agent writes the program's empty_cache() calls ([t0_us, t1_us] each).
EMPTY_CACHE_MARKS_KEY = "alloctune_empty_cache_calls"
# The agent's run record inside the snapshots it writes (cap, total memory, setting, command):
# a snapshot moved away from its report must still say which budget it ran under.
RUN_RECORD_KEY = "alloctune_run"
_RUN_RECORD_TYPES: dict[str, tuple[type[Any], ...]] = {
    "cap": (int,),
    "total_memory": (int,),
    "oom_limit": (int,),
    "device": (int,),
    "torch": (str,),
    "conf": (str,),
    "cmd": (list,),
    "cudnn_benchmark": (bool,),
}
RUN_RECORD_FIELDS = frozenset(_RUN_RECORD_TYPES)
# How far (µs) a release may lie outside a marked call's interval and still be that call's:
# the events' time_us is converted from a cycle counter, the marks from the wall clock.
MARK_TOLERANCE_US = 200
# Device memory never available to the allocator of an uncapped run: a lower bound on the CUDA
# context (the simulator's measured 518 MiB for torch 2.11 / CUDA 13 lives in sim/driver.py; the
# trace layer sits below sim and must not import it).
CUDA_CONTEXT_MIN = 512 * MiB


@dataclass(frozen=True)
class Limit:
    """What the recorded run could hold before cudaMalloc (or the cap test) failed.

    `capped`: True/False when the run's record says whether a cap was set, None if unknown.
    """

    cap: int | None = None
    total_memory: int | None = None
    capped: bool | None = None

    @classmethod
    def from_meta(cls, meta: dict[str, Any] | None, total_memory: int | None = None) -> "Limit":
        """From a run record (`cap` in bytes, 0 = none; `total_memory`), as the sidecar NAME.json holds."""
        meta = meta or {}
        cap: Any = meta.get("cap")  # JSON values, checked below
        total: Any = meta.get("total_memory") or total_memory
        number = isinstance(cap, (int, float)) and not isinstance(cap, bool)
        capped = None if not number else cap > 0
        total_ok = isinstance(total, (int, float)) and not isinstance(total, bool) and total > 0
        return cls(int(cap) if capped else None, int(total) if total_ok else None, capped)

    @property
    def bytes(self) -> int | None:
        """The limit in bytes, or None when unknown."""
        if self.capped:
            return self.cap
        if self.capped is False and self.total_memory:
            return self.total_memory - CUDA_CONTEXT_MIN
        return None


@dataclass
class StreamBuild:
    """What `build_stream` found besides the requests (for `trace info` and error checks)."""

    requests: RequestStream
    segment_events: list[SegmentEvent]
    unmatched_frees: int = 0  # frees whose alloc is not in the trace (wrapped / late history)
    unmatched_segment_frees: int = 0  # releases of segments never allocated in the trace
    first_unmatched_index: int = -1  # event index of the first unmatched free
    empty_cache_bursts: list[int] = field(default_factory=list)  # request index of each EMPTY_CACHE
    marked: bool = False  # the program's calls came from the agent's marks (exact), not inference
    marked_calls: list[int] = field(default_factory=list)  # request index of each EMPTY_CACHE a mark placed
    unmatched_marks: int = 0  # marks that found no place in the events (clock trouble): should be 0
    addresses: list[int] | None = None  # with keep_addresses: each request's block address (0: none)


def run_record(snapshot: Mapping[str, Any], source: str = "<snapshot>") -> dict[str, Any]:
    """The agent's run record of a snapshot (`RUN_RECORD_KEY`), checked; {} when there is none.

    Untrusted input: known fields of the wrong type, a non-dict record or an over-long command
    are a `TraceError`; unknown fields are dropped (a newer agent may write more).
    """
    rec = snapshot.get(RUN_RECORD_KEY)
    if rec is None:
        return {}
    bad = not isinstance(rec, dict)
    out: dict[str, Any] = {}
    if not bad:
        for key, types in _RUN_RECORD_TYPES.items():
            if key not in rec:
                continue
            value = rec[key]
            if (
                not isinstance(value, types)
                or (isinstance(value, bool) and bool not in types)
                or (isinstance(value, int) and not isinstance(value, bool) and value < 0)
            ):
                bad = True
                break
            if key == "cmd" and (len(value) > 4096 or not all(isinstance(a, str) and len(a) <= 65536 for a in value)):
                bad = True
                break
            out[key] = list(value) if key == "cmd" else value
    if bad:
        raise TraceError(
            f"{source}: '{RUN_RECORD_KEY}' is not the agent's run record (cap, total_memory, ...); "
            "the snapshot was edited or damaged"
        )
    return out


def with_run_record(record: dict[str, Any], sidecar: dict[str, Any] | None) -> dict[str, Any]:
    """A trace's meta: the snapshot's own run record under the sidecar (which, where there is one,
    has the last word), the record also kept whole under `run_record` so a cache of the trace can
    tell what came from the file's content from what came from beside it."""
    meta = {**record, **(sidecar or {})}
    if record:
        meta["run_record"] = dict(record)
    return meta


def stream_context(snapshot: dict[str, Any], meta: dict[str, Any] | None, *, source: str = "<trace>") -> dict[str, Any]:
    """`build_stream`'s `limit` and `marks` from a snapshot and its run record (untrusted input:
    malformed marks are a `TraceError`, not a crash)."""
    marks = snapshot.get(EMPTY_CACHE_MARKS_KEY)
    if marks is not None:
        ok = isinstance(marks, list) and all(
            isinstance(m, (list, tuple)) and len(m) == 2 and all(isinstance(x, int) for x in m) for m in marks
        )
        if not ok:
            raise TraceError(
                f"{source}: '{EMPTY_CACHE_MARKS_KEY}' is not a list of [start_us, end_us] pairs; "
                "the snapshot was edited or damaged"
            )
    return {"limit": Limit.from_meta(meta), "marks": marks}


def build_stream(
    events: Sequence[dict[str, Any]],
    allocator_settings: dict[str, Any] | None = None,
    *,
    source: str = "<trace>",
    limit: Limit | None = None,
    marks: Sequence[Sequence[int]] | None = None,
    keep_addresses: bool = False,
) -> StreamBuild:
    """Build the request stream and segment events of one device's `device_traces` list.

    `limit`: what the run could hold (module doc); `marks`: the agent's recorded
    `empty_cache()` intervals, which replace the inference when given (even empty).
    `keep_addresses`: also list each request's block address (the snapshot memory map of
    `diagnose` is rebuilt from this interpretation, not from a second reading of the events).
    Frees without a matching alloc are counted (not raised) so the caller can word the
    error (`load_trace`) or accept a partial history.
    """
    settings = allocator_settings or {}
    judge = _BurstJudge(
        float(settings.get("garbage_collection_threshold") or 0.0),
        limit or Limit(),
        Held(block_rules(settings) if marks is None else None),
    )
    out, marked = _start_build(events, marks, keep_addresses)
    req, addrs = out.requests, out.addresses

    live: dict[tuple[int, int], int] = {}  # (addr, stream) -> index of its ALLOC request
    segments: dict[int, tuple[int, int]] = {}  # cudaMalloc'd segments (not expandable ranges): addr -> size, stream
    next_rid = 0
    reserved = 0
    peak_reserved = 0
    n = len(events)
    # Local aliases: this loop runs ~1M times for the llm traces.
    append = req.append
    seg_append = out.segment_events.append
    ops, rids = req.ops, req.rids  # len(ops): the next request's index

    i = 0
    while i < n:
        ev = events[i]
        action = ev.get("action")
        if marked is not None and marked.get(i) == _SILENT:  # a marked call that released nothing
            _program_call(out, ev.get("stream", 0), i, marked=True)
        if action == "alloc":
            key = (ev["addr"], ev["stream"])
            if key in live:
                raise TraceError(
                    f"{source}: event {i}: a second alloc at address {ev['addr']:#x} before the first was freed; "
                    "the trace is inconsistent (was it edited or merged from several runs?)"
                )
            live[key] = len(ops)
            append(ALLOC, ev["size"], next_rid, ev["stream"], i)
            if addrs is not None:
                addrs.append(ev["addr"])
            next_rid += 1
        elif action == "free_completed":
            at = live.pop((ev["addr"], ev["stream"]), None)
            if at is None:
                out.unmatched_frees += 1
                if out.first_unmatched_index < 0:
                    out.first_unmatched_index = i
            else:
                append(FREE, ev["size"], rids[at], ev["stream"], i)
                if addrs is not None:
                    addrs.append(ev["addr"])
        elif action in RELEASE_ACTIONS:
            # A maximal burst of releases: decide whose it is from what follows.
            j = _burst_end(events, i, n)
            program = judge.program(events, i, j, reserved, peak_reserved, marked, segments, live, req.sizes)
            if program:
                _program_call(out, ev["stream"], i, marked=marked is not None and marked.get(i) == _BURST)
                owner = len(req) - 1
            else:
                owner = len(req)  # the request whose malloc comes next
            reserved = _release_segments(events, i, j, owner, out, segments, reserved)
            i = j
            continue
        elif action in GROW_ACTIONS:
            seg_append(SegmentEvent(action, ev["addr"], ev["size"], ev["stream"], i, len(req)))
            if action == "segment_alloc":
                segments[ev["addr"]] = (ev["size"], ev["stream"])
            reserved += ev["size"]
            if reserved > peak_reserved:
                peak_reserved = reserved
        elif action == "oom":
            free = ev.get("device_free")
            seg_append(SegmentEvent("oom", 0, ev["size"], ev["stream"], i, len(req), None if free is None else int(free)))
            append(FAILED_ALLOC, ev["size"], -1, ev["stream"], i)
            if addrs is not None:
                addrs.append(0)
        # free_requested, snapshot, annotations: not requests (see module doc).
        i += 1
    if marked is not None and marked.get(n) == _SILENT:  # a call after the last event
        _program_call(out, 0, n, marked=True)
    collect_stacks(events, req)
    return out


def _start_build(
    events: Sequence[dict[str, Any]], marks: Sequence[Sequence[int]] | None, keep_addresses: bool
) -> tuple[StreamBuild, dict[int, int] | None]:
    """The empty result, and the agent's marks placed on the events (None without marks)."""
    marked = _place_marks(events, marks) if marks is not None else None
    out = StreamBuild(RequestStream(), [], marked=marked is not None, addresses=[] if keep_addresses else None)
    if marked is not None:
        out.unmatched_marks = marked.pop(-1, 0)
    return out, marked


def _program_call(out: StreamBuild, stream: int, index: int, *, marked: bool) -> None:
    """One `empty_cache()` call of the program, as an EMPTY_CACHE request before event `index`
    (`marked`: placed by the agent's marks rather than inferred)."""
    req = out.requests
    if marked:
        out.marked_calls.append(len(req))
    out.empty_cache_bursts.append(len(req))
    req.append(EMPTY_CACHE, -1, -1, stream, index)
    if out.addresses is not None:
        out.addresses.append(0)


def _burst_end(events: Sequence[dict[str, Any]], i: int, n: int) -> int:
    """The index after the maximal run of segment releases that starts at event `i`."""
    j = i
    while j < n and events[j].get("action") in RELEASE_ACTIONS:
        j += 1
    return j


def _release_segments(
    events: Sequence[dict[str, Any]],
    i: int,
    j: int,
    owner: int,
    out: StreamBuild,
    segments: dict[int, tuple[int, int]],
    reserved: int,
) -> int:
    """Record the releases `events[i:j]` as segment events of request `owner`, matched against the
    segments the trace allocated; the reserved bytes after them (unmatched ones counted in `out`)."""
    seg_append = out.segment_events.append
    burst_bytes = 0
    for k in range(i, j):
        e = events[k]
        burst_bytes += e["size"]
        seg_append(SegmentEvent(e["action"], e["addr"], e["size"], e["stream"], k, owner))
        if e["action"] == "segment_free":
            if segments.pop(e["addr"], None) is None:
                out.unmatched_segment_frees += 1
                if out.first_unmatched_index < 0:
                    out.first_unmatched_index = k
    reserved -= burst_bytes
    if reserved < 0:  # unmapped more than was ever mapped in the trace
        if not out.unmatched_segment_frees:
            out.unmatched_segment_frees = 1
        if out.first_unmatched_index < 0:
            out.first_unmatched_index = i
        reserved = 0
    return reserved


_BURST, _SILENT = 1, 2


def _place_marks(events: Sequence[dict[str, Any]], marks: Sequence[Sequence[int]]) -> dict[int, int]:
    """Event index -> _BURST (the release burst starting there is a marked call) or _SILENT
    (a marked call that released nothing happened just before this event; index len(events)
    = after the last one). Key -1 counts marks that could not be placed."""
    times: list[Any] = [e.get("time_us") for e in events]  # as the snapshot has them (None: checked next)
    if any(t is None for t in times):
        return {-1: len(marks)}
    bursts: list[tuple[int, int]] = []  # each release burst: its first and last event
    for k, e in enumerate(events):
        if e.get("action") in RELEASE_ACTIONS:
            if k and events[k - 1].get("action") in RELEASE_ACTIONS:
                bursts[-1] = (bursts[-1][0], k)
            else:
                bursts.append((k, k))
    placed: dict[int, int] = {}
    unmatched = 0
    import bisect

    # the bursts a call can claim start within its tolerance window: found by bisection where the events'
    # times are in order (as torch writes them), else by looking at every burst
    starts = [times[k] for k, _ in bursts]
    ordered = all(a <= b for a, b in zip(starts, starts[1:]))
    for t0, t1 in sorted((int(m[0]), int(m[1])) for m in marks):
        lo, hi = 0, len(bursts)
        if ordered:
            lo = bisect.bisect_left(starts, t0 - MARK_TOLERANCE_US)
            hi = bisect.bisect_right(starts, t1 + MARK_TOLERANCE_US, lo)
        # the burst that lies within the call, else the one closest to it within the clocks' tolerance
        # that no request of the program separates from the call (a call releases all it releases before it
        # returns: a burst after the program's next request is the allocator's, of a malloc after the call)
        near = [
            (max(0, t0 - times[k]) + max(0, times[end] - t1), k)
            for k, end in bursts[lo:hi]
            if t0 - MARK_TOLERANCE_US <= times[k]
            and times[end] <= t1 + MARK_TOLERANCE_US
            and placed.get(k) != _BURST
            and not _request_between(events, times, k, end, t0, t1)
        ]
        if near:
            placed[min(near)[1]] = _BURST
            continue
        at = bisect.bisect_right(times, t0)  # first event after the call began (times are non-decreasing)
        if at < len(times) and times[at] < t0 - MARK_TOLERANCE_US:
            unmatched += 1
            continue
        placed.setdefault(at, _SILENT)
    if unmatched:
        placed[-1] = unmatched
    return placed


def _request_between(events: Sequence[dict[str, Any]], times: Sequence[int], first: int, last: int, t0: int, t1: int) -> bool:
    """Whether a request event (anything but a release) lies in time between the call [t0, t1] and the
    burst `events[first..last]`: after the call and before the burst, or after the burst and before the call."""
    k = first - 1
    while k >= 0 and times[k] > t1:
        if events[k].get("action") not in RELEASE_ACTIONS:
            return True
        k -= 1
    k = last + 1
    while k < len(events) and times[k] < t0:
        if events[k].get("action") not in RELEASE_ACTIONS:
            return True
        k += 1
    return False


class _BurstJudge:
    """Whose a release burst is (module doc): the agent's marks where the recording has them, else the
    rules of `_is_program_empty_cache`, then the recording's own layout (`held.Held`) for the ambiguous case."""

    def __init__(self, gc_threshold: float, limit: Limit, held: Held) -> None:
        self.gc_threshold, self.limit, self.held = gc_threshold, limit, held

    def program(
        self,
        events: Sequence[dict[str, Any]],
        i: int,
        j: int,
        reserved: int,
        peak_reserved: int,
        marked: dict[int, int] | None,
        segments: dict[int, tuple[int, int]],
        live: dict[tuple[int, int], int],
        sizes: list[int],
    ) -> bool:
        """Whether the burst `events[i:j]` is the program's `empty_cache()`; `reserved` before it, and the
        layout as it began: `segments`, and `live` allocations as indices into the requests' `sizes`."""
        nxt = events[j] if j < len(events) else None
        if marked is not None:
            # the marks decide the ambiguous case; a burst no malloc follows cannot be the
            # allocator's even if the program reached empty_cache some unwrapped way
            return marked.get(i) == _BURST or (nxt is None or nxt.get("action") not in _MALLOC_CONTINUATION)
        small = any(events[k]["size"] == SMALL_SEGMENT for k in range(i, j))
        return _is_program_empty_cache(
            nxt, reserved, peak_reserved, self.gc_threshold, self.limit, self.limit.bytes, small
        ) or self.held.served(events, j, segments, ((a, sizes[k]) for (a, _), k in live.items()))


def _is_program_empty_cache(
    nxt: dict[str, Any] | None,
    reserved: int,
    peak_reserved: int,
    gc_threshold: float,
    limit: Limit,
    limit_bytes: int | None,
    releases_small: bool = False,
) -> bool:
    """Whether a release burst is the program's `empty_cache()` (module doc, rule by rule);
    `releases_small`: the burst frees small-pool segments, which garbage collection never does."""
    if nxt is None:
        return True
    action = nxt.get("action")
    if action not in _MALLOC_CONTINUATION:
        return True
    if action == "oom":
        return False
    if gc_threshold > 0.0 and limit.capped is not False and not releases_small:
        # GC runs only under a cap, only above threshold x cap, and frees large-pool blocks only
        if limit.cap is None or reserved > gc_threshold * limit.cap:
            return False
    # A new segment follows: the allocator released only if cudaMalloc (or the cap test) had
    # failed, which cannot happen within the limit nor below a level the run already held.
    size: int = nxt["size"]
    return reserved + size <= max(peak_reserved, limit_bytes or 0)


def requested_live_peak(requests: RequestStream) -> int:
    """Peak of the program's live requested bytes (sum of unrounded sizes of live allocations)."""
    size_of: dict[int, int] = {}
    live = peak = 0
    for op, size, rid in zip(requests.ops, requests.sizes, requests.rids):
        if op == ALLOC:
            size_of[rid] = size
            live += size
            if live > peak:
                peak = live
        elif op == FREE:
            live -= size_of.pop(rid, 0)
    return peak
