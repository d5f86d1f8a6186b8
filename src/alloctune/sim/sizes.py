"""The allocator's size rules (torch 2.11 `CUDACachingAllocator.cpp`), as plain functions.

One place for the constants and the rounding rules, so that the simulator, the snapshot
diagnosis and the candidate spaces all use the same ones (and need no allocator object
to round a size).
"""

from __future__ import annotations

from typing import Any

MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 << 20  # kSmallSize: rounded size <= this -> small pool
SMALL_BUFFER = 2 << 20  # kSmallBuffer: small segment / small expandable page
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge


def round_size(size: int, table: tuple[int, ...] | None = None) -> int:
    """`round_size`: 512-byte multiples, or the next of `table[bucket]` divisions per power of
    two (`roundup_power2_divisions`; None or all <= 1 = off)."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    if table is not None:
        idx = size.bit_length() - 21  # floor(log2(size)) - 20
        d = table[0 if idx < 0 else (15 if idx > 15 else idx)]
        if d > 1 and size > MIN_BLOCK * d:
            return next_division(size, d)
    return (size + 511) & ~511


def allocation_size(size: int, mid_segment: int) -> int:
    """cudaMalloc size for a rounded request: 2 MiB small segments, `mid_segment` (20 MiB or
    large_segment_size) below 10 MiB, else the request rounded up to 2 MiB."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return mid_segment
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


def next_division(size: int, divisions: int) -> int:
    """roundup_power2_next_division: round up to the next of `divisions` steps per power of 2."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    f = size & ~(step - 1)
    return size if f == size else f + step


def division_table(settings: Any) -> tuple[int, ...] | None:
    """The `roundup_power2_divisions` table of `settings` as `round_size` takes it (None = off)."""
    table = settings.roundup_power2_divisions
    return table if any(d > 1 for d in table) else None


def should_split(small_pool: bool, rounded: int, remaining: int, expandable: bool, max_split_size: int | None) -> bool:
    """Whether a free block serving `rounded` bytes is split, leaving `remaining` bytes free:
    small pool and expandable segments split any remainder of at least 512 bytes; otherwise only
    a remainder above 1 MiB, and never for a request at or above `max_split_size`."""
    if small_pool or expandable:
        return remaining >= MIN_BLOCK
    return remaining > SMALL_SIZE and (max_split_size is None or rounded < max_split_size)
