"""Die with alloctune: end this trial's processes once the runner is gone (even by SIGKILL).

Why: a workload left running after `tune`/`run` was killed keeps holding the GPU and skews
every later trial. Every Python process of the trial runs the agent, so each one watches the
runner and ends the trial when it is gone: the other processes first (terminate, then kill after
a grace period), this one last, so a process that ignores SIGTERM is still killed by someone.
Two ways, chosen per process (`portable`):

- POSIX groups (Linux, macOS): the pipe whose write end only the runner holds gives EOF at once
  when it dies (identified by fd *and* inode, so a reused fd number is never mistaken for it);
  where that fd was not inherited, the runner's pid is checked every second. The trial is this
  process's group (the runner started the trial in a session of its own) and the process trees
  under the group's leader and under this process. In the trial's root the watchdog replaces the
  runner's PR_SET_PDEATHSIG (Linux), whose SIGKILL would end the root alone and leave the rest
  of the trial to nobody (a helper that is not Python has no watchdog).
- Portable (Windows, or forced with `ALLOCTUNE_PORTABLE_PROCESS=1`): the runner's pid *and
  creation time* are checked every second (a pid is soon reused on Windows); the trial is the
  process tree under its root (the runner's direct child, found while the runner lives) and
  under this process.

Standard library only at import, like `bootstrap.py` (loaded by file path in the child, perhaps
by an interpreter without alloctune): psutil is imported when first needed, and where the
workload's interpreter lacks it the checks fall back to the standard library: POSIX groups
signal the group (`killpg`); portable mode ends this process's tree with `taskkill /T` on
Windows and this process alone on POSIX; a process handle's exit code on Windows tells whether
the runner lives (`os.kill(pid, 0)` would end it there).
The runner (`run.process`) shares `portable`, `pid_alive` and `trial_tree`: one rule each.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from types import ModuleType
from typing import Any, cast

PORTABLE_ENV = "ALLOCTUNE_PORTABLE_PROCESS"
# Two readings of one process's creation time agree within this (psutil's clock ticks at 10 ms on
# Linux); a pid is never reused that fast, so a match within it is the same process.
SAME_BIRTH_S = 0.5
GRACE_S = 3.0  # between SIGTERM (the agent writes its report) and the hard kill


def portable() -> bool:
    """Whether process control does without POSIX process groups, PR_SET_PDEATHSIG and /proc:
    always on Windows; on POSIX when `ALLOCTUNE_PORTABLE_PROCESS` is set (not empty, not "0"), so
    that tests on Linux run the path Windows takes. Read at each call: a child inherits it."""
    return os.name != "posix" or os.environ.get(PORTABLE_ENV, "").strip() not in ("", "0")


def _psutil() -> ModuleType | None:
    """psutil where the interpreter has it (alloctune's own always does; a workload's may not)."""
    try:
        import psutil
    except ImportError:
        return None
    return cast(ModuleType, psutil)


# ---- is that process still there, and still the same one -------------------------------------
def birth(pid: int) -> float | None:
    """The creation time of process `pid` (seconds since the epoch), None if gone or unknown."""
    ps = _psutil()
    if ps is None:
        return None
    try:
        return float(ps.Process(pid).create_time())
    except (ps.Error, OSError, ValueError):
        return None


def pid_alive(pid: int, born: float | None = None) -> bool:
    """Whether process `pid` exists and is not a zombie (a killed runner is one until reaped);
    with `born`, also whether it is still the process created then (not a reuse of its pid).
    Also the runner's check (`run.process`): one rule for "is that process still there"."""
    if pid <= 0:
        return False
    ps = _psutil()
    if ps is None:
        return _pid_alive_stdlib(pid)
    try:
        proc = ps.Process(pid)
        if born is not None and abs(proc.create_time() - born) > SAME_BIRTH_S:
            return False
        return proc.status() not in (ps.STATUS_ZOMBIE, ps.STATUS_DEAD)
    except ps.NoSuchProcess:  # ZombieProcess included (macOS tells a zombie this way)
        return False
    except (ps.AccessDenied, OSError):  # it exists, owned by someone else
        return True


def _pid_alive_stdlib(pid: int) -> bool:
    """`pid_alive` without psutil: `os.kill(pid, 0)` on POSIX (with the zombie state read on Linux);
    the exit code of a process handle on Windows, where `os.kill` would terminate the process."""
    if os.name == "nt":
        return _windows_running(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    if not sys.platform.startswith("linux") or portable():
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def _windows_running(pid: int) -> bool:  # pragma: no cover - Windows without psutil
    import ctypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
    kernel32.OpenProcess.restype = ctypes.c_void_p  # a HANDLE is pointer-wide
    kernel32.GetExitCodeProcess.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulong)]
    kernel32.CloseHandle.argtypes = [ctypes.c_void_p]
    handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
    if not handle:
        return bool(ctypes.get_last_error() == 5)  # type: ignore[attr-defined]  # ERROR_ACCESS_DENIED: someone else's
    try:
        code = ctypes.c_ulong()
        if not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)):
            return True
        return code.value == 259  # STILL_ACTIVE
    finally:
        kernel32.CloseHandle(handle)


def trial_tree(pid: int, born: float | None = None, *, exact: bool = True) -> list[Any]:
    """The processes of the tree under `pid` (itself first while it lives), as psutil processes;
    [] without psutil.

    Each process is known by pid and creation time: a child belongs when its parent does and it
    was created no earlier than that parent. `born` is the root's creation time (`exact`) or a
    time it was created no earlier than (`exact=False`). If the root's pid now names a process
    that is not the root, only children older than that process are taken: the root's orphans,
    which keep its pid as their parent on Windows (on POSIX they are reparented and out of reach).
    """
    ps = _psutil()
    if ps is None:
        return []
    by_parent: dict[int, list[tuple[Any, float]]] = {}
    current: tuple[Any, float] | None = None
    for proc in ps.process_iter(["ppid", "create_time"]):
        ppid, created = proc.info.get("ppid"), proc.info.get("create_time")
        if not isinstance(ppid, int) or not isinstance(created, (int, float)):
            continue
        by_parent.setdefault(ppid, []).append((proc, float(created)))
        if proc.pid == pid:
            current = (proc, float(created))
    found: list[Any] = []
    earliest, before = float("-inf") if born is None else born - SAME_BIRTH_S, float("inf")
    if current is not None:
        proc, created = current
        if born is None or (abs(created - born) <= SAME_BIRTH_S if exact else created >= earliest):
            found.append(proc)
            earliest = created - SAME_BIRTH_S
        else:
            before = created  # an unrelated process has the root's pid: only its elders can be ours
    stack, seen = [(pid, earliest, before)], {pid}
    while stack:
        parent, not_before, older_than = stack.pop()
        for proc, created in by_parent.get(parent, ()):
            if proc.pid in seen or not (not_before <= created < older_than):
                continue
            seen.add(proc.pid)
            found.append(proc)
            stack.append((proc.pid, created - SAME_BIRTH_S, float("inf")))
    return found


# ---- the watch ------------------------------------------------------------------------------
class Watchdog:
    """One watching thread per process; `stop()` (registered with atexit) ends it before exit.

    `root`: the trial's root (pid, creation time) in portable mode; None with POSIX groups."""

    def __init__(
        self, fd: int | None, runner: int, runner_born: float | None = None, root: tuple[int, float | None] | None = None
    ) -> None:
        self._stopping = threading.Event()
        # A thread still blocked in select() while the interpreter finalizes can crash the process
        # at exit (seen: SIGSEGV); a wake-up pipe lets `stop` end it first.
        self._wake_r, self._wake_w = os.pipe() if fd is not None else (-1, -1)
        self._pid = os.getpid()  # a forked worker inherits the atexit hook, not the thread
        self._runner, self._runner_born, self._root = runner, runner_born, root
        self._thread: threading.Thread | None = threading.Thread(
            target=self._watch, args=(fd,), name="alloctune-watchdog", daemon=True
        )
        self._thread.start()
        atexit.register(self.stop)

    def stop(self) -> None:
        thread = self._thread
        if thread is None or os.getpid() != self._pid:
            return
        self._stopping.set()
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass
        thread.join(timeout=2.0)
        self._thread = None

    def _watch(self, fd: int | None) -> None:
        import select

        while True:
            if fd is None:  # the pid check only, once a second
                if self._stopping.wait(1.0):
                    return
            else:
                try:
                    ready, _, _ = select.select([self._wake_r, fd], [], [], 1.0)
                except (OSError, ValueError):  # the program closed the fd: fall back to the pid check
                    fd = None
                    continue
                if self._wake_r in ready:
                    return  # this process is exiting normally
                if fd in ready:
                    try:
                        if os.read(fd, 64):
                            continue
                    except OSError:
                        pass
                    fd = None  # EOF: the runner closed it or died; the pid check decides
            if not pid_alive(self._runner, self._runner_born):
                break
        end_trial(self._root)


def start(config: dict[str, Any]) -> Watchdog | None:
    """Start watching the runner named in the agent config; None when no runner is named."""
    fd, ino, runner = (config.get(k) for k in ("watch_fd", "watch_ino", "runner_pid"))
    if not isinstance(runner, int) or runner <= 1:
        return None
    if not portable():  # nothing to import or look up before the runner is gone
        if not (isinstance(fd, int) and isinstance(ino, int) and _is_watch_pipe(fd, ino)):
            fd = None
        if fd is not None and os.getppid() == runner:
            _clear_parent_death_signal()
        return Watchdog(fd, runner)
    return Watchdog(None, runner, birth(runner), _trial_root(runner))


def _clear_parent_death_signal() -> None:
    """In the trial's root, the watchdog ends the trial when the runner dies, not the runner's
    PR_SET_PDEATHSIG (Linux): that SIGKILL would end this process alone, at once, and leave no
    process to end the rest of the trial. The pipe tells the watchdog at the same moment. A root
    without the agent (not Python) keeps the signal."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG, none
    except (OSError, AttributeError):
        pass


def _is_watch_pipe(fd: int, ino: int) -> bool:
    import stat

    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return stat.S_ISFIFO(st.st_mode) and st.st_ino == ino


def _trial_root(runner: int) -> tuple[int, float | None]:
    """The trial's root while the runner lives: the ancestor of this process whose parent is the
    runner (pid, creation time); this process itself where that is not known."""
    ps = _psutil()
    if ps is None:
        return os.getpid(), None
    try:
        root = ps.Process()
        for parent in root.parents():  # nearest first
            if parent.pid == runner:
                return root.pid, float(root.create_time())
            root = parent
    except (ps.Error, OSError):
        pass
    return os.getpid(), birth(os.getpid())


# ---- ending the trial -------------------------------------------------------------------------
def end_trial(root: tuple[int, float | None] | None) -> None:
    """End every process of the trial this process belongs to: the others first (terminate, then
    kill after the grace period), this process last (SIGTERM: the agent writes its report).

    `root` None: POSIX groups; the trial is this process's group and the trees under its leader
    (the trial's root: the runner started it in a session of its own) and under this process.
    Else portable: the trees under `root` and under this process."""
    ps = _psutil()
    if ps is None:
        _end_without_psutil(root is None)
        return
    me = os.getpid()
    if root is None:
        pgid = os.getpgrp()
        members = [p for p in ps.process_iter() if _pgid(p.pid) == pgid] + trial_tree(pgid)
    else:
        members = trial_tree(*root)
    others = {p.pid: p for p in members + trial_tree(me, birth(me)) if p.pid != me}
    for proc in others.values():
        try:
            proc.terminate()
        except (ps.Error, OSError):
            pass
    try:
        _, alive = ps.wait_procs(list(others.values()), timeout=GRACE_S)
    except (ps.Error, OSError):
        alive = list(others.values())
    for proc in alive:
        try:
            proc.kill()
        except (ps.Error, OSError):
            pass
    _end_self()


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _end_without_psutil(groups: bool) -> None:
    """Without psutil. POSIX groups: SIGTERM, then SIGKILL, to this process's group (it holds
    every process of the trial). Portable: Windows ends this process's tree with `taskkill /T`;
    POSIX this process alone (every Python process of the trial runs a watchdog of its own)."""
    if groups:
        pgid = os.getpgrp()
        for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 0.0)):
            try:
                os.killpg(pgid, sig)
            except OSError:
                return
            time.sleep(wait)
        return
    if os.name == "nt":  # pragma: no cover - Windows without psutil
        import subprocess

        try:
            subprocess.run(["taskkill", "/T", "/F", "/PID", str(os.getpid())], capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            pass
        os._exit(1)
    _end_self()


def _end_self() -> None:
    """SIGTERM to this process (its handler runs in the main thread), then a hard exit."""
    try:
        if os.name == "nt":
            signal.raise_signal(signal.SIGTERM)
        else:
            os.kill(os.getpid(), signal.SIGTERM)
    except (OSError, ValueError):
        pass
    time.sleep(GRACE_S)
    kill = getattr(signal, "SIGKILL", None)
    if kill is not None:
        os.kill(os.getpid(), kill)
    os._exit(1)
