"""What-if replays: the recorded requests, up to the one that failed, under other settings and the same budget.

The simulator's job, asked two questions of the run *as far as the snapshot shows it* (its history
ends at, or changes course after, the failed request):

* does the failed request fit, with nothing failing before it, under the budget? (one replay)
* what is the smallest budget that gets the run that far? (a bisection: "how much more it needs")

Both are answered by the one sweep service (`sim.sweep`) on a trace cut after the failed request,
whose failure is turned into an ordinary request. The recorded setting goes first: unless the
simulator reproduces the OOM under it (fails at that very request, under that budget), the budget
or the history is not what the run had, and no other answer is worth showing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from alloctune.diagnose.snapshot_model import WhatIf
from alloctune.errors import TraceError


@dataclass(frozen=True)
class WhatIfs:
    """The replays of one snapshot OOM: per setting, plus whether the recorded one reproduced it."""

    rows: tuple[WhatIf, ...]  # the recorded setting first
    reproduced: bool | None  # None: nothing could be simulated (the note says why)
    note: str = ""  # why nothing was simulated, or how the recorded setting differed from the GPU


def what_if_replays(
    snap: Mapping[str, Any],
    source: str,
    device: int,
    oom_index: int,
    budget: int,
    candidates: Sequence[str],
    torch: str | None = None,
) -> WhatIfs:
    """Replay the history through the failed request under each candidate and `budget`."""
    try:
        from alloctune.config import AllocatorConfig
        from alloctune.sim.settings import SimSettings
        from alloctune.sim.sweep import sweep
        from alloctune.trace import trace_from_snapshot
    except ImportError as exc:  # pragma: no cover - a broken install
        return WhatIfs((), None, f"simulator unavailable: {exc}")
    try:
        trace = trace_from_snapshot(dict(snap), device, source=source)
    except TraceError as exc:
        return WhatIfs((), None, f"history not replayable: {exc}")
    prefix = through_failed_request(trace, oom_index)
    if prefix is None:
        return WhatIfs((), None, "the failed request is not in the request stream")
    target = len(prefix.requests) - 1
    settings = snap.get("allocator_settings") or {}
    recorded = str(settings.get("PYTORCH_CUDA_ALLOC_CONF") or "")
    order = [recorded] + [c for c in candidates if c != recorded]
    version = torch or "2.11"
    refused: dict[str, str] = {}
    for cand in order:  # a candidate the simulator cannot model is reported, not fatal
        try:
            SimSettings.from_config(AllocatorConfig.parse(cand, version), version)
        except Exception as exc:
            refused[cand] = f"{type(exc).__name__}: {exc}"
    modelled = [c for c in order if c not in refused]
    # One replay per setting at the budget (no uncapped replay, no bisection) ...
    rows = dict(zip(modelled, sweep(prefix, modelled, budget=budget, torch=version, find_min=False, uncapped=False).rows))
    out = [WhatIf(c, None, note=refused[c]) if c in refused else _judge(c, rows[c], target) for c in order]
    if recorded in refused:
        return WhatIfs(tuple(out), None, f"the recorded setting cannot be simulated: {refused[recorded]}")
    rec = rows[recorded]
    failed_at = rec.oom_at_budget["request_index"] if rec.oom_at_budget else None
    if failed_at == target:
        out[0] = replace(out[0], note="recorded setting: the simulator reproduces the OOM at the same request")
        if not any(w.avoids_oom for w in out):
            # ... and only when none serves, the bisections that say how much the run needs to get this far.
            need = dict(zip(modelled, sweep(prefix, modelled, torch=version, find_min=True).rows))
            out = [replace(w, min_budget=need[w.config].min_budget) if w.config in need else w for w in out]
        return WhatIfs(tuple(out), True)
    if failed_at is None:
        why = "it serves the failed request under this budget"
    else:
        why = f"it fails earlier, at request {failed_at} of {target + 1}"
    out[0] = replace(out[0], note=f"recorded setting: the simulator does NOT reproduce the OOM ({why})")
    return WhatIfs(tuple(out), False, f"replayed under the recorded setting and this budget, {why}")


def through_failed_request(trace: Any, oom_index: int) -> Any:
    """`trace` cut after the request that failed at history event `oom_index`, that request made an
    ordinary allocation (so a replay asks "does it fit?" and a bisection "what budget lets it?").

    None when no failed request is recorded at or after that event (the history lost it).
    """
    from alloctune.trace.model import ALLOC, FAILED_ALLOC, RequestStream, Trace

    req = trace.requests
    target = next((i for i, e in enumerate(req.event_index) if e >= oom_index), None)
    if target is None or req.ops[target] != FAILED_ALLOC:
        return None
    end = target + 1
    cut = RequestStream(
        req.ops[:end],
        req.sizes[:end],
        req.rids[:end],
        req.streams[:end],
        req.event_index[:end],
        {i: f for i, f in req.fallbacks.items() if i < end},
    )
    cut.ops[target] = ALLOC
    cut.rids[target] = max((r for r in cut.rids if r >= 0), default=0) + 1  # a fresh id, never freed
    events = [e for e in trace.segment_events if e.request_index <= target and e.action != "oom"]
    return Trace(
        trace.source,
        trace.device,
        cut,
        events,
        dict(trace.allocator_settings),
        events=[],
        meta=dict(trace.meta),
        total_memory=trace.total_memory,
    )


def _judge(conf: str, row: Any, target: int) -> WhatIf:
    """A sweep row read as a what-if: the failed request served with nothing failing before it."""
    serves = row.at_budget is True
    oom = row.oom_at_budget
    if serves:
        note = ""
    elif oom is not None and oom["request_index"] < target:
        note = f"fails earlier, at request {oom['request_index']}"
    else:
        note = "fails at the same request"
    return WhatIf(conf, serves, row.peak_reserved_at_budget, note)
