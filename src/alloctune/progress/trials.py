"""Trials of a sweep: which trial runs where and how it ended, and how a terminal shows it.

Executors report through `TrialProgress`; `LiveTrialTable` draws a live table per GPU/worker,
`ProgressLog` records the events (tests, logs), `TrialLines` is `tune`'s serial spinner with a
kept line per trial. Everything draws on stderr and rich is imported only when something is drawn.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional, Protocol, Sequence


# ---- trials of a sweep ---------------------------------------------------------------------------
# A task is a `tune.executors.tasks.TrialTask`, a result a `run.trial.TrialResult`; typed `Any` here
# so this shared leaf imports nothing of the packages that report through it.
class TrialProgress(Protocol):
    def begin(self, workers: Sequence[str], total: int) -> None: ...
    def started(self, task: Any, worker: str) -> None: ...
    def finished(self, task: Any, worker: str, result: Any) -> None: ...
    def end(self, interrupted: bool = False) -> None: ...


class NullProgress:
    def begin(self, workers: Sequence[str], total: int) -> None:
        pass

    def started(self, task: Any, worker: str) -> None:
        pass

    def finished(self, task: Any, worker: str, result: Any) -> None:
        pass

    def end(self, interrupted: bool = False) -> None:
        pass


def _mib(n: int | None) -> str:
    return "no budget" if n is None else f"{n / (1 << 20):,.0f} MiB"


def describe(task: Any) -> str:
    req = task.request
    label = f"#{task.number} {req.conf or '(default)'} @ {_mib(req.budget)}"
    return f"{label} ({req.purpose})" if req.purpose else label


class ProgressLog:
    """Records every event in order (tests, and the plain log when stderr is not a terminal)."""

    def __init__(self):
        self.events: list[tuple[str, int | None, str | None, str | None]] = []
        self._lock = threading.Lock()

    def begin(self, workers: Sequence[str], total: int) -> None:
        with self._lock:
            self.events.append(("begin", total, ",".join(workers), None))

    def started(self, task: Any, worker: str) -> None:
        with self._lock:
            self.events.append(("start", task.number, worker, None))

    def finished(self, task: Any, worker: str, result: Any) -> None:
        with self._lock:
            self.events.append(("end", task.number, worker, result.outcome))

    def end(self, interrupted: bool = False) -> None:
        with self._lock:
            self.events.append(("stop" if interrupted else "done", None, None, None))


class LiveTrialTable:
    """A live table of running and finished trials per GPU/worker, on stderr (a line per trial if not a terminal)."""

    def __init__(self, console: Any = None, *, keep_last: int = 8):
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self.keep_last = keep_last
        self._lock = threading.Lock()
        self._running: dict[int, tuple[str, Any, float]] = {}
        self._finished: list[tuple[str, Any, Any]] = []
        self._per_worker: dict[str, list[int]] = {}
        self._total = 0
        self._live: Any = None

    # ---- events --------------------------------------------------------------------------------
    def begin(self, workers: Sequence[str], total: int) -> None:
        from rich.live import Live

        with self._lock:
            self._total += total
            for w in workers:
                self._per_worker.setdefault(w, [0, 0])
        if self._live is None and self.console.is_terminal:
            # transient: the sweep prints its own final tables; a log file gets one line per trial instead
            self._live = Live(
                self._render(), console=self.console, refresh_per_second=2, transient=True, get_renderable=self._render
            )
            self._live.start()

    def started(self, task: Any, worker: str) -> None:
        with self._lock:
            self._running[task.number] = (worker, task, time.monotonic())

    def finished(self, task: Any, worker: str, result: Any) -> None:
        with self._lock:
            self._running.pop(task.number, None)
            self._finished.append((worker, task, result))
            counts = self._per_worker.setdefault(worker, [0, 0])
            counts[0 if result.outcome in ("ok", "oom") else 1] += 1
        if self._live is None:
            peak = "-" if result.peak_reserved is None else _mib(result.peak_reserved)
            self.console.print(
                f"{worker}: {describe(task)} -> {result.outcome}, peak reserved {peak}, {result.wall_s:.1f} s",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )

    def end(self, interrupted: bool = False) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        if interrupted:
            self.console.print(f"stopped: {len(self._finished)} trial(s) finished, {len(self._running)} cut off")

    # ---- drawing -------------------------------------------------------------------------------
    def _render(self) -> Any:
        from rich.table import Table

        with self._lock:
            t = Table(
                title=f"trials: {len(self._finished)}/{self._total} finished, {len(self._running)} running",
                title_justify="left",
                expand=False,
            )
            for col in ("worker", "trial", "state", "peak reserved", "wall", "done / failed"):
                t.add_column(col, overflow="fold")
            now = time.monotonic()
            for worker, counts in self._per_worker.items():
                rows = [(task, now - t0) for w, task, t0 in self._running.values() if w == worker]
                if not rows:
                    t.add_row(worker, "-", "[dim]idle[/dim]", "", "", f"{counts[0]} / {counts[1]}")
                for i, (task, age) in enumerate(rows):
                    t.add_row(
                        worker if i == 0 else "",
                        describe(task),
                        "[cyan]running[/cyan]",
                        "",
                        f"{age:.0f}s",
                        f"{counts[0]} / {counts[1]}" if i == 0 else "",
                    )
            for worker, task, res in self._finished[-self.keep_last :]:
                colour = {"ok": "green", "oom": "red", "timeout": "yellow"}.get(res.outcome, "magenta")
                peak = "-" if res.peak_reserved is None else _mib(res.peak_reserved)
                t.add_row(
                    f"[dim]{worker}[/dim]", describe(task), f"[{colour}]{res.outcome}[/{colour}]", peak, f"{res.wall_s:.1f}s", ""
                )
            return t


class TrialLines:
    """A transient spinner on stderr plus one kept line per finished trial.

    Why a class: the three callbacks `tune.session.prepare` takes (trial start, trial end,
    simulator steps) share one spinner and need the number of trials so far, which is only
    known once the session exists; `count` is set after `prepare` returns.
    """

    def __init__(self, console: Any) -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=True
        )
        self._task = self.bar.add_task("starting", total=None)
        self.count: Callable[[], int] = lambda: 0

    def started(self, conf: str, cap_: Optional[int], purpose: str) -> None:
        self.bar.update(self._task, description=f"trial {self.count() + 1}: {purpose} ({_budget_text(cap_)})")

    def finished(self, rec: Any) -> None:
        r = rec.result
        src = " [dim](from store)[/dim]" if rec.reused else ""
        self.bar.console.print(
            f"  #{self.count():<3} {r.conf or '(default)'} @ {_budget_text(r.budget)} → "
            f"{_coloured(r.outcome)}  peak reserved {_mib_text(r.peak_reserved)}  {r.wall_s:.1f} s{src}"
        )

    def simulating(self, step: str, done: int = 0, total: Optional[int] = None) -> None:
        of = f" ({done}/{total})" if total else ""
        self.bar.update(self._task, description=f"{step}{of}")


def _mib_text(n: Optional[int]) -> str:
    from alloctune.units import format_size

    return "-" if n is None else format_size(n)


def _budget_text(n: Optional[int]) -> str:
    return "no budget" if n is None else _mib_text(n)


def _coloured(outcome: str) -> str:
    colour = {"ok": "green", "oom": "red", "crash": "red", "timeout": "yellow"}.get(outcome, "white")
    return f"[{colour}]{outcome}[/{colour}]"
