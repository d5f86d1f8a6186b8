"""`alloctune diagnose`: stdin/file input, rich and JSON output, one-line errors with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

MSG = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacity of 6.00 GiB "
       "of which 0 bytes is free. Of the allocated memory 2.93 GiB is allocated by PyTorch, and 2.30 GiB is reserved by "
       "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


# a bare environment, but the same alloctune as the test run (a worktree's src via PYTHONPATH)
ENV = {"PATH": "/usr/bin:/bin", "COLUMNS": "200", "PYTHONIOENCODING": "utf-8",
       **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}


def run(args, stdin=None):
    """The real console entry point, as a user runs it (central error handling included)."""
    return subprocess.run([sys.executable, "-m", "alloctune", "diagnose", *args], input=stdin, capture_output=True,
                          text=True, env=ENV)


def test_stdin_json():
    res = run(["-", "--json"], stdin="log line\n" + MSG + "\nmore\n")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["schema"] == "alloctune.diagnose/1"  # one schema field form for every output (#18.19)
    data = out["diagnoses"]
    assert [d["verdict"] for d in data] == ["fragmentation"]
    es = next(f for f in data[0]["fixes"] if f["id"] == "expandable_segments")
    # the message has no docs URL, so its torch version is open-ended: both variables are set
    assert es["shell"]["bash"] == ("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
                                   "export PYTORCH_ALLOC_CONF=expandable_segments:True")
    assert es["shell"]["powershell"].splitlines()[0] == "$env:PYTORCH_CUDA_ALLOC_CONF = 'expandable_segments:True'"


def test_file_rich_output_has_verdict_evidence_and_four_shells(tmp_path):
    p = tmp_path / "log.txt"
    p.write_text(MSG, encoding="utf-8")
    res = run([str(p)])
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "FRAGMENTATION" in out and "Evidence" in out and "2.30 GiB" in out
    for shell in ("bash:", "powershell:", "cmd:", "python:"):
        assert shell in out
    assert 'set "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"' in out
    assert "max_split_size_mb:1740" in out


def test_platform_option_changes_fixes(tmp_path):
    p = tmp_path / "log.txt"
    p.write_text(MSG, encoding="utf-8")
    data = json.loads(run([str(p), "--json", "--platform", "windows"]).stdout)["diagnoses"]
    es = next(f for f in data[0]["fixes"] if f["id"] == "expandable_segments")
    assert es["works"] is False and data[0]["platform"] == "windows"


@pytest.mark.parametrize("args,stdin,needle", [
    (["-"], "", "empty"),
    (["-"], "everything is fine\nno errors\n", "no out-of-memory message"),
    (["/nonexistent/file.log"], None, "no such file"),
    (["-", "--platform", "beos"], MSG, "unknown platform"),
])
def test_bad_input_exit_2_one_line(args, stdin, needle):
    res = run(args, stdin=stdin)
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("alloctune: error:") and needle in lines[0]
    assert "Traceback" not in res.stderr


def test_diagnose_snapshot_flag(traces_dir):
    """`diagnose --snapshot` explains the OOM recorded in a capped H200 run (same engine as diagnose-snapshot)."""
    import json
    import subprocess
    import sys

    snap = traces_dir / "llm" / "default_cap85.pickle.xz"
    out = subprocess.run(
        [sys.executable, "-m", "alloctune", "diagnose", "--snapshot", str(snap), "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["verdict"] == "fragmentation"
    assert data["recommendation"] == "expandable_segments:True"


@pytest.mark.parametrize("args,needle", [
    (["--budget", "6GiB"], "--budget only applies with --snapshot"),
    (["--oom", "0"], "--oom only applies with --snapshot"),
    (["--no-what-if"], "--no-what-if only applies with --snapshot"),
])
def test_snapshot_only_options_without_snapshot_are_errors(tmp_path, args, needle):
    p = tmp_path / "log.txt"
    p.write_text(MSG, encoding="utf-8")
    res = run([str(p), *args])
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("alloctune: error:") and res.stderr.count("\n") == 1 and needle in res.stderr


def test_diagnose_snapshot_alias_is_retired_with_a_pointer(tmp_path):
    res = subprocess.run([sys.executable, "-m", "alloctune", "diagnose-snapshot", str(tmp_path / "x.pickle"),
                          "--budget", "6GiB"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == ("alloctune: error: 'diagnose-snapshot' is retired: use "
                          "'alloctune diagnose --snapshot FILE' (same options)\n")
    helptext = subprocess.run([sys.executable, "-m", "alloctune", "--help"], capture_output=True, text=True,
                              timeout=60, env=ENV).stdout
    assert "diagnose-snapshot" not in helptext


def test_diagnose_cli_does_not_import_other_commands():
    """Each command module calls the core; `diagnose` used to borrow `report`'s command module."""
    import ast
    from pathlib import Path

    import alloctune.cli as cli

    for path in Path(cli.__file__).parent.glob("*_cmd.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        others = {m for m in names if m.startswith("alloctune.cli.") and m.endswith("_cmd")}
        assert not others, (path.name, others)
