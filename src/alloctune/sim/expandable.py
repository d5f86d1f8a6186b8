"""Expandable segments (`expandable_segments:True`): one growing virtual range per
(stream, pool), backed by physical pages mapped on demand (spec §6).

This module owns the page bookkeeping of one range (`ExpandableSegment`: which pages are
mapped, what map/unmap of an address range really touches); the block-level logic
(find_expandable_block, map_block, unmap_block) lives in `allocator.py` next to the free
sets it edits. Page size: 2 MiB in the small pool, 20 MiB (`large_segment_size`, 2.11+)
in the large pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alloctune.sim.driver import Device


class ExpandableSegment:
    """A reserved virtual range of `page * max_pages` bytes; pages mapped individually."""

    def __init__(self, device: "Device", page: int) -> None:
        self.device = device
        self.page = page
        total = device.total_memory
        # enough virtual space for 1 1/8 of the device, in whole pages (as PyTorch reserves)
        self.max_pages = -(-(total + total // 8) // page)
        self.size = self.page * self.max_pages
        self.base = device.va.alloc(self.size)
        self.mapped: set[int] = set()  # page indices with physical memory

    def map(self, addr: int, size: int) -> int:
        """Map the pages covering [addr, addr+size) (addr is page aligned); bytes mapped or 0.

        A page that cannot be created (device full) undoes this call's pages: 0 = OOM.
        """
        page = self.page
        begin = (addr - self.base) // page
        end = -(-(addr + size - self.base) // page)
        if end <= begin:
            return 0
        need = (end - begin) * page
        if not self.device.create(need):
            return 0
        self.mapped.update(range(begin, end))
        return need

    def unmap(self, addr: int, size: int) -> tuple[int, int]:
        """Unmap the pages lying wholly inside [addr, addr+size): (start, bytes) or (addr, 0)."""
        page = self.page
        begin = -(-(addr - self.base) // page)
        end = (addr + size - self.base) // page
        if begin >= end:
            return addr, 0
        self.mapped.difference_update(range(begin, end))
        n = (end - begin) * page
        self.device.release(n)
        return self.base + begin * page, n

    def destroy(self) -> None:
        """Give the virtual range back (all pages are unmapped by now)."""
        self.device.va.free(self.base, self.size)
