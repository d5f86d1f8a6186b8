"""Command modules stay thin: parse, one core call, render (issue 38).

A `cli/*_cmd.py` holds the options, the checks that turn them into values, the call into the core
and the hand-over to a view module; decisions live in the core packages and rendering in the
`cli/*_view.py` modules. The line limit keeps it that way; the helpers the commands' logic moved
into are checked here on their own.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import alloctune.cli

CLI = Path(alloctune.cli.__file__).parent
MAX_COMMAND_LINES = 120


def command_modules() -> dict[str, int]:
    """`name_cmd.py` -> its line count, for every command module of the CLI."""
    return {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in sorted(CLI.glob("*_cmd.py"))}


def test_the_walk_sees_every_registered_command_module():
    """Guard against a glob that finds nothing (and so passes everything)."""
    from alloctune.cli import _COMMAND_MODULES

    registered = {f"{m}.py" for m in _COMMAND_MODULES if m.endswith("_cmd")}
    assert len(registered) >= 10
    assert registered <= set(command_modules())


def test_no_command_module_over_the_limit():
    over = {name: n for name, n in command_modules().items() if n > MAX_COMMAND_LINES}
    assert over == {}, (f"command modules over {MAX_COMMAND_LINES} lines: {over}; move decisions into the core "
                        "package the command calls and rendering into a cli/*_view.py module")


def test_the_limit_can_fail(tmp_path, monkeypatch):
    """A long command module is reported (so the rule can fail)."""
    (tmp_path / "long_cmd.py").write_text("x = 1\n" * (MAX_COMMAND_LINES + 1))
    (tmp_path / "short_cmd.py").write_text("x = 1\n")
    monkeypatch.setattr(sys.modules[__name__], "CLI", tmp_path)
    assert command_modules() == {"long_cmd.py": MAX_COMMAND_LINES + 1, "short_cmd.py": 1}


# ---- what moved out of the commands ---------------------------------------------------------------
def test_plan_sizes_are_repeatable_and_comma_separated():
    from alloctune.errors import InputError
    from alloctune.plan.inputs import parse_sizes

    assert parse_sizes(["4GiB, 8GiB", "16GiB", " ,"], "--card") == [4 << 30, 8 << 30, 16 << 30]
    assert parse_sizes(None, "--cap") == []
    with pytest.raises(InputError, match="--cap"):
        parse_sizes(["4GiB,lots"], "--cap")


def test_plan_confirm_program_is_split_as_a_shell_would():
    from alloctune.errors import InputError
    from alloctune.plan.confirm import command_words

    assert command_words(None) is None
    assert command_words("python 'my infer.py' --len {size}") == ["python", "my infer.py", "--len", "{size}"]
    with pytest.raises(InputError, match="No closing quotation"):
        command_words("'unbalanced")
    with pytest.raises(InputError, match="needs a program"):
        command_words("   ")


def test_run_exit_status_follows_the_shell():
    from alloctune.cli.run_cmd import TIMEOUT_EXIT, exit_status
    from alloctune.run.trial import TrialResult

    def trial(outcome: str, code: int | None) -> TrialResult:
        return TrialResult(command=("x",), conf=None, budget=None, outcome=outcome, exit_code=code, wall_s=0.0)

    assert exit_status(trial("ok", 0)) == 0
    assert exit_status(trial("crash", 3)) == 3
    assert exit_status(trial("crash", -9)) == 137  # killed by SIGKILL: 128 + 9
    assert exit_status(trial("timeout", -15)) == TIMEOUT_EXIT == 124
    assert exit_status(trial("no-cuda", None)) == 0


def test_diagnose_summary_states_each_shared_fix_once():
    """Ranks that fail the same way share one fix: it is stated once, naming every group it covers."""
    from alloctune.diagnose.groups import shared_fixes, summarise
    from alloctune.diagnose.scan import scan_reports

    msg = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacity of "
           "6.00 GiB of which 0 bytes is free. Of the allocated memory 2.93 GiB is allocated by PyTorch, and 2.30 GiB "
           "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
    log = "".join(f"[rank{r}] {msg}\n" for r in (0, 1, 2, 0))
    summary = summarise(scan_reports([log], None))
    assert len(summary.groups) == 3
    shared = shared_fixes(summary.groups)
    assert len(shared) == 1 and shared[0].groups == (1, 2, 3)
    assert shared[0].fix == summary.groups[0].fix[0] and shared[0].line == summary.groups[0].fix[1]
