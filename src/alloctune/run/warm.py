"""Trials started ahead: a tune's next runs start while its recording runs, and wait at their first CUDA call.

Why: a trial is a whole run of the user's program, and much of a run happens before the GPU is
touched (the interpreter, `import torch`, the model built on the CPU). The runs that follow the
recording can only be chosen once the recording is simulated, but their start can be made
before: each `WarmTrial` runs the program up to its first CUDA call, where its agent waits
(`agent/gate.py`) holding no GPU memory, until `release` writes the setting, the budget and what
to record. From there it is an ordinary trial: same agent, same report, same result.

The processes are started only once the recording has initialised CUDA, and only as many as the
host's free memory holds at the recording's own size then (`WarmPool.start_beside`), so a program
that builds a large model on the CPU is not multiplied into swap. A process that is never used
is killed like any trial (`discard`); one that ended before its release (a program that never
used CUDA) is not used, and the trial starts cold.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import psutil

from alloctune.agent.gate import EXIT_READ_SETTING
from alloctune.agent.settings import STATE_DIR_VAR, default_state_dir
from alloctune.run.child import (
    CONF_VARS,
    KILL_GRACE_S,
    TrialFolder,
    _agent_settings,
    _result,
    _start_child,
    _wait_for_child,
    applied_conf,
    build_env,
    conf_env,
    recording_watch,
    resolve_command,
)
from alloctune.run.process import (
    _RUNNING,
    _RUNNING_LOCK,
    _ExitSignals,
    _reap_group,
)
from alloctune.run.reports import read_reports
from alloctune.run.trial import TrialResult

RELEASE_FILE = "release.json"
READ_SETTING_NOTE = (
    "the runs after the recording started cold: the program reads the allocator's "
    "variable (PYTORCH_CUDA_ALLOC_CONF) before it uses CUDA"
)
HOST_RESERVE = 1 << 30  # host memory left free beside the held processes
HOST_FACTOR = 1.25  # a held process may be somewhat larger than the recording was at its CUDA start
CUDA_START_POLL_S = 0.1


class WarmTrial:
    """One process of `command`, started now and held at its first CUDA call until `release`."""

    def __init__(self, command: Sequence[str], *, env: Mapping[str, str] | None):
        self.argv = resolve_command(command)
        self.folder = TrialFolder(None)
        self.log = self.folder.path / "out.log"
        agent = _agent_settings(
            self.folder.reports,
            conf=None,
            budget=None,
            ensure_cap=False,
            record=None,
            record_max_entries=None,
            on_oom=None,
            oom_dir=None,
            device=None,
            watch_r=self.folder.watch_r,
        )
        agent["gate"] = str(self.folder.path / RELEASE_FILE)
        agent["gate_env"] = list(CONF_VARS)
        child_env = build_env(
            env if env is not None else os.environ, conf="", agent=agent, site_dir=self.folder.site, command=self.argv
        )  # no setting yet: both of its variables removed
        self.started = time.monotonic()
        signals = _ExitSignals().install()
        try:
            with open(self.log, "wb") as out, signals.deferred():
                self.proc: subprocess.Popen = _start_child(self.argv, child_env, None, out, False, self.folder.watch_r)
            with _RUNNING_LOCK:
                _RUNNING.add(self.proc)  # Ctrl-C and `terminate_running` reach it while it waits
        except BaseException:
            self.folder.close()
            raise
        finally:
            signals.restore()
        self.folder.started(self.proc.pid)
        signals.raise_missed()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def release(
        self,
        conf: str | None,
        budget: int | None,
        *,
        timeout: float | None,
        capture: Path,
        torch_version: str | None,
        repeat: int = 0,
        record: str | os.PathLike | None = None,
        ensure_cap: bool = False,
        pid_file: str | os.PathLike | None = None,
        on_recorded: Callable[[Path], None] | None = None,
    ) -> TrialResult | None:
        """Run the held process as the trial (`conf`, `budget`, `record`); its wall time counts from here.
        None where the program read the setting's variables before CUDA (`gate.EXIT_READ_SETTING`): it
        chose without the setting, so the trial must start cold."""
        conf = applied_conf(conf, torch_version)
        agent = _agent_settings(
            self.folder.reports,
            conf=conf,
            budget=budget,
            ensure_cap=ensure_cap,
            record=record,
            record_max_entries=None,
            on_oom=None,
            oom_dir=None,
            device=None,
            watch_r=self.folder.watch_w,
        )
        for key in ("watch_fd", "watch_ino", "runner_pid", "bootstrap", "report_dir"):
            agent.pop(key)  # the held process keeps the ones it started with
        self.folder.owner["conf"] = conf
        self.folder.write_owner(pid_file)
        tmp = self.folder.path / (RELEASE_FILE + ".tmp")
        tmp.write_text(json.dumps({"agent": agent, "env": conf_env(conf, torch_version)}))
        signals = _ExitSignals().install()
        t0 = time.monotonic()
        try:
            os.replace(tmp, self.folder.path / RELEASE_FILE)
            timed_out = _wait_for_child(self.proc, timeout, KILL_GRACE_S, signals, recording_watch(record, on_recorded))
            wall = time.monotonic() - t0
            reports = read_reports(self.folder.reports)
            if self.proc.returncode == EXIT_READ_SETTING and not reports:
                return None
            shutil.copyfile(self.log, capture)
            result = _result(self.argv, conf, budget, self.proc.returncode, timed_out, wall, reports, capture, repeat)
            return _warm_result(result, t0 - self.started)
        finally:
            signals.restore()
            if pid_file is not None:
                Path(pid_file).unlink(missing_ok=True)
            self.discard()

    def discard(self) -> None:
        """End the process (if it still runs) and everything under it; remove its folder."""
        try:
            _reap_group(self.proc.pid)
            with _RUNNING_LOCK:
                _RUNNING.discard(self.proc)
            self.proc.wait(timeout=5)
        except (subprocess.TimeoutExpired, OSError):
            pass
        finally:
            self.folder.close()


def _warm_result(result: TrialResult, held_s: float) -> TrialResult:
    return replace(result, started_ahead_s=round(held_s, 3))


class WarmPool:
    """Held processes for the trials a tune runs next (see the module doc). Thread-safe: executors
    call `take` from their worker threads."""

    def __init__(self, command: Sequence[str], *, env: Mapping[str, str] | None):
        self.command = list(command)
        self.env = env
        self.held: list[WarmTrial] = []
        self.note: str | None = None  # why none were started, when none were
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def start_beside(self, pid_file: Path, count: int) -> None:
        """Start `count` held processes once the trial that writes `pid_file` has initialised CUDA
        (its agent's first live sample), if the host's free memory holds them at that trial's size."""
        if count < 1:
            return
        threading.Thread(target=self._start_when_ready, args=(pid_file, count), name="alloctune-warm", daemon=True).start()

    def _start_when_ready(self, pid_file: Path, count: int) -> None:
        self._start(pid_file, count)
        # Linux's parent-death signal follows the thread that started a process: this thread lives
        # until `close`, so a held process dies with alloctune, not with the thread that started it.
        self._closed.wait()

    def _start(self, pid_file: Path, count: int) -> None:
        state = (self.env or os.environ).get(STATE_DIR_VAR) or default_state_dir()
        root = None
        while not self._closed.is_set():
            if root is None and pid_file.exists():
                try:
                    root = int(json.loads(pid_file.read_text())["pgid"])
                except (ValueError, KeyError, TypeError, OSError):
                    root = None
            if root is not None and os.path.exists(os.path.join(state, f"live-{root}.json")):
                break
            if root is not None and not psutil.pid_exists(root):
                return  # it ended before CUDA: nothing to start beside
            self._closed.wait(CUDA_START_POLL_S)
        else:
            return
        size = _tree_rss(root)
        fits = max(0, (psutil.virtual_memory().available - HOST_RESERVE) // max(1, int(size * HOST_FACTOR)))
        if fits < count:
            self.note = (
                f"{count - fits} of {count} next runs not started ahead: the host's free memory holds "
                f"{fits} at the recording's size"
            )
        for _ in range(min(count, fits)):
            with self._lock:
                if self._closed.is_set():
                    return
                try:
                    self.held.append(WarmTrial(self.command, env=self.env))
                except Exception as exc:  # a trial that cannot start ahead starts cold
                    self.note = f"next runs not started ahead: {exc}"
                    return

    def take(self) -> WarmTrial | None:
        """A held process still waiting, or None (the trial then starts cold)."""
        with self._lock:
            while self.held:
                trial = self.held.pop(0)
                if trial.alive():
                    return trial
                if trial.proc.returncode == EXIT_READ_SETTING:
                    self.note = READ_SETTING_NOTE
                trial.discard()
            return None

    def close(self) -> None:
        """End every held process not taken (every way out of a tune comes here)."""
        self._closed.set()
        with self._lock:
            held, self.held = self.held, []
        for trial in held:
            trial.discard()


def _tree_rss(root: int) -> int:
    """Resident memory of the process `root` and its descendants now (0 where it cannot be read)."""
    try:
        proc = psutil.Process(root)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


class Ahead:
    """One sweep runner's trials started ahead: `count` processes started beside the recorded baseline,
    taken by the setting trials that follow (a remedy's run starts cold: its switches act at torch
    import). Used by both runners of a local sweep (`runner.TrialEvaluator`, `executors.spec.SpecRunner`)."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str] | None, count: int):
        self.pool = WarmPool(command, env=env)
        self.count = count

    def trial(
        self,
        conf: str,
        budget: int | None,
        *,
        record_to: Path | None,
        remedy: bool,
        capture: Path,
        timeout: float | None,
        torch_version: str | None,
        repeat: int,
        ensure_cap: bool,
        pid_file: Path,
        cold: Callable[[], TrialResult],
        on_recorded: Callable[[Path], None] | None = None,
    ) -> TrialResult:
        """The trial through a held process when one waits, else `cold()` (the baseline starts the others)."""
        held = None if remedy else self.pool.take()
        if held is not None:
            result = held.release(
                conf,
                budget,
                timeout=timeout,
                capture=capture,
                torch_version=torch_version,
                repeat=repeat,
                record=record_to,
                ensure_cap=ensure_cap,
                pid_file=pid_file,
                on_recorded=on_recorded,
            )
            if result is not None:
                return result
            self.pool.note = READ_SETTING_NOTE
            self.pool.close()  # the others read it too: the rest of the sweep starts cold
            return cold()
        if record_to is not None and budget is None and self.count:
            self.pool.start_beside(pid_file, self.count)
            self.count = 0
        return cold()

    def close(self) -> str | None:
        """End what is left; why runs were not started ahead, if any were not."""
        self.pool.close()
        return self.pool.note
