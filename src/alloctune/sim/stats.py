"""Allocator statistics under `torch.cuda.memory_stats()` names (the `.all` aggregate).

Counters are plain int attributes updated inline by the allocator's hot path; `as_dict()`
expands them into PyTorch's `<stat>.all.{current,peak,allocated,freed}` keys.

In a replay, free_requested and free_completed happen together (single-stream traces), so
`active*` equals `allocation`/`allocated_bytes` at every point, as on the GPU for such runs.
"""

from __future__ import annotations

from typing import Any


class Stats:
    __slots__ = (
        "alloc_count",
        "alloc_peak",
        "alloc_cum",
        "allocated",
        "allocated_peak",
        "allocated_cum",
        "requested",
        "requested_peak",
        "requested_cum",
        "reserved",
        "reserved_peak",
        "reserved_cum",
        "segments",
        "segments_peak",
        "segments_cum",
        "inactive_split",
        "inactive_split_peak",
        "inactive_split_cum",
        "inactive_split_bytes",
        "inactive_split_bytes_peak",
        "inactive_split_bytes_cum",
        "oversize_allocations",
        "oversize_allocations_peak",
        "oversize_allocations_cum",
        "oversize_segments",
        "oversize_segments_peak",
        "oversize_segments_cum",
        "num_alloc_retries",
        "num_ooms",
        "num_sync_all_streams",
        "num_device_alloc",
        "num_device_free",
    )

    # every counter is a byte or event count, set to 0 in __init__ (annotated for type checkers)
    alloc_count: int
    alloc_peak: int
    alloc_cum: int
    allocated: int
    allocated_peak: int
    allocated_cum: int
    requested: int
    requested_peak: int
    requested_cum: int
    reserved: int
    reserved_peak: int
    reserved_cum: int
    segments: int
    segments_peak: int
    segments_cum: int
    inactive_split: int
    inactive_split_peak: int
    inactive_split_cum: int
    inactive_split_bytes: int
    inactive_split_bytes_peak: int
    inactive_split_bytes_cum: int
    oversize_allocations: int
    oversize_allocations_peak: int
    oversize_allocations_cum: int
    oversize_segments: int
    oversize_segments_peak: int
    oversize_segments_cum: int
    num_alloc_retries: int
    num_ooms: int
    num_sync_all_streams: int
    num_device_alloc: int
    num_device_free: int

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    # reserved / segments ------------------------------------------------------------------
    def reserved_inc(self, n: int) -> None:
        self.reserved += n
        self.reserved_cum += n
        if self.reserved > self.reserved_peak:
            self.reserved_peak = self.reserved

    def reserved_dec(self, n: int) -> None:
        self.reserved -= n

    def segment_inc(self, size: int) -> None:
        self.segments += 1
        self.segments_cum += 1
        if self.segments > self.segments_peak:
            self.segments_peak = self.segments
        self.reserved_inc(size)

    def segment_dec(self, size: int) -> None:
        self.segments -= 1
        self.reserved -= size

    # inactive split -----------------------------------------------------------------------
    def inactive_split_inc(self, n: int, nbytes: int) -> None:
        self.inactive_split_change(n, nbytes)

    def inactive_split_dec(self, n: int, nbytes: int) -> None:
        self.inactive_split_change(-n, -nbytes)

    def inactive_split_bytes_dec(self, nbytes: int) -> None:
        self.inactive_split_change(0, -nbytes)

    def inactive_split_change(self, n: int, nbytes: int) -> None:
        if n:
            self.inactive_split += n
            if n > 0:
                self.inactive_split_cum += n
                if self.inactive_split > self.inactive_split_peak:
                    self.inactive_split_peak = self.inactive_split
        if nbytes:
            self.inactive_split_bytes += nbytes
            if nbytes > 0:
                self.inactive_split_bytes_cum += nbytes
                if self.inactive_split_bytes > self.inactive_split_bytes_peak:
                    self.inactive_split_bytes_peak = self.inactive_split_bytes

    # oversize -----------------------------------------------------------------------------
    def oversize_alloc_inc(self) -> None:
        self.oversize_allocations += 1
        self.oversize_allocations_cum += 1
        if self.oversize_allocations > self.oversize_allocations_peak:
            self.oversize_allocations_peak = self.oversize_allocations

    def oversize_alloc_dec(self) -> None:
        self.oversize_allocations -= 1

    def oversize_seg_inc(self) -> None:
        self.oversize_segments += 1
        self.oversize_segments_cum += 1
        if self.oversize_segments > self.oversize_segments_peak:
            self.oversize_segments_peak = self.oversize_segments

    def oversize_seg_dec(self) -> None:
        self.oversize_segments -= 1

    # export -------------------------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        """memory_stats()-style flat dict (aggregate `.all` keys plus the scalar counters)."""
        out: dict[str, Any] = {}

        def put(name: str, cur: int, peak: int, cum: int) -> None:
            out[f"{name}.current"] = cur
            out[f"{name}.peak"] = peak
            out[f"{name}.allocated"] = cum
            out[f"{name}.freed"] = cum - cur

        put("allocation.all", self.alloc_count, self.alloc_peak, self.alloc_cum)
        put("active.all", self.alloc_count, self.alloc_peak, self.alloc_cum)
        put("allocated_bytes.all", self.allocated, self.allocated_peak, self.allocated_cum)
        put("active_bytes.all", self.allocated, self.allocated_peak, self.allocated_cum)
        put("requested_bytes.all", self.requested, self.requested_peak, self.requested_cum)
        put("reserved_bytes.all", self.reserved, self.reserved_peak, self.reserved_cum)
        put("segment.all", self.segments, self.segments_peak, self.segments_cum)
        put("inactive_split.all", self.inactive_split, self.inactive_split_peak, self.inactive_split_cum)
        put(
            "inactive_split_bytes.all",
            self.inactive_split_bytes,
            self.inactive_split_bytes_peak,
            self.inactive_split_bytes_cum,
        )
        put("oversize_allocations", self.oversize_allocations, self.oversize_allocations_peak, self.oversize_allocations_cum)
        put("oversize_segments", self.oversize_segments, self.oversize_segments_peak, self.oversize_segments_cum)
        for name in ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free"):
            out[name] = getattr(self, name)
        return out
