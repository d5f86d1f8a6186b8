"""Reading what is handed to `alloctune diagnose` as a stream: a log, a snapshot, a trace, or else.

What a file holds is decided by `alloctune.trace.content` (the same verdict the trace loader
gives every other command); here are the readers that let `diagnose` look at a file's first
bytes without reading it all: they decompress on the fly (gzip, xz, bz2) with the same one-line
errors as `read_input_bytes`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from alloctune.errors import InputError
from alloctune.trace.content import SNIFF_BYTES, sniff_bytes

__all__ = ["SNIFF_BYTES", "open_input", "read_head", "sniff_bytes"]


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
            raise self.error(
                f"{self.path}: the {self.kind} stream is truncated or corrupt ({exc or type(exc).__name__}); copy the file again"
            ) from None
        self.done += len(data)
        if self.done > self.limit:
            from alloctune.trace.limits import hint

            raise self.error(
                f"{self.path}: decompresses to more than {self.limit} bytes (a decompression bomb?); {hint(self.which)}"
            )
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
