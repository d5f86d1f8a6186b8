"""The batch-size finder's GPU side: one training step, run under a cap or recorded.

`StepDevice` is all `find_batch_size` asks of a GPU (a test passes a fake whose recordings are
synthetic traces); `CudaSteps` is it on torch.cuda. A recorded step is a `Recording`: the
step's allocator history with the memory held before it replayed as allocations at its start
(`step_recording`). torch is imported only when a `CudaSteps` method runs, so this module
imports without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from alloctune.errors import EnvironmentProblem
from alloctune.integrations.recorder import OOMRecorder
from alloctune.trace.model import ALLOC, RequestStream, Trace
from alloctune.units import MiB

__all__ = ["CudaSteps", "Recording", "StepDevice", "StepFn", "step_recording"]

RECORD_ENTRIES = 2_000_000  # allocator events kept per recorded step: one step of a large model fits
# Segments of exactly the padding's size: a large request of a 2 MiB multiple from 10 MiB gets a
# segment of its own size; below that, pairs of 1 MiB requests fill 2 MiB small-pool segments.
_PAD_GRAIN = 2 * MiB
_PAD_LARGE = 10 * MiB
_PAD_ADDRESS = 1 << 20  # the padding's block addresses: far below any real device address

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
            why = ("alloctune's agent records this process (ALLOCTUNE_AGENT is set): run it without "
                   "alloctune run/record/tune" if self.recorder.backend.available() else "no CUDA device here")
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


def step_recording(before: dict[str, Any], after: dict[str, Any], *, source: str,
                   workload: str | None = None) -> Recording:
    """One step's recording from the snapshot taken as its history began (`before`: the memory held
    then) and the one taken after it (`after`: its history and the run record).

    The blocks live in `before` become allocations at the start of the history (each segment's
    blocks in address order), so the frees of them inside the step match and the simulator holds
    them as the GPU did. The simulator packs them afresh, usually tighter than a history of frees
    left them: padding of the difference comes first (segments of its exact size), so the
    simulated step starts from the same reserved bytes.
    """
    from alloctune.sim.settings import SimSettings
    from alloctune.trace.load import trace_from_snapshot
    from alloctune.trace.stream import RUN_RECORD_KEY

    run = after.get(RUN_RECORD_KEY) or {}
    device = int(run.get("device", 0))
    segments = sorted((s for s in before.get("segments") or [] if s.get("device", device) == device),
                      key=lambda s: int(s["address"]))
    history = list(after["device_traces"][device]) if device < len(after["device_traces"]) else []
    t0 = int(history[0].get("time_us", 0)) if history else 0
    held = _held_events(segments, t0)
    resident = sum(int(s["total_size"]) for s in segments)
    settings = SimSettings.from_allocator_settings(after.get("allocator_settings") or {}, run.get("torch"))
    packed = _packed([e["size"] for e in held if e["action"] == "alloc"], settings, run.get("total_memory"))
    padding = resident - packed
    traces = list(after["device_traces"]) + [[] for _ in range(device + 1 - len(after["device_traces"]))]
    traces[device] = _padding_events(padding, t0) + held + history
    snapshot = {**after, "device_traces": traces}
    trace = trace_from_snapshot(snapshot, device, source=source, meta={"workload": workload} if workload else None)
    return Recording(trace, resident, padding)


def _held_events(segments: Sequence[dict[str, Any]], t0: int) -> list[dict[str, Any]]:
    """History events that create `segments` and the live blocks in them (pending frees count as live)."""
    events: list[dict[str, Any]] = []
    for seg in segments:
        stream = int(seg.get("stream", 0))
        action = "segment_map" if seg.get("is_expandable") else "segment_alloc"
        events.append({"action": action, "addr": int(seg["address"]), "size": int(seg["total_size"]),
                       "stream": stream, "time_us": t0})
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
    from alloctune.sim.replay import replay

    if not sizes:
        return 0
    req = RequestStream()
    for i, size in enumerate(sizes):
        req.append(ALLOC, size, i, 0, i)
    total = total_memory if isinstance(total_memory, int) and total_memory > 0 else None
    trace = Trace("<held blocks>", 0, req, [], {}, total_memory=total)
    return int(replay(trace, settings, addresses="model", record_events=False, timeline_points=1).peak_reserved)


def _padding_events(padding: int, t0: int) -> list[dict[str, Any]]:
    """Allocations that reserve `padding` bytes (rounded up to 2 MiB) in segments they fill exactly."""
    if padding <= 0:
        return []
    grains = -(-padding // _PAD_GRAIN)
    sizes = [grains * _PAD_GRAIN] if grains * _PAD_GRAIN >= _PAD_LARGE else [MiB] * (2 * grains)
    return [{"action": "alloc", "addr": _PAD_ADDRESS * (k + 1), "size": size, "stream": 0, "time_us": t0}
            for k, size in enumerate(sizes)]
