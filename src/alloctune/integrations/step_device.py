"""The batch-size finder's GPU side: one training step, run under a cap or recorded.

`StepDevice` is all `find_batch_size` asks of a GPU (a test passes a fake whose recordings are
synthetic traces); `CudaSteps` is it on torch.cuda. A recorded step is a `Recording`: the
step's allocator history with the memory held before it replayed as allocations at its start
(`step_recording`). torch is imported only when a `CudaSteps` method runs, so this module
imports without it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from alloctune.errors import EnvironmentProblem
from alloctune.integrations.recorder import OOMRecorder
from alloctune.trace.model import Trace
from alloctune.units import MiB

__all__ = ["CudaSteps", "Recording", "StepDevice", "StepFn", "step_recording"]

RECORD_ENTRIES = 2_000_000  # allocator events kept per recorded step: one step of a large model fits
# Segments of exactly the padding's size: a large request of a 2 MiB multiple from 10 MiB gets a
# segment of its own size; below that, pairs of 1 MiB requests fill 2 MiB small-pool segments.
_PAD_GRAIN = 2 * MiB
_PAD_LARGE = 10 * MiB
_PAD_ADDRESS = 1 << 20  # the padding's block addresses: far below any real device address
_SMALL_REQUEST = MiB  # the largest request the small pool serves

StepFn = Callable[[int], object]


@dataclass(frozen=True)
class Recording:
    """One recorded step, as the planner reads it.

    Attributes:
        trace: the step's request stream (what the simulator replays), the memory held before
            the step included as allocations at its start.
        resident: bytes the caching allocator had reserved when the step began (0: none).
        padding: bytes the simulation holds beside those allocations so that it starts from the
            same reserved bytes as the GPU (reserved less what the simulator packs them into;
            negative when the simulator needs more than the GPU did, which no padding can undo).
    """

    trace: Trace
    resident: int = 0
    padding: int = 0


class StepDevice(Protocol):
    """What the finder needs of a GPU (real: `CudaSteps`; tests: a fake). Errors of the step propagate."""

    def run(self, step_fn: StepFn, batch_size: int, budget: int | None = None) -> None:
        """Run `step_fn(batch_size)` once; under a per-process cap of `budget` bytes when given."""
        ...

    def record(self, step_fn: StepFn, batch_size: int) -> Recording:
        """Run `step_fn(batch_size)` once, uncapped, while the allocator's history is recorded."""
        ...

    def available(self) -> int:
        """Bytes this process's caching allocator can hold now: free device memory plus its own reserve."""
        ...

    def release(self) -> None:
        """Return cached memory to the device (after a step, and after a failed one)."""
        ...


class CudaSteps:
    """`StepDevice` on torch.cuda: the trainer hooks' `OOMRecorder` records, a per-process memory fraction caps.

    `max_entries`: allocator events kept per recorded step (a longer step loses its beginning,
    and the recording is refused with a message that says so).
    """

    def __init__(self, max_entries: int = RECORD_ENTRIES) -> None:
        self.recorder = OOMRecorder(".", max_entries=max_entries, stacks="python")

    def run(self, step_fn: StepFn, batch_size: int, budget: int | None = None) -> None:
        import torch

        if budget is None:
            step_fn(batch_size)
            torch.cuda.synchronize()
            return
        limits = self.recorder.backend.limits()
        before = limits.fraction if limits.fraction is not None else 1.0  # unknown: taken as no cap
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / limits.total_memory), limits.device)
        try:
            step_fn(batch_size)
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_per_process_memory_fraction(before, limits.device)

    def record(self, step_fn: StepFn, batch_size: int) -> Recording:
        import torch

        self.release()
        if not self.recorder.start():
            why = (
                "alloctune's agent records this process (ALLOCTUNE_AGENT is set): run it without alloctune run/record/tune"
                if self.recorder.backend.available()
                else "no CUDA device here"
            )
            raise EnvironmentProblem(f"find_batch_size records the allocator's history on the GPU: {why}")
        try:
            before = self.recorder.backend.snapshot()
            step_fn(batch_size)
            torch.cuda.synchronize()
            after = self.recorder.snapshot_with_record()
        finally:
            self.recorder.stop()
        name = getattr(step_fn, "__qualname__", None) or "step_fn"
        return step_recording(before, after, source=f"{name}@{batch_size}", workload=name)

    def available(self) -> int:
        import torch

        self.release()
        free, _total = torch.cuda.mem_get_info()
        have = int(free) + int(torch.cuda.memory_reserved())
        cap = self.recorder.backend.limits().cap
        return min(have, cap) if cap else have

    def release(self) -> None:
        import gc

        import torch

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def step_recording(before: dict[str, Any], after: dict[str, Any], *, source: str, workload: str | None = None) -> Recording:
    """One step's recording from the snapshot taken as its history began (`before`: the memory held
    then) and the one taken after it (`after`: its history and the run record).

    The memory held in `before` becomes events at the start of the history, so the frees of its
    blocks inside the step match. Where the simulator rebuilds every held segment as the GPU had it
    (`_layout_events`: each segment reserved whole, then cut block by block in address order, its
    free blocks freed again), the step can use the free space the GPU left in them, as the real
    step did. Otherwise (expandable segments, a split limit, a layout the replay does not
    reproduce) the live blocks are allocated afresh, which the simulator packs tighter than a
    history of frees left them: padding of the difference comes first (segments of its exact
    size), so the simulated step starts from the same reserved bytes.
    """
    from alloctune.sim.settings import SimSettings
    from alloctune.trace.load import trace_from_snapshot
    from alloctune.trace.stream import RUN_RECORD_KEY

    run = after.get(RUN_RECORD_KEY) or {}
    device = int(run.get("device", 0))
    segments = sorted(
        (s for s in before.get("segments") or [] if s.get("device", device) == device), key=lambda s: int(s["address"])
    )
    history = list(after["device_traces"][device]) if device < len(after["device_traces"]) else []
    t0 = int(history[0].get("time_us", 0)) if history else 0
    resident = sum(int(s["total_size"]) for s in segments)
    settings = SimSettings.from_allocator_settings(after.get("allocator_settings") or {}, run.get("torch"))
    layout = _layout_events(segments, t0, settings, run.get("total_memory"), resident)
    if layout is not None:
        prefix, padding = layout, 0
    else:
        held = _held_events(segments, t0)
        packed = _packed([e["size"] for e in held if e["action"] == "alloc"], settings, run.get("total_memory"))
        padding = resident - packed
        prefix = _padding_events(padding, t0) + held
    traces = list(after["device_traces"]) + [[] for _ in range(device + 1 - len(after["device_traces"]))]
    traces[device] = prefix + history
    snapshot = {**after, "device_traces": traces}
    trace = trace_from_snapshot(snapshot, device, source=source, meta={"workload": workload} if workload else None)
    return Recording(trace, resident, padding)


def _layout_events(
    segments: Sequence[dict[str, Any]], t0: int, settings: Any, total_memory: Any, resident: int
) -> list[dict[str, Any]] | None:
    """History events that rebuild `segments` block by block where the GPU had them, or None where
    the simulator would not end with exactly `resident` bytes reserved by them.

    A large-pool segment is reserved whole (one request of its size gets a segment of that size)
    and freed, then cut in address order: every block, free ones too, is allocated at its own size,
    and with no other free block in its pool the best fit is the rest of that segment. A small-pool
    segment (2 MiB) is cut the same way from its first block. The free blocks are freed again only
    after every segment is cut, so no cut lands in another segment's free space. Expandable
    segments and a split limit (`max_split_size_mb`) cut differently: None for them."""
    if not segments or getattr(settings, "expandable_segments", False) or getattr(settings, "max_split_size", None):
        return None
    cut: list[dict[str, Any]] = []
    free_again: list[dict[str, Any]] = []

    def ev(action: str, addr: int, size: int, stream: int) -> dict[str, Any]:
        return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t0}

    for seg in segments:
        if seg.get("is_expandable"):
            return None
        stream, addr, total = int(seg.get("stream", 0)), int(seg["address"]), int(seg["total_size"])
        cut.append(ev("segment_alloc", addr, total, stream))
        blocks = sorted(seg.get("blocks") or [], key=lambda b: int(b.get("address", addr)))
        whole = len(blocks) == 1 and int(blocks[0]["size"]) == total  # one block fills it: its own request
        small = seg.get("segment_type", "large") != "large"
        if not small and not whole:
            cut += [
                ev("alloc", addr, total, stream),
                ev("free_requested", addr, total, stream),
                ev("free_completed", addr, total, stream),
            ]
        for block in blocks:
            where, size = int(block.get("address", addr)), int(block["size"])
            if str(block.get("state", "")).startswith("active"):
                cut.append(ev("alloc", where, size, stream))
                continue
            # free space in a small segment is cut in pieces of at most 1 MiB: a larger request would go
            # to the large pool; freed again, the pieces merge back into the one free block
            step = _SMALL_REQUEST if small else size
            for at in range(where, where + size, step):
                piece = min(step, where + size - at)
                cut.append(ev("alloc", at, piece, stream))
                free_again += [ev("free_requested", at, piece, stream), ev("free_completed", at, piece, stream)]
    events = cut + free_again
    if _reserved_after(events, settings, total_memory) != resident:
        return None
    return events


def _reserved_after(events: list[dict[str, Any]], settings: Any, total_memory: Any) -> int:
    """Bytes the simulator holds reserved after `events`, replayed from an empty allocator."""
    from alloctune.sim.replay import replay
    from alloctune.trace.load import trace_from_snapshot

    total = total_memory if isinstance(total_memory, int) and total_memory > 0 else None
    trace = trace_from_snapshot(
        {"device_traces": [events], "allocator_settings": {}},
        0,
        source="<held segments>",
        meta={"total_memory": total} if total else None,
    )
    # nothing in `events` releases a segment: the peak is what is held at their end
    return int(replay(trace, settings, addresses="model", record_events=False, timeline_points=1).peak_reserved)


def _held_events(segments: Sequence[dict[str, Any]], t0: int) -> list[dict[str, Any]]:
    """History events that create `segments` and the live blocks in them (pending frees count as live)."""
    events: list[dict[str, Any]] = []
    for seg in segments:
        stream = int(seg.get("stream", 0))
        action = "segment_map" if seg.get("is_expandable") else "segment_alloc"
        events.append(
            {"action": action, "addr": int(seg["address"]), "size": int(seg["total_size"]), "stream": stream, "time_us": t0}
        )
        addr = int(seg["address"])
        for block in seg.get("blocks") or []:
            where = int(block.get("address", addr))
            if str(block.get("state", "")).startswith("active"):
                size = int(block.get("requested_size") or block["size"])
                events.append({"action": "alloc", "addr": where, "size": size, "stream": stream, "time_us": t0})
            addr = where + int(block["size"])
    return events


def _packed(sizes: Sequence[int], settings: Any, total_memory: Any) -> int:
    """Bytes the simulator reserves for `sizes` allocated in order from an empty allocator."""
    if not sizes:
        return 0
    starts = itertools.accumulate(sizes, initial=_PAD_ADDRESS)  # side by side: each block its own address
    events = [{"action": "alloc", "addr": at, "size": size, "stream": 0, "time_us": 0} for at, size in zip(starts, sizes)]
    return _reserved_after(events, settings, total_memory)


def _padding_events(padding: int, t0: int) -> list[dict[str, Any]]:
    """Allocations that reserve `padding` bytes (rounded up to 2 MiB) in segments they fill exactly."""
    if padding <= 0:
        return []
    grains = -(-padding // _PAD_GRAIN)
    sizes = [grains * _PAD_GRAIN] if grains * _PAD_GRAIN >= _PAD_LARGE else [MiB] * (2 * grains)
    return [
        {"action": "alloc", "addr": _PAD_ADDRESS * (k + 1), "size": size, "stream": 0, "time_us": t0}
        for k, size in enumerate(sizes)
    ]
