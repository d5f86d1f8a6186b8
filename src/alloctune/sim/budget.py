"""`min_budget`: the smallest per-process cap under which a trace still completes.

Bisection between a budget that must fail (below the program's own peak of live requested
bytes, nothing can fit) and one that completes (the uncapped peak reserved, grown if a
setting such as GC needs more). It stops when the bracket is within 1 % or 16 MiB, and
reports the completing end. Feasibility is assumed monotone in the budget, which holds
for the allocator's rules in practice but is not guaranteed (a cap changes which segments
get released, and so later placement); the result is the bracket the bisection saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from alloctune.sim.replay import replay
from alloctune.trace.model import Trace

MiB = 1 << 20


@dataclass(frozen=True)
class MinBudget:
    budget: int | None  # smallest completing budget found (bytes); None if even the device is too small
    infeasible_below: int  # largest budget seen to fail
    replays: int
    peak_reserved_uncapped: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def min_budget(
    trace: Trace,
    config: Any = None,
    *,
    torch: str | None = None,
    total_memory: int | None = None,
    rel_tol: float = 0.01,
    abs_tol: int = 16 * MiB,
) -> MinBudget:
    """Bisection for the smallest completing budget of `trace` under `config`."""

    def ok(budget: int | None) -> tuple[bool, Any]:
        r = replay(trace, config, budget=budget, total_memory=total_memory, torch=torch, record_events=False,
                   timeline_points=1)
        return r.completed, r

    done, base = ok(None)
    runs = 1
    if not done:
        return MinBudget(None, base.total_memory, runs, base.peak_reserved)
    lo = max(0, base.peak_requested - 1)  # nothing fits below the live requested bytes
    if trace.requests.fallbacks:
        lo = 0  # ... unless requests can fall back to smaller sizes under a cap (trace.fallible)
    hi = base.peak_reserved
    while True:
        good, _ = ok(hi)
        runs += 1
        if good:
            break
        lo = hi
        if hi >= base.total_memory:
            return MinBudget(None, lo, runs, base.peak_reserved)
        hi = min(base.total_memory, hi * 2)
    while hi - lo > max(abs_tol, int(rel_tol * hi)):
        mid = (lo + hi) // 2
        good, _ = ok(mid)
        runs += 1
        if good:
            hi = mid
        else:
            lo = mid
    return MinBudget(hi, lo, runs, base.peak_reserved)
