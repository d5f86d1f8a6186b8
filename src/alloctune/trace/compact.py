"""alloctune's own trace file: small, safe to open, and quick to load.

A snapshot pickle carries per-event timestamps, stack frames and the final segment
map; replay needs none of that. The compact file keeps only the request stream, the
recorded segment events, the allocator settings and the run's meta, as xz-compressed
JSON (no pickle, so nothing in it can run code) with a `schema` version.

Columns are stored as they compress best: rids of ALLOC requests are implicit (they
count up from 0 in order), so only FREE rids are stored, as the distance back to the
allocation (`alloc count so far - 1 - rid`), which is small for short-lived tensors;
`event_index` is stored as deltas (mostly 1 or 2).
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Any

from alloctune.errors import TraceError
from alloctune.trace.model import ALLOC, FREE, RequestStream, SegmentEvent, Trace

SCHEMA = 1
FORMAT = "alloctune-trace"
COMPACT_MAGIC = FORMAT.encode()  # appears near the start of the JSON text (first key)


def to_compact_dict(trace: Trace) -> dict[str, Any]:
    """The JSON-ready dict of a trace (see module doc for the column encodings)."""
    req = trace.requests
    alloc_count = 0
    free_back: list[int] = []
    for op, rid in zip(req.ops, req.rids):
        if op == ALLOC:
            if rid != alloc_count:
                raise TraceError(f"{trace.source}: allocation ids are not in order; cannot write the compact format")
            alloc_count += 1
        elif op == FREE:
            free_back.append(alloc_count - 1 - rid)
    streams = req.streams
    stream_col: list[int] | int = streams[0] if streams and all(s == streams[0] for s in streams) else list(streams)
    seg = trace.segment_events
    return {
        "format": FORMAT,
        "schema": SCHEMA,
        "source": trace.source,
        "device": trace.device,
        "total_memory": trace.total_memory,
        "allocator_settings": trace.allocator_settings,
        "meta": trace.meta,
        "requests": {
            "n": len(req),
            "ops": "".join(map(str, req.ops)),
            "sizes": req.sizes,
            "free_back": free_back,
            "streams": stream_col,
            "event_index_delta": _deltas(req.event_index),
        },
        "segment_events": {
            "action": [e.action for e in seg],
            "addr": [e.addr for e in seg],
            "size": [e.size for e in seg],
            "stream": [e.stream for e in seg],
            "event_index": [e.event_index for e in seg],
            "request_index": [e.request_index for e in seg],
            "device_free": {str(k): e.device_free for k, e in enumerate(seg) if e.device_free is not None},
        },
    }


def from_compact_dict(d: dict[str, Any], *, source: str = "<compact>") -> Trace:
    """Rebuild a `Trace` (without raw events) from `to_compact_dict`'s output."""
    if d.get("format") != FORMAT:
        raise TraceError(f"{source}: not an alloctune compact trace (format {d.get('format')!r})")
    schema = d.get("schema")
    if schema != SCHEMA:
        raise TraceError(
            f"{source}: compact trace schema {schema!r} is not supported by this alloctune (reads schema {SCHEMA}); "
            "convert the original snapshot again with `alloctune trace convert`"
        )
    try:
        r = d["requests"]
        n = int(r["n"])
        ops = [int(c) for c in r["ops"]]
        sizes = [int(x) for x in r["sizes"]]
        streams = r["streams"]
        streams = [int(streams)] * n if isinstance(streams, int) else [int(x) for x in streams]
        event_index = _undeltas(r["event_index_delta"])
        free_back = iter(r["free_back"])
        rids: list[int] = []
        alloc_count = 0
        for op in ops:
            if op == ALLOC:
                rids.append(alloc_count)
                alloc_count += 1
            elif op == FREE:
                rids.append(alloc_count - 1 - int(next(free_back)))
            else:
                rids.append(-1)
        if not (len(ops) == len(sizes) == len(streams) == len(event_index) == n):
            raise ValueError("request columns have different lengths")
        s = d["segment_events"]
        cols = (s["action"], s["addr"], s["size"], s["stream"], s["event_index"], s["request_index"])
        if len({len(c) for c in cols}) > 1:
            raise ValueError("segment event columns have different lengths")
        dfree = {int(k): int(v) for k, v in s.get("device_free", {}).items()}
        seg = [
            SegmentEvent(str(a), int(ad), int(sz), int(st), int(ei), int(ri), dfree.get(k))
            for k, (a, ad, sz, st, ei, ri) in enumerate(zip(*cols))
        ]
        req = RequestStream(ops=ops, sizes=sizes, rids=rids, streams=streams, event_index=event_index)
        total = d.get("total_memory")
        return Trace(
            source=str(d.get("source") or source),
            device=int(d.get("device") or 0),
            requests=req,
            segment_events=seg,
            allocator_settings=dict(d.get("allocator_settings") or {}),
            events=[],
            meta=dict(d.get("meta") or {}),
            total_memory=int(total) if total else None,
        )
    except (KeyError, TypeError, ValueError, StopIteration) as exc:
        raise TraceError(f"{source}: the compact trace is damaged ({exc or type(exc).__name__}); convert it again") from exc


def save_compact(trace: Trace, path: str | Path) -> int:
    """Write `trace` as an xz-compressed compact file; returns the bytes written."""
    text = json.dumps(to_compact_dict(trace), separators=(",", ":"))
    blob = lzma.compress(text.encode(), preset=6)
    Path(path).write_bytes(blob)
    return len(blob)


def read_compact_header(path: str | Path) -> dict[str, Any]:
    """A compact file's settings and meta without building its request stream (for listings)."""
    try:
        d = json.loads(lzma.decompress(Path(path).read_bytes()))
    except (lzma.LZMAError, ValueError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: not a readable alloctune compact trace ({exc})") from exc
    if not isinstance(d, dict):
        raise TraceError(f"{path}: not an alloctune compact trace")
    return {k: d.get(k) for k in ("format", "schema", "source", "device", "total_memory", "allocator_settings", "meta")}


def trace_from_compact_bytes(data: bytes, *, source: str = "<compact>", device: int | None = None) -> Trace:
    """Parse decompressed compact-file bytes (used by `load_trace` after sniffing)."""
    try:
        d = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceError(f"{source}: the compact trace is not valid JSON ({exc}); convert it again") from exc
    if not isinstance(d, dict):
        raise TraceError(f"{source}: not an alloctune compact trace")
    trace = from_compact_dict(d, source=source)
    if device is not None and device != trace.device:
        raise TraceError(f"{source}: this compact trace holds device {trace.device} only, not device {device}")
    trace.source = source
    return trace


def _deltas(xs: list[int]) -> list[int]:
    prev = 0
    out = []
    for x in xs:
        out.append(x - prev)
        prev = x
    return out


def _undeltas(ds: list[int]) -> list[int]:
    acc = 0
    out = []
    for d in ds:
        acc += int(d)
        out.append(acc)
    return out
