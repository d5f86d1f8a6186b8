"""Loading a recording before anyone asks for it.

A recorded run writes its snapshot at exit, then the process still tears down (the interpreter,
the CUDA context) while its caller waits. Loading the snapshot is a second of CPU work on a large
recording, and tune's next runs wait for the simulation it feeds. `trace.prefetch_trace(path)`
starts that load here, in a thread, as soon as the whole file is there; the next `load_trace` of
the same file (same path, size and modification time) takes the result instead of loading again,
or its error.

At most one load is pending: a newer prefetch drops the older one, so a trace nobody takes costs
memory for one recording, never more.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Callable

from alloctune.trace.model import Trace

_Key = tuple[str, int, int, int | None, bool]

_LOCK = threading.Lock()
_PENDING: dict[_Key, Future[Trace]] = {}


def _key(path: str | Path, device: int | None, partial: bool) -> _Key | None:
    """What identifies one load: the file as it is now, the device and the partial flag."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns, device, partial)


def start(path: str | Path, device: int | None, partial: bool, load: Callable[[str | Path, int | None, bool], Trace]) -> None:
    """Start `load(path, device, partial)` in a daemon thread (nothing if the file is missing)."""
    key = _key(path, device, partial)
    if key is None:
        return
    with _LOCK:
        if key in _PENDING:
            return
        _PENDING.clear()
        fut: Future[Trace] = Future()
        _PENDING[key] = fut

    def work() -> None:
        try:
            fut.set_result(load(path, device, partial))
        except BaseException as exc:  # noqa: BLE001 - handed to the load that takes it
            fut.set_exception(exc)

    threading.Thread(target=work, name="alloctune-prefetch", daemon=True).start()


def take(path: str | Path, device: int | None, partial: bool) -> Future[Trace] | None:
    """The pending load of exactly this file, device and flag (removed from the pending ones), else None."""
    key = _key(path, device, partial)
    if key is None:
        return None
    with _LOCK:
        return _PENDING.pop(key, None)
