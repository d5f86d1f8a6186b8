"""One utilization table per setting and per remedy: min budget, peak reserved, peak allocated
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
from typing import Any, Callable, Sequence

from alloctune.explain.moment import reserved_levels
from alloctune.remedy.model import Shared, activity_of
from alloctune.trace.model import Trace
from alloctune.units import format_percent, format_size, utilization

TARGET = 0.97
# The settings `explain` sets beside the recording in the table: expandable segments map only the pages
# live blocks need, the one setting of the caching allocator that removes most idle memory (Linux; the
# others are `tune`'s to search).
COMPARED_SETTINGS = ("expandable_segments:True",)


@dataclass(frozen=True)
class UtilizationRow:
    kind: str  # "recording" | "setting" | "remedy" | "setting + remedy"
    name: str
    conf: str  # the allocator setting ("" = the default)
    min_budget: int | None
    peak_reserved: int | None
    peak_allocated: int | None
    method: str  # simulated | measured | needs a confirming run
    trace: Any = field(default=None, repr=False, compare=False)  # its (rewritten) recording, for `held_back`

    @property
    def utilization(self) -> float | None:
        """peak allocated ÷ peak reserved (`units.utilization`)."""
        return utilization(self.peak_allocated, self.peak_reserved)

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
        return {
            "target": self.target,
            "reachable": self.reachable,
            "held_back": self.held_back,
            "rows": [r.to_dict() for r in self.rows],
        }


def remedy_rows(remedies: Sequence[Any]) -> list[UtilizationRow]:
    """Rows for `remedy.model.Remedy`s (the unconfirmed ones too: their row says so)."""
    return [
        UtilizationRow(
            "remedy", r.name, r.conf, r.min_budget, r.peak_reserved, r.peak_allocated, r.method, getattr(r, "trace", None)
        )
        for r in remedies
    ]


def combined_rows(
    an: Any, recorded: UtilizationRow, remedies_under: Callable[..., list[Any]], shared: Shared | None = None
) -> list[UtilizationRow]:
    """A row per `COMPARED_SETTINGS` entry the recording did not run with (its uncapped replay and
    min budget), then, under the one of them that keeps the least idle memory when it beats the
    recording, the release policies simulated again under it (`remedies_under(an, min budget, conf,
    uncapped replay)`: `remedy.registry.release_remedies`): what a setting and a remedy buy together.
    `shared`: where the recording's replays under a setting may have been made already."""
    trace, out, runs = an.trace, [], {}
    shared = Shared(trace) if shared is None else shared
    for conf in COMPARED_SETTINGS:  # all started (in `shared`'s thread) before the first is waited for
        if conf != recorded.conf:
            shared.prefetch(trace, conf)
    for conf in COMPARED_SETTINGS:
        if conf == recorded.conf:
            continue
        try:
            run = runs[conf] = shared.run(trace, conf)
            peak, alloc, _, _ = activity_of(run)
            out.append(UtilizationRow("setting", conf, conf, shared.min_budget(trace, conf), peak, alloc, "simulated"))
        except Exception:  # noqa: BLE001 - a setting the simulator cannot replay here: no row
            continue
    known = [r for r in out if r.utilization is not None]
    best = max(known, key=lambda r: r.utilization) if known else None  # type: ignore[arg-type, return-value]
    if best is None or (best.utilization or 0) <= (recorded.utilization or 0):
        return out
    for r in remedies_under(an, best.min_budget, best.conf, runs[best.conf]):
        if r.janitor is not None or r.name.startswith("empty_cache"):  # the release policies: they replay
            out.append(
                UtilizationRow(
                    "setting + remedy",
                    f"{best.conf} + {r.name}",
                    best.conf,
                    r.min_budget,
                    r.peak_reserved,
                    r.peak_allocated,
                    r.method,
                    r.trace,
                )
            )
    return out


def peak_split(trace: Trace, conf: str) -> dict[str, int]:
    """The memory at the peak of `trace` replayed uncapped under `conf`, at explain's moment (of the
    requests after which reserved is at its peak, the one holding the most live bytes): reserved,
    allocated, and the idle bytes split as explain splits them (`inactive_split`: free pieces of
    segments that hold live blocks; `cached_free`: the rest of what is reserved but not allocated;
    `rounding`: allocated minus requested). One replay finds the moment; a second one of the requests
    up to it gives the allocator's counters there (`_counters_after`)."""
    from alloctune.sim.replay import replay
    from alloctune.trace.model import ALLOC, FREE

    events = replay(trace, conf or None, reference=trace).segment_events
    req = trace.requests
    n = len(req)
    ops, sizes, rids = req.ops, req.sizes, req.rids
    live = 0
    best_live, at = -1, n - 1
    size_of: dict[int, int] = {}
    after = reserved_levels(n, events)  # reserved after each request
    peak = max(0, max(after, default=0))
    for r in range(n):  # live requested bytes after request r; the best moment at the peak
        op = ops[r]
        if op == ALLOC:
            size_of[rids[r]] = sizes[r]
            live += sizes[r]
        elif op == FREE:
            live -= size_of.pop(rids[r], 0)
        if after[r] == peak and live > best_live:
            best_live, at = live, r
    st = _counters_after(trace, conf, at + 1)
    split = int(st["inactive_split_bytes.all.current"])
    reserved, allocated = int(st["reserved_bytes.all.current"]), int(st["allocated_bytes.all.current"])
    return {
        "reserved": reserved,
        "allocated": allocated,
        "inactive_split": split,
        "cached_free": reserved - allocated - split,
        "rounding": allocated - int(st["requested_bytes.all.current"]),
    }


def _counters_after(trace: Trace, conf: str, stop: int) -> dict[str, Any]:
    """The allocator's counters (`memory_stats()` names) after requests [0, stop) of `trace` replayed
    uncapped under `conf` with the recording's segment addresses: the end of a replay of those
    requests alone (what `sim.replay.state_at` reaches one request at a time in the Python model)."""
    from alloctune.sim.replay import replay
    from alloctune.trace.model import RequestStream

    req = trace.requests
    stop = min(max(stop, 0), len(req))
    head = RequestStream(
        req.ops[:stop],
        req.sizes[:stop],
        req.rids[:stop],
        req.streams[:stop],
        req.event_index[:stop],
        {i: v for i, v in req.fallbacks.items() if i < stop},
    )
    first = Trace(
        source=trace.source,
        device=trace.device,
        requests=head,
        segment_events=[],
        allocator_settings=dict(trace.allocator_settings),
        total_memory=trace.total_memory,
    )
    return replay(first, conf or None, reference=trace, record_events=False, timeline_points=1).stats


def held_back(trace: Trace, conf: str) -> str:
    """What keeps utilization below 1 at the peak of `trace` replayed under `conf` (`peak_split`)."""
    o = peak_split(trace, conf)
    reserved = o["reserved"] or 1
    rounding = (
        o["rounding"],
        "rounding of each request up to its block size (no allocator setting removes it; fewer, larger requests do)",
    )
    if "expandable_segments:true" in (conf or "").replace(" ", "").lower():
        # one segment per stream and pool, mapped page by page: what is idle is mapped free pages, whichever
        # side of a live block they lie on
        parts = [
            (
                o["inactive_split"] + o["cached_free"],
                "free pages still mapped in the expandable segments "
                "(holes the freed blocks left, too small for the request that grew the segment here; an "
                "empty_cache() before this point unmaps every whole free page)",
            ),
            rounding,
        ]
    else:
        parts = [
            (
                o["inactive_split"],
                "free pieces of segments that also hold live blocks (fragmentation: "
                "expandable segments or a smaller max_split_size_mb reduce it)",
            ),
            (
                o["cached_free"],
                "free memory the cache keeps in segments with no live block (a release point before the peak returns it)",
            ),
            rounding,
        ]
    parts.sort(key=lambda p: -p[0])
    said = "; ".join(f"{format_size(b)} ({100.0 * b / reserved:.1f} %) {what}" for b, what in parts if b > 0)
    return (
        f"at the peak under {conf or 'the default'} ({format_size(o['reserved'])} reserved, "
        f"{format_size(o['allocated'])} allocated): {said or 'nothing idle'}"
    )


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
    head = f"{format_percent(TARGET)} utilization is not reached (best {format_percent(best.utilization)}, {best.name}); "
    return UtilizationTable(t.rows, t.target, head + why)
