"""What a trace holds, in numbers (`alloctune trace info`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from alloctune.trace.model import ALLOC, EMPTY_CACHE, FAILED_ALLOC, FREE, OP_NAMES, Trace
from alloctune.trace.stream import requested_live_peak

SCHEMA = 1


@dataclass(frozen=True)
class TraceSummary:
    """Counts and peaks of one trace; plain data for the table and `--json`."""

    source: str
    device: int
    requests: int
    requests_by_kind: dict[str, int]
    streams: list[int]
    peak_requested_bytes: int  # peak of live requested (unrounded) bytes
    live_at_end: int  # allocations never freed in the trace
    segment_events: dict[str, int]  # by action, incl. oom
    recorded_peak_reserved_bytes: int  # from the recorded segment events
    oom_events: int
    inferred_empty_cache: int
    allocator_settings: dict[str, Any]
    total_memory: int | None
    meta: dict[str, Any] = field(default_factory=dict)  # the sidecar's short fields

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["schema"] = SCHEMA
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TraceSummary:
        d = {k: v for k, v in d.items() if k != "schema"}
        return cls(**d)


_META_KEYS = ("workload", "conf", "cap", "torch", "outcome", "items_done")


def summarize(trace: Trace) -> TraceSummary:
    """Count requests and segment events, and replay the recorded reserved level."""
    req = trace.requests
    kinds = Counter(req.ops)
    reserved = peak = 0
    for e in trace.segment_events:
        if e.action in ("segment_alloc", "segment_map"):
            reserved += e.size
            peak = max(peak, reserved)
        elif e.action in ("segment_free", "segment_unmap"):
            reserved -= e.size
    seg = Counter(e.action for e in trace.segment_events)
    return TraceSummary(
        source=trace.source,
        device=trace.device,
        requests=len(req),
        requests_by_kind={OP_NAMES[op]: kinds.get(op, 0) for op in (ALLOC, FREE, EMPTY_CACHE, FAILED_ALLOC)},
        streams=trace.streams,
        peak_requested_bytes=requested_live_peak(req),
        live_at_end=kinds.get(ALLOC, 0) - kinds.get(FREE, 0),
        segment_events=dict(sorted(seg.items())),
        recorded_peak_reserved_bytes=peak,
        oom_events=seg.get("oom", 0),
        inferred_empty_cache=kinds.get(EMPTY_CACHE, 0),
        allocator_settings=dict(trace.allocator_settings),
        total_memory=trace.total_memory,
        meta={k: trace.meta[k] for k in _META_KEYS if k in trace.meta},
    )
