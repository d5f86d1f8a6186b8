"""Which alloctune, Python and torch are installed — for bug reports and `version --json`.

torch's version is read from the package metadata, never by importing torch: the core must
not import it, and importing it takes seconds.
"""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

from alloctune.schema import schema_id


def installed_versions() -> dict[str, Any]:
    """`{"schema", "alloctune", "python", "platform", "torch"}`; `torch` is None when not installed."""
    from alloctune import __version__

    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = None
    return {
        "schema": schema_id("version"),
        "alloctune": __version__,
        "python": platform.python_version(),
        "platform": platform.system().lower(),
        "torch": torch,
    }
