"""Progress reporting from the core without the core knowing how it is shown.

Why a callback: a 45 s `min_budget` or a long trace load should not be silent at a terminal,
but the core stays free of rich and of terminals (and must stay quiet for `--json` and in
library use). Long operations take a `progress` argument; the CLI passes one that draws on
stderr (`alloctune.cli.progress`), everyone else gets `no_progress`.
"""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """Called as work advances: `step` says what is being done now, `done` of `total` steps
    are finished (`total` None when unknown). Must be cheap and must not raise."""

    def __call__(self, step: str, done: int = 0, total: int | None = None) -> None: ...


def no_progress(step: str, done: int = 0, total: int | None = None) -> None:
    """The silent default."""
