"""Bytes of a log into text: logs come from anywhere, and Windows PowerShell writes UTF-16.

`Out-File` and `>` in Windows PowerShell 5 write UTF-16 LE with a byte-order mark; reading that
as UTF-8 turns every other byte into NUL and no message can be found. So: honour a BOM, else
recognise UTF-16 without one by its NULs in every other byte, else UTF-8 (bad bytes replaced).
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterator

from alloctune.trace.content import text_encoding as _encoding


def decode_log(data: bytes) -> str:
    """The text of a log file's bytes (UTF-8, UTF-8 with BOM, UTF-16 LE/BE with or without BOM)."""
    if data.startswith(codecs.BOM_UTF8):
        return data[len(codecs.BOM_UTF8) :].decode("utf-8", errors="replace")
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return data.decode("utf-16", errors="replace")
    sample = data[:4096]
    if len(sample) >= 4:
        even_nul = sample[0::2].count(0) / len(sample[0::2])
        odd_nul = sample[1::2].count(0) / len(sample[1::2])
        if odd_nul > 0.4 and even_nul < 0.05:  # ASCII-range text as UTF-16 LE
            return data.decode("utf-16-le", errors="replace")
        if even_nul > 0.4 and odd_nul < 0.05:
            return data.decode("utf-16-be", errors="replace")
    return data.decode("utf-8", errors="replace")


CHUNK = 1 << 20


def iter_log_text(read: Callable[[int], bytes], chunk: int = CHUNK) -> Iterator[str]:
    """The text of a byte stream, piece by piece, decoded as `decode_log` decodes it whole.

    Why: a log can be bigger than memory or arrive through a pipe; the encoding is decided from
    the first 4 KiB (as `decode_log` does) and an incremental decoder carries characters split
    between reads.
    """
    head = b""
    while len(head) < 4096:
        data = read(chunk)
        if not data:
            break
        head += data
    decoder = codecs.getincrementaldecoder(_encoding(head))(errors="replace")
    data = head
    while data:
        text = decoder.decode(data)
        if text:
            yield text
        data = read(chunk)
    text = decoder.decode(b"", final=True)
    if text:
        yield text
