"""Sampling GPU memory (NVML) and allocator statistics (the agent's live files) for `watch`.

NVML sees what the driver sees: memory used per GPU and per process. Only the allocator
inside a process knows how much of that is reserved-but-free, split into unusable pieces, or
retried; processes started by `alloctune run` publish those numbers every second in
`$ALLOCTUNE_STATE_DIR/live-<pid>.json` (written by `alloctune.agent.outputs`). A sample joins
the two by pid.

Sampling is a plain function over a small NVML facade (`NvmlFacade`), so tests drive it with
a fake and the real one (`PynvmlFacade`, `nvidia-ml-py`) is only built where a driver exists.
No torch here.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from alloctune.monitor.nvml import NvmlFacade

SCHEMA = "alloctune.watch-sample/1"
LIVE_KIND = "alloctune-live"
STATE_DIR_VAR = "ALLOCTUNE_STATE_DIR"


def default_state_dir() -> Path:
    """Where the agent writes live files (same rule as the agent: env var, else ~/.cache)."""
    env = os.environ.get(STATE_DIR_VAR)
    return Path(env) if env else Path.home() / ".cache" / "alloctune" / "live"


@dataclass(frozen=True)
class AllocatorSample:
    """One process's allocator numbers from its live file (`memory_stats` names)."""

    pid: int
    device: int
    rank: int | None
    cmd: str
    conf: str | None
    budget: int | None
    time: float
    stats: Mapping[str, int]

    @property
    def reserved(self) -> int | None:
        return self.stats.get("reserved_bytes.all.current")

    @property
    def allocated(self) -> int | None:
        return self.stats.get("allocated_bytes.all.current")

    @property
    def inactive_split(self) -> int | None:
        return self.stats.get("inactive_split_bytes.all.current")

    @property
    def retries(self) -> int | None:
        return self.stats.get("num_alloc_retries")

    @property
    def ooms(self) -> int | None:
        return self.stats.get("num_ooms")

    @property
    def utilization(self) -> float | None:
        """Peak allocated ÷ peak reserved (the project's metric); current values if peaks are absent."""
        r = self.stats.get("reserved_bytes.all.peak", self.reserved)
        a = self.stats.get("allocated_bytes.all.peak", self.allocated)
        if not r or a is None:
            return None
        return a / r

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "device": self.device,
            "rank": self.rank,
            "cmd": self.cmd,
            "conf": self.conf,
            "budget": self.budget,
            "time": self.time,
            "stats": dict(self.stats),
            "utilization": self.utilization,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "AllocatorSample":
        return cls(
            int(d["pid"]),
            int(d.get("device") or 0),
            d.get("rank"),
            str(d.get("cmd", "")),
            d.get("conf"),
            d.get("budget"),
            float(d.get("time", 0.0)),
            dict(d.get("stats") or {}),
        )


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    used: int | None  # NVML's number for this process (None: the driver did not say / not seen by NVML)
    allocator: AllocatorSample | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "used": self.used, "allocator": None if self.allocator is None else self.allocator.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ProcessSample":
        a = d.get("allocator")
        return cls(int(d["pid"]), d.get("used"), None if a is None else AllocatorSample.from_dict(a))


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str
    total: int
    used: int
    util: int | None
    processes: tuple[ProcessSample, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "total": self.total,
            "used": self.used,
            "util": self.util,
            "processes": [p.to_dict() for p in self.processes],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GpuSample":
        return cls(
            int(d["index"]),
            str(d["name"]),
            int(d["total"]),
            int(d["used"]),
            d.get("util"),
            tuple(ProcessSample.from_dict(p) for p in d.get("processes", ())),
        )


@dataclass(frozen=True)
class Sample:
    time: float
    gpus: tuple[GpuSample, ...]
    stale_live_files: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "time": self.time,
            "gpus": [g.to_dict() for g in self.gpus],
            "stale_live_files": self.stale_live_files,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Sample":
        return cls(float(d["time"]), tuple(GpuSample.from_dict(g) for g in d.get("gpus", ())), int(d.get("stale_live_files", 0)))


def pid_alive(pid: int) -> bool:
    """True if a process with this pid exists: the agent's one rule (psutil, or a process handle on
    Windows, where `os.kill(pid, 0)` would end the process)."""
    from alloctune.agent.watchdog import pid_alive as alive

    return alive(pid)


def read_live_files(state_dir: str | Path, is_alive: Callable[[int], bool] = pid_alive) -> tuple[dict[int, AllocatorSample], int]:
    """Live allocator samples by pid, and how many files were skipped as stale or unreadable.

    A file whose pid no longer runs is left over from a killed process; a file that fails to
    parse is being replaced right now (the agent replaces atomically, so this is rare) or is
    not ours. Both are skipped rather than shown as current.
    """
    out: dict[int, AllocatorSample] = {}
    skipped = 0
    d = Path(state_dir)
    if not d.is_dir():
        return out, 0
    for f in sorted(d.glob("live-*.json")):
        try:
            data = json.loads(f.read_text())
            if data.get("kind") != LIVE_KIND:
                raise ValueError("not a live file")
            pid = int(data["pid"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            skipped += 1
            continue
        if not is_alive(pid):
            skipped += 1
            continue
        cmd = data.get("cmd") or []
        stats = {k: int(v) for k, v in (data.get("stats") or {}).items() if isinstance(v, (int, float))}
        out[pid] = AllocatorSample(
            pid=pid,
            device=int(data.get("device") or 0),
            rank=data.get("rank"),
            cmd=" ".join(map(str, cmd)) if isinstance(cmd, list) else str(cmd),
            conf=data.get("conf"),
            budget=data.get("budget"),
            time=float(data.get("time") or 0.0),
            stats=stats,
        )
    return out, skipped


def take_sample(
    nvml: NvmlFacade,
    state_dir: str | Path | None = None,
    now: Callable[[], float] = time.time,
    is_alive: Callable[[int], bool] = pid_alive,
) -> Sample:
    """One sample of every GPU and its processes, with allocator numbers joined by pid.

    A live process that NVML does not list on its device (e.g. pids differ inside a
    container) is still shown on the device its live file names, with NVML's number unknown.
    """
    live, skipped = read_live_files(state_dir if state_dir is not None else default_state_dir(), is_alive)
    gpus = []
    seen: set[int] = set()
    count = nvml.device_count()
    for i in range(count):
        info = nvml.device(i)
        procs = []
        for pid, used in nvml.processes(i):
            procs.append(ProcessSample(pid, used, live.get(pid)))
            seen.add(pid)
        for pid, a in sorted(live.items()):
            if pid not in seen and a.device == i:
                procs.append(ProcessSample(pid, None, a))
                seen.add(pid)
        gpus.append(GpuSample(i, info.name, info.total, info.used, info.util, tuple(procs)))
    return Sample(now(), tuple(gpus), skipped)


def samples(
    nvml: NvmlFacade,
    interval: float,
    count: int | None = None,
    state_dir: str | Path | None = None,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.time,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Sample]:
    """Samples every `interval` seconds, on a fixed grid from the start so that slow drawing or
    logging does not make the samples drift; a sample that took longer than the interval is
    followed at once by the next."""
    start = clock()
    n = 0
    while count is None or n < count:
        yield take_sample(nvml, state_dir, now)
        n += 1
        if count is not None and n >= count:
            return
        sleep(max(start + n * interval - clock(), 0.0))
