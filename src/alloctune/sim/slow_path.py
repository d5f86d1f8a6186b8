"""The malloc slow path of the simulated allocator: garbage collection, new segments, release of
oversize cached blocks, release-all-and-retry, and the OOM record (spec §4-§5).

Kept apart from the hot path (`allocator.py`: rounding, best fit, split, merge) because it
runs rarely and reads best as one story; `CachingAllocator` inherits it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from alloctune.sim.blocks import Block, OOMInfo, Pool, Segment

if TYPE_CHECKING:
    from alloctune.sim.blocks import SimAction
    from alloctune.sim.driver import Device
    from alloctune.sim.settings import SimSettings
    from alloctune.sim.stats import Stats


class SlowPath:
    """`malloc`'s way to a block when no cached one fits (methods of `CachingAllocator`)."""

    if TYPE_CHECKING:  # what these methods use of `CachingAllocator` (its state, its other methods)
        settings: SimSettings
        device: Device
        cap: int | None  # bytes; None = uncapped
        gc_on: bool
        mss: int | None  # max_split_size in bytes; None = unlimited
        expandable: bool
        shift: int
        small_pool: Pool
        large_pool: Pool
        segments: dict[int, Segment]
        next_seg_id: int
        stats: Stats
        request_index: int
        oom: OOMInfo | None

        def allocation_size(self, size: int) -> int: ...
        def largest_free_block(self) -> int: ...
        def _event(self, action: SimAction, addr: int, size: int, stream: int) -> None: ...
        def _remove(self, pool: Pool, b: Block) -> None: ...
        def _try_allocate_expandable(self, pool: Pool, size: int, stream: int) -> Block | None: ...
        def _unmap_block(self, pool: Pool, b: Block) -> None: ...
        def _release_expandable_segment(self, pool: Pool, b: Block) -> None: ...

    def _malloc_slow(self, pool: Pool, orig: int, size: int, stream: int, small: bool) -> Block | None:
        alloc_size = self.allocation_size(size)
        if self.gc_on:
            self._garbage_collect()
        b = self._alloc_block(pool, size, alloc_size, stream, small, False)
        if b is None and self._release_available(pool, size, stream):
            b = self._alloc_block(pool, size, alloc_size, stream, small, False)
        if b is None:
            self._release_cached()
            b = self._alloc_block(pool, size, alloc_size, stream, small, True)
        if b is None:
            st = self.stats
            st.num_ooms += 1
            self.oom = OOMInfo(
                request_index=self.request_index,
                size=orig,
                rounded=size,
                alloc_size=alloc_size,
                stream=stream,
                reserved=st.reserved,
                allocated=st.allocated,
                device_free=self.device.free_bytes,
                cap=self.cap,
                largest_free_block=self.largest_free_block(),
            )
            self._event("oom", 0, size, stream)
        return b

    def _alloc_block(self, pool: Pool, size: int, alloc_size: int, stream: int, small: bool, retry: bool) -> Block | None:
        st = self.stats
        if retry:
            st.num_alloc_retries += 1
        if self.cap is not None and st.reserved + alloc_size > self.cap:
            return None
        if self.expandable:
            return self._try_allocate_expandable(pool, size, stream)
        addr = self.device.malloc(alloc_size)
        if addr is None:
            return None
        seg = Segment(addr, alloc_size, stream, small, self.next_seg_id)
        self.next_seg_id += 1
        self.segments[seg.id] = seg
        b = Block(addr, alloc_size, seg)
        seg.head = b
        st.segment_inc(alloc_size)
        if self.mss is not None and alloc_size >= self.mss:
            st.oversize_seg_inc()
        st.num_device_alloc += 1
        self._event("segment_alloc", addr, alloc_size, stream)
        return b

    def _release_block(self, pool: Pool, b: Block) -> None:
        """cudaFree a whole idle segment (b is its only block, in the free set)."""
        seg = b.seg
        st = self.stats
        st.num_device_free += 1
        self._event("segment_free", b.addr, b.size, seg.stream)
        self.device.free(b.addr, b.size)
        st.segment_dec(b.size)
        if self.mss is not None and b.size >= self.mss:
            st.oversize_seg_dec()
        self._remove(pool, b)
        del self.segments[seg.id]

    def _release_available(self, pool: Pool, size: int, stream: int) -> bool:
        """Free oversize cached blocks, just enough for this request (only with max_split_size)."""
        mss = self.mss
        if mss is None:
            return False
        fs = pool.sets.get(stream)
        if fs is None:
            return False
        keys = fs.keys
        need = size if size > mss else mss
        i = keys.bisect_left(need << self.shift)
        if i < len(keys) and fs.blocks[keys[i]].seg.es is None:
            self._release_block(pool, fs.blocks[keys[i]])
            return True
        if i == 0:
            return False
        released = 0
        i -= 1
        while released < need:
            b = fs.blocks[keys[i]]
            if b.size < mss:
                break
            first = i == 0
            if b.seg.es is None:
                released += b.size
                self._release_block(pool, b)  # removes keys[i]; i-1 is still the next one down
            if first:
                break
            i -= 1
        return released >= need

    def _release_cached(self) -> None:
        """release_cached_blocks: every idle segment of both pools; unmap free expandable pages."""
        self.stats.num_sync_all_streams += 1
        for pool in (self.large_pool, self.small_pool):
            to_unmap: list[Block] = []
            for fs in pool.ordered_sets():
                for key in list(fs.keys):
                    b = fs.blocks[key]
                    if b.seg.es is not None:
                        to_unmap.append(b)
                    elif b.prev is None and b.next is None:
                        self._release_block(pool, b)
            for b in to_unmap:
                self._unmap_block(pool, b)
                if not b.mapped and b.prev is None and b.next is None:
                    self._release_expandable_segment(pool, b)

    def _garbage_collect(self) -> None:
        """garbage_collection_threshold: free whole idle large segments at/above average age."""
        s = self.settings
        threshold = int(s.garbage_collection_threshold * cast(int, self.cap))  # gc_on: there is a cap
        st = self.stats
        if st.reserved <= threshold:
            return
        target = st.reserved - threshold
        pool = self.large_pool
        calls = pool.calls
        b: Block | None
        total_age = 0
        count = 0
        for fs in pool.ordered_sets():
            for b in fs.blocks.values():
                if b.prev is None and b.next is None:
                    total_age += calls - b.gc_base
                    count += 1
        if count == 0:
            return
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            avg = total_age / count
            freed = False
            for fs in pool.ordered_sets():
                for key in list(fs.keys):
                    b = fs.blocks.get(key)
                    if b is None or b.prev is not None or b.next is not None or b.seg.es is not None:
                        continue
                    age = calls - b.gc_base
                    if age >= avg:
                        freed = True
                        reclaimed += b.size
                        total_age -= age
                        count -= 1
                        self._release_block(pool, b)
