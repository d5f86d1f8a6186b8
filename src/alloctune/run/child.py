"""A trial's child process: its environment, its start, the wait for it, and what its reports say.

Split from `runner.py` so that both ways a trial starts use the same pieces: started now
(`runner.run_trial`) or started ahead and released later (`warm.WarmTrial`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from alloctune.agent import BOOTSTRAP, make_site_dir
from alloctune.agent.bootstrap import ENV_VAR
from alloctune.errors import EnvironmentProblem, InputError
from alloctune.run.ports import trial_port_env
from alloctune.run.process import (
    _RUNNING,
    _RUNNING_LOCK,
    OWNER_FILE,
    TRIAL_PREFIX,
    _ExitSignals,
    _kill_group,
    _stderr_fd,
    child_start_options,
)
from alloctune.run.ranks import summarize_ranks
from alloctune.run.reports import _last_line, _tail, classify, memory_fields, parse_throughput, settings_mismatch
from alloctune.run.trial import TrialResult, remedy_switches
from alloctune.units import format_size


class TrialFolder:
    """A trial's fresh folder and the watchdog pipe of its child: `owner.json` (so a later run removes
    the folder of a dead owner, `process.sweep_stale_trial_dirs`), the agent's site folder (`site`) and
    report folder (`reports`). The child's agents read the pipe; only this process holds its write end.
    `close` ends both, on every way out of the trial."""

    def __init__(self, conf: str | None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=TRIAL_PREFIX))
        self.owner: dict[str, Any] = {"runner_pid": os.getpid(), "pgid": None, "conf": conf, "started": time.time()}
        self.watch_r = self.watch_w = -1
        try:
            self.write_owner()
            self.watch_r, self.watch_w = os.pipe()
            self.site = make_site_dir(self.path / "site")
            self.reports = self.path / "reports"
            self.reports.mkdir()
        except BaseException:
            self.close()
            raise

    def write_owner(self, pid_file: str | os.PathLike | None = None) -> None:
        """`owner.json`, and the same in `pid_file` (read by `check_previous_trial` on resume) when given."""
        text = json.dumps(self.owner)
        (self.path / OWNER_FILE).write_text(text)
        if pid_file is not None:
            Path(pid_file).write_text(text)

    def started(self, pid: int, pid_file: str | os.PathLike | None = None) -> None:
        """The child runs: the read end is its own now, and the owner names its process group."""
        self.close_read()
        self.owner["pgid"] = pid
        self.write_owner(pid_file)

    def close_read(self) -> None:
        if self.watch_r >= 0:
            os.close(self.watch_r)
            self.watch_r = -1

    def close(self) -> None:
        self.close_read()
        if self.watch_w >= 0:
            os.close(self.watch_w)
            self.watch_w = -1
        shutil.rmtree(self.path, ignore_errors=True)


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


STACKS = ("python", "all", "none")


def _check_trial_arguments(
    on_oom: str | None, record_max_entries: int | None, device: int | None, stacks: str | None = None
) -> None:
    """The arguments a user can get wrong, refused before anything starts."""
    if stacks is not None and stacks not in STACKS:
        raise InputError(f"--stacks {stacks!r} is not known: use one of {', '.join(STACKS)}")
    if on_oom not in (None, "snapshot"):
        raise InputError(f"--on-oom {on_oom!r} is not known: use --on-oom snapshot")
    if record_max_entries is not None and record_max_entries < 1:
        raise InputError(f"--max-entries must be at least 1, got {record_max_entries}")
    if device is not None and device < 0:
        raise InputError(f"--device must be a CUDA device index (0, 1, ...), got {device}")


def _agent_settings(
    reports_dir: Path,
    *,
    conf: str | None,
    budget: int | None,
    ensure_cap: bool,
    record: str | os.PathLike | None,
    record_max_entries: int | None,
    on_oom: str | None,
    oom_dir: str | os.PathLike | None,
    device: int | None,
    watch_r: int,
    stacks: str | None = None,
    no_grad: bool = False,
    cudnn_benchmark: bool | None = None,
    checkpointing: bool = False,
) -> dict[str, Any]:
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
    agent.update(remedy_switches(no_grad, cudnn_benchmark, checkpointing))
    agent.update(watch_fd=watch_r, watch_ino=os.fstat(watch_r).st_ino, runner_pid=os.getpid())
    return agent


def _start_child(
    argv: list[str], child_env: Mapping[str, str], cwd: str | os.PathLike | None, out: Any, stdout_to_stderr: bool, watch_r: int
) -> subprocess.Popen:
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


# A recorded run's recording is looked for this often while the child runs (`RecordingWatch`).
WATCH_POLL_S = 0.02


class RecordingWatch:
    """A recording file to watch for while its run goes on, and whom to tell once it is there.

    The agent writes a recording whole under its final name (a rename), at the program's end; the
    child then still tears down. `on_ready(path)` (tune's: `trace.prefetch_trace`) can use that time."""

    def __init__(self, path: str | os.PathLike[str], on_ready: Callable[[Path], None]) -> None:
        self.path = Path(path)
        self.on_ready = on_ready
        self._before = self._version()  # a file of an earlier run under this name is not the recording

    def _version(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def wait(self, proc: subprocess.Popen, timeout: float | None) -> None:
        """`proc.wait(timeout)`, calling `on_ready` once, as soon as the run's file is there."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            version = self._version()
            if version is not None and version != self._before:
                try:
                    self.on_ready(self.path)
                except Exception:  # noqa: BLE001 - an early start only saves time; the run goes on
                    pass
                proc.wait(timeout=None if left is None else max(left, 0.0))
                return
            try:
                proc.wait(timeout=WATCH_POLL_S if left is None else max(0.0, min(WATCH_POLL_S, left)))
                return
            except subprocess.TimeoutExpired:
                if left is not None and left <= WATCH_POLL_S:
                    raise


def recording_watch(record: str | os.PathLike[str] | None, on_ready: Callable[[Path], None] | None) -> RecordingWatch | None:
    """The watch of a trial's recording, where there is one file to watch and someone to tell."""
    if record is None or on_ready is None or "{" in str(record):
        return None  # `{pid}`/`{rank}` names are the agent's to fill
    return RecordingWatch(record, on_ready)


def _wait_for_child(
    proc: subprocess.Popen,
    timeout: float | None,
    kill_grace: float,
    exit_signals: _ExitSignals,
    watch: RecordingWatch | None = None,
) -> bool:
    """Wait for the child (listed as running meanwhile); True when it ran past `timeout` and was killed.

    Ctrl-C, SIGTERM or SIGHUP to alloctune kill the child's group and propagate."""
    with _RUNNING_LOCK:
        _RUNNING.add(proc)
    try:
        exit_signals.raise_missed()  # one that arrived while Popen forked
        if watch is None:
            proc.wait(timeout=timeout)
        else:
            watch.wait(proc, timeout)
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
