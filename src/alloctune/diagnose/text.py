"""Bytes of a log into text: logs come from anywhere, and Windows PowerShell writes UTF-16.

`Out-File` and `>` in Windows PowerShell 5 write UTF-16 LE with a byte-order mark; reading that
as UTF-8 turns every other byte into NUL and no message can be found. So: honour a BOM, else
recognise UTF-16 without one by its NULs in every other byte, else UTF-8 (bad bytes replaced).
"""

from __future__ import annotations

import codecs


def decode_log(data: bytes) -> str:
    """The text of a log file's bytes (UTF-8, UTF-8 with BOM, UTF-16 LE/BE with or without BOM)."""
    if data.startswith(codecs.BOM_UTF8):
        return data[len(codecs.BOM_UTF8):].decode("utf-8", errors="replace")
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
