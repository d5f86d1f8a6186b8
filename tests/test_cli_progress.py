"""Progress on stderr for long operations (#18.16): drawn at a terminal, quiet under --json or in a pipe."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from alloctune.cli import main
from alloctune.progress import progress_on_stderr
from alloctune.progress import no_progress


def _terminal() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=80, color_system=None), buf


def test_draws_at_a_terminal():
    con, buf = _terminal()
    with progress_on_stderr(console=con) as progress:
        assert progress is not no_progress
        progress("replaying expandable_segments:True", 1, 4)
    assert "replaying expandable_segments:True" in buf.getvalue()


def test_quiet_for_json_and_pipes():
    con, buf = _terminal()
    with progress_on_stderr(quiet=True, console=con) as progress:
        assert progress is no_progress
    piped = Console(file=io.StringIO(), force_terminal=False)
    with progress_on_stderr(console=piped) as progress:
        assert progress is no_progress
    assert buf.getvalue() == ""


@pytest.mark.parametrize("json_out", [False, True])
def test_simulate_reports_progress_on_stderr(traces_dir, capsys, monkeypatch, json_out):
    import alloctune.cli.render as render

    con, buf = _terminal()
    monkeypatch.setattr(render, "err_console", con)
    trace = str(traces_dir / "rvc_ec0" / "default.pickle.xz")
    with pytest.raises(SystemExit) as exc:
        main(["simulate", trace, "--conf", "expandable_segments:True", "--min-budget", *(["--json"] if json_out else [])])
    assert exc.value.code == 0
    drawn = buf.getvalue()
    if json_out:
        assert drawn == ""
    else:
        assert "done" in drawn and "2/2" in drawn  # the last state is always drawn (the steps: test_sim_cli)
    assert "replaying" not in capsys.readouterr().out  # never on stdout
