"""What the caching allocator held at a moment of a recording, from the recording's own events.

Why: `stream.build_stream` must decide whose a release burst is when a new segment follows it
(the program's `empty_cache()` or the allocator's release-and-retry). The allocator releases
only after its search of the cache found no block for the request, so a cached block the
request could have taken, seen in the recording's layout just before the burst, proves the
burst was the program's. `Held` reads that layout where such a burst comes.
"""

from __future__ import annotations

import bisect
from typing import Any, Iterable, Mapping, Sequence

SMALL_SEGMENT = 2 << 20  # the small pool's segments (requests up to 1 MiB); large-pool segments are never this size
LARGE_BUFFER_BYTES = 20 << 20  # kLargeBuffer: the default non-split rounding
# How much a gap between recorded allocations may exceed the free block in it: an allocation's event gives its
# requested size, and its block also holds the rounding (< 512 B) and, in the large pool, an unsplit tail (< 1 MiB;
# with a split limit, up to the non-split rounding for an allocation at or above the limit).
_LARGE_SLACK = (1 << 20) + 512
_SMALL_SLACK = 512


def block_rules(settings: dict[str, Any]) -> tuple[int | None, int] | None:
    """Which cached block the allocator may give a request (`get_free_block`): with no split limit any
    block at least its size; with `max_split_size`, a request below it no block at or above it, a request
    at or above it only a block under its size + the non-split rounding (20 MiB unless the setting names
    it). Returns (split limit or None, rounding), or None where the settings are unknown (an old snapshot)
    or segments expand (blocks are not whole gaps there): then nothing is proven from the layout."""
    if "max_split_size" not in settings or settings.get("expandable_segments"):
        return None
    text = str(settings.get("PYTORCH_CUDA_ALLOC_CONF") or "")
    if "max_non_split_rounding_mb" in text or "large_segment_size_mb" in text:
        return None
    split = settings["max_split_size"]
    return (None if split < 0 or split >= 1 << 62 else int(split)), LARGE_BUFFER_BYTES


class Held:
    """Whether a release burst before a new segment is proven the program's from the recording's own layout:
    the segments (address -> size, stream) and the live allocations (address, requested size) that
    `stream.build_stream` keeps as it reads the events, read here only at such a burst. `rules`: the
    allocator's rules for which block a request may take (`block_rules`); None proves nothing."""

    def __init__(self, rules: tuple[int | None, int] | None) -> None:
        self.on = rules is not None
        self.split, self.rounding = rules if rules is not None else (None, 0)

    def served(
        self, events: Sequence[dict[str, Any]], j: int, segments: Mapping[int, tuple[int, int]], live: Iterable[tuple[int, int]]
    ) -> bool:
        """Whether the request that follows a release burst ending at `j` (a new segment, then its alloc)
        could have been served by a cached block of its stream and pool as the burst began. The allocator
        releases cached segments only after no cached block fits a request (`get_free_block` fails first),
        so then the burst is the program's `empty_cache()`, not the allocator's release-and-retry."""
        nxt = events[j] if j < len(events) else None
        if not self.on or nxt is None or nxt.get("action") != "segment_alloc":
            return False
        seg_start, seg_end = nxt["addr"], nxt["addr"] + nxt["size"]
        req = next((e for e in events[j + 1 : j + 4] if e.get("action") == "alloc" and seg_start <= e["addr"] < seg_end), None)
        if req is None:
            return False
        size, stream = -(-req["size"] // 512) * 512, req["stream"]
        small = size <= 1 << 20
        # an allocation at or above the split limit takes its whole block, up to the rounding more than it asked
        slack = _SMALL_SLACK if small else _LARGE_SLACK + (0 if self.split is None else self.rounding)
        # a gap proves a block the request may take when the block in it (its size less the slack at most)
        # is at least the request and under the limit the split rules set; the block `get_free_block` picks,
        # the smallest at least the request, is then under that limit too
        below = 1 << 63 if self.split is None else self.split if size < self.split else size + self.rounding
        starts = sorted(a for a, (s, st) in segments.items() if st == stream and (s == SMALL_SEGMENT) == small and s >= size)
        if not starts:
            return False
        used: dict[int, list[tuple[int, int]]] = {a: [] for a in starts}
        for addr, n in live:
            k = bisect.bisect_right(starts, addr) - 1
            if k >= 0 and addr < starts[k] + segments[starts[k]][0]:
                used[starts[k]].append((addr, n))
        for a in starts:
            at = a
            for addr, n in sorted(used[a]) + [(a + segments[a][0], 0)]:
                # a gap at the segment's start is its free block exactly; after an allocation, that
                # allocation's block may reach into it by the slack
                if size + (slack if at > a else 0) <= addr - at < below:
                    return True
                at = max(at, addr + n)
        return False
