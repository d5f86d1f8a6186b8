"""A trial started ahead: the program runs up to its first CUDA call, then waits to be told what it runs.

Why: most of a trial's start is not on the GPU (interpreter, `import torch`, the model built on
the CPU). `tune` starts the processes of its next runs while the recording runs, and each waits
at its first CUDA call, before any GPU memory is taken, until the runner writes the release file
(`run/warm.py`): the allocator setting, the budget and what to record. Nothing the program does
before CUDA depends on those, so the run is the run a cold start makes, minus the wait.

Standard library only, loaded by file path in the child like `bootstrap.py`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable

POLL_S = 0.01  # how often the held process looks for its release file
# Exit code of a held process whose program read or set the allocator's variables before its release:
# it ran with what a held process has (none), not with the setting a cold start gives it, so the
# runner starts that trial cold instead (and starts no more ahead).
EXIT_READ_SETTING = 87


class _EnvironWatch:
    """Which of `names` the program read or wrote in `os.environ` (reads of absent ones included)."""

    def __init__(self, names: list[str]):
        self.names = set(names)
        self.touched: list[str] = []
        base: Any = type(os.environ)
        self.cls = base
        watch = self

        class Watched(base):  # type: ignore[misc]
            def __getitem__(self, key: str) -> str:
                watch.seen(key)
                value: str = super().__getitem__(key)
                return value

            def __setitem__(self, key: str, value: str) -> None:
                watch.seen(key)
                super().__setitem__(key, value)

            def __delitem__(self, key: str) -> None:
                watch.seen(key)
                super().__delitem__(key)

        os.environ.__class__ = Watched

    def seen(self, key: str) -> None:
        if key in self.names and key not in self.touched:
            self.touched.append(key)

    def stop(self) -> list[str]:
        os.environ.__class__ = self.cls
        return self.touched


def watch_environment(names: list[str]) -> _EnvironWatch:
    """Start noting the program's uses of the allocator's variables while it is held (see `EXIT_READ_SETTING`)."""
    return _EnvironWatch(names)


def wait_for_release(path: str, poll: float = POLL_S) -> dict[str, Any]:
    """Block until the runner has written `path` (atomically: whole or absent), then read it.

    The process waits for nothing else: if alloctune dies meanwhile, its watchdog ends it."""
    while not os.path.exists(path):
        time.sleep(poll)
    with open(path, encoding="utf-8") as fh:
        release: dict[str, Any] = json.load(fh)
    return release


def apply_environment(env: dict[str, str | None]) -> None:
    """Set (or, for None, remove) the variables the trial runs with: the allocator setting's."""
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def apply_allocator_setting(torch: Any, conf: str | None) -> None:
    """The allocator setting, also through torch's runtime setter: whether the allocator reads its
    variable before this point differs across versions, and nothing has been allocated yet, so
    setting it now is the same as starting with it."""
    if conf:
        torch.cuda.memory._set_allocator_settings(conf)


def hold_cuda_init(torch: Any, release: Callable[[], None]) -> None:
    """Make the program's first CUDA initialisation call `release()` first (once; later calls pass).

    `torch.cuda._lazy_init` is the one entry every CUDA use goes through (torch's C++ calls it by
    name on the module), so wrapping the module's attribute holds the program before its context
    exists: a held process takes no GPU memory."""
    real = torch.cuda._lazy_init
    lock = threading.Lock()
    done: list[bool] = []

    def lazy_init() -> Any:
        if not done:
            with lock:
                if not done:
                    release()
                    done.append(True)
                    torch.cuda._lazy_init = real
        return real()

    torch.cuda._lazy_init = lazy_init
