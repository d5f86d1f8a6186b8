"""The records of a plan answer: targets, the largest size per target, the curve, one size's answer.

Plain frozen data with `to_dict()`; `answer.py` computes them, the views and the API read them.
`STOPS` words why a search for the largest size ended, with the limits it names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCHEMA = "alloctune.plan/1"
# Without --max-size the search doubles from 2x the largest recording until the target fails,
# and gives up at this many times the largest recording: an answer further out rests on laws
# fitted far away from any size seen, so it is said as "at least", with the size to record next.
EXTRAPOLATION_LIMIT = 16
BOUND_LIMIT = 0.25  # a memory error bound past this makes an answer meaningless: the search stops there
STOPS = {
    "exceeded": "a size that does not fit was found: the answer is the largest size below it",
    "extrapolation": f"every size up to {EXTRAPOLATION_LIMIT}x the largest recording fits: further out the "
    "extrapolation means nothing (record a larger size to sharpen it)",
    "max-size": "every size up to --max-size fits",
    "bound": f"further out the memory error bound passes {BOUND_LIMIT:.0%}: an answer there means nothing "
    "(record a larger size to sharpen it)",
    "real-run": "a real run of the program (a calibration given) died at the first failing size under this budget "
    "or a larger one with this setting: the answer stays below it whatever the simulation says",
}


@dataclass(frozen=True)
class Target:
    """Where the program runs: a whole card of `bytes`, or a per-process cap on the recording's device."""

    kind: str  # "card" | "cap"
    bytes: int

    @property
    def label(self) -> str:
        from alloctune.units import format_size

        return f"{self.kind} {format_size(self.bytes)}"


@dataclass(frozen=True)
class Largest:
    target: Target
    largest: str | None  # largest completing size on the grid; None: not even the smallest
    first_failing: str | None  # smallest failing size seen (None: the whole searched range fits)
    extrapolated: bool  # the answer lies outside the recorded sizes
    probes: int
    completes_again: str | None = None  # not monotone: bisection's answer, above a size that fails
    optimistic: str | None = None  # the same search with every inexact-law request fallible down to nothing
    stopped: str = "exceeded"  # why the search ended: exceeded | extrapolation | bound | max-size (see `STOPS`)
    searched_to: str | None = None  # the largest size replayed on the way up
    bound: float | None = None  # relative memory error bound at the answer (None: nothing checked)
    # Below the answer, sizes the 2 % scan stepped over fail in the simulation (`_window`): the largest size
    # below which every size completes (None: none fails). Reported beside the answer, not instead of it, until
    # real runs at such sizes say whether the simulation is right there (tests/data/plan_sharp/README.md).
    strict: str | None = None

    @property
    def monotone(self) -> bool:
        return self.completes_again is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target.kind,
            "bytes": self.target.bytes,
            "label": self.target.label,
            "largest": self.largest,
            "first_failing": self.first_failing,
            "extrapolated": self.extrapolated,
            "probes": self.probes,
            "completes_again": self.completes_again,
            "optimistic": self.optimistic,
            "stopped": self.stopped,
            "stopped_why": STOPS[self.stopped],
            "searched_to": self.searched_to,
            "bound": self.bound,
            "strict": self.strict,
        }


@dataclass(frozen=True)
class CurvePoint:
    size: str
    peak_reserved: int
    peak_allocated: int
    min_budget: int | None
    extrapolated: bool

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class AtSize:
    size: str
    peak_reserved: int
    peak_allocated: int
    min_budget: int | None
    smallest_card: int | None
    completes: dict[str, bool]  # target label -> completes
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["notes"] = list(self.notes)
        return d


@dataclass(frozen=True)
class SettingPlan:
    conf: str
    largest: tuple[Largest, ...]
    curve: tuple[CurvePoint, ...]
    at_size: AtSize | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "conf": self.conf,
            "largest": [x.to_dict() for x in self.largest],
            "curve": [p.to_dict() for p in self.curve],
            "at_size": self.at_size.to_dict() if self.at_size else None,
        }


@dataclass(frozen=True)
class PlanResult:
    workload: str | None
    recorded_sizes: tuple[str, ...]
    step: str
    search: tuple[str, str]
    settings: tuple[SettingPlan, ...]
    conservative: bool
    notes: tuple[str, ...]
    context_bytes: int  # CUDA context assumed on a card (not available to the allocator)
    replays: int
    wall_s: float
    traceset: dict[str, Any] = field(default_factory=dict)  # TraceSet.summary()
    errors: dict[str, Any] | None = None  # ErrorModel.to_dict(): what the answers' bounds rest on
    fallible: dict[str, Any] = field(default_factory=dict)  # `_fallible`: what decided the workspaces / what to record

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "workload": self.workload,
            "recorded_sizes": list(self.recorded_sizes),
            "step": self.step,
            "search": list(self.search),
            "settings": [s.to_dict() for s in self.settings],
            "conservative": self.conservative,
            "notes": list(self.notes),
            "context_bytes": self.context_bytes,
            "replays": self.replays,
            "wall_s": self.wall_s,
            "traceset": self.traceset,
            "errors": self.errors,
            "fallible": self.fallible,
        }
