"""sim/sizes.py states the allocator's size rules once; the allocator's inline hot path agrees."""

from __future__ import annotations

import pytest

from alloctune.sim.allocator import CachingAllocator
from alloctune.sim import sizes
from alloctune.sim.settings import SimSettings

MiB = 1 << 20
SETTINGS = [
    SimSettings(),
    SimSettings(max_split_size=128 * MiB),
    SimSettings(expandable_segments=True),
    SimSettings(roundup_power2_divisions=(4,) * 16),
    SimSettings(roundup_power2_divisions=(1, 2, 4, 8) + (8,) * 12, large_segment_size=64 * MiB),
]
SIZES = [1, 511, 512, 513, 4096, MiB - 1, MiB, MiB + 1, 3 * MiB + 7, 10 * MiB - 1, 10 * MiB, 20 * MiB + 3,
         127 * MiB, 128 * MiB, 129 * MiB + 1, 1000 * MiB + 12345]


@pytest.mark.parametrize("settings", SETTINGS)
def test_rounding_and_segment_size_match_the_allocator(settings):
    alloc = CachingAllocator(settings)
    for s in SIZES:
        assert sizes.round_size(s, sizes.division_table(settings)) == alloc.round_size(s), s
        r = sizes.round_size(s, sizes.division_table(settings))
        assert sizes.allocation_size(r, settings.segment_size_mid) == alloc.allocation_size(r), s


@pytest.mark.parametrize("settings", SETTINGS)
def test_split_rule_matches_the_allocator(settings):
    # A fresh allocator maps one segment per request; whether the rest of it stays a separate free
    # block after serving `size` is the split rule.
    for s in SIZES:
        alloc = CachingAllocator(settings)
        b = alloc.malloc(s)
        rounded = sizes.round_size(s, sizes.division_table(settings))
        remaining = b.seg.size - rounded if settings.expandable_segments is False else None
        if remaining is None:
            continue  # expandable: the mapped size is the page-rounded request, tested in the sim suite
        small = rounded <= 1 * MiB
        expected = rounded if sizes.should_split(small, rounded, remaining, settings.expandable_segments, settings.max_split_size) else b.seg.size
        assert b.size == expected, (s, b.size, b.seg.size)
