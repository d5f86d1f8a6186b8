"""The grammar of PyTorch's out-of-memory messages, every era (allocator-spec §7).

A message is read as a *head* ("CUDA out of memory.", "Allocation on device", ...) followed by
clauses ("Tried to allocate X", "GPU d has a total capacity of T", "Process P has M memory in
use", ...). Clauses are matched one after another wherever the previous one ended, in any order,
each at most once (process lines may repeat); the message ends at the first text that is no known
clause. That one rule covers all eras, reordered pieces, and truncation at any point, without a
regex per release. Input is text already normalised by `find` (single spaces, no escapes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from alloctune.errors import SizeError
from alloctune.units import parse_torch_size

_NUM = r"\d+(?:\.\d+)?"
_UNIT = r"(?:bytes|[KMGTP]i?B)(?![A-Za-z])"


def _sz(name: str) -> str:
    return rf"(?P<{name}>{_NUM}\s*{_UNIT})"


# Heads: the phrase that starts a message. (name, regex)
_HEADS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (n, re.compile(p))
    for n, p in (
        ("thc", r"cuda runtime error \((?P<code>\d+)\) ?: out of memory(?: at (?P<location>\S+?:\d+))?"),
        ("cuda-error", r"CUDA error: out of memory"),
        ("mps", r"MPS backend out of memory"),
        ("async", r"Allocation on device(?: (?P<device>\d+))?"),
        ("async-pt", r"Aloca(?:ção|cao) no dispositivo"),  # ComfyUI's Portuguese error report
        ("native", r"(?P<vendor>CUDA|HIP|XPU|NPU) out of memory\.?"),
    )
)

# Anchors for the search in raw text: heads plus a bare "Tried to allocate" (messages quoted
# without their first words) and the bare figures of a <= 2.0 message ("(GPU 0; 3.79 GiB total
# capacity; ...)", pasted without its first line). Spaces may be any whitespace: the raw text
# can be re-wrapped.
ANCHOR = re.compile(
    r"cuda\s+runtime\s+error\s+\(\d+\)\s*:\s*out\s+of\s+memory|CUDA\s+error:\s+out\s+of\s+memory"
    r"|MPS\s+backend\s+out\s+of\s+memory|Allocation\s+on\s+device|Aloca(?:ção|cao|\\u00e7\\u00e3o)\s+no\s+dispositivo"
    r"|(?:CUDA|HIP|XPU|NPU)\s+out\s+of\s+memory|Tried\s+to\s+allocate"
    r"|\(\s*(?:GPU|NPU|XPU)\s*\d+\s*;\s*\d+(?:\.\d+)?\s*[KMGTP]i?B\s+total\s+capacity"
)

_LEGACY_LABELS = {
    "total capacity": "total",
    "already allocated": "allocated",
    "current active": "active",
    "free": "free",
    "allowed": "cap",
    "reserved in total by PyTorch": "reserved",
    "cached": "reserved_unallocated",  # "memory held by the allocator but not used by the program" (PR #13751)
}

_SEP = r"[\s.,;]*"

# Clauses: (key, regex, repeatable). Field groups are named after OOMReport fields; helper
# groups: devkind, label, v (legacy value), pid, mem, hintvar, docvar, url, capacty.
_CLAUSES: tuple[tuple[str, re.Pattern[str], bool], ...] = tuple(
    (k, re.compile(_SEP + p), rep)
    for k, p, rep in (
        ("tried-1eb", r"Tried to allocate more than 1EB memory\.?", False),
        ("tried", r"Tried to allocate " + _sz("requested") + r"(?: on (?P<request_pool>private|shared) pool)?\.?", False),
        ("paren", r"\(\s*(?P<devkind>GPU|NPU|XPU) ?(?P<device>\d+)\s*[;,]", False),
        (
            "item",
            _sz("v") + r"\s*(?P<label>total capacity|already allocated|current active|free|allowed"
            r"|reserved in total by PyTorch|cached)",
            True,
        ),
        ("close", r"\)", False),
        (
            "gpu-has",
            r"(?P<devkind>GPU|XPU|NPU) (?P<device>\d+) has a total (?P<capacty>capacity|capacty) of " + _sz("total") + r"\.?",
            False,
        ),
        ("of-which", r"of which " + _sz("free") + r" is free\.?", False),
        ("process", r"Process (?P<pid>\d+) has " + _sz("mem") + r" memory in use\.?", True),
        (
            "this-process",
            r"Including non-PyTorch memory, this process has " + _sz("process_in_use") + r" memory in use\.?",
            False,
        ),
        ("of-allocated", r"Of the allocated memory " + _sz("allocated") + r" is allocated by PyTorch", False),
        ("private", r"with " + _sz("private_pools") + r" allocated in private pools \(e\.g\., \w+ Graphs\)", False),
        ("unallocated", r"and " + _sz("reserved_unallocated") + r" is reserved by PyTorch but unallocated\.?", False),
        (
            "hint-legacy",
            r"If reserved memory is >> allocated memory try setting (?P<hint>max_split_size_mb) to avoid"
            r" fragmentation\.?",
            False,
        ),
        (
            "hint",
            r"If reserved but unallocated memory is large try setting (?P<hint>(?:PYTORCH_\w*ALLOC_CONF="
            r"expandable_segments:True)|max_split_size_mb) to avoid fragmentation\.?",
            False,
        ),
        ("docs", r"See documentation for Memory Management(?: and (?P<docvar>PYTORCH_\w*ALLOC_CONF))?\.?", False),
        ("url", r"\(\s*(?P<docs_url>https?://[^\s()]+)\s*\)", False),
        ("xpu-hint", r"Please use `empty_cache` to release all unoccupied cached memory\.?", False),
        (
            "mps-figures",
            r"\(MPS allocated: "
            + _sz("allocated")
            + r", other allocations: "
            + _sz("other_allocations")
            + r", max allowed: "
            + _sz("cap")
            + r"\)",
            False,
        ),
        (
            "mps-hint",
            r"Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0\.0(?: to disable upper limit for memory allocations"
            r"(?: \(may cause system failure\))?)?\.?",
            False,
        ),
        ("async-exceed", r"would exceed allowed memory\.?", False),
        ("async-oom", r"\(out of memory\)", False),
        ("async-allocated", r"Currently allocated\s*: " + _sz("allocated"), False),
        ("async-requested", r"Requested\s*: " + _sz("requested"), False),
        ("async-limit", r"Device limit\s*: " + _sz("total") + r"\.?", False),
        ("async-free", r"Free \(according to CUDA\)\s*: " + _sz("free"), False),
        ("async-cap", r"PyTorch limit \(set by user-supplied memory fraction\)\s*: " + _sz("cap"), False),
        (
            "preemptive",
            r"Allocation was preemptively rejected because it would exceed per_process_memory_fraction"
            r" limit\.?",
            False,
        ),
        ("preemptive-size", r"Requested size: " + _sz("requested"), False),
    )
)

# Clauses that only make sense after another one (a lone ")" or URL is not part of a message).
_REQUIRES = {"close": "paren", "url": "docs"}

_BYTE_GROUPS = {
    "requested",
    "total",
    "free",
    "allocated",
    "reserved_unallocated",
    "private_pools",
    "process_in_use",
    "other_allocations",
    "cap",
}


@dataclass
class Parsed:
    """Mutable scratch result of `parse_at`; `find` turns it into an `OOMReport`."""

    head: str
    end: int
    clauses: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    processes: list[tuple[int, int]] = field(default_factory=list)
    # where each number was read: (target, start, end); target is a `values` key, or "pid"/"mem"
    # of the next process (`alloctune.diagnose.fast` reads other messages of the same shape so)
    numbers: list[tuple[str, int, int]] = field(default_factory=list)


# The units `_UNIT` accepts, as `parse_torch_size` reads them (binary: PyTorch prints them so).
_MULT = {
    "bytes": 1,
    "KB": 1 << 10,
    "KiB": 1 << 10,
    "MB": 1 << 20,
    "MiB": 1 << 20,
    "GB": 1 << 30,
    "GiB": 1 << 30,
    "TB": 1 << 40,
    "TiB": 1 << 40,
}


def _size(text: str) -> int:
    """`parse_torch_size` of a figure the grammar matched, without its general regex (a log of 100,000
    messages has 600,000 figures); a unit it does not know goes the general way. Raises
    `OverflowError` for a figure beyond a double (hundreds of digits: a corrupt or hostile log)."""
    num, _, unit = text.partition(" ")
    mult = _MULT.get(unit)
    if mult is None or " " in unit:
        return parse_torch_size(text.replace(" ", ""))
    return int(round(float(num) * mult))


# What reading a figure raises when it cannot be read: beyond a double (OverflowError), too many
# digits for int() or too large for parse_torch_size (ValueError, SizeError): its clause is refused.
UNREADABLE = (OverflowError, ValueError, SizeError)


def _combined() -> tuple[re.Pattern[str], list[tuple[tuple[str, ...], tuple[str, ...]]]]:
    """All clauses as one alternation, tried in their order: the first alternative that matches
    is the clause the one-by-one loop would find first, in one call instead of up to 28. Group
    names get a per-clause prefix (`g<i>_`) because clauses reuse names."""
    parts, names = [], []
    for i, (_, rx, _) in enumerate(_CLAUSES):
        short = tuple(rx.groupindex)
        parts.append(f"(?P<k{i}>" + re.sub(r"\(\?P<(\w+)>", rf"(?P<g{i}_\1>", rx.pattern) + ")")
        names.append((tuple(f"g{i}_{n}" for n in short), short))
    return re.compile("|".join(parts)), names


_ANY_CLAUSE, _CLAUSE_GROUPS = _combined()


def parse_at(s: str, pos: int = 0) -> Parsed | None:
    """Parse the message starting at `s[pos]` (normalised text). `None` if no message starts there."""
    head = None
    for name, rx in _HEADS:
        m = rx.match(s, pos)
        if m:
            parsed = Parsed(head=name, end=m.end())
            try:
                for k, v in m.groupdict().items():
                    if v is not None:
                        parsed.values[k] = int(v) if k in ("device", "code") else v
                        if k in ("device", "code"):
                            parsed.numbers.append((k, *m.span(k)))
            except UNREADABLE:  # a number too long for int(): this head does not hold here
                continue
            head = name
            break
    if head is None:
        parsed = Parsed(head="bare", end=pos)
    seen: set[str] = set()
    while True:
        m = _ANY_CLAUSE.match(s, parsed.end)
        if m is None:
            break
        i = int(m.lastgroup[1:])  # "k<i>": the first clause, in order, that matches here
        full, short = _CLAUSE_GROUPS[i]
        vals = m.group(*full) if len(full) > 1 else (m.group(full[0]),) if full else ()
        g = {k: v for k, v in zip(short, vals) if v is not None}
        if not _accept(parsed, seen, _CLAUSES[i][0], _CLAUSES[i][2], g, m, f"g{i}_"):
            # rejected (a repeat, or out of order): the later clauses, one by one, as the rule says
            for key, rx, repeatable in _CLAUSES[i + 1 :]:
                m = rx.match(s, parsed.end)
                if m and _accept(parsed, seen, key, repeatable, {k: v for k, v in m.groupdict().items() if v is not None}, m, ""):
                    break
            else:
                break
    if parsed.head == "bare" and not _bare_message(parsed):
        return None
    if head == "native" and parsed.values.get("vendor") is None:
        return None
    return parsed


def _accept(parsed: Parsed, seen: set[str], key: str, repeatable: bool, g: dict[str, str], m: re.Match[str], pre: str) -> bool:
    """Take clause `key` (its groups `g`, named `pre` + name in the match `m`) into `parsed`, unless
    the rules refuse it."""
    ident = key if key != "item" else f"item:{g['label']}"
    if ident in seen and not repeatable:
        return False  # a second "Tried to allocate" etc. belongs to the next message
    if key in _REQUIRES and _REQUIRES[key] not in seen:
        return False
    try:  # every figure first: a clause with one that cannot be read is refused whole
        if key == "item":
            name = _LEGACY_LABELS[g["label"]]
            if name in parsed.values:
                return False
            value = _size(g["v"])
        elif key == "process":
            proc = (int(g["pid"]), _size(g["mem"]))
        else:
            read = {k: _size(v) if k in _BYTE_GROUPS else int(v) if k == "device" else v for k, v in g.items()}
    except UNREADABLE:
        return False
    if key == "item":
        parsed.values[name] = value
        parsed.values.setdefault("_legacy_labels", []).append(g["label"])
        parsed.numbers.append((name, *m.span(pre + "v")))
    elif key == "process":
        parsed.processes.append(proc)
        parsed.numbers += [("pid", *m.span(pre + "pid")), ("mem", *m.span(pre + "mem"))]
    else:
        for k, v in read.items():
            parsed.values[k] = v
            if k in _BYTE_GROUPS or k == "device":
                parsed.numbers.append((k, *m.span(pre + k)))
    seen.add(ident)
    parsed.clauses.append(key)
    parsed.end = m.end()
    return True


def _bare_message(parsed: Parsed) -> bool:
    """A message without its head: "Tried to allocate ..." first, or the parenthesised figures of a
    <= 2.0 message with at least two of them (a lone "(GPU 0; 4 GiB total capacity" is not a message)."""
    if not parsed.clauses:
        return False
    if parsed.clauses[0] == "tried":
        return True
    return parsed.clauses[0] == "paren" and parsed.clauses.count("item") >= 2


# Log decorations that may start a continuation line of a wrapped message.
_LINE_PREFIX = re.compile(
    # CRI (containerd, Kubernetes): the text after its one space is the line's own, spaces included
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d) (?:stdout|stderr) [PF] "
    r"|[ \t]*(?:"
    r"\[rank\d+\]:?"  # torchrun
    r"|\([\w.-]+ pid=\d+(?:, ip=[\d.]+)?\)"  # Ray / vLLM workers
    r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d\s+\d\d:\d\d:\d\d(?:\.\d+)?\s+\[?[\w./-]+(?::\d+)?\]"  # vLLM
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?Z?(?:\s+-)?"  # ISO timestamps (CI logs)
    r"|>(?!>)"  # Markdown / e-mail quote
    r")[ \t]*"
)
