"""The real trial runner: a picklable description of the workload, run through `runner.run_trial`.

`TrialSpec` holds only plain data (command, working folder, extra environment), so the same
object drives a thread on this host and a Ray task on another node; the GPU a trial gets
comes from the environment of the worker (`CUDA_VISIBLE_DEVICES` set by the `gpus` executor
or by Ray), never from the spec. `runner` is imported inside the call: the tune core stays
free of the process-starting module until a trial really runs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from alloctune.run.trial import TrialResult
from alloctune.tune.executors.tasks import TrialTask

_LOG_RE = re.compile(r"trial-(\d+)\.log$")


@dataclass(frozen=True)
class TrialSpec:
    """The workload of a sweep: what every trial runs, where its files go, what it adds to the env."""

    command: tuple[str, ...]
    workdir: str  # logs/trial-NNNN.log and baseline.pickle; shared storage when trials run on other nodes
    env: tuple[tuple[str, str], ...] = ()  # added to the worker's environment (e.g. NCCL settings)
    torch_version: str | None = None  # the grammar to validate settings with (None = the default release)

    @classmethod
    def make(
        cls,
        command: Sequence[str],
        workdir: str | os.PathLike,
        *,
        env: Mapping[str, str] | None = None,
        torch_version: str | None = None,
    ) -> "TrialSpec":
        return cls(tuple(command), str(Path(workdir).resolve()), tuple(sorted((env or {}).items())), torch_version)

    @property
    def baseline_path(self) -> Path:
        return Path(self.workdir) / "baseline.pickle"

    def first_free_number(self) -> int:
        """Trial numbers already used by logs in the folder (a resumed sweep must not overwrite them)."""
        logs = Path(self.workdir) / "logs"
        used = [int(m.group(1)) for p in logs.glob("trial-*.log") if (m := _LOG_RE.search(p.name))] if logs.is_dir() else []
        return max(used, default=0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": 1,
            "command": list(self.command),
            "workdir": self.workdir,
            "env": dict(self.env),
            "torch_version": self.torch_version,
        }


class SpecRunner:
    """Runs `TrialTask`s of one `TrialSpec` with `runner.run_trial` (thread-safe, picklable)."""

    def __init__(self, spec: TrialSpec, on_recorded: Callable[[Path], None] | None = None):
        self.spec = spec
        self.ahead: Any = None  # a `run.warm.Ahead` (this host only: never shipped to a Ray worker)
        # told of a recording as soon as it is whole, while its run still exits (`run_trial`); this host only
        self.on_recorded = on_recorded

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "ahead": None, "on_recorded": None}

    def start_ahead(self, count: int) -> None:
        """Trials after the recorded baseline take processes started beside it (`run.warm`)."""
        from alloctune.run.warm import Ahead

        self.ahead = Ahead(self.spec.command, {**os.environ, **dict(self.spec.env)}, count)

    def close_ahead(self) -> str | None:
        return self.ahead.close() if self.ahead is not None else None

    def run_task(self, task: TrialTask, env: Mapping[str, str]) -> TrialResult:
        from alloctune.run.runner import run_trial

        spec, req = self.spec, task.request
        child_env = dict(os.environ)
        child_env.update(spec.env)
        child_env.update(env)
        logs = Path(spec.workdir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        # a capped recorded trial (tune's calibration) must not overwrite the baseline's history
        record_to = (
            (
                spec.baseline_path
                if req.budget is None
                else Path(spec.workdir) / task.log_name.replace("trial-", "capped-").replace(".log", ".pickle")
            )
            if req.record
            else None
        )
        pid_file = Path(spec.workdir) / task.log_name.replace("trial-", "running-").replace(".log", ".json")

        def cold() -> TrialResult:
            return run_trial(
                spec.command,
                conf=req.conf,
                budget=req.budget,
                record=record_to,
                timeout=task.timeout,
                capture=logs / task.log_name,
                ensure_cap=req.ensure_cap,
                repeat=req.repeat,
                no_grad=req.no_grad,
                cudnn_benchmark=req.cudnn_benchmark,
                checkpointing=req.checkpointing,
                torch_version=spec.torch_version,
                env=child_env,
                pid_file=pid_file if self.ahead is not None else None,
                on_recorded=self.on_recorded,
            )

        if self.ahead is None or env:  # a held process has the sweep's environment, not a worker's GPU choice
            return cold()
        return self.ahead.trial(
            req.conf,
            req.budget,
            record_to=record_to,
            remedy=req.remedy,
            capture=logs / task.log_name,
            timeout=task.timeout,
            torch_version=spec.torch_version,
            repeat=req.repeat,
            ensure_cap=req.ensure_cap,
            pid_file=pid_file,
            cold=cold,
            on_recorded=self.on_recorded,
        )

    def cancel(self) -> None:
        """Stop every trial this process is running (Ctrl-C of a parallel sweep)."""
        from alloctune.run.runner import terminate_running

        terminate_running()
