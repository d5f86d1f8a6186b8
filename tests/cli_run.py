"""Run the real `alloctune` entry point in-process and collect (exit code, stdout, stderr)."""

from __future__ import annotations

import pytest

from alloctune.cli import main


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """`main(args)` always ends in SystemExit (0 on success); the output is captured by pytest's capsys."""
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err
