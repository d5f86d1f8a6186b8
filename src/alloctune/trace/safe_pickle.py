"""Open `torch.cuda.memory._dump_snapshot` files without trusting them.

A snapshot is a plain pickle of dicts, lists, tuples, numbers and strings, but a pickle
can name any importable callable (`os.system`, `subprocess.Popen`, ...) and have the
unpickler call it. Snapshots get passed around in bug reports, so we refuse every
global: the restricted unpickler below can only build the plain containers and scalars
that pickle encodes with its own opcodes. The C unpickler still does the work, so a
1.3M-event trace loads at full speed; `find_class` is reached only by a hostile (or
non-snapshot) file.
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


def safe_loads(data: bytes) -> Any:
    """Unpickle bytes with `RestrictedUnpickler` (raises `UnsafePickleError` on any global)."""
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


def read_decompressed(path: str | Path) -> bytes:
    """The file's bytes, decompressed if they start with a gzip/xz/bz2 magic.

    Raises `TraceError` with one readable line for a missing file or a damaged stream.
    """
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if path.is_dir():
        raise TraceError(f"{path}: is a directory, expected a snapshot file (.pickle, .pickle.gz, .pickle.xz)")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    kind = sniff_compression(raw[:8])
    if kind is None:
        return raw
    try:
        if kind == "xz":
            return lzma.decompress(raw)
        if kind == "gzip":
            return gzip.decompress(raw)
        return bz2.decompress(raw)
    except (lzma.LZMAError, EOFError, OSError, zlib.error, ValueError) as exc:
        raise TraceError(
            f"{path}: the {kind} stream is truncated or corrupt ({exc or type(exc).__name__}); copy the file again"
        ) from exc


def load_pickle_file(path: str | Path) -> Any:
    """Safely unpickle a (possibly compressed) file; every failure is a one-line `TraceError`."""
    data = read_decompressed(path)
    return load_pickle_bytes(data, source=str(path))


def load_pickle_bytes(data: bytes, source: str = "<bytes>") -> Any:
    """Safely unpickle bytes, turning every pickle failure into a `TraceError` naming `source`."""
    if not data:
        raise TraceError(f"{source}: the file is empty")
    try:
        return safe_loads(data)
    except UnsafePickleError as exc:
        raise UnsafePickleError(f"{source}: {exc}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, MemoryError, OverflowError, RecursionError) as exc:
        detail = str(exc) or type(exc).__name__
        raise TraceError(
            f"{source}: not a readable pickle (truncated or corrupt: {detail:.120}); "
            "expected a file written by torch.cuda.memory._dump_snapshot"
        ) from exc

