"""The value forms a setting holds, and their limits: MB caps, backends, the roundup table.

Shared by the grammar (`parse.py`) and the setting itself (`model.py`), below both, so that
neither has to import the other's module for them.
"""

from __future__ import annotations

from typing import Union

from alloctune.config.versions import DEFAULT_TORCH, TorchVersion, parse_torch_version
from alloctune.errors import ConfigError
from alloctune.units import MiB

BACKENDS = ("native", "cudaMallocAsync")
# PyTorch caps MB values at SIZE_MAX / 1 MiB (64-bit size_t); larger inputs are clamped.
MAX_MB = (2**64 - 1) // MiB
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: default large segment size and MB-knob minimum
N_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: buckets 1 MiB … ≥32 GiB

ENV_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")

RoundupItem = tuple[str, int]  # ("256", 2) or (">", 8)
Roundup = Union[int, tuple[RoundupItem, ...], None]


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def apply_roundup(
    table: tuple[int, ...] | list[int], setting: Roundup, torch: str | TorchVersion = DEFAULT_TORCH
) -> tuple[int, ...]:
    """Apply one `roundup_power2_divisions` value on top of `table`, as PyTorch's parser does.

    Bucket i holds sizes in [2^i MiB, 2^(i+1) MiB) (bucket 0 also everything smaller, bucket
    15 everything larger). The single form sets every bucket. In a list, the first numeric
    item also fills the buckets below it; buckets between items keep what they had; `>`
    fills from the last item's bucket up to 2.9 (overwriting it) and from the bucket *after*
    it from 2.10 on. Only a repeated key starts from a non-zero table.
    """
    version = parse_torch_version(torch)
    out = list(table)
    if setting is None:
        return tuple(out)
    if isinstance(setting, int):
        return (setting,) * N_INTERVALS
    first, last = True, 0
    for key, value in setting:
        if key == ">":
            start = last if version <= (2, 9) else last + 1
            out[start:] = [value] * (N_INTERVALS - start) if start < N_INTERVALS else []
            continue
        idx = min(int(key).bit_length() - 1, N_INTERVALS - 1)
        if first:
            out[:idx] = [value] * idx
            first = False
        out[idx] = value
        last = idx
    return tuple(out)


def roundup_table_of(setting: Roundup, torch: str | TorchVersion = DEFAULT_TORCH) -> tuple[int, ...]:
    """PyTorch's 16-entry divisions table for one setting, starting from all zeros (§5.4)."""
    return apply_roundup((0,) * N_INTERVALS, setting, torch)


def setting_from_table(table: tuple[int, ...] | list[int]) -> Roundup:
    """The shortest version-independent setting that yields `table` (no `>`, whose meaning changed).

    All zero → None (default); all equal → the single form; otherwise a list whose first item
    covers the leading run and later items name each non-zero bucket.
    """
    table = tuple(int(v) for v in table)
    if len(table) != N_INTERVALS:
        raise ConfigError(f"a roundup table has {N_INTERVALS} entries, got {len(table)}")
    if not any(table):
        return None
    if len(set(table)) == 1:
        return table[0]
    end = 0
    while end + 1 < N_INTERVALS and table[end + 1] == table[0]:
        end += 1
    items: list[RoundupItem] = [(str(1 << end), table[0])]
    items += [(str(1 << i), v) for i, v in enumerate(table) if i > end and v]
    return tuple(items)
