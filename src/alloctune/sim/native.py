"""Which replay core runs: the native one (`_native.c`) when it was built, else the Python model.

The Python model (`allocator.py` + the loop in `session.PySession`, the address models in
`driver.py`) is the specification; the native core is the same loop and models, rule for rule,
~20-50x faster, and the differential tests (`tests/test_sim_native.py`,
`tests/test_explain_speed_sessions.py`) hold it to identical results. `ALLOCTUNE_SIM=python`
forces the Python model, `ALLOCTUNE_SIM=native` requires the native core (an error if it is
missing). When the core is missing and not forced either way, that is said once per process (a
log warning), not on every replay. Besides replays, the core makes the int64 columns it reads
(`columns`) and copies a rewritten request stream (`splice`, for `remedy.model.spliced`).
"""

from __future__ import annotations

import logging
import os
from array import array
from types import ModuleType
from typing import TYPE_CHECKING, Any, Union

from alloctune.errors import ConfigError

if TYPE_CHECKING:
    from alloctune.sim.blocks import SimAction

log = logging.getLogger("alloctune.sim")
_warned = False

ACTIONS: tuple[SimAction, ...] = ("segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom")
Int64s = Union["array[int]", memoryview]  # a column as int64 values (format "q")
Columns = tuple[Int64s, Int64s, Int64s, Int64s]  # ops, sizes, rids, streams as int64


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
            raise ConfigError(
                "ALLOCTUNE_SIM=native but the native simulator core is not built "
                "(reinstall with a C compiler, or unset ALLOCTUNE_SIM)"
            )
        return _MODULE
    if choice not in ("auto", ""):
        raise ConfigError(f"ALLOCTUNE_SIM must be 'auto', 'native' or 'python', not {choice!r}")
    if _MODULE is None and not _warned:
        _warned = True
        log.warning("alloctune: no native simulator core; using the Python model (slower)")
    return _MODULE


def columns(req: Any) -> Columns | None:
    """The request stream as int64 columns (the native core's input: arrays, or memoryviews of
    format "q"), or None when a value does not fit in 64 bits (then the Python model replays it).

    The arrays are cached on the stream object, keyed by the column objects and their length,
    so a sweep of many settings converts the columns once.
    """
    key = (id(req.ops), id(req.sizes), id(req.rids), id(req.streams), len(req.ops))
    cached: tuple[tuple[int, ...], Columns] | None = getattr(req, "_native_columns", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    try:
        cols = (_int64(req.ops), _int64(req.sizes), _int64(req.rids), _int64(req.streams))
    except (OverflowError, TypeError):
        return None
    try:
        req._native_columns = (key, cols)
    except AttributeError:  # a stream type with __slots__: no cache, still correct
        pass
    return cols


def _int64(values: Any) -> Int64s:
    """`array("q", values)`; a list of plain ints is converted by the native core (a few times faster:
    no per-item argument parsing; the bytes it makes are read as int64 in place), anything else (or a
    value beyond int64) by `array` itself."""
    if _MODULE is not None and type(values) is list:
        raw = _MODULE.int64(values)
        if raw is not None:
            return memoryview(raw).cast("q")
    return array("q", values)


def share_columns(src: Any, dst: Any) -> None:
    """Give stream `dst` the arrays `columns` made for stream `src` when both hold the very same
    four column lists (a copy with other fallbacks, say), so they are not made again."""
    cached: tuple[tuple[int, ...], Columns] | None = getattr(src, "_native_columns", None)
    key = (id(dst.ops), id(dst.sizes), id(dst.rids), id(dst.streams), len(dst.ops))
    if (
        cached is not None
        and cached[0] == key
        and src.ops is dst.ops
        and src.sizes is dst.sizes
        and src.rids is dst.rids
        and src.streams is dst.streams
    ):
        try:
            dst._native_columns = cached
        except AttributeError:  # a stream type with __slots__: no cache, still correct
            pass


Spliced = tuple[
    tuple[list[int], list[int], list[int], list[int], list[int]],  # the new stream's five columns
    "list[int] | None",  # its stack ids
    "memoryview",  # new_index: where each old request went (int64, writable; the last: the new length)
    list[int],  # made: the new positions of the rows put in or changed
    "Columns | None",  # the new stream's int64 columns, when the old one's were at hand
]


def splice(
    columns: tuple[list[int], list[int], list[int], list[int], list[int]],
    ids: list[int] | None,
    keys: list[int],
    before: dict[int, Any],
    changed: dict[int, Any],
    given_stacks: bool,
    int64_columns: Columns | None = None,
) -> Spliced | None:
    """`remedy.model.spliced`'s copying in the native core (`splice` in `_native.c` says what goes in
    and out), or None when the core is not used (then the Python code there does it). With the old
    stream's int64 columns (`cached_columns`), the new stream's come with it (no conversion later)."""
    mod = core()
    if mod is None:
        return None
    cols, new_ids, index, made, raw = mod.splice(columns, ids, keys, before, changed, given_stacks, int64_columns)
    cols64 = None if raw is None else tuple(memoryview(b).cast("q") for b in raw)
    return cols, new_ids, memoryview(index).cast("q"), made, cols64  # type: ignore[return-value]


def cached_columns(req: Any) -> Columns | None:
    """The int64 columns `columns` already made for stream `req` (None: none yet; nothing is made)."""
    key = (id(req.ops), id(req.sizes), id(req.rids), id(req.streams), len(req.ops))
    cached: tuple[tuple[int, ...], Columns] | None = getattr(req, "_native_columns", None)
    return cached[1] if cached is not None and cached[0] == key else None


def keep_columns(req: Any, cols: Columns) -> None:
    """Let stream `req` hold `cols` as its int64 columns (made along with its lists)."""
    try:
        req._native_columns = ((id(req.ops), id(req.sizes), id(req.rids), id(req.streams), len(req.ops)), cols)
    except AttributeError:  # a stream type with __slots__: no cache, still correct
        pass
