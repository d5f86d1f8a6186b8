"""Trainer hooks: alloctune inside a training loop (Hugging Face `Trainer`, Lightning).

* `alloctune.integrations.transformers` -- `AlloctuneCallback` and `alloctune_oom_guard(trainer)`
  (a `TrainerCallback` has no exception hook, so the guard wraps `trainer.train()`).
* `alloctune.integrations.lightning` -- `AlloctuneCallback` (Lightning's `on_exception` hook).
* `OOMRecorder` / `oom_guard` -- the same for a hand-written loop.
* `find_batch_size` / `fits_batch_size` -- the largest batch a budget holds, from a few recorded
  steps and plan's search (accelerate's finder halves on every real crash instead).

Each records the allocator history while training runs and, at an out-of-memory error, writes
the snapshot with alloctune's run record (cap, total memory, torch, setting, device, command),
prints one line -- the diagnosis verdict, the snapshot, the next commands -- and lets the error
propagate. Importing this package imports neither torch nor a framework; they are imported
when a hook is used.
"""

from __future__ import annotations

from alloctune.integrations.backend import CudaBackend, DeviceLimits, TorchCuda
from alloctune.integrations.batch_size import BatchSizeResult, NoBatchSizeFits, find_batch_size, fits_batch_size
from alloctune.integrations.recorder import OOMNote, OOMRecorder, oom_guard

__all__ = [
    "BatchSizeResult",
    "CudaBackend",
    "DeviceLimits",
    "NoBatchSizeFits",
    "OOMNote",
    "OOMRecorder",
    "TorchCuda",
    "find_batch_size",
    "fits_batch_size",
    "oom_guard",
]
