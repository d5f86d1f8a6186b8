"""The allocator's memory map at any point of a recorded history.

Two sources: the snapshot's own `segments` (exact, but only at the time it was written), or
a forward pass over the history (`replay_history`). The pass reads the history through the
trace loader's interpretation (`trace.stream.build_stream`: which event is a request, which
a segment event, whose release burst is whose) and applies the allocator's size rules from
`sim.sizes`, so neither the events nor the rules are read a second way here. A block's
extent is its rounded size unless the allocator would not have split the rest off, in which
case it takes the whole free gap; free blocks are the gaps between live blocks (the allocator
always merges adjacent free blocks). Exact when the history starts at an empty allocator;
`verify_against_segments` checks a pass against the snapshot's final `segments`.

A loaded trace (a compact one keeps no block addresses) gets its map and totals after any request
from the exact simulator (`map_after_request`, `totals_after_request`), checked against the
recording's reserved bytes and rebuilt from the recorded addresses where they differ. One place
for every reader: `diagnose --snapshot`, `explain` at its moment and the explain page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from sortedcontainers import SortedDict

from alloctune.errors import TraceError
from alloctune.memory_map.model import BlockView, MemoryMap, SegmentView
from alloctune.sim import sizes
from alloctune.sim.settings import SimSettings
from alloctune.trace.model import ALLOC, FREE
from alloctune.trace.stream import build_stream


@dataclass(frozen=True)
class SizeRules:
    """The settings that decide block sizes, read from the snapshot's `allocator_settings`;
    every rule is `sim.sizes`' (one statement of the allocator's arithmetic)."""

    settings: SimSettings = field(default_factory=SimSettings)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any] | None) -> "SizeRules":
        return cls(SimSettings.from_allocator_settings(settings or {}))

    @property
    def expandable(self) -> bool:
        return self.settings.expandable_segments

    def round_size(self, size: int) -> int:
        """PyTorch's `round_size`: 512-byte multiples, or power-of-two divisions when configured."""
        return sizes.round_size(size, sizes.division_table(self.settings))

    def allocation_size(self, rounded: int) -> int:
        """The cudaMalloc size a new segment for `rounded` bytes would have (what OOM text prints)."""
        return sizes.allocation_size(rounded, self.settings.segment_size_mid)

    def should_split(self, pool: str, rounded: int, remaining: int) -> bool:
        return sizes.should_split(
            pool == "small", rounded, remaining, self.settings.expandable_segments, self.settings.max_split_size
        )


def allocation_size(rounded: int, size_rules: SizeRules | None = None) -> int:
    """The cudaMalloc size a new segment for `rounded` bytes would have under `size_rules` (default settings)."""
    return (size_rules or SizeRules()).allocation_size(rounded)


def map_from_snapshot_segments(segments: Iterable[Mapping[str, Any]], device: int = 0) -> MemoryMap:
    """The memory map exactly as the snapshot recorded it (its `segments` list)."""
    out = []
    for seg in segments:
        if int(seg.get("device", 0)) != device:
            continue
        blocks = tuple(
            BlockView(
                int(b["address"]),
                int(b["size"]),
                str(b.get("state", "")).startswith("active"),
                int(b.get("requested_size", 0) or 0),
            )
            for b in seg.get("blocks", ())
        )
        out.append(
            SegmentView(
                int(seg["address"]),
                int(seg["total_size"]),
                int(seg.get("stream", 0)),
                str(seg.get("segment_type", "large")),
                bool(seg.get("is_expandable", False)),
                blocks,
            )
        )
    out.sort(key=lambda s: s.addr)
    return MemoryMap(-1, tuple(out))


# --------------------------------------------------------------------------------------------
# Replaying the recorded history.


class HistoryGap(TraceError):
    """The history does not start at an empty allocator (ring buffer wrapped), so it cannot be replayed."""


@dataclass
class Timeline:
    """Reserved / allocated bytes after each change, as parallel columns (event index, time)."""

    event_index: list[int] = field(default_factory=list)
    time_us: list[int] = field(default_factory=list)
    reserved: list[int] = field(default_factory=list)
    allocated: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "event_index": self.event_index,
            "time_us": self.time_us,
            "reserved": self.reserved,
            "allocated": self.allocated,
        }


@dataclass
class Replay:
    """What one pass over the history produced."""

    final: MemoryMap
    timeline: Timeline
    maps: dict[int, MemoryMap]  # captured maps, keyed by event index
    peak_reserved: int
    peak_reserved_index: int
    peak_allocated: int
    oom_indices: list[int]


class _Replayer:
    """Forward replay of `alloc` / `free_completed` / segment events into a segment map.

    Free blocks are the gaps between live blocks inside a segment (the allocator always merges
    adjacent free blocks). A block's extent is its rounded size unless the allocator would not
    have split the rest off, in which case it takes the whole free gap.
    """

    def __init__(self, rules: SizeRules) -> None:
        self.rules = rules
        self.segs: SortedDict = SortedDict()  # addr -> [end, stream, expandable, pool]
        self.live: SortedDict = SortedDict()  # addr -> (size, requested)
        self.reserved = 0
        self.allocated = 0

    def _segment_at(self, addr: int) -> tuple[int, list[Any]]:
        i = self.segs.bisect_right(addr) - 1
        if i >= 0:
            start = self.segs.keys()[i]
            info = self.segs[start]
            if addr < info[0]:
                return start, info
        raise HistoryGap(f"address {addr:#x} lies in no known segment")

    def seg_alloc(self, addr: int, size: int, stream: int) -> None:
        pool = "small" if size == sizes.SMALL_BUFFER else "large"
        self.segs[addr] = [addr + size, stream, False, pool]
        self.reserved += size

    def seg_free(self, addr: int, size: int) -> None:
        if addr not in self.segs:
            raise HistoryGap(f"segment_free of unknown segment {addr:#x}")
        end = self.segs.pop(addr)[0]
        if next(iter(self.live.irange(addr, end - 1)), None) is not None:
            raise HistoryGap(f"segment {addr:#x} freed while blocks in it were live")
        self.reserved -= end - addr

    def seg_map(self, addr: int, size: int, stream: int) -> None:
        end = addr + size
        pool = "small" if size % self.rules.settings.segment_size_mid else "large"
        i = self.segs.bisect_left(addr)
        if i > 0:
            pstart = self.segs.keys()[i - 1]
            pinfo = self.segs[pstart]
            if pinfo[0] == addr:  # extend the run before it
                del self.segs[pstart]
                addr, pool = pstart, pinfo[3]
        if end in self.segs:  # and swallow the run after it
            end = self.segs.pop(end)[0]
        self.segs[addr] = [end, stream, True, pool]
        self.reserved += size

    def seg_unmap(self, addr: int, size: int) -> None:
        start, info = self._segment_at(addr)
        end = addr + size
        del self.segs[start]
        if start < addr:
            self.segs[start] = [addr, info[1], True, info[3]]
        if end < info[0]:
            self.segs[end] = [info[0], info[1], True, info[3]]
        self.reserved -= size

    def alloc(self, addr: int, requested: int) -> None:
        start, info = self._segment_at(addr)
        rounded = self.rules.round_size(requested)
        nxt = next(iter(self.live.irange(addr + 1, info[0] - 1)), info[0])
        gap_end = min(nxt, info[0])
        if info[2] and rounded <= sizes.SMALL_SIZE:
            info[3] = "small"
        size = rounded
        if not self.rules.should_split(info[3], rounded, gap_end - addr - rounded):
            size = gap_end - addr
        self.live[addr] = (size, requested)
        self.allocated += size

    def free(self, addr: int) -> None:
        try:
            size, _ = self.live.pop(addr)
        except KeyError:
            raise HistoryGap(f"free of unknown block {addr:#x}") from None
        self.allocated -= size

    def memory_map(self, event_index: int) -> MemoryMap:
        segments = []
        for start, (end, stream, expandable, pool) in self.segs.items():
            blocks: list[BlockView] = []
            cursor = start
            for baddr in self.live.irange(start, end - 1):
                size, requested = self.live[baddr]
                if baddr > cursor:
                    blocks.append(BlockView(cursor, baddr - cursor, False))
                blocks.append(BlockView(baddr, size, True, requested))
                cursor = baddr + size
            if cursor < end:
                blocks.append(BlockView(cursor, end - cursor, False))
            segments.append(SegmentView(start, end - start, stream, pool, expandable, tuple(blocks)))
        return MemoryMap(event_index, tuple(segments))


def replay_history(
    events: Sequence[Mapping[str, Any]],
    settings: Mapping[str, Any] | None = None,
    capture: Iterable[int] = (),
    capture_peak: bool = False,
) -> Replay:
    """Replay one device's history from an empty allocator; capture the maps at `capture` indices.

    A map listed in `capture` is taken *at* that event, before it is applied (for an `oom` entry
    that is the state the failed request met). `capture_peak` also keeps the map at the peak of
    reserved bytes. Raises `HistoryGap` when the history does not start from an empty allocator.
    """
    try:
        built = build_stream(events, dict(settings or {}), keep_addresses=True)
    except (KeyError, TypeError, AttributeError) as exc:
        raise TraceError(f"a history entry is malformed ({type(exc).__name__}: {exc})") from exc
    if built.unmatched_frees or built.unmatched_segment_frees:
        raise HistoryGap(f"history event {built.first_unmatched_index} frees memory whose allocation is not in the history")
    size_rules = SizeRules.from_settings(settings)
    rep, tl, maps, ooms = _pass(built, events, size_rules, sorted(set(capture)))
    peak_r = max(tl.reserved, default=0)
    peak_i = tl.event_index[tl.reserved.index(peak_r)] if tl.reserved and peak_r > 0 else -1
    if capture_peak and peak_i >= 0:
        # A second, shorter pass over the same interpretation: cheaper than a map at every new peak.
        maps[peak_i] = MemoryMap(peak_i, _pass(built, events, size_rules, [], stop=peak_i)[0].memory_map(-1).segments)
    return Replay(rep.memory_map(-1), tl, maps, peak_r, peak_i, max(tl.allocated, default=0), ooms)


def _pass(
    built: Any, events: Sequence[Mapping[str, Any]], size_rules: SizeRules, wanted: list[int], stop: int | None = None
) -> tuple["_Replayer", Timeline, dict[int, MemoryMap], list[int]]:
    """One forward pass over the loader's requests and segment events, merged back into history
    order by their event index; up to event `stop` (inclusive) when given."""
    req, addrs = built.requests, built.addresses or []
    rep = _Replayer(size_rules)
    maps: dict[int, MemoryMap] = {}
    tl = Timeline()
    ooms: list[int] = []
    segs = built.segment_events
    k = r = w = 0
    nseg, nreq = len(segs), len(req)
    req_index = req.event_index
    while r < nreq or k < nseg:
        if k < nseg and (r >= nreq or segs[k].event_index < req_index[r]):
            e = segs[k]
            i, kind = e.event_index, e.action
            k += 1
        else:
            i, kind = req_index[r], req.ops[r]
        if stop is not None and i > stop:
            break
        while w < len(wanted) and wanted[w] <= i:
            maps[wanted[w]] = rep.memory_map(wanted[w])
            w += 1
        if kind == ALLOC:
            rep.alloc(addrs[r], req.sizes[r])
            r += 1
        elif kind == FREE:
            rep.free(addrs[r])
            r += 1
        elif isinstance(kind, int):  # EMPTY_CACHE / FAILED_ALLOC: their segment events carry the change
            r += 1
            continue
        elif kind == "segment_alloc":
            rep.seg_alloc(e.addr, e.size, e.stream)
        elif kind == "segment_free":
            rep.seg_free(e.addr, e.size)
        elif kind == "segment_map":
            rep.seg_map(e.addr, e.size, e.stream)
        elif kind == "segment_unmap":
            rep.seg_unmap(e.addr, e.size)
        else:  # "oom"
            ooms.append(i)
            continue
        tl.event_index.append(i)
        tl.time_us.append(int(events[i].get("time_us", 0) or 0))
        tl.reserved.append(rep.reserved)
        tl.allocated.append(rep.allocated)
    for c in wanted[w:]:
        maps[c] = rep.memory_map(c)
    return rep, tl, maps, ooms


def verify_against_segments(replayed: MemoryMap, recorded: MemoryMap) -> list[str]:
    """Differences between a replayed map and the snapshot's own `segments` (empty = identical)."""
    problems: list[str] = []
    rec = {s.addr: s for s in recorded.segments}
    rep = {s.addr: s for s in replayed.segments}
    for addr in sorted(set(rec) | set(rep)):
        a, b = rep.get(addr), rec.get(addr)
        if a is None or b is None:
            problems.append(f"segment {addr:#x}: {'missing in replay' if a is None else 'not in snapshot'}")
            continue
        if a.size != b.size:
            problems.append(f"segment {addr:#x}: size {a.size} replayed vs {b.size} recorded")
        live_a = [(x.addr, x.size) for x in a.blocks if x.allocated]
        live_b = [(x.addr, x.size) for x in b.blocks if x.allocated]
        if live_a != live_b:
            problems.append(f"segment {addr:#x}: live blocks differ")
    return problems


# --------------------------------------------------------------------------------------------
# The map and totals after any request of a loaded trace (what `explain` reads at its moment).


@dataclass(frozen=True)
class MomentTotals:
    """The allocator's totals after one request: what `explain`'s overhead categories are read from.

    `inactive_split` is PyTorch's `inactive_split_bytes` (free blocks that are split off a
    segment's other blocks, mapped or not); `cached_free` the rest of the free reserved bytes
    (whole free segments, which `empty_cache()` would release)."""

    reserved: int
    allocated: int
    requested: int
    inactive_split: int

    @property
    def cached_free(self) -> int:
        return self.reserved - self.allocated - self.inactive_split


def _settings_and_budget(trace: Any) -> tuple[SimSettings, int | None]:
    meta = getattr(trace, "meta", None) or {}
    torch = meta.get("torch")
    try:
        settings = SimSettings.from_allocator_settings(trace.allocator_settings or {}, torch if isinstance(torch, str) else None)
    except (ValueError, TypeError):
        settings = SimSettings.from_allocator_settings(trace.allocator_settings or {})
    cap = meta.get("cap")
    budget = int(cap) if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None
    return settings, budget


def totals_after_request(
    trace: Any, after: int, recorded_reserved: int | None = None, event_index: int = -1
) -> tuple[MomentTotals, str]:
    """The allocator's totals after request `after` of a `Trace`, and where they came from.

    The exact simulator replays the requests up to and including `after` under the settings the
    recording ran with (the native core when built: ~1 M requests in well under a second) and its
    statistics are read; when they hold other than `recorded_reserved` bytes, the totals are read
    off `map_after_request`'s map instead (the recorded addresses).
    """
    from dataclasses import replace as _replace

    from alloctune.sim.replay import replay
    from alloctune.trace.model import RequestStream

    settings, budget = _settings_and_budget(trace)
    req = trace.requests
    k = after + 1
    head = RequestStream(
        req.ops[:k],
        req.sizes[:k],
        req.rids[:k],
        req.streams[:k],
        req.event_index[:k],
        {i: v for i, v in req.fallbacks.items() if i < k},
    )
    res = replay(
        _replace(trace, requests=head, events=[]),
        settings,
        budget=budget,
        record_events=False,
        timeline_points=1,
        stop_at_oom=False,
    )
    st = res.stats
    got = MomentTotals(
        int(st["reserved_bytes.all.current"]),
        int(st["allocated_bytes.all.current"]),
        int(st["requested_bytes.all.current"]),
        int(st["inactive_split_bytes.all.current"]),
    )
    if recorded_reserved is None or got.reserved == recorded_reserved:
        return got, "simulated (exact replay; reserved matches the recording)"
    mm, source = map_after_request(trace, after, recorded_reserved, event_index)
    allocated = sum(s.allocated for s in mm.segments)
    split = sum(s.free for s in mm.segments if s.live_blocks)
    requested = sum(b.requested for s in mm.segments for b in s.blocks if b.allocated)
    return MomentTotals(mm.reserved, allocated, requested, split), source


def map_after_request(
    trace: Any, after: int, recorded_reserved: int | None = None, event_index: int = -1
) -> tuple[MemoryMap, str]:
    """The memory map after request `after` of a `Trace` (-1: before the first), and its source.

    A compact trace keeps no block addresses, so the map comes from the exact simulator replaying
    the recording under the settings it ran with (`sim.replay.state_at`); when that replay holds
    other than `recorded_reserved` bytes there and the trace still has its raw events, the map is
    rebuilt from the recorded addresses instead (`replay_history`, the map `diagnose --snapshot`
    reads). Raises `TraceError` when neither gives the recorded state.
    """
    from alloctune.sim.replay import state_at

    settings, budget = _settings_and_budget(trace)
    alloc = state_at(trace, settings, after + 1, budget=budget)
    segments = []
    for seg in alloc.segment_table():
        blocks = tuple(
            BlockView(b["address"], b["size"], b["state"] == "active_allocated", b["requested_size"]) for b in seg["blocks"]
        )
        segments.append(
            SegmentView(seg["address"], seg["total_size"], seg["stream"], seg["segment_type"], seg["is_expandable"], blocks)
        )
    mm = MemoryMap(event_index, tuple(segments))
    if recorded_reserved is None or mm.reserved == recorded_reserved:
        return mm, "simulated (exact replay; reserved matches the recording)"
    try:
        events = list(trace.events) if trace.events else []
    except (TraceError, OSError):
        events = []
    if events and -1 <= event_index < len(events):
        nxt = event_index + 1
        rec = replay_history(events, trace.allocator_settings, capture=[nxt]).maps.get(nxt)
        if rec is not None and rec.reserved == recorded_reserved:
            return MemoryMap(event_index, rec.segments), "recorded addresses (the simulation differed here)"
    raise TraceError(
        f"{trace.source}: the simulated allocator holds {mm.reserved} bytes after request {after}, the recording "
        f"{recorded_reserved}; the original snapshot (with its events) is needed to map this moment"
    )
