"""Open `torch.cuda.memory._dump_snapshot` files without trusting them.

A snapshot is a plain pickle of dicts, lists, tuples, numbers and strings, but a pickle
can name any importable callable (`os.system`, `subprocess.Popen`, ...) and have the
unpickler call it. Snapshots get passed around in bug reports, so we refuse every
global: the restricted unpickler below can only build the plain containers and scalars
that pickle encodes with its own opcodes.

Refusing globals is not enough: the C unpickler trusts the stream's shape (memo indices,
nesting, shared references), so every stream is first walked by `pickle_scan.scan`, which
proves it plain data within `Limits`; only then does the C unpickler build it at full speed.
Decompression is bounded too (`Limits.max_decompressed`): an xz of zeros stops at the limit.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import pickle
import zlib
from pathlib import Path
from typing import Any

from alloctune.errors import TraceError, UnsafePickleError
from alloctune.input_file import read_input_bytes
from alloctune.trace.limits import Limits, hint
from alloctune.trace.pickle_scan import NeedsGlobal, scan

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
            "a memory snapshot holds only plain data, so this file is not one (or was tampered with)"
        )

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        raise UnsafePickleError(
            f"refused to load the pickle: it uses a persistent id ({pid!r:.60}); a memory snapshot never does"
        )


def safe_loads(data: bytes, limits: Limits | None = None) -> Any:
    """Unpickle bytes that `scan` proved plain data within `limits`.

    Raises `UnsafePickleError` on any global, `TraceError` (via `scan`) on anything else
    that is not plain data or exceeds a limit.
    """
    try:
        scan(data, limits)
    except NeedsGlobal:
        # The prefix up to the global was proven plain; the restricted unpickler reaches the
        # global there and refuses it by name (find_class / persistent_load / extension code).
        RestrictedUnpickler(io.BytesIO(data)).load()
        raise UnsafePickleError("refused to load the pickle: it refers to code or out-of-band data") from None
    return RestrictedUnpickler(io.BytesIO(data)).load()


def sniff_compression(head: bytes) -> str | None:
    """'gzip', 'xz', 'bz2' or None (plain) from the first bytes of a file."""
    if head.startswith(XZ_MAGIC):
        return "xz"
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(BZ2_MAGIC):
        return "bz2"
    return None


def read_decompressed(path: str | Path, limits: Limits | None = None) -> bytes:
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
            raise TraceError(f"{path}: {len(raw)} bytes is more than the {lim.max_decompressed}-byte limit; "
                             f"{hint('max_decompressed')}")
        return raw
    allowed, which = lim.decompressed_allowed(len(raw))
    try:
        return decompress_bounded(raw, kind, allowed)
    except _TooLarge:
        raise TraceError(
            f"{path}: decompresses to more than {allowed} bytes ({len(raw)} compressed; a decompression bomb?); "
            f"{hint(which)}"
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


def load_pickle_bytes(data: bytes, source: str = "<bytes>", limits: Limits | None = None) -> Any:
    """Safely unpickle bytes, turning every pickle failure into a `TraceError` naming `source`."""
    if not data:
        raise TraceError(f"{source}: the file is empty")
    try:
        return safe_loads(data, limits)
    except UnsafePickleError as exc:
        raise UnsafePickleError(f"{source}: {exc}") from None
    except TraceError as exc:
        raise TraceError(f"{source}: not a readable pickle of plain data: {exc}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, MemoryError, OverflowError, RecursionError) as exc:
        detail = str(exc) or type(exc).__name__
        raise TraceError(
            f"{source}: not a readable pickle (truncated or corrupt: {detail:.120}); "
            "expected a file written by torch.cuda.memory._dump_snapshot"
        ) from exc

