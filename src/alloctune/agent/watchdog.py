"""Die with alloctune: kill this trial's process group once the runner is gone (even by SIGKILL).

Why: a workload left running after `tune`/`run` was killed keeps holding the GPU and skews
every later trial. The runner sets PR_SET_PDEATHSIG on its direct child, which does not reach
grandchildren (a shell's children, torchrun's workers, a program's own subprocesses); every
Python process of the trial runs the agent, so each one watches the runner: through the pipe
whose write end only the runner holds (EOF at once when it dies; identified by fd *and* inode,
so a reused fd number is never mistaken for it), and where that fd was not inherited, by
checking the runner's pid every second.

Split from `bootstrap.py`; like it, standard library only (loaded by file path in the child).
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
from typing import Any


class Watchdog:
    """One watching thread per process; `stop()` (registered with atexit) ends it before exit."""

    def __init__(self, fd: int | None, runner: int) -> None:
        # A thread still blocked in select() while the interpreter finalizes can crash the process
        # at exit (seen: SIGSEGV); a wake-up pipe lets `stop` end it first.
        self._wake_r, self._wake_w = os.pipe()
        self._pid = os.getpid()  # a forked worker inherits the atexit hook, not the thread
        self._thread: threading.Thread | None = threading.Thread(
            target=self._watch, args=(fd, runner), name="alloctune-watchdog", daemon=True
        )
        self._thread.start()
        atexit.register(self.stop)

    def stop(self) -> None:
        thread = self._thread
        if thread is None or os.getpid() != self._pid:
            return
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        thread.join(timeout=2.0)
        self._thread = None

    def _watch(self, fd: int | None, runner: int) -> None:
        import select

        wake = self._wake_r
        while True:
            try:
                ready, _, _ = select.select([wake] if fd is None else [wake, fd], [], [], 1.0)
            except (OSError, ValueError):  # the program closed the fd: fall back to the pid check
                fd = None
                continue
            if wake in ready:
                return  # this process is exiting normally
            if fd is not None and fd in ready:
                try:
                    if os.read(fd, 64):
                        continue
                except OSError:
                    pass
                fd = None  # EOF: the runner closed it or died; the pid check decides
            if not pid_alive(runner):
                break
        pgid = os.getpgrp()
        for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 0.0)):
            try:
                os.killpg(pgid, sig)
            except OSError:
                return
            time.sleep(wait)


def start(config: dict[str, Any]) -> Watchdog | None:
    """Start watching the runner named in the agent config; None when no runner is named."""
    fd, ino, runner = (config.get(k) for k in ("watch_fd", "watch_ino", "runner_pid"))
    if not isinstance(runner, int) or runner <= 1:
        return None
    if not (isinstance(fd, int) and isinstance(ino, int) and _is_watch_pipe(fd, ino)):
        fd = None
    return Watchdog(fd, runner)


def _is_watch_pipe(fd: int, ino: int) -> bool:
    import stat

    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return stat.S_ISFIFO(st.st_mode) and st.st_ino == ino


def pid_alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie (a killed runner is a zombie until reaped).
    Also the runner's check (`run.process`): one rule for "is that process still there"."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True
