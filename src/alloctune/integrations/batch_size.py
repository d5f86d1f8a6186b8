"""The largest batch size that fits, from three small recorded steps and the simulator, not from crashes.

    from alloctune.integrations import find_batch_size

    def step(batch_size):                      # one training step at any batch size
        x = torch.randn(batch_size, 512, device="cuda")
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    found = find_batch_size(step, budget="6GiB", max_size=4096)
    found.largest                              # e.g. 1984

accelerate's `find_executable_batch_size` halves the batch on every out-of-memory error: each
probe is a real crash and a wasted step. Here, in order:

1. one warm-up run of `step_fn` at the smallest size, so that what a first step creates
   (optimizer state, cuBLAS workspaces, lazy modules) is held before every recorded step, as it
   is before every later step of training;
2. one run at each of `sizes` while the caching allocator's history is recorded (the trainer
   hooks' `OOMRecorder`); the memory held before the step (model, optimizer state) enters each
   recording as allocations at its start (`step_recording`), so a step that frees some of it
   (gradients set to None) gets it back in the simulation as on the GPU;
3. `plan`'s size-parametric trace from those recordings (`plan.traceset.build`, the error bound
   of `plan.service.error_model`) and its search for the largest size that completes under a cap
   of `budget` bytes (`plan.answer.plan`), replayed by the exact simulator;
4. with `verify=True`, one real step at the answer under that cap, stepping down on a real
   out-of-memory error by `plan.confirm`'s rule (the answer's error bound, at least 2 %).

The GPU is reached through one small interface, `StepDevice` (`CudaSteps` on torch.cuda; a
test passes a fake whose recordings are synthetic traces). torch is imported only when a
`CudaSteps` method runs, so this module imports without it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from alloctune.errors import EnvironmentProblem, InputError, WorkloadFailed
from alloctune.guard.oom import is_oom, strip_traceback
from alloctune.integrations.recorder import OOMRecorder
from alloctune.trace.model import ALLOC, RequestStream, Trace
from alloctune.units import MiB, format_size, parse_user_size

if TYPE_CHECKING:
    from alloctune.plan.answer import Largest, PlanResult
    from alloctune.plan.confirm import Confirmation, ConfirmRun

__all__ = ["BatchSizeResult", "CudaSteps", "FitsBatchSize", "NoBatchSizeFits", "Recording", "StepDevice",
           "find_batch_size", "fits_batch_size", "step_recording"]

SCHEMA = "alloctune.batch_size/1"
DEFAULT_SIZES = (8, 16, 32)
RECORD_ENTRIES = 2_000_000  # allocator events kept per recorded step: one step of a large model fits
VERIFY_RUNS = 3  # real steps `verify=True` may take: the answer and at most two steps down
# Segments of exactly the padding's size: a large request of a 2 MiB multiple from 10 MiB gets a
# segment of its own size; below that, pairs of 1 MiB requests fill 2 MiB small-pool segments.
_PAD_GRAIN = 2 * MiB
_PAD_LARGE = 10 * MiB
_PAD_ADDRESS = 1 << 20  # the padding's block addresses: far below any real device address

StepFn = Callable[[int], object]
R = TypeVar("R")


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
        """Run `step_fn(batch_size)` once while the allocator's history is recorded."""
        ...

    def available(self) -> int:
        """Bytes this process's caching allocator can hold now: free device memory plus its own reserve."""
        ...

    def release(self) -> None:
        """Return cached memory to the device (after a step, and after a failed one)."""
        ...


@dataclass(frozen=True)
class BatchSizeResult:
    """What `find_batch_size` found.

    Attributes:
        largest: the largest batch size (a multiple of `multiple_of`) whose step completes under
            `budget`: the simulation's answer, or after `verify` the largest that completed on the GPU.
        budget: bytes the process's caching allocator may reserve, the memory held before the step included.
        recorded: the batch sizes recorded (ascending), each run once on the GPU.
        resident: bytes reserved before each recorded step (the largest seen): model, optimizer state.
        predicted: the simulation's answer (`largest` before `verify` moved it).
        first_failing: the smallest batch size the simulation saw fail (None: none up to `searched_to`).
        searched_to: the largest batch size the simulation tried.
        stopped: why the search ended, as `plan` says it (`exceeded`, `extrapolation`, `max-size`,
            `bound`; `plan.answer.STOPS`): only `exceeded` means a larger size was seen to fail.
        runs: the `verify` steps in order (`plan.confirm.ConfirmRun`; empty without `verify`).
        notes: what a reader needs to trust the answer: the planner's notes and the finder's own.
    """

    largest: int
    budget: int
    recorded: tuple[int, ...]
    resident: int
    predicted: int
    first_failing: int | None
    searched_to: int | None
    stopped: str
    runs: tuple[ConfirmRun, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def verified(self) -> bool:
        """Whether a real step at `largest` completed under the budget (False also when not asked)."""
        return any(r.passed and int(r.size) == self.largest for r in self.runs)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "largest": self.largest, "budget": self.budget, "recorded": list(self.recorded),
                "resident": self.resident, "predicted": self.predicted, "first_failing": self.first_failing,
                "searched_to": self.searched_to, "stopped": self.stopped, "verified": self.verified,
                "runs": [r.to_dict() for r in self.runs], "notes": list(self.notes)}


class NoBatchSizeFits(WorkloadFailed):
    """No batch size could be answered: a recorded size ran out of memory, or none fits the budget."""


def find_batch_size(step_fn: StepFn, budget: int | str | None = None, *, sizes: Sequence[int] = DEFAULT_SIZES,
                    max_size: int | None = None, multiple_of: int = 1, conf: str | None = None,
                    verify: bool = False, device: StepDevice | None = None) -> BatchSizeResult:
    """The largest batch size whose `step_fn(batch_size)` completes under `budget` (see the module docstring).

    `budget`: bytes, or a size such as "6GiB"; default: what the process's allocator can hold
    now (free device memory plus what torch already reserved, within a per-process cap).
    `sizes`: the batch sizes recorded (two or more; three or more give the answer an error bound).
    `max_size`: the largest batch size wanted (default: open-ended, up to 16x the largest
    recorded size: `stopped` says "extrapolation" when that limit, not a failing size, ended it).
    `multiple_of`: answers are multiples of it. `conf`: the allocator setting to answer for
    (default: this process's own, `PYTORCH_CUDA_ALLOC_CONF`). `verify`: run one real step at the
    answer under the budget, stepping down if it runs out of memory. `device`: the GPU (default
    `CudaSteps()`).
    """
    asked = _checked(step_fn, budget, sizes, max_size, multiple_of)
    _check_setting(conf, verify)
    order = sorted(set(sizes))
    gpu: StepDevice = device if device is not None else CudaSteps()
    _warm_up(gpu, step_fn, order[0])
    limit = gpu.available() if asked is None else asked
    recorded, failed = _record_all(gpu, step_fn, order)
    gpu.release()
    result = _plan(recorded, limit, failed, max_size, multiple_of, conf)
    item = result.settings[0].largest[0]
    resident = max(r.resident for _, r in recorded)
    if item.largest is None:
        raise NoBatchSizeFits(f"no batch size fits {format_size(limit)}: the simulated step fails already at "
                              f"batch size {multiple_of} (the memory held before each step: {format_size(resident)});"
                              " give a larger budget, or free memory the step does not need")
    predicted = int(item.largest)
    confirmation = _verified(gpu, step_fn, result) if verify else None
    largest = predicted
    if confirmation is not None:
        if confirmation.confirmed is None:
            raise NoBatchSizeFits(f"verify: {_run_list(confirmation.runs)} under {format_size(limit)}: "
                                  f"{confirmation.note}")
        largest = int(confirmation.confirmed)
    return BatchSizeResult(
        largest=largest, budget=limit, recorded=tuple(b for b, _ in recorded), resident=resident,
        predicted=predicted, first_failing=_whole(item.first_failing), searched_to=_whole(item.searched_to),
        stopped=item.stopped, runs=confirmation.runs if confirmation is not None else (),
        notes=tuple(finder_notes(item, recorded, failed, confirmation)) + result.notes)


class FitsBatchSize(Generic[R]):
    """A training function called at the batch size `find_batch_size` finds for its step (`fits_batch_size`).

    Calling it with the training function's arguments less the batch size finds the batch size
    with `step_fn(batch_size, *args, **kwargs)` and then calls the function at it; `found` is the
    last `BatchSizeResult`.
    """

    def __init__(self, train: Callable[..., R], step_fn: Callable[..., object], options: dict[str, Any]) -> None:
        functools.update_wrapper(self, train)
        self.train = train
        self.step_fn = step_fn
        self.options = options
        self.found: BatchSizeResult | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        self.found = find_batch_size(lambda batch_size: self.step_fn(batch_size, *args, **kwargs), **self.options)
        return self.train(self.found.largest, *args, **kwargs)


def fits_batch_size(step_fn: Callable[..., object], budget: int | str | None = None, *,
                    sizes: Sequence[int] = DEFAULT_SIZES, max_size: int | None = None, multiple_of: int = 1,
                    conf: str | None = None, verify: bool = False,
                    device: StepDevice | None = None) -> Callable[[Callable[..., R]], FitsBatchSize[R]]:
    """Decorator in the manner of accelerate's `find_executable_batch_size`, without its crashes:

        @fits_batch_size(one_step, budget="6GiB", max_size=4096)
        def train(batch_size, model, optimizer): ...

        train(model, optimizer)    # one_step(b, model, optimizer) recorded at small b, then train(found, ...)

    The batch size is found (`find_batch_size`, same options) at every call, before training starts.
    """
    options: dict[str, Any] = {"budget": budget, "sizes": sizes, "max_size": max_size, "multiple_of": multiple_of,
                               "conf": conf, "verify": verify, "device": device}
    _checked(step_fn, budget, sizes, max_size, multiple_of)  # a bad option fails at the decorator, not mid-run

    def decorate(train: Callable[..., R]) -> FitsBatchSize[R]:
        return FitsBatchSize(train, step_fn, options)

    return decorate


def _checked(step_fn: object, budget: int | str | None, sizes: Sequence[int], max_size: int | None,
             multiple_of: int) -> int | None:
    """The options, refused with one line each before any GPU work; the budget in bytes (None: the default)."""
    if not callable(step_fn):
        raise InputError(f"step_fn must be a function of the batch size, got {type(step_fn).__name__}")
    asked = None if budget is None else parse_user_size(budget, "budget")
    if not _count(multiple_of):
        raise InputError(f"multiple_of must be a whole number of 1 or more, got {multiple_of!r}")
    if isinstance(sizes, (str, bytes)) or not all(_count(s) for s in sizes) or len(set(sizes)) < 2:
        raise InputError(f"sizes must be two or more different batch sizes of 1 or more, got {sizes!r}")
    if max_size is not None:
        if not _count(max_size) or max_size < multiple_of:
            raise InputError(f"max_size must be a whole number of at least multiple_of ({multiple_of}), "
                             f"got {max_size!r}")
        if max_size < max(sizes):
            raise InputError(f"max_size {max_size} is below the largest size to record ({max(sizes)}): "
                             f"record smaller sizes (e.g. sizes={_smaller(max_size)})")
    return asked


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _smaller(top: int) -> tuple[int, ...]:
    """Three sizes below `top` to suggest (1, 2, 4 at the least)."""
    q = max(1, top // 4)
    return (max(1, q // 4), max(2, q // 2), max(4, q))


def _warm_up(gpu: StepDevice, step_fn: StepFn, batch_size: int) -> None:
    """One step before recording, so state a first step creates is there before every recorded step."""
    try:
        gpu.run(step_fn, batch_size)
    except Exception as exc:
        if not is_oom(exc):
            raise
        strip_traceback(exc)
        gpu.release()
        raise NoBatchSizeFits(_recording_oom(batch_size, (), exc, "the warm-up step before recording")) from exc
    gpu.release()


def _record_all(gpu: StepDevice, step_fn: StepFn, sizes: Sequence[int]) -> tuple[list[tuple[int, Recording]],
                                                                                 int | None]:
    """A recording at each size, ascending, until one runs out of memory (that size, else None).

    Two completed recordings are the least a size law needs: with fewer, the OOM is the answer.
    """
    done: list[tuple[int, Recording]] = []
    for b in sizes:
        try:
            done.append((b, gpu.record(step_fn, b)))
        except Exception as exc:
            if not is_oom(exc):
                raise
            strip_traceback(exc)
            gpu.release()
            if len(done) < 2:
                raise NoBatchSizeFits(_recording_oom(b, [s for s, _ in done], exc, "recording")) from exc
            return done, b
    return done, None


def _recording_oom(batch_size: int, recorded: Sequence[int], exc: BaseException, when: str) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    have = ", ".join(map(str, recorded)) or "none"
    return (f"step_fn ran out of memory at batch size {batch_size} during {when} (recorded: {have}); the sizes to "
            f"record must fit: give smaller ones (e.g. sizes={_smaller(max(4, batch_size))}) or free GPU memory "
            f"first [{type(exc).__name__}: {first}]")


def _plan(recorded: Sequence[tuple[int, Recording]], budget: int, failed: int | None,
          max_size: int | None, multiple_of: int, conf: str | None) -> PlanResult:
    """`plan`'s answer for one cap of `budget` bytes under one setting, from the recordings."""
    from alloctune.plan.answer import plan
    from alloctune.plan.service import error_model
    from alloctune.plan.traceset import build
    from alloctune.sim.driver import H200_TOTAL

    recs = [(b, r.trace) for b, r in recorded]
    first = recs[0][1]
    total = first.total_memory or H200_TOTAL
    if budget > total:
        raise InputError(f"budget {format_size(budget)} is more than this GPU's memory ({format_size(total)})")
    torch = first.meta.get("torch") if isinstance(first.meta.get("torch"), str) else None
    own = _own_conf(first)
    top = max_size
    if failed is not None:  # a real step died there: no answer reaches it
        below = ((failed - 1) // multiple_of) * multiple_of
        top = below if top is None else min(top, below)
    if top is not None and top < multiple_of:
        raise NoBatchSizeFits(f"batch size {failed} ran out of memory while recording and no multiple of "
                              f"{multiple_of} lies below it")
    errors = error_model(recs, None, torch) if len(recs) >= 3 else None
    ts = build(recs, meta={"workload": first.meta.get("workload") or "step_fn"})
    return plan(ts, confs=[own if conf is None else conf], caps=[budget], step=multiple_of, max_size=top, curve=[],
                bounds=False, torch=torch, errors=errors)


def _own_conf(trace: Trace) -> str:
    """The allocator setting the recorded process ran with (its run record's, else the environment's)."""
    from alloctune.integrations.backend import allocator_conf

    recorded = trace.meta.get("conf")
    return recorded if isinstance(recorded, str) else allocator_conf()


def _check_setting(conf: str | None, verify: bool) -> None:
    """A setting that does not read is refused before any GPU work (`ConfigError`), and so is `verify`
    under a setting other than the process's own: its real steps run under the process's."""
    from alloctune.integrations.backend import allocator_conf
    from alloctune.sim.settings import SimSettings

    if conf is None:
        return
    if not isinstance(conf, str):
        raise InputError(f"conf must be an allocator setting string such as 'expandable_segments:True', got {conf!r}")
    wanted = SimSettings.from_config(conf)
    own = allocator_conf()
    if verify and wanted != SimSettings.from_config(own):
        raise InputError(f"verify runs the step in this process, whose allocator setting is {own!r}, not {conf!r}: "
                         "drop verify, or start the process with that setting")


def _verified(gpu: StepDevice, step_fn: StepFn, result: PlanResult) -> Confirmation:
    """`plan.confirm` on the answer, its runs one step each in this process under the answer's cap."""
    from alloctune.plan.confirm import confirm

    def runner(cmd: Sequence[str], *, budget: int, **_: Any) -> _StepRun:
        t0 = time.perf_counter()
        ok = _completes(gpu, step_fn, int(cmd[0]), budget)
        return _StepRun("ok" if ok else "oom", None, time.perf_counter() - t0)

    return confirm(result, ["{size}"], runner=runner, max_runs=VERIFY_RUNS, base_env={})[0]


@dataclass(frozen=True)
class _StepRun:
    """What `plan.confirm` reads of a run (`run.trial.TrialResult`'s names)."""

    outcome: str
    peak_reserved: int | None
    wall_s: float


def _completes(gpu: StepDevice, step_fn: StepFn, batch_size: int, budget: int) -> bool:
    """One real step under the cap: True when it completed, False when it ran out of memory."""
    try:
        gpu.run(step_fn, batch_size, budget)
    except Exception as exc:
        if not is_oom(exc):
            raise
        strip_traceback(exc)
        ok = False
    else:
        ok = True
    gpu.release()
    return ok


def _whole(size: str | None) -> int | None:
    return None if size is None else int(size)


def _run_list(runs: Sequence[ConfirmRun]) -> str:
    return "; ".join(f"batch size {r.size}: {r.outcome}" for r in runs) or "no step ran"


# Why a search ended without a failing size (`plan.answer.Largest.stopped`), in the finder's words.
_STOPS = {
    "extrapolation": "the search stops at 16x the largest recorded size, where the fitted sizes rest on nothing "
                     "recorded: give max_size to search further, and record larger sizes to be sure",
    "max-size": "no larger size was asked for (max_size, or a size that ran out of memory while recording)",
    "bound": "further out the error bound of the fit passes 25 %: record larger sizes to search further",
}


def finder_notes(item: Largest, recorded: Sequence[tuple[int, Recording]], failed: int | None,
                 confirmation: Confirmation | None) -> list[str]:
    """The finder's own notes (the planner's follow them): the one place they are worded."""
    notes = []
    if item.stopped in _STOPS:
        notes.append(f"at least {item.largest}: every batch size up to {item.searched_to} fits in the simulation; "
                     + _STOPS[item.stopped])
    if failed is not None:
        notes.append(f"batch size {failed} ran out of memory while recording: the answer stays below it")
    resident = max(r.resident for _, r in recorded)
    if resident:
        pad = max(r.padding for _, r in recorded)
        notes.append(f"each step began with {format_size(resident)} reserved (model, optimizer state), replayed as "
                     "the blocks it held"
                     + (f"; the simulator packs them into {format_size(pad)} less, held aside as padding (a step "
                        "may use part of it on the GPU: answers err small)" if pad > 0 else "")
                     + (f"; the simulator packs them into {format_size(-pad)} more than the GPU did (answers err "
                        "small)" if pad < 0 else ""))
    if confirmation is not None:
        notes.append(f"verify: {confirmation.note}")
    return notes


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
