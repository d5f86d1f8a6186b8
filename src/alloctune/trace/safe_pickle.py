"""Open `torch.cuda.memory._dump_snapshot` files without trusting them.

A snapshot is a plain pickle of dicts, lists, tuples, numbers and strings, but a pickle
can name any importable callable (`os.system`, `subprocess.Popen`, ...) and have the
unpickler call it. Snapshots get passed around in bug reports, so we refuse every
global: the restricted unpickler below can only build the plain containers and scalars
that pickle encodes with its own opcodes.

Refusing globals is not enough: the C unpickler trusts the stream's shape (memo indices,
nesting, shared references). Two ways to prove a stream plain data within `Limits`:
- fast (what `_dump_snapshot` writes): `pickle_scan.screen` tokenizes it at C speed and admits
  only opcodes that cannot run code, grow the memo past the opcode count or hash deep tuples;
  the C unpickler builds it; `pickle_scan.check_built` enforces the limits on the result.
- anything else (older protocols, damage, bombs): `pickle_scan.scan` walks every opcode in
  Python before anything is built, and words every refusal.
Decompression is bounded too (`Limits.max_decompressed`): an xz of zeros stops at the limit.
"""

from __future__ import annotations

import bz2
import copyreg
import functools
import gc
import io
import lzma
import pickle
import zlib
from pathlib import Path
from typing import Any

from alloctune.errors import TraceError, UnsafePickleError
from alloctune.trace.input_file import read_input_bytes
from alloctune.trace.limits import Limits, hint
from alloctune.trace.pickle_check import OverLimit, check_built
from alloctune.trace.pickle_scan import NeedsGlobal, PickleRejected, scan, screen

# Magic bytes of the compressed containers we open (sniffed, the suffix may lie).
GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"
BZ2_MAGIC = b"BZh"


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that refuses every global: classes, functions, extension codes.

    Only the opcodes for None/bool/int/float/str/bytes/list/tuple/dict/set/frozenset
    remain usable, which is all a memory snapshot contains.
    """

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102 - see class doc
        raise UnsafePickleError(
            f"refused to load the pickle: it asks for the global '{module}.{name}', which could run code; "
            "a memory snapshot holds only plain data, so this file is not one (or was tampered with)",
            refused=f"{module}.{name}",
        )

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        raise UnsafePickleError(
            f"refused to load the pickle: it uses a persistent id ({pid!r:.60}); a memory snapshot never does"
        )


def safe_loads(data: bytes | bytearray, limits: Limits | None = None) -> Any:
    """Unpickle bytes proven plain data within `limits` (see the module doc for how).

    Raises `UnsafePickleError` on any global, `TraceError` (via `scan`) on anything else
    that is not plain data or exceeds a limit.
    """
    lim = limits or Limits.from_env()
    try:
        screened = screen(data)
    except Exception:  # noqa: BLE001 - whatever the screen cannot read, the scan words
        screened = None
    if screened is not None:
        value = _fast_load(data, lim, screened.tuples, screened.empty_tuples > 0)
        if value is not _NOT_FAST:
            return value
    return scanned_loads(data, lim)


def scanned_loads(data: bytes | bytearray, limits: Limits | None = None) -> Any:
    """The path for every stream the screen does not admit: `scan` each opcode, then build.

    Also what `safe_loads` did for every stream before the screen existed (bench/snapshot_load.py
    compares the two).
    """
    lim = limits or Limits.from_env()
    try:
        scan(data, lim)
    except NeedsGlobal as exc:
        _refuse_global(data, exc.args[0])
    return RestrictedUnpickler(io.BytesIO(data)).load()


_NOT_FAST = object()


def _fast_load(data: bytes | bytearray, lim: Limits, tuples: int, empty_tuples: bool) -> Any:
    """Build a screened stream with the C unpickler and check it; `_NOT_FAST` sends it to `scan`.

    The garbage collector is off meanwhile: it is what would untrack a tuple (and then maybe the dict
    holding it), and `check_built` skips the items of untracked dicts only while no tuple can be
    untracked. Any collection in between (another thread) and the check is redone looking at every dict.
    """
    flat_if_untracked, tuples_born_tracked = _gc_facts()
    flat = flat_if_untracked and not empty_tuples and (not tuples or tuples_born_tracked)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        before = _collections()
        try:
            value = RestrictedUnpickler(io.BytesIO(data)).load()
        except Exception:  # noqa: BLE001 - damaged: `scan` finds and words the reason
            return _NOT_FAST
        try:
            check_built(value, lim, len(data), tuples=tuples, empty_tuples=empty_tuples, untracked_are_flat=flat)
            if flat and tuples and _collections() != before:
                check_built(value, lim, len(data), tuples=tuples, empty_tuples=empty_tuples, untracked_are_flat=False)
        except OverLimit as exc:
            del value
            scan(data, lim)  # words the refusal as always (with the byte offset)
            raise PickleRejected(f"{exc}; {_hint_for(exc)}") from None  # only if scan disagreed
        except Exception:  # noqa: BLE001 - unforeseen (out of memory, ...): the scan decides
            del value
            return _NOT_FAST
        return value
    finally:
        if was_enabled:
            gc.enable()


def _hint_for(exc: OverLimit) -> str:
    text = str(exc)
    field = "max_depth" if "nest" in text else "max_container" if "holds" in text else "max_objects"
    return hint(field)


def _collections() -> int:
    return sum(s["collections"] for s in gc.get_stats())


@functools.cache
def _gc_facts() -> tuple[bool, bool]:
    """What `check_built` may assume of this interpreter, tried on tiny pickles: whether a dict
    holding a list or a dict is tracked, and whether a tuple the unpickler builds (and a dict
    holding it) is tracked while the collector is off. CPython keeps both; where either fails,
    every dict is looked at.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with_containers = all(gc.is_tracked(pickle.loads(p)) for p in (b"\x80\x04}(\x8c\x01a]u.", b"\x80\x04}(\x8c\x01a}u."))
        t = pickle.loads(b"\x80\x04K\x01K\x02\x86.")
        with_tuple = pickle.loads(b"\x80\x04}(\x8c\x01aK\x01K\x02\x86u.")
        return with_containers, gc.is_tracked(t) and gc.is_tracked(with_tuple)
    finally:
        if was_enabled:
            gc.enable()


def _refuse_global(data: bytes | bytearray, at: int) -> None:
    """Refuse the stream at the global / persistent id / extension code at byte `at`, by name.

    `scan` proved everything before `at` plain data; the restricted unpickler is given the bytes
    up to the end of that opcode and STOPs after it (same length, so frames still add up), so it
    reaches it and refuses it (`find_class`, `persistent_load`) and never reads anything the file
    has after it. Extension codes are named from
    copyreg's registry without unpickling: the C unpickler would take a cached one without
    asking `find_class`.
    """
    op = data[at]
    if op in (0x82, 0x83, 0x84):  # EXT1, EXT2, EXT4
        width = {0x82: 1, 0x83: 2, 0x84: 4}[op]
        code = int.from_bytes(data[at + 1 : at + 1 + width], "little")
        key = copyreg._inverted_registry.get(code)  # type: ignore[attr-defined]
        what = f"the global '{key[0]}.{key[1]}'" if key else f"extension code {code}"
        raise UnsafePickleError(
            f"refused to load the pickle: it asks for {what}, which could run code; "
            "a memory snapshot holds only plain data, so this file is not one (or was tampered with)",
            refused=f"{key[0]}.{key[1]}" if key else None,
        )
    end = at + 1
    if op in (0x63, 0x69):  # GLOBAL, INST: two text lines
        end = data.find(b"\n", data.find(b"\n", end) + 1) + 1
    elif op == 0x50:  # PERSID: one text line
        end = data.find(b"\n", end) + 1
    if end <= at:
        end = len(data)
    try:
        RestrictedUnpickler(io.BytesIO(bytes(data[:end]) + b"." * (len(data) - end))).load()
    except UnsafePickleError:
        raise
    except Exception:  # noqa: BLE001 - whatever stopped it, the stream names code
        pass
    raise UnsafePickleError("refused to load the pickle: it refers to code or out-of-band data")


def sniff_compression(head: bytes) -> str | None:
    """'gzip', 'xz', 'bz2' or None (plain) from the first bytes of a file."""
    if head.startswith(XZ_MAGIC):
        return "xz"
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(BZ2_MAGIC):
        return "bz2"
    return None


def read_decompressed(path: str | Path, limits: Limits | None = None) -> bytes | bytearray:
    """The file's bytes, decompressed if they start with a gzip/xz/bz2 magic.

    Raises `TraceError` with one readable line for a missing file, a damaged stream, or
    more than `limits.max_decompressed` bytes (checked while decompressing, so a bomb
    never gets further than the limit).
    """
    path = Path(path)
    raw = read_input_bytes(path, expected="a snapshot file (.pickle, .pickle.gz, .pickle.xz)", error=TraceError)
    lim = limits or Limits.from_env()
    kind = sniff_compression(raw[:8])
    if kind is None:
        if len(raw) > lim.max_decompressed:
            raise TraceError(
                f"{path}: {len(raw)} bytes is more than the {lim.max_decompressed}-byte limit; {hint('max_decompressed')}"
            )
        return raw
    allowed, which = lim.decompressed_allowed(len(raw))
    try:
        return decompress_bounded(raw, kind, allowed)
    except _TooLarge:
        raise TraceError(
            f"{path}: decompresses to more than {allowed} bytes ({len(raw)} compressed; a decompression bomb?); {hint(which)}"
        ) from None
    except (lzma.LZMAError, EOFError, OSError, zlib.error, ValueError) as exc:
        raise TraceError(
            f"{path}: the {kind} stream is truncated or corrupt ({exc or type(exc).__name__}); copy the file again"
        ) from exc


class _TooLarge(Exception):
    pass


_CHUNK = 1 << 24


def _decompressor(kind: str) -> Any:
    if kind == "xz":
        return lzma.LZMADecompressor()
    if kind == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    return bz2.BZ2Decompressor()


def decompress_bounded(raw: bytes, kind: str, limit: int) -> bytearray:
    """Decompress `raw` (all concatenated members/streams) in chunks; `_TooLarge` past `limit`.

    Output is produced at most `_CHUNK` bytes at a time, so memory never exceeds the limit
    plus one chunk, whatever the input claims.
    """
    out = bytearray()
    data = raw
    while True:
        dec = _decompressor(kind)
        if kind == "gzip":
            buf = dec.decompress(data, _CHUNK)
            while True:
                out += buf
                if len(out) > limit:
                    raise _TooLarge
                if dec.eof or not dec.unconsumed_tail and not buf:
                    break
                buf = dec.decompress(dec.unconsumed_tail, _CHUNK)
            if not dec.eof:
                raise EOFError("compressed stream ended before the end-of-stream marker")
        else:
            buf = dec.decompress(data, max_length=_CHUNK)
            while True:
                out += buf
                if len(out) > limit:
                    raise _TooLarge
                if dec.eof or (dec.needs_input and not buf):
                    break
                buf = dec.decompress(b"", max_length=_CHUNK)
            if not dec.eof:
                raise EOFError("compressed stream ended before the end-of-stream marker")
        rest = dec.unused_data
        if not rest:
            return out  # a bytearray: copying it to bytes would double the peak
        if not rest.strip(b"\x00") and (kind == "gzip" or (kind == "xz" and len(rest) % 4 == 0)):
            return out  # the padding gzip and xz allow after a member (xz: multiples of 4 bytes)
        if sniff_compression(rest[:8]) != kind:
            raise ValueError(f"{len(rest)} byte(s) of trailing garbage after the {kind} stream")
        data = rest


def load_pickle_file(path: str | Path, limits: Limits | None = None) -> Any:
    """Safely unpickle a (possibly compressed) file; every failure is a one-line `TraceError`."""
    lim = limits or Limits.from_env()
    data = read_decompressed(path, lim)
    return load_pickle_bytes(data, source=str(path), limits=lim)


def load_pickle_bytes(data: bytes | bytearray, source: str = "<bytes>", limits: Limits | None = None) -> Any:
    """Safely unpickle bytes, turning every pickle failure into a `TraceError` naming `source`."""
    if not data:
        raise TraceError(f"{source}: the file is empty")
    try:
        return safe_loads(data, limits)
    except UnsafePickleError as exc:
        raise UnsafePickleError(f"{source}: {exc}", refused=exc.refused) from None
    except TraceError as exc:
        raise TraceError(f"{source}: not a readable pickle of plain data: {exc}") from None
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        IndexError,
        KeyError,
        AttributeError,
        MemoryError,
        OverflowError,
        RecursionError,
    ) as exc:
        detail = str(exc) or type(exc).__name__
        raise TraceError(
            f"{source}: not a readable pickle (truncated or corrupt: {detail:.120}); "
            "expected a file written by torch.cuda.memory._dump_snapshot"
        ) from exc
