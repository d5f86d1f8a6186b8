"""The allocator's data: segments, blocks, per-stream free sets and pools, and what it reports
(`OOMInfo`, `SimEvent`).

Speed matters (a trace has ~10^6 requests): free blocks live in one `SortedList` of int
keys per (pool, stream) — an int compares much faster than a tuple — with the key packing
(size, [segment id,] address).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sortedcontainers import SortedDict, SortedList

ADDR_BITS = 48  # addresses are < 2**48; keys pack size above them
ID_BITS = 40
# What the simulator did to device memory (the `action` of a `SimEvent`; `native.ACTIONS` in this order)
SimAction = Literal["segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom"]


class Segment:
    """One cudaMalloc'd range (or one expandable virtual range)."""

    __slots__ = ("addr", "size", "stream", "small", "id", "head", "es")

    def __init__(self, addr: int, size: int, stream: int, small: bool, sid: int, es: Any = None):
        self.addr = addr
        self.size = size
        self.stream = stream
        self.small = small
        self.id = sid
        self.head: Block | None = None
        self.es = es  # ExpandableSegment or None


class Block:
    """A piece of a segment: allocated, free (in a pool's free set) or unmapped (expandable)."""

    __slots__ = ("addr", "size", "requested", "seg", "prev", "next", "allocated", "mapped", "gc_base", "key")

    def __init__(self, addr: int, size: int, seg: Segment, mapped: bool = True):
        self.addr = addr
        self.size = size
        self.requested = 0
        self.seg = seg
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = False
        self.mapped = mapped
        self.gc_base = 0
        self.key = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def __repr__(self) -> str:
        state = "alloc" if self.allocated else ("free" if self.mapped else "unmapped")
        return f"Block({self.addr:#x}, {self.size}, {state})"


class FreeSet:
    """Free mapped blocks of one (pool, stream), ordered by the version's comparator."""

    __slots__ = ("keys", "blocks")

    def __init__(self) -> None:
        self.keys = SortedList()
        self.blocks: dict[int, Block] = {}


class Pool:
    """`BlockPool`: free sets per stream (streams ordered by handle, as the C++ set is),
    the unmapped expandable ranges, and the GC call counter."""

    __slots__ = ("small", "sets", "unmapped", "calls")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.sets: dict[int, FreeSet] = {}
        self.unmapped: dict[int, SortedDict] = {}  # stream -> {addr: unmapped Block}
        self.calls = 0  # get_free_blocks_call_count

    def ordered_sets(self) -> list[FreeSet]:
        return [self.sets[s] for s in sorted(self.sets)]


@dataclass(frozen=True)
class OOMInfo:
    """Where an allocation failed: the request and the pool state at that point."""

    request_index: int
    size: int  # the program's requested bytes
    rounded: int  # round_size(size): the `oom` trace event's size
    alloc_size: int  # what "Tried to allocate" prints
    stream: int
    reserved: int
    allocated: int
    device_free: int
    cap: int | None
    largest_free_block: int
    expected: bool = False  # the recording failed here too

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class SimEvent:
    """A segment event the simulator made (mirrors `trace.model.SegmentEvent`)."""

    action: SimAction
    addr: int
    size: int
    stream: int
    request_index: int
