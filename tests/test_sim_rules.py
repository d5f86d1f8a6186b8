"""sim/rules.py states the allocator's size rules once; the allocator's inline hot path agrees."""

from __future__ import annotations

import pytest

from alloctune.sim.allocator import CachingAllocator
from alloctune.sim.rules import allocation_size, round_size, should_split
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
        assert round_size(s, settings) == alloc.round_size(s), s
        r = round_size(s, settings)
        assert allocation_size(r, settings) == alloc.allocation_size(r), s


@pytest.mark.parametrize("settings", SETTINGS)
def test_split_rule_matches_the_allocator(settings):
    # A fresh allocator maps one segment per request; whether the rest of it stays a separate free
    # block after serving `size` is the split rule.
    for s in SIZES:
        alloc = CachingAllocator(settings)
        b = alloc.malloc(s)
        rounded = round_size(s, settings)
        remaining = b.seg.size - rounded if settings.expandable_segments is False else None
        if remaining is None:
            continue  # expandable: the mapped size is the page-rounded request, tested in the sim suite
        small = rounded <= 1 * MiB
        expected = rounded if should_split(small, rounded, remaining, settings) else b.seg.size
        assert b.size == expected, (s, b.size, b.seg.size)
