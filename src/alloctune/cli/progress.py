"""SHIM (issue 26, remove once nothing imports it): progress drawing moved to `alloctune.progress`.

Kept only so `cli/diagnose_cmd.py` (owned by another session) still imports unchanged; it draws
on the CLI's own stderr console unless given one, as before.
"""

from __future__ import annotations

from typing import Any

from alloctune.progress import Progress, no_progress
from alloctune.progress import progress_on_stderr as _draw

__all__ = ["Progress", "no_progress", "progress_on_stderr"]


def progress_on_stderr(*, quiet: bool = False, console: Any = None, after: float = 0.0) -> Any:
    from alloctune.cli.render import err_console

    return _draw(quiet=quiet, console=console or err_console, after=after)
