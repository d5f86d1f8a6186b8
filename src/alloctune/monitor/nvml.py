"""The four NVML questions `watch` asks, behind a small facade (`NvmlFacade`).

Tests drive sampling with a fake; the real one (`PynvmlFacade`, `nvidia-ml-py`) is only built
where a driver exists, and fails with one clear line where none is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from alloctune.errors import EnvironmentProblem


@dataclass(frozen=True)
class GpuInfo:
    name: str
    total: int
    used: int
    util: int | None  # percent of time a kernel ran (NVML "gpu" utilization), None if unknown


class NvmlFacade(Protocol):
    """The four NVML questions `watch` asks; a fake implements them in tests."""

    def device_count(self) -> int: ...

    def device(self, index: int) -> GpuInfo: ...

    def processes(self, index: int) -> list[tuple[int, int | None]]:
        """(pid, used bytes or None when the driver does not say) of compute processes."""
        ...

    def close(self) -> None: ...


class PynvmlFacade:
    """The real NVML through `nvidia-ml-py`; fails with one clear line where no driver is present."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise EnvironmentProblem("nvidia-ml-py is not installed: pip install 'alloctune[nvml]' (or nvidia-ml-py)") from None
        self._nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise EnvironmentProblem(
                f"cannot talk to the NVIDIA driver (NVML: {exc}); watch needs an NVIDIA GPU and driver"
            ) from None

    def device_count(self) -> int:
        return int(self._nv.nvmlDeviceGetCount())

    def device(self, index: int) -> GpuInfo:
        nv = self._nv
        h = nv.nvmlDeviceGetHandleByIndex(index)
        name = nv.nvmlDeviceGetName(h)
        if isinstance(name, bytes):
            name = name.decode(errors="replace")
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        try:
            util: int | None = int(nv.nvmlDeviceGetUtilizationRates(h).gpu)
        except nv.NVMLError:
            util = None
        return GpuInfo(str(name), int(mem.total), int(mem.used), util)

    def processes(self, index: int) -> list[tuple[int, int | None]]:
        nv = self._nv
        h = nv.nvmlDeviceGetHandleByIndex(index)
        try:
            procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
        except nv.NVMLError:
            return []
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append((int(p.pid), int(used) if isinstance(used, int) else None))
        return out

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except Exception:
            pass
