"""Find every out-of-memory message inside arbitrary text and turn each into an `OOMReport`.

Users paste messages wrapped in tracebacks, log prefixes (`[rank0]:`, vLLM's `ERROR 03-13 ...
[core.py:330]`, Ray's `(Worker pid=1)`), JSON strings with `\\n` escapes, HTML tables, Markdown
quotes, re-wrapped lines and CRLF. Rather than teaching the grammar all of that, each candidate
region is first *normalised* into single-spaced plain text while remembering, for every
normalised character, where it came from; the grammar (`parse`) then reads clean text, and spans
map back to the exact slice of the input.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

from alloctune.diagnose import parse as grammar
from alloctune.diagnose.report import OOMReport

# A message is at most a few hundred characters; with per-line log prefixes and escapes it can
# span more. Normalising a bounded window per candidate keeps the scan linear in the input size.
WINDOWS = (2500, 20000)

# Log decorations that may start a continuation line of a wrapped message.
_LINE_PREFIX = re.compile(
    r"[ \t]*(?:"
    r"\[rank\d+\]:?"  # torchrun
    r"|\([\w.-]+ pid=\d+(?:, ip=[\d.]+)?\)"  # Ray / vLLM workers
    r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d\s+\d\d:\d\d:\d\d(?:\.\d+)?\s+\[?[\w./-]+(?::\d+)?\]"  # vLLM
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?Z?(?:\s+-)?"  # ISO timestamps (CI logs)
    r"|>(?!>)"  # Markdown / e-mail quote
    r")[ \t]*"
)

_FULLWIDTH = str.maketrans({"；": ";", "：": ":", "（": "(", "）": ")", "，": ","})

# One regex, one pass: entities, backslash escapes, <br>, line breaks, whitespace, other chars.
_TOKEN = re.compile(
    r"(?P<entity>&(?:#\d+|#x[0-9A-Fa-f]+|[A-Za-z]+);)"
    r"|(?P<esc>\\[nrt])"
    r"|(?P<escq>\\[\"'\\/])"
    r"|(?P<br><br\s*/?>)"
    r"|(?P<nl>\r\n|\r|\n)"
    r"|(?P<ws>[ \t\f\v\u00a0\u3000]+)"
    r"|(?P<text>[^&\\<\r\n \t\f\v\u00a0\u3000]+|.)",
    re.S,
)


class Normalized:
    """Single-spaced, un-escaped text plus `src[i]` = index in the raw input of character `i`."""

    def __init__(self, raw: str, start: int, end: int) -> None:
        chars: list[str] = []
        src: list[int] = []

        def put(text: str, at: int) -> None:
            for c in text:
                if c == " " and (not chars or chars[-1] == " "):
                    continue
                chars.append(c)
                src.append(at)

        pos = start
        while pos < end:
            m = _TOKEN.match(raw, pos, end)
            kind = m.lastgroup
            tok = m.group()
            if kind == "entity":
                put(html.unescape(tok), pos)
            elif kind in ("esc", "br", "ws"):
                put(" ", pos)
            elif kind == "escq":
                put(tok[1], pos)
            elif kind == "nl":
                put(" ", pos)
                p = m.end()
                while True:  # strip stacked prefixes such as "(Worker pid=1) ERROR ... ]"
                    pm = _LINE_PREFIX.match(raw, p, end)
                    if not pm or pm.end() == p:
                        break
                    p = pm.end()
                pos = p
                continue
            else:
                chars.extend(tok.translate(_FULLWIDTH))
                src.extend(range(pos, pos + len(tok)))
            pos = m.end()
        self.text = "".join(chars)
        self.src = src
        self.raw_end = end

    def raw_span(self, i: int, j: int) -> tuple[int, int]:
        """Raw [start, end) covering normalised characters [i, j)."""
        if j <= i:
            return (self.src[i], self.src[i])
        last = self.src[j - 1]
        return (self.src[i], last + 1)


# ---- platform hints from the surrounding text ------------------------------------------------

# (name, cheap substrings that must occur, regex giving the evidence); the first platform with a
# hit wins: WSL over Windows (a Linux process on a Windows driver), Windows over Linux (Windows
# paths rarely appear by accident). The substring test keeps big logs fast.
_PLATFORM_HINTS: tuple[tuple[str, tuple[str, ...], re.Pattern[str]], ...] = (
    ("wsl", ("WSL", "/mnt/"), re.compile(r"\bWSL2?\b|/mnt/[a-z]/")),
    ("windows", (":\\", "windows_portable", "Windows", "Win1", "WIN1", ".exe", "nvcuda"), re.compile(
        r"\b[A-Za-z]:\\{1,2}[\w .()-]+\\|\bPS [A-Z]:\\|windows_portable|\bWin(?:dows)? ?1[01]\b|\bWIN1[01]\b"
        r"|\bWindows\b|\.exe\b|\bnvcuda\.dll\b")),
    ("macos", ("macOS", "MacBook", "Darwin", "/Users/", "/opt/homebrew/"), re.compile(
        r"\bmacOS\b|\bMacBook\b|\bDarwin\b|/Users/[\w.-]+/|/opt/homebrew/")),
    ("linux", ("/home/", "/usr/", "/opt/conda/", "dist-packages/", "Ubuntu", "Linux"), re.compile(
        r"/home/[\w.-]+/|/usr/(?:local/)?lib/python|/opt/conda/|dist-packages/|\bUbuntu\b|\bLinux\b")),
)
_CONTEXT = 3000


def platform_hint(text: str, start: int, end: int, vendor: str) -> tuple[str | None, str | None]:
    """Guess the OS from paths and words near the message; `(platform, evidence)`.

    MPS means macOS whatever the surroundings say.
    """
    if vendor == "mps":
        return "macos", "MPS backend"
    ctx = text[max(0, start - _CONTEXT) : min(len(text), end + _CONTEXT)]
    for name, needles, rx in _PLATFORM_HINTS:
        if any(n in ctx for n in needles):
            m = rx.search(ctx)
            if m:
                return name, m.group().strip()
    return None, None


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


def build_report(p: grammar.Parsed, norm: Normalized, i: int, raw: str, platform: str | None = None) -> OOMReport:
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

    derived: list[str] = []
    allocated, reserved, unalloc = v.get("allocated"), v.get("reserved"), v.get("reserved_unallocated")
    if reserved is None and allocated is not None and unalloc is not None and backend == "native" and vendor != "mps":
        reserved = allocated + unalloc  # 2.1+: "A is allocated ... and R-A is reserved but unallocated"
        derived.append("reserved")
    if unalloc is None and allocated is not None and reserved is not None:
        unalloc = max(0, reserved - allocated)  # <=2.0: reserved in total minus already allocated
        derived.append("reserved_unallocated")

    # Truncated: the message stops before the figures its format always carries.
    ends = {"close", "docs", "url", "hint", "hint-legacy", "xpu-hint", "mps-hint", "async-cap", "preemptive-size",
            "tried-1eb"}
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
    plat, evidence = platform_hint(raw, start, end, vendor)
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


def _plausible_bare_head(text: str, m: re.Match[str], parsed: grammar.Parsed) -> bool:
    """A head with no clause after it ("CUDA out of memory.", ComfyUI's cut "Allocation on device")
    counts only where an exception message would stand: after "...Error:" or a log marker, and
    with nothing but punctuation after it on its line. Prose ("I meet CUDA out of memory when...")
    does not."""
    line_start = text.rfind("\n", 0, m.start()) + 1
    before = text[line_start : m.start()]
    line_end = text.find("\n", m.end())
    after = text[m.end() : len(text) if line_end < 0 else line_end]
    if parsed.head in ("async", "async-pt"):
        after = re.sub(r"^\s*\d+", "", after)
    before_ok = not before.strip() or bool(_EXC_BEFORE.search(before))
    after_ok = not re.search(r"[A-Za-z0-9]", after.lstrip(".").strip(" .'\"`)*"))
    return before_ok and after_ok


def iter_reports(text: str, platform: str | None = None) -> Iterator[OOMReport]:
    """Every OOM message in `text`, in order of appearance (repeats included)."""
    pos = 0
    n = len(text)
    while pos < n:
        m = grammar.ANCHOR.search(text, pos)
        if not m:
            return
        for window in WINDOWS:  # small first; grow only if the message may run past the window
            norm = Normalized(text, m.start(), min(n, m.start() + window))
            parsed = grammar.parse_at(norm.text, 0)
            if parsed is None or norm.raw_end >= n or parsed.end < len(norm.text) - 200:
                break
        if parsed is None or (
            not parsed.clauses and parsed.head not in ("thc", "cuda-error") and not _plausible_bare_head(text, m, parsed)
        ):
            pos = m.end()
            continue
        report = build_report(parsed, norm, 0, text, platform)
        yield report
        pos = max(report.span[1], m.end())


def find_reports(text: str, platform: str | None = None) -> list[OOMReport]:
    """All OOM messages in `text` as reports (possibly empty)."""
    return list(iter_reports(text, platform))
