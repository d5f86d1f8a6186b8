"""Trials started ahead (run/warm.py, agent/gate.py), in real child processes with the fake CUDA torch:
the held process does the program's work before CUDA while the recording runs, waits at its first CUDA
call, and once released is the same trial a cold start makes."""

from __future__ import annotations

import os
import sys
import textwrap
import time

import psutil
import pytest

from alloctune.run.runner import TrialEvaluator, run_trial
from fake_torch import install

PY = sys.executable
MiB = 1 << 20

PROGRAM = """
    import os, sys, time
    import torch
    # the program's work before CUDA: one marker file per process
    open(os.path.join(sys.argv[1], f"pre-{os.getpid()}"), "w").write(str(time.time()))
    torch.cuda.fake_alloc(300 << 20)
    print("CUDA-AT", time.time(), flush=True)
    time.sleep(float(sys.argv[2]))
    torch.cuda.fake_alloc(200 << 20)
    print("throughput: 10 items/s")
"""


@pytest.fixture()
def setup(tmp_path):
    install(tmp_path / "fake")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "fake"), ALLOCTUNE_STATE_DIR=str(tmp_path / "live"))
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env.pop(k, None)
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(PROGRAM))
    marks = tmp_path / "marks"
    marks.mkdir()
    return env, [PY, str(prog), str(marks), "1.5"], marks


def _wait(cond, limit=20.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < limit, "timed out"
        time.sleep(0.05)


def test_the_runs_after_the_recording_start_beside_it_and_equal_cold_runs(tmp_path, setup):
    env, cmd, marks = setup
    ev = TrialEvaluator(cmd, tmp_path / "work", env=env)
    ev.start_ahead(2)
    try:
        base = ev("", None, record=True)
        assert base.outcome == "ok" and base.started_ahead_s is None
        pool = ev.ahead.pool
        _wait(lambda: len(pool.held) == 2)
        held = [t.proc.pid for t in pool.held]
        # both did their work before CUDA, and wait there: no CUDA was started, no report written
        _wait(lambda: all((marks / f"pre-{pid}").exists() for pid in held))
        time.sleep(0.3)
        assert all(t.alive() and not list(t.folder.reports.iterdir()) for t in pool.held)

        warm = ev("expandable_segments:True", 400 * MiB)
        cold = run_trial(cmd, conf="expandable_segments:True", budget=400 * MiB, env=env,
                         capture=tmp_path / "cold.log")
        assert warm.started_ahead_s is not None and warm.started_ahead_s > 0
        # the same trial: setting applied and read back, cap applied, same outcome and peaks
        assert warm.allocator_settings["expandable_segments"] is True and warm.warnings == ()
        assert (warm.outcome, warm.peak_reserved, warm.num_ooms) == (cold.outcome, cold.peak_reserved, cold.num_ooms)
        assert warm.outcome == "oom" and warm.budget == 400 * MiB
        assert warm.throughput is None and "CUDA-AT" in (tmp_path / "work/logs/trial-0002.log").read_text()
        # its wall time counts from the release: the sleep after CUDA, not the start before it
        assert warm.wall_s < cold.wall_s + 1.0

        ok = ev("", 600 * MiB)
        assert ok.started_ahead_s is not None and ok.outcome == "ok" and ok.peak_reserved == 500 * MiB
        assert ok.allocator_settings["PYTORCH_CUDA_ALLOC_CONF"] == "" and ok.throughput == 10.0

        # none left: the next trial starts cold
        assert ev("", 600 * MiB).started_ahead_s is None
    finally:
        ev.close_ahead()


def test_a_remedy_run_starts_cold_and_close_ends_every_held_process(tmp_path, setup):
    env, cmd, marks = setup
    ev = TrialEvaluator(cmd, tmp_path / "work", env=env)
    ev.start_ahead(2)
    try:
        ev("", None, record=True)
        pool = ev.ahead.pool
        _wait(lambda: len(pool.held) == 2)
        procs = [psutil.Process(t.proc.pid) for t in pool.held]
        dirs = [t.folder.path for t in pool.held]
        remedy = ev("", 600 * MiB, no_grad=True)
        assert remedy.started_ahead_s is None and remedy.no_grad
        assert len(pool.held) == 2
    finally:
        ev.close_ahead()
    gone, alive = psutil.wait_procs(procs, timeout=5)
    assert not alive and not any(d.exists() for d in dirs)


def test_nothing_starts_ahead_without_a_recorded_baseline_or_where_the_host_lacks_memory(tmp_path, setup, monkeypatch):
    env, cmd, _ = setup
    ev = TrialEvaluator(cmd, tmp_path / "a", env=env)
    ev.start_ahead(2)
    try:
        ev("", 600 * MiB)  # not the recording: nothing is started beside it
        assert ev.ahead.pool.held == [] and ev.ahead.count == 2
    finally:
        ev.close_ahead()

    import alloctune.run.warm as warm

    monkeypatch.setattr(warm, "HOST_RESERVE", psutil.virtual_memory().total)
    ev = TrialEvaluator(cmd, tmp_path / "b", env=env)
    ev.start_ahead(2)
    try:
        ev("", None, record=True)
        pool = ev.ahead.pool
        _wait(lambda: pool.note is not None)
        assert pool.held == [] and "2 of 2 next runs not started ahead" in pool.note
    finally:
        ev.close_ahead()


def test_a_held_process_that_ended_before_its_release_is_not_used(tmp_path, setup):
    env, _, marks = setup
    prog = tmp_path / "nocuda.py"
    prog.write_text("import sys, time\nimport torch\nif len(sys.argv) > 1: time.sleep(1.0); torch.cuda.fake_alloc(1)\n")
    ev = TrialEvaluator([PY, str(prog)], tmp_path / "w", env=env)
    ev.start_ahead(1)
    try:
        base = ev("", None, record=True)
        # the recording never started CUDA: nothing was started beside it
        assert base.outcome == "no-cuda" and ev.ahead.pool.held == []
    finally:
        ev.close_ahead()


READS_SETTING = """
    import os, sys, time
    import torch
    time.sleep(float(sys.argv[1]))
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")  # the program chooses by the setting, before CUDA
    torch.cuda.fake_alloc(400 << 20)
    torch.cuda.fake_alloc(200 << 20)
    if "expandable_segments:True" not in conf:
        torch.cuda.fake_alloc(300 << 20)
    time.sleep(1.5)  # the recording runs long enough to start the next runs beside it
"""


@pytest.mark.parametrize("pause", [0.0, 1.5], ids=["exits-at-cuda", "released-before-it-reads"])
def test_a_program_that_reads_the_setting_before_cuda_gets_the_cold_run(tmp_path, setup, pause):
    """Held, it would read no setting; it exits at its first CUDA call (or after its release) and the
    trial runs cold, as the program needs: 600 MiB under expandable segments, not the default's 900."""
    env, _, _ = setup
    from alloctune.run.warm import READ_SETTING_NOTE

    prog = tmp_path / "reads.py"
    prog.write_text(textwrap.dedent(READS_SETTING))
    ev = TrialEvaluator([PY, str(prog), str(pause)], tmp_path / "w", env=env)
    ev.start_ahead(2)
    try:
        base = ev("", None, record=True)
        assert base.peak_reserved == 900 * MiB
        pool = ev.ahead.pool
        _wait(lambda: len(pool.held) == 2)
        if pause == 0.0:
            _wait(lambda: all(not t.alive() for t in pool.held))
        r = ev("expandable_segments:True", 800 * MiB)
        assert r.started_ahead_s is None and r.outcome == "ok" and r.peak_reserved == 600 * MiB
        assert pool.note == READ_SETTING_NOTE and pool.held == []
    finally:
        ev.close_ahead()


# ---- on the GPU: real torch -----------------------------------------------------------------------
GPU_PROGRAM = """
    import sys, time
    import torch
    time.sleep(1.0)  # the program's work before CUDA
    keep = [torch.empty(300 << 20, dtype=torch.uint8, device="cuda")]
    parts = [torch.empty(100 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
    del parts[1], parts[2]  # two 100 MiB holes: a 150 MiB block needs a new segment unless segments expand
    keep.append(torch.empty(150 << 20, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    time.sleep(float(sys.argv[1]))
"""


def _gpu_pids() -> set[int] | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
    except Exception:
        return None


@pytest.mark.gpu
def test_on_the_gpu_a_trial_started_ahead_is_the_cold_trial(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():  # this process only asks; it never initialises CUDA
        pytest.skip("needs a CUDA device")
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(GPU_PROGRAM))
    cmd = [PY, str(prog), "2.0"]
    env = dict(os.environ, ALLOCTUNE_STATE_DIR=str(tmp_path / "live"))
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env.pop(k, None)
    ev = TrialEvaluator(cmd, tmp_path / "work", env=env)
    ev.start_ahead(2)
    try:
        base = ev("", None, record=True)
        assert base.outcome == "ok"
        pool = ev.ahead.pool
        _wait(lambda: len(pool.held) == 2, limit=60)
        time.sleep(3.0)  # past their work before CUDA: held at the first CUDA call
        held = {t.proc.pid for t in pool.held}
        seen = _gpu_pids()
        if seen is not None and base.processes and seen:  # NVML sees pids here: the held ones have no context
            assert not held & seen
        runs = {}
        for conf in ("expandable_segments:True", "max_split_size_mb:64"):
            warm = ev(conf, 800 << 20)
            cold = run_trial(cmd, conf=conf, budget=800 << 20, env=env, capture=tmp_path / f"{conf[:6]}.log")
            runs[conf] = (warm, cold)
            assert warm.started_ahead_s is not None and cold.started_ahead_s is None
            assert warm.warnings == () == cold.warnings, (warm.warnings, cold.warnings)
            assert warm.allocator_settings == cold.allocator_settings
            assert (warm.outcome, warm.peak_reserved, warm.peak_allocated, warm.num_ooms) == \
                (cold.outcome, cold.peak_reserved, cold.peak_allocated, cold.num_ooms)
            assert warm.wall_s < cold.wall_s  # the second before CUDA (and the start) was made ahead
        exp, split = runs["expandable_segments:True"][0], runs["max_split_size_mb:64"][0]
        assert exp.allocator_settings["expandable_segments"] is True
        assert split.allocator_settings["max_split_size"] == 64 << 20
    finally:
        ev.close_ahead()


DRIVER = """
    import json, sys, time
    from alloctune.run.runner import TrialEvaluator
    cmd, work = json.loads(sys.argv[1]), sys.argv[2]
    ev = TrialEvaluator(cmd, work)
    ev.start_ahead(2)
    ev("", None, record=True)
    while len(ev.ahead.pool.held) < 2:
        time.sleep(0.05)
    print(json.dumps([t.proc.pid for t in ev.ahead.pool.held]), flush=True)
    time.sleep(600)
"""


@pytest.mark.skipif(os.name == "nt", reason="kill -9 is POSIX; Windows ends the tree through psutil (test_portable_process)")
@pytest.mark.parametrize("portable", ["0", "1"], ids=["posix", "portable"])
def test_held_processes_never_outlive_a_killed_alloctune(tmp_path, setup, portable):
    """kill -9 of the process that holds them (the tune): the held processes end too (their watchdog; on
    Linux also the parent-death signal of the thread that started them)."""
    import json
    import signal
    import subprocess

    env, cmd, _ = setup
    import alloctune

    src = os.path.dirname(os.path.dirname(alloctune.__file__))
    env = dict(env, PYTHONPATH=os.pathsep.join([env["PYTHONPATH"], src]), ALLOCTUNE_PORTABLE_PROCESS=portable)
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(DRIVER))
    p = subprocess.Popen([PY, str(driver), json.dumps(cmd), str(tmp_path / "w")], stdout=subprocess.PIPE,
                         text=True, env=env)
    try:
        held = json.loads(p.stdout.readline())
        procs = [psutil.Process(pid) for pid in held]
        assert all(pr.is_running() for pr in procs)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        gone, alive = psutil.wait_procs(procs, timeout=10)
        assert not alive
    finally:
        if p.poll() is None:
            p.kill()


def test_tune_through_the_side_by_side_executor_takes_the_runs_started_ahead(tmp_path, setup, monkeypatch):
    """The GPU default: the confirm flow's runs side by side on one GPU (LocalExecutor over SpecRunner, the
    runner `tune` uses when NVML reads the free memory). The opening pair takes the two processes started
    beside the recording, and the answer is the one the program's memory gives."""
    from alloctune.tune.executors.factory import executor_for_sweep
    from alloctune.tune.session import prepare

    env, _, _ = setup
    prog = tmp_path / "w.py"
    prog.write_text(textwrap.dedent("""
        import time, torch
        time.sleep(0.5)
        torch.cuda.fake_alloc(400 << 20)
        conf = torch.cuda.memory._snapshot()["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"]
        torch.cuda.fake_alloc(200 << 20)
        if "expandable_segments:True" not in conf:
            torch.cuda.fake_alloc(300 << 20)
        time.sleep(2.0)
    """))
    for name in ("PYTHONPATH", "ALLOCTUNE_STATE_DIR"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    cmd = [PY, str(prog)]
    executor = executor_for_sweep("local", cmd, tmp_path / "store.d", jobs=2, memory=8 << 30, live=False)
    outcome = prepare(cmd, budget=800 * MiB, knobs=["expandable"], store=tmp_path / "store.jsonl",
                      executor=executor).run()
    trials = [t.result for t in outcome.result.trials]
    assert trials[0].started_ahead_s is None
    ahead = [t for t in trials[1:] if t.started_ahead_s is not None]
    assert len(ahead) == 2 and all(t.started_ahead_s > 0 for t in ahead)
    assert outcome.recommendation is not None and outcome.recommendation.conf == "expandable_segments:True"
    best = outcome.result.ranking.best
    assert best.infeasible_below < 600 * MiB <= best.min_budget


@pytest.mark.parametrize("side_by_side", [False, True])
def test_the_recording_is_loaded_while_its_run_still_exits(tmp_path, setup, monkeypatch, side_by_side):
    """tune's recording is read in the prefetch thread once the agent has written it whole, while the
    program still tears down (here 1 s at interpreter exit, after the agent's snapshot), and the
    simulation takes that load instead of reading the file again: through the evaluator (no NVML) and
    through the side-by-side executor (the GPU default)."""
    import threading

    import alloctune.trace.load as load_mod
    from alloctune.tune.session import prepare

    env, _, _ = setup
    prog = tmp_path / "w.py"
    prog.write_text(textwrap.dedent("""
        import time, torch
        torch.cuda.fake_alloc(400 << 20)

        class SlowExit:  # finalized after the atexit hooks, the agent's snapshot among them
            def __del__(self):
                time.sleep(1.0)

        keep = SlowExit()
    """))
    for name in ("PYTHONPATH", "ALLOCTUNE_STATE_DIR"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.setenv("ALLOCTUNE_CACHE", "0")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    loads: list[tuple[str, str]] = []
    real = load_mod.load_through_cache

    def counted(path, device, partial):
        loads.append((os.path.basename(str(path)), threading.current_thread().name))
        return real(path, device, partial)

    monkeypatch.setattr(load_mod, "load_through_cache", counted)
    if side_by_side:
        monkeypatch.setattr("alloctune.tune.executors.gpuinfo.probe", lambda: [type("G", (), {"free": 8 << 30})()])
    cmd = [PY, str(prog)]
    tuner = prepare(cmd, budget=800 * MiB, knobs=["expandable"], store=tmp_path / "store.jsonl")
    assert (type(tuner.tuner.executor).__name__ == "LocalExecutor") == side_by_side
    outcome = tuner.run()
    assert outcome.result.baseline.snapshot
    assert [name for name, _ in loads if name == "baseline.pickle"] == ["baseline.pickle"]  # read once
    assert ("baseline.pickle", "alloctune-prefetch") in loads
