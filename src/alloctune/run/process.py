"""The processes of one trial: start them so they cannot outlive alloctune, end them all on every way out.

A trial is the runner's direct child (the trial's root) and every process under it. This module
owns what ending all of them takes, and nothing here reads a report or knows an outcome:

- the options that start the root (`child_start_options`): its own session on POSIX, a new process
  group on Windows (`CREATE_NEW_PROCESS_GROUP`: Ctrl-Break reaches the trial, not alloctune), and
  on Linux `PR_SET_PDEATHSIG`, so a root without the agent dies with alloctune even by SIGKILL
  (where the agent runs, its watchdog ends the whole trial instead, `agent/watchdog.py`);
- stopping the trial (`_kill_group`): an interrupt if asked, SIGTERM (the agent writes its report),
  then a hard kill, each after a grace period without an exit, and nothing left once the root exits;
- Ctrl-C / SIGTERM / SIGHUP raised once and never lost while `Popen` forks; the trials running now
  (a parallel executor stops them all on Ctrl-C); trial folders and pid files an earlier alloctune
  left behind.

Every process of a trial is reached two ways. The tree (psutil, every platform): the root and its
descendants, each known by pid *and* creation time, so a reused pid is never taken for a process
of the trial; on Windows, where a dead parent's children keep its pid as their parent, the tree
still finds them. The process group (POSIX only, besides the tree): `killpg` also reaches what
was reparented when its parent exited. `ALLOCTUNE_PORTABLE_PROCESS=1` switches the POSIX-only
means off (groups, PR_SET_PDEATHSIG, the watch pipe), so tests on Linux run the Windows path.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil

from alloctune.agent.watchdog import PORTABLE_ENV, birth, pid_alive, portable, trial_tree  # noqa: F401 (re-exported)
from alloctune.errors import EnvironmentProblem

# time.time() taken before a start and psutil's creation time of the process started then differ
# by up to this much (psutil counts from the boot time, in whole seconds on Linux).
CLOCK_SLACK_S = 2.0
REAP_ROUNDS = 3  # hard-kill passes at the end: a process started during one is caught by the next


def _stderr_fd() -> int:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a test harness: the real one
        return sys.__stderr__.fileno() if sys.__stderr__ else subprocess.DEVNULL


def _groups() -> bool:
    """Whether POSIX process groups are used besides the tree (not on Windows, not when portable)."""
    return not portable()


# ---- starting a trial ----------------------------------------------------------------------------
PR_SET_PDEATHSIG = 1
TRIAL_PREFIX = "alloctune-trial-"
OWNER_FILE = "owner.json"


def child_start_options(parent: int, watch_fd: int) -> dict[str, Any]:
    """The `subprocess.Popen` keywords that start a trial's root on this platform.

    POSIX: its own session (the group `killpg` reaches), the watchdog pipe's read end inherited,
    and the parent-death signal (Linux). Windows: a new process group, and nothing POSIX-only
    (`Popen` refuses `pass_fds` and `preexec_fn` there; the agent checks the runner's pid instead).
    Portable mode on POSIX keeps the session (Windows' new group) and drops the rest."""
    if os.name == "nt":
        return {"creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}
    if portable():
        return {"start_new_session": True}
    return {"start_new_session": True, "pass_fds": (watch_fd,) if watch_fd >= 0 else (), "preexec_fn": _die_with_parent(parent)}


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """A preexec function: the child gets SIGKILL when alloctune dies (Linux), or None elsewhere
    and in portable mode (where the agent's watchdog alone ends the trial)."""
    if not sys.platform.startswith("linux") or portable():
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # alloctune died between fork and prctl
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


# ---- the trials running now, and their roots' identities -------------------------------------
# Creation time of each trial's root, from when the runner lists it as running until
# `_reap_group` has ended what is left of it: once its exit is collected its pid may be reused.
_BORN: dict[int, float | None] = {}


class _RunningTrials(set[subprocess.Popen]):
    """The trials running now (the runner adds each once started, under `_RUNNING_LOCK`); adding
    one notes its root's creation time, taken while its exit is not collected yet, so the pid is
    still its own."""

    def add(self, proc: subprocess.Popen) -> None:
        super().add(proc)
        _BORN[proc.pid] = birth(proc.pid)


_RUNNING: _RunningTrials = _RunningTrials()
_RUNNING_LOCK = threading.Lock()


def _root_birth(proc: subprocess.Popen) -> float | None:
    with _RUNNING_LOCK:
        if proc.pid in _BORN:
            return _BORN[proc.pid]
    return birth(proc.pid) if proc.returncode is None else None


# ---- stopping a trial ------------------------------------------------------------------------
INTERRUPT, TERMINATE, KILL = "interrupt", "terminate", "kill"
_POSIX_SIGNAL = {INTERRUPT: "SIGINT", TERMINATE: "SIGTERM", KILL: "SIGKILL"}


def _kill_group(proc: subprocess.Popen, grace: float, first: tuple[signal.Signals, ...] = ()) -> None:
    """Stop every process of the trial rooted at `proc`: `first` signals (SIGINT: an interrupt),
    SIGTERM, then a hard kill, each after `grace` s without an exit (the agent writes its report
    on SIGTERM). Once the root has exited, nothing of the trial survives it: the hard kill also
    reaches every process seen in an earlier step (on POSIX the root's orphans leave its tree)."""
    born = _root_birth(proc)
    seen: dict[int, psutil.Process] = {}
    steps = [(INTERRUPT if sig == signal.SIGINT else TERMINATE, grace) for sig in first]
    for step, wait in steps + [(TERMINATE, grace), (KILL, 10.0)]:
        _signal_trial(proc.pid, born, step, seen)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        _signal_trial(proc.pid, born, KILL, seen)  # the root is gone: no straggler survives it
        return


def _signal_trial(root: int, born: float | None, step: str, seen: dict[int, psutil.Process]) -> None:
    """One step to every process of the trial: to its group (POSIX), and through the tree to each
    process outside that group (its own session, or no group at all: Windows, portable mode).
    `seen` gathers the tree's processes; a hard kill goes to all of them (psutil refuses a pid
    that now names another process)."""
    tree = trial_tree(root, born) if born is not None else []  # unknown identity: the group alone
    if step == KILL:
        tree = list({p.pid: p for p in list(seen.values()) + tree}.values())
    seen.update((p.pid, p) for p in tree)
    if _groups():
        try:
            os.killpg(root, getattr(signal, _POSIX_SIGNAL[step]))
        except OSError:
            pass
        tree = [p for p in tree if _pgid(p.pid) not in (root, None)]
    for proc in tree:
        _send(proc, step, is_root=proc.pid == root)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _send(proc: psutil.Process, step: str, *, is_root: bool) -> None:
    """One step to one process. Windows has no SIGINT for another process: an interrupt is
    Ctrl-Break to the root's process group (the root leads one: `child_start_options`);
    terminate and kill both end the process."""
    try:
        if os.name != "nt":
            proc.send_signal(getattr(signal, _POSIX_SIGNAL[step]))
        elif step == INTERRUPT:
            if is_root:
                proc.send_signal(signal.CTRL_BREAK_EVENT)  # type: ignore[attr-defined]
        elif step == TERMINATE:
            proc.terminate()
        else:
            proc.kill()
    except (psutil.Error, OSError, ValueError):
        pass


def _reap_group(pgid: int) -> None:
    """Hard-kill whatever is left of the trial rooted at `pgid` (every way out of a trial ends here)."""
    with _RUNNING_LOCK:
        born = _BORN.pop(pgid, None)
    if _groups():
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    if born is None:
        return  # the root's identity is unknown: its pid alone may now name another process
    for _ in range(REAP_ROUNDS):
        left = [p for p in trial_tree(pgid, born) if _running(p)]
        if not left:
            return
        for proc in left:
            _send(proc, KILL, is_root=proc.pid == pgid)
        psutil.wait_procs(left, timeout=1.0)


# ---- no orphans ----------------------------------------------------------------------------------
def group_alive(pgid: int, started: float | None = None) -> bool:
    """Whether any process of the trial rooted at `pgid` (on POSIX: of process group `pgid`) still
    runs; zombies do not count. `started`: when the trial was started (`owner.json`), so a process
    older than that holding the root's pid is not taken for it."""
    earliest = None if started is None else started - CLOCK_SLACK_S
    if any(_running(p) for p in trial_tree(pgid, earliest, exact=False)):
        return True
    if not _groups():
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    for proc in psutil.process_iter():
        if _pgid(proc.pid) == pgid and _running(proc):
            return True
    return False


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, OSError):
        return True


def _runner_alive(owner: dict[str, Any]) -> bool:
    """Whether the alloctune that wrote `owner` (an `owner.json` or pid file) still runs: its pid
    is alive and was created before the trial it started (not a later reuse of the pid)."""
    try:
        pid = int(owner.get("runner_pid", -1))
    except (TypeError, ValueError):
        return False
    if not pid_alive(pid):
        return False
    started, created = owner.get("started"), birth(pid)
    return not (isinstance(started, (int, float)) and created is not None and created > started + CLOCK_SLACK_S)


def _started(owner: dict[str, Any]) -> float | None:
    started = owner.get("started")
    return float(started) if isinstance(started, (int, float)) else None


def sweep_stale_trial_dirs(tmp: str | os.PathLike | None = None, older_than_s: float = 86400.0) -> int:
    """Remove trial folders whose alloctune died without cleaning up; returns how many.

    A folder with `owner.json` goes once its owner and its trial's processes are gone; one
    without (an older alloctune) once it is a day old.
    """
    removed = 0
    root = Path(tmp or tempfile.gettempdir())
    try:
        candidates = [p for p in root.iterdir() if p.name.startswith(TRIAL_PREFIX)][:200]
    except OSError:
        return 0
    now = time.time()
    for folder in candidates:
        try:
            owner = json.loads((folder / OWNER_FILE).read_text())
            stale = not _runner_alive(owner) and not (
                isinstance(owner.get("pgid"), int) and group_alive(owner["pgid"], _started(owner))
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            try:
                stale = now - folder.stat().st_mtime > older_than_s
            except OSError:
                continue
        if stale:
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


def check_previous_trial(pid_file: str | os.PathLike) -> None:
    """On resume: a trial of an earlier sweep still running is a one-line error; a dead one's file goes.

    Raises `EnvironmentProblem` naming its process group (it may hold the GPU, which would
    make every measurement of this sweep wrong).
    """
    path = Path(pid_file)
    try:
        info = json.loads(path.read_text())
        pgid = int(info["pgid"])
    except FileNotFoundError:
        return
    except (OSError, ValueError, KeyError, TypeError):
        path.unlink(missing_ok=True)
        return
    if group_alive(pgid, _started(info)):
        who = "whose alloctune is still running" if _runner_alive(info) else "orphaned"
        stop = f"taskkill /T /F /PID {pgid}" if os.name == "nt" else f"kill -- -{pgid}"
        raise EnvironmentProblem(
            f"a trial of an earlier sweep on this store is still running ({who}: process group {pgid}, "
            f"conf {info.get('conf') or 'default'!r}); it may hold the GPU: stop it with `{stop}` "
            "or wait for it, then resume"
        )
    path.unlink(missing_ok=True)


class _Terminated(SystemExit):
    """SIGTERM/SIGHUP reached alloctune during a trial: unwind so the trial's group is killed."""


def _signal_error(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else _Terminated(128 + signum)


class _ExitSignals:
    """Ctrl-C, SIGTERM and SIGHUP during a trial, raised once and never lost (main thread only).

    Python runs a signal's handler wherever the main thread happens to be, including in the
    at-fork hooks `subprocess.Popen` runs while it starts the child (logging's lock release).
    An exception raised there is printed as "Exception ignored" with a traceback and dropped,
    so a Ctrl-C pressed just as a trial started was lost and the sweep ran on to the end (seen
    under load in CI). While the child is being started (`deferred()`) a handler only notes
    its signal; `raise_missed()` raises it once the child exists and can be stopped.
    """

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.caught: list[int] = []
        self.defer = False

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self.defer = True
        try:
            yield
        finally:
            self.defer = False

    def install(self) -> _ExitSignals:
        if threading.current_thread() is not threading.main_thread():
            return self

        def handler(signum: int, frame: Any) -> None:
            self.caught.append(signum)
            if not self.defer:
                raise _signal_error(signum)

        for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is None:
                continue
            if sig == signal.SIGINT and signal.getsignal(sig) is not signal.default_int_handler:
                continue  # a caller's own Ctrl-C handling is left alone
            try:
                self.previous[sig] = signal.signal(sig, handler)
            except (ValueError, OSError):
                pass
        return self

    def raise_missed(self) -> None:
        """Raise a signal that was noted while deferred (or whose exception something swallowed)."""
        if self.caught:
            raise _signal_error(self.caught[0])

    def restore(self) -> None:
        for sig, old in self.previous.items():
            try:
                signal.signal(sig, old)
            except (ValueError, OSError, TypeError):
                pass
        self.previous = {}


# ---- children running now (parallel executors stop them all on Ctrl-C) -------------------------
def terminate_running(grace: float = 3.0) -> None:
    """Stop every trial this process has running (interrupt, SIGTERM, hard kill: `_kill_group`).

    Only the main thread gets Ctrl-C; trials started by an executor's worker threads are in
    their own sessions and would run on without this.
    """
    with _RUNNING_LOCK:
        procs = list(_RUNNING)
    workers = [threading.Thread(target=_kill_group, args=(p, grace, (signal.SIGINT,)), daemon=True) for p in procs]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
