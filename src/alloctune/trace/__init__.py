"""Recorded allocator histories: safe loading, the request stream, a compact format.

`load_trace(path)` is the entry point: it opens `torch.cuda.memory._dump_snapshot`
files (plain, gzip or xz; never with plain `pickle`) and alloctune compact traces, and
returns a `Trace` whose `requests` the simulator replays.
"""

from __future__ import annotations

from alloctune.trace.compact import save_compact
from alloctune.trace.load import load_snapshot, load_trace, prefetch_trace, trace_from_snapshot
from alloctune.trace.model import (
    ALLOC,
    EMPTY_CACHE,
    FAILED_ALLOC,
    FREE,
    OP_NAMES,
    RequestStream,
    SegmentEvent,
    Trace,
)
from alloctune.trace.safe_pickle import RestrictedUnpickler, safe_loads

__all__ = [
    "ALLOC",
    "EMPTY_CACHE",
    "FAILED_ALLOC",
    "FREE",
    "OP_NAMES",
    "RequestStream",
    "RestrictedUnpickler",
    "SegmentEvent",
    "Trace",
    "load_snapshot",
    "load_trace",
    "prefetch_trace",
    "safe_loads",
    "save_compact",
    "trace_from_snapshot",
]
