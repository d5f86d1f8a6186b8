"""The executor contract on this host, with fake trials (no GPU): local packing, gpus queue, store, stop."""

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

from alloctune.errors import EnvironmentProblem, InputError
from alloctune.run.process import PORTABLE_ENV
from alloctune.tune.executors import SerialExecutor, TrialRequest
from alloctune.tune.executors.factory import make_executor
from alloctune.tune.executors.gpuinfo import GpuInfo, visible_entries
from alloctune.tune.executors.gpus import GpusExecutor, gpu_slots
from alloctune.tune.executors.local import LocalExecutor, default_jobs
from alloctune.progress import ProgressLog
from alloctune.tune.executors.ray_tasks import RayExecutor, gpu_fraction
from alloctune.tune.executors.spec import SpecRunner, TrialSpec
from alloctune.tune.executors.stored import run_stored
from alloctune.tune.store import TrialStore

from executor_fakes import COMMAND, GiB, MiB, FakeTrials, requests

SRC = str(Path(__file__).resolve().parents[1] / "src")
TESTS = str(Path(__file__).resolve().parent)


def _process_mode(monkeypatch, portable: bool) -> None:
    """POSIX process groups, or portable mode (`ALLOCTUNE_PORTABLE_PROCESS=1`: the path Windows takes)."""
    if portable:
        monkeypatch.setenv(PORTABLE_ENV, "1")
    else:
        monkeypatch.delenv(PORTABLE_ENV, raising=False)


def _trial_lines(path: Path) -> list[str]:
    return sorted(line for line in path.read_text().splitlines() if '"kind":"trial"' in line)


# ---- local: packing on one GPU ---------------------------------------------------------------
def test_local_never_holds_more_than_the_memory_it_was_given():
    fake = FakeTrials(delay=0.05)
    memory = 10 * GiB  # room for three or four of these trials at once, never five
    ex = LocalExecutor(fake, jobs=8, memory=memory, context_bytes=fake.context)
    reqs = requests()
    got = list(ex.run(reqs))
    assert sorted((r.conf, r.budget) for r, _ in got) == sorted((r.conf, r.budget) for r in reqs)
    assert fake.max_held <= memory
    assert fake.max_running >= 3  # it really ran trials side by side
    assert fake.max_held <= ex.peak_bytes["gpu"] <= memory  # what it booked bounds what ran


def test_a_trial_of_several_processes_books_a_cap_and_a_context_for_each():
    fake = FakeTrials(delay=0.05)
    memory = 12 * GiB  # two-rank trials of ~2.5-3.5 GiB per rank: at most two at once
    ex = LocalExecutor(fake, jobs=8, memory=memory, context_bytes=fake.context, processes=2)
    assert len(list(ex.run(requests()))) == 15
    assert 2 * fake.max_held <= memory and fake.max_running == 2


def test_local_jobs_limit_and_exclusive_trials_run_alone():
    fake = FakeTrials(delay=0.03)
    reqs = requests()
    reqs.insert(3, TrialRequest("", None, record=True, purpose="baseline"))  # no budget: the whole card
    reqs.insert(8, TrialRequest("expandable_segments:True", 3000 * MiB, exclusive=True, purpose="throughput"))
    ex = LocalExecutor(fake, jobs=2, memory=100 * GiB, context_bytes=fake.context)
    assert len(list(ex.run(reqs))) == len(reqs)
    assert fake.max_running == 2
    assert not fake.exclusive_overlap


def test_a_trial_larger_than_the_memory_runs_alone_instead_of_never():
    fake = FakeTrials(delay=0.02)
    reqs = [TrialRequest("", 2000 * MiB), TrialRequest("", 9000 * MiB), TrialRequest("", 2200 * MiB)]
    ex = LocalExecutor(fake, jobs=4, memory=6 * GiB, context_bytes=fake.context)
    assert [r.budget for r, _ in ex.run(reqs)].count(9000 * MiB) == 1
    assert not fake.exclusive_overlap


def test_default_jobs_from_memory_and_cpus():
    assert default_jobs(None, 4 * GiB, 512 * MiB) == 1  # no NVML: sequential
    assert default_jobs(140 * GiB, 20 * GiB, 512 * MiB, cpus=16) == 6
    assert default_jobs(140 * GiB, 1 * GiB, 512 * MiB, cpus=16) == 16
    assert default_jobs(10 * GiB, 20 * GiB, 512 * MiB, cpus=16) == 1


def test_jobs_over_one_without_known_memory_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr("alloctune.tune.executors.local.probe", lambda: [])
    with pytest.raises(InputError, match="--jobs > 1 needs"):
        LocalExecutor(FakeTrials(), jobs=2)
    with pytest.raises(InputError, match="at least 1"):
        LocalExecutor(FakeTrials(), jobs=0, memory=GiB)
    assert LocalExecutor(FakeTrials()).jobs == 1


# ---- gpus: a queue over the visible GPUs ----------------------------------------------------------
def test_gpus_executor_points_each_trial_at_one_gpu():
    fake = FakeTrials(delay=0.03)
    gpus = [GpuInfo("0", "H200", 140 * GiB, 139 * GiB), GpuInfo("3", "H200", 140 * GiB, 139 * GiB)]
    log = ProgressLog()
    ex = GpusExecutor(fake, gpus=gpus, progress=log, context_bytes=fake.context)
    assert len(list(ex.run(requests()))) == 15
    assert {e["CUDA_VISIBLE_DEVICES"] for e in fake.envs} == {"0", "3"}
    assert fake.max_running == 2  # one per GPU
    per_worker = {w for ev, _, w, _ in log.events if ev == "start"}
    assert per_worker == {"gpu0", "gpu3"}
    assert log.events[-1][0] == "done"


def test_gpu_slots_groups_for_multi_process_workloads():
    gpus = [GpuInfo(str(i), "H200", 140 * GiB, (100 + i) * GiB) for i in range(5)]
    slots = gpu_slots(gpus, gpus_per_trial=2)
    assert [dict(s.env)["CUDA_VISIBLE_DEVICES"] for s in slots] == ["0,1", "2,3"]
    assert slots[0].memory == int(100 * GiB * 0.98)  # the tighter card of the pair
    with pytest.raises(EnvironmentProblem, match="needs 8 GPU"):
        gpu_slots(gpus, gpus_per_trial=8)
    with pytest.raises(EnvironmentProblem, match="no GPU visible"):
        GpusExecutor(FakeTrials(), gpus=[])


def test_visible_entries_follow_cuda_rules():
    assert visible_entries({}) is None
    assert visible_entries({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_entries({"CUDA_VISIBLE_DEVICES": "2,0"}) == ["2", "0"]
    assert visible_entries({"CUDA_VISIBLE_DEVICES": "1,-1,2"}) == ["1"]
    assert visible_entries({"CUDA_VISIBLE_DEVICES": "GPU-abc, GPU-def"}) == ["GPU-abc", "GPU-def"]


def test_make_executor_rejects_bad_combinations():
    with pytest.raises(InputError, match="not known"):
        make_executor("slurm", FakeTrials())
    with pytest.raises(InputError, match="--address is for"):
        make_executor("local", FakeTrials(), address="auto")
    with pytest.raises(InputError, match="--jobs is for"):
        make_executor("ray", FakeTrials(), jobs=2)


# ---- ray without Ray: the arithmetic and the message --------------------------------------------
def test_gpu_fraction_from_budget():
    ctx = 512 * MiB
    assert gpu_fraction(TrialRequest("", None), 140 * GiB, ctx) == 1.0
    assert gpu_fraction(TrialRequest("", 20 * GiB, exclusive=True), 140 * GiB, ctx) == 1.0
    assert gpu_fraction(TrialRequest("", 20 * GiB), None, ctx) == 1.0  # card size unknown yet
    assert gpu_fraction(TrialRequest("", 20 * GiB), 140 * GiB, ctx) == 0.15  # 20.5/140 = 0.146 -> up to 0.15
    assert gpu_fraction(TrialRequest("", 13 * GiB + 512 * MiB), 140 * GiB, ctx) == 0.1  # exactly 0.1
    assert gpu_fraction(TrialRequest("", 1 * MiB), 140 * GiB, ctx) == 0.05
    assert gpu_fraction(TrialRequest("", 200 * GiB), 140 * GiB, ctx) == 1.0
    assert gpu_fraction(TrialRequest("", 20 * GiB), 140 * GiB, ctx, processes=2) == 0.3  # 41/140 = 0.293


def test_ray_executor_without_ray_is_a_one_line_error(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_ray(name, *a, **kw):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(EnvironmentProblem, match=r"pip install 'alloctune\[ray\]'"):
        list(RayExecutor(FakeTrials()).run(requests()[:1]))
    with pytest.raises(InputError, match="HOST:PORT"):
        RayExecutor(FakeTrials(), address="nohost")


# ---- failures and stopping ------------------------------------------------------------------------
def test_a_broken_worker_is_a_failed_trial_not_a_failed_sweep():
    fake = FakeTrials(delay=0.01, raise_on="max_split_size_mb:128")
    got = dict(((r.conf, r.budget), res) for r, res in LocalExecutor(fake, jobs=3, memory=100 * GiB).run(requests()))
    assert len(got) == 15
    broken = [res for (c, _), res in got.items() if c == "max_split_size_mb:128"]
    assert all(r.outcome == "crash" and "the fake worker broke" in r.error for r in broken)
    assert all(res.outcome in ("ok", "oom") for (c, _), res in got.items() if c != "max_split_size_mb:128")


def test_the_users_setup_error_stops_the_sweep():
    class Missing(FakeTrials):
        def run_task(self, task, env):
            raise EnvironmentProblem("command not found: train.py")

    with pytest.raises(EnvironmentProblem, match="command not found"):
        list(LocalExecutor(Missing(), jobs=2, memory=100 * GiB).run(requests()))


class _OneFast(FakeTrials):
    """The first request ends at once, the others would sleep 30 s unless cancelled."""

    def run_task(self, task, env):
        self.delay = 0.01 if task.request.budget == 1800 * MiB and task.request.conf == "" else 30.0
        return super().run_task(task, env)


def test_closing_the_sweep_cancels_running_trials_and_joins_them():
    fake = _OneFast()
    log = ProgressLog()
    it = LocalExecutor(fake, jobs=3, memory=100 * GiB, progress=log).run(requests())
    t0 = time.monotonic()
    req, res = next(it)
    assert (req.conf, req.budget, res.outcome) == ("", 1800 * MiB, "oom")
    it.close()  # what a consumer stopping early (or an exception in it) does
    assert time.monotonic() - t0 < 10
    assert fake.cancelled.is_set() and fake.running == 0
    assert log.events[-1][0] == "stop"


def test_ctrl_c_stops_the_sweep_everywhere():
    import threading

    fake = FakeTrials(delay=30.0)
    ex = LocalExecutor(fake, jobs=3, memory=100 * GiB)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        list(ex.run(requests()))
    assert time.monotonic() - t0 < 10
    assert fake.cancelled.is_set() and fake.running == 0 and len(fake.calls) == 3


@pytest.mark.parametrize("portable", [False, True])
def test_ctrl_c_kills_real_trial_processes(tmp_path, monkeypatch, portable):
    """SpecRunner + runner.terminate_running: children in their own sessions do not outlive the sweep
    (also in portable mode, the path Windows takes)."""
    _process_mode(monkeypatch, portable)
    pids = tmp_path / "pids"
    pids.mkdir()
    code = "import os,sys,time; open(os.path.join(sys.argv[1], str(os.getpid())), 'w').close(); time.sleep(120)"
    spec = TrialSpec.make([sys.executable, "-c", code, str(pids)], tmp_path / "work")
    ex = LocalExecutor(SpecRunner(spec), jobs=3, memory=100 * GiB)
    it = ex.run([TrialRequest("", (1 + i) * GiB) for i in range(3)])
    deadline = time.monotonic() + 30
    import threading

    def stop_when_started():
        while len(list(pids.iterdir())) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=stop_when_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        list(it)
    started = [int(p.name) for p in pids.iterdir()]
    assert len(started) == 3
    for pid in started:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert sorted(p.name for p in (tmp_path / "work" / "logs").iterdir()) == [
        "trial-0001.log", "trial-0002.log", "trial-0003.log"]


# ---- the store: the same whoever ran it, nothing lost or repeated across a kill ---------------------
def _sweep(executor, path: Path, resume: bool = False):
    store = TrialStore(path, COMMAND, resume=resume)
    return list(run_stored(executor, requests(), store, COMMAND))


def test_store_is_identical_whichever_executor_ran_it(tmp_path):
    gpus = [GpuInfo(str(i), "H200", 140 * GiB, 139 * GiB) for i in range(3)]
    runs = {
        "serial": SerialExecutor(lambda c, b, **kw: FakeTrials().result(TrialRequest(c, b, repeat=kw["repeat"]))),
        "local": LocalExecutor(FakeTrials(delay=0.01), jobs=4, memory=20 * GiB),
        "gpus": GpusExecutor(FakeTrials(delay=0.01), gpus=gpus),
    }
    lines = {}
    for name, ex in runs.items():
        out = _sweep(ex, tmp_path / f"{name}.jsonl")
        assert len(out) == 15 and not any(t.reused for t in out)
        lines[name] = _trial_lines(tmp_path / f"{name}.jsonl")
    assert len(lines["serial"]) == 15
    assert lines["local"] == lines["serial"] and lines["gpus"] == lines["serial"]


def test_resume_runs_only_what_is_missing(tmp_path):
    path = tmp_path / "t.jsonl"
    fake = FakeTrials(delay=0.0)
    first = list(run_stored(LocalExecutor(fake, jobs=2, memory=20 * GiB), requests()[:6], TrialStore(path, COMMAND), COMMAND))
    assert len(first) == 6
    fake2 = FakeTrials(delay=0.0)
    again = list(run_stored(LocalExecutor(fake2, jobs=2, memory=20 * GiB), requests(),
                            TrialStore(path, COMMAND, resume=True), COMMAND))
    assert sum(t.reused for t in again) == 6 and len(again) == 15
    assert len(fake2.calls) == 9
    assert len(_trial_lines(path)) == 15


def test_a_request_twice_in_one_batch_runs_once(tmp_path):
    fake = FakeTrials(delay=0.0)
    reqs = [TrialRequest("", 3000 * MiB), TrialRequest("", 3000 * MiB, purpose="again")]
    out = list(run_stored(LocalExecutor(fake, jobs=2, memory=20 * GiB), reqs, TrialStore(tmp_path / "s.jsonl", COMMAND),
                          COMMAND))
    assert len(out) == 2 and len(fake.calls) == 1 and [t.reused for t in out] == [False, True]


SWEEP = textwrap.dedent("""
    import sys
    from executor_fakes import COMMAND, GiB, FakeTrials, requests
    from alloctune.tune.executors.local import LocalExecutor
    from alloctune.tune.executors.stored import run_stored
    from alloctune.tune.store import TrialStore
    store = TrialStore(sys.argv[1], COMMAND, resume=True)
    ex = LocalExecutor(FakeTrials(delay=0.4, log=sys.argv[2]), jobs=3, memory=20 * GiB)
    for t in run_stored(ex, requests(), store, COMMAND):
        pass
""")


def test_kill_and_resume_loses_and_repeats_no_finished_trial(tmp_path):
    path, log = tmp_path / "t.jsonl", tmp_path / "runs.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, TESTS]))
    proc = subprocess.Popen([sys.executable, "-c", SWEEP, str(path), str(log)], env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not path.exists() or len(_trial_lines(path)) < 5):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {json.loads(line)["key"]["conf"] + str(json.loads(line)["key"]["budget"]) for line in _trial_lines(path)}
    assert 5 <= len(before) < 15, "the kill came too late to test anything"
    n_runs_before = len(log.read_text().splitlines())

    fake = FakeTrials(delay=0.0, log=str(log))
    out = list(run_stored(LocalExecutor(fake, jobs=3, memory=20 * GiB), requests(), TrialStore(path, COMMAND, resume=True),
                          COMMAND))
    assert len(out) == 15
    rerun = {r.conf + str(r.budget) for r in fake.calls}
    assert not (rerun & before)  # nothing finished before the kill ran again
    assert rerun | before == {r.conf + str(r.budget) for r in requests()}  # nothing lost
    keys = [json.dumps(json.loads(line)["key"], sort_keys=True) for line in _trial_lines(path)]
    assert len(keys) == len(set(keys)) == 15  # each trial stored exactly once
    ends_after = [json.loads(x) for x in log.read_text().splitlines()[n_runs_before:] if '"end"' in x]
    assert len(ends_after) == 15 - len(before)


def test_executors_import_no_torch_ray_rich_or_runner():
    code = ("import sys; import alloctune.tune.executors.factory, alloctune.tune.executors.local, "
            "alloctune.tune.executors.gpus, alloctune.tune.executors.ray_tasks, alloctune.tune.executors.stored, "
            "alloctune.tune.executors.spec, alloctune.progress; "
            "print(sorted(m for m in ('torch', 'ray', 'rich', 'alloctune.run.runner') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=SRC), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_live_table_draws_workers_and_trials():
    import io

    from rich.console import Console

    from alloctune.progress import LiveTrialTable

    buf = io.StringIO()
    table = LiveTrialTable(Console(file=buf, width=150, force_terminal=False))
    gpus = [GpuInfo("0", "H200", 140 * GiB, 139 * GiB), GpuInfo("1", "H200", 140 * GiB, 139 * GiB)]
    list(GpusExecutor(FakeTrials(delay=0.01), gpus=gpus, progress=table).run(requests()[:4]))
    lines = buf.getvalue().splitlines()
    assert len(lines) == 4 and all(ln.startswith(("gpu0: #", "gpu1: #")) for ln in lines)
    assert "(default) @ 1,800 MiB (fake) -> oom" in buf.getvalue()
    drawn = Console(width=150, record=True)
    drawn.print(table._render())
    text = drawn.export_text()
    assert "4/4 finished, 0 running" in text and "gpu0" in text and "gpu1" in text


def test_executor_for_sweep_runs_real_trials_and_numbers_logs_after_a_resume(tmp_path):
    from alloctune.tune.executors.factory import executor_for_sweep

    work = tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    (work / "logs" / "trial-0007.log").write_text("from the first run of the sweep\n")
    ex = executor_for_sweep("local", [sys.executable, "-c", "print('throughput: 5 it/s')"], work, jobs=1, live=False)
    got = [res for _, res in ex.run([TrialRequest("", None), TrialRequest("expandable_segments:True", None)])]
    assert [r.outcome for r in got] == ["no-cuda", "no-cuda"]  # a real child ran (no torch in it)
    assert [r.throughput for r in got] == [5.0, 5.0]
    assert sorted(p.name for p in (work / "logs").iterdir()) == ["trial-0007.log", "trial-0008.log", "trial-0009.log"]


def test_probe_falls_back_to_nvidia_smi_and_follows_visible_devices(tmp_path, monkeypatch):
    from alloctune.tune.executors import gpuinfo

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, GPU-aaa, NVIDIA H200, 143771, 143000'\necho '1, GPU-bbb, NVIDIA H200, 143771, 100000'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    got = gpuinfo.probe({"CUDA_VISIBLE_DEVICES": "GPU-bbb,0,7"})
    assert [(g.visible_id, g.free) for g in got] == [("GPU-bbb", 100000 * MiB), ("0", 143000 * MiB)]  # stops at 7
    assert [g.visible_id for g in gpuinfo.probe({})] == ["0", "1"]
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert gpuinfo.probe({"CUDA_VISIBLE_DEVICES": "0"}) == [GpuInfo("0", None, None, None)]


@pytest.mark.parametrize("portable", [False, True])
def test_the_runners_evaluator_is_stopped_too_when_wrapped(tmp_path, monkeypatch, portable):
    """`runner.TrialEvaluator` given straight to an executor: Ctrl-C still reaches its children (also
    in portable mode)."""
    _process_mode(monkeypatch, portable)
    import threading

    from alloctune.run.runner import TrialEvaluator

    pids = tmp_path / "pids"
    pids.mkdir()
    code = "import os,sys,time; open(os.path.join(sys.argv[1], str(os.getpid())), 'w').close(); time.sleep(120)"
    ev = TrialEvaluator([sys.executable, "-c", code, str(pids)], tmp_path / "work", timeout=300)
    it = LocalExecutor(ev, jobs=2, memory=100 * GiB).run([TrialRequest("", GiB), TrialRequest("", 2 * GiB)])
    deadline = time.monotonic() + 30

    def stop_when_started():
        while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=stop_when_started, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        list(it)
    assert time.monotonic() - t0 < 30
    for pid in (int(p.name) for p in pids.iterdir()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert sorted(p.name for p in (tmp_path / "work" / "logs").iterdir()) == ["trial-0001.log", "trial-0002.log"]
