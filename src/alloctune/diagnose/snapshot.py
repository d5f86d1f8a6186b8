"""Flight-recorder diagnosis: explain an OOM from a `_dump_snapshot` file, not from its message.

The OOM message only has totals. A snapshot taken at (or after) the OOM also has the segment
map and the event history, so it can say what the message cannot: the largest free block
against the request, which segments are pinned by a few small live blocks, how much memory
is reserved but free and where, and — by replaying the history in the simulator under other
settings and the same budget — which setting would have avoided the OOM.

Two ways to get the memory map at the OOM:

* the snapshot was written *at* the OOM (the agent's `--on-oom snapshot`: nothing but the
  `oom` entry follows in the history), so its `segments` are the state at the OOM — exact;
* the program went on after the OOM (the shared capped traces), so the map is rebuilt by
  replaying the history from the start (`replay_history`). That is exact when the history
  begins at an empty allocator; `verify_against_segments` checks it against the final
  `segments` the snapshot holds.

Pure Python over plain data (no torch): the snapshot is loaded with the restricted unpickler
of `alloctune.trace`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from sortedcontainers import SortedDict

from alloctune.errors import TraceError
from alloctune.sim.replay import make_allocator
from alloctune.sim.settings import SimSettings
from alloctune.tune.candidates import STANDARD_CONFS
from alloctune.units import MiB, format_size

SCHEMA = "alloctune.snapshot-diagnosis/1"

# Allocator constants (see /work/shared/allocator-spec.md §1.1).
_MIN_BLOCK = 512
_SMALL_SIZE = 1 * MiB
_SMALL_BUFFER = 2 * MiB
_LARGE_BUFFER = 20 * MiB

# Settings replayed by `what_if` when the caller gives none: the usual fixes for fragmentation.
STANDARD_CANDIDATES: tuple[str, ...] = STANDARD_CONFS


# --------------------------------------------------------------------------------------------
# Allocator arithmetic needed to know a block's extent from a recorded (unrounded) request.


@dataclass(frozen=True)
class SizeRules:
    """The settings that decide block sizes, read from the snapshot's `allocator_settings`.

    Rounding and segment sizes come from the simulator's allocator model, so the memory map
    rebuilt here can never disagree with what `alloctune simulate` does."""

    max_split_size: int | None = None  # None = unlimited
    divisions: tuple[int, ...] = (0,) * 16  # roundup_power2_divisions per bucket
    expandable: bool = False
    large_segment_size: int | None = None  # 2.11+ knob; None = 20 MiB

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any] | None) -> "SizeRules":
        s = SimSettings.from_allocator_settings(settings or {})
        return cls(s.max_split_size, tuple(s.roundup_power2_divisions), s.expandable_segments, s.large_segment_size)

    @cached_property
    def _model(self):
        settings = SimSettings(
            max_split_size=self.max_split_size,
            expandable_segments=self.expandable,
            large_segment_size=self.large_segment_size,
            roundup_power2_divisions=self.divisions,
        )
        return make_allocator(settings, record_events=False)

    def round_size(self, size: int) -> int:
        """PyTorch's `round_size`: 512-byte multiples, or power-of-two divisions when configured."""
        return self._model.round_size(size)

    def allocation_size(self, rounded: int) -> int:
        """The cudaMalloc size a new segment for `rounded` bytes would have (what OOM text prints)."""
        return self._model.allocation_size(rounded)

    def should_split(self, pool: str, rounded: int, remaining: int) -> bool:
        if pool == "small" or self.expandable:
            return remaining >= _MIN_BLOCK
        unlimited = self.max_split_size is None
        return (unlimited or rounded < self.max_split_size) and remaining > _SMALL_SIZE


def allocation_size(rounded: int, rules: SizeRules | None = None) -> int:
    """The cudaMalloc size a new segment for `rounded` bytes would have under `rules` (default settings)."""
    return (rules or SizeRules()).allocation_size(rounded)


# --------------------------------------------------------------------------------------------
# Plain views of the memory map.


@dataclass(frozen=True)
class BlockView:
    addr: int
    size: int
    allocated: bool
    requested: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"addr": self.addr, "size": self.size, "allocated": self.allocated, "requested": self.requested}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BlockView":
        return cls(int(d["addr"]), int(d["size"]), bool(d["allocated"]), int(d.get("requested", 0)))


@dataclass(frozen=True)
class SegmentView:
    """One segment (or one mapped run of an expandable segment) and its blocks in address order."""

    addr: int
    size: int
    stream: int
    pool: str  # "small" or "large"
    expandable: bool
    blocks: tuple[BlockView, ...]

    @property
    def allocated(self) -> int:
        return sum(b.size for b in self.blocks if b.allocated)

    @property
    def free(self) -> int:
        return self.size - self.allocated

    @property
    def largest_free(self) -> int:
        return max((b.size for b in self.blocks if not b.allocated), default=0)

    @property
    def live_blocks(self) -> int:
        return sum(1 for b in self.blocks if b.allocated)

    def to_dict(self) -> dict[str, Any]:
        return {
            "addr": self.addr,
            "size": self.size,
            "stream": self.stream,
            "pool": self.pool,
            "expandable": self.expandable,
            "blocks": [b.to_dict() for b in self.blocks],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SegmentView":
        return cls(
            int(d["addr"]),
            int(d["size"]),
            int(d.get("stream", 0)),
            str(d.get("pool", "large")),
            bool(d.get("expandable", False)),
            tuple(BlockView.from_dict(b) for b in d.get("blocks", ())),
        )


@dataclass(frozen=True)
class MemoryMap:
    """The allocator's segments at one point of the history (`event_index`, -1 = snapshot time)."""

    event_index: int
    segments: tuple[SegmentView, ...]

    @property
    def reserved(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def allocated(self) -> int:
        return sum(s.allocated for s in self.segments)

    def free_blocks(self, pool: str | None = None, stream: int | None = None) -> list[int]:
        """Sizes of the free blocks (optionally of one pool and stream), largest first."""
        sizes = [
            b.size
            for s in self.segments
            if (pool is None or s.pool == pool) and (stream is None or s.stream == stream)
            for b in s.blocks
            if not b.allocated
        ]
        return sorted(sizes, reverse=True)

    def to_dict(self) -> dict[str, Any]:
        return {"event_index": self.event_index, "segments": [s.to_dict() for s in self.segments]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "MemoryMap":
        return cls(int(d.get("event_index", -1)), tuple(SegmentView.from_dict(s) for s in d.get("segments", ())))


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
        pool = "small" if size == _SMALL_BUFFER else "large"
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
        pool = "small" if size % _LARGE_BUFFER else "large"
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
        if info[2] and rounded <= _SMALL_SIZE:
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
    rep = _Replayer(SizeRules.from_settings(settings))
    wanted = set(capture)
    maps: dict[int, MemoryMap] = {}
    tl = Timeline()
    peak_r = peak_a = 0
    peak_i = -1
    ooms: list[int] = []
    for i, ev in enumerate(events):
        if i in wanted:
            maps[i] = rep.memory_map(i)
        action = ev.get("action")
        if action == "alloc":
            rep.alloc(int(ev["addr"]), int(ev["size"]))
        elif action == "free_completed":
            rep.free(int(ev["addr"]))
        elif action == "segment_alloc":
            rep.seg_alloc(int(ev["addr"]), int(ev["size"]), int(ev.get("stream", 0)))
        elif action == "segment_free":
            rep.seg_free(int(ev["addr"]), int(ev["size"]))
        elif action == "segment_map":
            rep.seg_map(int(ev["addr"]), int(ev["size"]), int(ev.get("stream", 0)))
        elif action == "segment_unmap":
            rep.seg_unmap(int(ev["addr"]), int(ev["size"]))
        elif action == "oom":
            ooms.append(i)
            continue
        else:
            continue
        tl.event_index.append(i)
        tl.time_us.append(int(ev.get("time_us", 0) or 0))
        tl.reserved.append(rep.reserved)
        tl.allocated.append(rep.allocated)
        if rep.reserved > peak_r:
            peak_r, peak_i = rep.reserved, i
        peak_a = max(peak_a, rep.allocated)
    if capture_peak and peak_i >= 0:
        # A second, shorter pass: cheaper than building a map at every new peak.
        at_peak = replay_history(events[: peak_i + 1], settings).final
        maps[peak_i] = MemoryMap(peak_i, at_peak.segments)
    return Replay(rep.memory_map(-1), tl, maps, peak_r, peak_i, peak_a, ooms)


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
# The diagnosis.


@dataclass(frozen=True)
class PinnedSegment:
    """A segment that cannot go back to the driver because a few live blocks hold it."""

    addr: int
    size: int
    allocated: int
    free: int
    largest_free: int
    live_blocks: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PinnedSegment":
        return cls(**{k: int(d[k]) for k in ("addr", "size", "allocated", "free", "largest_free", "live_blocks")})


@dataclass(frozen=True)
class WhatIf:
    """One candidate setting replayed on the recorded requests under the same budget."""

    config: str
    # True: the request that failed fits and nothing failed before it. The recorded run ended
    # (or changed course) at the OOM, so whether a *later* request would fail is not known.
    avoids_oom: bool | None  # None: could not be simulated
    peak_reserved: int | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "WhatIf":
        return cls(str(d["config"]), d.get("avoids_oom"), d.get("peak_reserved"), str(d.get("note", "")))


@dataclass(frozen=True)
class SnapshotDiagnosis:
    source: str
    verdict: str  # "fragmentation", "capacity" or "no-oom"
    summary: str
    state_source: str  # "snapshot-at-oom", "replayed-history" or "snapshot-final"
    oom_event_index: int
    oom_count: int
    request: int  # rounded bytes of the failed request
    alloc_size: int  # what the OOM message printed ("Tried to allocate")
    pool: str
    reserved: int
    allocated: int
    reserved_free: int
    largest_free: int  # largest free block the request could have used (same pool, same stream)
    free_blocks: int
    device_free: int | None
    budget: int | None
    budget_source: str
    pinned: tuple[PinnedSegment, ...]
    pinned_count: int
    pinned_free: int
    what_if: tuple[WhatIf, ...]
    recommendation: str | None
    evidence: tuple[str, ...]
    memory_map: MemoryMap = field(repr=False, default=MemoryMap(-1, ()))

    def to_dict(self, with_map: bool = True) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("pinned", "what_if", "memory_map")}
        d["schema"] = SCHEMA
        d["evidence"] = list(self.evidence)
        d["pinned"] = [p.to_dict() for p in self.pinned]
        d["what_if"] = [w.to_dict() for w in self.what_if]
        if with_map:
            d["memory_map"] = self.memory_map.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SnapshotDiagnosis":
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k not in ("pinned", "what_if", "memory_map")}
        kw["evidence"] = tuple(d.get("evidence", ()))
        kw["pinned"] = tuple(PinnedSegment.from_dict(p) for p in d.get("pinned", ()))
        kw["what_if"] = tuple(WhatIf.from_dict(w) for w in d.get("what_if", ()))
        kw["memory_map"] = MemoryMap.from_dict(d.get("memory_map", {}))
        return cls(**kw)


def _load(path_or_snapshot: str | Path | Mapping[str, Any], source: str | None) -> tuple[str, Mapping[str, Any]]:
    if isinstance(path_or_snapshot, Mapping):
        return source or "<snapshot>", path_or_snapshot
    from alloctune.trace import load_snapshot  # restricted unpickler; never plain pickle here

    return str(path_or_snapshot), load_snapshot(path_or_snapshot)


def sidecar_meta(path: str | Path) -> dict[str, Any]:
    """What was recorded beside a snapshot: the shared traces' `NAME.json`, or for the agent's
    `oom-snapshot.<pid>.pickle` its `report.<pid>.json` (cap, torch version)."""
    from alloctune.trace.load import read_sidecar

    p = Path(path)
    try:
        meta = read_sidecar(p)
    except TraceError:
        meta = {}
    if not meta and p.name.startswith("oom-snapshot."):
        pid = p.name.split(".")[1]
        try:
            meta = json.loads((p.with_name(f"report.{pid}.json")).read_text())
        except (OSError, ValueError):
            meta = {}
    return meta if isinstance(meta, dict) else {}


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _pinned_segments(mm: MemoryMap, pool: str, stream: int) -> list[PinnedSegment]:
    """Segments of the request's pool holding more free than live bytes, most free first."""
    out = []
    for s in mm.segments:
        if s.pool != pool or s.stream != stream or s.live_blocks == 0 or s.free <= s.allocated:
            continue
        out.append(PinnedSegment(s.addr, s.size, s.allocated, s.free, s.largest_free, s.live_blocks))
    out.sort(key=lambda p: (-p.free, p.addr))
    return out


def diagnose_snapshot(
    path_or_snapshot: str | Path | Mapping[str, Any],
    *,
    device: int = 0,
    oom: int = -1,
    budget: int | None = None,
    candidates: Sequence[str] | None = STANDARD_CANDIDATES,
    top: int = 8,
    source: str | None = None,
) -> SnapshotDiagnosis:
    """Explain the OOM recorded in a snapshot; `oom` picks which one (default: the last).

    `budget` is the per-process cap the run had; without it the sidecar `NAME.json`'s `cap`
    is used, else reserved-at-OOM + the device's free memory at the OOM (what the process
    could have had). `candidates=None` skips the what-if replays. `source` names an
    already-loaded snapshot dict (its file path: used for messages and the sidecar).
    """
    source, snap = _load(path_or_snapshot, source)
    traces = snap.get("device_traces") or []
    events: Sequence[Mapping[str, Any]] = traces[device] if device < len(traces) else []
    settings = snap.get("allocator_settings") or {}
    oom_indices = [i for i, e in enumerate(events) if e.get("action") == "oom"]
    if not oom_indices:
        raise TraceError(
            f"{source}: the snapshot's history holds no `oom` entry; record history before the OOM "
            "(alloctune run --on-oom snapshot) or pass a snapshot written at an OOM"
        )
    try:
        oom_i = oom_indices[oom]
    except IndexError:
        raise TraceError(f"{source}: OOM #{oom} requested but the history holds {len(oom_indices)}") from None
    ev = events[oom_i]
    request = int(ev.get("size", 0))
    stream = int(ev.get("stream", 0))
    device_free = ev.get("device_free")
    device_free = int(device_free) if device_free is not None else None

    after = [e for e in events[oom_i + 1 :] if e.get("action") not in ("oom", "snapshot", "user_defined")]
    if not after:
        mm = map_from_snapshot_segments(snap.get("segments") or [], device)
        state_source = "snapshot-at-oom"
    else:
        try:
            rp = replay_history(events, settings, capture=[oom_i])
        except HistoryGap as exc:
            raise TraceError(
                f"{source}: the snapshot was written after the OOM and its history does not reach back to an "
                f"empty allocator ({exc}); write the snapshot at the OOM (alloctune run --on-oom snapshot)"
            ) from None
        mm = rp.maps[oom_i]
        state_source = "replayed-history"

    pool = "small" if request <= _SMALL_SIZE else "large"
    free_sizes = mm.free_blocks(pool, stream)
    largest = free_sizes[0] if free_sizes else 0
    reserved, allocated = mm.reserved, mm.allocated
    reserved_free = reserved - allocated
    pinned = _pinned_segments(mm, pool, stream)
    pinned_free = sum(p.free for p in pinned)

    budget_source = "given"
    meta = sidecar_meta(source) if source != "<snapshot>" else {}
    torch_version = meta.get("torch") or meta.get("torch_version")
    if budget is None:
        budget = _positive_int(meta.get("cap")) or _positive_int(meta.get("budget"))
        budget_source = "recorded cap"
    if budget is None and device_free is not None:
        budget = reserved + device_free
        budget_source = "reserved + device free at the OOM"
    if budget is None:
        budget_source = "unknown"

    needed = allocation_size(request, SizeRules.from_settings(settings))
    evidence = [
        f"request: {format_size(request)} (rounded) from the {pool} pool; a new segment for it would be "
        f"{format_size(needed)} (the size the OOM message prints)",
        f"at the OOM: {format_size(reserved)} reserved, {format_size(allocated)} allocated, "
        f"{format_size(reserved_free)} reserved but free",
        f"largest free {pool}-pool block: {format_size(largest)} ({len(free_sizes)} free blocks) "
        f"vs the {format_size(request)} request",
    ]
    if pinned:
        live = sum(p.live_blocks for p in pinned)
        evidence.append(
            f"{len(pinned)} segment(s) hold more free than live memory: {format_size(pinned_free)} free, "
            f"pinned by {live} live block(s) of {format_size(sum(p.allocated for p in pinned))} in total"
        )
    if budget is not None:
        headroom = max(budget - reserved, 0)
        evidence.append(
            f"budget {format_size(budget)} ({budget_source}): headroom {format_size(headroom)} "
            f"{'<' if headroom < needed else '>='} the {format_size(needed)} new segment"
        )

    # Fragmentation whenever no free block served the request although the bytes were there:
    # cached-but-free alone covered it, or live tensors + request fit in the budget (the cached
    # pieces and the headroom together would have, had they been one range). Capacity only when
    # the live tensors and the request exceed the budget themselves.
    fits = budget is not None and allocated + request <= budget
    if largest < request and reserved_free >= request:
        verdict = "fragmentation"
        summary = (
            f"Fragmentation: {format_size(reserved_free)} was reserved but free, enough for the "
            f"{format_size(request)} request, yet no free block was larger than {format_size(largest)}."
        )
    elif largest < request and fits:
        verdict = "fragmentation"
        summary = (
            f"Fragmentation: the live tensors ({format_size(allocated)}) and the {format_size(request)} request "
            f"fit in the {format_size(budget)} budget, but its free part was split: {format_size(reserved_free)} "
            f"cached in blocks of at most {format_size(largest)}, and {format_size(max(budget - reserved, 0))} "
            f"of headroom, less than the {format_size(needed)} new segment."
        )
        evidence.append(f"allocated {format_size(allocated)} + request {format_size(request)} = "
                        f"{format_size(allocated + request)} <= budget {format_size(budget)}")
    else:
        verdict = "capacity"
        if budget is not None:
            summary = (
                f"Capacity: the live tensors ({format_size(allocated)}) and the {format_size(request)} request "
                f"need {format_size(allocated + request)}, more than the {format_size(budget)} budget."
            )
        else:
            summary = (
                f"Capacity: only {format_size(reserved_free)} was reserved but free for a "
                f"{format_size(request)} request, and the budget is unknown."
            )

    what_if: tuple[WhatIf, ...] = ()
    recommendation = None
    if candidates and budget is not None:
        what_if = tuple(what_if_replays(snap, source, device, oom_i, budget, candidates, torch_version))
        current = str(settings.get("PYTORCH_CUDA_ALLOC_CONF") or "")
        reproduced = bool(what_if) and what_if[0].config == current and what_if[0].avoids_oom is False
        if what_if and what_if[0].avoids_oom is None:
            evidence.append(f"no what-if replays: {what_if[0].note}")
        elif not reproduced:
            evidence.append("the simulator does not reproduce this OOM under the recorded setting, "
                            "so no setting is recommended from the replays")
        for w in what_if:
            if reproduced and w.avoids_oom and w.config != current:
                recommendation = w.config
                evidence.append(f"replayed under the same budget, {w.config} serves the failed request "
                                "(the recorded run ended there, so later requests are not covered)")
                break
    return SnapshotDiagnosis(
        source=source,
        verdict=verdict,
        summary=summary,
        state_source=state_source,
        oom_event_index=oom_i,
        oom_count=len(oom_indices),
        request=request,
        alloc_size=needed,
        pool=pool,
        reserved=reserved,
        allocated=allocated,
        reserved_free=reserved_free,
        largest_free=largest,
        free_blocks=len(free_sizes),
        device_free=device_free,
        budget=budget,
        budget_source=budget_source,
        pinned=tuple(pinned[:top]),
        pinned_count=len(pinned),
        pinned_free=pinned_free,
        what_if=what_if,
        recommendation=recommendation,
        evidence=tuple(evidence),
        memory_map=mm,
    )


def what_if_replays(
    snap: Mapping[str, Any],
    source: str,
    device: int,
    oom_index: int,
    budget: int,
    candidates: Sequence[str],
    torch: str | None = None,
) -> list[WhatIf]:
    """Replay the recorded requests under each candidate and the same budget (the simulator's job).

    The setting the run was recorded with goes first: the simulator must reproduce the OOM
    under it, or the other answers are not worth much (its note says so). A candidate avoids
    the OOM when the request that failed fits and nothing failed before it.
    """
    try:
        from alloctune.config import AllocatorConfig
        from alloctune.sim import replay
        from alloctune.trace import trace_from_snapshot
    except ImportError as exc:
        return [WhatIf(c, None, note=f"simulator unavailable: {exc}") for c in candidates]
    try:
        trace = trace_from_snapshot(dict(snap), device, source=source)
    except TraceError as exc:
        return [WhatIf(c, None, note=f"history not replayable: {exc}") for c in candidates]
    reqs = trace.requests
    target = next((i for i, e in enumerate(reqs.event_index) if e >= oom_index), None)
    if target is None:
        return [WhatIf(c, None, note="the failed request is not in the request stream") for c in candidates]
    settings = snap.get("allocator_settings") or {}
    recorded = str(settings.get("PYTORCH_CUDA_ALLOC_CONF") or "")
    order = [recorded] + [c for c in candidates if c != recorded]
    version = torch or "2.11"
    out = []
    for cand in order:
        try:
            res = replay(trace, AllocatorConfig.parse(cand, version), budget=budget, torch=version,
                         record_events=False)
        except Exception as exc:  # a candidate the simulator cannot model is reported, not fatal
            out.append(WhatIf(cand, None, note=f"{type(exc).__name__}: {exc}"))
            continue
        failed_before = res.oom is not None and res.oom.request_index <= target
        avoids = (not failed_before) and target in res.unexpected_successes
        if cand == recorded:
            note = "recorded setting: the simulator " + ("reproduces the OOM" if not avoids else "does NOT reproduce it")
        elif failed_before:
            note = f"fails earlier, at request {res.oom.request_index}"
        else:
            note = ""
        out.append(WhatIf(cand, avoids, res.peak_reserved, note))
    return out
