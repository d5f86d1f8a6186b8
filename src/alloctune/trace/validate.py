"""Check what a snapshot or compact trace *says* before anything replays or reports it.

Why: a well-formed file can still be wrong (edited by hand, damaged by a tool that rewrote
it, or built to mislead): a negative size, a 200 GB allocation on a 140 GB card, a free of
a block that was never allocated. Replayed, such data gives a confident wrong answer with
exit 0. Every check here ends in one `TraceError` line naming the file, the place
(`device_traces[0][1234]`, `requests[17]`) and what is wrong.

Sizes are bounded by the device when its memory is known (the sidecar's or the trace's
`total_memory`) and by `MAX_DEVICE_BYTES` otherwise; a failed request (`oom`) may ask for
more than the device has, so it is only bounded by int64.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from alloctune.errors import TraceError
from alloctune.trace.model import ALLOC, EMPTY_CACHE, FAILED_ALLOC, FREE, Trace

# Larger than any GPU's memory (128 TiB); the bound when the device's size is unknown.
MAX_DEVICE_BYTES = 1 << 47
INT64 = (1 << 63) - 1
UINT64 = (1 << 64) - 1
# Every action torch 2.x records in device_traces.
ACTIONS = frozenset(
    {
        "alloc",
        "free_requested",
        "free_completed",
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
        "snapshot",
        "oom",
    }
)
SEGMENT_EVENT_ACTIONS = frozenset({"segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom"})
# allocator_settings is a flat record of a few knobs: bound its shape so nothing can hide in it.
MAX_SETTINGS_KEYS = 256
MAX_SETTINGS_ITEMS = 4096
_SCALARS = (type(None), bool, int, float, str)


def device_bound(total_memory: Any) -> int:
    """The largest size a successful allocation or segment can have on this device."""
    if type(total_memory) is int and 0 < total_memory <= MAX_DEVICE_BYTES:
        return total_memory
    return MAX_DEVICE_BYTES


def _is_count(value: Any, upper: int) -> bool:
    return type(value) is int and 0 <= value <= upper


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_settings(settings: Any, where: str) -> None:
    """`allocator_settings`: a dict of str -> scalar, or a flat list/dict of scalars."""
    if settings is None:
        return
    if not isinstance(settings, dict):
        raise TraceError(f"{where}: allocator_settings is a {type(settings).__name__}, expected a dict")
    if len(settings) > MAX_SETTINGS_KEYS:
        raise TraceError(f"{where}: allocator_settings has {len(settings)} keys; a real record has a few dozen")
    for key, value in settings.items():
        if not isinstance(key, str):
            raise TraceError(f"{where}: allocator_settings has a non-text key {_describe(key)}")
        if isinstance(value, _SCALARS):
            continue
        if not isinstance(value, (list, tuple, dict)):
            raise TraceError(f"{where}: allocator_settings[{key!r}] is a {type(value).__name__}")
        if len(value) > MAX_SETTINGS_ITEMS:
            raise TraceError(f"{where}: allocator_settings[{key!r}] has {len(value)} items; too many to be real")
        items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
        for k, v in items:
            if not isinstance(k, _SCALARS) or not isinstance(v, _SCALARS):
                raise TraceError(
                    f"{where}: allocator_settings[{key!r}][{_describe(k)}] is nested; "
                    "a real record holds only numbers and text there"
                )


def check_events(events: Any, where: str, bound: int) -> None:
    """One device's `device_traces` list: known actions, sizes/addresses/streams in range.

    `where` is e.g. `file: device_traces[0]`; an error names the event's index.
    """
    if not isinstance(events, list):
        raise TraceError(f"{where}: is a {type(events).__name__}, expected a list of events")
    actions = ACTIONS
    for i, ev in enumerate(events):
        if type(ev) is not dict:
            raise TraceError(f"{where}[{i}]: the entry is malformed: a {type(ev).__name__} where an event dict belongs")
        action = ev.get("action")
        if type(action) is not str or action not in actions:  # (a dict here is unhashable: test the type first)
            raise TraceError(f"{where}[{i}]: unknown action {_describe(action)} (known: {', '.join(sorted(actions))})")
        size = ev.get("size")
        if type(size) is not int or size < 0 or size > bound:
            if action == "oom" and _is_count(size, INT64):
                pass  # a failed request may ask for more than the device has
            elif action == "snapshot" and size is None:
                pass
            else:
                raise TraceError(
                    f"{where}[{i}] ({action}): size {_describe(size)} is not a byte count between 0 "
                    f"and {bound} (the device's memory)"
                )
        addr = ev.get("addr", 0)
        if type(addr) is not int or not 0 <= addr <= UINT64:
            raise TraceError(f"{where}[{i}] ({action}): addr {_describe(addr)} is not a device address")
        stream = ev.get("stream", 0)
        if type(stream) is not int or not 0 <= stream <= UINT64:
            raise TraceError(f"{where}[{i}] ({action}): stream {_describe(stream)} is not a stream handle")
        if action == "oom":
            free = ev.get("device_free")
            if free is not None and not _is_count(free, INT64):
                raise TraceError(f"{where}[{i}] (oom): device_free {_describe(free)} is not a byte count")


def check_snapshot(snapshot: dict[str, Any], source: str, total_memory: Any = None) -> None:
    """Every device's events and the allocator settings of a loaded snapshot."""
    bound = device_bound(total_memory)
    for dev, events in enumerate(snapshot["device_traces"]):
        check_events(events, f"{source}: device_traces[{dev}]", bound)
    check_settings(snapshot.get("allocator_settings"), source)
    check_segments(snapshot.get("segments"), source, bound)


_SEGMENT_INTS = ("address", "total_size", "allocated_size", "active_size", "requested_size", "device", "stream")
_BLOCK_INTS = ("address", "size", "requested_size")


def check_segments(segments: Any, source: str, bound: int) -> None:
    """The snapshot's final memory map (`segments`), as far as reports and diagnosis read it."""
    if segments is None:
        return
    if not isinstance(segments, list):
        raise TraceError(f"{source}: 'segments' is a {type(segments).__name__}, expected a list")
    for i, seg in enumerate(segments):
        where = f"{source}: segments[{i}]"
        if type(seg) is not dict:
            raise TraceError(f"{where}: a {type(seg).__name__} where a segment dict belongs")
        for key in _SEGMENT_INTS:
            if key in seg and not _is_count(seg[key], UINT64):
                raise TraceError(f"{where}: {key} {_describe(seg[key])} is not a non-negative integer")
        if "total_size" in seg and seg["total_size"] > bound:
            raise TraceError(f"{where}: total_size {seg['total_size']} does not fit the device ({bound} bytes)")
        for key in ("segment_type", "state"):
            if key in seg and not isinstance(seg[key], str):
                raise TraceError(f"{where}: {key} {_describe(seg[key])} is not text")
        blocks = seg.get("blocks", [])
        if not isinstance(blocks, list):
            raise TraceError(f"{where}: blocks is a {type(blocks).__name__}, expected a list")
        for j, block in enumerate(blocks):
            if type(block) is not dict:
                raise TraceError(f"{where}.blocks[{j}]: a {type(block).__name__} where a block dict belongs")
            for key in _BLOCK_INTS:
                if key in block and not _is_count(block[key], UINT64):
                    raise TraceError(f"{where}.blocks[{j}]: {key} {_describe(block[key])} is not a non-negative integer")
            if "state" in block and not isinstance(block["state"], str):
                raise TraceError(f"{where}.blocks[{j}]: state {_describe(block['state'])} is not text")


def check_trace(trace: Trace, where: str) -> None:
    """A decoded compact trace: request kinds, sizes, allocation ids and segment events consistent.

    The compact format stores only the request stream, so this is what stands between a
    damaged file and a replay that reports a wrong OOM: every FREE frees a live allocation
    of the same size, sizes fit the device, indices stay in range.
    """
    req = trace.requests
    bound = device_bound(trace.total_memory)
    if trace.total_memory is not None and not _is_count(trace.total_memory, MAX_DEVICE_BYTES):
        raise TraceError(f"{where}: total_memory {_describe(trace.total_memory)} is not a device size")
    if not _is_count(trace.device, 1 << 16):
        raise TraceError(f"{where}: device {_describe(trace.device)} is not a device index")
    check_settings(trace.allocator_settings, where)
    live: dict[int, int] = {}
    allocs = 0
    prev_event = 0
    for i, (op, size, rid, stream, ev) in enumerate(zip(req.ops, req.sizes, req.rids, req.streams, req.event_index)):
        if op == ALLOC:
            if not _is_count(size, bound):
                raise TraceError(
                    f"{where}: requests[{i}]: allocation of {_describe(size)} bytes does not fit the device ({bound} bytes)"
                )
            live[rid] = size
            allocs += 1
        elif op == FREE:
            if not 0 <= rid < allocs:
                raise TraceError(f"{where}: requests[{i}]: frees allocation {rid}, which does not exist")
            got = live.pop(rid, None)
            if got is None:
                raise TraceError(f"{where}: requests[{i}]: frees allocation {rid} twice")
            if got != size and size != -1:  # -1: a generated stream that does not restate the size (plan)
                raise TraceError(f"{where}: requests[{i}]: frees {size} bytes of allocation {rid}, which has {got}")
        elif op == EMPTY_CACHE:
            if size != -1:
                raise TraceError(f"{where}: requests[{i}]: empty_cache with size {_describe(size)}")
        elif op == FAILED_ALLOC:
            if not _is_count(size, INT64):
                raise TraceError(f"{where}: requests[{i}]: failed request of {_describe(size)} bytes")
        else:
            raise TraceError(f"{where}: requests[{i}]: unknown request kind {_describe(op)}")
        if not _is_count(stream, UINT64):
            raise TraceError(f"{where}: requests[{i}]: stream {_describe(stream)} is not a stream handle")
        if type(ev) is not int or ev < prev_event:
            raise TraceError(f"{where}: requests[{i}]: event index {_describe(ev)} goes backwards")
        prev_event = ev
    n = len(req.ops)
    for k, e in enumerate(trace.segment_events):
        if e.action not in SEGMENT_EVENT_ACTIONS:
            raise TraceError(f"{where}: segment_events[{k}]: unknown action {_describe(e.action)}")
        limit = INT64 if e.action == "oom" else bound
        if not _is_count(e.size, limit):
            raise TraceError(
                f"{where}: segment_events[{k}] ({e.action}): size {_describe(e.size)} does not fit the device ({bound} bytes)"
            )
        if not _is_count(e.addr, UINT64) or not _is_count(e.stream, UINT64):
            raise TraceError(f"{where}: segment_events[{k}] ({e.action}): address or stream out of range")
        if not -1 <= e.request_index <= n:
            raise TraceError(f"{where}: segment_events[{k}]: request index {e.request_index} is outside the {n} requests")
        if e.device_free is not None and not _is_count(e.device_free, INT64):
            raise TraceError(f"{where}: segment_events[{k}]: device_free {_describe(e.device_free)}")


def check_fallbacks(fallbacks: Mapping[int, Sequence[int]], n: int, where: str) -> None:
    """Fallback sizes: keyed by a request index, each a byte count."""
    for idx, sizes in fallbacks.items():
        if not 0 <= idx < n:
            raise TraceError(f"{where}: fallbacks: request index {idx} is outside the {n} requests")
        if not all(_is_count(s, INT64) for s in sizes):
            raise TraceError(f"{where}: fallbacks[{idx}]: sizes must be byte counts")
