"""`alloctune run` end to end: exit codes and one-line errors, with real and fake-CUDA commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fake_torch import install

PY = sys.executable


def alloctune(*args, env=None, timeout=60):
    return subprocess.run([PY, "-m", "alloctune", *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture()
def fake_env(tmp_path):
    install(tmp_path / "fake")
    return dict(os.environ, PYTHONPATH=str(tmp_path / "fake"), ALLOCTUNE_STATE_DIR=str(tmp_path / "live"))


def test_command_not_found_exits_2_on_one_line():
    p = alloctune("run", "--", "no-such-cmd-xyz")
    assert p.returncode == 2
    assert p.stderr.strip() == "alloctune: error: command not found: no-such-cmd-xyz (not on PATH)"


def test_no_cuda_exits_2_on_one_line():
    p = alloctune("run", "--", PY, "-c", "print('hi')")
    assert p.returncode == 2
    assert p.stdout == "hi\n"  # the command's own output is untouched
    assert p.stderr.strip().splitlines()[-1] == (
        "alloctune: error: no CUDA in the command: the command never imported torch; nothing to measure"
    )


def test_real_cpu_torch_is_no_cuda():
    p = alloctune("run", "--", PY, "-c", "import torch; torch.zeros(1, device='cuda')")
    assert p.returncode == 2
    assert "no CUDA in the command" in p.stderr.splitlines()[-1]
    assert "Traceback" in p.stderr  # the command's own traceback, not ours: our error is one line
    assert p.stderr.splitlines()[-1].startswith("alloctune: error:")


def test_exit_code_of_the_command_and_timeout():
    assert alloctune("run", "--", "false").returncode == 1
    p = alloctune("run", "--timeout", "0.5", "--", "sleep", "30")
    assert p.returncode == 124 and "timeout" in p.stderr


def test_bad_budget_and_conf_are_one_line_errors():
    p = alloctune("run", "--budget", "6 parsecs", "--", "true")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "unknown unit" in p.stderr
    p = alloctune("run", "--conf", "max_split_size_mb:abc", "--", "true")
    assert p.returncode == 2 and p.stderr.count("\n") == 1


def test_fake_cuda_json_summary_and_budget_too_large(tmp_path, fake_env):
    work = tmp_path / "w.py"
    work.write_text("import torch\ntorch.cuda.fake_alloc(100 << 20)\nprint('done')\n")
    p = alloctune("run", "--json", "--budget", "1GiB", "--conf", "expandable_segments:True", "--", PY, str(work),
                  env=fake_env)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)  # the command's "done" went to stderr, stdout is pure JSON
    assert data["outcome"] == "ok" and data["peak_reserved"] == 100 << 20 and data["budget"] == 1 << 30
    assert "done" in p.stderr
    p = alloctune("run", "--budget", "9GiB", "--", PY, str(work), env=fake_env)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == (
        "alloctune: error: budget 9.00 GiB is larger than the card (8.00 GiB) Fake GPU: "
        "give a --budget below its total memory"
    )


def test_fake_cuda_oom_summary(tmp_path, fake_env):
    work = tmp_path / "w.py"
    work.write_text("import torch\ntorch.cuda.fake_alloc(2 << 30)\n")
    p = alloctune("run", "--budget", "1GiB", "--", PY, str(work), env=fake_env)
    assert p.returncode == 1
    assert "oom" in p.stderr and "CUDA out of memory. Tried to allocate 2048.00 MiB." in p.stderr
