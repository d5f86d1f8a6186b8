"""Expandable segments (`expandable_segments:True`): one growing virtual range per
(stream, pool), backed by physical pages mapped on demand (spec §6).

This module owns the page bookkeeping of one range (`ExpandableSegment`: which pages are
mapped, what map/unmap of an address range really touches); the block-level logic
(find_expandable_block, map_block, unmap_block) is `ExpandableBlocks`, which
`CachingAllocator` inherits, next to the free sets it edits. Page size: 2 MiB in the small pool,
20 MiB (`large_segment_size`, 2.11+)
in the large pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from sortedcontainers import SortedDict

from alloctune.sim.blocks import Block, Pool, Segment
from alloctune.sim.sizes import SMALL_BUFFER

if TYPE_CHECKING:
    from alloctune.sim.blocks import SimAction
    from alloctune.sim.driver import Device
    from alloctune.sim.stats import Stats


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


class ExpandableBlocks:
    """Block-level expandable segments: find a spot, map and unmap pages, merge (methods of
    `CachingAllocator`)."""

    if TYPE_CHECKING:  # what these methods use of `CachingAllocator` (its state, its other methods)
        device: Device
        mid_segment: int  # large-pool page size in bytes
        segments: dict[int, Segment]
        next_seg_id: int
        stats: Stats

        def _event(self, action: SimAction, addr: int, size: int, stream: int) -> None: ...
        def _insert(self, pool: Pool, b: Block) -> None: ...
        def _remove(self, pool: Pool, b: Block) -> None: ...

    def _unmapped_add(self, pool: Pool, b: Block) -> None:
        um = pool.unmapped.get(b.seg.stream)
        if um is None:
            um = pool.unmapped[b.seg.stream] = SortedDict()
        b.key = b.addr
        um[b.addr] = b

    def _unmapped_remove(self, pool: Pool, b: Block) -> None:
        del pool.unmapped[b.seg.stream][b.key]

    def _find_expandable_block(self, pool: Pool, size: int, stream: int) -> Block:
        """Lowest-address spot (free + unmapped run) with room for `size`, else a new segment."""
        um = pool.unmapped.get(stream)
        c: Block  # `um` maps address -> unmapped Block (a SortedDict, which has no types)
        x: Block | None
        if um:
            for c in um.values():
                p = c.prev
                if p is not None and not p.allocated:
                    c = p
                got = 0
                x = c
                while got < size and x is not None and not x.allocated:
                    got += x.size
                    x = x.next
                if got >= size:
                    return c
        page = SMALL_BUFFER if pool.small else self.mid_segment
        es = ExpandableSegment(self.device, page)
        seg = Segment(es.base, es.size, stream, pool.small, self.next_seg_id, es)
        self.next_seg_id += 1
        self.segments[seg.id] = seg
        b = Block(es.base, es.size, seg, mapped=False)
        seg.head = b
        self._unmapped_add(pool, b)
        return b

    def _map_block(self, pool: Pool, b: Block, size: int) -> bool:
        es: ExpandableSegment = b.seg.es
        start = b.addr
        mapped = es.map(start, size)
        if mapped == 0:
            return False
        self._unmapped_remove(pool, b)
        b.mapped = True
        if mapped < b.size:
            rest = Block(b.addr + mapped, b.size - mapped, b.seg, mapped=False)
            rest.prev = b
            rest.next = b.next
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            self._unmapped_add(pool, rest)
            b.size = mapped
        self._merge_into(pool, b, b.prev)
        self._merge_into(pool, b, b.next)
        self._insert(pool, b)
        st = self.stats
        st.reserved_inc(mapped)
        st.num_device_alloc += 1
        self._event("segment_map", start, mapped, b.seg.stream)
        return True

    def _merge_into(self, pool: Pool, dst: Block, src: Block | None) -> int:
        """try_merge_blocks for map/unmap (free neighbours with the same mapped state)."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if src.prev is not None:
                src.prev.next = dst
            else:
                dst.seg.head = dst
        else:
            dst.next = src.next
            if src.next is not None:
                src.next.prev = dst
        dst.size += src.size
        if src.mapped:
            self._remove(pool, src)
        else:
            self._unmapped_remove(pool, src)
        return src.size

    def _try_allocate_expandable(self, pool: Pool, size: int, stream: int) -> Block | None:
        c = self._find_expandable_block(pool, size, stream)
        if not c.mapped and not self._map_block(pool, c, min(c.size, size)):
            return None
        while c.size < size:
            nxt = cast(Block, c.next)  # the spot found has room for `size`: blocks follow until then
            if not self._map_block(pool, nxt, min(size - c.size, nxt.size)):
                return None
            c = nxt
        self._remove(pool, c)
        return c

    def _unmap_block(self, pool: Pool, b: Block) -> None:
        es: ExpandableSegment = b.seg.es
        start, length = es.unmap(b.addr, b.size)
        if length == 0:
            return
        self._remove(pool, b)
        before = start - b.addr
        if before > 0:
            bf = Block(b.addr, before, b.seg)
            bf.prev = b.prev
            bf.next = b
            if b.prev is not None:
                b.prev.next = bf
            else:
                b.seg.head = bf
            b.prev = bf
            self._insert(pool, bf)
        after = b.size - before - length
        if after > 0:
            af = Block(start + length, after, b.seg)
            af.prev = b
            af.next = b.next
            if b.next is not None:
                b.next.prev = af
            b.next = af
            self._insert(pool, af)
        b.addr = start
        b.size = length
        b.mapped = False
        self._merge_into(pool, b, b.prev)
        self._merge_into(pool, b, b.next)
        self._unmapped_add(pool, b)
        st = self.stats
        st.reserved_dec(length)
        st.num_device_free += 1
        self._event("segment_unmap", start, length, b.seg.stream)

    def _release_expandable_segment(self, pool: Pool, b: Block) -> None:
        seg = b.seg
        self._unmapped_remove(pool, b)
        seg.es.destroy()
        del self.segments[seg.id]
