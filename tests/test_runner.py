"""Runner error paths with ordinary commands, and its pure helpers."""

from __future__ import annotations

import os
import sys
import time

import pytest

from alloctune.errors import ConfigError, EnvironmentProblem
from alloctune.run.process import PORTABLE_ENV
from alloctune.run.runner import (
    TrialResult,
    build_env,
    classify,
    conf_env,
    parse_throughput,
    raise_for_environment,
    run_trial,
    settings_mismatch,
)

PY = sys.executable
MiB = 1 << 20


def test_false_is_a_crash_with_its_exit_code():
    res = run_trial(["false"])
    assert res.outcome == "crash" and res.exit_code == 1 and res.error == "exit code 1"
    assert res.processes == 0


def test_python_exception_is_a_crash_with_the_exception(tmp_path):
    res = run_trial([PY, "-c", "raise ValueError('bad shape')"], capture=tmp_path / "o.log")
    assert res.outcome == "crash" and res.exit_code == 1
    assert res.error == "ValueError: bad shape"


def test_missing_command_is_environment_problem():
    with pytest.raises(EnvironmentProblem, match="command not found: no-such-cmd-xyz"):
        run_trial(["no-such-cmd-xyz", "--flag"])
    with pytest.raises(EnvironmentProblem, match="not executable"):
        run_trial(["/nonexistent/bin/tool"])


def test_python_without_cuda_is_no_cuda():
    res = run_trial([PY, "-c", "print(1)"])
    assert res.outcome == "no-cuda" and res.exit_code == 0
    with pytest.raises(EnvironmentProblem, match="no CUDA in the command: the command never imported torch"):
        raise_for_environment(res)


@pytest.mark.parametrize("portable", [False, True])
def test_timeout_kills_the_whole_process_group(tmp_path, monkeypatch, portable):
    """Also in portable mode (the path Windows takes: the trial's tree, no killpg)."""
    if portable:
        monkeypatch.setenv(PORTABLE_ENV, "1")
    else:
        monkeypatch.delenv(PORTABLE_ENV, raising=False)
    pidfile = tmp_path / "grandchild.pid"
    # a shell whose background child would outlive a plain kill of the shell
    cmd = ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"]
    t0 = time.monotonic()
    res = run_trial(cmd, timeout=1, kill_grace=1)
    assert res.outcome == "timeout" and time.monotonic() - t0 < 10
    grandchild = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the background sleep survived the timeout")


def test_bad_setting_is_rejected_before_running():
    with pytest.raises(ConfigError, match="max_split_size_mb"):
        run_trial(["true"], conf="max_split_size_mb:10")


def test_default_conf_removes_inherited_variables(tmp_path):
    env = build_env({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "PYTHONPATH": "/x"},
                    conf="", agent={"budget": 1}, site_dir=tmp_path)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env and "PYTORCH_ALLOC_CONF" not in env
    assert env["PYTHONPATH"] == f"{tmp_path}{os.pathsep}/x"
    assert conf_env(None) == {}
    assert conf_env("max_split_size_mb:0128") == {
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128",
        "PYTORCH_ALLOC_CONF": "max_split_size_mb:128",
    }


def test_classify_table():
    cuda_ok = {"cuda_initialized": True, "torch_imported": True, "outcome": "ok"}
    assert classify(0, False, [cuda_ok]) == ("ok", None)
    assert classify(None, True, [cuda_ok])[0] == "timeout"
    assert classify(1, False, [dict(cuda_ok, outcome="oom")]) == ("oom", None)
    assert classify(1, False, [dict(cuda_ok, outcome="crash", exception={"type": "KeyError", "message": "'x'"})]) == (
        "crash",
        "KeyError: 'x'",
    )
    assert classify(-9, False, [])[1] == "killed by SIGKILL"
    assert classify(0, False, [])[0] == "no-cuda"
    assert classify(86, False, [{"outcome": "budget-too-large"}])[0] == "budget-too-large"
    # exits 0 after OOMs it handled (cuDNN's fallbacks): ok, the counts stay as evidence
    assert classify(0, False, [dict(cuda_ok, ooms_observed=5)]) == ("ok", None)
    assert classify(1, False, [dict(cuda_ok, outcome="crash", ooms_observed=2)])[0] == "oom"


def test_parse_throughput_takes_the_last_one():
    text = "step 1\nthroughput: 10 items/s\nwarm\nThroughput=1.5e3 tok/s, done\n"
    assert parse_throughput(text) == (1500.0, "tok/s")
    assert parse_throughput("nothing here") == (None, None)


def test_settings_mismatch():
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128", "max_split_size": 128 * MiB,
                "expandable_segments": False, "garbage_collection_threshold": 0.0}
    assert settings_mismatch("max_split_size_mb:128", settings) == []
    problems = settings_mismatch("expandable_segments:True", settings)
    assert any("parsed 'max_split_size_mb:128'" in p for p in problems)
    assert any("expandable_segments: asked True" in p for p in problems)
    assert any("max_split_size_mb: asked default" in p for p in problems)
    assert settings_mismatch(None, settings) == [] and settings_mismatch("x", None) == []


def test_trial_result_round_trip():
    res = TrialResult(command=("a",), conf="", budget=5, outcome="ok", exit_code=0, wall_s=1.0,
                      peak_reserved=10, peak_allocated=5, segment_sizes=((2, 3),), warnings=("w",))
    data = res.to_dict()
    assert data["utilization"] == 0.5 and data["schema"] == 1
    assert TrialResult.from_dict(data) == res
