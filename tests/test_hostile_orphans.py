"""No orphaned workloads: when `alloctune run` / `tune` dies (kill -9, SIGTERM, SIGHUP) the workload dies
with it, trial folders are cleaned up, and --resume reports a trial of an earlier sweep still running
(issue #19, item 4), with POSIX process groups and in portable mode (`process_mode`). Workloads are
tiny Python sleepers (no GPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import hostile_probes as hp
from alloctune.errors import EnvironmentProblem
from alloctune.run.process import PORTABLE_ENV, check_previous_trial, group_alive, pid_alive, sweep_stale_trial_dirs
from alloctune.run.runner import TrialEvaluator

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals (SIGKILL, SIGHUP) to alloctune")


@pytest.fixture(autouse=True, params=["groups", "portable"])
def process_mode(request, monkeypatch):
    """Each test twice: with POSIX process groups, and with `ALLOCTUNE_PORTABLE_PROCESS=1`, the path
    Windows takes (psutil trees by pid and creation time; killpg and PR_SET_PDEATHSIG off), here and
    in every alloctune and workload started from here (they inherit the variable)."""
    if request.param == "portable":
        monkeypatch.setenv(PORTABLE_ENV, "1")

        def no_killpg(*args):
            raise AssertionError("os.killpg used in portable mode")

        monkeypatch.setattr(os, "killpg", no_killpg)
    else:
        monkeypatch.delenv(PORTABLE_ENV, raising=False)
    return request.param

# Writes its pid (and, with CHILD=1, a grandchild's) then sleeps: the process that must not outlive alloctune.
SLEEPER = """
import os, subprocess, sys, time
out = sys.argv[1]
pids = [os.getpid()]
if os.environ.get("CHILD") == "1":
    pids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]).pid)
with open(out + ".tmp", "w") as fh:
    fh.write(" ".join(map(str, pids)))
os.replace(out + ".tmp", out)
time.sleep(120)
"""


@pytest.fixture()
def env(tmp_path):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    (tmp_path / "tmp").mkdir()
    return hp.cli_env({"TMPDIR": str(tmp_path / "tmp"), "HOME": str(tmp_path / "home"),
                       "ALLOCTUNE_STATE_DIR": str(tmp_path / "live")})


def start(args, env):
    return subprocess.Popen([sys.executable, "-m", "alloctune", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def kill_all(pids):
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
def test_run_killed_takes_its_workload_along(tmp_path, env, sig):
    marker = tmp_path / "pids"
    proc = start(["run", "--", sys.executable, str(tmp_path / "sleeper.py"), str(marker)], dict(env, CHILD="1"))
    pids = hp.wait_for(marker)
    try:
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        proc.send_signal(sig)
        proc.wait(timeout=30)
        assert hp.gone(pids), f"workload still running after {sig.name} to alloctune run"
        if sig != signal.SIGKILL:
            assert proc.returncode == 128 + sig  # exited through its own cleanup
            assert not list((tmp_path / "tmp").glob("alloctune-trial-*"))
    finally:
        kill_all(pids)


def test_tune_killed_takes_its_trial_along_and_a_second_tune_is_refused(tmp_path, env):
    marker = tmp_path / "pids"
    store = tmp_path / "s.jsonl"
    cmd = ["tune", "--store", str(store), "--knobs", "expandable", "--", sys.executable,
           str(tmp_path / "sleeper.py"), str(marker)]
    first = start(cmd, env)
    pids = hp.wait_for(marker)
    try:
        second = subprocess.run([sys.executable, "-m", "alloctune", *cmd], env=env, capture_output=True, text=True,
                                timeout=60)
        out = hp.Outcome(second.returncode, second.stdout, second.stderr)
        assert hp.verdict(out) == "clean" and second.returncode == 2, second.stderr
        assert "in use by another alloctune tune" in second.stderr and f"pid {first.pid}" in second.stderr
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        assert hp.gone(pids), "the trial survived kill -9 of tune"
        # its trial folder is left behind by the kill, and removed by the next run's sweep
        assert list((tmp_path / "tmp").glob("alloctune-trial-*"))
        assert sweep_stale_trial_dirs(tmp_path / "tmp") >= 1
        assert not list((tmp_path / "tmp").glob("alloctune-trial-*"))
        # the lock died with the process: the store opens again (and the torn sweep can resume)
        from alloctune.tune.store import TrialStore

        with TrialStore(store, cmd[6:], resume=True) as reopened:
            assert len(reopened) == 0
    finally:
        kill_all(pids)


def test_resume_reports_a_previous_trial_still_running(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        workdir = tmp_path / "trials.d"
        workdir.mkdir()
        (workdir / "running.json").write_text(json.dumps({"runner_pid": 999_999_999, "pgid": sleeper.pid,
                                                          "conf": "expandable_segments:True"}))
        with pytest.raises(EnvironmentProblem, match=rf"process group {sleeper.pid}.*kill -- -{sleeper.pid}"):
            TrialEvaluator(["python", "x.py"], workdir)
        sleeper.kill()
        sleeper.wait()
        assert not group_alive(sleeper.pid)
        TrialEvaluator(["python", "x.py"], workdir)  # the group is gone: the stale file is removed
        assert not (workdir / "running.json").exists()
    finally:
        sleeper.kill()


def test_damaged_pid_file_is_ignored(tmp_path):
    (tmp_path / "running.json").write_text("{not json")
    check_previous_trial(tmp_path / "running.json")
    assert not (tmp_path / "running.json").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_swallowed_while_the_trial_starts_still_stops_it(tmp_path, env, monkeypatch, sig):
    """Python runs a signal's handler inside Popen's at-fork hooks, where an exception is printed as
    "Exception ignored" and dropped (how Ctrl-C was lost in CI): no exception may be raised there, and
    the trial must stop anyway once the child is up, its workload with it."""
    import alloctune.run.runner as runner

    real_popen = subprocess.Popen
    raised_inside: list[BaseException] = []

    def popen_that_swallows(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        hp.wait_for(marker)  # the workload is up
        try:  # what the at-fork hook does with the handler's exception
            os.kill(os.getpid(), sig)
            time.sleep(1.0)  # the handler runs here
        except BaseException as exc:
            raised_inside.append(exc)
        return proc

    marker = tmp_path / "pids"
    monkeypatch.setattr(runner.subprocess, "Popen", popen_that_swallows)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt if sig == signal.SIGINT else SystemExit):
        runner.run_trial([sys.executable, str(tmp_path / "sleeper.py"), str(marker)], timeout=60)
    assert not raised_inside  # nothing for a hook to print and drop
    assert time.monotonic() - t0 < 30  # not the sleeper's 120 s, nor the timeout
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers put back
    assert hp.gone(hp.wait_for(marker)), "the workload outlived the interrupted trial"
