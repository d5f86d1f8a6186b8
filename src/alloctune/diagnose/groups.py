"""Many OOM messages, summarised: one group per verdict, device/rank and request size.

Why: a multi-rank log that retries holds thousands of OOM messages that differ only in their
numbers. One diagnosis box each says the same thing thousands of times (and took minutes to
print); what a person needs is how many failed in which way, where (first and last line), the
worst case, and the one fix that covers the group. Memory is bounded by the number of groups
(the request-size key is a power-of-two range), not by the number of messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from alloctune.diagnose.diagnosis import Diagnosis, FirstFix, Verdict
from alloctune.diagnose.fixes import Fix
from alloctune.diagnose.report import OOMReport
from alloctune.diagnose.scan import Found
from alloctune.diagnose.verdict import diagnose_report, verdict_only
from alloctune.units import format_size

SCHEMA_MESSAGE = "alloctune.diagnose-message/1"

# Groups whose worst case is given as a whole diagnosis (JSON `diagnoses`, the terminal's fixes).
FULL = 10

# Repeated messages are judged once; the memo is dropped when it grows past this.
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
    if fix.extra:
        extra = dict(fix.extra)
        for key in ("reduce_percent", "chunks", "fraction", "ratio", "shortfall"):
            if isinstance(extra.get(key), (int, float)):
                return float(extra[key])
    if fix.id == "max_split_size_mb" and fix.conf:
        return -float(fix.conf.split(":", 1)[1])
    return 0.0


@dataclass
class Group:
    """Messages with one verdict, device, rank and request-size range.

    Each member is added with its `Verdict` only (no text); the full diagnosis is built for the
    worst case alone, when it is shown (`worst`), with the platform the log was read with."""

    verdict: str
    device: int | None
    rank: int | None
    requests: tuple[int, int] | None
    platform: str | None = None
    count: int = 0
    first_line: int = 0
    last_line: int = 0
    worst_report: OOMReport | None = None
    worst_line: int = 0
    worst_key: tuple[int, int] = (0, 0)  # (shortfall, requested) of the worst case
    worst_shortfall: int | None = None
    # fix id -> [members whose first working fix it is, largest demand, that fix, its line]
    _fixes: dict[str | None, list[Any]] = field(default_factory=dict)
    _worst: Diagnosis | None = field(default=None, repr=False, compare=False)

    def add(self, v: Verdict, r: OOMReport, line: int) -> None:
        self.count += 1
        self.first_line = self.first_line or line
        self.last_line = line
        key = ((v.shortfall or 0), (r.requested or 0))
        if self.worst_report is None or key > self.worst_key:
            self.worst_report, self.worst_line, self.worst_key, self.worst_shortfall = r, line, key, v.shortfall
            self._worst = None
        top = v.top
        fid = top.id if top is not None else None
        demand = (top.demand if isinstance(top, FirstFix) else _demand(top)) if top is not None else 0.0
        slot = self._fixes.get(fid)
        if slot is None:
            self._fixes[fid] = [1, demand, top, line]
        else:
            slot[0] += 1
            if demand > slot[1]:
                slot[1:] = [demand, top, line]

    @property
    def worst(self) -> Diagnosis | None:
        """The full diagnosis of the worst case (the largest shortfall, then request; the first such)."""
        if self._worst is None and self.worst_report is not None:
            self._worst = diagnose_report(self.worst_report, self.platform)
        return self._worst

    def merge(self, later: Group) -> None:
        """Add the members of the same group from a later part of the log, as if added one by one."""
        if later.worst_report is not None and (self.worst_report is None or later.worst_key > self.worst_key):
            self.worst_report, self.worst_line, self.worst_key = later.worst_report, later.worst_line, later.worst_key
            self.worst_shortfall, self._worst = later.worst_shortfall, later._worst
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
        if isinstance(slot[2], FirstFix):
            slot[2] = slot[2].build()
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
            "worst": {
                "line": self.worst_line,
                "requested": self.worst_report.requested if self.worst_report else None,
                "shortfall": self.worst_shortfall,
                "reason": self.worst.reason if self.worst else None,
            },
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
    first: OOMReport | None
    platform: str | None = None


def summarise_found(
    found: Iterable[Found], platform: str | None = None, on_message: Callable[[Found, Diagnosis], None] | None = None
) -> Partial:
    """Judge every message and fold it into its group; `on_message` sees each one's full
    diagnosis as it comes (`--all`). Without it only the verdict is worked out per message
    (`verdict_only`: the same branches without the text), the full diagnosis only for the few
    messages shown. Identical messages are judged once (a bounded memo)."""
    groups: dict[tuple, Group] = {}
    memo: dict[tuple[str, str | None], Verdict] = {}
    full: dict[tuple[str, str | None], Diagnosis] = {}
    first_text: str | None = None
    single = True
    count = 0
    first: OOMReport | None = None
    for f in found:
        r = f.report
        if on_message is not None:
            d = full.get((r.text, r.platform))
            if d is None:
                if len(full) > _MEMO:
                    full.clear()
                d = full[(r.text, r.platform)] = diagnose_report(r, platform)
            elif d.report.span != r.span:
                d = _with_report(d, r)
            on_message(f, d)
            v = Verdict(d.verdict, d.shortfall, next((x for x in d.fixes if x.works), None))
        else:
            v = memo.get((r.text, r.platform))  # the verdict reads the figures and the platform only
            if v is None:
                if len(memo) > _MEMO:
                    memo.clear()
                v = memo[(r.text, r.platform)] = verdict_only(r, platform)
        count += 1
        if first_text is None:
            first_text, first = r.text, r
        elif single and r.text != first_text:
            single = False
        key = (v.verdict, r.device, f.rank, size_range(r.requested))
        g = groups.get(key)
        if g is None:
            g = groups[key] = Group(v.verdict, r.device, f.rank, key[3], platform)
        g.add(v, r, f.line)
    return Partial(groups, count, first_text, single, first, platform)


def finish(groups: dict[tuple, Group], count: int, single: OOMReport | None, platform: str | None = None) -> LogSummary:
    """The summary: groups with most messages first; `single` (the one distinct message's first
    report) is diagnosed in full, with the count as its occurrences."""
    ordered = sorted(groups.values(), key=lambda g: (-g.count, g.first_line))
    one = None
    if single is not None:
        d = diagnose_report(single, platform)
        one = Diagnosis(d.report, d.verdict, d.reason, d.evidence, d.fixes, d.contributing, d.shortfall, d.platform, count)
    return LogSummary(count, ordered, one)


def summarise(
    found: Iterable[Found], platform: str | None = None, on_message: Callable[[Found, Diagnosis], None] | None = None
) -> LogSummary:
    """The `LogSummary` of the messages, in one pass (see `summarise_found`)."""
    part = summarise_found(found, platform, on_message)
    return finish(part.groups, part.count, part.first if part.same else None, platform)


def _with_report(d: Diagnosis, r: Any) -> Diagnosis:
    """A memoised diagnosis for a repeat of its message: the same verdict, this occurrence's report."""
    return Diagnosis(r, d.verdict, d.reason, d.evidence, d.fixes, d.contributing, d.shortfall, d.platform, d.occurrences)


def message_record(f: Found, d: Diagnosis) -> dict[str, Any]:
    """One message for `--all --json` (a JSON line each)."""
    return {"schema": SCHEMA_MESSAGE, "line": f.line, "rank": f.rank, **{k: v for k, v in d.to_dict().items() if k != "schema"}}


@dataclass(frozen=True)
class SharedFix:
    """One fix as a summary states it once, for every large group whose fix it is.

    Attributes:
        fix: the fix (the same id, title, setting, code and check command in each group).
        line: the log line of the message it was derived from, in the first group that has it.
        groups: 1-based positions (largest group first) of the groups it is the fix of, ascending.
    """

    fix: Fix
    line: int
    groups: tuple[int, ...]


def shared_fixes(groups: Sequence[Group]) -> list[SharedFix]:
    """The fixes of the `FULL` largest groups (`groups` most messages first), each once, in the
    order the groups first name them.

    Why: groups that differ by device, rank or request size mostly share a fix; a summary that
    printed each group's would repeat the same shell lines for every rank. Two fixes are the same
    when everything a user would copy from them is (id, title, setting, code, check command)."""
    order: dict[tuple[Any, ...], tuple[Fix, int]] = {}
    members: dict[tuple[Any, ...], list[int]] = {}
    for position, g in enumerate(groups[:FULL], 1):
        fix, line, _ = g.fix
        if fix is None:
            continue
        key = (fix.id, fix.title, fix.conf, fix.code, fix.command)
        order.setdefault(key, (fix, line))
        members.setdefault(key, []).append(position)
    return [SharedFix(fix, line, tuple(members[key])) for key, (fix, line) in order.items()]
