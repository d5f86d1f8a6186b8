"""Plain data of an explanation (`alloctune.explain/2`): frozen dataclasses with `to_dict`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from alloctune.analysis.phases import PhaseBytes
from alloctune.schema import schema_id

SCHEMA = schema_id("explain", 2)
CATEGORIES = (
    "model_state",
    "gradients",
    "optimizer_state",
    "activations",
    "growing",
    "cached_free",
    "inactive_split",
    "rounding",
)
OVERHEAD = ("cached_free", "inactive_split", "rounding")


@dataclass(frozen=True)
class Category:
    name: str
    bytes: int
    blocks: int
    how: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class WhatIfResult:
    """A simulated counterfactual: the min budget of the transformed recording."""

    what: str
    min_budget: int | None
    saves: int | None  # the recording's own min budget minus this one
    command: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Site:
    site: str
    library_frame: str | None
    bytes: int  # live requested bytes at the moment
    blocks: int
    outlived_bytes: int  # of those, in blocks that outlived the repetition that made them
    growing: bool
    growing_bytes: int
    bytes_per_repeat: int
    categories: dict[str, int] = field(default_factory=dict)
    min_budget_if_freed: int | None = None
    what_if_command: str | None = None
    delta: int | None = None  # with --against: bytes here minus bytes in the other recording
    model_frame: str | None = None  # the model's own code between the user's line and the library (most bytes)

    @classmethod
    def others(cls, rest: Sequence["Site"], delta: int | None = None) -> "Site":
        """The one row that stands for the sites not listed: their bytes, blocks and categories summed."""
        cats: Counter[str] = Counter()
        for r in rest:
            cats.update(r.categories)
        return cls(
            f"({len(rest)} other sites)",
            None,
            sum(r.bytes for r in rest),
            sum(r.blocks for r in rest),
            sum(r.outlived_bytes for r in rest),
            False,
            sum(r.growing_bytes for r in rest),
            0,
            dict(cats),
            delta=delta,
        )

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        if self.delta is None:
            d.pop("delta")
        return d


@dataclass(frozen=True)
class Explanation:
    source: str
    moment: dict[str, Any]  # event, time, reserved, allocated, request, reason
    categories: tuple[Category, ...]
    overhead: dict[str, int]
    sites: tuple[Site, ...]
    sites_total: int  # distinct sites with live bytes (the list may be cut to `top`)
    group: str
    stacks: str  # "python" | "none" | why they were dropped
    repeats: dict[str, Any]
    map_source: str
    what_if: tuple[WhatIfResult, ...] = ()
    min_budget: int | None = None  # the recording's own min budget (what-ifs compare with it)
    # the low end of its range when workspace-shaped requests no evidence covers could be given up
    # (`remedy.model.workspace_floor`); None: the min budget is one number
    min_budget_floor: int | None = None
    notes: tuple[str, ...] = ()
    remedies: tuple[Any, ...] = ()  # program-level remedies simulated on the recording (`remedy.model.Remedy`)
    utilization: Any = None  # `explain.utilization.UtilizationTable`: the recording and each remedy
    # live bytes at the moment by the phase that made them (`analysis.phases.PhaseBytes`), summing to
    # moment["allocated"]; empty when the recording names no phase
    phases: tuple[PhaseBytes, ...] = ()

    @property
    def reserved(self) -> int:
        return int(self.moment["reserved"])

    @property
    def moment_name(self) -> str:
        """How prose names the moment: "peak", "OOM", or "moment" (one picked with --at)."""
        return {"peak": "peak", "oom": "OOM"}.get(str(self.moment["reason"]), "moment")

    def category(self, name: str) -> int:
        return next(c.bytes for c in self.categories if c.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "source": self.source,
            "moment": dict(self.moment),
            "categories": [c.to_dict() for c in self.categories],
            "overhead": dict(self.overhead),
            "sites": [s.to_dict() for s in self.sites],
            "sites_total": self.sites_total,
            "group": self.group,
            "stacks": self.stacks,
            "repeats": dict(self.repeats),
            "map_source": self.map_source,
            "min_budget": self.min_budget,
            "min_budget_range": ([self.min_budget_floor, self.min_budget] if self.min_budget_floor is not None else None),
            "what_if": [w.to_dict() for w in self.what_if],
            "remedies": [r.to_dict() for r in self.remedies],
            "utilization": self.utilization.to_dict() if self.utilization is not None else None,
            "phases": [p.to_dict() for p in self.phases],
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class Comparison:
    """`explain B --against A`: B's peak minus A's, split by category and by site, exactly."""

    this: Explanation
    other: Explanation
    gap: int
    categories: dict[str, int]  # delta per category (sums to gap)
    sites: tuple[Site, ...]  # B's sites with `delta` (site deltas + overhead deltas = gap)
    other_only: tuple[tuple[str, int], ...]  # sites only in A, with their (negative) delta

    def to_dict(self) -> dict[str, Any]:
        d = self.this.to_dict()
        d["against"] = {
            "source": self.other.source,
            "moment": dict(self.other.moment),
            "categories": [c.to_dict() for c in self.other.categories],
        }
        d["gap"] = self.gap
        d["category_delta"] = dict(self.categories)
        d["sites"] = [s.to_dict() for s in self.sites]
        d["sites_only_against"] = [{"site": s, "delta": b} for s, b in self.other_only]
        return d


@dataclass(frozen=True)
class RankImbalance:
    """One program's ranks side by side (a torchrun recording set): each rank explained at its own
    peak, and per category and per site the bytes of every rank and the spread (max - min)."""

    ranks: tuple[int, ...]
    explanations: tuple[Explanation, ...]
    categories: dict[str, list[int]]  # name -> bytes per rank (rank order)
    sites: tuple[tuple[str, list[int]], ...]  # (site, bytes per rank), largest spread first

    def to_dict(self) -> dict[str, Any]:
        reserved = [e.reserved for e in self.explanations]
        return {
            "schema": schema_id("explain-ranks"),
            "ranks": list(self.ranks),
            "reserved": reserved,
            "reserved_spread": max(reserved) - min(reserved),
            "categories": [{"name": n, "bytes": v, "spread": max(v) - min(v)} for n, v in self.categories.items()],
            "sites": [{"site": s, "bytes": v, "spread": max(v) - min(v)} for s, v in self.sites],
            "explanations": [e.to_dict() for e in self.explanations],
        }
