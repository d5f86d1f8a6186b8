"""The command line's own promises (#18.14): one-line usage errors with exit 2, `--version`,
`version --json`, help without Python type names."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from alloctune import __version__
from alloctune.cli import command
from alloctune.schema import parse_schema
from cli_run import run_cli as _run


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["simulate"], "Missing argument 'TRACE'"),
        (["simulate", "x.pickle", "--no-such-option"], "No such option: --no-such-option"),
        (["simulate", "x.pickle", "--budget"], "'--budget' requires an argument"),
        (["simulate", "x.pickle", "--device", "abc"], "--device"),
        (["no-such-command"], "No such command 'no-such-command'"),
        (["config", "check"], "Missing argument"),
        (["watch", "--interval", "abc"], "--interval"),
        (["trace", "info", "x", "--partial=maybe"], "--partial"),
    ],
)
def test_usage_errors_are_one_line_exit_2(capsys, args, needle):
    code, out, err = _run(capsys, *args)
    assert code == 2 and out == ""
    assert err.startswith("alloctune: error: ") and err.count("\n") == 1, err
    assert needle in err
    assert not any(ch in err for ch in "╭╰│"), "no boxes"


def test_version_flag_and_json(capsys):
    code, out, _ = _run(capsys, "--version")
    assert (code, out) == (0, f"alloctune {__version__}\n")
    code, out, _ = _run(capsys, "version", "--json")
    data = json.loads(out)
    assert code == 0 and data["alloctune"] == __version__ and parse_schema(data["schema"]) == ("version", 1)
    assert set(data) == {"schema", "alloctune", "python", "platform", "torch"}
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from alloctune.api import installed_versions as v; v(); "
         "sys.exit(1 if 'torch' in sys.modules else 0)"], timeout=60)
    assert proc.returncode == 0


def _all_commands(cmd, path=()):
    subs = getattr(cmd, "commands", {})
    if not subs:
        yield path
    for name, sub in subs.items():
        if not sub.hidden:  # the retired `diagnose-snapshot` only prints its pointer
            yield from _all_commands(sub, (*path, name))


_TYPE_NAME = re.compile(r"<(?:bool|str|int|float|path|Path|list\[[^\]]*\]|[a-z]+)>")


def test_help_never_shows_python_type_names(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    paths = list(_all_commands(command()))
    assert ("simulate",) in paths and ("config", "check") in paths
    for path in [(), *paths]:
        code, out, _ = _run(capsys, *path, "--help")
        assert code == 0, path
        assert not _TYPE_NAME.search(out), (path, _TYPE_NAME.search(out).group(0))
        assert "list[" not in out
