"""The one sweep service: simulate several allocator settings on one trace, each with its
smallest working budget, and return plain data.

Why one place: `simulate`, `demo`, `tune` and the snapshot what-ifs all ask the same
question ("what would each setting need?"), and each used to write its own loop. Here each
setting costs one uncapped replay (peaks, retries, whether it completes at all), one
bisection for `min_budget`, and optionally one replay at the caller's budget.

Fallible requests (`RequestStream.fallbacks`, see `alloctune.trace.fallible`) are part of the
trace: a prediction that rests on large requests the model could not tag says so in
`Sweep.untagged_note`.

Where the native core is built, the settings replay side by side in threads (it replays without
the GIL); the rows are the ones one after another gives, in the order asked.

Pure Python: no torch.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterator, Sequence, TypeVar

from alloctune.config.standard import STANDARD_CONFS, setting_label
from alloctune.progress import Progress, no_progress
from alloctune.schema import schema_id
from alloctune.sim.budget import min_budget
from alloctune.sim.native import columns, core
from alloctune.sim.replay import replay
from alloctune.sim.resolution import ABS_TOL, REL_TOL
from alloctune.trace.model import Trace

SCHEMA = schema_id("sweep")


@dataclass(frozen=True)
class SweepRow:
    """One setting's simulated outcome: uncapped peaks, `min_budget`, and (if asked) the budget."""

    conf: str  # canonical allocator string ("" = default)
    completed: bool | None  # completes without a cap (on the trace's device); None: not replayed uncapped
    peak_reserved: int | None  # uncapped
    peak_allocated: int | None
    utilization: float | None
    retries: int | None  # uncapped num_alloc_retries
    min_budget: int | None  # smallest completing cap (bytes); None: not even the device suffices / not asked
    infeasible_below: int | None  # largest cap seen to fail in the bisection
    replays: int  # replays spent on this row (cost)
    at_budget: bool | None = None  # completes under `Sweep.budget`; None: no budget asked
    adapted_at_budget: int = 0  # fallible requests that fell back at the budget
    peak_reserved_at_budget: int | None = None
    num_ooms_at_budget: int | None = None
    oom_at_budget: dict[str, Any] | None = None  # the failure that ended the capped replay (OOMInfo.to_dict())
    # recorded failures (FAILED_ALLOC) that fit at the budget: a snapshot what-if's "avoids the OOM"
    surprises_at_budget: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        return setting_label(self.conf)

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "label": self.label}


@dataclass(frozen=True)
class Sweep:
    """Every setting of one sweep, in the order asked."""

    source: str
    torch: str | None
    total_memory: int | None
    budget: int | None
    rows: tuple[SweepRow, ...]
    fallible: int = 0  # requests of the trace with a learned fallback
    untagged_note: str | None = None  # set when predictions rest on requests the model could not tag

    def row(self, conf: str) -> SweepRow:
        for r in self.rows:
            if r.conf == conf:
                return r
        raise KeyError(conf)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "source": self.source,
            "torch": self.torch,
            "total_memory": self.total_memory,
            "budget": self.budget,
            "rows": [r.to_dict() for r in self.rows],
            "fallible": self.fallible,
            "untagged_note": self.untagged_note,
        }


def simulate_setting(
    trace: Trace,
    conf: str,
    *,
    budget: int | None = None,
    torch: str | None = None,
    total_memory: int | None = None,
    find_min: bool = True,
    rel_tol: float = REL_TOL,
    abs_tol: int = ABS_TOL,
    addresses: Any = "recorded",
    reference: Trace | None = None,
    uncapped: bool = True,
) -> SweepRow:
    """One row of a sweep (the unit `sweep` repeats; also what a caller with one setting uses).

    `uncapped=False` (with `find_min=False` and a budget) skips the uncapped replay: a what-if
    that only asks "does it fit this budget?" pays one replay per setting.
    """
    from alloctune.config import AllocatorConfig

    config = AllocatorConfig.parse(conf, torch) if torch else AllocatorConfig.parse(conf)
    where = {"addresses": addresses, "reference": reference}
    free = None
    replays = 0
    if uncapped or find_min or budget is None:
        free = replay(
            trace,
            config,
            total_memory=total_memory,
            torch=torch,
            record_events=False,
            timeline_points=1,
            keep_states=find_min,
            **where,
        )
        replays = 1
    mb_budget = mb_below = None
    if find_min:
        # the uncapped replay above is the bisection's first probe: handed over, not replayed again
        mb = min_budget(
            trace, config, torch=torch, total_memory=total_memory, rel_tol=rel_tol, abs_tol=abs_tol, uncapped=free, **where
        )
        mb_budget, mb_below, replays = mb.budget, mb.infeasible_below, replays + mb.replays
    capped = None
    if budget is not None:
        # replayed, not inferred from min_budget: feasibility is monotone in the cap only in practice
        capped = replay(
            trace, config, budget=budget, total_memory=total_memory, torch=torch, record_events=False, timeline_points=1, **where
        )
        replays += 1
    return SweepRow(
        conf=config.format(),
        completed=free.completed if free else None,
        peak_reserved=free.peak_reserved if free else None,
        peak_allocated=free.peak_allocated if free else None,
        utilization=free.utilization if free else None,
        retries=free.num_alloc_retries if free else None,
        min_budget=mb_budget,
        infeasible_below=mb_below,
        replays=replays,
        at_budget=capped.completed if capped else None,
        adapted_at_budget=len(capped.adapted) if capped else 0,
        peak_reserved_at_budget=capped.peak_reserved if capped else None,
        num_ooms_at_budget=int(capped.stats.get("num_ooms", 0)) if capped else None,
        oom_at_budget=capped.oom.to_dict() if capped and capped.oom else None,
        surprises_at_budget=tuple(capped.unexpected_successes) if capped else (),
    )


R = TypeVar("R")

# Settings a sweep replays side by side at most.
SWEEP_THREADS = 8


def sweep_threads(settings: int, addresses: Any) -> int:
    """Threads for a sweep: one per setting, up to the cores and `SWEEP_THREADS`, where the native
    core replays (it lets go of the GIL, and the settings' replays share nothing but the read-only
    trace); one with the Python model, which holds the GIL, or with an address model object, which
    every replay of the sweep would share."""
    if settings < 2 or not isinstance(addresses, str) or core() is None:
        return 1
    return max(1, min(settings, os.cpu_count() or 1, SWEEP_THREADS))


def side_by_side(
    work: Callable[[str], R], confs: Sequence[str], threads: int, trace: Trace
) -> Iterator[tuple[int, str, Callable[[], R]]]:
    """`(i, conf, result)` for each setting in order; calling `result()` gives `work(conf)`, computed
    then (one thread) or already under way beside the others (`threads` > 1). `trace`: the recording
    every `work` replays (its columns are converted once, before the threads start). Leaving the
    loop early (an error, Ctrl-C) drops the settings not started yet."""
    if threads == 1:
        for i, conf in enumerate(confs):
            yield i, conf, partial(work, conf)
        return
    columns(trace.requests)  # converted once, before the threads would each convert it
    pool = ThreadPoolExecutor(threads, thread_name_prefix="alloctune-sweep")
    try:
        futures = [pool.submit(work, conf) for conf in confs]
        for i, (conf, fut) in enumerate(zip(confs, futures)):
            yield i, conf, fut.result
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def sweep(
    trace: Trace,
    confs: Sequence[str] = STANDARD_CONFS,
    *,
    budget: int | None = None,
    torch: str | None = None,
    total_memory: int | None = None,
    find_min: bool = True,
    rel_tol: float = REL_TOL,
    abs_tol: int = ABS_TOL,
    addresses: Any = "recorded",
    reference: Trace | None = None,
    uncapped: bool = True,
    progress: Progress = no_progress,
) -> Sweep:
    """Simulate every setting in `confs` on `trace` (see `simulate_setting`).

    `addresses` / `reference`: where new segments are placed (see `sim.replay`); the default
    places them where the trace itself placed its segments.
    """

    def row(c: str) -> SweepRow:
        return simulate_setting(
            trace,
            c,
            budget=budget,
            torch=torch,
            total_memory=total_memory,
            find_min=find_min,
            rel_tol=rel_tol,
            abs_tol=abs_tol,
            addresses=addresses,
            reference=reference,
            uncapped=uncapped,
        )

    rows: list[SweepRow] = []
    for i, c, result in side_by_side(row, confs, sweep_threads(len(confs), addresses), trace):
        progress(f"simulating {c or '(default)'}", i, len(confs))
        rows.append(result())
    progress("simulated", len(confs), len(confs))
    from alloctune.trace.fallible import untagged_note

    return Sweep(
        source=trace.source,
        torch=torch,
        total_memory=total_memory or trace.total_memory,
        budget=budget,
        rows=tuple(rows),
        fallible=len(trace.requests.fallbacks),
        untagged_note=untagged_note(trace),
    )
