"""What the agent writes: the report at exit, the allocator snapshots, the live samples.

Split from `bootstrap.py` (which keeps the hooks into the process); like it, standard library
only and loaded by file path in the child. `AgentOutputs` is the `Agent`'s half that builds and
writes these files from the state the hooks collected.

Live samples (the contract `alloctune watch` reads)
----------------------------------------------------
Every `live_interval` seconds (default 1 s) after CUDA init, the file
`$ALLOCTUNE_STATE_DIR/live-<pid>.json` (default directory `~/.cache/alloctune/live/`) is
replaced atomically (write to a temporary file in the same directory, then `os.replace`)
with a JSON object::

    {"schema": 1, "kind": "alloctune-live", "pid": int, "rank": int|null,
     "local_rank": int|null, "cmd": [str, ...], "time": float (Unix s),
     "started": float (Unix s), "device": int, "device_name": str,
     "total_memory": int, "budget": int|null, "conf": str|null,
     "stats": {memory_stats names from STAT_KEYS: int}}

The file is removed when the process exits normally or by SIGTERM; a file whose `pid` no
longer runs (e.g. after SIGKILL) is stale and readers should ignore it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any, Callable

# Snapshot key of the program's empty_cache() calls; equal to trace.stream.EMPTY_CACHE_MARKS_KEY
# (not imported: the agent loads only the standard library in the user's interpreter).
EMPTY_CACHE_MARKS_KEY = "alloctune_empty_cache_calls"
# Snapshot key of the run record (cap, total memory, setting, command); equal to trace.stream.RUN_RECORD_KEY.
RUN_RECORD_KEY = "alloctune_run"

REPORT_SCHEMA = 1
LIVE_SCHEMA = 1
# The `torch.cuda.memory_stats()` subset every report and live sample carries.
STAT_KEYS: tuple[str, ...] = tuple(
    f"{kind}.all.{field}"
    for kind in ("reserved_bytes", "allocated_bytes", "active_bytes", "requested_bytes", "inactive_split_bytes")
    for field in ("current", "peak")
) + (
    "segment.all.current",
    "segment.all.peak",
    "segment.all.allocated",
    "segment.all.freed",
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
    "num_sync_all_streams",
)


def replace_atomically(path: str, write: Callable[[str], None], suffix: str = "") -> None:
    """`write(tmp)` to a temporary file beside `path`, then rename it to `path`: a reader sees the
    old file or the whole new one, never half of one, and a write that fails leaves nothing."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=directory)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json_atomic(path: str, data: dict[str, Any]) -> None:
    """Write JSON so that a reader sees either the old or the new file, never half of one."""

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)

    replace_atomically(path, write, ".json")


def _is_oom(type_name: str, message: str) -> bool:
    """torch.OutOfMemoryError, or an exception that wraps the allocator's message."""
    return type_name == "OutOfMemoryError" or "out of memory" in message.lower()


class AgentOutputs:
    """The `Agent`'s outputs (a mixin: it reads the state `bootstrap.Agent` keeps)."""

    def run_record(self) -> dict[str, Any]:
        """What a snapshot needs to be read right later, written into it (`RUN_RECORD_KEY`).

        Without the cap, a diagnosis of a capped run would take the whole device as the budget
        and answer the wrong question; the report file beside it is gone by then (the runner's
        temporary folder). Keys follow the shared traces' sidecar (`cap`: bytes, 0 = none).
        """
        cap = 0
        if self.fraction is not None and self.fraction < 1.0 and self.total_memory:
            cap = int(self.fraction * self.total_memory)  # the allocator truncates the same product
        record: dict[str, Any] = {
            "cap": cap,
            "total_memory": int(self.total_memory or 0),
            "torch": str(getattr(self.torch, "__version__", "") or ""),
            "conf": str(
                self.config.get("conf") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF") or ""
            ),
            "device": int(self.device or 0),
            "cmd": [str(a) for a in sys.argv],
        }
        if self.ooms:  # the allocator's own limit at the first OOM (the observer's `limit`)
            record["oom_limit"] = int(self.ooms[0]["limit"])
        bench = self._cudnn_benchmark()
        if bench is not None:  # which way cuDNN chose its algorithms: the switch to try is the other
            record["cudnn_benchmark"] = bench
        return record

    def _cudnn_benchmark(self) -> bool | None:
        """torch.backends.cudnn.benchmark as the program leaves it (None: torch not imported)."""
        try:
            return None if self.torch is None else bool(self.torch.backends.cudnn.benchmark)
        except Exception:  # noqa: BLE001 - a torch without cuDNN: nothing to say
            return None

    def _dump_oom_snapshot(self) -> None:
        folder = self.config.get("oom_dir") or self.config.get("report_dir") or "."
        path = os.path.join(folder, f"oom-snapshot.{os.getpid()}.pickle")
        try:
            self._write_snapshot(self._with_record(self.torch.cuda.memory._snapshot()), path)
            self.oom_snapshot = path
        except Exception as exc:
            self._note(f"OOM snapshot failed: {exc}")

    def _with_record(self, snap: dict[str, Any]) -> dict[str, Any]:
        """`snap` plus the run record and, when recording, the program's empty_cache() calls."""
        snap = {**snap, RUN_RECORD_KEY: self.run_record()}
        if self.empty_cache_calls is not None:
            snap[EMPTY_CACHE_MARKS_KEY] = list(self.empty_cache_calls)
        return snap

    @staticmethod
    def _write_snapshot(snap: dict[str, Any], path: str) -> None:
        """Write under a temporary name, then rename: a file at `path` is whole, so the runner may
        start reading it while this process is still exiting, and a run killed mid-write leaves none."""
        import pickle  # writing our own plain-data dict; only reading pickles is dangerous

        opener = open
        if path.endswith(".gz"):
            import gzip as opener_mod

            opener = opener_mod.open
        elif path.endswith(".xz"):
            import lzma as opener_mod

            opener = opener_mod.open

        def write(tmp: str) -> None:
            with opener(tmp, "wb") as fh:
                pickle.dump(snap, fh)

        replace_atomically(path, write, os.path.basename(path))

    def _live_loop(self) -> None:
        interval = float(self.config.get("live_interval") or 1.0)
        while True:
            try:
                write_json_atomic(self._live_path, self.live_sample())
            except Exception as exc:  # a full disk must not break the workload
                self._note(f"live sample failed: {exc}")
                return
            if self._stop.wait(interval):
                return

    def live_sample(self) -> dict[str, Any]:
        return {
            "schema": LIVE_SCHEMA,
            "kind": "alloctune-live",
            "pid": os.getpid(),
            "rank": self.rank,
            "local_rank": self.local_rank,
            "cmd": list(sys.argv),
            "time": time.time(),
            "started": self.started,
            "device": self.device,
            "device_name": self.device_name,
            "total_memory": self.total_memory,
            "budget": self.config.get("budget"),
            "conf": self.config.get("conf"),
            "stats": self._stats(),
        }

    def _stop_live(self) -> None:
        self._stop.set()
        if self._live_thread is not None:
            self._live_thread.join(timeout=2.0)
        if self._live_path:
            try:
                os.unlink(self._live_path)
            except OSError:
                pass

    def _stats(self) -> dict[str, int]:
        if not self.cuda_initialized or self.device is None:
            return {}
        stats = self.torch.cuda.memory_stats(self.device)
        return {k: int(stats[k]) for k in STAT_KEYS if k in stats}

    def outcome(self) -> str:
        """The agent's own view; the runner combines it with the real exit status."""
        if self.forced_outcome:
            return self.forced_outcome
        if self.exception is not None:
            if _is_oom(self.exception["type"], self.exception["message"]):
                return "oom"
            return "crash"
        if self.exit_code not in (None, 0):
            return "oom" if self.ooms else "crash"
        if not self.cuda_initialized:
            return "no-cuda"
        return "ok"

    def finish(self) -> None:
        """Write the report once (atexit, SIGTERM, or before a forced stop)."""
        with self._lock:
            if self._written or os.getpid() != self.pid:
                return
            self._written = True
        self._stop_live()
        report_dir = self.config.get("report_dir")
        if not report_dir:
            return
        try:
            report = self.build_report()
        except Exception as exc:  # never lose the report entirely
            report = self._base_report()
            report["agent_errors"] = self.agent_errors + [f"report failed: {type(exc).__name__}: {exc}"]
        try:
            rank = "" if self.rank is None else f"rank{self.rank}."  # torchrun: one report per rank, named so
            write_json_atomic(os.path.join(report_dir, f"report.{rank}{os.getpid()}.json"), report)
        except Exception as exc:
            sys.stderr.write(f"alloctune agent: cannot write report: {exc}\n")

    def _base_report(self) -> dict[str, Any]:
        torch = self.torch
        oom_message = None
        if self.exception is not None and _is_oom(self.exception["type"], self.exception["message"]):
            oom_message = self.exception["message"]
        return {
            "schema": REPORT_SCHEMA,
            "kind": "alloctune-agent-report",
            "pid": os.getpid(),
            "rank": self.rank,
            "local_rank": self.local_rank,
            "cmd": list(sys.argv),
            "outcome": self.outcome(),
            "exit_code": self.exit_code,
            "exception": self.exception,
            "oom_message": oom_message,
            "ooms_observed": len(self.ooms),
            "last_oom": self.ooms[-1] if self.ooms else None,
            "torch_imported": torch is not None,
            "torch_version": getattr(torch, "__version__", None),
            "cuda_initialized": self.cuda_initialized,
            "device": self.device,
            "device_name": self.device_name,
            "total_memory": self.total_memory,
            "budget": self.config.get("budget"),
            "fraction": self.fraction,
            "conf": self.config.get("conf"),
            "env_conf": {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")},
            "started": self.started,
            "wall_s": time.monotonic() - self._t0,
            "stats": {},
            "allocator_settings": None,
            "snapshot": None,
            "oom_snapshot": self.oom_snapshot,
            "autograd": dict(self.autograd_counts) if self.autograd_counts is not None else None,
            "no_grad": bool(self.config.get("no_grad")),
            "checkpointing": list(self.checkpointing_enabled) if self.config.get("checkpointing") else None,
            "cudnn_benchmark_set": self.config.get("cudnn_benchmark"),
            "cudnn_benchmark": self._cudnn_benchmark(),
            "segment_sizes": None,
            "agent_errors": list(self.agent_errors),
        }

    def build_report(self) -> dict[str, Any]:
        report = self._base_report()
        torch = self.torch
        if torch is None:
            return report
        try:
            report["cuda_available"] = bool(torch.cuda.is_available())
        except Exception:
            report["cuda_available"] = False
        if not self.cuda_initialized:
            return report
        report["stats"] = self._stats()
        snap = torch.cuda.memory._snapshot()
        report["allocator_settings"] = snap.get("allocator_settings")
        if report["allocator_settings"] is None:
            getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
            report["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": getter()} if getter else None
        record = self.config.get("record")
        if record:
            path = self._record_path(record)
            snap = self._with_record(snap)
            self._write_snapshot(snap, path)
            report["snapshot"] = path
            report["segment_sizes"] = segment_sizes(snap, self.device or 0)
        return report


def segment_sizes(snapshot: dict[str, Any], device: int = 0) -> list[list[int]]:
    """Distinct `cudaMalloc` sizes the run made, as sorted `[size, count]` pairs.

    Tuning `max_split_size_mb` needs only these: blocks are parts of segments, so a value
    above every segment size never marks a block oversize and changes nothing.
    """
    traces = snapshot.get("device_traces") or []
    events = traces[device] if device < len(traces) else []
    counts: dict[int, int] = {}
    for ev in events:
        if ev.get("action") == "segment_alloc":
            counts[int(ev["size"])] = counts.get(int(ev["size"]), 0) + 1
    return [[size, counts[size]] for size in sorted(counts)]
