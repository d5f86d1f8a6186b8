"""Steps of one long core operation (trace load, sweep, min budget, diagnosis) and their spinner.

Why a callback: a 45 s `min_budget` or a long trace load should not be silent at a terminal,
but the core stays free of rich and of terminals (and must stay quiet for `--json` and in
library use). A long core operation takes a `progress` argument and calls it as it advances;
everyone passes `no_progress` except the CLI, which passes `progress_on_stderr()`'s spinner.
It draws on stderr (stdout stays clean for `--json`) and only at a terminal; rich is imported
only when something is drawn.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol


# ---- steps of one core operation -----------------------------------------------------------------
class Progress(Protocol):
    """Called as work advances: `step` says what is being done now, `done` of `total` steps
    are finished (`total` None when unknown). Must be cheap and must not raise."""

    def __call__(self, step: str, done: int = 0, total: int | None = None) -> None: ...


def no_progress(step: str, done: int = 0, total: int | None = None) -> None:
    """The silent default."""


@contextmanager
def progress_on_stderr(*, quiet: bool = False, console: Any = None, after: float = 0.0) -> Iterator[Progress]:
    """Yield a `Progress` callback that draws a transient spinner on stderr, or `no_progress`
    under `quiet` (`--json`) and whenever stderr is not a terminal (pipes, logs, programs).

    `after`: seconds of work before anything is drawn, whether or not the work reports again by
    then (a quick command shows no flicker; a long one that reports once still gets its bar)."""
    if console is None:
        from rich.console import Console

        console = Console(stderr=True, highlight=False, emoji=False)
    if quiet or not console.is_terminal:
        yield no_progress
        return
    from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    bar = RichProgress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    task = bar.add_task("starting", total=None)

    def report(step: str, done: int = 0, total: int | None = None) -> None:
        bar.update(task, description=step, completed=done, total=total)

    if after <= 0:
        with bar:
            yield report
        return
    import threading

    lock = threading.Lock()
    state = {"shown": False, "done": False}

    def show() -> None:
        with lock:
            if not state["done"]:
                bar.start()
                state["shown"] = True

    timer = threading.Timer(after, show)
    timer.daemon = True
    timer.start()
    try:
        yield report
    finally:
        timer.cancel()
        with lock:
            state["done"] = True
            if state["shown"]:
                bar.stop()
