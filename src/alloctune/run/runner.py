"""One trial: run the user's command under an allocator setting and a budget, and say what happened.

The parent never touches CUDA (a context in the parent would hold GPU memory through the
whole sweep); everything measured comes from the agent inside the child, which writes
`report.<pid>.json` files into a fresh trial folder. The runner (its pieces in `child.py`, shared
with the trials `warm.py` starts ahead)

1. validates the command (missing → `EnvironmentProblem`, exit 2),
2. builds the child's environment: the allocator string in `PYTORCH_CUDA_ALLOC_CONF` and
   `PYTORCH_ALLOC_CONF` (or both removed for the default), our `sitecustomize` folder first
   on `PYTHONPATH`, the agent's settings in `ALLOCTUNE_AGENT`, a free rendezvous port of the
   trial's own in `PET_MASTER_PORT`/`MASTER_PORT` (`ports.py`),
3. starts the command in its own session / process group and kills the whole group on
   every way out: the timeout (SIGTERM, then SIGKILL after a grace period), Ctrl-C, SIGTERM
   or SIGHUP to alloctune, and a normal exit (stragglers the command left behind). If
   alloctune itself is killed (SIGKILL leaves no way out), the workload dies with it: the
   direct child has PR_SET_PDEATHSIG (Linux), and the agent in every Python process of the
   trial watches a pipe whose other end only alloctune holds (`agent/watchdog.py`) -- process control lives in `process.py`,
4. leaves `owner.json` in its trial folder, so a later run removes folders whose owner
   died, and, when asked (`pid_file`), a pid file that `--resume` uses to report a trial of
   an earlier sweep that is still running (and holding the GPU),
5. reads the reports and classifies the trial (`reports.py`): `ok`, `oom`, `crash`, `timeout`, `no-cuda`
   (or `budget-too-large`, which the CLI turns into a one-line error).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from alloctune.run.child import (  # noqa: F401 (re-exported: the runner's public face)
    CONF_VARS,
    KILL_GRACE_S,
    MULTICAST_OFF,
    STACKS,
    TrialFolder,
    _agent_settings,
    _check_trial_arguments,
    _result,
    _start_child,
    _wait_for_child,
    applied_conf,
    build_env,
    conf_env,
    recording_watch,
    resolve_command,
)
from alloctune.run.process import (  # noqa: F401 (check_previous_trial.. re-exported: the runner's public face)
    _RUNNING,
    _RUNNING_LOCK,
    OWNER_FILE,
    TRIAL_PREFIX,
    _die_with_parent,
    _ExitSignals,
    _kill_group,
    _reap_group,
    _stderr_fd,
    check_previous_trial,
    child_start_options,
    group_alive,
    pid_alive,
    sweep_stale_trial_dirs,
    terminate_running,
)
from alloctune.run.reports import (  # noqa: F401 (re-exported: tests and executors import them from here)
    _knobs,
    _last_line,
    _no_cuda_reason,
    _tail,
    classify,
    memory_fields,
    parse_throughput,
    read_reports,
    settings_mismatch,
)
from alloctune.run.trial import OUTCOMES, RESULT_SCHEMA, TrialResult, raise_for_environment  # noqa: F401 (re-exported)


# ---- the trial -----------------------------------------------------------------------------------
def run_trial(
    command: Sequence[str],
    *,
    conf: str | None = None,
    budget: int | None = None,
    record: str | os.PathLike | None = None,
    record_max_entries: int | None = None,
    stacks: str | None = None,
    no_grad: bool = False,
    cudnn_benchmark: bool | None = None,
    checkpointing: bool = False,
    device: int | None = None,
    on_oom: str | None = None,
    oom_dir: str | os.PathLike | None = None,
    timeout: float | None = None,
    capture: str | os.PathLike | None = None,
    ensure_cap: bool = False,
    repeat: int = 0,
    torch_version: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    kill_grace: float = KILL_GRACE_S,
    stdout_to_stderr: bool = False,
    pid_file: str | os.PathLike | None = None,
    on_recorded: Callable[[Path], None] | None = None,
) -> TrialResult:
    """Run `command` once and return its evidence. Raises only for a missing command.

    `capture`: file that receives the child's stdout and stderr (the terminal otherwise);
    throughput is read from it; `stdout_to_stderr` keeps our stdout clean for `--json`.
    `record`: write the full allocator history there (`{pid}` in the name: one file per
    process; `TrialResult.snapshot` names the busiest process's); `record_max_entries`:
    events kept (oldest dropped; None = the agent's default, 5,000,000); `stacks`: frames kept
    with each allocation of a recorded history ("python", the agent's default; "all"; "none").
    `no_grad`: the agent switches autograd off in the program (opt-in; measures what
    `torch.no_grad()` would save an inference program; a program that trains then fails).
    `cudnn_benchmark`: the agent sets `torch.backends.cudnn.benchmark` to it at torch import (opt-in;
    None leaves the program's own choice).
    `checkpointing`: the agent switches activation checkpointing on in the first model the program
    trains (opt-in; `agent.checkpointing`; the checkpointing remedy's confirming run).
    `device`: the CUDA device the agent measures and caps (None = LOCAL_RANK's or the current).
    `on_oom="snapshot"`: keep a bounded history and dump it into `oom_dir` (default: the
    current directory) as `oom-snapshot.<pid>.pickle` when the allocator runs out of memory.
    `pid_file`: written while the child runs (runner pid, process group, conf) and removed
    after; `check_previous_trial` reads it on resume. `on_recorded(path)`: `child.RecordingWatch`.
    """
    argv = resolve_command(command)
    conf = applied_conf(conf, torch_version)
    _check_trial_arguments(on_oom, record_max_entries, device, stacks)
    sweep_stale_trial_dirs()
    folder = TrialFolder(conf)
    exit_signals = _ExitSignals()
    proc: subprocess.Popen | None = None
    try:
        agent = _agent_settings(
            folder.reports,
            conf=conf,
            budget=budget,
            ensure_cap=ensure_cap,
            record=record,
            record_max_entries=record_max_entries,
            on_oom=on_oom,
            oom_dir=oom_dir,
            device=device,
            watch_r=folder.watch_r,
            stacks=stacks,
            no_grad=no_grad,
            cudnn_benchmark=cudnn_benchmark,
            checkpointing=checkpointing,
        )
        child_env = build_env(
            env if env is not None else os.environ,
            conf=conf,
            agent=agent,
            site_dir=folder.site,
            torch_version=torch_version,
            command=argv,
        )
        log_path = Path(capture) if capture else None
        out = open(log_path, "wb") if log_path else None
        t0 = time.monotonic()
        exit_signals.install()
        try:
            with exit_signals.deferred():
                proc = _start_child(argv, child_env, cwd, out, stdout_to_stderr, folder.watch_r)
            folder.started(proc.pid, pid_file)
            timed_out = _wait_for_child(proc, timeout, kill_grace, exit_signals, recording_watch(record, on_recorded))
        finally:
            if proc is not None:
                _reap_group(proc.pid)  # every way out: nothing of the trial outlives it
            exit_signals.restore()
            if out:
                out.close()
        wall = time.monotonic() - t0
        reports = read_reports(folder.reports)
        return _result(argv, conf, budget, proc.returncode, timed_out, wall, reports, log_path, repeat)
    finally:
        folder.close()
        if pid_file is not None:
            Path(pid_file).unlink(missing_ok=True)


class TrialEvaluator:
    """The GPU evaluator for `alloctune tune`: one `run_trial` per call, logs kept per trial.

    `workdir` receives `logs/trial-NNNN.log` (the child's output, where throughput is read)
    and `baseline.pickle` (the recorded history of the `record=True` trial). Trials after
    the first recorded one get `timeout` or, if none was given, five times the baseline's
    wall time (at least 60 s), so a hang under a tight budget cannot stall a sweep.
    `on_recorded(path)`: told of each recording as soon as it is written whole, while its run
    still exits (tune starts loading it there: `trace.prefetch_trace`).
    """

    def __init__(
        self,
        command: Sequence[str],
        workdir: str | os.PathLike,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        on_recorded: Callable[[Path], None] | None = None,
    ):
        self.command = list(command)
        self.workdir = Path(workdir)
        self.timeout = timeout
        self.env = env
        self.on_recorded = on_recorded
        self.count = 0
        self._count_lock = threading.Lock()  # executors may call one evaluator from several threads
        self.torch_version: str | None = None
        self._baseline_wall: float | None = None
        self.ahead: Any = None  # a `run.warm.Ahead` once `start_ahead` asked for one
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        # An earlier sweep's trial still on the GPU: say so (one pid file per running trial, since
        # an executor may run several at once).
        for pid_file in sorted(self.workdir.glob("running*.json")):
            check_previous_trial(pid_file)

    def cancel(self) -> None:
        """Stop the trials running now (a parallel executor calls this on Ctrl-C)."""
        terminate_running()

    def start_ahead(self, count: int) -> None:
        """Start the processes of the next `count` trials while the recorded baseline runs, held at their
        first CUDA call (`run.warm`); setting trials after it take them. `close_ahead` ends what is left."""
        from alloctune.run.warm import Ahead

        self.ahead = Ahead(self.command, self.env, count)

    def close_ahead(self) -> str | None:
        return self.ahead.close() if self.ahead is not None else None

    def _timeout(self) -> float | None:
        if self.timeout is not None:
            return self.timeout
        if self._baseline_wall is None:
            return 3600.0
        return max(60.0, 5 * self._baseline_wall)

    def __call__(
        self,
        conf: str,
        budget: int | None,
        *,
        repeat: int = 0,
        record: bool = False,
        ensure_cap: bool = False,
        no_grad: bool = False,
        cudnn_benchmark: bool | None = None,
        checkpointing: bool = False,
    ) -> TrialResult:
        with self._count_lock:
            self.count += 1
            number = self.count
        # a capped recorded trial (tune's calibration) must not overwrite the baseline's history
        record_to = self.workdir / ("baseline.pickle" if budget is None else f"capped-{number:04d}.pickle") if record else None
        capture = self.workdir / "logs" / f"trial-{number:04d}.log"
        pid_file = self.workdir / f"running-{number:04d}.json"
        timeout = self._timeout()

        def cold() -> TrialResult:
            return run_trial(
                self.command,
                conf=conf,
                budget=budget,
                record=record_to,
                timeout=timeout,
                capture=capture,
                ensure_cap=ensure_cap,
                repeat=repeat,
                torch_version=self.torch_version,
                env=self.env,
                no_grad=no_grad,
                cudnn_benchmark=cudnn_benchmark,
                checkpointing=checkpointing,
                pid_file=pid_file,
                on_recorded=self.on_recorded,
            )

        result = (
            cold()
            if self.ahead is None
            else self.ahead.trial(
                conf,
                budget,
                record_to=record_to,
                remedy=no_grad or cudnn_benchmark is not None or checkpointing,
                capture=capture,
                timeout=timeout,
                torch_version=self.torch_version,
                repeat=repeat,
                ensure_cap=ensure_cap,
                pid_file=pid_file,
                cold=cold,
                on_recorded=self.on_recorded,
            )
        )
        if record and budget is None and result.outcome in ("ok", "oom"):
            self._baseline_wall = result.wall_s
        if result.torch_version and self.torch_version is None:
            self.torch_version = result.torch_version.split("+")[0]
        return result
