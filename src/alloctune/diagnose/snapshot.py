"""Flight-recorder diagnosis: explain an OOM from a `_dump_snapshot` file, not from its message.

The OOM message only has totals. A snapshot taken at (or after) the OOM also has the segment
map and the event history, so it can say what the message cannot: the largest free block
against the request, which segments are pinned by a few small live blocks, how much memory
is reserved but free and where, and -- by replaying the history in the simulator under other
settings and the same budget -- which setting would have avoided the OOM.

Two ways to get the memory map at the OOM (`memory_map.py`):

* the snapshot was written *at* the OOM (the agent's `--on-oom snapshot`: nothing but the
  `oom` entry follows in the history), so its `segments` are the state at the OOM -- exact;
* the program went on after the OOM (the shared capped traces), so the map is rebuilt by a
  pass over the history from the start (`replay_history`).

The plain data types live in `snapshot_model.py`, the what-if replays in `what_if.py`.
Pure Python over plain data (no torch): the snapshot is loaded with the restricted unpickler
of `alloctune.trace`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from alloctune.config.standard import STANDARD_CONFS
from alloctune.diagnose.memory_map import (  # noqa: F401  (re-exported: the snapshot API in one import)
    HistoryGap,
    Replay,
    SizeRules,
    Timeline,
    allocation_size,
    map_from_snapshot_segments,
    replay_history,
    verify_against_segments,
)
from alloctune.diagnose.snapshot_model import (  # noqa: F401
    SCHEMA,
    BlockView,
    MemoryMap,
    PinnedSegment,
    SegmentView,
    SnapshotDiagnosis,
    WhatIf,
)
from alloctune.diagnose.what_if import what_if_replays
from alloctune.errors import TraceError
from alloctune.sim.sizes import SMALL_SIZE
from alloctune.units import format_size


def _load(path_or_snapshot: str | Path | Mapping[str, Any], source: str | None) -> tuple[str, Mapping[str, Any]]:
    if isinstance(path_or_snapshot, Mapping):
        return source or "<snapshot>", path_or_snapshot
    from alloctune.trace import load_snapshot  # restricted unpickler; never plain pickle here

    return str(path_or_snapshot), load_snapshot(path_or_snapshot)


def sidecar_meta(path: str | Path) -> dict[str, Any]:
    """What was recorded beside a snapshot: the shared traces' `NAME.json`, or for the agent's
    `oom-snapshot.<pid>.pickle` its `report.<pid>.json` (cap, torch version)."""
    from alloctune.trace.load import read_sidecar

    p = Path(path)
    try:
        meta = read_sidecar(p)
    except TraceError:
        meta = {}
    if not meta and p.name.startswith("oom-snapshot."):
        pid = p.name.split(".")[1]
        try:
            meta = json.loads((p.with_name(f"report.{pid}.json")).read_text())
        except (OSError, ValueError):
            meta = {}
    return meta if isinstance(meta, dict) else {}


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _pinned_segments(mm: MemoryMap, pool: str, stream: int) -> list[PinnedSegment]:
    """Segments of the request's pool holding more free than live bytes, most free first."""
    out = []
    for s in mm.segments:
        if s.pool != pool or s.stream != stream or s.live_blocks == 0 or s.free <= s.allocated:
            continue
        out.append(PinnedSegment(s.addr, s.size, s.allocated, s.free, s.largest_free, s.live_blocks))
    out.sort(key=lambda p: (-p.free, p.addr))
    return out


def diagnose_snapshot(
    path_or_snapshot: str | Path | Mapping[str, Any],
    *,
    device: int = 0,
    oom: int = -1,
    budget: int | None = None,
    candidates: Sequence[str] | None = STANDARD_CONFS,
    top: int = 8,
    source: str | None = None,
) -> SnapshotDiagnosis:
    """Explain the OOM recorded in a snapshot; `oom` picks which one (default: the last).

    `budget` is the per-process cap the run had; without it the sidecar `NAME.json`'s `cap`
    is used, else reserved-at-OOM + the device's free memory at the OOM (what the process
    could have had). `candidates=None` skips the what-if replays. `source` names an
    already-loaded snapshot dict (its file path: used for messages and the sidecar).
    """
    source, snap = _load(path_or_snapshot, source)
    traces = snap.get("device_traces") or []
    events: Sequence[Mapping[str, Any]] = traces[device] if device < len(traces) else []
    settings = snap.get("allocator_settings") or {}
    oom_indices = [i for i, e in enumerate(events) if e.get("action") == "oom"]
    if not oom_indices:
        raise TraceError(
            f"{source}: the snapshot's history holds no `oom` entry; record history before the OOM "
            "(alloctune run --on-oom snapshot) or pass a snapshot written at an OOM"
        )
    try:
        oom_i = oom_indices[oom]
    except IndexError:
        raise TraceError(f"{source}: OOM #{oom} requested but the history holds {len(oom_indices)}") from None
    ev = events[oom_i]
    request = int(ev.get("size", 0))
    stream = int(ev.get("stream", 0))
    device_free = ev.get("device_free")
    device_free = int(device_free) if device_free is not None else None

    after = [e for e in events[oom_i + 1 :] if e.get("action") not in ("oom", "snapshot", "user_defined")]
    if not after:
        mm = map_from_snapshot_segments(snap.get("segments") or [], device)
        state_source = "snapshot-at-oom"
    else:
        try:
            rp = replay_history(events, settings, capture=[oom_i])
        except HistoryGap as exc:
            raise TraceError(
                f"{source}: the snapshot was written after the OOM and its history does not reach back to an "
                f"empty allocator ({exc}); write the snapshot at the OOM (alloctune run --on-oom snapshot)"
            ) from None
        mm = rp.maps[oom_i]
        state_source = "replayed-history"

    pool = "small" if request <= SMALL_SIZE else "large"
    free_sizes = mm.free_blocks(pool, stream)
    largest = free_sizes[0] if free_sizes else 0
    reserved, allocated = mm.reserved, mm.allocated
    reserved_free = reserved - allocated
    pinned = _pinned_segments(mm, pool, stream)
    pinned_free = sum(p.free for p in pinned)

    budget_source = "given"
    meta = sidecar_meta(source) if source != "<snapshot>" else {}
    torch_version = meta.get("torch") or meta.get("torch_version")
    if budget is None:
        budget = _positive_int(meta.get("cap")) or _positive_int(meta.get("budget"))
        budget_source = "recorded cap"
    if budget is None and device_free is not None:
        budget = reserved + device_free
        budget_source = "reserved + device free at the OOM"
    if budget is None:
        budget_source = "unknown"

    needed = allocation_size(request, SizeRules.from_settings(settings))
    evidence = [
        f"request: {format_size(request)} (rounded) from the {pool} pool; a new segment for it would be "
        f"{format_size(needed)} (the size the OOM message prints)",
        f"at the OOM: {format_size(reserved)} reserved, {format_size(allocated)} allocated, "
        f"{format_size(reserved_free)} reserved but free",
        f"largest free {pool}-pool block: {format_size(largest)} ({len(free_sizes)} free blocks) "
        f"vs the {format_size(request)} request",
    ]
    if pinned:
        live = sum(p.live_blocks for p in pinned)
        evidence.append(
            f"{len(pinned)} segment(s) hold more free than live memory: {format_size(pinned_free)} free, "
            f"pinned by {live} live block(s) of {format_size(sum(p.allocated for p in pinned))} in total"
        )
    if budget is not None:
        headroom = max(budget - reserved, 0)
        evidence.append(
            f"budget {format_size(budget)} ({budget_source}): headroom {format_size(headroom)} "
            f"{'<' if headroom < needed else '>='} the {format_size(needed)} new segment"
        )

    # Fragmentation whenever no free block served the request although the bytes were there:
    # cached-but-free alone covered it, or live tensors + request fit in the budget (the cached
    # pieces and the headroom together would have, had they been one range). Capacity only when
    # the live tensors and the request exceed the budget themselves.
    fits = budget is not None and allocated + request <= budget
    if largest < request and reserved_free >= request:
        verdict = "fragmentation"
        summary = (
            f"Fragmentation: {format_size(reserved_free)} was reserved but free, enough for the "
            f"{format_size(request)} request, yet no free block was larger than {format_size(largest)}."
        )
    elif largest < request and fits:
        verdict = "fragmentation"
        summary = (
            f"Fragmentation: the live tensors ({format_size(allocated)}) and the {format_size(request)} request "
            f"fit in the {format_size(budget)} budget, but its free part was split: {format_size(reserved_free)} "
            f"cached in blocks of at most {format_size(largest)}, and {format_size(max(budget - reserved, 0))} "
            f"of headroom, less than the {format_size(needed)} new segment."
        )
        evidence.append(f"allocated {format_size(allocated)} + request {format_size(request)} = "
                        f"{format_size(allocated + request)} <= budget {format_size(budget)}")
    else:
        verdict = "capacity"
        if budget is not None:
            summary = (
                f"Capacity: the live tensors ({format_size(allocated)}) and the {format_size(request)} request "
                f"need {format_size(allocated + request)}, more than the {format_size(budget)} budget."
            )
        else:
            summary = (
                f"Capacity: only {format_size(reserved_free)} was reserved but free for a "
                f"{format_size(request)} request, and the budget is unknown."
            )

    what_if: tuple[WhatIf, ...] = ()
    recommendation = None
    if candidates and budget is not None:
        what_if = tuple(what_if_replays(snap, source, device, oom_i, budget, candidates, torch_version))
        current = str(settings.get("PYTORCH_CUDA_ALLOC_CONF") or "")
        reproduced = bool(what_if) and what_if[0].config == current and what_if[0].avoids_oom is False
        if what_if and what_if[0].avoids_oom is None:
            evidence.append(f"no what-if replays: {what_if[0].note}")
        elif not reproduced:
            evidence.append("the simulator does not reproduce this OOM under the recorded setting, "
                            "so no setting is recommended from the replays")
        for w in what_if:
            if reproduced and w.avoids_oom and w.config != current:
                recommendation = w.config
                evidence.append(f"replayed under the same budget, {w.config} serves the failed request "
                                "(the recorded run ended there, so later requests are not covered)")
                break
    return SnapshotDiagnosis(
        source=source,
        verdict=verdict,
        summary=summary,
        state_source=state_source,
        oom_event_index=oom_i,
        oom_count=len(oom_indices),
        request=request,
        alloc_size=needed,
        pool=pool,
        reserved=reserved,
        allocated=allocated,
        reserved_free=reserved_free,
        largest_free=largest,
        free_blocks=len(free_sizes),
        device_free=device_free,
        budget=budget,
        budget_source=budget_source,
        pinned=tuple(pinned[:top]),
        pinned_count=len(pinned),
        pinned_free=pinned_free,
        what_if=what_if,
        recommendation=recommendation,
        evidence=tuple(evidence),
        memory_map=mm,
    )


