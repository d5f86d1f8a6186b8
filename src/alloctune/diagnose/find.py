"""Find every out-of-memory message inside arbitrary text and turn each into an `OOMReport`.

Users paste messages wrapped in tracebacks, log prefixes (`[rank0]:`, vLLM's `ERROR 03-13 ...
[core.py:330]`, Ray's `(Worker pid=1)`), JSON strings with `\\n` escapes, HTML tables, Markdown
quotes, re-wrapped lines and CRLF. Rather than teaching the grammar all of that, each candidate
region is first *normalised* (`normalize.py`) into single-spaced plain text while remembering, for every
normalised character, where it came from; the grammar (`parse`) then reads clean text, and spans
map back to the exact slice of the input.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from alloctune.diagnose import parse as grammar
from alloctune.diagnose.normalize import Normalized
from alloctune.diagnose.parse import _LINE_PREFIX
from alloctune.diagnose.platform import _CONTEXT, BIG_TEXT, PlatformIndex, platform_hint  # noqa: F401
from alloctune.diagnose.report import FIGURE_FIELDS, OOMReport

if TYPE_CHECKING:
    from alloctune.diagnose.fast import FastReader

# A message is at most a few hundred characters; with per-line log prefixes and escapes it can
# span more. Normalising a bounded window per candidate keeps the scan linear in the input size.
WINDOWS = (1000, 2500, 20000)


# ---- from parsed clauses to an OOMReport ---------------------------------------------------

_VERSION_HINTS = {
    "thc": "<=0.4",
    "paren-cached": "0.4-1.3",
    "paren-reserved": "1.4-1.9",
    "paren-hint": "1.10-2.0",
    "2.1": "2.1",
    "preemptive": ">=2.12",
}


def _format_and_hint(p: grammar.Parsed, vendor: str) -> tuple[str, str | None]:
    v, c = p.values, set(p.clauses)
    head = p.head
    if head == "thc":
        return "thc", _VERSION_HINTS["thc"]
    if head == "cuda-error":
        return "cuda-error", None
    if head == "mps" or "mps-figures" in c:
        return "mps", None
    if head in ("async", "async-pt") or any(k.startswith("async-") for k in c):
        return "cudamallocasync", None
    if "preemptive" in c:
        return "preemptive", _VERSION_HINTS["preemptive"]
    if "tried-1eb" in c:
        return "1eb", None
    labels = v.get("_legacy_labels", [])
    if "paren" in c or set(labels) - {"allowed"}:  # 2.x prints "X allowed;" outside any parenthesis
        if vendor == "npu":
            return "npu-paren", None
        if "cached" in labels:
            return "paren-cached", _VERSION_HINTS["paren-cached"]
        if "hint-legacy" in c:
            return "paren-hint", _VERSION_HINTS["paren-hint"]
        if "docs" in c or "reserved in total by PyTorch" in labels:
            # without the hint sentence it is 1.4-1.9 unless the text was cut before it
            return "paren-reserved", _VERSION_HINTS["paren-reserved"] if c & {"close"} else None
        return "paren", None
    if vendor == "xpu":
        return "xpu", None
    if v.get("capacty") == "capacty":
        return "2.1", "2.1"
    return "2.2+", _modern_hint(p, vendor)


def _modern_hint(p: grammar.Parsed, vendor: str) -> str | None:
    v, c = p.values, set(p.clauses)
    hint, url = v.get("hint") or "", v.get("docs_url") or ""
    if hint == "max_split_size_mb":
        return "2.1"
    if "PYTORCH_ALLOC_CONF=" in hint and "HIP" not in hint:
        return "2.10"
    if "docs.pytorch.org" in url:
        return ">=2.11"
    lo = "2.4" if "private" in c else "2.2"
    if vendor == "cuda" and "pytorch.org/docs" in url and "PYTORCH_CUDA_ALLOC_CONF=" in hint:
        return f"{lo}-2.9"
    return f">={lo}"


def _derive(v: dict, backend: str, vendor: str) -> tuple[int | None, int | None, list[str]]:
    """(reserved, reserved_unallocated, names of the derived ones): each era prints one of the two."""
    derived: list[str] = []
    allocated, reserved, unalloc = v.get("allocated"), v.get("reserved"), v.get("reserved_unallocated")
    if reserved is None and allocated is not None and unalloc is not None and backend == "native" and vendor != "mps":
        reserved = allocated + unalloc  # 2.1+: "A is allocated ... and R-A is reserved but unallocated"
        derived.append("reserved")
    if unalloc is None and allocated is not None and reserved is not None:
        unalloc = max(0, reserved - allocated)  # <=2.0: reserved in total minus already allocated
        derived.append("reserved_unallocated")
    return reserved, unalloc, derived


# The figures a template reads (each `OOMReport` field of that name), all unknown.
_NO_FIGURES = dict.fromkeys(FIGURE_FIELDS)


def with_figures(
    proto: OOMReport,
    v: dict,
    processes: list[tuple[int, int]],
    text: str,
    raw: str,
    start: int,
    end: int,
    platform: str | None,
    index: PlatformIndex | None,
    base: int = 0,
) -> OOMReport:
    """The report of a message of `proto`'s shape (same clauses, same words) with figures `v` (keyed
    by field name): what `build_report` gives for it, without working out the shape again (span
    moved by `base`)."""
    reserved, unalloc, derived = _derive(v, proto.backend, proto.vendor)
    plat, evidence = (platform, "given") if platform else platform_hint(raw, start, end, proto.vendor, index)
    new = dict(_NO_FIGURES)
    new.update(v)
    new.update(
        text=text,
        raw=raw[start:end],
        span=(start + base, end + base),
        reserved=reserved,
        reserved_unallocated=unalloc,
        other_processes=tuple(processes),
        derived=tuple(derived),
        platform=plat,
        platform_evidence=evidence,
    )
    if not hasattr(proto, "__dict__"):
        from dataclasses import replace

        return replace(proto, **new)
    out = object.__new__(OOMReport)
    out.__dict__.update(proto.__dict__)
    out.__dict__.update(new)
    return out


def build_report(
    p: grammar.Parsed, norm: Normalized, i: int, raw: str, platform: str | None = None, index: PlatformIndex | None = None
) -> OOMReport:
    """Assemble the frozen report: vendor, backend, derived figures, hints, span."""
    v = dict(p.values)
    devkind = v.get("devkind")
    vendor = (v.get("vendor") or "").lower()
    if p.head == "mps" or "mps-figures" in p.clauses:
        vendor = "mps"
    elif not vendor:
        vendor = {"NPU": "npu", "XPU": "xpu"}.get(devkind or "", "cuda")
    backend = "cudaMallocAsync" if p.head.startswith("async") or any(k.startswith("async-") for k in p.clauses) else "native"
    fmt, torch_hint = _format_and_hint(p, vendor)

    allocated = v.get("allocated")
    reserved, unalloc, derived = _derive(v, backend, vendor)

    # Truncated: the message stops before the figures its format always carries.
    ends = {"close", "docs", "url", "hint", "hint-legacy", "xpu-hint", "mps-hint", "async-cap", "preemptive-size", "tried-1eb"}
    truncated = False
    if fmt in ("thc", "cuda-error"):
        truncated = False
    elif fmt == "cudamallocasync":
        truncated = "async-cap" not in p.clauses and "async-free" not in p.clauses
    elif fmt == "xpu":
        truncated = "of-allocated" not in p.clauses and "unallocated" not in p.clauses
    else:
        truncated = not (ends & set(p.clauses)) and "unallocated" not in p.clauses

    j = p.end
    start, end = norm.raw_span(i, j)
    plat, evidence = platform_hint(raw, start, end, vendor, index)
    if platform:
        plat, evidence = platform, "given"
    return OOMReport(
        vendor=vendor,
        backend=backend,
        format=fmt,
        text=norm.text[i:j].strip(),
        raw=raw[start:end],
        span=(start, end),
        truncated=truncated,
        device=v.get("device"),
        requested=v.get("requested"),
        total=v.get("total"),
        free=v.get("free"),
        allocated=allocated,
        active=v.get("active"),
        reserved=reserved,
        reserved_unallocated=unalloc,
        private_pools=v.get("private_pools"),
        cap=v.get("cap"),
        process_in_use=v.get("process_in_use"),
        other_allocations=v.get("other_allocations"),
        other_processes=tuple(p.processes),
        derived=tuple(derived),
        hint=v.get("hint"),
        docs_url=v.get("docs_url"),
        torch_hint=torch_hint,
        platform=plat,
        platform_evidence=evidence,
        request_pool=v.get("request_pool"),
        location=v.get("location"),
    )


_EXC_BEFORE = re.compile(r"(?:Error|Exception|error|exception|[:>*\-!\]])[\s*]*$")
# Only an exception's own message stands after these: whatever a GUI or logger appends after the
# short form ("torch.OutOfMemoryError: Allocation on device  (node 12)") does not make it prose.
_STRONG_BEFORE = re.compile(
    r"(?:OutOfMemoryError|[Ee]rror|[Ee]xception)\s*:[\s*]*$|!!![\s*]*$"
    r"|\b(?:ERROR|CRITICAL|FATAL)\b[\]\s:|-]*$"
)
_JSON_VALUE_BEFORE = re.compile(r'"[\w.-]+"\s*:\s*"$')  # {"log": "...  (Docker, JSON loggers)
_LINE_END = re.compile(r'\n|\\[nr]|"|<')  # a line, a JSON-escaped line, a JSON string, an HTML cell
_LOOKBACK = 3000  # how far back the start of a line is looked for (and platform clues before a message)


def _plausible_bare_head(text: str, m: re.Match[str], parsed: grammar.Parsed) -> bool:
    """A head with no clause after it ("CUDA out of memory.", ComfyUI's cut "Allocation on device")
    counts only where an exception message would stand: after "...Error:", a log marker, or only
    log prefixes (timestamps, `[rank0]:`) on its line, and with nothing but punctuation after it
    on its line -- unless an exception name stands right before it, when anything may follow.
    Prose ("I meet CUDA out of memory when...") does not count."""
    line_start = text.rfind("\n", max(0, m.start() - _LOOKBACK), m.start()) + 1
    before = text[line_start : m.start()]
    pos = 0
    while True:  # log prefixes only: as if the line started here
        pm = _LINE_PREFIX.match(before, pos)
        if not pm or pm.end() == pos:
            break
        pos = pm.end()
    before = before[pos:]
    if _STRONG_BEFORE.search(before):
        return True
    le = _LINE_END.search(text, m.end(), m.end() + _LOOKBACK)
    after = text[m.end() : le.start() if le else min(len(text), m.end() + _LOOKBACK)]
    if parsed.head in ("async", "async-pt"):
        after = re.sub(r"^\s*\d+", "", after)
    before_ok = not before.strip() or bool(_EXC_BEFORE.search(before) or _JSON_VALUE_BEFORE.search(before))
    after_ok = not re.search(r"[A-Za-z0-9]", after.lstrip(".").strip(" .'\"`)*"))
    return before_ok and after_ok


# Line breaks that split a message: a terminal's hard wrap cuts every line at one width, a
# container runtime marks the pieces of a long line "P" (partial).
_WRAP_MIN = 40
_CRI_PARTIAL = re.compile(r"\S+ (?:stdout|stderr) P ")


def _joins(chunk: str, lead: str) -> frozenset[int]:
    """Line breaks of `chunk` to drop: after a CRI partial line, or after a line exactly as long as
    the longest line (at least `_WRAP_MIN`), as a terminal's hard wrap leaves them. `lead` is the
    text of the first line before `chunk` starts."""
    out, width, lines = set(), 0, []
    start, line = 0, lead
    for k, piece in enumerate(chunk.split("\n")[:-1]):
        full = (line if k == 0 else "") + piece
        brk = start + len(piece) - (1 if piece.endswith("\r") else 0)
        full = full.rstrip("\r")
        if _CRI_PARTIAL.match(full):
            out.add(brk)
        lines.append((len(full), brk))
        width = max(width, len(full))
        start += len(piece) + 1
    if width >= _WRAP_MIN:
        out.update(brk for n, brk in lines if n == width)
    return frozenset(out)


def _rejoined(chunk: str, lead: str, norm: Normalized, parsed: grammar.Parsed | None):
    """The window parsed again without the line breaks that split it, when the message stops just
    before such a break with words left on that line; `None` unless that reads more clauses."""
    if parsed is None:
        return None
    stop = norm.raw_span(parsed.end, parsed.end)[0]
    nl = chunk.find("\n", stop, stop + 300)
    if nl < 0 or not chunk[stop:nl].strip():
        return None
    joins = _joins(chunk, lead)
    if not joins or (nl not in joins and nl - 1 not in joins):
        return None
    norm2 = Normalized(chunk, 0, len(chunk), joins)
    parsed2 = grammar.parse_at(norm2.text, 0)
    if parsed2 is None or len(parsed2.clauses) <= len(parsed.clauses):
        return None
    return norm2, parsed2


# Memory for repeats within one call (a log often repeats one message thousands of times).
_CACHE_CHARS = 8_000_000

# Messages after which a big text's platform clues are indexed once instead of scanned per message.
_INDEX_AFTER = 64

# What a message may need after its first character: the largest window plus the platform context.
LOOKAHEAD = WINDOWS[-1] + _CONTEXT


class _Shifted:
    """A window normalised from a slice, with raw positions moved back into the whole text."""

    __slots__ = ("text", "_norm", "_base")

    def __init__(self, norm: Normalized, base: int) -> None:
        self.text, self._norm, self._base = norm.text, norm, base

    def raw_span(self, i: int, j: int) -> tuple[int, int]:
        a, b = self._norm.raw_span(i, j)
        return a + self._base, b + self._base


class ReportFinder:
    """Finds the messages of one text, given whole or piece by piece (`alloctune.diagnose.scan`).

    Linear in the text, and fast on logs made of repeats: a window is normalised once per
    distinct raw window and parsed once per distinct normalised text; a repeat's report is the
    first one's with its own span and platform clue. Windows are normalised from a slice, which
    is exact: neither normalisation nor the line-prefix rules look behind their start.
    """

    def __init__(self, platform: str | None = None, *, fast: bool | FastReader = True, index_after: int = _INDEX_AFTER) -> None:
        """`fast=False`: every message through the grammar (the reference the templates are tested against);
        `index_after`: messages read before a big text's clues are indexed (0: a chunk of a big log)."""
        self.platform = platform
        self.found = 0
        self.index_after = index_after
        self.pos = 0  # where the next `scan` resumes
        self._windows: dict[str, tuple[Normalized, grammar.Parsed | None]] = {}
        self._parsed: dict[str, grammar.Parsed | None] = {}
        self._reports: dict[str, tuple[int, OOMReport]] = {}
        self._cached = 0
        from alloctune.diagnose.fast import FastReader

        self.fast = (fast if isinstance(fast, FastReader) else FastReader()) if fast else None  # shareable

    def _window(self, text: str, s: int, e: int) -> tuple[str, Normalized, grammar.Parsed | None]:
        chunk = text[s:e]
        hit = self._windows.get(chunk)
        if hit is not None:
            return chunk, hit[0], hit[1]
        norm = Normalized(chunk, 0, len(chunk))
        parsed = self._parsed.get(norm.text, _MISSING)
        if parsed is _MISSING:
            parsed = self._parsed[norm.text] = grammar.parse_at(norm.text, 0)
        if "\n" in chunk:
            lead = text[text.rfind("\n", max(0, s - _LOOKBACK), s) + 1 : s]
            again = _rejoined(chunk, lead, norm, parsed)
            if again is not None:
                norm, parsed = again
        if self._cached > _CACHE_CHARS:
            self._windows.clear()
            self._parsed.clear()
            self._reports.clear()
            self._cached = 0
        self._windows[chunk] = (norm, parsed)
        self._cached += 2 * len(chunk)
        return chunk, norm, parsed

    def scan(self, text: str, pos: int, stop: int, *, big: bool, base: int = 0) -> Iterator[OOMReport]:
        """Reports of the messages that start in `text[pos:stop]`, spans relative to `text` plus `base`
        (where `text` starts in the whole input).

        `text` must reach `LOOKAHEAD` characters past `stop` unless it ends the input; `big`
        allows the platform-clue index (for texts above `BIG_TEXT`)."""
        n = len(text)
        index = PlatformIndex.of(text) if big and self.found >= self.index_after and self.platform is None else None
        self.pos = pos
        while pos < stop:
            m = grammar.ANCHOR.search(text, pos, stop + 200)
            if not m or m.start() >= stop:
                break
            s = m.start()
            hit = None if self.fast is None or text[s : s + WINDOWS[0]] in self._windows else self.fast.find(text, s)
            if hit is not None:  # a shape seen before, read with its template: the grammar's report
                t, x, end = hit
                if index is None and big and self.found + 1 == self.index_after and self.platform is None:
                    index = PlatformIndex.of(text)
                try:
                    report = (
                        t.build(x, text, self.platform, index, base)
                        if type(x) is not tuple
                        else t.build_native(x, text, s, self.platform, index, base)
                    )
                except grammar.UNREADABLE:  # a figure beyond a double or int(): the grammar refuses its clause
                    report = None
                if report is not None:
                    pos = self.pos = max(end, m.end())
                    if _echo(text, report.span[0] - base, report.span[1] - base):
                        continue
                    self.found += 1
                    yield report
                    continue
            for window in WINDOWS:  # small first; grow only if the message may run past the window
                e = min(n, s + window)
                chunk, norm, parsed = self._window(text, s, e)
                if parsed is None or e >= n or parsed.end < len(norm.text) - 200:
                    break
            if parsed is None or (
                not parsed.clauses and parsed.head not in ("thc", "cuda-error") and not _plausible_bare_head(text, m, parsed)
            ):
                pos = self.pos = m.end()
                continue
            self.found += 1
            if index is None and big and self.found == self.index_after and self.platform is None:
                index = PlatformIndex.of(text)
            first = self._reports.get(chunk)
            if first is None:
                report = build_report(parsed, _Shifted(norm, s), 0, text, self.platform, index)
                self._reports[chunk] = (s, report)
                if report.span[0] == s and self.fast is not None:
                    self.fast.learn(report, norm.text, parsed)
            else:
                report = _repeat(
                    first[1], first[1].span[0] - first[0] + s, first[1].span[1] - first[0] + s, text, self.platform, index
                )
            pos = self.pos = max(report.span[1], m.end())
            if _echo(text, report.span[0], report.span[1]):
                continue
            if base:
                report = moved(report, report.span[0] + base, report.span[1] + base, report.platform, report.platform_evidence)
            yield report
        self.pos = max(self.pos, min(pos, stop))


def _echo(text: str, start: int, end: int) -> bool:
    """Whether the message `text[start:end]` already stands, character for character, earlier on
    its own line (within `_LOOKBACK` characters): one exception quoted twice in one record, as a
    server's JSON error body does (`{"error": ..., "warnings": ["<msg>", "There was an inference
    error: <msg>"]}`), is one OOM, not two. Repeats on other lines are separate OOMs (a loop that
    fails again) and stay. Stateless, so every reader (one pass, a stream, parallel chunks, all of
    which keep `_LOOKBACK` characters before a message) decides alike."""
    lo = max(0, start - _LOOKBACK)
    lo = max(lo, text.rfind("\n", lo, start) + 1, text.rfind("\r", lo, start) + 1)
    return start - lo >= end - start > 0 and text.find(text[start:end], lo, start) >= 0


def iter_reports(text: str, platform: str | None = None) -> Iterator[OOMReport]:
    """Every OOM message in `text`, in order of appearance (repeats included, except a message that
    repeats itself on its own line: `_echo`)."""
    return ReportFinder(platform).scan(text, 0, len(text), big=len(text) > BIG_TEXT)


_MISSING = object()


def _repeat(first: OOMReport, start: int, end: int, text: str, platform: str | None, index: PlatformIndex | None) -> OOMReport:
    """The report of a message whose raw window equals an earlier one's: same figures and text
    (shared, not copied), its own span and platform clue."""
    if platform:
        plat, evidence = platform, "given"
    else:
        plat, evidence = platform_hint(text, start, end, first.vendor, index)
    return moved(first, start, end, plat, evidence)


def moved(report: OOMReport, start: int, end: int, plat: str | None, evidence: str | None) -> OOMReport:
    """`report` with another span and platform clue (figures and text shared, not copied)."""
    if not hasattr(report, "__dict__"):  # a slotted OOMReport: the slower, general way
        from dataclasses import replace

        return replace(report, span=(start, end), platform=plat, platform_evidence=evidence)
    out = object.__new__(OOMReport)  # a plain copy: dataclasses.replace costs more than the rest
    out.__dict__.update(report.__dict__)
    out.__dict__.update(span=(start, end), platform=plat, platform_evidence=evidence)
    return out


def find_reports(text: str, platform: str | None = None) -> list[OOMReport]:
    """All OOM messages in `text` as reports (possibly empty)."""
    return list(iter_reports(text, platform))
