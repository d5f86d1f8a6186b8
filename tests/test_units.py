from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from alloctune.errors import SizeError
from alloctune.units import (
    GiB,
    KiB,
    MiB,
    format_size,
    format_size_arg,
    parse_size,
    parse_torch_size,
    parse_user_size,
)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("6GiB", 6 * GiB),
        ("6G", 6 * GiB),
        ("6 gib", 6 * GiB),
        ("6 gb", 6 * 10**9),
        ("512MiB", 512 * MiB),
        ("512MB", 512 * 10**6),
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


# ---- one rule for the units people type: SI decimal, IEC binary, a bare letter binary ---------------
@pytest.mark.parametrize("text,expected", [
    ("1.5GB", 1_500_000_000), ("1.5GiB", 3 * GiB // 2), ("1.5G", 3 * GiB // 2),
    ("6TB", 6 * 10**12), ("6TiB", 6 * 1024**4), ("100kB", 100_000), ("100KB", 100_000), ("100KiB", 102_400),
    ("512M", 512 * MiB), ("512 mb", 512_000_000),
])
def test_decimal_and_binary_units_mean_what_the_standards_say(text, expected):
    assert parse_size(text) == expected
    assert parse_user_size(text, "--budget") == expected


def test_simulate_budget_in_gb_is_not_read_as_gib(capsys):
    """`simulate --budget 1.5GB` is 1.5e9 bytes, not 1.5 GiB (exit 1 where the replay says the run
    would not fit)."""
    import json

    from cli_run import run_cli

    for text, expected in (("1.5GB", 1_500_000_000), ("1.5GiB", 3 * GiB // 2), ("2.5GB", 2_500_000_000)):
        code, out, err = run_cli(capsys, "simulate", "rvc_h200_ec1", "--budget", text, "--json")
        assert code in (0, 1) and err == "", err
        assert json.loads(out)["budget"] == expected


def test_torch_messages_keep_their_binary_reading():
    """PyTorch's MPS allocator prints 1024**3 as `GB`: its figures are read as it meant them."""
    assert parse_torch_size("9.07 GB") == round(9.07 * GiB)
    assert parse_torch_size("82.00 MiB") == 82 * MiB
    assert parse_torch_size("768.00 MB") == 768 * MiB
    from alloctune.diagnose import find_reports

    r = find_reports("RuntimeError: MPS backend out of memory (MPS allocated: 18.02 GB, other allocations: "
                     "107.10 MB, max allowed: 18.13 GB). Tried to allocate 4.50 MB on private pool.")[0]
    assert r.cap == round(18.13 * GiB) and r.requested == round(4.5 * MiB)


@pytest.mark.parametrize("size,text", [
    (round(1.6 * GiB), "1.6GiB"), (11 * GiB // 2, "5.5GiB"), (3 * GiB, "3GiB"), (512 * MiB, "512MiB"),
    (1_500_000_000, "1.5GB"), (542099349, "542099349B"), (1, "1B"),
])
def test_size_arg_reads_back_exactly(size, text):
    assert format_size_arg(size) == text
    assert parse_user_size(format_size_arg(size)) == size


@given(st.integers(min_value=1, max_value=2**50))
def test_size_arg_roundtrip(n):
    assert parse_user_size(format_size_arg(n)) == n
