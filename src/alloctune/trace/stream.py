"""Turn one device's recorded allocator events into the program's request stream.

The snapshot mixes two voices: what the *program* asked for (allocations, frees,
`empty_cache()` calls) and what the *allocator* did about it (cudaMalloc/cudaFree,
expandable map/unmap, OOM). The simulator replays the first and must reproduce the
second, so this module separates them.

Rules (tested on hand-made histories and the shared H200 traces, tests/test_trace_stream.py;
bench/gpu_trace.sh checks them against programs whose calls are known):

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
  after a cudaMalloc failed, i.e. when reserved + the new segment exceeds the device
  (or cap) limit; the limit is fixed during a run, so that is impossible if the run had
  already held at least as much: if `reserved before the burst + next segment size <=
  the highest reserved level reached so far`, the burst is the program's
  `empty_cache()`. Garbage collection needs no failure, so when
  `garbage_collection_threshold > 0` such bursts stay with the allocator. Otherwise (a
  new segment above every level held before) the burst stays with the allocator: an
  `empty_cache()` there is indistinguishable from release-and-retry. (Assumes no other
  process takes device memory during the run; with expandable segments under a cap the
  cap test uses the rounded segment size, not the mapped size, so the level test is
  slightly optimistic there.)

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
from typing import Any, Sequence

from alloctune.errors import TraceError
from alloctune.trace.model import ALLOC, EMPTY_CACHE, FAILED_ALLOC, FREE, RequestStream, SegmentEvent

RELEASE_ACTIONS = frozenset({"segment_free", "segment_unmap"})
GROW_ACTIONS = frozenset({"segment_alloc", "segment_map"})
SEGMENT_ACTIONS = RELEASE_ACTIONS | GROW_ACTIONS
# Events that end a malloc slow path: the burst before them belongs to that malloc.
_MALLOC_CONTINUATION = GROW_ACTIONS | {"oom"}


@dataclass
class StreamBuild:
    """What `build_stream` found besides the requests (for `trace info` and error checks)."""

    requests: RequestStream
    segment_events: list[SegmentEvent]
    unmatched_frees: int = 0  # frees whose alloc is not in the trace (wrapped / late history)
    unmatched_segment_frees: int = 0  # releases of segments never allocated in the trace
    first_unmatched_index: int = -1  # event index of the first unmatched free
    empty_cache_bursts: list[int] = field(default_factory=list)  # request index of each EMPTY_CACHE


def build_stream(
    events: Sequence[dict[str, Any]],
    allocator_settings: dict[str, Any] | None = None,
    *,
    source: str = "<trace>",
) -> StreamBuild:
    """Build the request stream and segment events of one device's `device_traces` list.

    Frees without a matching alloc are counted (not raised) so the caller can word the
    error (`load_trace`) or accept a partial history.
    """
    settings = allocator_settings or {}
    gc_on = float(settings.get("garbage_collection_threshold") or 0.0) > 0.0

    req = RequestStream()
    seg_events: list[SegmentEvent] = []
    out = StreamBuild(req, seg_events)

    live: dict[tuple[int, int], int] = {}  # (addr, stream) -> rid
    segments: set[int] = set()  # addresses of cudaMalloc'd segments (not expandable ranges)
    next_rid = 0
    reserved = 0
    peak_reserved = 0
    n = len(events)
    # Local aliases: this loop runs ~1M times for the llm traces.
    append = req.append
    seg_append = seg_events.append

    i = 0
    while i < n:
        ev = events[i]
        action = ev.get("action")
        if action == "alloc":
            key = (ev["addr"], ev["stream"])
            if key in live:
                raise TraceError(
                    f"{source}: event {i}: a second alloc at address {ev['addr']:#x} before the first was freed; "
                    "the trace is inconsistent (was it edited or merged from several runs?)"
                )
            live[key] = next_rid
            append(ALLOC, ev["size"], next_rid, ev["stream"], i)
            next_rid += 1
        elif action == "free_completed":
            rid = live.pop((ev["addr"], ev["stream"]), None)
            if rid is None:
                out.unmatched_frees += 1
                if out.first_unmatched_index < 0:
                    out.first_unmatched_index = i
            else:
                append(FREE, ev["size"], rid, ev["stream"], i)
        elif action in RELEASE_ACTIONS:
            # A maximal burst of releases: decide whose it is from what follows.
            j = i
            burst_bytes = 0
            while j < n and events[j].get("action") in RELEASE_ACTIONS:
                burst_bytes += events[j]["size"]
                j += 1
            nxt = events[j] if j < n else None
            if _is_program_empty_cache(nxt, reserved, peak_reserved, gc_on):
                out.empty_cache_bursts.append(len(req))
                append(EMPTY_CACHE, -1, -1, ev["stream"], i)
                owner = len(req) - 1
            else:
                owner = len(req)  # the request whose malloc comes next
            for k in range(i, j):
                e = events[k]
                seg_append(SegmentEvent(e["action"], e["addr"], e["size"], e["stream"], k, owner))
                if e["action"] == "segment_free":
                    if e["addr"] in segments:
                        segments.discard(e["addr"])
                    else:
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
            i = j
            continue
        elif action in GROW_ACTIONS:
            seg_append(SegmentEvent(action, ev["addr"], ev["size"], ev["stream"], i, len(req)))
            if action == "segment_alloc":
                segments.add(ev["addr"])
            reserved += ev["size"]
            if reserved > peak_reserved:
                peak_reserved = reserved
        elif action == "oom":
            free = ev.get("device_free")
            seg_append(SegmentEvent("oom", 0, ev["size"], ev["stream"], i, len(req), None if free is None else int(free)))
            append(FAILED_ALLOC, ev["size"], -1, ev["stream"], i)
        # free_requested, snapshot, annotations: not requests (see module doc).
        i += 1
    return out


def _is_program_empty_cache(nxt: dict[str, Any] | None, reserved: int, peak_reserved: int, gc_on: bool) -> bool:
    """Whether a release burst is the program's `empty_cache()` (module doc, rule by rule)."""
    if nxt is None:
        return True
    action = nxt.get("action")
    if action not in _MALLOC_CONTINUATION:
        return True
    if action == "oom" or gc_on:
        return False
    # A new segment follows: the allocator released only if cudaMalloc had failed, which
    # cannot happen below a level the run already reached.
    return reserved + nxt["size"] <= peak_reserved


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
