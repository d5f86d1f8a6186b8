"""`min_budget`: the smallest per-process cap under which a trace still completes.

Bisection between a budget that must fail (below the program's own peak of live requested
bytes, nothing can fit: cap >= reserved >= allocated >= requested) and one that completes
(the uncapped peak reserved, grown if a setting such as GC needs more). It stops when the
bracket is within `REL_TOL` or `ABS_TOL` (0.2 % or 1 MiB), and reports the completing end: one
resolution for every command, so that a number one command prints is the number the command it
prints as its reproduction answers (a remedy's saving is often a few percent, finer than 1 %). Feasibility is assumed
monotone in the budget, which holds for the allocator's rules in practice but is not
guaranteed (a cap changes which segments get released, and so later placement); the result
is the bracket the bisection saw.

Replays the trace already answers are skipped, never guessed: the uncapped run can be passed
in (`uncapped=`), and without garbage collection a cap at or above the uncapped peak reserved
is never hit, so that run *is* the uncapped one and completes (GC is the exception: a cap
switches it on and changes the run, so it is replayed).

Each probe is exact and costs less than a replay where it can (`_Probes`): a capped run is the
uncapped one until the first time the cap refuses memory (`sim.session`), so with the native
core each probe starts from a copy of the latest state of the uncapped replay (`uncapped=` made
with `keep_states=True`) that it shares, and a cap no comparison of that replay exceeded is
answered by the replay itself. The answers, and so the bisection's path and result, are those of
full replays (`tests/test_explain_speed_sessions.py` holds them equal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from alloctune.sim import native
from alloctune.sim.driver import H200_TOTAL, AddressModel
from alloctune.sim.replay import Addresses, Paused, SimResult, allocator_cap, cap_from_budget, replay, start
from alloctune.sim.resolution import ABS_TOL, REL_TOL, step
from alloctune.sim.session import Checkpoints
from alloctune.sim.settings import SimSettings
from alloctune.trace.model import Trace


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
    rel_tol: float = REL_TOL,
    abs_tol: int = ABS_TOL,
    uncapped: SimResult | None = None,
    addresses: Addresses | AddressModel = "recorded",
    reference: Trace | None = None,
) -> MinBudget:
    """Bisection for the smallest completing budget of `trace` under `config`.

    `uncapped`: a replay of this trace and setting without a budget (same `total_memory`,
    `addresses`, `reference`) that the caller already has; it saves that replay.
    """
    settings = SimSettings.from_config(config, torch)
    runs = 0
    if uncapped is None:
        base = replay(
            trace,
            settings,
            total_memory=total_memory,
            addresses=addresses,
            reference=reference,
            record_events=False,
            timeline_points=1,
            keep_states=True,
        )
        runs += 1
    else:
        _check_uncapped(uncapped, trace, settings, total_memory)
        base = uncapped
    ok = _Probes(trace, settings, total_memory, addresses, reference, base.states).completes
    if not base.completed:
        return MinBudget(None, base.total_memory, runs, base.peak_reserved)
    lo = max(0, base.peak_requested - 1)  # nothing fits below the live requested bytes
    if trace.requests.fallbacks:
        lo = 0  # ... unless requests can fall back to smaller sizes under a cap (trace.fallible)
    hi = base.peak_reserved
    # the trace's own proof: with no GC, a cap >= the uncapped peak reserved never binds. Not with
    # expandable segments: under a cap a growing segment is checked against the whole step it maps,
    # which can exceed the peak reserved of the uncapped run (tests/test_plan_answer.py found one).
    cap = cap_from_budget(hi, base.total_memory, settings.torch)
    proven = (
        settings.garbage_collection_threshold <= 0
        and not settings.expandable_segments
        and (cap is None or cap >= base.peak_reserved)
    )
    while not proven:
        runs += 1
        if ok(hi):
            break
        lo = hi
        if hi >= base.total_memory:
            return MinBudget(None, lo, runs, base.peak_reserved)
        hi = min(base.total_memory, hi * 2)
    while hi - lo > step(hi, rel_tol, abs_tol):
        mid = (lo + hi) // 2
        runs += 1
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return MinBudget(hi, lo, runs, base.peak_reserved)


def _check_uncapped(r: SimResult, trace: Trace, settings: SimSettings, total_memory: int | None) -> None:
    """An `uncapped=` result from another trace, setting or device would give a wrong answer silently."""
    total = int(total_memory or trace.total_memory or H200_TOTAL)
    if (
        r.budget is not None
        or r.requests != len(trace.requests)
        or r.settings != settings.to_dict()
        or r.total_memory != total
        or r.source != trace.source
    ):
        raise ValueError("min_budget(uncapped=...) must be an uncapped replay of the same trace, setting and total memory")


class _Probes:
    """Whether `trace` completes under a budget, each answer that of a full replay (`replay(...).completed`).

    With `checkpoints` of the uncapped replay of these requests (native core, its address models, no
    garbage collection), `Checkpoints.completes` answers from where the capped run leaves the
    uncapped one; else each probe replays from the start."""

    def __init__(
        self,
        trace: Trace,
        settings: SimSettings,
        total_memory: int | None,
        addresses: Addresses | AddressModel,
        reference: Trace | None,
        checkpoints: Checkpoints | None,
    ) -> None:
        self.trace, self.settings, self.addresses, self.reference = trace, settings, addresses, reference
        self.total_memory = total_memory
        self.total = int(total_memory or trace.total_memory or H200_TOTAL)
        cols = native.columns(trace.requests) if checkpoints is not None and native.core() is not None else None
        # GC runs only under a cap and its threshold is a fraction of the cap: no two runs share a state
        usable = (
            cols is not None
            and checkpoints is not None
            and checkpoints.columns is cols
            and settings.garbage_collection_threshold <= 0
        )
        self.checkpoints = checkpoints if usable else None

    def _fresh(self, budget: int | None = None) -> Paused:
        return start(
            self.trace,
            self.settings,
            budget=budget,
            total_memory=self.total_memory,
            addresses=self.addresses,
            reference=self.reference,
        )

    def completes(self, budget: int) -> bool:
        if self.checkpoints is not None:
            cap = allocator_cap(self.settings, budget, self.total)
            return self.checkpoints.completes(cap, self.trace.requests.fallbacks, self._fresh)
        run = self._fresh(budget)
        run.run(len(self.trace.requests))
        return not run.failed
