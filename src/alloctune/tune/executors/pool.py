"""Trials side by side on the GPUs of this host: a memory-aware queue served by threads.

Why memory-aware: a budget trial caps its process with `set_per_process_memory_fraction`, so
several of them can share one card as long as their caps plus each process's CUDA context
(which lies outside the cap) fit in the memory that was free when the sweep started. A
trial without a budget (the baseline) or one marked `exclusive` (its throughput will be
compared) runs alone on its GPU. Each trial is one thread waiting on one child process;
the threads do no work, so the parent's CPU use stays flat whatever `jobs` is.

Admission is first-fit in request order, except that nothing overtakes a request that must
run alone (so it cannot starve behind a stream of small trials).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

from alloctune.errors import AlloctuneError
from alloctune.progress import NullProgress, TrialProgress
from alloctune.run.trial import TrialRequest, TrialResult
from alloctune.tune.executors.tasks import (
    DEFAULT_CONTEXT_BYTES,
    Numbering,
    TimeoutPolicy,
    TrialTask,
    as_runner,
    failed_trial,
)


@dataclass(frozen=True)
class Slot:
    """A place trials run: one GPU (or a group of GPUs for a multi-process workload).

    `memory`: bytes the trials on it may use together (None = unknown: one trial at a time);
    `jobs`: most trials at once; `env`: what selects it (`CUDA_VISIBLE_DEVICES`).
    """

    name: str
    env: tuple[tuple[str, str], ...] = ()
    memory: int | None = None
    jobs: int = 1


@dataclass
class _SlotState:
    slot: Slot
    running: dict[int, int | None] = field(default_factory=dict)  # task number -> bytes held (None = alone)

    @property
    def used(self) -> int:
        return sum(v for v in self.running.values() if v is not None)

    @property
    def alone(self) -> bool:
        return any(v is None for v in self.running.values())


class PoolExecutor:
    """Runs trials on `slots` with threads; yields each result as soon as it is known (any order).

    `runner`: a `TrialRunner` or an in-process `Evaluator` (called from several threads).
    `context_bytes`: GPU memory each trial's process needs outside its cap.
    `processes`: processes of the workload on each GPU (2 for `torchrun --nproc-per-node 2`
    on one card): each has its own cap and context, so a trial holds that many of each.
    `progress`: told when a trial starts and ends (the live table).
    Ctrl-C (or closing the iterator) stops starting trials, stops the running ones
    (the runner's `cancel`) and waits for their threads.
    """

    def __init__(
        self,
        runner: Any,
        slots: Sequence[Slot],
        *,
        context_bytes: int = DEFAULT_CONTEXT_BYTES,
        timeout: float | None = None,
        first_number: int = 0,
        progress: TrialProgress | None = None,
        command: Sequence[str] = (),
        processes: int = 1,
    ):
        if not slots:
            raise ValueError("no slots to run trials on")
        self.runner = as_runner(runner)
        self.slots = list(slots)
        self.context_bytes = int(context_bytes)
        self.timeouts = TimeoutPolicy(timeout)
        self.numbers = Numbering(first_number)
        self.progress = progress or NullProgress()
        self.command = tuple(command)
        self.processes = max(1, int(processes))
        self.peak_bytes: dict[str, int] = {s.name: 0 for s in self.slots}  # most memory ever admitted per slot

    @property
    def side_by_side(self) -> bool:
        """Whether two trials may ever run at once (several slots, or several jobs on one)."""
        return sum(s.jobs for s in self.slots) > 1

    # ---- admission ---------------------------------------------------------------------------
    def need(self, req: TrialRequest, slot: Slot) -> int | None:
        """Bytes `req` holds on `slot` while it runs, or None when it must run alone there."""
        if req.exclusive or req.budget is None or slot.memory is None:
            return None
        need = self.processes * (int(req.budget) + self.context_bytes)
        return None if need > slot.memory else need

    def _fits(self, state: _SlotState, need: int | None) -> bool:
        if not state.running:
            return True
        if need is None or state.alone or len(state.running) >= state.slot.jobs:
            return False
        return state.used + need <= (state.slot.memory or 0)

    def _admit(self, pending: deque[TrialRequest], states: list[_SlotState]) -> list[tuple[TrialTask, _SlotState]]:
        """Take from `pending` every request that fits now, booked on its slot at once."""
        started = []
        keep: deque[TrialRequest] = deque()
        blocked = False
        while pending:
            req = pending.popleft()
            if blocked:
                keep.append(req)
                continue
            placed = False
            for state in states:
                need = self.need(req, state.slot)
                if self._fits(state, need):
                    task = TrialTask(req, self.numbers.next(), self.timeouts.next())
                    state.running[task.number] = need
                    self.peak_bytes[state.slot.name] = max(self.peak_bytes[state.slot.name], state.used)
                    started.append((task, state))
                    placed = True
                    break
            if not placed:
                keep.append(req)
                # a request that runs alone everywhere is not overtaken
                blocked = all(self.need(req, s.slot) is None for s in states)
        pending.extend(keep)
        return started

    # ---- running -----------------------------------------------------------------------------
    def run(self, requests: Iterable[TrialRequest]) -> Iterator[tuple[TrialRequest, TrialResult]]:
        pending: deque[TrialRequest] = deque(requests)
        states = [_SlotState(s) for s in self.slots]
        done: queue.Queue = queue.Queue()
        threads: dict[int, threading.Thread] = {}
        self.progress.begin([s.name for s in self.slots], len(pending))
        finished_cleanly = False
        try:
            while pending or threads:
                for task, state in self._admit(pending, states):
                    thread = threading.Thread(
                        target=self._work, args=(task, state.slot, done), name=f"alloctune-trial-{task.number}", daemon=True
                    )
                    threads[task.number] = thread
                    self.progress.started(task, state.slot.name)
                    thread.start()
                while True:
                    try:  # a short wait keeps the main thread responsive to Ctrl-C
                        task, slot_name, result, error = done.get(timeout=0.2)
                        break
                    except queue.Empty:
                        continue
                threads.pop(task.number).join()
                for state in states:
                    state.running.pop(task.number, None)
                if error is not None:
                    raise error
                self.timeouts.observe(task.request, result)
                self.progress.finished(task, slot_name, result)
                yield task.request, result
            finished_cleanly = True
        finally:
            if threads:
                self._stop(threads)
            self.progress.end(interrupted=not finished_cleanly)

    def _work(self, task: TrialTask, slot: Slot, done: queue.Queue) -> None:
        try:
            result = self.runner.run_task(task, dict(slot.env))
            done.put((task, slot.name, result, None))
        except AlloctuneError as exc:  # the user's setup (missing command, bad setting): stop the sweep
            done.put((task, slot.name, None, exc))
        except BaseException as exc:  # a broken worker is one failed trial, not a failed sweep
            done.put(
                (
                    task,
                    slot.name,
                    failed_trial(task.request, f"worker {slot.name} failed: {type(exc).__name__}: {exc}", self.command),
                    None,
                )
            )

    def _stop(self, threads: Mapping[int, threading.Thread]) -> None:
        cancel = getattr(self.runner, "cancel", None)
        if callable(cancel):
            cancel()
        for thread in threads.values():
            thread.join(timeout=30.0)
