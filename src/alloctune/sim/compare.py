"""Fidelity: does a replay reproduce a recording? Names the first differing event.

Compared, strictly: the sequence of segment events (action and size, in order; addresses
are the driver's and are reported, not compared), the peaks and counters of the recorded
`memory_stats()` (from the sidecar `stats` when present), and for capped runs which
requests failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from alloctune.sim.replay import Addresses, SimResult
from alloctune.trace.model import FAILED_ALLOC, OP_NAMES, SegmentEvent, Trace, peak_reserved
from alloctune.units import format_size

STAT_KEYS = (
    "reserved_bytes.all.peak",
    "allocated_bytes.all.peak",
    "segment.all.peak",
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
    "reserved_bytes.all.current",
    "allocated_bytes.all.current",
    "requested_bytes.all.peak",
    "inactive_split_bytes.all.peak",
)
HEADLINE = ("reserved_bytes.all.peak", "allocated_bytes.all.peak", "segment.all.peak", "num_alloc_retries")
SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")


@dataclass(frozen=True)
class Fidelity:
    """The verdict of one comparison. `exact` = same events, stats and failures."""

    events_recorded: int
    events_simulated: int
    first_difference: int | None  # index into the segment-event sequences, None = identical
    context: str  # human-readable account of the first difference ('' if none)
    stats: dict[str, tuple[Any, Any]]  # key -> (recorded, simulated)
    failed_recorded: tuple[int, ...]
    failed_simulated: tuple[int, ...]
    outcome_recorded: str | None
    outcome_simulated: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def events_match(self) -> bool:
        return self.first_difference is None

    @property
    def stats_match(self) -> bool:
        return all(r == s for r, s in self.stats.values())

    @property
    def headline_match(self) -> bool:
        return all(self.stats[k][0] == self.stats[k][1] for k in HEADLINE if k in self.stats)

    @property
    def failures_match(self) -> bool:
        return self.failed_recorded == self.failed_simulated

    @property
    def exact(self) -> bool:
        return (
            self.events_match
            and self.stats_match
            and self.failures_match
            and (self.outcome_recorded in (None, self.outcome_simulated))
        )

    @property
    def verdict(self) -> str:
        if self.exact:
            return "exact"
        parts = []
        if not self.events_match:
            parts.append(f"segment events differ from #{self.first_difference}")
        bad = [k for k, (r, s) in self.stats.items() if r != s]
        if bad:
            parts.append("stats differ: " + ", ".join(bad))
        if not self.failures_match:
            parts.append(f"failed requests differ ({len(self.failed_recorded)} recorded, {len(self.failed_simulated)} simulated)")
        if self.outcome_recorded not in (None, self.outcome_simulated):
            parts.append(f"outcome {self.outcome_simulated} != recorded {self.outcome_recorded}")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "alloctune.fidelity/1",
            "verdict": self.verdict,
            "exact": self.exact,
            "events_recorded": self.events_recorded,
            "events_simulated": self.events_simulated,
            "first_difference": self.first_difference,
            "context": self.context,
            "stats": {k: {"recorded": r, "simulated": s} for k, (r, s) in self.stats.items()},
            "failed_recorded": list(self.failed_recorded),
            "failed_simulated": list(self.failed_simulated),
            "outcome_recorded": self.outcome_recorded,
            "outcome_simulated": self.outcome_simulated,
            "details": self.details,
        }


def compare(result: SimResult, recorded: Trace, *, stream_trace: Trace | None = None, explain: bool = True) -> Fidelity:
    """Compare a replay with a recording (`stream_trace` = the trace whose requests were replayed,
    default `recorded`, used to show the requests around a difference)."""
    rec = [e for e in recorded.segment_events if e.action in SEGMENT_ACTIONS]
    sim = [e for e in result.segment_events if e.action in SEGMENT_ACTIONS]
    first = None
    for k, (a, b) in enumerate(zip(rec, sim)):
        if a.action != b.action or a.size != b.size:
            first = k
            break
    if first is None and len(rec) != len(sim):
        first = min(len(rec), len(sim))
    context = _context(first, rec, sim, stream_trace or recorded) if first is not None else ""
    if first is not None and explain:
        context += _state_note(result, recorded, stream_trace or recorded, rec, sim, first)

    recorded_stats = (recorded.meta or {}).get("stats") or {}
    stats = {k: (recorded_stats[k], result.stats.get(k)) for k in STAT_KEYS if k in recorded_stats}
    if not recorded_stats:  # no sidecar: peaks rebuilt from the recorded events
        stats["reserved_bytes.all.peak"] = (peak_reserved(rec), result.peak_reserved)
        stats["num_ooms"] = (sum(1 for e in recorded.segment_events if e.action == "oom"), result.stats["num_ooms"])
    # the requests the replayed stream says failed on the GPU (its FAILED_ALLOCs) must be
    # exactly the ones that fail in the simulation, and no others
    replayed = stream_trace or recorded
    failed_rec = tuple(i for i, op in enumerate(replayed.requests.ops) if op == FAILED_ALLOC)
    failed_sim = tuple(sorted(result.expected_failures + ((result.oom.request_index,) if result.oom else ())))
    outcome_sim = "ok" if result.oom is None else "oom"
    outcome_rec = (recorded.meta or {}).get("outcome")
    # A recorded run ends "oom" when the program gave up after its failures; the replay of
    # the same stream then ends with those failures reproduced, not with a new one.
    if outcome_rec == "oom" and result.oom is None and failed_rec and failed_rec == failed_sim:
        outcome_sim = "oom"
    details = {"address_divergence": result.address_divergence}
    return Fidelity(
        events_recorded=len(rec),
        events_simulated=len(sim),
        first_difference=first,
        context=context,
        stats=stats,
        failed_recorded=failed_rec,
        failed_simulated=failed_sim,
        outcome_recorded=outcome_rec,
        outcome_simulated=outcome_sim,
        details=details,
    )


def _state_note(
    result: SimResult, recorded: Trace, stream: Trace, rec: list[SegmentEvent], sim: list[SegmentEvent], first: int
) -> str:
    """The simulated pool just before the request of the first difference: which free blocks
    it could have used (re-replays up to there; the same address source as the replay)."""
    from alloctune.sim.allocator import SMALL_SIZE
    from alloctune.sim.replay import state_at
    from alloctune.sim.settings import SimSettings

    r = rec[first] if first < len(rec) else None
    s = sim[first] if first < len(sim) else None
    idx = min(x.request_index for x in (r, s) if x is not None)
    addresses: Addresses
    if result.addresses.startswith("recorded:"):
        src = result.addresses[len("recorded:") :]
        ref = recorded if recorded.source == src else stream if stream.source == src else None
        if ref is None:
            return ""
        addresses = "recorded"
    elif result.addresses == "model":
        ref, addresses = None, "model"
    else:
        return ""
    alloc = state_at(
        stream,
        SimSettings.from_dict(result.settings),
        idx,
        budget=result.budget,
        total_memory=result.total_memory,
        addresses=addresses,
        reference=ref,
    )
    if idx >= len(stream.requests):
        return ""
    size = alloc.round_size(max(0, stream.requests.sizes[idx]))
    pool = alloc.small_pool if size <= SMALL_SIZE else alloc.large_pool
    fits = sorted((b.size, b.addr) for fs in pool.sets.values() for b in fs.blocks.values() if b.size >= size)
    shown = ", ".join(f"{format_size(sz)} at {addr:#x}" for sz, addr in fits[:6]) or "none"
    return (
        f"\nsimulated state before request #{idx}: reserved {format_size(alloc.stats.reserved)}, "
        f"allocated {format_size(alloc.stats.allocated)}, {len(alloc.segments)} segments; "
        f"free blocks >= {format_size(size)}: {shown}{' ...' if len(fits) > 6 else ''}"
    )


def _fmt(e: SegmentEvent | None) -> str:
    if e is None:
        return "(none)"
    return f"{e.action} {format_size(e.size)} ({e.size} B) at {e.addr:#x}, request #{e.request_index}"


def _context(first: int, rec: list[SegmentEvent], sim: list[SegmentEvent], stream: Trace) -> str:
    r = rec[first] if first < len(rec) else None
    s = sim[first] if first < len(sim) else None
    lines = [
        f"segment event #{first}: recorded {_fmt(r)}; simulated {_fmt(s)}",
    ]
    if r is not None and r.event_index >= 0:
        lines.append(f"recorded trace event index {r.event_index}")
    idx = min(x.request_index for x in (r, s) if x is not None)
    req = stream.requests
    lo, hi = max(0, idx - 3), min(len(req), idx + 3)
    around = []
    for i in range(lo, hi):
        op = OP_NAMES.get(req.ops[i], str(req.ops[i]))
        size = req.sizes[i]
        around.append(f"#{i} {op}" + (f" {size}" if size >= 0 else "") + (" <-" if i == idx else ""))
    lines.append("requests: " + ", ".join(around))
    prev = [f"{e.action} {e.size}" for e in sim[max(0, first - 3) : first]]
    if prev:
        lines.append("preceding (both): " + "; ".join(prev))
    return "\n".join(lines)
