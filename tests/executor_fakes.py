"""Fake trials for the executor tests: deterministic results, real concurrency, checks from inside.

`FakeTrials` is a `TrialRunner`: a trial passes iff its budget covers the setting's need, and
its result depends only on the request (so stores written by different executors must be
equal line for line). While a trial "runs" (sleeps) it holds budget + context bytes in a
shared account; the highest total ever held and any overlap with an exclusive trial are
recorded, so the tests see what the scheduler really did. `log` (a file, appended with
O_APPEND) lists every start and end across processes (for kill/resume tests); `die_once`
makes the trial of one setting kill its own worker process the first time (a lost Ray worker).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from alloctune.run.trial import TrialRequest, TrialResult

MiB = 1 << 20
GiB = 1 << 30
COMMAND = ("python", "train.py")
NEEDS = {"": 3000 * MiB, "expandable_segments:True": 2100 * MiB, "max_split_size_mb:128": 2300 * MiB}


def requests(confs=tuple(NEEDS), budgets=(1800, 2200, 2600, 3000, 3400)) -> list[TrialRequest]:
    return [TrialRequest(c, b * MiB, purpose="fake") for c in confs for b in budgets]


def key_of(conf: str, budget, repeat=0, record=False) -> str:
    return json.dumps({"command": list(COMMAND), "conf": conf, "budget": budget, "repeat": repeat, "record": record},
                      sort_keys=True)


def _claim(marker: Path) -> bool:
    """True for exactly one caller across processes: two trials of the same setting may start at once
    on two workers, and an exists-then-write check let both of them die (CI, stop 23)."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True


class FakeTrials:
    def __init__(self, *, delay: float = 0.05, context: int = 512 * MiB, log: str | None = None,
                 die_once: str | None = None, marker_dir: str | None = None, raise_on: str | None = None,
                 total: int = 140 * GiB):
        self.delay = delay
        self.context = context
        self.log = log
        self.die_once = die_once
        self.marker_dir = marker_dir
        self.raise_on = raise_on
        self.total = total
        self._init_state()

    def _init_state(self):
        self._lock = threading.Lock()
        self.held = 0
        self.max_held = 0
        self.running = 0
        self.max_running = 0
        self.exclusive_overlap = False
        self.calls: list[TrialRequest] = []
        self.envs: list[dict] = []
        self.cancelled = threading.Event()
        self._alone = False

    def __getstate__(self):  # shipped to Ray workers: configuration only
        return {k: getattr(self, k) for k in ("delay", "context", "log", "die_once", "marker_dir", "raise_on", "total")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._init_state()

    def _note(self, what: str, req: TrialRequest) -> None:
        if self.log:
            line = json.dumps({"ev": what, "conf": req.conf, "budget": req.budget, "pid": os.getpid()}) + "\n"
            fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)

    def result(self, req: TrialRequest) -> TrialResult:
        need = NEEDS[req.conf]
        ok = req.budget is None or req.budget >= need
        return TrialResult(command=COMMAND, conf=req.conf, budget=req.budget, outcome="ok" if ok else "oom",
                           exit_code=0 if ok else 1, wall_s=1.5, peak_reserved=need if ok else req.budget,
                           peak_allocated=1900 * MiB, num_alloc_retries=0 if ok else 1, num_ooms=0 if ok else 1,
                           total_memory=self.total, device_name="Fake H200", repeat=req.repeat)

    def run_task(self, task, env):
        req = task.request
        weight = None if (req.exclusive or req.budget is None) else req.budget + self.context
        with self._lock:
            self.calls.append(req)
            self.envs.append(dict(env))
            if self.running and (weight is None or self._alone):
                self.exclusive_overlap = True  # something ran beside a trial that must run alone
            self.running += 1
            self._alone = self._alone or weight is None
            self.held += weight or 0
            self.max_held = max(self.max_held, self.held)
            self.max_running = max(self.max_running, self.running)
        self._note("start", req)
        try:
            if self.raise_on is not None and req.conf == self.raise_on:
                raise RuntimeError("the fake worker broke")
            if self.die_once is not None and req.conf == self.die_once:
                if _claim(Path(self.marker_dir) / "died"):
                    os._exit(1)  # the worker process dies mid-trial
            self.cancelled.wait(self.delay)
            result = self.result(req)
            if not self.cancelled.is_set():
                self._note("end", req)
            return result
        finally:
            with self._lock:
                self.running -= 1
                self.held -= weight or 0
                if weight is None or self.running == 0:
                    self._alone = False

    def cancel(self):
        self.cancelled.set()


class WhereTrials(FakeTrials):
    """Reports the GPU(s) the worker was given (`CUDA_VISIBLE_DEVICES`) as the device name."""

    def run_task(self, task, env):
        res = super().run_task(task, env)
        return TrialResult(**{**res.__dict__, "device_name": os.environ.get("CUDA_VISIBLE_DEVICES")})
