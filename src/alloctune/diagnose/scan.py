"""Find OOM messages in a log that arrives piece by piece: a file bigger than memory, a pipe.

Why a module of its own: `find.iter_reports` wants the whole text. Here the text is kept as a
rolling buffer: what a message can still need (`find.LOOKAHEAD` characters after its start, a
few thousand before it for its line and platform clues) and no more, so memory is bounded by the
read size plus the largest message, whatever the log's size. Spans are offsets in the whole
text; each message also gets its 1-based line number and the rank its line names, if any.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from alloctune.diagnose.find import _LOOKBACK, BIG_TEXT, LOOKAHEAD, ReportFinder
from alloctune.diagnose.report import OOMReport

# A rank on the message's line: torchrun's "[rank3]:", "[rank3] step 12:", "rank=3", "RANK 3".
_RANK = re.compile(r"\[rank(\d+)\]|\brank[ =:_-]?(\d+)\b", re.IGNORECASE)


class Found(NamedTuple):
    """One message: its report (span in the whole text), its line, the rank its line names."""

    report: OOMReport
    line: int
    rank: int | None


def rank_at(text: str, s: int) -> int | None:
    """The rank named on the line of `text[s]` before it, if any."""
    m = _RANK.search(text, text.rfind("\n", max(0, s - _LOOKBACK), s) + 1, s)
    return int(m.group(1) or m.group(2)) if m else None


def scan_reports(pieces: Iterable[str], platform: str | None = None) -> Iterator[Found]:
    """Every OOM message in the concatenation of `pieces`, in order, as `find_reports` would
    find them in the whole text (same reports, same spans)."""
    finder = ReportFinder(platform)
    buf, base, pos = "", 0, 0  # buf holds text[base:]; messages before base + pos are done
    line, counted = 1, 0  # line of buf[counted]
    it = iter(pieces)
    eof = False
    while not eof:
        piece = next(it, None)
        if piece is None:
            eof = True
        else:
            buf += piece
        stop = len(buf) if eof else len(buf) - LOOKAHEAD
        if stop <= pos:
            continue
        for r in finder.scan(buf, pos, stop, big=base + len(buf) > BIG_TEXT, base=base):
            s = r.span[0] - base
            line += buf.count("\n", counted, s)
            counted = s
            yield Found(r, line, rank_at(buf, s))
        pos = finder.pos
        drop = max(0, pos - _LOOKBACK)
        if drop > counted:
            line += buf.count("\n", counted, drop)
            counted = drop
        if drop:
            buf = buf[drop:]
            base += drop
            pos -= drop
            counted -= drop
