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
4. while that answer does not rest on recordings near it, one more recorded step and step 3
   again from all the recordings, at most `MAX_ADDED` times (`_supported`): at half an answer
   more than `REACH` times the largest recorded size (laws fitted on small sizes, extrapolated
   far), at an answer the search could only bound from below, at a failing size above every
   recording that failed by the room left for the error bound (`_next_size`); a recording that
   runs out of memory caps the answer below its size;
5. with `verify=True`, one real step at the answer under that cap, stepping down on a real
   out-of-memory error by `plan.confirm`'s rule (the answer's error bound, at least 2 %).

The GPU is reached through one small interface, `StepDevice` (`step_device`: `CudaSteps` on
torch.cuda; a test passes a fake whose recordings are synthetic traces), so this module imports
without torch.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from alloctune.errors import InputError, WorkloadFailed
from alloctune.guard.oom import is_oom, strip_traceback
from alloctune.integrations.step_device import CudaSteps, Recording, StepDevice, StepFn, step_recording
from alloctune.trace.model import Trace
from alloctune.units import format_size, parse_user_size

if TYPE_CHECKING:
    from alloctune.plan.bound import ErrorModel
    from alloctune.plan.confirm import Confirmation, ConfirmRun
    from alloctune.plan.result import Largest, PlanResult

__all__ = [
    "BatchSizeResult",
    "CudaSteps",
    "FitsBatchSize",
    "NoBatchSizeFits",
    "Recording",
    "StepDevice",
    "find_batch_size",
    "fits_batch_size",
    "step_recording",
]

SCHEMA = "alloctune.batch_size/1"
DEFAULT_SIZES = (8, 16, 32)
VERIFY_RUNS = 3  # real steps `verify=True` may take: the answer and at most two steps down
REACH = 2  # an answer may lie at most this many times the largest recorded size
LOOSE_BOUND = 0.05  # a larger error bound at a failing size above every recording: record there (`_next_size`)
MAX_ADDED = 4  # steps the finder may record after its first answer (`_supported`)

R = TypeVar("R")


@dataclass(frozen=True)
class BatchSizeResult:
    """What `find_batch_size` found.

    Attributes:
        largest: the largest batch size (a multiple of `multiple_of`) whose step completes under
            `budget`: the simulation's answer, or after `verify` the largest that completed on the GPU.
        budget: bytes the process's caching allocator may reserve, the memory held before the step included.
        recorded: the batch sizes recorded (ascending), each run once on the GPU: `sizes`, then `added`.
        resident: bytes reserved before each recorded step (the largest seen): model, optimizer state.
        predicted: the simulation's answer (`largest` before `verify` moved it).
        first_failing: the smallest batch size the simulation saw fail (None: none up to `searched_to`).
        searched_to: the largest batch size the simulation tried.
        stopped: why the search ended, as `plan` says it (`exceeded`, `extrapolation`, `max-size`,
            `bound`; `plan.result.STOPS`): only `exceeded` means a larger size was seen to fail.
        runs: the `verify` steps in order (`plan.confirm.ConfirmRun`; empty without `verify`).
        notes: what a reader needs to trust the answer: the planner's notes and the finder's own.
        added: the batch sizes recorded after the first answer, in the order recorded (also in
            `recorded`): each where an answer did not rest on recordings near it (`_next_size`).
        recording_oom: the smallest batch size that ran out of memory while recording (None: none);
            the answer stays below it.
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
    added: tuple[int, ...] = ()
    recording_oom: int | None = None

    @property
    def verified(self) -> bool:
        """Whether a real step at `largest` completed under the budget (False also when not asked)."""
        return any(r.passed and int(r.size) == self.largest for r in self.runs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "largest": self.largest,
            "budget": self.budget,
            "recorded": list(self.recorded),
            "resident": self.resident,
            "predicted": self.predicted,
            "first_failing": self.first_failing,
            "searched_to": self.searched_to,
            "stopped": self.stopped,
            "verified": self.verified,
            "runs": [r.to_dict() for r in self.runs],
            "notes": list(self.notes),
            "added": list(self.added),
            "recording_oom": self.recording_oom,
        }


class NoBatchSizeFits(WorkloadFailed):
    """No batch size could be answered: a recorded size ran out of memory, or none fits the budget."""


def find_batch_size(
    step_fn: StepFn,
    budget: int | str | None = None,
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    max_size: int | None = None,
    multiple_of: int = 1,
    conf: str | None = None,
    verify: bool = False,
    device: StepDevice | None = None,
) -> BatchSizeResult:
    """The largest batch size whose `step_fn(batch_size)` completes under `budget` (see the module docstring).

    `budget`: bytes, or a size such as "6GiB"; default: what the process's allocator can hold
    now (free device memory plus what torch already reserved, within a per-process cap).
    `sizes`: the batch sizes recorded first (two or more; three or more give the answer an error
    bound); up to `MAX_ADDED` more are recorded where the answer needs them (`added`).
    `max_size`: the largest batch size wanted (default: open-ended, up to 16x the largest
    recorded size: `stopped` says "extrapolation" when that limit, not a failing size, ended it).
    Either way no answer rests on more than `REACH`x the largest recording unless `notes` say so.
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
    steps = _record_all(gpu, step_fn, order)
    found = _supported(gpu, step_fn, steps, lambda: _plan(steps, limit, max_size, multiple_of, conf), multiple_of)
    result, item = found.result, found.item
    resident = max(r.resident for _, r in steps.done)
    if item.largest is None:
        raise NoBatchSizeFits(
            f"no batch size fits {format_size(limit)}: the simulated step fails already at "
            f"batch size {multiple_of} (the memory held before each step: {format_size(resident)});"
            " give a larger budget, or free memory the step does not need"
        )
    predicted = int(item.largest)
    confirmation = _verified(gpu, step_fn, result) if verify else None
    largest = predicted
    if confirmation is not None:
        if confirmation.confirmed is None:
            raise NoBatchSizeFits(f"verify: {_run_list(confirmation.runs)} under {format_size(limit)}: {confirmation.note}")
        largest = int(confirmation.confirmed)
    return BatchSizeResult(
        largest=largest,
        budget=limit,
        recorded=tuple(b for b, _ in steps.done),
        resident=resident,
        predicted=predicted,
        first_failing=_whole(item.first_failing),
        searched_to=_whole(item.searched_to),
        stopped=item.stopped,
        runs=confirmation.runs if confirmation is not None else (),
        notes=tuple(finder_notes(item, steps, confirmation)) + result.notes,
        added=tuple(steps.added),
        recording_oom=steps.failed,
    )


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


def fits_batch_size(
    step_fn: Callable[..., object],
    budget: int | str | None = None,
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    max_size: int | None = None,
    multiple_of: int = 1,
    conf: str | None = None,
    verify: bool = False,
    device: StepDevice | None = None,
) -> Callable[[Callable[..., R]], FitsBatchSize[R]]:
    """Decorator in the manner of accelerate's `find_executable_batch_size`, without its crashes:

        @fits_batch_size(one_step, budget="6GiB", max_size=4096)
        def train(batch_size, model, optimizer): ...

        train(model, optimizer)    # one_step(b, model, optimizer) recorded at small b, then train(found, ...)

    The batch size is found (`find_batch_size`, same options) at every call, before training starts.
    """
    options: dict[str, Any] = {
        "budget": budget,
        "sizes": sizes,
        "max_size": max_size,
        "multiple_of": multiple_of,
        "conf": conf,
        "verify": verify,
        "device": device,
    }
    _checked(step_fn, budget, sizes, max_size, multiple_of)  # a bad option fails at the decorator, not mid-run

    def decorate(train: Callable[..., R]) -> FitsBatchSize[R]:
        return FitsBatchSize(train, step_fn, options)

    return decorate


def _checked(
    step_fn: object, budget: int | str | None, sizes: Sequence[int], max_size: int | None, multiple_of: int
) -> int | None:
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
            raise InputError(f"max_size must be a whole number of at least multiple_of ({multiple_of}), got {max_size!r}")
        if max_size < max(sizes):
            raise InputError(
                f"max_size {max_size} is below the largest size to record ({max(sizes)}): "
                f"record smaller sizes (e.g. sizes={_smaller(max_size)})"
            )
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


@dataclass
class _Steps:
    """The recorded steps an answer rests on, and what recording showed beyond them."""

    done: list[tuple[int, Recording]]  # ascending by batch size
    failed: int | None = None  # the smallest batch size that ran out of memory while recording
    added: list[int] = field(default_factory=list)  # recorded after the first answer, in order
    tries: int = 0  # recordings tried after the first answer, those that ran out of memory included

    @property
    def top(self) -> int:
        return self.done[-1][0]

    def record(self, gpu: StepDevice, step_fn: StepFn, batch_size: int) -> bool:
        """One more recording at `batch_size` (False: it ran out of memory, and caps the answer)."""
        try:
            made = gpu.record(step_fn, batch_size)
        except Exception as exc:
            if not is_oom(exc):
                raise
            strip_traceback(exc)
            gpu.release()
            if len(self.done) < 2:  # the least a size law needs: with fewer, the OOM is the answer
                have = [s for s, _ in self.done]
                raise NoBatchSizeFits(_recording_oom(batch_size, have, exc, "recording")) from exc
            self.failed = batch_size if self.failed is None else min(self.failed, batch_size)
            return False
        self.done = sorted([*self.done, (batch_size, made)], key=lambda step: step[0])
        return True


def _record_all(gpu: StepDevice, step_fn: StepFn, sizes: Sequence[int]) -> _Steps:
    """A recording at each size, ascending, until one runs out of memory (`NoBatchSizeFits` before two are done)."""
    steps = _Steps([])
    for b in sizes:
        if not steps.record(gpu, step_fn, b):
            break
    gpu.release()
    return steps


@dataclass(frozen=True)
class _Answer:
    """`plan`'s answer from the recordings, and the error bound it left room for (None: none checked)."""

    result: PlanResult
    errors: ErrorModel | None

    @property
    def item(self) -> Largest:
        return self.result.settings[0].largest[0]

    def bound(self, size: int) -> float:
        """The relative memory error bound the simulation allows at `size`."""
        return self.errors.at(Fraction(size)) if self.errors is not None else 0.0


def _supported(gpu: StepDevice, step_fn: StepFn, steps: _Steps, answer: Callable[[], _Answer], multiple_of: int) -> _Answer:
    """`answer()` once it rests on recordings near it (`_next_size`), or after `MAX_ADDED` more recordings:
    until then, one more step is recorded where `_next_size` says and the answer asked again from
    all the recordings."""
    found = answer()
    while steps.tries < MAX_ADDED:
        size = _next_size(found, steps.top, multiple_of)
        if size is None:
            break
        steps.tries += 1
        if steps.record(gpu, step_fn, size):  # one that ran out of memory was released there
            steps.added.append(size)
            gpu.release()
        found = answer()
    return found


def _next_size(found: _Answer, top: int, multiple_of: int) -> int | None:
    """Where to record next for the answer `found` (None: nowhere, it rests on recordings near it).

    1. An answer more than `REACH` times the largest recorded size `top`: at half the answer
       rounded up to `multiple_of` (above `top`, as the answer is more than twice it; below any
       size that ran out of memory, as the answer is). Half, not the answer: the recording runs
       uncapped, and laws extrapolated that far may be wrong by any amount.
    2. An answer above `top` that is only a lower bound (the search stopped where the fit's
       error bound or the extrapolation limit ends it): at the answer, which fits with room for that bound.
    3. A first failing size above `top` that failed with an error bound over `LOOSE_BOUND` left room
       for: at that size, so that a recording, not the allowance, says whether it fits.
    """
    item = found.item
    if item.largest is None:
        return None
    largest = int(item.largest)
    if largest > REACH * top:
        return -(-largest // (REACH * multiple_of)) * multiple_of
    if largest > top and item.stopped in ("bound", "extrapolation"):
        return largest
    failing = _whole(item.first_failing)
    if failing is not None and failing > top and found.bound(failing) > LOOSE_BOUND:
        return failing
    return None


def _recording_oom(batch_size: int, recorded: Sequence[int], exc: BaseException, when: str) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    have = ", ".join(map(str, recorded)) or "none"
    return (
        f"step_fn ran out of memory at batch size {batch_size} during {when} (recorded: {have}); the sizes to "
        f"record must fit: give smaller ones (e.g. sizes={_smaller(max(4, batch_size))}) or free GPU memory "
        f"first [{type(exc).__name__}: {first}]"
    )


def _plan(steps: _Steps, budget: int, max_size: int | None, multiple_of: int, conf: str | None) -> _Answer:
    """`plan`'s answer for one cap of `budget` bytes under one setting, from the recordings."""
    from alloctune.plan.answer import plan
    from alloctune.plan.service import error_model
    from alloctune.plan.traceset import build
    from alloctune.sim.driver import H200_TOTAL

    recs = [(b, r.trace) for b, r in steps.done]
    failed = steps.failed
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
        raise NoBatchSizeFits(
            f"batch size {failed} ran out of memory while recording and no multiple of {multiple_of} lies below it"
        )
    errors = error_model(recs, None, torch) if len(recs) >= 3 else None
    ts = build(recs, meta={"workload": first.meta.get("workload") or "step_fn"})
    return _Answer(
        plan(
            ts,
            confs=[own if conf is None else conf],
            caps=[budget],
            step=multiple_of,
            max_size=top,
            curve=[],
            bounds=False,
            torch=torch,
            errors=errors,
        ),
        errors,
    )


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
        raise InputError(
            f"verify runs the step in this process, whose allocator setting is {own!r}, not {conf!r}: "
            "drop verify, or start the process with that setting"
        )


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
    "recorded: record larger sizes to search further",
    "max-size": "no larger size was asked for (max_size, or a size that ran out of memory while recording)",
    "bound": "further out the error bound of the fit passes 25 %: record larger sizes to search further",
}


def finder_notes(item: Largest, steps: _Steps, confirmation: Confirmation | None) -> list[str]:
    """The finder's own notes (the planner's follow them): the one place they are worded."""
    notes = []
    if item.stopped in _STOPS:
        notes.append(
            f"at least {item.largest}: every batch size up to {item.searched_to} fits in the simulation; " + _STOPS[item.stopped]
        )
    if steps.added:
        notes.append(
            f"recorded {', '.join(map(str, steps.added))} as well, near the answers the recordings before "
            f"gave: an answer more than {REACH}x the largest recorded size, or one that only the error bound "
            "decided, rests on laws fitted far from it"
        )
    if steps.failed is not None:
        notes.append(f"batch size {steps.failed} ran out of memory while recording: the answer stays below it")
    if item.largest is not None and int(item.largest) > REACH * steps.top:
        notes.append(
            f"{item.largest} is still more than {REACH}x the largest recorded size ({steps.top}) after "
            f"{steps.tries} more recordings, the most the finder makes: it rests on extrapolation; record "
            "larger sizes (up to half of it), or pass verify=True"
        )
    resident = max(r.resident for _, r in steps.done)
    if resident:
        pad = max(r.padding for _, r in steps.done)
        notes.append(
            f"each step began with {format_size(resident)} reserved (model, optimizer state), replayed as "
            "the blocks it held"
            + (
                f"; the simulator packs them into {format_size(pad)} less, held aside as padding (a step "
                "may use part of it on the GPU: answers err small)"
                if pad > 0
                else ""
            )
            + (
                f"; the simulator packs them into {format_size(-pad)} more than the GPU did (answers err small)"
                if pad < 0
                else ""
            )
        )
    if confirmation is not None:
        notes.append(f"verify: {confirmation.note}")
    return notes
