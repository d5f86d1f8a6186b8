"""The process group of one trial: start it so it cannot outlive alloctune, end it on every way out.

The runner starts each trial in its own session (process group). This module owns what that
takes: killing the whole group (SIGTERM, then SIGKILL after a grace period; the agent writes
its report on SIGTERM), `PR_SET_PDEATHSIG` so the direct child dies with alloctune (Linux),
Ctrl-C / SIGTERM / SIGHUP raised once and never lost while `Popen` forks, the children running
now (a parallel executor stops them all on Ctrl-C), and trial folders or pid files an earlier
alloctune left behind. Process control only: nothing here reads a report or knows an outcome.
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
from typing import Any, Iterator

from alloctune.agent.watchdog import pid_alive  # whether a process exists and is not a zombie
from alloctune.errors import EnvironmentProblem


def _stderr_fd() -> int:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a test harness: the real one
        return sys.__stderr__.fileno() if sys.__stderr__ else subprocess.DEVNULL


def _kill_group(proc: subprocess.Popen, grace: float, first: tuple[signal.Signals, ...] = ()) -> None:
    """Signal the child's whole process group: `first` signals, SIGTERM, then SIGKILL, each after
    `grace` s without an exit (the agent writes its report on SIGTERM)."""
    steps = [(sig, grace) for sig in first] + [(signal.SIGTERM, grace), (signal.SIGKILL, 10.0)]
    for sig, wait in steps:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; make sure no straggler in the group survives it.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


# ---- no orphans -----------------------------------------------------------------------------------
PR_SET_PDEATHSIG = 1
TRIAL_PREFIX = "alloctune-trial-"
OWNER_FILE = "owner.json"


def _die_with_parent(parent: int):
    """A preexec function: the child gets SIGKILL when alloctune dies (Linux), or None elsewhere."""
    if not sys.platform.startswith("linux"):
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


def group_alive(pgid: int) -> bool:
    """Whether any process of process group `pgid` still exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    if sys.platform.startswith("linux"):  # zombies only (e.g. killed, not reaped) do not count
        try:
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        with open(f"/proc/{entry}/stat", "rb") as fh:
                            fields = fh.read().rsplit(b")", 1)[1].split()
                    except OSError:
                        continue
                    if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
                        return True
            return False
        except OSError:
            return True
    return True


def _reap_group(pgid: int) -> None:
    """SIGKILL whatever is left of the trial's process group."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def sweep_stale_trial_dirs(tmp: str | os.PathLike | None = None, older_than_s: float = 86400.0) -> int:
    """Remove trial folders whose alloctune died without cleaning up; returns how many.

    A folder with `owner.json` goes once its owner and its process group are gone; one
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
            stale = not pid_alive(int(owner["runner_pid"])) and not (
                isinstance(owner.get("pgid"), int) and group_alive(owner["pgid"]))
        except (OSError, ValueError, KeyError, TypeError):
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
    if group_alive(pgid):
        who = "whose alloctune is still running" if pid_alive(int(info.get("runner_pid", -1))) else "orphaned"
        raise EnvironmentProblem(
            f"a trial of an earlier sweep on this store is still running ({who}: process group {pgid}, "
            f"conf {info.get('conf') or 'default'!r}); it may hold the GPU: stop it with `kill -- -{pgid}` "
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
_RUNNING: set[subprocess.Popen] = set()
_RUNNING_LOCK = threading.Lock()


def terminate_running(grace: float = 3.0) -> None:
    """Stop every trial this process has running (SIGINT, SIGTERM, SIGKILL to each group).

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
