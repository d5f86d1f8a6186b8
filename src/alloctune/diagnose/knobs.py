"""Which allocator knob exists where: torch version bounds from a message, platform/backend support.

Kept apart from the verdict so the rules ("expandable segments: CUDA from 2.1, not on Windows,
not under cudaMallocAsync, ROCm only from 2.12") are stated once and are easy to test.
"""

from __future__ import annotations

import re
from functools import lru_cache

from alloctune.diagnose.report import OOMReport

Version = tuple[int, int]

_RANGE = re.compile(r"^(?:(>=|<=)?(\d+)\.(\d+))(?:-(\d+)\.(\d+))?$")


@lru_cache(maxsize=256)  # a few hints, asked several times per message (logs hold 100,000s)
def torch_bounds(hint: str | None) -> tuple[Version | None, Version | None]:
    """`"2.4-2.9"` -> ((2, 4), (2, 9)); `">=2.11"` -> ((2, 11), None); `"<=0.4"` -> (None, (0, 4))."""
    if not hint:
        return None, None
    m = _RANGE.match(hint)
    if not m:
        return None, None
    op, a, b, c, d = m.groups()
    v = (int(a), int(b))
    if op == ">=":
        return v, None
    if op == "<=":
        return None, v
    if c is not None:
        return v, (int(c), int(d))
    return v, v


def torch_for_env(report: OOMReport) -> str | None:
    """A version to hand to `shells.env_assignments`: the newest the format allows, or None."""
    lo, hi = torch_bounds(report.torch_hint)
    if hi is not None:
        return f"{hi[0]}.{hi[1]}"
    if lo is not None and lo >= (2, 10):
        return f"{lo[0]}.{lo[1]}"
    return None


def expandable_segments_support(report: OOMReport, platform: str | None) -> tuple[bool, str | None, str | None]:
    """(works, why-not, requires) for `expandable_segments:True` on this report's setup.

    `requires` names an upgrade that would make it work (the message came from an older torch).
    """
    lo, hi = torch_bounds(report.torch_hint)
    if report.backend == "cudaMallocAsync":
        return False, "ignored under backend:cudaMallocAsync (only the native caching allocator has it)", None
    if report.vendor in ("mps", "xpu"):
        return False, f"{report.vendor.upper()} has no expandable segments (a CUDA/ROCm caching-allocator option)", None
    if platform == "windows":
        return (
            False,
            "not supported on Windows: PyTorch warns 'expandable_segments not supported on this platform' and ignores it",
            None,
        )
    if report.vendor == "hip":
        # ROCm support landed upstream in 2026 (pytorch#173330, relanded as #177974; ROCm's own 2.11 builds carry it).
        if hi is not None and hi < (2, 11):
            return (
                False,
                f"ROCm builds before torch 2.11 ignore it (this message is from {report.torch_hint})",
                "torch>=2.12 (ROCm)",
            )
        return True, None, "torch>=2.12 on ROCm (2.11 in AMD's ROCm builds); older ROCm builds ignore it"
    if report.vendor == "npu":
        return True, None, None  # torch_npu reads it from PYTORCH_NPU_ALLOC_CONF
    if hi is not None and hi < (2, 1):
        return True, None, f"torch>=2.1 (this message comes from torch {report.torch_hint})"
    return True, None, None


def max_split_minimum_mb(report: OOMReport) -> int:
    """Smallest accepted `max_split_size_mb`: > 20 up to 2.9, >= 20 from 2.10 (spec §5.3)."""
    lo, _ = torch_bounds(report.torch_hint)
    return 20 if lo is not None and lo >= (2, 10) else 21


def max_split_available(report: OOMReport, platform: str | None) -> tuple[bool, str | None, str | None]:
    lo, hi = torch_bounds(report.torch_hint)
    if report.backend == "cudaMallocAsync":
        return False, "ignored under backend:cudaMallocAsync (PyTorch warns that it ignores max_split_size_mb)", None
    if report.vendor in ("mps", "xpu"):
        return False, f"{report.vendor.upper()} has no max_split_size_mb", None
    if hi is not None and hi < (1, 10):
        return True, None, f"torch>=1.10 (this message comes from torch {report.torch_hint})"
    return True, None, None


__all__ = [
    "expandable_segments_support",
    "max_split_available",
    "max_split_minimum_mb",
    "torch_bounds",
    "torch_for_env",
]
