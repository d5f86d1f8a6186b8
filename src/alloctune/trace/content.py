"""What a file holds, from its first (decompressed) bytes: a recording, a log, or something else.

Why here, with the trace loader: every command that takes a recording (`simulate`, `explain`,
`report`, `trace`, `plan`) and `diagnose`, which takes either a log or a recording, must tell
the user the same thing about a file given to the wrong command ("a text log: try `alloctune
diagnose`", "a PNG image"). Content decides, never the suffix: a log renamed `.pickle` and a
snapshot sent as `.txt` both happen in bug reports. `diagnose/` (above) routes with it; the
loader (`trace.load`) words its refusals with it.
"""

from __future__ import annotations

import codecs
from typing import NamedTuple

SNIFF_BYTES = 8192  # enough of a file to tell text from binary, and to find a compact trace's marker

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


class Content(NamedTuple):
    """What the first bytes of a file look like.

    Attributes:
        kind: "snapshot" (a binary pickle, as `_dump_snapshot` and `alloctune record` write),
            "compact" (alloctune's trace format), "text" (a log, a pasted message, JSON) or "other".
        what: the same in words, for a message ("a pickle (protocol 4)", "a PNG image", "text").
        magic: whether `what` came from a known file signature (a PNG, a ZIP, ...): such a file
            is certainly not a recording, while "binary data" may still be a damaged one.
    """

    kind: str
    what: str
    magic: bool = False


def text_encoding(sample: bytes | bytearray) -> str:
    """The codec a log starting with `sample` is read with: a BOM's, else UTF-16 recognised by its
    NULs in every other byte (Windows PowerShell's `>` writes UTF-16 LE), else UTF-8."""
    if sample.startswith(codecs.BOM_UTF8):
        return "utf-8-sig"
    if sample.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    sample = sample[:4096]
    if len(sample) >= 4:
        even_nul = sample[0::2].count(0) / len(sample[0::2])
        odd_nul = sample[1::2].count(0) / len(sample[1::2])
        if odd_nul > 0.4 and even_nul < 0.05:
            return "utf-16-le"
        if even_nul > 0.4 and odd_nul < 0.05:
            return "utf-16-be"
    return "utf-8"


def sniff_content(head: bytes | bytearray) -> Content:
    """The `Content` of a file whose (decompressed) bytes start with `head` (`SNIFF_BYTES` of them
    is plenty). An empty file is "text" ("empty"): there is nothing else it could be."""
    from alloctune.trace.compact import is_compact

    if not head:
        return Content("text", "empty")
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return Content("snapshot", f"a pickle (protocol {head[1]})")
    if is_compact(head):
        return Content("compact", "an alloctune compact trace")
    for magic, what in _MAGICS:
        if head.startswith(magic):
            return Content("other", what, magic=True)
    if len(head) > 262 and head[257:262] == b"ustar":
        return Content("other", "a tar archive", magic=True)
    if len(head) >= 10 and head[8:10] == b'{"' and int.from_bytes(head[:8], "little") < 100_000_000:
        return Content("other", "a safetensors file", magic=True)
    enc = text_encoding(head)
    if enc.startswith("utf-16"):
        return Content("text", "UTF-16 text")
    text = head.decode("utf-8", errors="replace")
    if "\x00" not in text:
        odd = sum(1 for c in text if (c < " " and c not in "\t\n\r\f\v\x1b") or c == "\ufffd")
        if odd <= len(text) // 10:
            return Content("text", "JSON" if text.lstrip("\ufeff \t\r\n")[:1] in ("{", "[") else "text")
    return Content("other", "binary data")


def sniff_bytes(head: bytes) -> tuple[str, str]:
    """(kind, what it looks like) of a file's first bytes: `sniff_content` as a plain pair
    (JSON counts as text, as a log would be read)."""
    content = sniff_content(head)
    return content.kind, ("text" if content.what == "JSON" else content.what)
