"""One utilization table per setting and per remedy (#29.6): min budget, peak reserved, peak allocated
and their ratio, so the user sees which remedy buys what; and, where no row reaches the target
(0.97), what holds it back -- the free bytes at the peak split as `explain` splits them.

Utilization is peak allocated ÷ peak reserved of one uncapped run (or replay): 1 − what the cache
holds idle at its fullest. What is left below 1 at the best row's peak is either whole free
segments (`cached_free`: a release point returns them), free pieces of segments that hold live
blocks (`inactive_split`: fragmentation, which expandable segments or a split limit reduce), or
the allocation rounding inside live blocks (no setting of the caching allocator removes it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from alloctune.trace.model import Trace
from alloctune.units import format_size

TARGET = 0.97


@dataclass(frozen=True)
class UtilizationRow:
    kind: str  # "setting" | "remedy" | "recording"
    name: str
    conf: str  # the allocator setting ("" = the default)
    min_budget: int | None
    peak_reserved: int | None
    peak_allocated: int | None
    method: str  # simulated | measured | needs a confirming run
    trace: Any = field(default=None, repr=False, compare=False)  # its (rewritten) recording, for `held_back`

    @property
    def utilization(self) -> float | None:
        if not self.peak_reserved or self.peak_allocated is None:
            return None
        return self.peak_allocated / self.peak_reserved

    def to_dict(self) -> dict[str, Any]:
        d = {**self.__dict__, "utilization": self.utilization}
        d.pop("trace")
        return d


@dataclass(frozen=True)
class UtilizationTable:
    rows: tuple[UtilizationRow, ...]
    target: float = TARGET
    held_back: str | None = None  # why no row reaches the target (None: one does, or unknown)

    @property
    def best(self) -> UtilizationRow | None:
        known = [r for r in self.rows if r.utilization is not None]
        return max(known, key=lambda r: r.utilization) if known else None  # type: ignore[arg-type, return-value]

    @property
    def reachable(self) -> bool:
        b = self.best
        return b is not None and (b.utilization or 0) >= self.target

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "reachable": self.reachable, "held_back": self.held_back,
                "rows": [r.to_dict() for r in self.rows]}


def remedy_rows(remedies: Sequence[Any]) -> list[UtilizationRow]:
    """Rows for `explain.remedies.Remedy`s (the unconfirmed ones too: their row says so)."""
    return [UtilizationRow("remedy", r.name, r.conf, r.min_budget, r.peak_reserved, r.peak_allocated, r.method,
                           getattr(r, "trace", None)) for r in remedies]


def held_back(trace: Trace, conf: str) -> str:
    """What keeps utilization below 1 at the peak of `trace` replayed under `conf`: explain's split
    of the free bytes there (the replay written as a snapshot and explained at its peak)."""
    from alloctune.explain.core import explain_trace
    from alloctune.sim.export import simulated_snapshot
    from alloctune.trace.load import trace_from_snapshot

    snap = simulated_snapshot(trace, conf or None)
    ex = explain_trace(trace_from_snapshot(snap, None, source=f"{trace.source} under {conf or 'the default'}"), top=1)
    o, reserved = ex.overhead, ex.reserved or 1
    parts = [(o.get("inactive_split", 0), "free pieces of segments that also hold live blocks (fragmentation: "
              "expandable segments or a smaller max_split_size_mb reduce it)"),
             (o.get("cached_free", 0), "whole free segments kept by the cache (a release point returns them)"),
             (o.get("rounding", 0), "rounding of each request up to its block size (no allocator setting removes "
              "it; fewer, larger requests do)")]
    parts.sort(key=lambda p: -p[0])
    said = "; ".join(f"{format_size(b)} ({100.0 * b / reserved:.1f} %) {what}" for b, what in parts if b > 0)
    return (f"at the peak under {conf or 'the default'} ({format_size(ex.reserved)} reserved): "
            f"{said or 'nothing idle'}")


def table(rows: Sequence[UtilizationRow], trace: Trace | None = None) -> UtilizationTable:
    """The table; when no row reaches the target and a recording is at hand, what holds it back: the
    best row's own (rewritten) recording, else `trace`, explained under the best row's setting."""
    t = UtilizationTable(tuple(rows))
    best = t.best
    src = best.trace if best is not None and best.trace is not None else trace
    if t.reachable or best is None or src is None:
        return t
    try:
        why = held_back(src, best.conf)
    except Exception as exc:  # noqa: BLE001 - the table stands without the reason
        why = f"not explained ({type(exc).__name__}: {exc})"
    return UtilizationTable(t.rows, t.target, f"{TARGET} is not reached (best {best.utilization:.3f}, {best.name}); "
                                              + why)


def render_lines(t: UtilizationTable) -> list[str]:
    """The table as plain lines for the terminal."""
    def fmt(n: int | None) -> str:
        return "-" if n is None else format_size(n)

    out = [f"  {'':<40} {'min budget':>12} {'peak reserved':>14} {'peak alloc':>12} {'util':>6}  method"]
    for r in t.rows:
        u = "-" if r.utilization is None else f"{r.utilization:.3f}"
        out.append(f"  {r.kind + ' ' + r.name:<40.40} {fmt(r.min_budget):>12} {fmt(r.peak_reserved):>14} "
                   f"{fmt(r.peak_allocated):>12} {u:>6}  {r.method}")
    if t.held_back:
        out.append(f"  {t.held_back}")
    return out
