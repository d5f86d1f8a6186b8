"""Shared by the `record` tests: the fake torch in the child, and the CLI's exit code in-process."""

from __future__ import annotations

import pytest
from fake_torch import install

from alloctune.cli import main as cli_main
from alloctune.cli import record_cmd


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The fake torch for the child, one visible CUDA device for the parent's check."""
    install(tmp_path / "fake")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    monkeypatch.setenv("ALLOCTUNE_STATE_DIR", str(tmp_path / "live"))
    monkeypatch.delenv("ALLOCTUNE_AGENT", raising=False)
    monkeypatch.setattr(record_cmd, "_cuda_device_count", lambda: 1)
    return tmp_path


def cli_exit(argv: list[str]) -> int:
    """The exit code `alloctune ARGV` ends with (0 when it returns normally)."""
    try:
        cli_main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
