"""A model of PyTorch's native CUDA caching allocator (`DeviceCachingAllocator`), rule by rule.

It follows PyTorch's `c10/cuda/CUDACachingAllocator.cpp` (torch 2.11 by default; the rules that changed
between releases are switched by `SimSettings.torch`): rounding, small/large pools,
per-stream best fit with the version's tie-break, `max_split_size` rules A/B, splitting and
coalescing, the malloc slow path (GC, device allocation, release of oversize blocks,
release-all-and-retry, OOM), the memory cap, `empty_cache()`, and expandable segments.
Statistics are kept under `memory_stats()` names.

By concern: this module is the hot path (malloc, free, best fit, split, merge); the data
(blocks, free sets, pools) is `blocks.py`, the size rules `sizes.py`, the slow path
`slow_path.py`, block-level expandable segments `expandable.py`, inspection
`inspection.py` — all methods of the one `CachingAllocator` class. The native core
(`_native.c`) follows the same rules; this model is its specification.
"""

from __future__ import annotations

from typing import Callable

from alloctune.sim.blocks import ADDR_BITS, ID_BITS, Block, FreeSet, OOMInfo, Pool, Segment, SimAction, SimEvent
from alloctune.sim.driver import Device
from alloctune.sim.expandable import ExpandableBlocks
from alloctune.sim.inspection import Inspection
from alloctune.sim.settings import SimSettings
from alloctune.sim.sizes import MIN_BLOCK, SMALL_SIZE, allocation_size, division_table, round_size
from alloctune.sim.slow_path import SlowPath
from alloctune.sim.stats import Stats

__all__ = ["CachingAllocator", "Block", "OOMInfo", "Segment", "SimEvent"]


class CachingAllocator(SlowPath, ExpandableBlocks, Inspection):
    """The simulated allocator of one device.

    `cap`: per-process budget in bytes (`allowed_memory_maximum`, None = no cap). GC runs only
    with a cap (torch >= 2.10: only when the cap is below the device total).
    """

    def __init__(
        self,
        settings: SimSettings | None = None,
        cap: int | None = None,
        device: Device | None = None,
        record_events: bool = True,
    ) -> None:
        s = settings or SimSettings()
        self.settings = s
        self.device = device or Device()
        self.cap = cap
        self.gc_on = cap is not None and s.garbage_collection_threshold > 0
        self.mss = s.max_split_size  # None = unlimited
        self.nsr = s.nsr
        self.mid_segment = s.segment_size_mid
        self.expandable = s.expandable_segments
        self.table = division_table(s)
        self.id_key = s.seg_id_tiebreak
        self.shift = ADDR_BITS + ID_BITS if self.id_key else ADDR_BITS
        self.small_pool = Pool(True)
        self.large_pool = Pool(False)
        self.segments: dict[int, Segment] = {}  # id -> live segment (creation order)
        self.next_seg_id = 0
        self.stats = Stats()
        self.events: list[SimEvent] | None = [] if record_events else None
        self.request_index = -1  # set by the replay loop so events can point at their request
        self.oom: OOMInfo | None = None  # the last failure
        self.on_event: Callable[[SimEvent], None] | None = None

    # ------------------------------------------------------------------ sizes
    def round_size(self, size: int) -> int:
        return round_size(size, self.table)

    def allocation_size(self, size: int) -> int:
        return allocation_size(size, self.mid_segment)

    # ------------------------------------------------------------------ keys / free sets
    def _key(self, b: Block) -> int:
        if self.id_key:
            return (b.size << self.shift) | (b.seg.id << ADDR_BITS) | b.addr
        return (b.size << ADDR_BITS) | b.addr

    def _insert(self, pool: Pool, b: Block) -> None:
        """`insert_into_blocks`: into the free set, resetting the block's GC age."""
        fs = pool.sets.get(b.seg.stream)
        if fs is None:
            fs = pool.sets[b.seg.stream] = FreeSet()
        key = self._key(b)
        b.key = key
        b.gc_base = pool.calls
        fs.keys.add(key)
        fs.blocks[key] = b

    def _remove(self, pool: Pool, b: Block) -> None:
        fs = pool.sets[b.seg.stream]
        fs.keys.remove(b.key)
        del fs.blocks[b.key]

    # ------------------------------------------------------------------ public API
    def malloc(self, orig: int, stream: int = 0) -> Block | None:
        """Allocate `orig` bytes on `stream`; None when the real allocator would raise OOM."""
        if self.table is None:  # round_size, inlined for the common case (no power-of-2 rounding)
            size = (orig + 511) & ~511 if orig >= MIN_BLOCK else MIN_BLOCK
        else:
            size = round_size(orig, self.table)
        small = size <= SMALL_SIZE
        pool = self.small_pool if small else self.large_pool
        b = self._get_free_block(pool, size, stream)
        if b is None:
            b = self._malloc_slow(pool, orig, size, stream, small)
            if b is None:
                return None
        # should_split / alloc_found_block
        remaining = b.size - size
        st = self.stats
        es = b.seg.es is not None
        if (
            (remaining >= MIN_BLOCK)
            if (small or self.expandable)
            else (remaining > SMALL_SIZE and (self.mss is None or size < self.mss))
        ):
            was_split = b.prev is not None or b.next is not None
            nb = Block(b.addr, size, b.seg)
            nb.prev = b.prev
            nb.next = b
            if b.prev is not None:
                b.prev.next = nb
            else:
                b.seg.head = nb
            b.prev = nb
            b.addr += size
            b.size = remaining
            # insert_into_blocks, inlined (hot path): the remainder back into its free set
            key = (remaining << self.shift) | (b.seg.id << ADDR_BITS if self.id_key else 0) | b.addr
            b.key = key
            b.gc_base = pool.calls
            fs = pool.sets.get(stream)
            if fs is None:
                fs = pool.sets[stream] = FreeSet()
            fs.keys.add(key)
            fs.blocks[key] = b
            if not es:
                if was_split:
                    st.inactive_split_bytes_dec(size)
                else:
                    st.inactive_split_inc(1, remaining)
            b = nb
        elif not es and (b.prev is not None or b.next is not None):
            st.inactive_split_dec(1, b.size)
        b.allocated = True
        b.requested = orig
        # allocation / allocated_bytes / active / requested stats (inlined: hot path)
        bs = b.size
        st.alloc_count += 1
        st.alloc_cum += 1
        if st.alloc_count > st.alloc_peak:
            st.alloc_peak = st.alloc_count
        cur = st.allocated + bs
        st.allocated = cur
        st.allocated_cum += bs
        if cur > st.allocated_peak:
            st.allocated_peak = cur
        cur = st.requested + orig
        st.requested = cur
        st.requested_cum += orig
        if cur > st.requested_peak:
            st.requested_peak = cur
        if self.mss is not None and bs >= self.mss:
            st.oversize_alloc_inc()
        return b

    def free(self, b: Block) -> None:
        """The program freed `b` (free_requested and free_completed at once: one stream)."""
        st = self.stats
        bs = b.size
        st.alloc_count -= 1
        st.allocated -= bs
        st.requested -= b.requested
        if self.mss is not None and bs >= self.mss:
            st.oversize_alloc_dec()
        b.allocated = False
        seg = b.seg
        pool = self.small_pool if seg.small else self.large_pool
        fs: FreeSet | None  # the set a merged neighbour leaves, then the one `b` joins
        # free_block: merge with free neighbours of the same segment (same mapped state)
        net_n = 0
        net_bytes = 0
        p = b.prev
        if p is not None and not p.allocated and p.mapped:  # b itself is mapped
            fs = pool.sets[seg.stream]
            fs.keys.remove(p.key)
            del fs.blocks[p.key]
            b.addr = p.addr
            b.size += p.size
            b.prev = p.prev
            if p.prev is not None:
                p.prev.next = b
            else:
                seg.head = b
            net_n -= 1
            net_bytes -= p.size
        n = b.next
        if n is not None and not n.allocated and n.mapped:
            fs = pool.sets[seg.stream]
            fs.keys.remove(n.key)
            del fs.blocks[n.key]
            b.size += n.size
            b.next = n.next
            if n.next is not None:
                n.next.prev = b
            net_n -= 1
            net_bytes -= n.size
        # insert_into_blocks, inlined (hot path)
        fs = pool.sets.get(seg.stream)
        if fs is None:
            fs = pool.sets[seg.stream] = FreeSet()
        key = (b.size << self.shift) | (seg.id << ADDR_BITS if self.id_key else 0) | b.addr
        b.key = key
        b.gc_base = pool.calls
        fs.keys.add(key)
        fs.blocks[key] = b
        if seg.es is None:
            if b.prev is not None or b.next is not None:
                net_n += 1
                net_bytes += b.size
            if net_n:
                st.inactive_split_change(net_n, net_bytes)
            elif net_bytes:
                v = st.inactive_split_bytes + net_bytes
                st.inactive_split_bytes = v
                if net_bytes > 0:
                    st.inactive_split_bytes_cum += net_bytes
                    if v > st.inactive_split_bytes_peak:
                        st.inactive_split_bytes_peak = v

    def empty_cache(self) -> None:
        """`torch.cuda.empty_cache()` = release_cached_blocks()."""
        self._release_cached()

    # ------------------------------------------------------------------ get_free_block
    def _get_free_block(self, pool: Pool, size: int, stream: int) -> Block | None:
        if self.gc_on:
            pool.calls += 1
        fs = pool.sets.get(stream)
        if fs is None:
            return None
        keys = fs.keys
        i = keys.bisect_left(size << self.shift)
        if i == len(keys):
            return None
        b = fs.blocks[keys[i]]
        if b.seg.es is not None:
            if self.expandable:
                # best fit counts the unmapped space right after a block as its size
                nxt = b.next
                ex = b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)
                j = i + 1
                n = len(keys)
                while b.seg.es is not None and j < n:
                    c = fs.blocks[keys[j]]
                    cn = c.next
                    cex = c.size + (cn.size if cn is not None and not cn.mapped else 0)
                    if cex >= ex:
                        break
                    b, ex, i = c, cex, j
                    j += 1
            else:  # the flag was switched off: only non-expandable blocks qualify
                n = len(keys)
                i += 1
                while i < n and fs.blocks[keys[i]].seg.es is not None:
                    i += 1
                if i == n:
                    return None
                b = fs.blocks[keys[i]]
        mss = self.mss
        if mss is not None:
            if size < mss and b.size >= mss:  # rule A: no oversize block for a normal request
                return None
            if size >= mss and b.size >= size + self.nsr:  # rule B: limited rounding
                return None
        del keys[i]
        del fs.blocks[b.key]
        return b

    # ------------------------------------------------------------------ events / inspection
    def _event(self, action: SimAction, addr: int, size: int, stream: int) -> None:
        ev = SimEvent(action, addr, size, stream, self.request_index)
        if self.events is not None:
            self.events.append(ev)
        if self.on_event is not None:
            self.on_event(ev)

    def largest_free_block(self) -> int:
        best = 0
        for pool in (self.large_pool, self.small_pool):
            for fs in pool.sets.values():
                if fs.keys:
                    best = max(best, fs.blocks[fs.keys[-1]].size)
        return best
