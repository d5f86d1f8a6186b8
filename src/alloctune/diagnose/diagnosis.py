"""What a diagnosis is, and how the verdict's branches collect one.

`Diagnosis` is the full answer for one OOM message (verdict, reason, evidence lines, ranked fixes);
`Verdict` and `FirstFix` are the lite answer grouping a long log needs of every message. `Builder`
is what each branch of `verdict.py` writes into: evidence and fixes as they are found, then the
`Diagnosis` (or, lite, the `Verdict`) at `done`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from alloctune.diagnose import fixes as fx
from alloctune.diagnose.fixes import Fix
from alloctune.diagnose.report import OOMReport

SCHEMA = "alloctune.diagnosis/1"
VERDICTS = ("fragmentation", "cap", "contention", "shortage", "unknown")


@dataclass(frozen=True)
class Diagnosis:
    report: OOMReport
    verdict: str
    reason: str
    evidence: tuple[str, ...]
    fixes: tuple[Fix, ...]  # ranked; includes non-working knobs last, marked works=False
    contributing: tuple[str, ...] = ()
    shortfall: int | None = None
    platform: str | None = None
    occurrences: int = 1

    @property
    def working_fixes(self) -> tuple[Fix, ...]:
        return tuple(f for f in self.fixes if f.works)

    @property
    def blocked_fixes(self) -> tuple[Fix, ...]:
        return tuple(f for f in self.fixes if not f.works)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "verdict": self.verdict,
            "reason": self.reason,
            "contributing": list(self.contributing),
            "shortfall": self.shortfall,
            "platform": self.platform,
            "occurrences": self.occurrences,
            "evidence": list(self.evidence),
            "fixes": [f.to_dict() for f in self.fixes],
            "report": self.report.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Diagnosis:
        return cls(
            report=OOMReport.from_dict(d["report"]),
            verdict=d["verdict"],
            reason=d["reason"],
            evidence=tuple(d.get("evidence", ())),
            fixes=tuple(Fix.from_dict(f) for f in d.get("fixes", ())),
            contributing=tuple(d.get("contributing", ())),
            shortfall=d.get("shortfall"),
            platform=d.get("platform"),
            occurrences=int(d.get("occurrences", 1)),
        )


class Verdict(NamedTuple):
    """What grouping needs of a diagnosis: the verdict, the shortfall and the first working fix
    (from `verdict_only`, often a `FirstFix`: built when needed)."""

    verdict: str
    shortfall: int | None
    top: Any


# A fix not built yet: (function, positional args, keyword args).
_Pending = tuple[Callable[..., Fix], tuple, dict]


class Builder:
    """Collects a diagnosis. `full=False` (grouping a long log) runs the same branches but writes
    no evidence or reason text and builds the fixes only up to the first working one: the
    verdict, shortfall and top fix are those of the full diagnosis by construction."""

    __slots__ = ("r", "platform", "full", "evidence", "fixes", "contributing")

    def __init__(self, r: OOMReport, platform: str | None, full: bool = True) -> None:
        self.r = r
        self.platform = platform
        self.full = full
        self.evidence: list[str] = []
        self.fixes: list[Fix | _Pending] = []
        self.contributing: list[str] = []

    def ev(self, line: str) -> None:
        self.evidence.append(line)

    def fix(self, make: Callable[..., Fix], *args: Any, at: int | None = None, **kw: Any) -> None:
        """Add the fix `make(*args, **kw)` (at position `at`, else last); built later when lite."""
        item = make(*args, **kw) if self.full else (make, args, kw)
        if at is None:
            self.fixes.append(item)
        else:
            self.fixes.insert(at, item)

    def done(self, verdict: str, reason: str | Callable[[], str], shortfall: int | None = None) -> Any:
        """The `Diagnosis` (lite: the `Verdict`); `reason` may be a function, called only when full."""
        if not self.full:
            return Verdict(verdict, shortfall, self._top())
        fixes: list[Fix] = self.fixes  # type: ignore[assignment]
        ranked = [f for f in fixes if f.works] + [f for f in fixes if not f.works]
        return Diagnosis(
            self.r,
            verdict,
            reason() if callable(reason) else reason,
            tuple(self.evidence),
            tuple(ranked),
            tuple(self.contributing),
            shortfall,
            self.platform,
        )

    def _top(self) -> Fix | FirstFix | None:
        probes = fx.PROBES
        for make, args, kw in self.fixes:  # type: ignore[misc]
            probe = probes.get(make)
            if probe is not None:
                works, fix_id, demand = probe(*args, **kw)
                if works:
                    return FirstFix(fix_id, demand, make, args, kw)
                continue
            f = make(*args, **kw)
            if f.works:
                return f
        return None


class FirstFix:
    """A message's first working fix before it is built: its id and demand (what grouping reads of
    every message) and how to build it (for the few messages a group keeps). Equal to the `Fix` it
    builds."""

    __slots__ = ("id", "demand", "_make", "_args", "_kw", "_fix")
    _fix: Fix | None  # built on first use

    def __init__(self, fix_id: str, demand: float, make: Callable[..., Fix], args: tuple, kw: dict) -> None:
        self.id, self.demand, self._make, self._args, self._kw, self._fix = fix_id, demand, make, args, kw, None

    def build(self) -> Fix:
        if self._fix is None:
            self._fix = self._make(*self._args, **self._kw)
        return self._fix

    def __eq__(self, other: object) -> bool:
        return self.build() == (other.build() if isinstance(other, FirstFix) else other)

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> tuple:
        return self.id, self.demand, self._make, self._args, self._kw, self._fix

    def __setstate__(self, state: tuple) -> None:
        self.id, self.demand, self._make, self._args, self._kw, self._fix = state
