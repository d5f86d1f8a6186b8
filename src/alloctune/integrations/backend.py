"""The CUDA side of the trainer hooks: start and stop the allocator history, take a snapshot, read the cap.

Everything torch is reached through one small interface, `CudaBackend`, so the hooks can be
driven without a GPU (the tests pass a fake whose `snapshot()` returns a dict shaped like
torch's). `TorchCuda` is the real one; it imports torch only when a method is called, so this
module imports on a machine without torch.

The run record written into a snapshot is the agent's (`alloctune.trace.stream.RUN_RECORD_KEY`:
cap, total memory, torch version, allocator setting, device, command): a snapshot that leaves
the training process must still say which budget it ran under, or a diagnosis would judge a
capped run against the whole card.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["CudaBackend", "DeviceLimits", "TorchCuda", "allocator_conf", "run_record"]

# torch's `stacks` argument of `_record_memory_history`: Python frames only, or C++ frames too.
STACKS = ("python", "all")


@dataclass(frozen=True)
class DeviceLimits:
    """What bounds the process's allocator on its device.

    Attributes:
        device: the CUDA device index the process allocates on.
        total_memory: the device's memory in bytes (0 when unknown).
        fraction: the per-process memory fraction set with
            `torch.cuda.set_per_process_memory_fraction` (1.0: none), None when this torch
            cannot say.
    """

    device: int
    total_memory: int
    fraction: float | None

    @property
    def cap(self) -> int | None:
        """The cap in bytes (0: no cap; None: unknown), truncated as the allocator truncates it."""
        if self.fraction is None or not self.total_memory:
            return None
        return int(self.fraction * self.total_memory) if self.fraction < 1.0 else 0


class CudaBackend(Protocol):
    """The few CUDA operations the hooks need (real: `TorchCuda`; tests: a fake)."""

    def available(self) -> bool:
        """Whether a CUDA device can be used (no history exists without one)."""
        ...

    def start_history(self, max_entries: int, stacks: str) -> None:
        """Record the allocator's history, the last `max_entries` events with `stacks` frames."""
        ...

    def stop_history(self) -> None:
        """Stop recording (the history recorded so far is dropped by torch)."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """The allocator's state and history, as `torch.cuda.memory._snapshot()` returns it."""
        ...

    def limits(self) -> DeviceLimits:
        """The device, its memory and the process's memory fraction."""
        ...

    def torch_version(self) -> str:
        """`torch.__version__` ("" when unknown)."""
        ...


class TorchCuda:
    """`CudaBackend` on the real `torch.cuda` (imported on first use)."""

    def available(self) -> bool:
        import torch

        return bool(torch.cuda.is_available())

    def start_history(self, max_entries: int, stacks: str) -> None:
        import torch

        # context "alloc": frees need no stack, which halves the cost of "all" (as the agent records).
        torch.cuda.memory._record_memory_history(max_entries=max_entries, context="alloc", stacks=stacks)

    def stop_history(self) -> None:
        import torch

        torch.cuda.memory._record_memory_history(enabled=None)

    def snapshot(self) -> dict[str, Any]:
        import torch

        snap: dict[str, Any] = torch.cuda.memory._snapshot()
        return snap

    def limits(self) -> DeviceLimits:
        import torch

        device = int(torch.cuda.current_device())
        total = int(torch.cuda.get_device_properties(device).total_memory)
        getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # newer torch only
        fraction = float(getter(device)) if getter is not None else None
        return DeviceLimits(device, total, fraction)

    def torch_version(self) -> str:
        import torch

        return str(getattr(torch, "__version__", "") or "")


def allocator_conf(environ: dict[str, str] | None = None) -> str:
    """The allocator setting the process started with, read as the agent reads it (CUDA name first)."""
    env = os.environ if environ is None else environ
    return env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF") or ""


def run_record(limits: DeviceLimits, torch_version: str, command: Sequence[str] | None = None) -> dict[str, Any]:
    """The run record a snapshot carries under `RUN_RECORD_KEY`, with the agent's keys and types.

    `cap` is left out when this torch cannot report the fraction: an absent cap reads as
    "unknown" (the diagnosis then says its budget is assumed), while 0 would claim "no cap".
    """
    record: dict[str, Any] = {
        "total_memory": int(limits.total_memory),
        "torch": torch_version,
        "conf": allocator_conf(),
        "device": int(limits.device),
        "cmd": [str(a) for a in (sys.argv if command is None else command)],
    }
    if limits.cap is not None:
        record["cap"] = limits.cap
    return record
