"""`alloctune diagnose`: stdin/file input, rich and JSON output, one-line errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

MSG = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacity of 6.00 GiB "
       "of which 0 bytes is free. Of the allocated memory 2.93 GiB is allocated by PyTorch, and 2.30 GiB is reserved by "
       "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def run(args, stdin=None):
    """The real console entry point, as a user runs it (central error handling included)."""
    return subprocess.run([sys.executable, "-m", "alloctune", "diagnose", *args], input=stdin, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", "PYTHONIOENCODING": "utf-8"})


def test_stdin_json():
    res = run(["-", "--json"], stdin="log line\n" + MSG + "\nmore\n")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
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
    data = json.loads(run([str(p), "--json", "--platform", "windows"]).stdout)
    es = next(f for f in data[0]["fixes"] if f["id"] == "expandable_segments")
    assert es["works"] is False and data[0]["platform"] == "windows"


@pytest.mark.parametrize("args,stdin,needle", [
    (["-"], "", "empty"),
    (["-"], "everything is fine\nno errors\n", "no out-of-memory message"),
    (["/nonexistent/file.log"], None, "file not found"),
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
