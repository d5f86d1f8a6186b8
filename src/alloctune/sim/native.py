"""Which replay core runs: the native one (`_native.c`) when it was built, else the Python model.

The Python model (`allocator.py` + the loop in `replay.py`) is the specification; the native
core is the same loop, rule for rule, ~20-50x faster, and the differential tests
(`tests/test_sim_native.py`) hold it to identical results. `ALLOCTUNE_SIM=python` forces the
Python model, `ALLOCTUNE_SIM=native` requires the native core (an error if it is missing).
When the core is missing and not forced either way, that is said once per process (a log
warning), not on every replay.
"""

from __future__ import annotations

import logging
import os
from array import array
from types import ModuleType
from typing import TYPE_CHECKING, Any

from alloctune.errors import ConfigError

if TYPE_CHECKING:
    from alloctune.sim.blocks import SimAction

log = logging.getLogger("alloctune.sim")
_warned = False

ACTIONS: tuple[SimAction, ...] = ("segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom")
Columns = tuple["array[int]", "array[int]", "array[int]", "array[int]"]  # ops, sizes, rids, streams as int64


def _load() -> ModuleType | None:
    try:
        from alloctune.sim import _native
    except ImportError:
        return None
    return _native


_MODULE = _load()


def available() -> bool:
    """True when the native core was built for this interpreter."""
    return _MODULE is not None


def core() -> ModuleType | None:
    """The native module to use for this replay, or None for the Python model (see module doc)."""
    global _warned
    choice = os.environ.get("ALLOCTUNE_SIM", "auto").strip().lower()
    if choice == "python":
        return None
    if choice == "native":
        if _MODULE is None:
            raise ConfigError("ALLOCTUNE_SIM=native but the native simulator core is not built "
                                 "(reinstall with a C compiler, or unset ALLOCTUNE_SIM)")
        return _MODULE
    if choice not in ("auto", ""):
        raise ConfigError(f"ALLOCTUNE_SIM must be 'auto', 'native' or 'python', not {choice!r}")
    if _MODULE is None and not _warned:
        _warned = True
        log.warning("alloctune: no native simulator core; using the Python model (slower)")
    return _MODULE


def columns(req: Any) -> Columns | None:
    """The request stream as int64 arrays (the native core's input), or None when a value does
    not fit in 64 bits (then the Python model replays it).

    The arrays are cached on the stream object, keyed by the column objects and their length,
    so a sweep of many settings converts the columns once.
    """
    key = (id(req.ops), id(req.sizes), id(req.rids), id(req.streams), len(req.ops))
    cached: tuple[tuple[int, ...], Columns] | None = getattr(req, "_native_columns", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    try:
        cols = (array("q", req.ops), array("q", req.sizes), array("q", req.rids), array("q", req.streams))
    except (OverflowError, TypeError):
        return None
    try:
        req._native_columns = (key, cols)
    except AttributeError:  # a stream type with __slots__: no cache, still correct
        pass
    return cols
