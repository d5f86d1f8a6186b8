"""Reading a file a person named on the command line: one readable line when it is not there.

Why one reader, and why in `trace/`: the log `diagnose` reads and the snapshot every trace
command reads fail the same three ways (missing, a directory, unreadable), and each said so in
its own words. One reader gives one wording; the caller picks the error class and names what
was expected instead. It lives with the trace loader, its lowest user (`diagnose/` sits above).
"""

from __future__ import annotations

from pathlib import Path

from alloctune.errors import InputError


def read_input_bytes(path: str | Path, *, expected: str, error: type[InputError] = InputError) -> bytes:
    """The bytes of `path`; `error` (exit 2, one line) when it is missing, a directory or unreadable.

    `expected` completes "is a directory, expected ..." (e.g. "the log file").
    """
    p = existing_file(path, expected=expected, error=error)
    try:
        return p.read_bytes()
    except OSError as exc:
        raise error(f"{p}: cannot read: {exc.strerror or exc}") from exc


# ---- what a file holds, from its first bytes ------------------------------------------------


def existing_file(path: str | Path, *, expected: str, error: type[InputError] = InputError) -> Path:
    """`path` as a Path, or `error` when it is missing or a directory (the first two of the three ways)."""
    p = Path(path)
    if not p.exists():
        raise error(f"{p}: no such file")
    if p.is_dir():
        raise error(f"{p}: is a directory, expected {expected}")
    return p
