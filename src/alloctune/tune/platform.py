"""Which candidates make sense on the user's platform and allocator backend.

Why: most people who report these OOMs run Windows, where `expandable_segments` does not
exist (PyTorch ignores it with a warning), so a Linux recording that plans a Windows
user's setting must never propose it. Under `backend:cudaMallocAsync` the caching
allocator is not used at all: the split, rounding and GC knobs change nothing, and
saying so is the useful answer. Pure data.
"""

from __future__ import annotations

import sys
from typing import Sequence

from alloctune.errors import InputError
from alloctune.tune.candidates import EXPANDABLE, GC, MAX_SPLIT, ROUNDUP, Candidate

PLATFORMS = ("linux", "windows")
NATIVE_ONLY = (EXPANDABLE, MAX_SPLIT, ROUNDUP, GC)  # settings of the native caching allocator


def this_platform() -> str:
    return "windows" if sys.platform.startswith(("win", "cygwin")) else "linux"


def check_platform(name: str | None) -> str:
    if name is None:
        return this_platform()
    low = name.strip().lower()
    if low not in PLATFORMS:
        raise InputError(f"--platform {name!r} is not known: use linux or windows")
    return low


def is_async_backend(settings: dict | None) -> bool:
    """Whether a child's read-back allocator settings say the cudaMallocAsync backend ran."""
    backend = str((settings or {}).get("backend", "") or "")
    conf = str((settings or {}).get("PYTORCH_CUDA_ALLOC_CONF", "") or "")
    return "cudamallocasync" in backend.lower() or "backend:cudamallocasync" in conf.replace(" ", "").lower()


def filter_candidates(
    cands: Sequence[Candidate], platform: str, *, async_backend: bool = False
) -> tuple[list[Candidate], list[str]]:
    """The candidates worth trying here, and one note per kind left out."""
    kept, notes = [], []
    if platform == "windows" and any(_has(c, EXPANDABLE) for c in cands):
        notes.append("expandable_segments left out: it does not exist on Windows (--platform windows)")
    if async_backend and any(_has(c, k) for c in cands for k in NATIVE_ONLY):
        notes.append(
            "backend:cudaMallocAsync: expandable_segments, max_split_size_mb, roundup_power2_divisions and "
            "garbage_collection_threshold do nothing under it (they configure the native caching allocator), "
            "so they are not tried"
        )
    for c in cands:
        if platform == "windows" and _has(c, EXPANDABLE):
            continue
        if async_backend and any(_has(c, k) for k in NATIVE_ONLY):
            continue
        kept.append(c)
    return kept, notes


def _has(c: Candidate, knob: str) -> bool:
    return f"{knob}:" in c.conf
