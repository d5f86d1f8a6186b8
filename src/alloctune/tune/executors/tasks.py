"""One trial as a unit of work an executor can ship anywhere: a thread here, a process on a Ray node.

The sweep's `Evaluator` is called in-process with (setting, budget); an executor that runs
trials on other GPUs or other machines needs more: the environment that selects the GPU
(`CUDA_VISIBLE_DEVICES`), a unique log name, and a timeout decided by the driver (which
has seen the baseline). `TrialTask` carries that, and a `TrialRunner` runs it. Runners must
be picklable when used with Ray; any `Evaluator` becomes one through `EvaluatorRunner`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, runtime_checkable

from alloctune.run.trial import TrialRequest, TrialResult
from alloctune.tune.executors.base import Evaluator

# A per-process CUDA context (driver state, cuBLAS/cuDNN handles) costs GPU memory outside the
# caching allocator and outside the per-process cap; ~500 MiB on an H200 with torch 2.11
# (measured: bench/results/scale_gpu.md). Trials packed side by side must leave room for it.
DEFAULT_CONTEXT_BYTES = 512 << 20


@dataclass(frozen=True)
class TrialTask:
    """What a worker needs to run one trial: the request, its number (log name) and its timeout."""

    request: TrialRequest
    number: int
    timeout: float | None = None

    @property
    def log_name(self) -> str:
        return f"trial-{self.number:04d}.log"


@runtime_checkable
class TrialRunner(Protocol):
    """Runs one task with `env` (added to the worker's own environment) and returns its evidence."""

    def run_task(self, task: TrialTask, env: Mapping[str, str]) -> TrialResult: ...


class EvaluatorRunner:
    """Any in-process `Evaluator` as a `TrialRunner` (it ignores env, number and timeout).

    The local executors call it from several threads at once: the evaluator must be
    thread-safe then (the runner-based one is; fakes in tests are).
    """

    def __init__(self, evaluator: Evaluator):
        self.evaluator = evaluator

    def run_task(self, task: TrialTask, env: Mapping[str, str]) -> TrialResult:
        req = task.request
        return self.evaluator(req.conf, req.budget, **req.call_options())

    def cancel(self) -> None:
        cancel = getattr(self.evaluator, "cancel", None)
        if callable(cancel):
            cancel()


def as_runner(obj: Any) -> TrialRunner:
    """A `TrialRunner` as is, or an `Evaluator` wrapped in one."""
    if isinstance(obj, TrialRunner):
        return obj
    if callable(obj):
        return EvaluatorRunner(obj)
    raise TypeError(f"not a trial runner or evaluator: {obj!r}")


def failed_trial(request: TrialRequest, error: str, command: tuple[str, ...] = ()) -> TrialResult:
    """A worker that died (thread exception, lost Ray node) is a crashed trial, not a failed sweep.

    `crash` is never reused by `--resume`, so the trial runs again next time.
    """
    return TrialResult(
        command=command,
        conf=request.conf,
        budget=request.budget,
        outcome="crash",
        exit_code=None,
        wall_s=0.0,
        error=error,
        repeat=request.repeat,
    )


class TimeoutPolicy:
    """The per-trial timeout, decided where trials are dispatched (so it also reaches Ray tasks).

    The same rule as the serial evaluator: a fixed `--timeout`, else one hour until a recorded
    baseline has finished, then five times its wall time (at least 60 s), so a hang under a
    tight budget cannot stall a sweep.
    """

    def __init__(self, fixed: float | None = None):
        self.fixed = fixed
        self._baseline_wall: float | None = None
        self._lock = threading.Lock()

    def next(self) -> float | None:
        if self.fixed is not None:
            return self.fixed
        with self._lock:
            return 3600.0 if self._baseline_wall is None else max(60.0, 5 * self._baseline_wall)

    def observe(self, request: TrialRequest, result: TrialResult) -> None:
        if request.record and result.outcome in ("ok", "oom"):
            with self._lock:
                self._baseline_wall = result.wall_s


class Numbering:
    """Thread-safe trial numbers (one log file each), continuing after `start`."""

    def __init__(self, start: int = 0):
        self._n = start
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self._n += 1
            return self._n
