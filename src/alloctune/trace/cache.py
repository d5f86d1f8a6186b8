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
and meta; the raw `events` list of the snapshot is not kept (nothing downstream reads it).
The sidecar `NAME.json` is read afresh on every load.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
from pathlib import Path
from typing import Callable

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


def _entry(path: Path, device: int | None, partial: bool) -> Path | None:
    root = cache_dir()
    if root is None:
        return None
    try:
        raw = path.read_bytes()
    except OSError:
        return None  # the loader says what is wrong with the file
    h = hashlib.sha256(raw)
    h.update(f"|{device}|{partial}|{_fingerprint()}".encode())
    return root / f"{h.hexdigest()}.atrace"


def load_cached(
    path: str | Path, device: int | None, partial: bool,
    load: Callable[[str | Path, int | None, bool], Trace],
) -> Trace:
    """`load(path, device, partial)` through the cache (the hook `trace.load.load_trace` calls)."""
    from alloctune.trace.compact import to_compact_dict, trace_from_compact_bytes
    from alloctune.trace.load import read_sidecar

    entry = _entry(Path(path), device, partial)
    if entry is not None and entry.is_file():
        try:
            trace = trace_from_compact_bytes(lzma.decompress(entry.read_bytes()), source=str(path))
        except (OSError, lzma.LZMAError, TraceError):
            _remove(entry)
        else:
            trace.meta = read_sidecar(path) or {}
            total = trace.meta.get("total_memory")
            trace.total_memory = int(total) if isinstance(total, int) and total > 0 else None
            return trace
    trace = load(path, device, partial)
    if entry is not None and trace.events:  # from a snapshot (a compact file is already fast)
        try:
            text = json.dumps(to_compact_dict(trace), separators=(",", ":")).encode()
            entry.parent.mkdir(parents=True, exist_ok=True)
            tmp = entry.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(lzma.compress(text, preset=0))
            os.replace(tmp, entry)  # atomic: a concurrent reader sees all or nothing
        except OSError:
            pass
    return trace


def _remove(entry: Path) -> None:
    try:
        entry.unlink()
    except OSError:
        pass
