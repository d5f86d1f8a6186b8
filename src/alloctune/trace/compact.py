"""alloctune's own trace file: small, safe to open, and quick to load.

A snapshot pickle carries per-event timestamps, stack frames and the final segment
map; replay needs none of that. The compact file keeps only the request stream, the
recorded segment events, the allocator settings and the run's meta, as xz-compressed
JSON (no pickle, so nothing in it can run code) with a `schema` version.

Columns are stored as they compress best: rids of ALLOC requests are implicit (they
count up from 0 in order), so only FREE rids are stored, as the distance back to the
allocation (`alloc count so far - 1 - rid`), which is small for short-lived tensors;
`event_index` is stored as deltas (mostly 1 or 2).

Schema 2 puts a header line before the JSON inside the xz stream:
`alloctune-trace 2 sha256=<hex of the JSON> bytes=<its length>`, so a file damaged or
edited after it was written is refused before it is parsed, and every decoded trace is
checked for consistency (`validate.check_trace`) whatever its schema. Schema 1 files
(plain JSON) are still read.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import re
from pathlib import Path
from typing import Any

from alloctune.errors import TraceError
from alloctune.trace.limits import Limits
from alloctune.trace.model import (
    ALLOC,
    FREE,
    MAX_ANNOTATION_NAME,
    MAX_ANNOTATIONS,
    MAX_FRAMES,
    MAX_FRAMES_PER_STACK,
    MAX_STACKS,
    Annotation,
    RequestStream,
    SegmentEvent,
    StackTable,
    Trace,
)
from alloctune.trace.validate import check_fallbacks, check_trace

SCHEMA = 2
READABLE_SCHEMAS = (1, 2)
FORMAT = "alloctune-trace"
COMPACT_MAGIC = FORMAT.encode()  # schema 1: near the start of the JSON text (first key)
HEADER_PREFIX = COMPACT_MAGIC + b" "  # schema 2: the first bytes of the decompressed file
_HEADER = re.compile(rb"alloctune-trace (\d+) sha256=([0-9a-f]{64}) bytes=(\d+)\n")


def is_compact(data: bytes | bytearray) -> bool:
    """Whether decompressed bytes are an alloctune compact trace (either schema)."""
    return data.startswith(HEADER_PREFIX) or (data[:64].lstrip()[:1] == b"{" and COMPACT_MAGIC in data[:200])


def encode(trace: Trace) -> bytes:
    """The decompressed bytes of a schema-2 file: header line + JSON."""
    body = json.dumps(to_compact_dict(trace), separators=(",", ":")).encode()
    head = f"{FORMAT} {SCHEMA} sha256={hashlib.sha256(body).hexdigest()} bytes={len(body)}\n".encode()
    return head + body


def _body(data: bytes | bytearray, source: str) -> bytes | bytearray:
    """The JSON of a compact file, its header and checksum verified (schema 1: the data itself)."""
    if not data.startswith(HEADER_PREFIX):
        return data
    m = _HEADER.match(data, 0, 200)
    if m is None:
        raise TraceError(
            f"{source}: the compact trace header is damaged (expected "
            f"'{FORMAT} <schema> sha256=<hex> bytes=<n>'); convert the original snapshot again"
        )
    schema, digest, length = int(m.group(1)), m.group(2).decode(), int(m.group(3))
    if schema not in READABLE_SCHEMAS:
        raise TraceError(
            f"{source}: compact trace schema {schema} is not supported by this alloctune (reads schema {SCHEMA}); "
            "convert the original snapshot again with `alloctune trace convert`"
        )
    body = data[m.end() :]
    if len(body) != length:
        raise TraceError(
            f"{source}: the compact trace is {len(body)} bytes after its header, the header says "
            f"{length}: truncated or damaged; convert the original snapshot again"
        )
    if hashlib.sha256(body).hexdigest() != digest:
        raise TraceError(
            f"{source}: the compact trace fails its sha256 checksum: damaged or edited after it was "
            "written; convert the original snapshot again"
        )
    return body


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
            **({"fallbacks": {str(k): list(v) for k, v in sorted(req.fallbacks.items())}} if req.fallbacks else {}),
        },
        **({"stacks": _stacks_dict(req)} if req.stack_table is not None else {}),
        **({"annotations": [[a.name, a.start, a.end] for a in req.annotations]} if req.annotations else {}),
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
    if schema not in READABLE_SCHEMAS:
        raise TraceError(
            f"{source}: compact trace schema {schema!r} is not supported by this alloctune (reads schema {SCHEMA}); "
            "convert the original snapshot again with `alloctune trace convert`"
        )
    try:
        r = d["requests"]
        n = _count(r["n"])
        if not isinstance(r["ops"], str) or len(r["ops"]) != n:
            raise ValueError(f"the request count {n} differs from the {len(r['ops'])} request kinds stored")
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
        if next(free_back, None) is not None:
            raise ValueError("more frees stored than FREE requests")
        fallbacks = {int(k): tuple(int(x) for x in v) for k, v in (r.get("fallbacks") or {}).items()}
        req = RequestStream(ops=ops, sizes=sizes, rids=rids, streams=streams, event_index=event_index, fallbacks=fallbacks)
        if d.get("stacks") is not None:
            req.stack_table, req.stack_ids = _stacks_from_dict(d["stacks"], ops)
        req.annotations = _annotations_from_list(d.get("annotations") or [], n)
        total = d.get("total_memory")
        trace = Trace(
            source=str(d.get("source") or source),
            device=int(d.get("device") or 0),
            requests=req,
            segment_events=seg,
            allocator_settings=dict(d.get("allocator_settings") or {}),
            events=[],
            meta=dict(d.get("meta") or {}),
            total_memory=int(total) if total else None,
        )
    except (KeyError, TypeError, ValueError, StopIteration, AttributeError) as exc:
        raise TraceError(f"{source}: the compact trace is damaged ({exc or type(exc).__name__}); convert it again") from exc
    check_trace(trace, source)
    check_fallbacks(trace.requests.fallbacks, len(trace.requests), source)
    return trace


def _stacks_dict(req: RequestStream) -> dict[str, Any]:
    """The stack table (schema 2, optional key `stacks`): frames once as [filename, line, function],
    stacks as lists of frame ids (innermost first), and one stack id per ALLOC request in order."""
    t = req.stack_table
    assert t is not None
    ids = req.stack_ids or [-1] * len(req.ops)
    return {
        "frames": [list(f) for f in t.frames],
        "stacks": [list(s) for s in t.stacks],
        "alloc_stack": [sid for op, sid in zip(req.ops, ids) if op == ALLOC],
        "dropped": t.dropped,
    }


def _stacks_from_dict(d: Any, ops: list[int]) -> tuple[StackTable, list[int]]:
    """Read `_stacks_dict`'s output back, every index checked (a damaged table is a `ValueError`)."""
    if not isinstance(d, dict):
        raise ValueError("the stack table is not an object")
    raw_frames, raw_stacks, per_alloc = d.get("frames"), d.get("stacks"), d.get("alloc_stack")
    if not (isinstance(raw_frames, list) and isinstance(raw_stacks, list) and isinstance(per_alloc, list)):
        raise ValueError("the stack table's frames, stacks and alloc_stack must be lists")
    if len(raw_frames) > MAX_FRAMES or len(raw_stacks) > MAX_STACKS:
        raise ValueError("the stack table is larger than alloctune keeps")
    frames = []
    for f in raw_frames:
        if not (isinstance(f, list) and len(f) == 3 and type(f[0]) is str and type(f[1]) is int and type(f[2]) is str):
            raise ValueError("a frame of the stack table is not [filename, line, function]")
        frames.append((f[0], f[1], f[2]))
    nf = len(frames)
    stacks = []
    for st in raw_stacks:
        if not (isinstance(st, list) and len(st) <= MAX_FRAMES_PER_STACK and all(type(x) is int and 0 <= x < nf for x in st)):
            raise ValueError("a stack of the stack table names frames that do not exist")
        stacks.append(tuple(st))
    ns = len(stacks)
    allocs = [r for r, op in enumerate(ops) if op == ALLOC]
    if len(per_alloc) != len(allocs) or not all(type(x) is int and -1 <= x < ns for x in per_alloc):
        raise ValueError("alloc_stack does not give one valid stack id per allocation")
    ids = [-1] * len(ops)
    for r, sid in zip(allocs, per_alloc):
        ids[r] = sid
    dropped = d.get("dropped")
    return StackTable(frames, stacks, dropped if isinstance(dropped, str) else None), ids


def _annotations_from_list(raw: Any, n: int) -> list[Annotation]:
    """Read the stored annotations back: [name, start, end] each, a range of the n requests."""
    if not isinstance(raw, list) or len(raw) > MAX_ANNOTATIONS:
        raise ValueError("the annotations are not a list of at most MAX_ANNOTATIONS ranges")
    out = []
    for a in raw:
        if not (
            isinstance(a, list)
            and len(a) == 3
            and type(a[0]) is str
            and len(a[0]) <= MAX_ANNOTATION_NAME
            and type(a[1]) is int
            and type(a[2]) is int
            and 0 <= a[1] <= a[2] <= n
        ):
            raise ValueError("an annotation is not [name, start, end] within the requests")
        out.append(Annotation(a[0], a[1], a[2]))
    return out


def _count(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"request count {value!r} is not a count")
    return value


def save_compact(trace: Trace, path: str | Path) -> int:
    """Write `trace` as an xz-compressed compact file (schema 2); returns the bytes written."""
    blob = lzma.compress(encode(trace), preset=6)
    Path(path).write_bytes(blob)
    return len(blob)


def read_compact_header(path: str | Path) -> dict[str, Any]:
    """A compact file's settings and meta without building its request stream (for listings)."""
    from alloctune.trace.safe_pickle import read_decompressed

    data = read_decompressed(path, Limits.from_env())
    try:
        d = json.loads(_body(data, str(path)))
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: not a readable alloctune compact trace ({exc})") from exc
    if not isinstance(d, dict):
        raise TraceError(f"{path}: not an alloctune compact trace")
    return {k: d.get(k) for k in ("format", "schema", "source", "device", "total_memory", "allocator_settings", "meta")}


def trace_from_compact_bytes(data: bytes | bytearray, *, source: str = "<compact>", device: int | None = None) -> Trace:
    """Parse decompressed compact-file bytes (used by `load_trace` after sniffing)."""
    data = _body(data, source)
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
