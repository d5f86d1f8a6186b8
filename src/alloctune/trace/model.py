"""Plain data that the trace loader produces and the simulator consumes.

A recorded run becomes a `Trace`: the request stream the *program* made (what the
simulator replays) plus the events the *allocator* made (what the simulator must
reproduce). Columnar lists keep replay of ~650k requests fast and the memory small.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

# Request kinds (the program's side of the trace).
ALLOC = 0  # size = requested bytes (before rounding), rid = new allocation id
FREE = 1  # rid = id of the allocation being freed (at `free_completed`)
EMPTY_CACHE = 2  # the program called torch.cuda.empty_cache(); size = rid = -1
FAILED_ALLOC = 3  # a request that raised OOM on the GPU (recorded `oom` event); rid = -1

OP_NAMES = {ALLOC: "alloc", FREE: "free", EMPTY_CACHE: "empty_cache", FAILED_ALLOC: "failed_alloc"}


# Bounds on the stack table one recording may carry (hostile recordings: enormous frame lists,
# millions of distinct stacks). Beyond them the table is dropped and `StackTable.dropped` says why.
MAX_FRAMES_PER_STACK = 1024
MAX_STACKS = 200_000
MAX_FRAMES = 1_000_000


@dataclass
class StackTable:
    """The Python stacks of a recording's allocations, each frame and each stack stored once.

    `frames[i]` = (filename, line, function); `stacks[j]` = frame ids, innermost first (as
    torch records them). A request's stack id indexes `stacks`; -1 = no stack (not an ALLOC,
    or an allocation made with no Python frames, e.g. by autograd's backward thread).
    `dropped`: why a recording's stacks were not kept (malformed or beyond the bounds above);
    the stack ids are then all -1 and `explain` says so instead of guessing sites.
    """

    frames: list[tuple[str, int, str]] = field(default_factory=list)
    stacks: list[tuple[int, ...]] = field(default_factory=list)
    dropped: str | None = None


@dataclass(frozen=True)
class Annotation:
    """A named range of the program's requests: a `record_function` range torch wrote into the
    snapshot's `external_annotations` (the optimizer's `Optimizer.step#AdamW.step` and
    `Optimizer.zero_grad#...` by default, users' own ranges too), placed by its times.

    The range holds requests `start <= r < end` (request indices of the stream)."""

    name: str
    start: int
    end: int


# Bounds on the annotations one recording may carry (hostile files: bounded like stacks).
MAX_ANNOTATIONS = 2_000_000
MAX_ANNOTATION_NAME = 1024


@dataclass
class RequestStream:
    """The program's requests in order, one column per field (all lists have equal length).

    `event_index[i]` is the index in `Trace.events` of the recorded event that produced
    request i, so a mismatch can be reported with its recorded context.
    """

    ops: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    rids: list[int] = field(default_factory=list)
    streams: list[int] = field(default_factory=list)
    event_index: list[int] = field(default_factory=list)
    # Fallible requests (a cuDNN/cuBLAS workspace, say): request index -> the smaller sizes the
    # program asks for instead, in order, when this request fails. Empty = every failure is fatal.
    fallbacks: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # Python stacks (recordings made with stacks): one stack id per request into `stack_table`
    # (-1: none). None when the recording kept no frames at all.
    stack_ids: list[int] | None = None
    stack_table: StackTable | None = None
    # The program's named ranges (`Annotation`), in order of their start; empty when the
    # recording has none.
    annotations: list[Annotation] = field(default_factory=list)

    def append(self, op: int, size: int, rid: int, stream: int, event_index: int) -> None:
        self.ops.append(op)
        self.sizes.append(size)
        self.rids.append(rid)
        self.streams.append(stream)
        self.event_index.append(event_index)

    def extend_from(self, other: "RequestStream", start: int, stop: int) -> None:
        """Append requests [start, stop) of `other` (its five columns; `append` row by row, in bulk)."""
        self.ops.extend(other.ops[start:stop])
        self.sizes.extend(other.sizes[start:stop])
        self.rids.extend(other.rids[start:stop])
        self.streams.extend(other.streams[start:stop])
        self.event_index.extend(other.event_index[start:stop])

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[tuple[int, int, int, int]]:
        """Yield (op, size, rid, stream) tuples."""
        return zip(self.ops, self.sizes, self.rids, self.streams)

    def count(self, op: int) -> int:
        return sum(1 for o in self.ops if o == op)


@dataclass(frozen=True)
class SegmentEvent:
    """A recorded (or simulated) device-memory event: what the allocator asked of the driver.

    action is one of `segment_alloc`, `segment_free`, `segment_map`, `segment_unmap`
    (the last two with expandable segments), or `oom`.
    """

    action: str
    addr: int
    size: int
    stream: int
    event_index: int  # position in Trace.events (or -1 for simulated events)
    request_index: int  # index of the request during (or after) which it happened
    device_free: int | None = None  # `oom` only: cudaMemGetInfo free bytes at the failure (addr is 0)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "action": self.action,
            "addr": self.addr,
            "size": self.size,
            "stream": self.stream,
            "event_index": self.event_index,
            "request_index": self.request_index,
        }
        if self.device_free is not None:
            d["device_free"] = self.device_free
        return d


@dataclass
class Trace:
    """One device's recorded history, ready for replay and comparison."""

    source: str  # file it came from
    device: int
    requests: RequestStream
    segment_events: list[SegmentEvent]  # recorded segment_alloc/free/map/unmap and oom, in order
    allocator_settings: dict[str, Any]  # as recorded by the allocator (may be empty)
    events: list[dict[str, Any]] = field(default_factory=list, repr=False)  # raw device_traces[device]
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. the sidecar NAME.json of the shared traces
    total_memory: int | None = None  # device total memory when known (sidecar / snapshot)

    @property
    def streams(self) -> list[int]:
        return sorted(set(self.requests.streams))


# Reserved bytes from segment events: the one implementation (recorded or simulated events alike).
RESERVE_ACTIONS = frozenset(("segment_alloc", "segment_map"))
RELEASE_ACTIONS = frozenset(("segment_free", "segment_unmap"))


def reserved_change(action: str, size: int) -> int:
    """How an event changes reserved bytes: +size for alloc/map, -size for free/unmap, 0 otherwise
    (`oom`, and every request-level action of a raw snapshot history)."""
    if action in RESERVE_ACTIONS:
        return size
    if action in RELEASE_ACTIONS:
        return -size
    return 0


def reserved_delta(e: SegmentEvent) -> int:
    """`reserved_change` of a segment event."""
    return reserved_change(e.action, e.size)


def peak_reserved(events: Iterable[SegmentEvent]) -> int:
    """The highest reserved level the events reach (starting from nothing reserved)."""
    cur = peak = 0
    for e in events:
        cur += reserved_delta(e)
        if cur > peak:
            peak = cur
    return peak


def reserved_by_mark(events: Sequence[SegmentEvent], marks: Sequence[int]) -> list[int]:
    """The highest reserved level within each bucket of requests ending at each mark (events
    ordered by `request_index`; a bucket starts at the level the previous one ended with)."""
    out: list[int] = []
    reserved = bucket_max = 0
    k = 0
    ne = len(events)
    for mark in marks:
        while k < ne and events[k].request_index < mark:
            reserved += reserved_delta(events[k])
            if reserved > bucket_max:
                bucket_max = reserved
            k += 1
        out.append(bucket_max)
        bucket_max = reserved
    return out
