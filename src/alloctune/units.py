"""Byte sizes: parse what humans type, format exactly as PyTorch's OOM messages do.

Bytes are plain `int` everywhere inside alloctune; this module is the only place human units
appear. What a person types follows the standards (`GiB` = 2**30 bytes, `GB` = 10**9 bytes);
what PyTorch printed is read as it meant it (`parse_torch_size`: every unit binary).
"""

from __future__ import annotations

import math
import re

from alloctune.errors import InputError, SizeError

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

# One rule for every size a person types (`--budget`, `--card`, `Janitor(max_cached=...)`,
# `ALLOCTUNE_MAX_*`): units mean what the standards say. IEC binary units are powers of 1024
# (`KiB`, `MiB`, `GiB`, `TiB`); SI decimal units are powers of 1000 (`kB`/`KB`, `MB`, `GB`, `TB`),
# so `1.5GB` is 1,500,000,000 bytes, 0.07 GiB less than `1.5GiB` -- the difference between a card
# that fits and one that does not, never to be changed silently. A bare letter (`6G`, `512M`, as
# `docker --memory 6g` writes it) has no standard meaning and is read as binary, which is what
# those tools mean by it. Units are case-insensitive. PyTorch's own messages print binary units
# (and MPS's print binary sizes as `GB`): they are read by `parse_torch_size`, not by this rule.
_SUFFIX = {
    "": 1,
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "k": KiB,
    "kb": 1000,
    "kib": KiB,
    "m": MiB,
    "mb": 1000**2,
    "mib": MiB,
    "g": GiB,
    "gb": 1000**3,
    "gib": GiB,
    "t": TiB,
    "tb": 1000**4,
    "tib": TiB,
}
# How PyTorch prints sizes: every unit binary (c10's `format_size` writes `MiB`/`GiB`; the MPS
# allocator and some older backends write `MB`/`GB` for the same powers of 1024).
_TORCH_SUFFIX = {**_SUFFIX, "kb": KiB, "mb": MiB, "gb": GiB, "tb": TiB}

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse `6GiB`, `6G`, `512MB`, `1.5 GiB`, `82.00 MiB` or plain bytes into an int.

    Units follow the rule above `_SUFFIX`: `GiB` = 2**30 bytes, `GB` = 10**9 bytes, a bare `G`
    binary. Fractional results are rounded to the nearest byte. Raises `SizeError` with the
    offending text for anything else.
    """
    return _parse(text, _SUFFIX)


def parse_torch_size(text: str | int) -> int:
    """A size as PyTorch printed it in a message (`82.00 MiB`, MPS's `9.07 GB`): every unit binary.

    Why apart from `parse_size`: these figures were written by a program that means 1024**3 by
    `GB`; reading them by the SI rule would move an MPS message's figures by 7 %.
    """
    return _parse(text, _TORCH_SUFFIX)


def _parse(text: str | int, suffixes: dict[str, int]) -> int:
    if isinstance(text, bool):
        raise SizeError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise SizeError(f"size must not be negative: {text}")
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise SizeError(f"cannot read size {text!r}: expected a number with an optional unit, e.g. 6GiB, 512MB, 1.5G")
    number, unit = m.groups()
    mult = suffixes.get(unit.lower())
    if mult is None:
        raise SizeError(
            f"unknown unit {unit!r} in size {text!r}: use bytes, KiB, MiB, GiB or TiB (or the decimal kB, MB, GB, TB)"
        )
    value = float(number) * mult
    if not math.isfinite(value):
        raise SizeError(f"size {text!r} is too large")
    return int(round(value))


def format_size(size: int) -> str:
    """Format like c10's `format_size`: `0 bytes`, `1024 bytes`, `1.50 KiB`, `82.00 MiB`, `1.95 GiB`.

    The thresholds are inclusive (1 MiB prints as `1024.00 KiB`), exactly as PyTorch prints them,
    so our messages can be compared with real ones character for character.
    """
    if size <= KiB:
        return f"{size} bytes"
    if size <= MiB:
        return f"{size / KiB:.2f} KiB"
    if size <= GiB:
        return f"{size / MiB:.2f} MiB"
    return f"{size / GiB:.2f} GiB"


def format_size_arg(size: int) -> str:
    """`size` as an option value a person can type back and get exactly `size` bytes: the shortest
    spelling (`1.6GiB`, `512MiB`, `1.5GB`; binary first on a tie; up to three decimals) that
    `parse_user_size` reads as `size`, else `<size>B`. Why: a printed command (a hint, a
    reproduction) must reproduce its number, and `1717986918B` says less to a reader than `1.6GiB`."""
    found: list[str] = []
    if size > 0:
        for name in ("GiB", "GB", "MiB", "MB", "KiB", "kB"):
            unit = _SUFFIX[name.lower()]
            if size < unit:
                continue
            for decimals in range(4):
                text = f"{size / unit:.{decimals}f}{name}"
                if parse_size(text) == size:
                    found.append(text)
                    break
    found.append(f"{size}B")
    return min(found, key=len)  # the first of the shortest


def format_percent(fraction: float | None) -> str:
    """A fraction as our text output shows it: one decimal, a space before the sign (`0.781` -> `78.1 %`,
    the docs' `5.45 %` style); `-` for None. JSON keeps the fraction itself."""
    return "-" if fraction is None else f"{fraction * 100:.1f} %"


def parse_user_size(text: str | int, option: str = "size") -> int:
    """A size a person typed for `option` (e.g. `--budget`): a unit is required and it must be > 0.

    Why stricter than `parse_size`: `--budget 6` could mean 6 bytes or 6 GiB, and guessing either
    silently gives a run nobody asked for; 0, negative and NaN sizes are never meant. Ints (from
    the Python API) are bytes and only need to be positive. Write bytes as `6B` or `6bytes`.
    Units as in `parse_size`: `1.5GiB` is 1.5 * 2**30 bytes, `1.5GB` is 1.5 * 10**9 bytes.
    """
    if isinstance(text, bool):
        raise SizeError(f"{option}: not a size: {text!r}")
    if isinstance(text, int):
        if text <= 0:
            raise SizeError(f"{option} must be more than 0 bytes, got {text}")
        return text
    raw = str(text).strip()
    m = _SIZE_RE.match(raw)
    if m is None:
        low = raw.lower().lstrip("+-")
        if raw.startswith("-"):
            raise SizeError(f"{option} must be more than 0 bytes, got {raw!r}")
        if low.startswith(("nan", "inf")):
            raise SizeError(f"{option} must be a finite size such as 6GiB, got {raw!r}")
        raise SizeError(f"{option}: cannot read size {raw!r}: expected a number with a unit, e.g. 6GiB, 512MiB")
    if not m.group(2):
        if float(m.group(1)) >= 1 << 20:  # nobody means a million GiB: a count of bytes
            raise SizeError(f"{option} {raw}: give a unit: did you mean {raw}B (bytes, {format_size(int(float(m.group(1))))})?")
        raise SizeError(f"{option} {raw}: give a unit: did you mean {raw}GiB? ({raw}MiB, or {raw}B for bytes)")
    value = parse_size(raw)
    if value <= 0:
        raise SizeError(f"{option} must be more than 0 bytes, got {raw!r}")
    return value


def parse_seconds(value: float | None, option: str = "--timeout") -> float | None:
    """A duration a person gave for `option`: None stays None, else it must be finite and > 0.

    Why: `float("nan")` passes `value <= 0` checks unnoticed and then never times out.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise InputError(f"{option} must be a positive number of seconds, got {value}")
    return float(value)


def utilization(peak_allocated: int | None, peak_reserved: int | None) -> float | None:
    """Peak allocated ÷ peak reserved: the share of what the cache held that tensors used at the peak
    (1 − that is what fragmentation and caching cost). None where either is unknown or nothing was reserved."""
    if not peak_reserved or peak_allocated is None:
        return None
    return peak_allocated / peak_reserved
