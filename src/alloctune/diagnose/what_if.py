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
        from alloctune.sim import replay
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
    out = []
    for cand in order:
        try:
            res = replay(trace, AllocatorConfig.parse(cand, version), budget=budget, torch=version,
                         record_events=False)
        except Exception as exc:  # a candidate the simulator cannot model is reported, not fatal
            out.append(WhatIf(cand, None, note=f"{type(exc).__name__}: {exc}"))
            continue
        failed_before = res.oom is not None and res.oom.request_index <= target
        avoids = (not failed_before) and target in res.unexpected_successes
        if cand == recorded:
            note = "recorded setting: the simulator " + ("reproduces the OOM" if not avoids else "does NOT reproduce it")
        elif failed_before:
            note = f"fails earlier, at request {res.oom.request_index}"
        else:
            note = ""
        out.append(WhatIf(cand, avoids, res.peak_reserved, note))
    return out
