"""One trial: run the user's command under an allocator setting and a budget, and say what happened.

The parent never touches CUDA (a context in the parent would hold GPU memory through the
whole sweep); everything measured comes from the agent inside the child, which writes
`report.<pid>.json` files into a fresh trial folder. The runner

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

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from alloctune.agent import BOOTSTRAP, make_site_dir
from alloctune.agent.bootstrap import ENV_VAR
from alloctune.errors import EnvironmentProblem, InputError
from alloctune.run.ports import trial_port_env
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
from alloctune.run.ranks import summarize_ranks
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
from alloctune.units import format_size

CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
KILL_GRACE_S = 5.0
# NVLink multicast (NVLS) off for multi-GPU children by default: trials packed side by side or
# in containers often cannot map multicast objects, and NCCL then fails at init, not for memory.
MULTICAST_OFF = (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"))


# ---- environment ---------------------------------------------------------------------------
def applied_conf(conf: str | None, torch_version: str | None = None) -> str | None:
    """The allocator string as the child will get it: validated and canonical (None = inherit).

    Validation uses the project's grammar for `torch_version` (the default release when
    unknown), so a typo is a one-line `ConfigError` here, not a crash inside the workload.
    """
    if conf is None:
        return None
    from alloctune.config import AllocatorConfig

    if not conf.strip():
        return ""
    parsed = AllocatorConfig.parse(conf, torch_version) if torch_version else AllocatorConfig.parse(conf)
    return parsed.format()


def conf_env(conf: str | None, torch_version: str | None = None) -> dict[str, str | None]:
    """The allocator variables for the child: value to set, or None to remove.

    None = leave the caller's variables alone; "" = the default (both removed, so a value the
    user exported cannot leak into the 'default' trial). Otherwise both names carry the
    canonical string (`AllocatorConfig.to_env`): torch ≤ 2.9 reads only the first, 2.10+
    reads the first one set.
    """
    text = applied_conf(conf, torch_version)
    if text is None:
        return {}
    if not text:
        return {name: None for name in CONF_VARS}
    from alloctune.config import AllocatorConfig

    parsed = AllocatorConfig.parse(text, torch_version) if torch_version else AllocatorConfig.parse(text)
    return dict(parsed.to_env())


def build_env(
    base: Mapping[str, str],
    *,
    conf: str | None,
    agent: Mapping[str, Any],
    site_dir: Path,
    torch_version: str | None = None,
    command: Sequence[str] = (),
) -> dict[str, str]:
    """The child's environment: `base` plus the allocator setting, the agent and a rendezvous port.

    The port (`ports.trial_port_env`, unless `base` or `command` already fixes it) is drawn per
    call, so trials side by side of a distributed job never meet on torch's default 29500.
    """
    env = dict(base)
    for name, value in conf_env(conf, torch_version).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(site_dir) + (os.pathsep + old if old else "")
    env[ENV_VAR] = json.dumps(dict(agent))
    for name, value in MULTICAST_OFF:
        env.setdefault(name, value)  # a value the user exported wins
    env.update(trial_port_env(command, base))
    return env


def resolve_command(command: Sequence[str]) -> list[str]:
    """The command with its program found on PATH; a missing program is a one-line error."""
    if not command:
        raise InputError("no command given: put it after `--`, e.g. alloctune run -- python infer.py")
    prog = command[0]
    if os.sep in prog:
        if not (os.path.isfile(prog) and os.access(prog, os.X_OK)):
            raise EnvironmentProblem(f"command not found or not executable: {prog}")
        return list(command)
    found = shutil.which(prog)
    if found is None:
        raise EnvironmentProblem(f"command not found: {prog} (not on PATH)")
    return [prog, *command[1:]]


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
    after; `check_previous_trial` reads it on resume.
    """
    argv = resolve_command(command)
    conf = applied_conf(conf, torch_version)
    _check_trial_arguments(on_oom, record_max_entries, device, stacks)
    sweep_stale_trial_dirs()
    trial_dir = Path(tempfile.mkdtemp(prefix=TRIAL_PREFIX))
    watch_r = watch_w = -1
    exit_signals = _ExitSignals()
    proc: subprocess.Popen | None = None
    try:
        owner = {"runner_pid": os.getpid(), "pgid": None, "conf": conf, "started": time.time()}
        (trial_dir / OWNER_FILE).write_text(json.dumps(owner))
        # The watchdog pipe: the child's agents read it; only this process holds the write end.
        watch_r, watch_w = os.pipe()
        site = make_site_dir(trial_dir / "site")
        reports_dir = trial_dir / "reports"
        reports_dir.mkdir()
        agent = _agent_settings(reports_dir, conf=conf, budget=budget, ensure_cap=ensure_cap, record=record,
                                record_max_entries=record_max_entries, on_oom=on_oom, oom_dir=oom_dir,
                                device=device, watch_r=watch_r, stacks=stacks, no_grad=no_grad,
                                cudnn_benchmark=cudnn_benchmark, checkpointing=checkpointing)
        child_env = build_env(env if env is not None else os.environ, conf=conf, agent=agent, site_dir=site,
                              torch_version=torch_version, command=argv)
        log_path = Path(capture) if capture else None
        out = open(log_path, "wb") if log_path else None
        t0 = time.monotonic()
        timed_out = False
        exit_signals.install()
        try:
            with exit_signals.deferred():
                proc = _start_child(argv, child_env, cwd, out, stdout_to_stderr, watch_r)
            os.close(watch_r)
            watch_r = -1
            owner["pgid"] = proc.pid
            (trial_dir / OWNER_FILE).write_text(json.dumps(owner))
            if pid_file is not None:
                Path(pid_file).write_text(json.dumps(owner))
            timed_out = _wait_for_child(proc, timeout, kill_grace, exit_signals)
        finally:
            if proc is not None:
                _reap_group(proc.pid)  # every way out: nothing of the trial outlives it
            exit_signals.restore()
            if out:
                out.close()
        wall = time.monotonic() - t0
        reports = read_reports(reports_dir)
        return _result(argv, conf, budget, proc.returncode, timed_out, wall, reports, log_path, repeat)
    finally:
        for fd in (watch_r, watch_w):
            if fd >= 0:
                os.close(fd)
        if pid_file is not None:
            Path(pid_file).unlink(missing_ok=True)
        shutil.rmtree(trial_dir, ignore_errors=True)


STACKS = ("python", "all", "none")


def _check_trial_arguments(on_oom: str | None, record_max_entries: int | None, device: int | None,
                           stacks: str | None = None) -> None:
    """The arguments a user can get wrong, refused before anything starts."""
    if stacks is not None and stacks not in STACKS:
        raise InputError(f"--stacks {stacks!r} is not known: use one of {', '.join(STACKS)}")
    if on_oom not in (None, "snapshot"):
        raise InputError(f"--on-oom {on_oom!r} is not known: use --on-oom snapshot")
    if record_max_entries is not None and record_max_entries < 1:
        raise InputError(f"--max-entries must be at least 1, got {record_max_entries}")
    if device is not None and device < 0:
        raise InputError(f"--device must be a CUDA device index (0, 1, ...), got {device}")


def _agent_settings(reports_dir: Path, *, conf: str | None, budget: int | None, ensure_cap: bool,
                    record: str | os.PathLike | None, record_max_entries: int | None, on_oom: str | None,
                    oom_dir: str | os.PathLike | None, device: int | None, watch_r: int,
                    stacks: str | None = None, no_grad: bool = False,
                    cudnn_benchmark: bool | None = None, checkpointing: bool = False) -> dict[str, Any]:
    """What the agent inside the child is told (`ALLOCTUNE_AGENT`): where to report, what to apply."""
    agent: dict[str, Any] = {
        "report_dir": str(reports_dir),
        "bootstrap": str(BOOTSTRAP),
        "budget": budget,
        "ensure_cap": ensure_cap,
        "record": str(Path(record).resolve()) if record else None,
        "on_oom": on_oom,
        "oom_dir": str(Path(oom_dir or ".").resolve()) if on_oom else None,
        "conf": conf,
        "device": device,
    }
    if record_max_entries is not None:
        agent["record_max_entries"] = int(record_max_entries)
    if stacks is not None:
        agent["stacks"] = stacks
    if no_grad:
        agent["no_grad"] = True
    if cudnn_benchmark is not None:
        agent["cudnn_benchmark"] = bool(cudnn_benchmark)
    if checkpointing:
        agent["checkpointing"] = True
    agent.update(watch_fd=watch_r, watch_ino=os.fstat(watch_r).st_ino, runner_pid=os.getpid())
    return agent


def _start_child(argv: list[str], child_env: Mapping[str, str], cwd: str | os.PathLike | None, out: Any,
                 stdout_to_stderr: bool, watch_r: int) -> subprocess.Popen:
    """Start the command in its own session (Windows: its own process group), dying with alloctune; a
    command that cannot start is exit 2."""
    try:
        return subprocess.Popen(
            argv,
            env=child_env,
            cwd=cwd,
            stdout=out if out else (_stderr_fd() if stdout_to_stderr else None),
            stderr=subprocess.STDOUT if out else None,
            stdin=subprocess.DEVNULL if out else None,
            **child_start_options(os.getpid(), watch_r),
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        raise EnvironmentProblem(f"cannot start {argv[0]}: {exc.strerror or exc}") from None


def _wait_for_child(proc: subprocess.Popen, timeout: float | None, kill_grace: float,
                    exit_signals: _ExitSignals) -> bool:
    """Wait for the child (listed as running meanwhile); True when it ran past `timeout` and was killed.

    Ctrl-C, SIGTERM or SIGHUP to alloctune kill the child's group and propagate."""
    with _RUNNING_LOCK:
        _RUNNING.add(proc)
    try:
        exit_signals.raise_missed()  # one that arrived while Popen forked
        proc.wait(timeout=timeout)
        exit_signals.raise_missed()
        return False
    except subprocess.TimeoutExpired:
        _kill_group(proc, kill_grace)
        return True
    except BaseException:  # Ctrl-C, SIGTERM, SIGHUP: the child is in its own session
        _kill_group(proc, min(kill_grace, 3.0), first=(signal.SIGINT,))
        raise
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)


def _result(
    argv: list[str],
    conf: str | None,
    budget: int | None,
    exit_code: int | None,
    timed_out: bool,
    wall: float,
    reports: list[dict[str, Any]],
    log_path: Path | None,
    repeat: int,
) -> TrialResult:
    outcome, reason = classify(exit_code, timed_out, reports)
    # The process that used the GPU most speaks for the trial (torchrun: the busiest rank).
    cuda = [r for r in reports if r.get("cuda_initialized")] or reports
    main = max(cuda, key=lambda r: (r.get("stats") or {}).get("reserved_bytes.all.peak", 0), default={})
    stats = main.get("stats") or {}
    text = _tail(log_path, 200_000) if log_path else ""
    throughput, unit = parse_throughput(text)
    error = reason
    if outcome == "crash" and log_path and (reason is None or reason.startswith("exit code")):
        error = _last_line(text) or reason
    settings = main.get("allocator_settings")
    warnings = settings_mismatch(conf, settings) if outcome in ("ok", "oom") else []
    oom_message = next((r.get("oom_message") for r in reports if r.get("oom_message")), None)
    if outcome == "oom" and oom_message is None:
        last = next((r.get("last_oom") for r in reports if r.get("last_oom")), None)
        if last:
            oom_message = (
                f"CUDA out of memory (observer): tried to allocate {format_size(last['alloc_size'])}, "
                f"limit {format_size(last['limit'])}"
            )
    seg = main.get("segment_sizes")
    return TrialResult(
        command=tuple(argv),
        conf=conf,
        budget=budget,
        outcome=outcome,
        exit_code=exit_code,
        wall_s=round(wall, 3),
        **memory_fields(stats),
        allocator_settings=settings,
        oom_message=oom_message,
        error=error,
        throughput=throughput,
        throughput_unit=unit,
        total_memory=main.get("total_memory"),
        device_name=main.get("device_name"),
        torch_version=main.get("torch_version"),
        snapshot=main.get("snapshot"),
        oom_snapshot=main.get("oom_snapshot"),
        segment_sizes=tuple((int(s), int(c)) for s, c in seg) if seg else None,
        stats=dict(stats),
        processes=len(reports),
        warnings=tuple(warnings),
        repeat=repeat,
        log=str(log_path) if log_path else None,
        ranks=tuple(r.to_dict() for r in summarize_ranks(reports)),
        autograd=main.get("autograd"),
        no_grad=bool(main.get("no_grad")),
        cudnn_benchmark=main.get("cudnn_benchmark"),
        cudnn_benchmark_set=main.get("cudnn_benchmark_set"),
        checkpointing=tuple(str(x) for x in main["checkpointing"]) if isinstance(main.get("checkpointing"), list) else None,
    )


class TrialEvaluator:
    """The GPU evaluator for `alloctune tune`: one `run_trial` per call, logs kept per trial.

    `workdir` receives `logs/trial-NNNN.log` (the child's output, where throughput is read)
    and `baseline.pickle` (the recorded history of the `record=True` trial). Trials after
    the first recorded one get `timeout` or, if none was given, five times the baseline's
    wall time (at least 60 s), so a hang under a tight budget cannot stall a sweep.
    """

    def __init__(self, command: Sequence[str], workdir: str | os.PathLike, *, timeout: float | None = None,
                 env: Mapping[str, str] | None = None):
        self.command = list(command)
        self.workdir = Path(workdir)
        self.timeout = timeout
        self.env = env
        self.count = 0
        self._count_lock = threading.Lock()  # executors may call one evaluator from several threads
        self.torch_version: str | None = None
        self._baseline_wall: float | None = None
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        # An earlier sweep's trial still on the GPU: say so (one pid file per running trial, since
        # an executor may run several at once).
        for pid_file in sorted(self.workdir.glob("running*.json")):
            check_previous_trial(pid_file)

    def cancel(self) -> None:
        """Stop the trials running now (a parallel executor calls this on Ctrl-C)."""
        terminate_running()

    def _timeout(self) -> float | None:
        if self.timeout is not None:
            return self.timeout
        if self._baseline_wall is None:
            return 3600.0
        return max(60.0, 5 * self._baseline_wall)

    def __call__(self, conf: str, budget: int | None, *, repeat: int = 0, record: bool = False,
                 ensure_cap: bool = False, no_grad: bool = False,
                 cudnn_benchmark: bool | None = None, checkpointing: bool = False) -> TrialResult:
        with self._count_lock:
            self.count += 1
            number = self.count
        result = run_trial(
            self.command,
            conf=conf,
            budget=budget,
            # a capped recorded trial (tune's calibration) must not overwrite the baseline's history
            record=(self.workdir / ("baseline.pickle" if budget is None else f"capped-{self.count:04d}.pickle")
                    if record else None),
            timeout=self._timeout(),
            capture=self.workdir / "logs" / f"trial-{number:04d}.log",
            ensure_cap=ensure_cap,
            repeat=repeat,
            torch_version=self.torch_version,
            env=self.env,
            no_grad=no_grad,
            cudnn_benchmark=cudnn_benchmark,
            checkpointing=checkpointing,
            pid_file=self.workdir / f"running-{number:04d}.json",
        )
        if record and budget is None and result.outcome in ("ok", "oom"):
            self._baseline_wall = result.wall_s
        if result.torch_version and self.torch_version is None:
            self.torch_version = result.torch_version.split("+")[0]
        return result
