"""Which OS a pasted message came from, guessed from paths and words around it.

The platform changes the fixes (expandable segments do nothing on Windows). Kept apart from
`find` so that the message finder stays readable; `PlatformIndex` makes the guess a lookup on
big logs.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterator

from alloctune.diagnose import native

# (name, cheap substrings that must occur, regex giving the evidence); the first platform with a
# hit wins: WSL over Windows (a Linux process on a Windows driver), Windows over Linux (Windows
# paths rarely appear by accident). The substring test keeps big logs fast.
_PLATFORM_HINTS: tuple[tuple[str, tuple[str, ...], re.Pattern[str]], ...] = (
    ("wsl", ("WSL", "/mnt/"), re.compile(r"\bWSL2?\b|/mnt/[a-z]/")),
    (
        "windows",
        (":\\", "windows_portable", "Windows", "Win1", "WIN1", ".exe", "nvcuda"),
        re.compile(
            r"\b[A-Za-z]:\\{1,2}[\w .()-]+\\|\bPS [A-Z]:\\|windows_portable|\bWin(?:dows)? ?1[01]\b|\bWIN1[01]\b"
            r"|\bWindows\b|\.exe\b|\bnvcuda\.dll\b"
        ),
    ),
    (
        "macos",
        ("macOS", "MacBook", "Darwin", "/Users/", "/opt/homebrew/"),
        re.compile(r"\bmacOS\b|\bMacBook\b|\bDarwin\b|/Users/[\w.-]+/|/opt/homebrew/"),
    ),
    (
        "linux",
        ("/home/", "/usr/", "/opt/conda/", "dist-packages/", "Ubuntu", "Linux"),
        re.compile(r"/home/[\w.-]+/|/usr/(?:local/)?lib/python|/opt/conda/|dist-packages/|\bUbuntu\b|\bLinux\b"),
    ),
)
_CONTEXT = 3000


class PlatformIndex:
    """Every platform clue of a big text, found once, so each message's hint is a lookup.

    Why: `platform_hint` scans 6,000 characters per message; on a log made of OOM messages
    that is most of the time. Here each needle and evidence regex runs once over the whole
    text; a message asks which clues lie wholly inside its context window, and the evidence is
    read from that window's slice, so the answer is exactly `platform_hint`'s without an index
    (which is what lets a log be read in pieces, or in parallel, with the same result).
    """

    _last: PlatformIndex | None = None  # the index built last: a chunk's head and rest are read apart

    @classmethod
    def of(cls, text: str) -> PlatformIndex:
        """The index of `text`, built once however many scans of it ask (the same string object)."""
        last = cls._last
        if last is None or last.text is not text:
            last = cls._last = cls(text)
        return last

    def __init__(self, text: str) -> None:
        self.text = text
        self.tables = []
        first = _first_needle(text)  # one pass: most logs of OOM messages hold no clue at all
        if first < 0:
            return
        for name, needles, rx in _PLATFORM_HINTS:  # no needle starts before the leftmost one found
            hits = sorted((i, i + len(nd)) for nd in needles for i in _find_all(text, nd, first))
            if hits:  # the evidence regex runs only where a needle is near (see `hint`)
                self.tables.append((name, [h[0] for h in hits], hits, rx))

    @staticmethod
    def _first_inside(starts: list[int], items: list, lo: int, hi: int):
        k = bisect_left(starts, lo)
        while k < len(items) and items[k][0] < hi:
            if items[k][1] <= hi:
                return items[k]
            k += 1
        return None

    def hint(self, lo: int, hi: int) -> tuple[str | None, str | None]:
        for name, nstarts, hits, rx in self.tables:
            if self._first_inside(nstarts, hits, lo, hi) is not None:
                found = rx.search(self.text[lo:hi])  # a slice: \b and look-behinds see what the window sees
                if found is not None:
                    return name, found.group().strip()
        return None, None


BIG_TEXT = 100_000


# Any needle of any platform: whether a text holds one, in one pass (cheaper than a find per needle).
_NEEDLES = tuple(nd for _, needles, _ in _PLATFORM_HINTS for nd in needles)
_ANY_NEEDLE = re.compile("|".join(re.escape(nd) for nd in _NEEDLES))


def _first_needle(text: str) -> int:
    """Where the leftmost needle of any platform begins in `text`, or -1: the C scan
    (`_templates.find_any`, 2.6 against 6.6 ms per MB) where it was built, else the regex."""
    mod = native.templates()
    if mod is not None:
        return mod.find_any(text, _NEEDLES, 0)
    m = _ANY_NEEDLE.search(text)
    return m.start() if m else -1


def _find_all(text: str, needle: str, start: int = 0) -> Iterator[int]:
    i = text.find(needle, start)
    while i >= 0:
        yield i
        i = text.find(needle, i + 1)


def platform_hint(
    text: str, start: int, end: int, vendor: str, index: PlatformIndex | None = None
) -> tuple[str | None, str | None]:
    """Guess the OS from paths and words near the message; `(platform, evidence)`.

    MPS means macOS whatever the surroundings say.
    """
    if vendor == "mps":
        return "macos", "MPS backend"
    if index is not None:
        return index.hint(max(0, start - _CONTEXT), min(len(text), end + _CONTEXT))
    ctx = text[max(0, start - _CONTEXT) : min(len(text), end + _CONTEXT)]
    for name, needles, rx in _PLATFORM_HINTS:
        if any(n in ctx for n in needles):
            m = rx.search(ctx)
            if m:
                return name, m.group().strip()
    return None, None
