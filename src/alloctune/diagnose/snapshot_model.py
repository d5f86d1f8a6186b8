"""Plain data of a snapshot diagnosis: pinned segments, what-ifs, the verdict (the memory map's own
types are `memory_map.model`'s).

Only dataclasses with `to_dict`/`from_dict` and no logic beyond derived properties, so that
`report/` (tables, figures, HTML) can take them without importing the diagnosis itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from alloctune.memory_map.model import MemoryMap

SCHEMA = "alloctune.snapshot-diagnosis/1"


@dataclass(frozen=True)
class PinnedSegment:
    """A segment that cannot go back to the driver because a few live blocks hold it."""

    addr: int
    size: int
    allocated: int
    free: int
    largest_free: int
    live_blocks: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PinnedSegment":
        return cls(**{k: int(d[k]) for k in ("addr", "size", "allocated", "free", "largest_free", "live_blocks")})


@dataclass(frozen=True)
class WhatIf:
    """One candidate setting replayed on the recorded requests under the same budget."""

    config: str
    # True: the request that failed fits and nothing failed before it. The recorded run ended
    # (or changed course) at the OOM, so whether a *later* request would fail is not known.
    avoids_oom: bool | None  # None: could not be simulated
    peak_reserved: int | None = None
    note: str = ""
    # The smallest budget under which this setting gets the run through the failed request (bisected
    # to sim.resolution's 0.2 % or 1 MiB); only computed when no setting serves it under the budget ("needs N more").
    min_budget: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "WhatIf":
        return cls(str(d["config"]), d.get("avoids_oom"), d.get("peak_reserved"), str(d.get("note", "")), d.get("min_budget"))


@dataclass(frozen=True)
class Margin:
    """Headroom the best setting leaves under the budget after the failed request: where a setting serves
    it, budget - that replay's peak reserved so far (>= 0); where none does, budget - the least budget
    that gets the run through it (`needs`, < 0: how much is missing). `fraction` is of the budget;
    `thin` when it is under the share (`diagnose.snapshot.THIN_MARGIN`) that the rest of a run needs (always
    where none serves it), so a script reads `thin` or `bytes <= 0` as "no setting to go to"."""

    bytes: int
    fraction: float
    thin: bool

    def to_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "fraction": self.fraction, "thin": self.thin}


@dataclass(frozen=True)
class SnapshotDiagnosis:
    source: str
    # Within the budget: "fragmentation" (a setting serves the failed request under it with room to
    # spare), "borderline" (a setting serves it, but with a thin margin or none, in a history that ends
    # at the OOM: no recommendation, `confirm` settles it), "shortage" (none does: `needs` says how
    # much the run needs to get that far), "unknown" (the replays could not decide: the budget or the
    # history is not what the run had; `undecided` says why).
    verdict: str
    summary: str
    state_source: str  # "snapshot-at-oom", "replayed-history" or "snapshot-final"
    oom_event_index: int
    oom_count: int
    request: int  # rounded bytes of the failed request
    alloc_size: int  # what the OOM message printed ("Tried to allocate")
    pool: str
    reserved: int
    allocated: int
    reserved_free: int
    largest_free: int  # largest free block the request could have used (same pool, same stream)
    free_blocks: int
    device_free: int | None
    budget: int | None
    budget_source: str
    pinned: tuple[PinnedSegment, ...]
    pinned_count: int
    pinned_free: int
    what_if: tuple[WhatIf, ...]
    recommendation: str | None
    evidence: tuple[str, ...]
    memory_map: MemoryMap = field(repr=False, default=MemoryMap(-1, ()))
    # Whether the simulator, under the recorded setting and this budget, fails at the failed request
    # itself (None: not replayed). Unless True, `what_if` holds no answers (the recorded row at most).
    reproduced: bool | None = None
    undecided: str = ""  # why the what-ifs are not answers, and what to pass
    needs: int | None = None  # smallest budget that gets the run through the failed request (best setting)
    needs_setting: str | None = None
    ends_at_oom: bool = True  # the history stops at the OOM: later requests are not known
    confirm: str | None = None  # the command that settles whether the recommendation completes the run
    margin: Margin | None = None  # the best setting's headroom (None: the replays could not decide)

    def to_dict(self, with_map: bool = True) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("pinned", "what_if", "memory_map", "margin")}
        d["margin"] = self.margin.to_dict() if self.margin is not None else None
        d["schema"] = SCHEMA
        d["evidence"] = list(self.evidence)
        d["pinned"] = [p.to_dict() for p in self.pinned]
        d["what_if"] = [w.to_dict() for w in self.what_if]
        if with_map:
            d["memory_map"] = self.memory_map.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SnapshotDiagnosis":
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k not in ("pinned", "what_if", "memory_map", "margin")}
        kw["evidence"] = tuple(d.get("evidence", ()))
        kw["pinned"] = tuple(PinnedSegment.from_dict(p) for p in d.get("pinned", ()))
        kw["what_if"] = tuple(WhatIf.from_dict(w) for w in d.get("what_if", ()))
        kw["memory_map"] = MemoryMap.from_dict(d.get("memory_map", {}))
        m = d.get("margin")
        kw["margin"] = Margin(int(m["bytes"]), float(m["fraction"]), bool(m["thin"])) if m else None
        return cls(**kw)
