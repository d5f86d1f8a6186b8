"""The allocator's memory map as plain data: segments and their blocks in address order.

Only dataclasses with `to_dict`/`from_dict` and derived properties, so that the diagnosis, the
explain page and the report (tables, figures, HTML) take a map without importing what builds it
(`memory_map.build`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


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
