"""The `watch` logs: every sample appended to a CSV file (one row per process) and/or JSON lines."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import IO, Any

from alloctune.monitor.sample import Sample

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
        base = {
            "time": f"{sample.time:.3f}",
            "gpu": g.index,
            "gpu_name": g.name,
            "gpu_used": g.used,
            "gpu_total": g.total,
            "gpu_util": "" if g.util is None else g.util,
        }
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
