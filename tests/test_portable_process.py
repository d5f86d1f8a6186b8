"""Process control without POSIX process groups: the path Windows takes, run here on POSIX with
`ALLOCTUNE_PORTABLE_PROCESS=1` (psutil trees known by pid and creation time; no killpg, prctl,
/proc or watch pipe), the store's lock through filelock, and the platform rules each side shares.

The reliability tests of the runner (`test_hostile_orphans.py`, `test_runner.py`,
`test_executors.py`) run in both modes too; this file holds what only the portable path has:
processes outside the trial's group, a workload whose interpreter lacks psutil, pid reuse."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from types import SimpleNamespace

import psutil
import pytest

import hostile_probes as hp
from alloctune.agent import watchdog
from alloctune.run import process
from alloctune.tune.store import StoreBusy, TrialStore
from tune_fakes import COMMAND

POSIX = pytest.mark.skipif(os.name != "posix", reason="the workloads here use POSIX signals and sh")


def _forbidden(name: str):
    def call(*args, **kwargs):
        raise AssertionError(f"{name} used in portable mode")

    return call


@pytest.fixture()
def portable(monkeypatch):
    """Portable mode in this process and its children; the POSIX-only calls fail loudly here."""
    monkeypatch.setenv(watchdog.PORTABLE_ENV, "1")
    if hasattr(os, "killpg"):
        monkeypatch.setattr(os, "killpg", _forbidden("os.killpg"))
    monkeypatch.setattr(os, "getpgid", _forbidden("os.getpgid"), raising=False)


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


# A Python workload that starts a helper which is not Python (no agent, no watchdog), in a session
# of its own (out of the trial's process group) and deaf to SIGTERM: only a tree reaches it.
DETACHED = textwrap.dedent("""
    import os, subprocess, sys, time
    out = sys.argv[1]
    helper = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 120"], start_new_session=True)
    time.sleep(0.3)
    with open(out + ".tmp", "w") as fh:
        fh.write(" ".join(map(str, [os.getpid(), helper.pid])))
    os.replace(out + ".tmp", out)
    time.sleep(120)
""")


def test_the_mode_is_read_from_the_environment(monkeypatch):
    for value, expected in (("", os.name != "posix"), ("0", os.name != "posix"), ("1", True), ("yes", True)):
        monkeypatch.setenv(watchdog.PORTABLE_ENV, value)
        assert watchdog.portable() is expected and process.portable() is expected


def test_start_options_per_platform(monkeypatch):
    monkeypatch.delenv(watchdog.PORTABLE_ENV, raising=False)
    if os.name == "posix":
        opts = process.child_start_options(os.getpid(), 7)
        assert opts["start_new_session"] and opts["pass_fds"] == (7,)
        assert (opts["preexec_fn"] is not None) == sys.platform.startswith("linux")
    monkeypatch.setenv(watchdog.PORTABLE_ENV, "1")
    if os.name == "posix":
        assert process.child_start_options(os.getpid(), 7) == {"start_new_session": True}
    assert process._die_with_parent(os.getpid()) is None  # no prctl in portable mode
    monkeypatch.setattr(os, "name", "nt")
    opts = process.child_start_options(os.getpid(), 7)
    monkeypatch.undo()
    assert list(opts) == ["creationflags"]  # no pass_fds or preexec_fn: Popen refuses them on Windows
    if sys.platform == "win32":
        assert opts["creationflags"] & subprocess.CREATE_NEW_PROCESS_GROUP


def test_pid_alive_knows_a_process_by_its_creation_time():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        born = watchdog.birth(child.pid)
        assert born is not None and abs(born - time.time()) < 30
        assert process.pid_alive(child.pid) and process.pid_alive(child.pid, born)
        assert not process.pid_alive(child.pid, born + 5.0)  # another process under the same pid
        child.kill()
        child.wait()
        assert not process.pid_alive(child.pid) and watchdog.birth(child.pid) is None
    finally:
        child.kill()
    assert not process.pid_alive(0) and not process.pid_alive(-1)


@POSIX
def test_the_tree_holds_every_descendant_and_nothing_older():
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import subprocess, time; subprocess.Popen([\"sleep\", \"60\"]); time.sleep(60)']); time.sleep(60)")
    root = subprocess.Popen([sys.executable, "-c", code])
    try:
        born = watchdog.birth(root.pid)
        end = time.monotonic() + 20
        while len(watchdog.trial_tree(root.pid, born)) < 3 and time.monotonic() < end:
            time.sleep(0.1)
        tree = watchdog.trial_tree(root.pid, born)
        assert len(tree) == 3 and tree[0].pid == root.pid
        assert watchdog.trial_tree(root.pid, born + 5.0) == []  # the pid, but not the process started then
        assert len(watchdog.trial_tree(root.pid, born - 1.0, exact=False)) == 3  # created no earlier than
    finally:
        pids = [p.pid for p in watchdog.trial_tree(root.pid, watchdog.birth(root.pid))]
        kill_all(pids)
        root.wait()


class FakeProc(SimpleNamespace):
    pass


def test_the_tree_of_a_dead_root_finds_its_orphans_not_a_reusers_children(monkeypatch):
    """Windows keeps a dead parent's pid as its children's parent pid, and soon gives that pid to a
    new process: the root's orphans are the trial's, the new process's children are not."""
    table = [
        FakeProc(pid=100, info={"ppid": 1, "create_time": 50.0}),   # pid 100 reused, long after the root
        FakeProc(pid=200, info={"ppid": 100, "create_time": 11.0}),  # the root's orphan
        FakeProc(pid=201, info={"ppid": 200, "create_time": 12.0}),  # and its child
        FakeProc(pid=300, info={"ppid": 100, "create_time": 51.0}),  # the reuser's child
        FakeProc(pid=400, info={"ppid": 100, "create_time": 5.0}),   # older than the root: not its child
    ]
    fake = SimpleNamespace(process_iter=lambda attrs: iter(table))
    monkeypatch.setattr(watchdog, "_psutil", lambda: fake)
    assert sorted(p.pid for p in watchdog.trial_tree(100, 10.0)) == [200, 201]
    assert sorted(p.pid for p in watchdog.trial_tree(100, 50.0)) == [100, 300]  # the live process itself
    monkeypatch.setattr(watchdog, "_psutil", lambda: None)
    assert watchdog.trial_tree(100, 10.0) == []  # without psutil: nothing is known


@POSIX
def test_kill_group_reaches_processes_outside_the_group(tmp_path, portable):
    marker = tmp_path / "pids"
    proc = subprocess.Popen([sys.executable, "-c", DETACHED, str(marker)], start_new_session=True)
    pids = hp.wait_for(marker)
    helper = psutil.Process(pids[1])
    helpers = [helper.pid] + [p.pid for p in helper.children(recursive=True)]
    try:
        with process._RUNNING_LOCK:
            process._RUNNING.add(proc)
        t0 = time.monotonic()
        process._kill_group(proc, grace=1.0)
        process._reap_group(proc.pid)
        assert proc.returncode is not None and time.monotonic() - t0 < 15
        assert hp.gone(helpers, timeout=20.0), "the helper in a session of its own survived"
    finally:
        with process._RUNNING_LOCK:
            process._RUNNING.discard(proc)
        kill_all(pids + helpers)


@POSIX
def test_run_trial_timeout_in_portable_mode_ends_a_detached_helper(tmp_path, portable):
    from alloctune.run.runner import run_trial

    marker = tmp_path / "pids"
    script = tmp_path / "detached.py"
    script.write_text(DETACHED)
    t0 = time.monotonic()
    res = run_trial([sys.executable, str(script), str(marker)], timeout=3, kill_grace=1)
    pids = hp.wait_for(marker)
    try:
        assert res.outcome == "timeout" and time.monotonic() - t0 < 30
        assert hp.gone(pids, timeout=20.0), "a process of the trial outlived its timeout"
        assert not process._BORN  # the root's identity is dropped once the trial is over
    finally:
        kill_all(pids)


def _alloctune_run(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "alloctune", "run", "--", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@POSIX
@pytest.mark.parametrize("mode", ["groups", "portable"])
def test_kill_9_of_run_takes_a_detached_helper_along(tmp_path, mode):
    """The helper has no watchdog and is out of the trial's group: the workload's watchdog finds it in
    the tree (portable), or in the trees it adds to the group (groups; the root's agent takes over
    from PR_SET_PDEATHSIG, which would kill the root alone)."""
    if mode == "groups" and not hasattr(os, "killpg"):
        pytest.skip("no process groups here")
    marker = tmp_path / "pids"
    (tmp_path / "tmp").mkdir()
    env = hp.cli_env({"TMPDIR": str(tmp_path / "tmp"), "HOME": str(tmp_path / "home"),
                      watchdog.PORTABLE_ENV: "1" if mode == "portable" else "0"})
    script = tmp_path / "detached.py"
    script.write_text(DETACHED)
    runner = _alloctune_run([sys.executable, str(script), str(marker)], env)
    pids = hp.wait_for(marker)
    helper = psutil.Process(pids[1])
    pids += [p.pid for p in helper.children(recursive=True)]
    try:
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=30)
        assert hp.gone(pids, timeout=20.0), f"the workload outlived kill -9 of alloctune run ({mode})"
    finally:
        kill_all(pids)


SLEEPER = textwrap.dedent("""
    import os, subprocess, sys, time
    out = sys.argv[1]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(out + ".tmp", "w") as fh:
        fh.write(" ".join(map(str, [os.getpid(), child.pid])))
    os.replace(out + ".tmp", out)
    time.sleep(120)
""")


@POSIX
@pytest.mark.parametrize("mode", ["groups", "portable"])
def test_a_workload_without_psutil_still_dies_with_alloctune(tmp_path, mode):
    """The agent runs in the workload's interpreter, which may lack psutil: with the standard library
    only, the watchdog signals the trial's group (groups), or every Python process of the trial ends
    itself (portable)."""
    blocker = tmp_path / "blocker" / "psutil"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('psutil is not installed here')\n")
    (tmp_path / "tmp").mkdir()
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER + "\n")
    probe = tmp_path / "probe.py"
    probe.write_text("import sys\ntry:\n    import psutil\n    found = 'present'\nexcept ImportError:\n    found = 'blocked'\n"
                     "open(sys.argv[1], 'w').write(found)\n")
    marker = tmp_path / "pids"
    env = hp.cli_env({"TMPDIR": str(tmp_path / "tmp"), "HOME": str(tmp_path / "home"),
                      watchdog.PORTABLE_ENV: "1" if mode == "portable" else "0"})
    # psutil blocked for the workload only (alloctune itself needs it): the blocker goes first on
    # the workload's PYTHONPATH, after the runner has put the agent's folder there
    inner = f"PYTHONPATH={blocker.parent}:$PYTHONPATH; export PYTHONPATH; "
    found = tmp_path / "found"
    subprocess.run([sys.executable, "-m", "alloctune", "run", "--", "sh", "-c",
                    inner + f'exec "{sys.executable}" "{probe}" "{found}"'], env=env, capture_output=True, timeout=120)
    assert found.read_text() == "blocked", "psutil was not blocked in the workload"
    runner = _alloctune_run(["sh", "-c", inner + f'exec "{sys.executable}" "{script}" "{marker}"'], env)
    pids = hp.wait_for(marker)
    try:
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=30)
        assert hp.gone(pids, timeout=20.0), "the workload outlived kill -9 of alloctune run"
    finally:
        kill_all(pids)


# ---- the store's lock: filelock, the same code on every platform ---------------------------------
def test_the_store_lock_names_its_holder_and_goes_with_the_last_close(tmp_path):
    path = tmp_path / "s.jsonl"
    first = TrialStore(path, COMMAND)
    owner = path.with_name(path.name + ".owner")
    assert owner.read_text().strip() == f"pid {os.getpid()}"
    second = TrialStore(path, COMMAND, resume=True)  # this process again: shares the lock
    second.close()
    assert owner.exists()
    closed = threading.Thread(target=first.close)  # closed from another thread than the one that opened it
    closed.start()
    closed.join()
    assert not owner.exists()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom alloctune.tune.store import TrialStore\n"
                               "s = TrialStore(sys.argv[1], sys.argv[2:], resume=True)\nprint('locked', flush=True)\n"
                               "time.sleep(60)\n", str(path), *COMMAND],
        stdout=subprocess.PIPE, text=True, env=hp.cli_env())
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StoreBusy, match=rf"\(pid {holder.pid}\)"):
            TrialStore(path, COMMAND, resume=True)
    finally:
        holder.kill()
        holder.wait()
    with TrialStore(path, COMMAND, resume=True) as again:  # the holder's kill released the lock
        assert len(again) == 0


@POSIX
def test_a_busy_store_without_an_owner_note_says_pid_unknown(tmp_path):
    from filelock import FileLock

    path = tmp_path / "s.jsonl"
    # A lock object of its own stands for another process: flock conflicts between two open files
    # even within one process.
    other = FileLock(str(path.with_name(path.name + ".lock")), thread_local=False)
    other.acquire()
    try:
        with pytest.raises(StoreBusy, match=r"\(pid unknown\)"):
            TrialStore(path, COMMAND)
    finally:
        other.release()
    TrialStore(path, COMMAND).close()


def test_group_alive_and_stale_folders_by_identity(tmp_path, portable):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    folder = tmp_path / f"{process.TRIAL_PREFIX}x"
    folder.mkdir()
    try:
        started = time.time() - 1.0
        assert process.group_alive(sleeper.pid) and process.group_alive(sleeper.pid, started)
        # a trial started after this process was: the pid is no longer that trial's root
        assert not process.group_alive(sleeper.pid, time.time() + 60)
        me, my_birth = os.getpid(), watchdog.birth(os.getpid())
        assert process._runner_alive({"runner_pid": me, "started": started})
        assert not process._runner_alive({"runner_pid": me, "started": my_birth - 60})  # a reuse of the pid
        (folder / process.OWNER_FILE).write_text(
            f'{{"runner_pid": {me}, "pgid": {sleeper.pid}, "started": {my_birth - 60}}}')
        assert process.sweep_stale_trial_dirs(tmp_path) == 0  # its runner is gone, its trial is not
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not process.group_alive(sleeper.pid)
    assert process.sweep_stale_trial_dirs(tmp_path) == 1 and not folder.exists()
