"""The GPUs this process may use and their free memory, read through NVML.

Why NVML and not torch: the parent of a sweep must never create a CUDA context (it would
hold ~500 MiB on the card for the whole sweep and skew every trial). NVML numbers devices
physically; `CUDA_VISIBLE_DEVICES` (indices or UUIDs) says which of them the user gave us,
and a trial is pointed at one by giving it that same entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class GpuInfo:
    """One visible GPU: `visible_id` is what goes into a child's `CUDA_VISIBLE_DEVICES`."""

    visible_id: str
    name: str | None
    total: int | None
    free: int | None

    def to_dict(self) -> dict:
        return {"schema": 1, "visible_id": self.visible_id, "name": self.name, "total": self.total, "free": self.free}


def visible_entries(env: Mapping[str, str] | None = None) -> list[str] | None:
    """Entries of `CUDA_VISIBLE_DEVICES` (None = unset: every GPU; [] = none visible).

    CUDA stops at the first invalid entry; so do we (an entry of -1 hides all that follow).
    """
    value = (env if env is not None else os.environ).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    out = []
    for item in value.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break
        out.append(item)
    return out


def probe(env: Mapping[str, str] | None = None) -> list[GpuInfo]:
    """The visible GPUs with NVML's total/free bytes; [] when NVML is absent or sees none."""
    entries = visible_entries(env)
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return [GpuInfo(e, None, None, None) for e in entries or []]
    try:
        pynvml.nvmlInit()
    except Exception:
        return [GpuInfo(e, None, None, None) for e in entries or []]
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = {}
        for i in range(count):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            handles[str(i)] = h
            handles[uuid.decode() if isinstance(uuid, bytes) else uuid] = h
        wanted = entries if entries is not None else [str(i) for i in range(count)]
        out = []
        for entry in wanted:
            h = handles.get(entry) or next((v for k, v in handles.items() if k.startswith(entry)), None)
            if h is None:
                break  # CUDA stops at the first entry it cannot resolve
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            name = pynvml.nvmlDeviceGetName(h)
            out.append(GpuInfo(entry, name.decode() if isinstance(name, bytes) else name, int(mem.total), int(mem.free)))
        return out
    except Exception:
        return [GpuInfo(e, None, None, None) for e in entries or []]
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
