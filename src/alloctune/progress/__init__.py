"""Progress of every long operation, in one place: what the core reports and how a terminal shows it.

Two shapes, one per kind of work: the **steps** of one core operation (`steps.py`: the
`Progress` callback, `no_progress`, the stderr spinner `progress_on_stderr`) and the **trials**
of a sweep (`trials.py`: the `TrialProgress` protocol executors report to, `NullProgress`,
`ProgressLog`, the live table `LiveTrialTable`, `tune`'s `TrialLines`). Callers import the names
from here. Importing costs nothing: rich is imported only when something is drawn.
"""

from __future__ import annotations

from alloctune.progress.steps import Progress, no_progress, progress_on_stderr
from alloctune.progress.trials import LiveTrialTable, NullProgress, ProgressLog, TrialLines, TrialProgress, describe

__all__ = [
    "LiveTrialTable",
    "NullProgress",
    "Progress",
    "ProgressLog",
    "TrialLines",
    "TrialProgress",
    "describe",
    "no_progress",
    "progress_on_stderr",
]
