"""Load a recorded allocator history into a `Trace`.

Accepts what `torch.cuda.memory._dump_snapshot` writes (`.pickle`, also gzip/xz/bz2
compressed: the content is sniffed, not the suffix) and alloctune's own compact format
(`alloctune.trace.compact`). Every way a file can be unusable ends in one `TraceError`
line that says what to do, because these files come from users' bug reports: a text log given
where a recording belongs is named as one, with the command that reads it (`diagnose`).
A path that does not exist but names a shipped trace (`rvc_h200`, see `alloctune demo --list`)
loads that trace (`trace.shipped`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alloctune.errors import TraceError, UnsafePickleError
from alloctune.trace.annotated_ranges import collect_annotations
from alloctune.trace.compact import is_compact, trace_from_compact_bytes
from alloctune.trace.content import SNIFF_BYTES, Content, sniff_content
from alloctune.trace.model import Trace
from alloctune.trace.safe_pickle import load_pickle_bytes, read_decompressed
from alloctune.trace.sidecar import read_sidecar  # noqa: F401  (re-exported: where callers look for it)
from alloctune.trace.stream import build_stream, run_record, stream_context, with_run_record
from alloctune.trace.validate import check_events, check_settings, check_snapshot, device_bound

_RECORD_HINT = (
    "call torch.cuda.memory._record_memory_history(max_entries=5_000_000) before the workload "
    "and torch.cuda.memory._dump_snapshot(path) after it"
)


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """The snapshot dict of a `_dump_snapshot` file, unpickled without trusting it.

    Raises `TraceError` if the file is missing, damaged, or not a snapshot, and
    `UnsafePickleError` if the pickle asks for any class or function. `path` may be the name
    of a shipped trace (which, being compact, is then refused with the way to go on).
    """
    path = _existing_recording(path)
    data = read_decompressed(path)
    side = read_sidecar(path)
    if is_compact(data):
        raise TraceError(
            f"{path}: an alloctune compact trace keeps the request stream, not the snapshot's memory map; "
            "give the original _dump_snapshot file, or simulate it "
            f"(alloctune simulate {path} --json > sim.json) and report on that"
        )
    return _snapshot_from_bytes(data, str(path), side.get("total_memory"))


def _existing_recording(path: str | Path) -> str | Path:
    """`path` as given when it exists (messages keep the user's spelling), else the shipped trace it
    names; a `TraceError` naming both readings when it is neither."""
    from alloctune.trace.shipped import shipped_path, unknown_name_hint

    if Path(path).exists():
        return path
    found = shipped_path(str(path))
    if found is None:
        raise TraceError(f"{path}: no such file: {unknown_name_hint()}")
    return found


def _not_a_recording(content: Content, source: str) -> TraceError | None:
    """The one line for content that is certainly no recording (a text log, JSON, a PNG, a ZIP...),
    None for what may be one (a pickle, or binary data the pickle reader words best)."""
    if content.kind == "text" and content.what != "empty":
        if content.what == "JSON":
            return TraceError(
                f"{source} is JSON, not a recording: a recording is a torch memory snapshot "
                "(torch.cuda.memory._dump_snapshot) or an alloctune trace (.atrace); results of "
                f"simulate --json and tune stores go to `alloctune report {source}`"
            )
        return TraceError(f"{source} is a text log, not a recording: try `alloctune diagnose {source}`")
    if content.kind == "other" and content.magic:
        return TraceError(
            f"{source} is {content.what}, not a recording: expected a torch memory snapshot "
            "(torch.cuda.memory._dump_snapshot) or an alloctune trace (.atrace)"
        )
    return None


def _well_formed_global(exc: UnsafePickleError) -> bool:
    """Whether a refused pickle named a real-looking global (`os.system`): a tampered pickle, worth
    saying so, rather than a log whose first line happened to start with a pickle opcode."""
    import re

    return bool(exc.refused) and re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", str(exc.refused)) is not None


def _snapshot_from_bytes(data: bytes | bytearray, source: str, total_memory: Any = None) -> dict[str, Any]:
    """Unpickle safely, then check every event (`validate.check_snapshot`): bad data is one line.

    Content that is certainly not a recording is refused before unpickling; text is first tried
    as a pickle all the same (protocols 0 and 1 are ASCII), and named a log only when that fails.
    """
    content = sniff_content(data[:SNIFF_BYTES])
    refusal = _not_a_recording(content, source)
    if refusal is not None and content.kind != "text":
        raise refusal
    try:
        obj = load_pickle_bytes(data, source=source)
    except TraceError as exc:
        if isinstance(exc, UnsafePickleError) and _well_formed_global(exc):
            raise
        if refusal is not None:
            raise refusal from None
        if content.kind == "other":  # no pickle header and unreadable as one: say what it is not
            detail = str(exc).removeprefix(f"{source}: ")
            raise TraceError(
                f"{source} is binary data that is neither a torch memory snapshot nor an alloctune trace ({detail})"
            ) from None
        raise
    if not isinstance(obj, dict) or "device_traces" not in obj:
        what = f"a dict with keys {sorted(map(str, obj))[:6]}" if isinstance(obj, dict) else type(obj).__name__
        raise TraceError(
            f"{source}: not a memory snapshot (found {what}, no 'device_traces'); "
            "expected a file written by torch.cuda.memory._dump_snapshot"
        )
    if not isinstance(obj["device_traces"], list):
        raise TraceError(f"{source}: 'device_traces' is not a list; the snapshot is damaged")
    check_snapshot(obj, source, total_memory)
    return obj


def devices_with_events(snapshot: dict[str, Any]) -> list[int]:
    """Indices of the devices whose history holds at least one event."""
    return [d for d, evs in enumerate(snapshot["device_traces"]) if evs]


def pick_device(snapshot: dict[str, Any], device: int | None, source: str) -> int:
    """The device to read: the one given, or the only one with events."""
    traces = snapshot["device_traces"]
    have = devices_with_events(snapshot)
    if device is not None:
        if not 0 <= device < len(traces):
            raise TraceError(
                f"{source}: device {device} is out of range: the snapshot has {len(traces)} device(s) "
                f"(0..{len(traces) - 1}); devices with events: {_fmt_devices(have)}"
            )
        if not traces[device]:
            raise TraceError(f"{source}: device {device} has no recorded events; devices with events: {_fmt_devices(have)}")
        return device
    if not have:
        raise TraceError(f"{source}: the snapshot has no allocation history (empty device_traces); {_RECORD_HINT}")
    if len(have) > 1:
        raise TraceError(
            f"{source}: events were recorded on several devices ({_fmt_devices(have)}); "
            "choose one with --device N (device= in Python)"
        )
    return have[0]


def _fmt_devices(devs: list[int]) -> str:
    return ", ".join(map(str, devs)) if devs else "none"


def trace_from_snapshot(
    snapshot: dict[str, Any],
    device: int | None = None,
    *,
    source: str = "<snapshot>",
    meta: dict[str, Any] | None = None,
    partial: bool = False,
    _checked: bool = False,
) -> Trace:
    """Build a `Trace` from an already-loaded snapshot dict (see `load_trace`).

    The device's events and the settings are validated (`validate.check_events`) unless
    the snapshot came through `_snapshot_from_bytes`, which already did.
    """
    dev = pick_device(snapshot, device, source)
    meta = with_run_record(run_record(snapshot, source), meta)
    events = snapshot["device_traces"][dev]
    settings = snapshot.get("allocator_settings") or {}
    if not _checked:
        check_events(events, f"{source}: device_traces[{dev}]", device_bound((meta or {}).get("total_memory")))
        check_settings(settings, source)
    try:
        built = build_stream(events, settings, source=source, **stream_context(snapshot, meta, source=source))
    except (KeyError, TypeError, AttributeError) as exc:
        raise TraceError(
            f"{source}: a device_traces entry is malformed ({type(exc).__name__}: {exc}); the snapshot is damaged"
        ) from exc
    if not partial and (built.unmatched_frees or built.unmatched_segment_frees):
        raise TraceError(
            f"{source}: the history is incomplete: {built.unmatched_frees} free(s) and "
            f"{built.unmatched_segment_frees} segment release(s) of memory whose allocation is not in the trace "
            f"(first at event {built.first_unmatched_index}); the ring buffer wrapped around (raise max_entries in "
            "torch.cuda.memory._record_memory_history) or recording started after the workload began "
            "(start it before the first allocation)"
        )
    collect_annotations(snapshot.get("external_annotations"), events, built.requests, dev, source)
    total = meta.get("total_memory")
    return Trace(
        source=source,
        device=dev,
        requests=built.requests,
        segment_events=built.segment_events,
        allocator_settings=dict(settings),
        events=events,
        meta=meta,
        total_memory=int(total) if isinstance(total, int) and total > 0 else None,
    )


def load_trace(path: str | Path, device: int | None = None, *, partial: bool = False) -> Trace:
    """Load a snapshot (or an alloctune compact trace) as a `Trace` of one device.

    `path` may also be the name of a shipped trace (`rvc_h200`; a file of that name wins).
    `device`: required only when several devices have events. `partial=True` accepts a
    history whose beginning is missing (frees of unknown blocks are dropped); replaying
    such a stream starts from an empty allocator, so only use it for inspection.
    A sidecar `NAME.json` next to the file becomes `Trace.meta` (and `total_memory`).
    A loaded snapshot is cached in compact form, keyed by its content (`trace/cache.py`); a load
    `prefetch_trace` started of this very file is taken instead of loading again.
    """
    from alloctune.trace.prefetch import take

    found = _existing_recording(path)
    pending = take(found, device, partial)
    if pending is not None:
        return pending.result()
    return load_through_cache(found, device, partial)


def prefetch_trace(path: str | Path, device: int | None = None, *, partial: bool = False) -> None:
    """Start loading `path` in a thread; the next `load_trace` of this very file takes the result
    (`trace/prefetch.py`). Nothing happens if the file does not exist."""
    from alloctune.trace.prefetch import start

    start(path, device, partial, load_through_cache)


def load_through_cache(path: str | Path, device: int | None, partial: bool) -> Trace:
    """`load_trace` of an existing file, without looking for a prefetched load (what a prefetch runs)."""
    from alloctune.trace.cache import load_cached

    return load_cached(path, device, partial, _load_trace)


def _load_trace(path: str | Path, device: int | None, partial: bool) -> Trace:
    data = read_decompressed(path)
    source = str(path)
    side = read_sidecar(path)
    if is_compact(data):
        trace = trace_from_compact_bytes(data, source=source, device=device)
        if side and not trace.meta:
            trace.meta = side
        return trace
    snapshot = _snapshot_from_bytes(data, source, side.get("total_memory"))
    return trace_from_snapshot(snapshot, device, source=source, meta=side, partial=partial, _checked=True)
