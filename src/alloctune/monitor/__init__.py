"""`watch`: GPU memory as NVML sees it, joined by pid with the allocator's own numbers.

NVML sees what the driver sees: memory used per GPU and per process. Only the allocator inside
a process knows how much of that is reserved-but-free; processes started by `alloctune run`
publish those numbers every second in `$ALLOCTUNE_STATE_DIR/live-<pid>.json` (written by
`alloctune.agent.outputs`). No torch here.

    nvml.py    the NVML facade (a fake in tests, `nvidia-ml-py` for real)
    sample.py  live files and samples: one per interval, joined by pid
    log.py     CSV / JSON-lines logs
    view.py    the live table

The names below are the package's public face (`from alloctune.monitor import samples`).
"""

from __future__ import annotations

from alloctune.monitor.log import CSV_COLUMNS, SampleLog, csv_rows, read_csv_log
from alloctune.monitor.nvml import GpuInfo, NvmlFacade, PynvmlFacade
from alloctune.monitor.sample import (
    LIVE_KIND,
    SCHEMA,
    STATE_DIR_VAR,
    AllocatorSample,
    GpuSample,
    ProcessSample,
    Sample,
    default_state_dir,
    pid_alive,
    read_live_files,
    samples,
    take_sample,
)
from alloctune.monitor.view import sample_table, short_size

__all__ = [
    "CSV_COLUMNS",
    "LIVE_KIND",
    "SCHEMA",
    "STATE_DIR_VAR",
    "AllocatorSample",
    "GpuInfo",
    "GpuSample",
    "NvmlFacade",
    "ProcessSample",
    "PynvmlFacade",
    "Sample",
    "SampleLog",
    "csv_rows",
    "default_state_dir",
    "pid_alive",
    "read_csv_log",
    "read_live_files",
    "sample_table",
    "samples",
    "short_size",
    "take_sample",
]
