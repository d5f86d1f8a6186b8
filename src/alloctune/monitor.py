"""Sampling GPU memory (NVML) and allocator statistics (the agent's live files) for `watch`.

NVML sees what the driver sees: memory used per GPU and per process. Only the allocator
inside a process knows how much of that is reserved-but-free, split into unusable pieces, or
retried; processes started by `alloctune run` publish those numbers every second in
`$ALLOCTUNE_STATE_DIR/live-<pid>.json` (written by `alloctune.agent.bootstrap`). A sample joins
the two by pid.

Sampling is a plain function over a small NVML facade (`NvmlFacade`), so tests drive it with
a fake and the real one (`PynvmlFacade`, `nvidia-ml-py`) is only built where a driver exists.
No torch here.
"""

from __future__ import annotations

import csv
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Mapping, Protocol

from alloctune.errors import EnvironmentProblem

SCHEMA = "alloctune.watch-sample/1"
LIVE_KIND = "alloctune-live"
STATE_DIR_VAR = "ALLOCTUNE_STATE_DIR"


def default_state_dir() -> Path:
    """Where the agent writes live files (same rule as the agent: env var, else ~/.cache)."""
    env = os.environ.get(STATE_DIR_VAR)
    return Path(env) if env else Path.home() / ".cache" / "alloctune" / "live"


# --------------------------------------------------------------------------------------------
# NVML facade.


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
            raise EnvironmentProblem(
                "nvidia-ml-py is not installed: pip install 'alloctune[nvml]' (or nvidia-ml-py)"
            ) from None
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


# --------------------------------------------------------------------------------------------
# Samples.


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
        return cls(int(d["pid"]), int(d.get("device") or 0), d.get("rank"), str(d.get("cmd", "")), d.get("conf"),
                   d.get("budget"), float(d.get("time", 0.0)), dict(d.get("stats") or {}))


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
        return cls(int(d["index"]), str(d["name"]), int(d["total"]), int(d["used"]), d.get("util"),
                   tuple(ProcessSample.from_dict(p) for p in d.get("processes", ())))


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
        return cls(float(d["time"]), tuple(GpuSample.from_dict(g) for g in d.get("gpus", ())),
                   int(d.get("stale_live_files", 0)))


# --------------------------------------------------------------------------------------------
# Live files.


def pid_alive(pid: int) -> bool:
    """True if a process with this pid exists (signal 0 checks without touching it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def read_live_files(
    state_dir: str | Path, is_alive: Callable[[int], bool] = pid_alive
) -> tuple[dict[int, AllocatorSample], int]:
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


# --------------------------------------------------------------------------------------------
# Logs.

CSV_COLUMNS = (
    "time",
    "gpu",
    "gpu_name",
    "gpu_used",
    "gpu_total",
    "gpu_util",
    "pid",
    "proc_used",
    "rank",
    "reserved_bytes",
    "allocated_bytes",
    "inactive_split_bytes",
    "utilization",
    "num_alloc_retries",
    "num_ooms",
    "conf",
    "cmd",
)


def csv_rows(sample: Sample) -> list[dict[str, Any]]:
    """One row per (GPU, process); a GPU without processes gets one row with an empty pid."""
    rows = []
    for g in sample.gpus:
        base = {"time": f"{sample.time:.3f}", "gpu": g.index, "gpu_name": g.name, "gpu_used": g.used,
                "gpu_total": g.total, "gpu_util": "" if g.util is None else g.util}
        if not g.processes:
            rows.append({**{c: "" for c in CSV_COLUMNS}, **base})
            continue
        for p in g.processes:
            a = p.allocator
            row = {c: "" for c in CSV_COLUMNS}
            row.update(base)
            row.update(pid=p.pid, proc_used="" if p.used is None else p.used)
            if a is not None:
                util = a.utilization
                row.update(
                    rank="" if a.rank is None else a.rank,
                    reserved_bytes=_blank(a.reserved),
                    allocated_bytes=_blank(a.allocated),
                    inactive_split_bytes=_blank(a.inactive_split),
                    utilization="" if util is None else f"{util:.4f}",
                    num_alloc_retries=_blank(a.retries),
                    num_ooms=_blank(a.ooms),
                    conf=a.conf or "",
                    cmd=a.cmd,
                )
            rows.append(row)
    return rows


def _blank(v: int | None) -> Any:
    return "" if v is None else v


class SampleLog:
    """Appends every sample to a CSV file (header once) and/or a JSON-lines stream."""

    def __init__(self, csv_path: str | Path | None = None, json_stream: IO[str] | None = None) -> None:
        self._csv_fh = None
        self._writer = None
        if csv_path is not None:
            p = Path(csv_path)
            new = not p.exists() or p.stat().st_size == 0
            try:
                self._csv_fh = open(p, "a", newline="", encoding="utf-8")
            except OSError as exc:
                from alloctune.errors import InputError

                raise InputError(f"cannot write CSV log {p}: {exc.strerror}") from None
            self._writer = csv.DictWriter(self._csv_fh, fieldnames=list(CSV_COLUMNS))
            if new:
                self._writer.writeheader()
        self._json = json_stream

    def write(self, sample: Sample) -> None:
        if self._writer is not None:
            self._writer.writerows(csv_rows(sample))
            self._csv_fh.flush()
        if self._json is not None:
            self._json.write(json.dumps(sample.to_dict(), separators=(",", ":")) + "\n")
            self._json.flush()

    def close(self) -> None:
        if self._csv_fh is not None:
            self._csv_fh.close()


def read_csv_log(path: str | Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def short_size(n: int) -> str:
    """Compact sizes for the live view (`6.0G`, `300M`): the terminal is narrow, logs keep bytes."""
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f}G"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.0f}M"
    return f"{n / 1024:.0f}K"


def sample_table(sample: Sample, fmt: Callable[[int], str] = short_size, width: int = 120):
    """The watch view of one sample: a line per GPU, then its processes (rich Table).

    Allocator columns are filled only for processes that publish live stats (`alloctune run`);
    NVML's "used" includes the CUDA context and non-PyTorch memory, so it exceeds "resv".
    "a/r" is the project's utilization (peak allocated / peak reserved), "split" the
    inactive-split bytes, "cap" the budget `alloctune run` applied. Only the first column
    gives way on a narrow terminal (`width`).
    """
    from rich import box
    from rich.table import Table

    f = fmt
    table = Table(title=time.strftime("alloctune watch  %H:%M:%S", time.localtime(sample.time)), expand=False,
                  box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, collapse_padding=True, show_edge=False)
    first = max(10, min(48, width - 74))
    table.add_column("GPU / process", overflow="ellipsis", no_wrap=True, width=first)
    for name, w in (("used", 9), ("total", 6), ("cap", 6), ("resv", 6), ("alloc", 6), ("split", 6), ("a/r", 6),
                    ("retry/OOM", 9)):
        table.add_column(name, justify="right", no_wrap=True, min_width=w)
    for g in sample.gpus:
        pct = f" {g.used / g.total:.0%}" if g.total else ""
        util = "" if g.util is None else f" {g.util}%"
        table.add_row(f"[bold]{g.index} {g.name}[/bold]{util}", f"{f(g.used)}{pct}", f(g.total), "", "", "", "", "", "")
        for p in g.processes:
            a = p.allocator
            used = "?" if p.used is None else f(p.used)
            if a is None:
                table.add_row(f"  {p.pid}", used, "", "", "", "", "", "", "")
                continue
            util = a.utilization
            who = f"  {p.pid}" + ("" if a.rank is None else f" r{a.rank}") + f" {a.cmd}"
            retries = "" if a.retries is None and a.ooms is None else f"{_blank(a.retries)}/{_blank(a.ooms)}"
            table.add_row(
                who,
                used,
                "",
                "" if a.budget is None else f(int(a.budget)),
                _fmt(f, a.reserved),
                _fmt(f, a.allocated),
                _fmt(f, a.inactive_split),
                "" if util is None else f"{util:.0%}",
                retries,
            )
    if sample.stale_live_files:
        table.caption = f"{sample.stale_live_files} stale live file(s) ignored"
    return table


def _fmt(f: Callable[[int], str], v: int | None) -> str:
    return "" if v is None else f(v)
