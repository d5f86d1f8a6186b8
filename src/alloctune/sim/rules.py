"""The allocator's size rules as plain functions of `SimSettings`: rounding, segment size, split.

`CachingAllocator` applies these same rules inline on its hot path; this module is their
statement for everyone else (the snapshot memory map of `diagnose`, OOM texts, tests), so
nobody re-declares the constants or re-derives the split rule. `tests/test_sim_rules.py`
holds the two identical on every size class and setting.
"""

from __future__ import annotations

from alloctune.sim.allocator import MIN_BLOCK, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE, _next_division
from alloctune.sim.settings import SimSettings

__all__ = ["MIN_BLOCK", "SMALL_BUFFER", "SMALL_SIZE", "allocation_size", "round_size", "should_split"]


def round_size(size: int, settings: SimSettings) -> int:
    """PyTorch's `round_size`: 512-byte multiples, or power-of-two divisions when configured."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    table = settings.roundup_power2_divisions
    idx = size.bit_length() - 21  # floor(log2(size)) - 20
    d = table[0 if idx < 0 else (15 if idx > 15 else idx)]
    if d > 1 and size > MIN_BLOCK * d:
        return _next_division(size, d)
    return (size + 511) & ~511


def allocation_size(rounded: int, settings: SimSettings) -> int:
    """The cudaMalloc size of a new segment for a `rounded` request (what the OOM text prints)."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return settings.segment_size_mid
    return (rounded + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


def should_split(small_pool: bool, rounded: int, remaining: int, settings: SimSettings) -> bool:
    """Whether a free block serving `rounded` bytes is split, leaving `remaining` bytes free:
    small pool and expandable segments split any remainder of at least 512 bytes; otherwise only
    a remainder above 1 MiB, and never for a request at or above `max_split_size`."""
    if small_pool or settings.expandable_segments:
        return remaining >= MIN_BLOCK
    mss = settings.max_split_size
    return remaining > SMALL_SIZE and (mss is None or rounded < mss)
