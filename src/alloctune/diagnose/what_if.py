"""What-if replays: the recorded requests under other settings and the same budget.

The simulator's job, asked for one question -- does the request that failed fit, with nothing
failing before it? -- so a snapshot diagnosis can name a setting that would have avoided the OOM.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from alloctune.diagnose.snapshot_model import WhatIf
from alloctune.errors import TraceError


def what_if_replays(
    snap: Mapping[str, Any],
    source: str,
    device: int,
    oom_index: int,
    budget: int,
    candidates: Sequence[str],
    torch: str | None = None,
) -> list[WhatIf]:
    """Replay the recorded requests under each candidate and the same budget (the simulator's job).

    The setting the run was recorded with goes first: the simulator must reproduce the OOM
    under it, or the other answers are not worth much (its note says so). A candidate avoids
    the OOM when the request that failed fits and nothing failed before it.
    """
    try:
        from alloctune.config import AllocatorConfig
        from alloctune.sim.settings import SimSettings
        from alloctune.sim.sweep import sweep
        from alloctune.trace import trace_from_snapshot
    except ImportError as exc:
        return [WhatIf(c, None, note=f"simulator unavailable: {exc}") for c in candidates]
    try:
        trace = trace_from_snapshot(dict(snap), device, source=source)
    except TraceError as exc:
        return [WhatIf(c, None, note=f"history not replayable: {exc}") for c in candidates]
    reqs = trace.requests
    target = next((i for i, e in enumerate(reqs.event_index) if e >= oom_index), None)
    if target is None:
        return [WhatIf(c, None, note="the failed request is not in the request stream") for c in candidates]
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
    # The one sweep service, asked only for one replay at the budget (no uncapped replay, no bisection).
    rows = dict(zip(modelled, sweep(trace, modelled, budget=budget, torch=version, find_min=False,
                                    uncapped=False).rows))
    return [WhatIf(c, None, note=refused[c]) if c in refused else _judge(c, rows[c], target, c == recorded)
            for c in order]


def _judge(conf: str, row, target: int, is_recorded: bool) -> WhatIf:
    """A sweep row read as a what-if: does request `target` fit, with nothing failing before it?"""
    oom = row.oom_at_budget
    failed_before = oom is not None and oom["request_index"] <= target
    avoids = (not failed_before) and target in row.surprises_at_budget
    if is_recorded:
        note = "recorded setting: the simulator " + ("reproduces the OOM" if not avoids else "does NOT reproduce it")
    elif failed_before:
        note = f"fails earlier, at request {oom['request_index']}"
    else:
        note = ""
    return WhatIf(conf, avoids, row.peak_reserved_at_budget, note)
