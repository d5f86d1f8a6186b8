"""Give cached GPU memory back after an OOM: collect garbage, then `empty_cache()`.

Kept apart so `oom_retry`, `chunked` and tests share one definition of "clean up" and one
measure of what it released (the drop in `torch.cuda.memory_reserved()`).
"""

from __future__ import annotations

import gc
import sys

from alloctune.guard.counters import stats

__all__ = ["release_cached", "cuda_ready"]


def cuda_ready() -> bool:
    """True when torch is loaded and CUDA is initialised (never initialises it: that costs a context)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:  # a broken driver must not turn cleanup into a new failure
        return False


def release_cached(collect: bool = True) -> int:
    """Free unreachable objects, return cached blocks to the driver; bytes released (0 without CUDA).

    `gc.collect()` comes first: tensors caught in reference cycles (closures, exceptions
    pointing at their frames) are only freed by the collector, and `empty_cache()` can only
    release segments whose blocks are all free.
    """
    if collect:
        gc.collect()
    if not cuda_ready():
        return 0
    import torch

    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    released = max(0, before - torch.cuda.memory_reserved())
    stats.add(cleanups=1, bytes_released=released)
    return released
