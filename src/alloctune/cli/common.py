"""Helpers shared by the command modules: the consoles and JSON output."""

from __future__ import annotations

import json
import sys
from typing import Any

from alloctune.cli.render import console, err_console

__all__ = ["console", "err_console", "print_json", "warn"]


def _default(obj: Any) -> Any:
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def print_json(data: Any) -> None:
    """Print machine-readable output on stdout (objects with `to_dict()` are expanded)."""
    sys.stdout.write(json.dumps(data, default=_default, indent=2) + "\n")


def warn(message: str) -> None:
    """A one-line warning on stderr that does not change the exit code."""
    err_console.print(f"[yellow]warning:[/yellow] {message}")
