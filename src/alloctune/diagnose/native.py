"""The optional C part of `diagnose` (`_templates.c`): the known-shape matcher (`fast`) and the
leftmost-needle scan (`platform`), each with its Python twin as reference and fallback.

Apart so that both users reach it without importing each other."""

from __future__ import annotations

import functools
import os
from typing import Any


@functools.cache
def templates() -> Any:
    """The C module where it was built and not declined (ALLOCTUNE_TEMPLATES=python), else None:
    the templates' regexes, `fast.collapse` and the needle regex do its work."""
    if os.environ.get("ALLOCTUNE_TEMPLATES", "").strip().lower() == "python":
        return None
    try:
        from alloctune.diagnose import _templates
    except ImportError:
        return None
    return _templates
