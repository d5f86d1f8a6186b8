"""The CLI side of `alloctune.progress`: a rich spinner on stderr while the core works.

Quiet (the silent callback) under `--json` and whenever stderr is not a terminal, so pipes,
logs and programs never see progress lines; transient, so nothing stays behind on screen.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console

from alloctune.progress import Progress, no_progress


@contextmanager
def progress_on_stderr(*, quiet: bool = False, console: Console | None = None, after: float = 0.0) -> Iterator[Progress]:
    """Yield a `Progress` callback that draws on stderr, or `no_progress` when it should be quiet.

    `after`: seconds of work before anything is drawn (a quick command shows no flicker)."""
    from alloctune.cli.render import err_console

    con = console or err_console
    if quiet or not con.is_terminal:
        yield no_progress
        return
    from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    bar = RichProgress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), console=con, transient=True)
    task = bar.add_task("starting", total=None)
    if after <= 0:
        def report(step: str, done: int = 0, total: int | None = None) -> None:
            bar.update(task, description=step, completed=done, total=total)

        with bar:
            yield report
        return

    # Drawn only once the work has taken `after` seconds, whether or not it reports again by then
    # (a snapshot's replays report once, at their start): a timer starts the bar.
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

    def report(step: str, done: int = 0, total: int | None = None) -> None:
        bar.update(task, description=step, completed=done, total=total)

    timer.start()
    try:
        yield report
    finally:
        timer.cancel()
        with lock:
            state["done"] = True
            if state["shown"]:
                bar.stop()
