"""A cache of loaded snapshots in alloctune's compact form, keyed by the file's content.

Why: unpickling (safely) and rebuilding the request stream of a snapshot costs 1-5 s, the
compact form of the same trace loads several times faster, and users load the same
recording again and again (simulate, then tune, then report). The key is the SHA-256 of the
file's bytes plus the device, the `partial` flag and a fingerprint of the code that builds a
trace (so a fixed stream builder never serves a stale entry). Entries live in
`$ALLOCTUNE_CACHE_DIR`, else `$XDG_CACHE_HOME/alloctune`, else `~/.cache/alloctune`;
`ALLOCTUNE_CACHE=0` turns the cache off. A cache that cannot be written or read is skipped
silently: it only ever saves time.

A trace served from the cache is what the compact format holds: the request stream (alloc
ids renumbered in order, which replay does not see), the recorded segment events, settings
and meta. The snapshot's raw `events` are not cached: `Trace.events` is then a lazy sequence
that loads them from the file on first use (refusing a file whose content changed), so code
that reads them still works and code that does not never pays for them. The sidecar
`NAME.json` is read afresh on every load.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Iterator

from alloctune.errors import TraceError
from alloctune.trace.model import Trace

_FINGERPRINT: str | None = None


def cache_dir() -> Path | None:
    """Where entries live, or None when the cache is off."""
    if os.environ.get("ALLOCTUNE_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    explicit = os.environ.get("ALLOCTUNE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "alloctune"


def _fingerprint() -> str:
    """Hash of the modules that turn a snapshot into a Trace: a change to them invalidates entries."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        h = hashlib.sha256()
        here = Path(__file__).resolve().parent
        for name in ("load.py", "stream.py", "compact.py", "model.py", "cache.py"):
            try:
                h.update((here / name).read_bytes())
            except OSError:
                h.update(name.encode())
        _FINGERPRINT = h.hexdigest()[:16]
    return _FINGERPRINT


class LazyEvents(Sequence):
    """A cached trace's raw snapshot events, loaded from the original file on first use."""

    def __init__(self, load: Callable[[], list[dict[str, Any]]]) -> None:
        self._load: Callable[[], list[dict[str, Any]]] | None = load
        self._events: list[dict[str, Any]] = []

    def _get(self) -> list[dict[str, Any]]:
        if self._load is not None:
            self._events = self._load()
            self._load = None
        return self._events

    def __getitem__(self, i: Any) -> Any:
        return self._get()[i]

    def __len__(self) -> int:
        return len(self._get())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._get())

    def __eq__(self, other: object) -> bool:
        return self._get() == (other._get() if isinstance(other, LazyEvents) else other)

    def __repr__(self) -> str:
        return "LazyEvents(not loaded)" if self._load is not None else f"LazyEvents({len(self._events)} events)"


def _content_hash(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None  # the loader says what is wrong with the file


def _entry(digest: str, device: int | None, partial: bool) -> Path | None:
    root = cache_dir()
    if root is None:
        return None
    key = hashlib.sha256(f"{digest}|{device}|{partial}|{_fingerprint()}".encode()).hexdigest()
    return root / f"{key}.atrace"


def load_cached(
    path: str | Path,
    device: int | None,
    partial: bool,
    load: Callable[[str | Path, int | None, bool], Trace],
) -> Trace:
    """`load(path, device, partial)` through the cache (the hook `trace.load.load_trace` calls)."""
    from alloctune.trace.compact import to_compact_dict, trace_from_compact_bytes
    from alloctune.trace.sidecar import read_sidecar
    from alloctune.trace.stream import with_run_record

    digest = _content_hash(Path(path)) if cache_dir() is not None else None
    entry = _entry(digest, device, partial) if digest is not None else None
    if entry is not None and entry.is_file():
        try:
            trace = trace_from_compact_bytes(lzma.decompress(entry.read_bytes()), source=str(path))
        except (OSError, lzma.LZMAError, TraceError):
            _remove(entry)
        else:
            # The snapshot's own run record (part of its content, cached with it) under the sidecar as it is now.
            recorded = trace.meta.get("run_record")
            trace.meta = with_run_record(recorded if isinstance(recorded, dict) else {}, read_sidecar(path) or {})
            total = trace.meta.get("total_memory")
            trace.total_memory = int(total) if isinstance(total, int) and total > 0 else None
            trace.events = LazyEvents(lambda: _raw_events(path, device, partial, digest, load))  # type: ignore[assignment]
            return trace
    trace = load(path, device, partial)
    if entry is not None and trace.events:  # from a snapshot (a compact file is already fast)
        try:
            text = json.dumps(to_compact_dict(trace), separators=(",", ":")).encode()
            entry.parent.mkdir(parents=True, exist_ok=True)
            tmp = entry.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")  # one writer per name (processes, threads)
            tmp.write_bytes(lzma.compress(text, preset=0))
            os.replace(tmp, entry)  # atomic: a concurrent reader sees all or nothing
        except OSError:
            pass
    return trace


def _raw_events(
    path: str | Path, device: int | None, partial: bool, digest: str | None, load: Callable[[str | Path, int | None, bool], Trace]
) -> list[dict[str, Any]]:
    if _content_hash(Path(path)) != digest:
        raise TraceError(f"{path}: the file changed since it was loaded; load it again")
    return list(load(path, device, partial).events)


def _remove(entry: Path) -> None:
    try:
        entry.unlink()
    except OSError:
        pass
