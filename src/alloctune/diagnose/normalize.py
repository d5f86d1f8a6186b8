"""One candidate region of a pasted log as single-spaced plain text, mapped back to the raw input.

HTML entities, JSON escapes (`\\n`, `\\"`, `\\u...`), `<br>`, line breaks, per-line log prefixes
and runs of whitespace become single spaces or the characters they stand for, and full-width
punctuation its ASCII form; `Normalized.raw_span` maps any normalised slice to the exact slice
of the input it came from.
"""

from __future__ import annotations

import html
import re
from bisect import bisect_right

from alloctune.diagnose.parse import _LINE_PREFIX

_FULLWIDTH = str.maketrans({"；": ";", "：": ":", "（": "(", "）": ")", "，": ","})
_HAS_FULLWIDTH = re.compile("[；：（），]")  # translate() looks up every character: only where needed


# The characters normalisation changes; everything between two of them is copied as one chunk
# (C speed), so a window costs a few steps per line instead of a few per word. Candidates are
# found with a character class (rare characters) and `str.find("  ")` (runs of spaces), both
# fast scans; `_SPECIAL` is then matched only there.
_SPECIAL = re.compile(
    r"(?P<entity>&(?:#\d+|#x[0-9A-Fa-f]+|[A-Za-z]+);)"
    r"|(?P<esc>\\[nrt])"
    r"|(?P<escq>\\[\"'\\/])"
    r"|(?P<uesc>\\u[0-9A-Fa-f]{4})"  # JSON's \u escapes (Python's json.dumps writes non-ASCII so)
    r"|(?P<br><br\s*/?>)"
    r"|(?P<nl>\r\n|\r|\n)"
    r"|(?P<ws>[\t\f\v\u00a0\u3000][ \t\f\v\u00a0\u3000]*| [ \t\f\v\u00a0\u3000]+)",
    re.S,
)
_RARE = re.compile(r"[&\\<\r\n\t\f\v\u00a0\u3000]")


class Normalized:
    """Single-spaced, un-escaped text plus the map back to the raw input (`raw_span`).

    The map is a table of pieces (normalised start, raw start, copied?): a copied chunk maps
    character by character, a replaced token (entity, escape, line break) maps every
    character it produced to the token's first raw character.
    """

    def __init__(self, raw: str, start: int, end: int, joins: frozenset[int] = frozenset()) -> None:
        """`joins`: raw positions of line breaks that split a word or a line (a terminal's hard
        wrap, a log collector's partial line): they vanish instead of becoming a space."""
        parts: list[str] = []
        ns: list[int] = []
        rs: list[int] = []
        cp: list[bool] = []
        length = 0
        last_space = True  # at the start a space is dropped, as after a space
        pos = start
        match, rare, find = _SPECIAL.match, _RARE.search, raw.find
        wide = _HAS_FULLWIDTH.search(raw, start, end) is not None
        next_rare = next_spaces = -1  # cached positions of the next candidates (recomputed when passed)
        while pos < end:
            m = None
            q = pos
            while True:
                if next_rare < q:
                    r = rare(raw, q, end)
                    next_rare = r.start() if r else end
                if next_spaces < q:
                    d = find("  ", q, end)
                    next_spaces = d if d >= 0 else end
                c = next_rare if next_rare < next_spaces else next_spaces
                if c >= end:
                    break
                m = match(raw, c, end)
                if m is not None:
                    break
                q = c + 1
            stop = m.start() if m else end
            if stop > pos:
                a = pos + 1 if last_space and raw[pos] == " " else pos
                if a < stop:
                    chunk = raw[a:stop].translate(_FULLWIDTH) if wide else raw[a:stop]
                    ns.append(length)
                    rs.append(a)
                    cp.append(True)
                    parts.append(chunk)
                    length += len(chunk)
                    last_space = chunk[-1] == " "
            if m is None:
                break
            kind = m.lastgroup
            at = m.start()
            if kind == "entity":
                out = html.unescape(m.group())
            elif kind == "escq":
                out = m.group()[1]
            elif kind == "uesc":
                out = chr(int(m.group()[2:], 16)).translate(_FULLWIDTH)
                out = " " if out.isspace() else out
            elif kind == "nl" and at in joins:
                out = ""
            else:
                out = " "
            for ch in out:
                if ch == " " and last_space:
                    continue
                ns.append(length)
                rs.append(at)
                cp.append(False)
                parts.append(ch)
                length += 1
                last_space = ch == " "
            pos = m.end()
            if kind == "nl":
                while True:  # strip stacked prefixes such as "(Worker pid=1) ERROR ... ]"
                    pm = _LINE_PREFIX.match(raw, pos, end)
                    if not pm or pm.end() == pos:
                        break
                    pos = pm.end()
        self.text = "".join(parts)
        self._ns, self._rs, self._cp = ns, rs, cp
        self.raw_end = end

    def _src(self, i: int) -> int:
        k = bisect_right(self._ns, i) - 1
        return self._rs[k] + (i - self._ns[k]) if self._cp[k] else self._rs[k]

    def raw_span(self, i: int, j: int) -> tuple[int, int]:
        """Raw [start, end) covering normalised characters [i, j)."""
        if j <= i:
            return (self._src(i), self._src(i))
        return (self._src(i), self._src(j - 1) + 1)
