"""`alloctune record`, which records through the general in-process agent (`runner.run_trial`).

Without a GPU the end-to-end path runs against `fake_torch` (a stand-in torch with a toy
CUDA allocator) on the child's PYTHONPATH, so the tests check the real mechanism: the
agent's sitecustomize, history started at CUDA init with the requested size, the dump at
exit/failure/SIGTERM/Ctrl-C, the busiest process's trace kept, compression by suffix, and
the trace read back with alloctune's safe loader. The `gpu` test records a real workload.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from alloctune.cli import record_cmd
from alloctune.trace import load_snapshot
from record_child import cli_exit, fake  # noqa: F401  (fake is a fixture)

MiB = 1 << 20


def _script(folder: Path, body: str) -> list[str]:
    path = folder / "work.py"
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def _one_line_error(capfd) -> str:
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _segments(path: Path) -> list[int]:
    snap = load_snapshot(path)
    return [e["size"] for e in snap["device_traces"][0] if e["action"] == "segment_alloc"]


# Allocates 30 MiB and 6 MiB (rounded from 5 MiB + 1), reports the history size the agent asked for.
ALLOCATING = """
    import torch
    torch.cuda.fake_alloc(30 << 20)
    torch.cuda.fake_alloc((5 << 20) + 1)
    print("max_entries", torch.cuda.fake_state["max_entries"])
"""


def test_no_command_is_exit_2(capfd):
    assert cli_exit(["record"]) == 2
    assert "no command given" in _one_line_error(capfd)


def test_command_not_found_is_exit_2(capfd, tmp_path):
    assert cli_exit(["record", "--out", str(tmp_path / "t.pickle"), "--", "no-such-program-alloctune"]) == 2
    assert "command not found: no-such-program-alloctune" in _one_line_error(capfd)


def test_missing_output_directory_is_exit_2(capfd, tmp_path):
    assert cli_exit(["record", "--out", str(tmp_path / "nope" / "t.pickle"), "--", sys.executable, "-c", "0"]) == 2
    assert "does not exist" in _one_line_error(capfd)


def test_no_cuda_is_exit_2(capfd, tmp_path, monkeypatch):
    monkeypatch.setattr(record_cmd, "_cuda_device_count", lambda: 0)
    assert cli_exit(["record", "--out", str(tmp_path / "t.pickle"), "--", sys.executable, "-c", "0"]) == 2
    assert "CUDA is not available" in _one_line_error(capfd)
    assert list(tmp_path.iterdir()) == []


def test_device_that_is_not_there_is_exit_2(capfd, fake):
    out = fake / "t.pickle"
    assert cli_exit(["record", "--out", str(out), "--device", "1", "--", sys.executable, "-c", "0"]) == 2
    assert "--device 1: only 1 CUDA device(s) visible" in _one_line_error(capfd)
    assert not out.exists()


@pytest.mark.parametrize("name", ["t.pickle.xz", "t.pickle.gz", "t.pickle"])
def test_records_and_compresses_by_suffix(fake, capfd, name):
    out = fake / name
    cmd = _script(fake, ALLOCATING)
    code = cli_exit(["record", "--out", str(out), "--max-entries", "1234", "--device", "0", "--json", "--", *cmd])
    assert code == 0
    stdout = capfd.readouterr().out
    assert "max_entries 1234" in stdout  # the agent started the history with the requested size
    result = json.loads(stdout[stdout.index("{"):])
    assert result["schema"] == 1 and result["exit_code"] == 0 and result["bytes"] == out.stat().st_size
    assert result["max_entries"] == 1234 and result["device"] == 0 and result["command"] == cmd
    assert result["wall_s"] > 0
    magic = out.read_bytes()[:6]
    assert {".xz": magic == b"\xfd7zXZ\x00", ".gz": magic[:2] == b"\x1f\x8b"}.get(out.suffix, magic[:1] == b"\x80")
    assert _segments(out) == [30 * MiB, 6 * MiB]
    assert [p.name for p in fake.iterdir() if p.name.startswith(".")] == []  # raw dumps removed


def test_failed_command_keeps_trace_and_exits_1(fake, capfd):
    out = fake / "t.pickle"
    cmd = _script(fake, ALLOCATING + "    raise SystemExit(3)\n")
    assert cli_exit(["record", "--out", str(out), "--", *cmd]) == 1
    captured = capfd.readouterr()
    assert "max_entries 5000000" in captured.out  # the default
    assert "exited with status 3" in captured.err
    assert _segments(out) == [30 * MiB, 6 * MiB]


def test_sigterm_still_dumps(fake):
    out = fake / "t.pickle"
    cmd = _script(fake, ALLOCATING + """
    import os, signal, time
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
    """)
    t0 = time.monotonic()
    assert cli_exit(["record", "--out", str(out), "--", *cmd]) == 1  # killed by the signal (re-raised after the dump)
    assert time.monotonic() - t0 < 20
    assert _segments(out) == [30 * MiB, 6 * MiB]


def test_the_busiest_cuda_process_is_kept(fake, capfd):
    """A launcher that never touches CUDA and a small CUDA user do not hide the real workload."""
    worker = _script(fake, """
        import sys, torch
        torch.cuda.fake_alloc(int(sys.argv[1]) << 20)
    """)
    launcher = fake / "launch.py"
    launcher.write_text(
        "import subprocess, sys\n"
        f"for mb in ('8', '100', '4'):\n"
        f"    subprocess.run([sys.executable, {worker[1]!r}, mb], check=True)\n"
    )
    out = fake / "t.pickle"
    assert cli_exit(["record", "--out", str(out), "--", sys.executable, str(launcher)]) == 0
    assert _segments(out) == [100 * MiB]


def test_chains_to_the_shadowed_sitecustomize(fake, monkeypatch):
    site = fake / "site"
    site.mkdir()
    marker = fake / "marker"
    (site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(fake / "fake")]))
    out = fake / "t.pickle"
    assert cli_exit(["record", "--out", str(out), "--", *_script(fake, ALLOCATING)]) == 0
    assert marker.read_text() == "ran"
    assert _segments(out) == [30 * MiB, 6 * MiB]


def test_no_cuda_in_child_means_no_trace(fake, monkeypatch, capfd):
    monkeypatch.setenv("FAKE_NO_CUDA", "1")
    out = fake / "t.pickle"
    cmd = _script(fake, "import torch\nprint(torch.cuda.is_available())\n")
    assert cli_exit(["record", "--out", str(out), "--", *cmd]) == 2
    err = capfd.readouterr().err
    assert "no trace was written" in err and "torch.cuda.is_available() is False" in err
    assert not out.exists()
    assert [p.name for p in fake.iterdir() if p.name.startswith(".")] == []


def test_torch_never_imported_means_no_trace(fake, capfd):
    out = fake / "t.pickle"
    assert cli_exit(["record", "--out", str(out), "--", sys.executable, "-c", "0"]) == 2
    assert "no trace was written: no Python process with CUDA recorded (the command never imported torch)" in (
        _one_line_error(capfd))
    assert cli_exit(["record", "--out", str(out), "--", sys.executable, "-c", "raise SystemExit(4)"]) == 2
    assert "no trace was written: it exited with status 4 and no Python process" in _one_line_error(capfd)
    assert not out.exists()


def test_ctrl_c_keeps_the_trace_so_far(fake):
    """Ctrl-C reaches `alloctune record`; the runner stops the command and the trace is kept (exit 1)."""
    ready = fake / "ready"
    cmd = _script(fake, f"""
        import time, torch
        torch.cuda.fake_alloc(12 << 20)
        open({str(ready)!r}, "w").close()
        time.sleep(60)
    """)
    out = fake / "t.pickle.gz"
    proc = subprocess.Popen([sys.executable, "-m", "alloctune", "record", "--out", str(out), "--", *cmd],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert ready.exists(), proc.communicate(timeout=5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert "interrupted; the trace up to then is kept" in err
    assert _segments(out) == [12 * MiB]


@pytest.mark.gpu
def test_records_a_real_workload(tmp_path, monkeypatch):
    out = tmp_path / "train.pickle.xz"
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo / "src"), os.environ.get("PYTHONPATH")])))
    assert cli_exit(["record", "--out", str(out), "--", sys.executable, "-m", "alloctune.workloads.train",
                 "--tiny", "--device", "cuda", "--count", "2", "--quiet"]) == 0
    snapshot = load_snapshot(out)
    actions = {e["action"] for dev in snapshot["device_traces"] for e in dev}
    assert {"alloc", "free_completed", "segment_alloc"} <= actions
