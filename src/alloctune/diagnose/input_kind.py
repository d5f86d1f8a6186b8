"""What a file handed to `alloctune diagnose` is, by its content: a log, a snapshot, a trace, or else.

Why in `diagnose/`: recognising a pickle snapshot or a compact trace needs the trace loader's
sniffers, which the plain file reader (`alloctune.trace.input_file`) does without. The readers
decompress on the fly (gzip, xz, bz2) with the same one-line errors as `read_input_bytes`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from alloctune.errors import InputError

SNIFF_BYTES = 8192

# (magic at offset 0, what it is): files people hand to the wrong command.
_MAGICS: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"%PDF", "a PDF document"),
    (b"PK\x03\x04", "a ZIP archive (a torch.save checkpoint is one)"),
    (b"\x7fELF", "an executable (ELF)"),
    (b"MZ", "a Windows executable"),
    (b"SQLite format 3\x00", "an SQLite database"),
    (b"\x89HDF", "an HDF5 file"),
    (b"\x93NUMPY", "a NumPy array (.npy)"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed data (decompress it first: zstd -d)"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
)


def sniff_bytes(head: bytes) -> tuple[str, str]:
    """(kind, what it looks like) of a file's first (decompressed) bytes.

    kind: "snapshot" (a pickle, as `_dump_snapshot` and `alloctune record` write), "compact"
    (alloctune's trace format), "text" (a log or a pasted message), or "other". Content only:
    the suffix of a file says nothing about a log renamed `.pickle` or a snapshot sent as `.txt`.
    """
    from alloctune.trace.compact import is_compact

    if not head:
        return "text", "empty"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "snapshot", f"a pickle (protocol {head[1]})"
    if is_compact(head):
        return "compact", "an alloctune compact trace"
    for magic, what in _MAGICS:
        if head.startswith(magic):
            return "other", what
    if len(head) > 262 and head[257:262] == b"ustar":
        return "other", "a tar archive"
    if len(head) >= 10 and head[8:10] == b'{"' and int.from_bytes(head[:8], "little") < 100_000_000:
        return "other", "a safetensors file"
    from alloctune.diagnose.text import _encoding

    enc = _encoding(head)
    if enc.startswith("utf-16"):
        return "text", "UTF-16 text"
    text = head.decode("utf-8", errors="replace")
    if "\x00" not in text:
        odd = sum(1 for c in text if (c < " " and c not in "\t\n\r\f\v\x1b") or c == "\ufffd")
        if odd <= len(text) // 10:
            return "text", "text"
    return "other", "binary data"


def open_input(path: str | Path, *, expected: str, error: type[InputError] = InputError) -> tuple[BinaryIO, str | None]:
    """A binary stream of `path`'s content, decompressed on the fly (gzip, xz, bz2), and the
    compression's name; the same one-line errors as `read_input_bytes`."""
    import bz2
    import gzip
    import lzma

    from alloctune.trace.input_file import existing_file
    from alloctune.trace.safe_pickle import sniff_compression

    p = existing_file(path, expected=expected, error=error)
    try:
        fh = p.open("rb")
        kind = sniff_compression(fh.peek(8)[:8])  # peek: a FIFO cannot be rewound
    except OSError as exc:
        raise error(f"{p}: cannot read: {exc.strerror or exc}") from exc
    if kind is None:
        return fh, None
    from alloctune.trace.limits import Limits

    opener = {"gzip": lambda f: gzip.GzipFile(fileobj=f, mode="rb"), "xz": lzma.LZMAFile, "bz2": bz2.BZ2File}[kind]
    size = p.stat().st_size if p.is_file() else 0
    lim = Limits.from_env()
    limit, which = lim.decompressed_allowed(size) if size else (lim.max_decompressed, "max_decompressed")
    return _Decompressing(opener(fh), kind, p, (limit, which), error), kind  # type: ignore[operator, return-value]


class _Decompressing:
    """Reads a compressed stream; a damaged one or one past `limit` bytes is one line, not a traceback."""

    def __init__(self, inner: BinaryIO, kind: str, path: Path, limit: tuple[int, str], error: type[InputError]) -> None:
        self.inner, self.kind, self.path, self.error, self.done = inner, kind, path, error, 0
        self.limit, self.which = limit

    def read(self, n: int = -1) -> bytes:
        import lzma
        import zlib

        try:
            data = self.inner.read(n)
        except (lzma.LZMAError, EOFError, OSError, zlib.error, ValueError) as exc:
            raise self.error(f"{self.path}: the {self.kind} stream is truncated or corrupt "
                             f"({exc or type(exc).__name__}); copy the file again") from None
        self.done += len(data)
        if self.done > self.limit:
            from alloctune.trace.limits import hint

            raise self.error(f"{self.path}: decompresses to more than {self.limit} bytes (a decompression bomb?); "
                             f"{hint(self.which)}")
        return data

    def close(self) -> None:
        self.inner.close()


def read_head(read: Callable[[int], bytes], size: int = SNIFF_BYTES) -> tuple[bytes, Callable[[int], bytes]]:
    """The first `size` bytes of a stream (fewer if it ends) and a `read` that starts over with them."""
    head = b""
    while len(head) < size:
        data = read(size - len(head))
        if not data:
            break
        head += data
    pending = [head]

    def again(n: int) -> bytes:
        if pending:
            first = pending.pop()
            if first:
                return first
        return read(n)

    return head, again
