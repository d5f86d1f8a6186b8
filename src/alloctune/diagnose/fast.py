"""Read messages of a shape already seen with one regex match: a log of 100,000 OOMs at disk speed.

Why: a long log repeats a few message *shapes* with different numbers (every rank, every
retry). The grammar (`parse`) tries clause after clause on normalised text, which is exact but
costs more than the verdict. Once a clean message (one line, ASCII, nothing to un-escape) has
been parsed, its normalised text with every number the grammar read replaced by that number's
pattern is a template: another message matching it has the same clauses in the same order,
so its `Parsed` is the template's with the new numbers. The same report comes out as from the
grammar; anything the template cannot vouch for (a different shape, text after the message on
its line, a next line that could continue it) goes the grammar's way.

A template's match, figures and normalised text are one C call (`_templates.c`) where the
extension was built: the regex and `collapse` stay as its reference and fallback
(ALLOCTUNE_TEMPLATES=python forces them; tests/test_diagnose_native.py holds the two equal).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from operator import itemgetter
from operator import mul as _mul
from typing import Any

from alloctune.diagnose import parse as grammar
from alloctune.diagnose.native import templates as _native
from alloctune.diagnose.parse import _LINE_PREFIX
from alloctune.diagnose.platform import platform_hint
from alloctune.diagnose.report import FIGURE_FIELDS, OOMReport

# ASCII digits only (the grammar's `\d` also reads other scripts' digits, but not in every clause):
# a message written with others goes the grammar's way.
_SIZE = r"([0-9]+(?:\.[0-9]+)?) *(bytes|[KMGTP]i?B)(?![A-Za-z])"
_INT = r"([0-9]+)"
# ASCII and the full-width punctuation Chinese input methods type: normalisation only turns blanks and
# line breaks into one space, and those marks into their ASCII forms.
_CLEAN = re.compile(r"[ -~\t\r\n；：（），]*")
_WIDE = {";": "；", ":": "：", "(": "（", ")": "）", ",": "，"}
_NARROW = str.maketrans({w: a for a, w in _WIDE.items()})
# (a mark as re.escape writes it, a class of it and its full-width form); no replacement adds a later mark
_EITHER = tuple((re.escape(a), f"[{re.escape(a)}{w}]") for a, w in _WIDE.items())
_DIGITS = b"0123456789"
_SEPS = frozenset(" \t.,;")
_MAX = 1024  # templates kept (a log has a few shapes; the memory stays bounded whatever it holds)
# A shape's key: the UTF-8 bytes of its first characters without their digits (bytes.translate drops
# them at C speed; str.translate looks each character up, ten times slower).
_KEY_RAW, _KEY = 200, 120
_MULT = grammar._MULT
# What a template reads: report fields (`find.with_figures` sets them by name) and a process's pid and memory.
_FIGURES = FIGURE_FIELDS
_set = object.__setattr__  # a report's fields set at once (the class is frozen)
_READ = frozenset((*_FIGURES, "pid", "mem"))


class Template:
    """One message shape: the regex that matches its raw text and the report of the message it was
    learnt from (everything but the figures is the same)."""

    __slots__ = (
        "pattern",
        "_rx",
        "prog",
        "proto",
        "reads",
        "targets",
        "base",
        "derive",
        "has_procs",
        "ints",
        "sized",
        "nums",
        "units",
    )

    def __init__(self, proto: OOMReport, norm_text: str, parsed: grammar.Parsed) -> None:
        parts, pos, reads, k = [], 0, [], 1
        words: list[str | bool] = []  # the literal texts, and for each number whether it is whole
        for target, a, b in sorted(parsed.numbers, key=lambda t: t[1]):
            parts.append(_literal(norm_text[pos:a]))
            whole = target in ("device", "pid")
            parts.append(_INT if whole else _SIZE)
            words += [norm_text[pos:a], whole]
            reads.append((target, k, whole))
            k += 1 if whole else 2
            pos = b
        parts.append(_literal(norm_text[pos : parsed.end]))
        words.append(norm_text[pos : parsed.end])
        self.pattern = "".join(parts)
        self._rx: re.Pattern[str] | None = None  # compiled when first needed (C reads most logs alone)
        native = _native()
        ops = _program(words) if native is not None else None
        self.prog = native.compile(ops, _MULT) if ops is not None else None
        self.targets = tuple(t for t, _, _ in reads)  # what each number of a native match sets, in order
        self.proto = proto
        self.reads = tuple(reads)  # (target, its first group, a plain integer?)
        # What `build` needs, worked out once per shape: which figures a match sets is fixed by the
        # template, so the derivation `find._derive` makes (and its `derived` names) is fixed too.
        read = {t for t, _, _ in reads}
        self.base = {**proto.__dict__, **dict.fromkeys(_FIGURES), "other_processes": (), "derived": ()}
        native = proto.backend == "native" and proto.vendor != "mps"
        if "reserved" not in read and {"allocated", "reserved_unallocated"} <= read and native:
            self.derive, derived = 1, ("reserved",)  # reserved = allocated + unallocated
        elif "reserved_unallocated" not in read and {"allocated", "reserved"} <= read:
            self.derive, derived = 2, ("reserved_unallocated",)  # unallocated = reserved - allocated
        else:
            self.derive, derived = 0, ()
        self.base["derived"] = derived
        # (group index, target or None for a process's pid / "" for its memory, a plain integer?)
        self.has_procs = "mem" in read
        # Without processes, the sizes are read in one go (C loops over the groups): their numbers,
        # their units and the fields they set; whole numbers (the device) one by one.
        sizes = [(k - 1, t) for t, k, whole in reads if not whole]
        self.ints = tuple((k - 1, t) for t, k, whole in reads if whole)
        self.sized = tuple(t for _, t in sizes)
        self.nums = _getter([k for k, _ in sizes])
        self.units = _getter([k + 1 for k, _ in sizes])

    @property
    def rx(self) -> re.Pattern[str]:
        """The regex of the shape: the reference of the C program, and the way without it. Compiled
        on first use: compiling the ~40 shapes of a log took ~80 ms, a tenth of reading 10 MB."""
        if self._rx is None:
            self._rx = re.compile(self.pattern)
        return self._rx

    def build(self, m: re.Match[str], text: str, platform: str | None, index, base: int) -> OOMReport:
        """The report of the message `m` matched: the proto's report with the figures the grammar
        would read (a number's unit follows it after one space or none, as it prints), in one step
        (one dict per report, the derivation decided per shape)."""
        s, e = m.span()
        g = m.groups()
        d = self.base.copy()
        if self.has_procs:
            self._figures(g, d)
        else:
            try:  # int(round(float(num) * unit)) for every size, as the grammar reads it
                d.update(zip(self.sized, map(round, map(_mul, map(float, self.nums(g)), map(_MULT.__getitem__, self.units(g))))))
            except KeyError:  # a unit without a multiplier here (PB): every figure the general way
                self._figures(g, d)
            for k, target in self.ints:
                d[target] = int(g[k])
        raw = text[s:e]
        return self._finish(d, raw, collapse(raw), s, e, text, platform, index, base)

    def build_native(self, hit: tuple[int, tuple, str], text: str, s: int, platform: str | None, index, base: int) -> OOMReport:
        """`build` of a native match, `hit` = (end, the numbers in order, the normalised text)."""
        e, values, norm = hit
        d = self.base.copy()
        if self.has_procs:
            procs = _place(zip(self.targets, values), d)
            if procs:
                d["other_processes"] = procs
        else:
            d.update(zip(self.targets, values))
        raw = text[s:e]
        # One string for both where they are equal (most messages): half the memory, and half the
        # bytes a worker sends back for the reports its groups keep.
        return self._finish(d, raw, raw if raw == norm else norm, s, e, text, platform, index, base)

    def _finish(
        self, d: dict, raw: str, norm: str, s: int, e: int, text: str, platform: str | None, index, base: int
    ) -> OOMReport:
        """The derived figure, the texts, the span and the platform clue into `d`: the report."""
        if self.derive == 1:
            d["reserved"] = d["allocated"] + d["reserved_unallocated"]
        elif self.derive == 2:
            d["reserved_unallocated"] = max(0, d["reserved"] - d["allocated"])
        d["raw"] = raw
        d["text"] = norm
        d["span"] = (s + base, e + base)
        if platform:
            d["platform"], d["platform_evidence"] = platform, "given"
        elif index is not None and not index.tables and self.proto.vendor != "mps":
            d["platform"], d["platform_evidence"] = None, None  # no clue anywhere in the text
        else:
            d["platform"], d["platform_evidence"] = platform_hint(text, s, e, self.proto.vendor, index)
        out = object.__new__(OOMReport)
        _set(out, "__dict__", d)
        return out

    def _figures(self, g: tuple, d: dict) -> None:
        """Every figure of the match into `d`, one by one (processes as `other_processes`)."""
        procs = _place(((t, _figure(g, k - 1, whole)) for t, k, whole in self.reads), d)
        if procs:
            d["other_processes"] = procs


def _figure(g: tuple, k: int, whole: bool) -> int:
    """The figure at group `k` of a template's match (a size: its number and unit), as the grammar
    reads it."""
    if whole:
        return int(g[k])
    num, unit = g[k], g[k + 1]
    mult = _MULT.get(unit)
    return round(float(num) * mult) if mult else grammar._size(f"{num} {unit}")


def _place(figures: Iterable[tuple[str, int]], into: dict) -> tuple[tuple[int, int], ...]:
    """Each (target, figure) into `into`, but a process's pid and memory, which pair up: the
    processes, in order."""
    procs, pid = [], 0
    for target, n in figures:
        if target == "pid":
            pid = n
        elif target == "mem":
            procs.append((pid, n))
        else:
            into[target] = n
    return tuple(procs)


def _getter(idx: list[int]):
    """The groups at `idx`, as a tuple whatever their number (`itemgetter` gives one bare)."""
    if len(idx) == 1:
        k = idx[0]
        return lambda g: (g[k],)
    return itemgetter(*idx) if idx else (lambda g: ())


class FastReader:
    """The templates learnt so far; `match` tries them on a message start."""

    def __init__(self) -> None:
        self.templates: dict[bytes, list[Template]] = {}  # by key: usually one template each
        self.count = 0

    @staticmethod
    def key(text: str, s: int) -> bytes:
        return text[s : s + _KEY_RAW].encode("utf-8", "surrogatepass").translate(None, _DIGITS)[:_KEY]

    def learn(self, report: OOMReport, norm_text: str, parsed: grammar.Parsed) -> None:
        """Keep the shape of a message the grammar read, if it is clean enough to template."""
        raw_msg = report.raw
        if (
            not parsed.clauses
            or parsed.head in ("thc", "cuda-error")
            or _CLEAN.fullmatch(raw_msg) is None
            or any(t[0] not in _READ for t in parsed.numbers)
            or norm_text[: parsed.end] != collapse(raw_msg)
            or report.text != norm_text[: parsed.end]
        ):
            return
        if self.count >= _MAX:
            self.templates.clear()
            self.count = 0
        slot = self.templates.setdefault(self.key(raw_msg, 0), [])
        t = Template(report, norm_text, parsed)
        if any(u.pattern == t.pattern for u in slot):
            return  # the same shape, learnt again where a template was declined (text after it, say)
        slot.insert(0, t)
        self.count += 1

    def find(self, text: str, s: int) -> tuple[Template, Any, int] | None:
        """(the template, its match, where it ends) of the message at `text[s]`, or None when no
        template vouches for it; `Template.build` (a regex match) or `Template.build_native` turns
        the match into the report."""
        native = _native()
        key = native.key if native is not None else self.key
        for t in self.templates.get(key(text, s), ()):
            hit = native.match(t.prog, text, s) if t.prog is not None and native is not None else False
            if hit is None:
                continue  # (C: no match here)
            if hit is False:  # the regex reads it: no C program, or a figure the Python way must read
                hit = t.rx.match(text, s)
                end = hit.end() if hit is not None else -1
            else:
                end = hit[0]
            if end >= 0 and _ends_here(text, end):
                return t, hit, end
            # else: the grammar would read on: a longer shape of the same beginning may fit
        return None


def _program(words: list[str | bool]) -> list[tuple] | None:
    """The C program of a template, from its literal texts and, between them, whether each
    number is whole (`([0-9]+)`) or a size; None where matching it could need backtracking (a whole
    number right before a digit or another number), which the C matcher does not do: the regex
    reads that shape."""
    ops: list[tuple] = []
    for item in words:
        if isinstance(item, bool):
            if ops and ops[-1][0] in ("int", "size"):
                return None  # two numbers with nothing between them
            ops.append(("int",) if item else ("size",))
            continue
        lit: list[str] = []
        for ch in item:
            if ch == " ":
                if lit:
                    ops.append(("lit", "".join(lit)))
                    lit = []
                if ops and ops[-1][0] == "ws":
                    ops[-1] = ("ws", ops[-1][1] + 1)
                else:
                    ops.append(("ws", 1))
            elif ch in _WIDE:
                if lit:
                    ops.append(("lit", "".join(lit)))
                    lit = []
                ops.append(("either", ch + _WIDE[ch]))
            elif ch in "\t\r\n":
                return None  # (normalised text holds none)
            else:
                if not lit and ops and ops[-1][0] == "int" and "0" <= ch <= "9":
                    return None  # `[0-9]+` would give a digit back to the literal
                lit.append(ch)
        if lit:
            ops.append(("lit", "".join(lit)))
    return ops


def _literal(words: str) -> str:
    """Regex for normalised text as it may stand raw: any run of blanks for a space, the full-width
    form of a punctuation mark for the mark."""
    out = re.escape(words).replace("\\ ", r"[ \t\r\n]+")
    for escaped, either in _EITHER:
        out = out.replace(escaped, either)
    return out


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
            return not _may_start_clause(text, i)
    return True


def _may_start_clause(text: str, i: int) -> bool:
    """Whether a clause of the grammar might start at `text[i]` (its first character after the
    separators): False only where every clause is ruled out by the plain characters there (those
    normalisation leaves as they are), so the grammar would surely stop before them."""
    c = text[i]
    if _ANY_START or not _PLAIN.fullmatch(c):
        return True  # (an entity, an escape, a break, any non-ASCII: normalisation may rewrite it)
    for literal in _BY_FIRST.get(c, ()):
        if not literal or text.startswith(literal, i):
            return True  # a clause that begins otherwise may start with c, or the literal is all there
        m = min(len(literal), len(text) - i)
        j = 1
        while j < m and text[i + j] == literal[j]:
            j += 1
        if j == m or not _PLAIN.fullmatch(text[i + j]):
            return True  # the text ends inside it, or normalisation may turn that character into it
    return False


def _clause_starts() -> tuple[tuple[str, frozenset[str] | None], ...]:
    """Per grammar clause: the literal text it begins with (after its separators), or, where it
    begins otherwise, the characters it may begin with (None: any)."""
    try:
        from re import _parser as sre
    except ImportError:  # Python 3.10
        import sre_parse as sre  # type: ignore[no-redef]
    out = []
    for _key, rx, _rep in grammar._CLAUSES:
        items = list(sre.parse(rx.pattern[len(grammar._SEP) :]))
        lit = []
        for op, av in items:
            if op is not sre.LITERAL:
                break
            lit.append(chr(av))
        out.append(("".join(lit), None if lit else _first_chars(items, sre)))
    return tuple(out)


def _first_chars(items: list, sre) -> frozenset[str] | None:
    """The characters a parsed pattern can begin with; None where it cannot tell (then: any)."""
    for op, av in items:
        if op is sre.LITERAL:
            return frozenset(chr(av))
        if op is sre.IN:
            chars: set[str] = set()
            for kind, v in av:
                if kind is sre.LITERAL:
                    chars.add(chr(v))
                elif kind is sre.CATEGORY and v is sre.CATEGORY_DIGIT:
                    chars.update("0123456789")  # (and other scripts' digits: not ASCII, ruled out before)
                else:
                    return None
            return frozenset(chars)
        if op is sre.SUBPATTERN:
            return _first_chars(list(av[-1]), sre)
        if op is sre.BRANCH:
            alts = [_first_chars(list(alt), sre) for alt in av[1]]
            return None if any(a is None for a in alts) else frozenset().union(*alts)
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT) and av[0] >= 1:
            return _first_chars(list(av[2]), sre)
        return None
    return None


_PLAIN = re.compile(r"[A-Za-z0-9!-%'-/:;=>?@\[\]-`{-~]")  # ASCII that normalisation copies as it is
_CLAUSE_STARTS = _clause_starts()
# The clauses by their possible first character: their literal beginnings ("" for one that begins otherwise).
_BY_FIRST: dict[str, list[str]] = {}
for _lit, _first in _CLAUSE_STARTS:
    for _c in (_lit[0],) if _lit else (_first or ()):
        _BY_FIRST.setdefault(_c, []).append(_lit)
_ANY_START = any(not lit and first is None for lit, first in _CLAUSE_STARTS)
