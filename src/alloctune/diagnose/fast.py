"""Read messages of a shape already seen with one regex match: a log of 100,000 OOMs at disk speed.

Why: a long log repeats a few message *shapes* with different numbers (every rank, every
retry). The grammar (`parse`) tries clause after clause on normalised text, which is exact but
costs more than the verdict. Once a clean message (one line, ASCII, nothing to un-escape) has
been parsed, its normalised text with every number the grammar read replaced by that number's
pattern is a template: another message matching it has the same clauses in the same order,
so its `Parsed` is the template's with the new numbers. The same report comes out as from the
grammar; anything the template cannot vouch for (a different shape, text after the message on
its line, a next line that could continue it) goes the grammar's way.
"""

from __future__ import annotations

import re

from alloctune.diagnose import parse as grammar
from alloctune.diagnose.parse import _LINE_PREFIX
from alloctune.diagnose.report import OOMReport

_SIZE = r"(\d+(?:\.\d+)?) *(bytes|[KMGTP]i?B)(?![A-Za-z])"
_INT = r"(\d+)"
# ASCII and the full-width punctuation Chinese input methods type: normalisation only turns blanks and
# line breaks into one space, and those marks into their ASCII forms.
_CLEAN = re.compile(r"[ -~\t\r\n；：（），]*")
_WIDE = {";": "；", ":": "：", "(": "（", ")": "）", ",": "，"}
_NARROW = str.maketrans({w: a for a, w in _WIDE.items()})
_NO_DIGITS = str.maketrans("", "", "0123456789")  # translate() drops them: faster than a regex here
# First characters of a clause (after its separators) or of something normalisation rewrites:
# a next line starting with one of these might continue the message.
_MAY_CONTINUE = frozenset("TGXNoPIOwaSUCRDFA()0123456789&\\<")
_SEPS = frozenset(" \t.,;")
_MAX = 1024  # templates kept (a log has a few shapes; the memory stays bounded whatever it holds)
_KEY_RAW, _KEY = 200, 120  # a shape's key: the first characters without their digits
_MULT = grammar._MULT
# What a template reads: report fields (`find.with_figures` sets them by name) and a process's pid and memory.
_READ = frozenset(("device", "requested", "total", "free", "allocated", "active", "reserved", "reserved_unallocated",
                   "private_pools", "cap", "process_in_use", "other_allocations", "pid", "mem"))


class Template:
    """One message shape: the regex that matches its raw text and the report of the message it was
    learnt from (everything but the figures is the same)."""

    __slots__ = ("rx", "proto", "reads")

    def __init__(self, proto: OOMReport, norm_text: str, parsed: grammar.Parsed) -> None:
        parts, pos, reads, k = [], 0, [], 1
        for target, a, b in sorted(parsed.numbers, key=lambda t: t[1]):
            parts.append(_literal(norm_text[pos:a]))
            whole = target in ("device", "pid")
            parts.append(_INT if whole else _SIZE)
            reads.append((target, k, whole))
            k += 1 if whole else 2
            pos = b
        parts.append(_literal(norm_text[pos:parsed.end]))
        self.rx = re.compile("".join(parts))
        self.proto = proto
        self.reads = tuple(reads)  # (target, its first group, a plain integer?)

    def read(self, m: re.Match[str]) -> tuple[dict, list[tuple[int, int]]]:
        """(values, processes) of the matched message, as the grammar reads them. Its normalised
        text is its raw text with each run of blanks one space (`collapse`): the template's words
        are the grammar's, and a number's unit follows it after one space or none, as it prints."""
        values: dict = {}
        procs, pid = [], 0
        groups = m.groups()
        for target, k, whole in self.reads:
            if whole:
                n = int(groups[k - 1])
            else:
                num, unit = groups[k - 1], groups[k]
                mult = _MULT.get(unit)
                n = int(round(float(num) * mult)) if mult else grammar._size(f"{num} {unit}")
            if target == "pid":
                pid = n
            elif target == "mem":
                procs.append((pid, n))
            else:
                values[target] = n
        return values, procs


class FastReader:
    """The templates learnt so far; `match` tries them on a message start."""

    def __init__(self) -> None:
        self.templates: dict[str, list[Template]] = {}  # by key: usually one template each
        self.count = 0

    @staticmethod
    def key(text: str, s: int) -> str:
        return text[s : s + _KEY_RAW].translate(_NO_DIGITS)[:_KEY]

    def learn(self, report: OOMReport, norm_text: str, parsed: grammar.Parsed) -> None:
        """Keep the shape of a message the grammar read, if it is clean enough to template."""
        raw_msg = report.raw
        if (not parsed.clauses or parsed.head in ("thc", "cuda-error") or _CLEAN.fullmatch(raw_msg) is None
                or any(t[0] not in _READ for t in parsed.numbers)
                or norm_text[:parsed.end] != collapse(raw_msg) or report.text != norm_text[:parsed.end]):
            return
        if self.count >= _MAX:
            self.templates.clear()
            self.count = 0
        slot = self.templates.setdefault(self.key(raw_msg, 0), [])
        slot.insert(0, Template(report, norm_text, parsed))
        self.count += 1

    def match(self, text: str, s: int) -> tuple[OOMReport, dict, list[tuple[int, int]], str, int] | None:
        """(the shape's report, values, processes, normalised text, raw end) of the message at
        `text[s]`, or None when no template vouches for it."""
        for t in self.templates.get(self.key(text, s), ()):
            m = t.rx.match(text, s)
            if m is None:
                continue
            e = m.end()
            if not _ends_here(text, e):
                return None
            values, procs = t.read(m)
            return t.proto, values, procs, collapse(text[s:e]), e
        return None


def _literal(words: str) -> str:
    """Regex for normalised text as it may stand raw: any run of blanks for a space, the full-width
    form of a punctuation mark for the mark."""
    out = []
    for c in words:
        if c == " ":
            out.append(r"[ \t\r\n]+")
        elif c in _WIDE:
            out.append(f"[{re.escape(c)}{_WIDE[c]}]")
        else:
            out.append(re.escape(c))
    return "".join(out)


def collapse(raw: str) -> str:
    """The normalised text of a clean raw message (no blank at either end): each run of blanks and
    line breaks one space, full-width punctuation in its ASCII form. Plain string operations: a
    regex substitution costs several times more on a message of 500 characters."""
    if not raw.isascii():
        raw = raw.translate(_NARROW)
    if "\n" in raw or "\t" in raw or "\r" in raw:
        return " ".join(raw.split())  # ASCII: split() breaks exactly at [ \t\r\n] here
    while "  " in raw:
        raw = raw.replace("  ", " ")
    return raw


def _ends_here(text: str, e: int) -> bool:
    """Whether the grammar, reading on from `e`, would surely stop: nothing but blanks up to the
    line's end, and no following line that starts like a clause (after its log prefixes)."""
    n = len(text)
    i = e
    while i < n and text[i] in " \t":
        i += 1
    if i < n and text[i] not in "\r\n":
        return False  # more on this line: the grammar (and its re-joining of wrapped lines) decides
    while i < n:
        c = text[i]
        if c in "\r\n":
            i += 1
            while True:  # the prefixes normalisation strips after a line break
                pm = _LINE_PREFIX.match(text, i)
                if not pm or pm.end() == i:
                    break
                i = pm.end()
        elif c in _SEPS or c.isspace():
            i += 1
        else:
            return c not in _MAY_CONTINUE and c.isascii()
    return True
