"""Looking inside the simulated allocator: its segment table like `torch.cuda.memory_snapshot()`,
and the consistency check the tests run (not used by replay)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from alloctune.sim.blocks import Block, Segment

if TYPE_CHECKING:
    from alloctune.sim.blocks import Pool
    from alloctune.sim.stats import Stats


class Inspection:
    """`segment_table()` and `check()` (methods of `CachingAllocator`)."""

    if TYPE_CHECKING:  # what these methods use of `CachingAllocator` (its state, its other methods)
        segments: dict[int, Segment]
        small_pool: Pool
        large_pool: Pool
        stats: Stats

        def _key(self, b: Block) -> int: ...

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
