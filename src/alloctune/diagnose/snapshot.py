"""Flight-recorder diagnosis: explain an OOM from a `_dump_snapshot` file, not from its message.

The OOM message only has totals. A snapshot taken at (or after) the OOM also has the segment
map and the event history, so it can say what the message cannot: the largest free block
against the request, which segments are pinned by a few small live blocks, how much memory
is reserved but free and where, and -- by replaying the history in the simulator under other
settings and the same budget -- which setting would have avoided the OOM.

Two ways to get the memory map at the OOM (`alloctune.memory_map`):

* the snapshot was written *at* the OOM (the agent's `--on-oom snapshot`: nothing but the
  `oom` entry follows in the history), so its `segments` are the state at the OOM -- exact;
* the program went on after the OOM (the shared capped traces), so the map is rebuilt by a
  pass over the history from the start (`replay_history`).

The plain data types live in `snapshot_model.py` (the map's own in `memory_map.model`), the what-if
replays in `what_if.py`.
Pure Python over plain data (no torch): the snapshot is loaded with the restricted unpickler
of `alloctune.trace`.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from alloctune.config.standard import STANDARD_CONFS
from alloctune.diagnose.snapshot_model import (  # noqa: F401  (re-exported: the snapshot API in one import)
    SCHEMA,
    Margin,
    PinnedSegment,
    SnapshotDiagnosis,
    WhatIf,
)
from alloctune.diagnose.what_if import WhatIfs, what_if_replays
from alloctune.errors import TraceError
from alloctune.memory_map.build import (  # noqa: F401  (re-exported: the snapshot API in one import)
    HistoryGap,
    Replay,
    SizeRules,
    Timeline,
    allocation_size,
    map_from_snapshot_segments,
    replay_history,
    verify_against_segments,
)
from alloctune.memory_map.model import BlockView, MemoryMap, SegmentView  # noqa: F401
from alloctune.sim.sizes import SMALL_SIZE
from alloctune.units import GiB, MiB, format_size


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


def _run_meta(snap: Mapping[str, Any], source: str) -> dict[str, Any]:
    """What is known of the run: the agent's record inside the snapshot under what lies beside its file (`sidecar_meta`)."""
    from alloctune.trace.stream import run_record, with_run_record

    return with_run_record(run_record(snap, source), sidecar_meta(source) if source != "<snapshot>" else {})


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


@dataclass(frozen=True)
class Budget:
    """The cap a diagnosis answers within, and where it came from."""

    bytes: int | None
    source: str
    assumed: bool = False  # not known to be the run's (no cap recorded): the replays must bear it out


def budget_of_run(
    given: int | None, meta: Mapping[str, Any], reserved: int, device_free: int | None, given_source: str = "given"
) -> Budget:
    """The budget the run had: given, else the cap recorded in the snapshot (the agent's run record)
    or beside it (sidecar), else -- for a run known to have had no cap -- what the device could give
    it (reserved + free at the OOM); with no record at all that is only an assumption."""
    if given is not None:
        return Budget(given, given_source)
    cap = _positive_int(meta.get("cap")) or _positive_int(meta.get("budget"))
    if cap is not None:
        return Budget(cap, "recorded cap")
    if device_free is None:
        return Budget(None, "unknown")
    if meta.get("cap") == 0:
        return Budget(reserved + device_free, "no cap recorded: reserved + device free at the OOM")
    return Budget(reserved + device_free, "assumed: no cap known, so reserved + device free at the OOM", True)


def _oom_index(events: Sequence[Mapping[str, Any]], oom: int, source: str) -> tuple[int, int]:
    """(history index of the chosen `oom` entry, number of OOMs recorded)."""
    oom_indices = [i for i, e in enumerate(events) if e.get("action") == "oom"]
    if not oom_indices:
        raise TraceError(
            f"{source}: the snapshot's history holds no `oom` entry; record history before the OOM "
            "(alloctune run --on-oom snapshot) or pass a snapshot written at an OOM"
        )
    try:
        return oom_indices[oom], len(oom_indices)
    except IndexError:
        raise TraceError(f"{source}: OOM #{oom} requested but the history holds {len(oom_indices)}") from None


def _failed_request(ev: Mapping[str, Any]) -> tuple[int, int, int | None]:
    """The OOM event's request size and stream, and the device's free bytes at the failure (None: not recorded)."""
    device_free = ev.get("device_free")
    return int(ev.get("size", 0)), int(ev.get("stream", 0)), int(device_free) if device_free is not None else None


def _state_at(
    snap: Mapping[str, Any], events: Sequence[Mapping[str, Any]], oom_i: int, device: int, source: str
) -> tuple[MemoryMap, str, bool]:
    """The memory map at the OOM, how it was obtained, and whether the history ends there."""
    after = [e for e in events[oom_i + 1 :] if e.get("action") not in ("oom", "snapshot", "user_defined")]
    if not after:
        return map_from_snapshot_segments(snap.get("segments") or [], device), "snapshot-at-oom", True
    try:
        rp = replay_history(events, snap.get("allocator_settings") or {}, capture=[oom_i])
    except HistoryGap as exc:
        raise TraceError(
            f"{source}: the snapshot was written after the OOM and its history does not reach back to an "
            f"empty allocator ({exc}); write the snapshot at the OOM (alloctune run --on-oom snapshot)"
        ) from None
    # Frees after the OOM are the program unwinding (the agent dumps again when the OOM ends it): no new
    # request was made, so the history still ends at the OOM.
    return rp.maps[oom_i], "replayed-history", not any(e.get("action") == "alloc" for e in after)


def _size_arg(n: int) -> str:
    """A size for a command line that parses back to exactly `n`."""
    for unit, name in ((GiB, "GiB"), (MiB, "MiB")):
        if n % unit == 0:
            return f"{n // unit}{name}"
    return f"{n}B"


def confirm_command(conf: str, budget: int, cmd: Sequence[str] | None) -> str:
    """`alloctune run` of the recorded command under `conf` and the same budget: the one real run that
    settles what a snapshot cannot (whether the rest of the program fits too)."""
    prog = ("python " + shlex.join(cmd)) if cmd else "YOUR_COMMAND"
    conf_arg = f"--conf {shlex.quote(conf)} " if conf else ""
    return f"alloctune run {conf_arg}--budget {_size_arg(budget)} --on-oom snapshot -- {prog}"


# Headroom, as a share of the budget, under which a setting that serves the failed request is said to do so
# only just: the rest of the program (at least the rest of the step that failed) is still to come.
THIN_MARGIN = 0.02


@dataclass(frozen=True)
class _Judgement:
    verdict: str
    summary: str
    recommendation: str | None = None
    needs: int | None = None
    needs_setting: str | None = None
    undecided: str = ""
    confirm: str | None = None
    margin: Margin | None = None


def _judge_by_numbers(allocated: int, request: int, reserved_free: int, largest: int, budget: Budget) -> _Judgement:
    """What the memory map alone decides (no replays): the bytes either were cached, or cannot fit."""
    fs = format_size
    if budget.bytes is not None and allocated + request > budget.bytes:
        return _Judgement(
            "shortage",
            (
                f"Shortage: the live tensors ({fs(allocated)}) and the {fs(request)} request need "
                f"{fs(allocated + request)}, more than the {fs(budget.bytes)} budget; no allocator setting can serve it."
            ),
            needs=allocated + request,
        )
    if largest < request <= reserved_free:
        return _Judgement(
            "fragmentation",
            (
                f"Fragmentation: {fs(reserved_free)} was reserved but free, enough for the {fs(request)} request, yet "
                f"no free block was larger than {fs(largest)}."
            ),
        )
    why = (
        "the budget is unknown (pass --budget)"
        if budget.bytes is None
        else f"the live tensors and the request fit in the {fs(budget.bytes)} budget, but the cached free memory "
        f"({fs(reserved_free)}) does not cover the request: whether a setting serves it takes the replays"
    )
    return _Judgement("unknown", f"Undecided from the memory map alone: {why}.", undecided=why)


def _judge_by_replays(
    w: WhatIfs, allocated: int, request: int, budget: Budget, ends_at_oom: bool, cmd: Sequence[str] | None, meta_hint: str
) -> _Judgement:
    """The verdict within the budget, from the exact replays of the history through the failed request."""
    fs = format_size
    assert budget.bytes is not None
    cap = fs(budget.bytes)
    if not w.reproduced:
        what = (
            "pass the cap the run had (--budget SIZE), or give its OOM text too (alloctune diagnose LOG "
            "--snapshot FILE), or record it with alloctune run --budget ... --on-oom snapshot"
        )
        why = f"{w.note or 'the replays could not be made'}; {meta_hint}{what}"
        if allocated + request > budget.bytes:
            return _Judgement(
                "shortage",
                (
                    f"Shortage: the live tensors ({fs(allocated)}) and the {fs(request)} request exceed the {cap} "
                    f"budget; the simulator does not reproduce this OOM, so no setting is judged."
                ),
                undecided=why,
            )
        return _Judgement(
            "unknown",
            (
                f"Undecided: under the recorded setting and the {cap} budget the simulator does not reproduce this "
                "OOM, so the budget (or the history) is not what the run had and no what-if is an answer."
            ),
            undecided=why,
        )
    later = (
        "; the snapshot ends at the OOM, so whether the rest of the run fits is not known -- one run settles it"
        if ends_at_oom
        else ""
    )
    serving = [x for x in w.rows[1:] if x.avoids_oom]
    if serving:
        # the setting that leaves the most room (a row without a peak counts as none left)
        first = max(serving, key=lambda x: budget.bytes - (x.peak_reserved if x.peak_reserved is not None else budget.bytes))
        best = first.config
        margin = None
        spare = ""
        if first.peak_reserved is not None:
            left = budget.bytes - first.peak_reserved
            margin = Margin(left, left / budget.bytes, left < THIN_MARGIN * budget.bytes)
            spare = (
                f", with {fs(left)} ({margin.fraction:.1%}) of it to spare so far"
                if left > 0
                else f", but with no room left ({fs(-left)} over it at the peak so far)"
            )
        if margin is not None and (margin.bytes <= 0 or (ends_at_oom and margin.thin)):
            return _Judgement(
                "borderline",
                (
                    f"Borderline within the {cap} budget: replayed exactly, {best or '(default)'} gets the program "
                    f"through the failed {fs(request)} request{spare}; the snapshot ends at the OOM and that margin "
                    "is thin, so the rest of the run very likely needs more than the budget: no setting is recommended "
                    "-- one run settles it."
                ),
                confirm=confirm_command(best, budget.bytes, cmd),
                margin=margin,
            )
        return _Judgement(
            "fragmentation",
            (
                f"Fragmentation within the {cap} budget: replayed exactly, {best or '(default)'} serves the program "
                f"through the failed {fs(request)} request under the same budget{spare}, where the recorded setting "
                f"fails{later}."
            ),
            recommendation=best,
            confirm=confirm_command(best, budget.bytes, cmd),
            margin=margin,
        )
    needs = [(x.min_budget, x.config) for x in w.rows if x.min_budget is not None]
    if needs:
        need, conf = min(needs)
        short = budget.bytes - need
        return _Judgement(
            "shortage",
            (
                f"Shortage within the {cap} budget: no setting gets the program through the failed {fs(request)} "
                f"request under it; replayed exactly, the run so far needs about {fs(need)} "
                f"({fs(max(need - budget.bytes, 0))} more), least under {conf or '(default)'}"
                f"{'; the rest of the run may need more' if ends_at_oom else ''}."
            ),
            needs=need,
            needs_setting=conf,
            margin=Margin(short, short / budget.bytes, True),
        )
    return _Judgement(
        "shortage",
        (
            f"Shortage within the {cap} budget: no setting gets the program through the failed {fs(request)} request, "
            "not even on the whole device."
        ),
    )


def diagnose_snapshot(
    path_or_snapshot: str | Path | Mapping[str, Any],
    *,
    device: int = 0,
    oom: int = -1,
    budget: int | None = None,
    budget_source: str = "given",
    candidates: Sequence[str] | None = STANDARD_CONFS,
    top: int = 8,
    source: str | None = None,
) -> SnapshotDiagnosis:
    """Explain the OOM recorded in a snapshot within the budget the run had; `oom` picks which
    one (default: the last).

    `budget`: the per-process cap (`budget_source` says where the caller got it); without it the
    cap the agent recorded in the snapshot (or a sidecar `NAME.json`) is used, else what the
    device could have given (an assumption the replays must bear out). `candidates=None` skips
    the what-if replays. `source` names an already-loaded snapshot dict.
    """
    source, snap = _load(path_or_snapshot, source)
    traces = snap.get("device_traces") or []
    events: Sequence[Mapping[str, Any]] = traces[device] if device < len(traces) else []
    settings = snap.get("allocator_settings") or {}
    oom_i, oom_count = _oom_index(events, oom, source)
    request, stream, device_free = _failed_request(events[oom_i])
    mm, state_source, ends_at_oom = _state_at(snap, events, oom_i, device, source)

    pool = "small" if request <= SMALL_SIZE else "large"
    free_sizes = mm.free_blocks(pool, stream)
    largest = free_sizes[0] if free_sizes else 0
    reserved, allocated = mm.reserved, mm.allocated
    reserved_free = reserved - allocated
    pinned = _pinned_segments(mm, pool, stream)
    pinned_free = sum(p.free for p in pinned)

    meta = _run_meta(snap, source)
    torch_version = meta.get("torch") or meta.get("torch_version")
    b = budget_of_run(budget, meta, reserved, device_free, budget_source)
    needed = allocation_size(request, SizeRules.from_settings(settings))
    evidence = _map_evidence(request, needed, pool, reserved, allocated, largest, len(free_sizes), pinned, b)

    what_if: tuple[WhatIf, ...] = ()
    w: WhatIfs | None = None
    if candidates and b.bytes is not None:
        w = what_if_replays(snap, source, device, oom_i, b.bytes, candidates, torch_version)
    reproduced = w.reproduced if w is not None else None
    if w is not None and w.reproduced is not None:
        hint = _unrecorded_cap_hint(events, oom_i, reserved, needed) if b.assumed else ""
        judged = _judge_by_replays(w, allocated, request, b, ends_at_oom, meta.get("cmd"), hint)
        # Not reproduced: the other rows answer a question the run never asked; only the recorded one stays.
        what_if = w.rows if w.reproduced else w.rows[:1]
        evidence.append(
            "the recorded setting, replayed under this budget, "
            + ("reproduces the OOM at the same request" if w.reproduced else f"does not: {w.note}")
        )
    else:
        if w is not None:  # no replay could be made: the numbers alone decide
            evidence.append(f"no what-if replays: {w.note}")
            what_if = w.rows
        judged = _judge_by_numbers(allocated, request, reserved_free, largest, b)
    if judged.confirm:
        evidence.append(f"confirm on the GPU: {judged.confirm}")
    if judged.verdict == "shortage":
        evidence.extend(f"next: {step}" for step in _shortage_steps(source, b.bytes, meta.get("cmd")))
    return SnapshotDiagnosis(
        source=source,
        verdict=judged.verdict,
        summary=judged.summary,
        state_source=state_source,
        oom_event_index=oom_i,
        oom_count=oom_count,
        request=request,
        alloc_size=needed,
        pool=pool,
        reserved=reserved,
        allocated=allocated,
        reserved_free=reserved_free,
        largest_free=largest,
        free_blocks=len(free_sizes),
        device_free=device_free,
        budget=b.bytes,
        budget_source=b.source,
        pinned=tuple(pinned[:top]),
        pinned_count=len(pinned),
        pinned_free=pinned_free,
        what_if=what_if,
        recommendation=judged.recommendation,
        evidence=tuple(evidence),
        memory_map=mm,
        reproduced=reproduced,
        undecided=judged.undecided,
        needs=judged.needs,
        needs_setting=judged.needs_setting,
        ends_at_oom=ends_at_oom,
        confirm=judged.confirm,
        margin=judged.margin,
    )


def _cap_bracket(events: Sequence[Mapping[str, Any]], oom_i: int, reserved: int, needed: int) -> tuple[int, int]:
    """Where a cap nobody recorded must lie: at least the most the run reserved before the OOM (it got
    that), below what it held plus the segment it was refused. A hint for --budget, not a budget."""
    from alloctune.trace.model import reserved_change

    level = peak = 0
    for e in events[:oom_i]:
        level += reserved_change(str(e.get("action")), int(e.get("size", 0)))
        peak = max(peak, level)
    return max(peak, reserved), reserved + needed


def _unrecorded_cap_hint(events: Sequence[Mapping[str, Any]], oom_i: int, reserved: int, needed: int) -> str:
    """Where the cap of a run that recorded none must have lain (`_cap_bracket`), as the start of a hint."""
    low, high = _cap_bracket(events, oom_i, reserved, needed)
    return (
        f"no cap is recorded with this snapshot, and the run's cap, if it had one, lay between "
        f"{format_size(low)} (the most it held before) and {format_size(high)} (reserved + the new "
        "segment it could not get); "
    )


def _shortage_steps(source: str, budget: int | None, cmd: Sequence[str] | None) -> list[str]:
    """`shortage_next_steps` for a snapshot: its path quoted for a shell, the run's own command if recorded."""
    return shortage_next_steps(
        shlex.quote(source) if source != "<snapshot>" else "SNAPSHOT",
        budget,
        ("python " + shlex.join(cmd)) if cmd else "CMD",
    )


def shortage_next_steps(
    recording: str, budget: int | None, command: str, before: Sequence[str] = (), training: bool = False
) -> list[str]:
    """What can help when no setting can (#29.4), for `diagnose` and `tune` alike: see what holds the
    memory and what freeing it would buy (`before`: the caller's own steps), then -- last, the command
    to run next -- find the largest input that fits the budget, or, for a service whose inputs come as
    they come, split each one where it runs out (`guard.chunked`). A training run (`training`: it ran
    backward) is not a service: its input is the micro-batch, accumulated to the batch it needs."""
    cap = f" --budget {budget // MiB}MiB" if budget else ""  # rounded down: the plan stays within the budget
    head = [f"where the memory goes and what would free it: alloctune explain {recording}", *before]
    if training:
        return head + [
            "smaller micro-batches with gradients accumulated over ceil(batch / micro-batch) steps: the largest "
            "batch that fits without accumulation is the micro-batch to try -- record the program at three batch "
            f"sizes, no accumulation: alloctune record --size 8,16,32 --out sizes/run.pickle -- {command} (with "
            f"{{size}} where the batch size goes), then alloctune plan sizes/{cap}; on the GPU add --confirm "
            "'<the accumulating program, {size} as its micro-batch>' to run that answer (accumulated gradients and "
            "each micro-batch's own padding can cost a sample or two)"
        ]
    return head + [
        f"the largest input that fits: alloctune record --size S1,S2,S3 --out sizes/run.pickle -- {command} "
        f"(with {{size}} where the input size goes), then alloctune plan sizes/{cap}",
        "or, for a service (inputs of any length): run the model through alloctune.guard.chunked, e.g. "
        "@alloctune.guard.chunked(dim=-1, overlap=N) on the function that calls it: each input is split only "
        "where it runs out of memory",
    ]


def _map_evidence(
    request: int,
    needed: int,
    pool: str,
    reserved: int,
    allocated: int,
    largest: int,
    nfree: int,
    pinned: Sequence[PinnedSegment],
    b: Budget,
) -> list[str]:
    """The figures of the memory map at the OOM, as sentences."""
    fs = format_size
    out = [
        f"request: {fs(request)} (rounded) from the {pool} pool; a new segment for it would be "
        f"{fs(needed)} (the size the OOM message prints)",
        f"at the OOM: {fs(reserved)} reserved, {fs(allocated)} allocated, {fs(reserved - allocated)} reserved but free",
        f"largest free {pool}-pool block: {fs(largest)} ({nfree} free blocks) vs the {fs(request)} request",
    ]
    if pinned:
        out.append(
            f"{len(pinned)} segment(s) hold more free than live memory: {fs(sum(p.free for p in pinned))} "
            f"free, pinned by {sum(p.live_blocks for p in pinned)} live block(s) of "
            f"{fs(sum(p.allocated for p in pinned))} in total"
        )
    if b.bytes is not None:
        headroom = max(b.bytes - reserved, 0)
        out.append(
            f"budget {fs(b.bytes)} ({b.source}): headroom {fs(headroom)} "
            f"{'<' if headroom < needed else '>='} the {fs(needed)} new segment"
        )
        fit = "<=" if allocated + request <= b.bytes else ">"
        out.append(f"allocated {fs(allocated)} + request {fs(request)} = {fs(allocated + request)} {fit} budget {fs(b.bytes)}")
    return out
