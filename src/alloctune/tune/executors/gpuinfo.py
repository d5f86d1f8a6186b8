"""The GPUs this process may use and their free memory, read through NVML (or nvidia-smi).

Why NVML and not torch: the parent of a sweep must never create a CUDA context (it would
hold ~500 MiB on the card for the whole sweep and skew every trial). NVML numbers devices
physically; `CUDA_VISIBLE_DEVICES` (indices or UUIDs) says which of them the user gave us,
and a trial is pointed at one by giving it that same entry.
"""

from __future__ import annotations

import os
import shutil
import subprocess
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


def _select(rows: list[tuple[str, str, str, int, int]], entries: list[str] | None) -> list[GpuInfo]:
    """Rows (index, uuid, name, total, free) in the order `CUDA_VISIBLE_DEVICES` names them."""
    wanted = entries if entries is not None else [r[0] for r in rows]
    out = []
    for entry in wanted:
        row = next((r for r in rows if entry == r[0] or r[1].startswith(entry)), None)
        if row is None:
            break  # CUDA stops at the first entry it cannot resolve
        out.append(GpuInfo(entry, row[2], row[3], row[4]))
    return out


def _probe_smi(entries: list[str] | None) -> list[GpuInfo] | None:
    """The same from `nvidia-smi` (present wherever the driver is), when nvidia-ml-py is not installed."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,uuid,name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    rows = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        try:
            rows.append((parts[0], parts[1], parts[2], int(float(parts[3])) << 20, int(float(parts[4])) << 20))
        except ValueError:
            continue
    return _select(rows, entries)


def probe(env: Mapping[str, str] | None = None) -> list[GpuInfo]:
    """The visible GPUs with total/free bytes (NVML, else nvidia-smi); unknown sizes when neither works."""
    entries = visible_entries(env)
    unknown = [GpuInfo(e, None, None, None) for e in entries or []]
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        found = _probe_smi(entries)
        return unknown if found is None else found
    try:
        pynvml.nvmlInit()
    except Exception:
        found = _probe_smi(entries)
        return unknown if found is None else found
    try:
        rows = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid, name = pynvml.nvmlDeviceGetUUID(h), pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            rows.append(
                (
                    str(i),
                    uuid.decode() if isinstance(uuid, bytes) else uuid,
                    name.decode() if isinstance(name, bytes) else name,
                    int(mem.total),
                    int(mem.free),
                )
            )
        return _select(rows, entries)
    except Exception:
        return unknown
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
