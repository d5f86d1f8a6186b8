from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from alloctune.errors import SizeError
from alloctune.units import GiB, KiB, MiB, format_size, parse_size


@pytest.mark.parametrize(
    "text,expected",
    [
        ("6GiB", 6 * GiB),
        ("6G", 6 * GiB),
        ("6 gb", 6 * GiB),
        ("512MB", 512 * MiB),
        ("1.5 GiB", int(1.5 * GiB)),
        ("82.00 MiB", 82 * MiB),
        ("1024", 1024),
        ("0 bytes", 0),
        ("4k", 4 * KiB),
        (123, 123),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "6 XB", "-1G", "1.2.3G", "G"])
def test_parse_size_rejects(bad):
    with pytest.raises(SizeError):
        parse_size(bad)


@pytest.mark.parametrize(
    "size,text",
    [
        (0, "0 bytes"),
        (1024, "1024 bytes"),
        (1025, "1.00 KiB"),
        (MiB, "1024.00 KiB"),
        (82 * MiB, "82.00 MiB"),
        (GiB, "1024.00 MiB"),
        (int(1.95 * GiB), "1.95 GiB"),
        (410.59 * MiB // 1, "410.59 MiB"),
    ],
)
def test_format_size_matches_pytorch(size, text):
    assert format_size(int(size)) == text


@given(st.integers(min_value=0, max_value=2**50))
def test_format_parse_roundtrip_within_two_decimals(n):
    back = parse_size(format_size(n))
    if n <= KiB:
        assert back == n
    else:
        # two decimals of the printed unit: error at most half a hundredth of that unit
        unit = KiB if n <= MiB else MiB if n <= GiB else GiB
        assert abs(back - n) <= 0.005 * unit + 1
