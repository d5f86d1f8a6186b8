"""`alloctune record` and its bootstrap.

Without a GPU the end-to-end path runs against a stand-in `torch` package put on the
child's PYTHONPATH: it logs the calls the bootstrap makes and writes a JSON "snapshot", so
the tests check the real mechanism (sitecustomize on PYTHONPATH, chaining, atexit and
SIGTERM dumps, first-process-only, compression) without CUDA. The `gpu` test records a real
workload and reads the trace back with alloctune's safe loader.
"""

from __future__ import annotations

import gzip
import json
import lzma
import os
import sys
from pathlib import Path

import pytest

from alloctune.cli import main as cli_main
from alloctune.cli import record_cmd

FAKE_TORCH = '''
import json, os, types
_calls = {}
cuda = types.SimpleNamespace()
cuda.is_available = lambda: os.environ.get("FAKE_CUDA", "1") == "1"
def _record(**kwargs):
    _calls["record"] = kwargs
def _dump(path):
    with open(path, "w") as f:
        json.dump({"pid": os.getpid(), "record": _calls.get("record")}, f)
cuda.memory = types.SimpleNamespace(_record_memory_history=_record, _dump_snapshot=_dump)
'''


@pytest.fixture
def fake_torch(tmp_path, monkeypatch):
    """A stand-in torch for the child, and CUDA 'available' for the parent's check."""
    pkg = tmp_path / "fake" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_TORCH)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    monkeypatch.delenv("ALLOCTUNE_RECORD", raising=False)
    monkeypatch.setattr(record_cmd, "_cuda_available", lambda: True)
    return tmp_path


def _cli(argv: list[str]) -> int:
    try:
        cli_main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _one_line_error(capfd) -> str:
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_no_command_is_exit_2(capfd):
    assert _cli(["record"]) == 2
    assert "no command given" in _one_line_error(capfd)


def test_command_not_found_is_exit_2(capfd, tmp_path):
    assert _cli(["record", "--out", str(tmp_path / "t.pickle"), "--", "no-such-program-alloctune"]) == 2
    assert "command not found: 'no-such-program-alloctune'" in _one_line_error(capfd)


def test_missing_output_directory_is_exit_2(capfd, tmp_path):
    assert _cli(["record", "--out", str(tmp_path / "nope" / "t.pickle"), "--", sys.executable, "-c", "0"]) == 2
    assert "does not exist" in _one_line_error(capfd)


def test_no_cuda_is_exit_2(capfd, tmp_path, monkeypatch):
    monkeypatch.setattr(record_cmd, "_cuda_available", lambda: False)
    assert _cli(["record", "--out", str(tmp_path / "t.pickle"), "--", sys.executable, "-c", "0"]) == 2
    assert "CUDA is not available" in _one_line_error(capfd)
    assert not (tmp_path / "t.pickle").exists()


def test_records_and_compresses_by_suffix(fake_torch, capfd):
    for name, opener in (("t.pickle.xz", lzma.open), ("t.pickle.gz", gzip.open), ("t.pickle", open)):
        out = fake_torch / name
        code = _cli(["record", "--out", str(out), "--max-entries", "1234", "--device", "0", "--json",
                     "--", sys.executable, "-c", "print('child ran')"])
        assert code == 0
        stdout = capfd.readouterr().out
        assert "child ran" in stdout
        result = json.loads(stdout[stdout.index("{"):])
        assert result["schema"] == 1 and result["exit_code"] == 0 and result["bytes"] == out.stat().st_size
        with opener(out, "rb") as f:
            dumped = json.loads(f.read())
        assert dumped["record"] == {"max_entries": 1234, "context": None, "stacks": "python", "device": 0}
    assert [p.name for p in fake_torch.iterdir() if p.name.startswith(".")] == []  # raw dump removed


def test_failed_command_keeps_trace_and_exits_1(fake_torch, capfd):
    out = fake_torch / "t.pickle"
    assert _cli(["record", "--out", str(out), "--", sys.executable, "-c", "raise SystemExit(3)"]) == 1
    assert "exited with status 3" in capfd.readouterr().err
    assert json.loads(out.read_text())["record"]["max_entries"] == 5_000_000


def test_sigterm_still_dumps(fake_torch):
    out = fake_torch / "t.pickle"
    code = _cli(["record", "--out", str(out), "--", sys.executable, "-c",
                 "import os, signal, time; os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)"])
    assert code == 1  # killed by the signal (re-raised after the dump)
    assert json.loads(out.read_text())["record"]["context"] is None


def test_only_the_first_python_records(fake_torch, capfd):
    out = fake_torch / "t.pickle"
    script = (
        "import os, subprocess, sys; print('parent', os.getpid());"
        "subprocess.run([sys.executable, '-c', "
        "'import os; print(\"child sees\", os.environ.get(\"ALLOCTUNE_RECORD\"))'])"
    )
    assert _cli(["record", "--out", str(out), "--", sys.executable, "-c", script]) == 0
    stdout = capfd.readouterr().out
    parent_pid = int(stdout.split("parent ")[1].split()[0])
    assert "child sees None" in stdout
    assert json.loads(out.read_text())["pid"] == parent_pid


def test_chains_to_the_shadowed_sitecustomize(fake_torch, monkeypatch):
    site = fake_torch / "site"
    site.mkdir()
    marker = fake_torch / "marker"
    (site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(fake_torch / "fake")]))
    out = fake_torch / "t.pickle"
    assert _cli(["record", "--out", str(out), "--", sys.executable, "-c", "0"]) == 0
    assert marker.read_text() == "ran"
    assert out.exists()


def test_no_cuda_in_child_means_no_trace(fake_torch, monkeypatch, capfd):
    monkeypatch.setenv("FAKE_CUDA", "0")
    out = fake_torch / "t.pickle"
    assert _cli(["record", "--out", str(out), "--", sys.executable, "-c", "0"]) == 2
    err = capfd.readouterr().err
    assert "no trace was written" in err and "CUDA is not available in this process" in err
    assert not out.exists()


@pytest.mark.gpu
def test_records_a_real_workload(tmp_path, monkeypatch):
    from alloctune.trace import load_snapshot

    out = tmp_path / "train.pickle.xz"
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo / "src"), os.environ.get("PYTHONPATH")])))
    assert _cli(["record", "--out", str(out), "--", sys.executable, "-m", "alloctune.workloads.train",
                 "--tiny", "--device", "cuda", "--count", "2", "--quiet"]) == 0
    snapshot = load_snapshot(out)
    actions = {e["action"] for dev in snapshot["device_traces"] for e in dev}
    assert {"alloc", "free_completed", "segment_alloc"} <= actions
