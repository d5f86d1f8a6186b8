"""A model of PyTorch's native CUDA caching allocator (`DeviceCachingAllocator`), rule by rule.

It follows `/work/shared/allocator-spec.md` (torch 2.11 by default; the rules that changed
between releases are switched by `SimSettings.torch`): rounding, small/large pools,
per-stream best fit with the version's tie-break, `max_split_size` rules A/B, splitting and
coalescing, the malloc slow path (GC, device allocation, release of oversize blocks,
release-all-and-retry, OOM), the memory cap, `empty_cache()`, and expandable segments
(with `expandable.py`). Statistics are kept under `memory_stats()` names.

Speed matters (a trace has ~10^6 requests): free blocks live in one `SortedList` of int
keys per (pool, stream) — an int compares much faster than a tuple — with the key packing
(size, [segment id,] address).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from sortedcontainers import SortedDict, SortedList

from alloctune.sim.driver import Device
from alloctune.sim.expandable import ExpandableSegment
from alloctune.sim.settings import SimSettings
from alloctune.sim.stats import Stats

MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 << 20  # kSmallSize: rounded size <= this -> small pool
SMALL_BUFFER = 2 << 20  # kSmallBuffer: small segment / small expandable page
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge
ADDR_BITS = 48  # addresses are < 2**48; keys pack size above them
ID_BITS = 40


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

    action: str
    addr: int
    size: int
    stream: int
    request_index: int


class CachingAllocator:
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
        self.table = s.roundup_power2_divisions if any(d > 1 for d in s.roundup_power2_divisions) else None
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
        if size < MIN_BLOCK:
            return MIN_BLOCK
        if self.table is not None:
            idx = size.bit_length() - 21  # floor(log2(size)) - 20
            d = self.table[0 if idx < 0 else (15 if idx > 15 else idx)]
            if d > 1 and size > MIN_BLOCK * d:
                return _next_division(size, d)
        return (size + 511) & ~511

    def allocation_size(self, size: int) -> int:
        if size <= SMALL_SIZE:
            return SMALL_BUFFER
        if size < MIN_LARGE_ALLOC:
            return self.mid_segment
        return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE

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
            size = self.round_size(orig)
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
        if (remaining >= MIN_BLOCK) if (small or self.expandable) else (
            remaining > SMALL_SIZE and (self.mss is None or size < self.mss)
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

    # ------------------------------------------------------------------ slow path
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

    def _alloc_block(
        self, pool: Pool, size: int, alloc_size: int, stream: int, small: bool, retry: bool
    ) -> Block | None:
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
        threshold = int(s.garbage_collection_threshold * self.cap)
        st = self.stats
        if st.reserved <= threshold:
            return
        target = st.reserved - threshold
        pool = self.large_pool
        calls = pool.calls
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

    # ------------------------------------------------------------------ expandable segments
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
            nxt = c.next
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

    # ------------------------------------------------------------------ events / inspection
    def _event(self, action: str, addr: int, size: int, stream: int) -> None:
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

    def segment_table(self) -> list[dict[str, Any]]:
        """The allocator's state like `torch.cuda.memory_snapshot()`: segments with their blocks.

        Expandable segments are shown as one entry per run of mapped blocks (as PyTorch does).
        """
        out: list[dict[str, Any]] = []
        for seg in self.segments.values():
            b = seg.head
            run: list[Block] = []

            def flush() -> None:
                if run:
                    out.append(_seg_info(seg, run))
                    run.clear()

            while b is not None:
                if b.mapped:
                    run.append(b)
                else:
                    flush()
                b = b.next
            flush()
        out.sort(key=lambda d: d["address"])
        return out

    def check(self) -> None:
        """Internal consistency (tests): blocks tile segments, free sets match, stats add up."""
        allocated = reserved = 0
        for seg in self.segments.values():
            b = seg.head
            assert b is not None and b.prev is None and b.addr == seg.addr
            end = seg.addr
            while b is not None:
                assert b.addr == end, (b, end)
                end += b.size
                pool = self.small_pool if seg.small else self.large_pool
                if b.mapped:
                    if seg.es is not None:
                        reserved += b.size
                    if b.allocated:
                        allocated += b.size
                    else:
                        fs = pool.sets[seg.stream]
                        assert fs.blocks.get(b.key) is b and b.key == self._key(b), b
                        if b.next is not None:
                            assert b.next.allocated or b.next.mapped != b.mapped, "unmerged free neighbours"
                if b.next is not None:
                    assert b.next.prev is b
                b = b.next
            assert end == seg.addr + seg.size
            if seg.es is None:
                reserved += seg.size
        assert allocated == self.stats.allocated, (allocated, self.stats.allocated)
        assert reserved == self.stats.reserved, (reserved, self.stats.reserved)


def _seg_info(seg: Segment, blocks: list[Block]) -> dict[str, Any]:
    return {
        "address": blocks[0].addr,
        "total_size": sum(b.size for b in blocks),
        "stream": seg.stream,
        "segment_type": "small" if seg.small else "large",
        "is_expandable": seg.es is not None,
        "allocated_size": sum(b.size for b in blocks if b.allocated),
        "requested_size": sum(b.requested for b in blocks if b.allocated),
        "blocks": [
            {
                "address": b.addr,
                "size": b.size,
                "requested_size": b.requested if b.allocated else 0,
                "state": "active_allocated" if b.allocated else "inactive",
            }
            for b in blocks
        ],
    }


def _next_division(size: int, divisions: int) -> int:
    """roundup_power2_next_division: round up to the next of `divisions` steps per power of 2."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    f = size & ~(step - 1)
    return size if f == size else f + step
