"""Byte sizes: parse what humans type, format exactly as PyTorch's OOM messages do.

Bytes are plain `int` everywhere inside alloctune; these two functions are the only
place human units appear.
"""

from __future__ import annotations

import math
import re

from alloctune.errors import InputError, SizeError

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

# Binary and decimal suffixes. Like most ML tooling (and nvidia-smi), a bare "G"/"GB" is
# read as binary: users typing "6G" for a 6 GiB card mean 6 GiB, not 6e9 bytes.
_SUFFIX = {
    "": 1,
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "k": KiB,
    "kb": KiB,
    "kib": KiB,
    "m": MiB,
    "mb": MiB,
    "mib": MiB,
    "g": GiB,
    "gb": GiB,
    "gib": GiB,
    "t": TiB,
    "tb": TiB,
    "tib": TiB,
}

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse `6GiB`, `6G`, `512MB`, `1.5 GiB`, `82.00 MiB` or plain bytes into an int.

    Fractional results are rounded to the nearest byte. Raises `SizeError` with the
    offending text for anything else.
    """
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
    mult = _SUFFIX.get(unit.lower())
    if mult is None:
        raise SizeError(f"unknown unit {unit!r} in size {text!r}: use bytes, KiB, MiB, GiB or TiB")
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


def format_mib(size: int) -> str:
    """Compact human form used in our own tables (`512 MiB`, `5.25 GiB`)."""
    if size >= GiB:
        return f"{size / GiB:.2f} GiB"
    if size >= MiB:
        return f"{size / MiB:.0f} MiB" if size % MiB == 0 else f"{size / MiB:.2f} MiB"
    return format_size(size)


def parse_user_size(text: str | int, option: str = "size") -> int:
    """A size a person typed for `option` (e.g. `--budget`): a unit is required and it must be > 0.

    Why stricter than `parse_size`: `--budget 6` could mean 6 bytes or 6 GiB, and guessing either
    silently gives a run nobody asked for; 0, negative and NaN sizes are never meant. Ints (from
    the Python API) are bytes and only need to be positive. Write bytes as `6B` or `6bytes`.
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
            raise SizeError(f"{option} {raw}: give a unit: did you mean {raw}B (bytes, "
                            f"{format_size(int(float(m.group(1))))})?")
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
