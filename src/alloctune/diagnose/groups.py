"""Many OOM messages, summarised: one group per verdict, device/rank and request size.

Why: a multi-rank log that retries holds thousands of OOM messages that differ only in their
numbers. One diagnosis box each says the same thing thousands of times (and took minutes to
print); what a person needs is how many failed in which way, where (first and last line), the
worst case, and the one fix that covers the group. Memory is bounded by the number of groups
(the request-size key is a power-of-two range), not by the number of messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from alloctune.diagnose.fixes import Fix
from alloctune.diagnose.scan import Found
from alloctune.diagnose.verdict import Diagnosis, diagnose_report
from alloctune.units import format_size

SCHEMA_MESSAGE = "alloctune.diagnose-message/1"

# Groups whose worst case is given as a whole diagnosis (JSON `diagnoses`, the terminal's fixes).
FULL = 10

# Repeated messages are diagnosed once; the memo is dropped when it grows past this.
_MEMO = 1024


def size_range(requested: int | None) -> tuple[int, int] | None:
    """The power-of-two range [lo, hi) a request falls in (None when the message has no size)."""
    if requested is None:
        return None
    if requested <= 0:
        return (0, 1)
    b = requested.bit_length()
    return (1 << (b - 1), 1 << b)


def _demand(fix: Fix) -> float:
    """How much a fix asks for, to pick the one fix that covers every member with the same fix:
    the largest reduction, chunk count, fraction or ratio; the smallest max_split_size_mb."""
    extra = dict(fix.extra)
    for key in ("reduce_percent", "chunks", "fraction", "ratio", "shortfall"):
        if isinstance(extra.get(key), (int, float)):
            return float(extra[key])
    if fix.id == "max_split_size_mb" and fix.conf:
        return -float(fix.conf.split(":", 1)[1])
    return 0.0


@dataclass
class Group:
    """Messages with one verdict, device, rank and request-size range."""

    verdict: str
    device: int | None
    rank: int | None
    requests: tuple[int, int] | None
    count: int = 0
    first_line: int = 0
    last_line: int = 0
    worst: Diagnosis | None = None
    worst_line: int = 0
    # fix id -> [members whose first working fix it is, largest demand, that fix, its line]
    _fixes: dict[str | None, list[Any]] = field(default_factory=dict)

    def add(self, d: Diagnosis, line: int) -> None:
        self.count += 1
        self.first_line = self.first_line or line
        self.last_line = line
        key = ((d.shortfall or 0), (d.report.requested or 0))
        if self.worst is None or key > ((self.worst.shortfall or 0), (self.worst.report.requested or 0)):
            self.worst, self.worst_line = d, line
        top = next((f for f in d.fixes if f.works), None)
        fid = top.id if top else None
        demand = _demand(top) if top else 0.0
        slot = self._fixes.get(fid)
        if slot is None:
            self._fixes[fid] = [1, demand, top, line]
        else:
            slot[0] += 1
            if demand > slot[1]:
                slot[1:] = [demand, top, line]

    def merge(self, later: Group) -> None:
        """Add the members of the same group from a later part of the log, as if added one by one."""
        if later.worst is not None and (self.worst is None or ((later.worst.shortfall or 0),
                                        (later.worst.report.requested or 0)) > ((self.worst.shortfall or 0),
                                                                                 (self.worst.report.requested or 0))):
            self.worst, self.worst_line = later.worst, later.worst_line
        self.count += later.count
        self.first_line = self.first_line or later.first_line
        self.last_line = later.last_line or self.last_line
        for fid, (n, demand, top, line) in later._fixes.items():
            slot = self._fixes.get(fid)
            if slot is None:
                self._fixes[fid] = [n, demand, top, line]
            else:
                slot[0] += n
                if demand > slot[1]:
                    slot[1:] = [demand, top, line]

    @property
    def fix(self) -> tuple[Fix | None, int, int]:
        """(the fix, the line of the message it was derived from, how many members it covers):
        the first working fix most members share, with the largest demand among them, so it
        covers each of them."""
        fid, slot = max(self._fixes.items(), key=lambda kv: (kv[0] is not None, kv[1][0]))
        return slot[2], slot[3], slot[0]

    @property
    def requests_text(self) -> str:
        if self.requests is None:
            return "size unknown"
        lo, hi = self.requests
        return f"{format_size(lo)} - {format_size(hi)}"

    def to_dict(self) -> dict[str, Any]:
        fix, fix_line, covers = self.fix
        return {
            "verdict": self.verdict,
            "device": self.device,
            "rank": self.rank,
            "requests": list(self.requests) if self.requests else None,
            "count": self.count,
            "first_line": self.first_line,
            "last_line": self.last_line,
            "worst": {"line": self.worst_line, "requested": self.worst.report.requested if self.worst else None,
                      "shortfall": self.worst.shortfall if self.worst else None,
                      "reason": self.worst.reason if self.worst else None},
            "fix": ({"line": fix_line, "covers": covers, **fix.to_dict()} if fix is not None else None),
        }


@dataclass
class LogSummary:
    """What `summarise` found: the groups (most messages first) and, when the log holds one
    distinct message (however often repeated), its full diagnosis."""

    messages: int
    groups: list[Group]
    single: Diagnosis | None

    def diagnoses(self) -> list[Diagnosis]:
        """Full diagnoses, a bounded number: the single message's, else the worst case of each of
        the `FULL` largest groups (every group names its worst case and fix in `groups`)."""
        if self.single is not None:
            return [self.single]
        return [g.worst for g in self.groups[:FULL] if g.worst is not None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "groups": [g.to_dict() for g in self.groups],
            "diagnoses": [d.to_dict() for d in self.diagnoses()],
        }


@dataclass
class Partial:
    """What `summarise_found` gathered from some consecutive messages (a chunk, or the whole log)."""

    groups: dict[tuple, Group]
    count: int
    first_text: str | None
    same: bool  # every message had the first one's text
    first: Diagnosis | None


def summarise_found(found: Iterable[Found], platform: str | None = None,
                    on_message: Callable[[Found, Diagnosis], None] | None = None) -> Partial:
    """Diagnose every message and fold it into its group; `on_message` sees each one as it comes
    (`--all`). Identical messages are diagnosed once (a bounded memo)."""
    groups: dict[tuple, Group] = {}
    memo: dict[tuple[str, str | None], Diagnosis] = {}
    first_text: str | None = None
    single = True
    count = 0
    first: Diagnosis | None = None
    for f in found:
        r = f.report
        d = memo.get((r.text, r.platform))  # the verdict reads the figures and the platform only
        if d is None:
            if len(memo) > _MEMO:
                memo.clear()
            d = memo[(r.text, r.platform)] = diagnose_report(r, platform)
        elif d.report.span != r.span:
            d = _with_report(d, r)
        count += 1
        if first_text is None:
            first_text, first = r.text, d
        elif single and r.text != first_text:
            single = False
        key = (d.verdict, r.device, f.rank, size_range(r.requested))
        g = groups.get(key)
        if g is None:
            g = groups[key] = Group(d.verdict, r.device, f.rank, key[3])
        g.add(d, f.line)
        if on_message is not None:
            on_message(f, d)
    return Partial(groups, count, first_text, single, first)


def finish(groups: dict[tuple, Group], count: int, single: Diagnosis | None) -> LogSummary:
    """The summary: groups with most messages first; `single` (the one distinct message's first
    diagnosis) gets the count as its occurrences."""
    ordered = sorted(groups.values(), key=lambda g: (-g.count, g.first_line))
    one = None
    if single is not None:
        one = Diagnosis(single.report, single.verdict, single.reason, single.evidence, single.fixes,
                        single.contributing, single.shortfall, single.platform, count)
    return LogSummary(count, ordered, one)


def summarise(found: Iterable[Found], platform: str | None = None,
              on_message: Callable[[Found, Diagnosis], None] | None = None) -> LogSummary:
    """The `LogSummary` of the messages, in one pass (see `summarise_found`)."""
    part = summarise_found(found, platform, on_message)
    return finish(part.groups, part.count, part.first if part.same else None)


def _with_report(d: Diagnosis, r: Any) -> Diagnosis:
    """A memoised diagnosis for a repeat of its message: the same verdict, this occurrence's report."""
    return Diagnosis(r, d.verdict, d.reason, d.evidence, d.fixes, d.contributing, d.shortfall, d.platform,
                     d.occurrences)


def message_record(f: Found, d: Diagnosis) -> dict[str, Any]:
    """One message for `--all --json` (a JSON line each)."""
    return {"schema": SCHEMA_MESSAGE, "line": f.line, "rank": f.rank, **{k: v for k, v in d.to_dict().items()
                                                                          if k != "schema"}}
