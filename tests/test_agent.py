"""The in-process agent, run in real child processes: with no torch, and with a fake CUDA torch."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from alloctune.agent import bootstrap
from alloctune.errors import InputError
from alloctune.run.runner import raise_for_environment, run_trial
from fake_torch import install

PY = sys.executable
MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture()
def fake_env(tmp_path):
    """Environment whose PYTHONPATH puts the fake torch first, and a private live-state dir."""
    install(tmp_path / "fake")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tmp_path / "fake")
    env["ALLOCTUNE_STATE_DIR"] = str(tmp_path / "live")
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env.pop(k, None)
    return env


def script(tmp_path, body: str) -> list[str]:
    path = tmp_path / "work.py"
    path.write_text(textwrap.dedent(body))
    return [PY, str(path)]


def test_chains_existing_sitecustomize_and_reports_for_a_torchless_child(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    marker = tmp_path / "chained.txt"
    (other / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    env = dict(os.environ, PYTHONPATH=str(other))
    log = tmp_path / "out.log"
    cmd = [PY, "-c", "import sys; print('torch loaded:', 'torch' in sys.modules)"]
    res = run_trial(cmd, env=env, capture=log)
    assert marker.read_text() == "ran"  # the site's own sitecustomize still ran
    assert "torch loaded: False" in log.read_text()  # the agent did not import torch
    assert res.processes == 1  # ... but it did write its report
    assert res.outcome == "no-cuda" and res.error == "the command never imported torch"
    assert res.exit_code == 0


def test_budget_stats_settings_and_throughput(tmp_path, fake_env):
    cmd = script(tmp_path, """
        import json, torch
        torch.cuda.fake_alloc(300 << 20)
        torch.cuda.fake_alloc(100 << 20 | 5)
        print("throughput: 12.5 items/s")
        print("OWN", json.dumps(torch.cuda.memory_stats()))
        print("FRACTION", torch.cuda.fake_state["fraction_calls"], torch.cuda.fake_state["cap"])
    """)
    log = tmp_path / "out.log"
    res = run_trial(cmd, conf="expandable_segments:True", budget=GiB + 12345, env=fake_env, capture=log)
    text = log.read_text()
    assert res.outcome == "ok" and res.exit_code == 0
    own = json.loads(text.split("OWN ", 1)[1].splitlines()[0])
    # the report equals what the workload itself read from memory_stats()
    assert res.peak_reserved == own["reserved_bytes.all.peak"] == 300 * MiB + 102 * MiB
    assert res.peak_allocated == own["allocated_bytes.all.peak"] == 400 * MiB + 5
    assert res.stats == {k: own[k] for k in bootstrap.STAT_KEYS}
    cap = int(text.split("FRACTION ", 1)[1].split()[-1])
    assert cap >= GiB + 12345 and cap - (GiB + 12345) < 8  # the budget, not one byte less
    assert res.allocator_settings["expandable_segments"] is True
    assert res.allocator_settings["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert res.warnings == ()
    assert (res.throughput, res.throughput_unit) == (12.5, "items/s")
    assert res.total_memory == 8 * GiB and res.device_name == "Fake GPU" and res.torch_version == "2.11.0+fake"
    assert res.utilization == pytest.approx((400 * MiB + 5) / (402 * MiB))


def test_oom_is_classified_with_message_and_snapshot(tmp_path, fake_env):
    cmd = script(tmp_path, """
        import torch
        torch.cuda.fake_alloc(600 << 20)
        torch.cuda.fake_alloc(600 << 20)
    """)
    res = run_trial(cmd, budget=GiB, on_oom="snapshot", oom_dir=tmp_path, env=fake_env, capture=tmp_path / "o.log")
    assert res.outcome == "oom" and res.exit_code == 1
    assert res.oom_message == "CUDA out of memory. Tried to allocate 600.00 MiB."
    assert res.num_ooms == 1 and res.num_alloc_retries == 1
    assert res.peak_reserved == 600 * MiB
    assert res.oom_snapshot and os.path.exists(res.oom_snapshot)
    assert os.path.dirname(res.oom_snapshot) == str(tmp_path.resolve())


def test_caught_oom_then_exit_1_is_still_an_oom(tmp_path, fake_env):
    cmd = script(tmp_path, """
        import sys, torch
        try:
            torch.cuda.fake_alloc(2 << 30)
        except torch.OutOfMemoryError:
            print("skipped the item")
            sys.exit(1)
    """)
    res = run_trial(cmd, budget=GiB, env=fake_env, capture=tmp_path / "o.log")
    assert res.outcome == "oom" and res.exit_code == 1


def test_budget_larger_than_card(tmp_path, fake_env):
    cmd = script(tmp_path, "import torch; torch.cuda.fake_alloc(1 << 20); print('must not run')\n")
    log = tmp_path / "o.log"
    res = run_trial(cmd, budget=9 * GiB, env=fake_env, capture=log)
    assert res.outcome == "budget-too-large" and res.exit_code == bootstrap.EXIT_BUDGET_TOO_LARGE
    assert "must not run" not in log.read_text()
    with pytest.raises(InputError, match=r"budget 9\.00 GiB is larger than the card \(8\.00 GiB\) Fake GPU"):
        raise_for_environment(res)


def test_setting_that_did_not_take_effect_is_reported(tmp_path, fake_env):
    cmd = script(tmp_path, "import torch; torch.cuda.fake_alloc(1 << 20)\n")
    res = run_trial(cmd, conf="expandable_segments:True", env=dict(fake_env, FAKE_IGNORE_CONF="1"),
                    capture=tmp_path / "o.log")
    assert res.outcome == "ok"
    assert any("expandable_segments: asked True" in w for w in res.warnings)


def test_torch_without_cuda_is_no_cuda(tmp_path, fake_env):
    cmd = script(tmp_path, "import torch; torch.cuda.fake_alloc(1 << 20)\n")
    res = run_trial(cmd, env=dict(fake_env, FAKE_NO_CUDA="1"), capture=tmp_path / "o.log")
    assert res.outcome == "no-cuda" and res.exit_code == 1
    assert "is_available() is False" in res.error


def test_record_gives_segment_sizes_and_a_snapshot_file(tmp_path, fake_env):
    cmd = script(tmp_path, """
        import torch
        for mb in (30, 30, 64, 5):
            torch.cuda.fake_alloc(mb << 20)
    """)
    rec = tmp_path / "trace.pickle"
    res = run_trial(cmd, record=rec, env=fake_env, capture=tmp_path / "o.log")
    assert res.outcome == "ok"
    assert res.segment_sizes == ((6 * MiB, 1), (30 * MiB, 2), (64 * MiB, 1))
    assert res.snapshot == str(rec) and rec.stat().st_size > 0


def test_record_max_entries_and_device_reach_the_agent(tmp_path, fake_env):
    cmd = script(tmp_path, """
        import os, sys, torch
        torch.cuda.fake_alloc(2 << 20)
        agent = sys.modules["_alloctune_agent_bootstrap"]._AGENT
        print("pid", os.getpid(), "entries", torch.cuda.fake_state.get("max_entries"), "device", agent.device,
              "notes", agent.agent_errors)
    """)
    log = tmp_path / "o.log"
    res = run_trial(cmd, record=tmp_path / "t.{pid}.pickle", record_max_entries=321, device=0, env=fake_env,
                    capture=log)
    text = log.read_text()
    assert res.outcome == "ok" and "entries 321 device 0 notes []" in text
    pid = text.split("pid ")[1].split()[0]
    assert res.snapshot == str(tmp_path / f"t.{pid}.pickle") and os.path.getsize(res.snapshot) > 0
    res = run_trial(cmd, device=3, env=fake_env, capture=log)  # not there: measured the default, noted, ran on
    assert res.outcome == "ok"
    assert "entries None device 0 notes ['device 3 is not visible (1 devices); measured device 0']" in log.read_text()
    with pytest.raises(InputError, match="--max-entries must be at least 1"):
        run_trial(cmd, record=tmp_path / "t.pickle", record_max_entries=0, env=fake_env)
    with pytest.raises(InputError, match="--device must be a CUDA device index"):
        run_trial(cmd, device=-1, env=fake_env)


def test_sigterm_at_timeout_still_reports(tmp_path, fake_env):
    cmd = script(tmp_path, """
        import time, torch
        torch.cuda.fake_alloc(50 << 20)
        print("allocated", flush=True)
        time.sleep(60)
    """)
    res = run_trial(cmd, timeout=3, env=fake_env, capture=tmp_path / "o.log", kill_grace=5)
    assert res.outcome == "timeout"
    assert res.wall_s < 15
    assert res.processes == 1 and res.peak_reserved == 50 * MiB  # written by the SIGTERM handler


def test_live_sample_contract(tmp_path, fake_env):
    cmd = script(tmp_path, """
        import json, os, time, torch
        torch.cuda.fake_alloc(70 << 20)
        path = os.path.join(os.environ["ALLOCTUNE_STATE_DIR"], f"live-{os.getpid()}.json")
        for _ in range(50):
            if os.path.exists(path):
                break
            time.sleep(0.1)
        time.sleep(1.2)  # at least one refresh after the allocation
        print("LIVE", open(path).read().replace("\\n", " "))
    """)
    log = tmp_path / "o.log"
    res = run_trial(cmd, budget=GiB, conf="", env=dict(fake_env, RANK="3", LOCAL_RANK="0"), capture=log)
    assert res.outcome == "ok"
    live = json.loads(log.read_text().split("LIVE ", 1)[1])
    assert live["schema"] == 1 and live["kind"] == "alloctune-live"
    assert live["rank"] == 3 and live["local_rank"] == 0 and live["budget"] == GiB
    assert live["stats"]["reserved_bytes.all.current"] == 70 * MiB
    assert live["cmd"][0].endswith("work.py") and live["total_memory"] == 8 * GiB
    assert os.listdir(tmp_path / "live") == []  # removed at exit


def test_fraction_for_rounds_up_and_keeps_gc_cap():
    total = 150109880320
    for budget in (1, 12345, 2 * GiB + 1, total // 3, total - 1):
        f = bootstrap.fraction_for(budget, total)
        assert int(f * total) >= budget and int(f * total) - budget < 64
    assert bootstrap.fraction_for(total, total) == 1.0
    assert bootstrap.fraction_for(total, total, ensure_cap=True) < 1.0


def test_load_config_inline_and_directory(tmp_path):
    assert bootstrap.load_config(None) is None and bootstrap.load_config("  ") is None
    cfg = bootstrap.load_config('{"budget": 5}')
    assert cfg["budget"] == 5 and cfg["live"] is True and cfg["report_dir"] is None
    (tmp_path / "agent.json").write_text('{"on_oom": "snapshot"}')
    cfg = bootstrap.load_config(str(tmp_path))
    assert cfg["report_dir"] == str(tmp_path) and cfg["on_oom"] == "snapshot"


def test_failing_chained_sitecustomize_does_not_stop_the_agent(tmp_path, fake_env):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("raise RuntimeError('site is broken')\n")
    env = dict(fake_env, PYTHONPATH=f"{fake_env['PYTHONPATH']}{os.pathsep}{other}")
    log = tmp_path / "o.log"
    res = run_trial(script(tmp_path, "import torch; torch.cuda.fake_alloc(4 << 20)\n"), env=env, capture=log)
    assert "Error in sitecustomize (chained by alloctune): RuntimeError: site is broken" in log.read_text()
    assert res.outcome == "ok" and res.peak_reserved == 4 * MiB


def test_nested_run_does_not_load_the_agent_twice(tmp_path, fake_env):
    from alloctune.agent import make_site_dir

    outer = make_site_dir(tmp_path / "outer-site")  # as if an outer `alloctune run` had put it there
    env = dict(fake_env, PYTHONPATH=f"{outer}{os.pathsep}{fake_env['PYTHONPATH']}")
    cmd = script(tmp_path, "import torch; torch.cuda.fake_alloc(2 << 20)\n"
                           "print('budget applied', len(torch.cuda.fake_state['fraction_calls']), 'time(s)')\n")
    log = tmp_path / "o.log"
    res = run_trial(cmd, env=env, budget=GiB, capture=log)
    assert res.outcome == "ok" and res.processes == 1
    assert "budget applied 1 time(s)" in log.read_text()  # one agent, not two
    assert "Error" not in log.read_text()


def test_record_marks_the_programs_empty_cache_calls(tmp_path, fake_env):
    """A call that releases nothing leaves no allocator event; the agent's mark makes it exact (#18.6)."""
    from alloctune.trace import EMPTY_CACHE, load_trace
    from alloctune.trace.stream import EMPTY_CACHE_MARKS_KEY

    assert bootstrap.EMPTY_CACHE_MARKS_KEY == EMPTY_CACHE_MARKS_KEY
    cmd = script(tmp_path, """
        import time, torch
        x = torch.empty(3 << 20, device="cuda")
        time.sleep(0.01)
        torch.cuda.empty_cache()
        time.sleep(0.01)
        y = torch.empty(5 << 20, device="cuda")
        torch.cuda.memory.empty_cache()
    """)
    rec = tmp_path / "trace.pickle"
    res = run_trial(cmd, record=rec, env=fake_env, capture=tmp_path / "o.log")
    assert res.outcome == "ok", res
    trace = load_trace(rec, partial=True)
    ops = [op for op in trace.requests.ops]
    assert ops.count(EMPTY_CACHE) == 2
    assert ops.index(EMPTY_CACHE) == 1  # between the two allocations, as called


@pytest.mark.parametrize("stacks,expected", [(None, ["alloc", "python"]), ("all", ["alloc", "all"]),
                                             ("none", [None, "python"])])
def test_record_keeps_python_frames_unless_told_not_to(tmp_path, fake_env, stacks, expected):
    """#27.4: a recorded history keeps each allocation's frames (for explain) by default."""
    cmd = script(tmp_path, """
        import torch
        torch.cuda.fake_alloc(1 << 20)
        print("HISTORY", torch.cuda.fake_state["history_args"])
    """)
    res = run_trial(cmd, record=tmp_path / "rec.pickle", stacks=stacks, env=fake_env, capture=tmp_path / "o.log")
    assert res.outcome == "ok"
    assert f"HISTORY {expected}" in (tmp_path / "o.log").read_text()


def test_unknown_stacks_is_refused(tmp_path, fake_env):
    with pytest.raises(InputError, match="--stacks 'some'"):
        run_trial([PY, "-c", "pass"], record=tmp_path / "r.pickle", stacks="some", env=fake_env)


AUTOGRAD_PROGRAM = """
    import torch

    class Net(torch.nn.Module):
        def forward(self, x):
            return torch.empty(1 << 20, device="cuda")

    net = Net()
    for _ in range(3):
        y = net(None)
    if TRAIN:
        y.backward()
    with torch.no_grad():
        net(None)
    print("GRAD ON AT EXIT", torch.is_grad_enabled())
"""


@pytest.mark.parametrize("train", [False, True])
def test_a_recording_says_whether_autograd_was_on_for_nothing(tmp_path, fake_env, train):
    """#29.2: module calls with and without grad and backward passes are counted while recording."""
    cmd = script(tmp_path, AUTOGRAD_PROGRAM.replace("TRAIN", str(train)))
    res = run_trial(cmd, record=tmp_path / "rec.pickle", env=fake_env, capture=tmp_path / "o.log")
    assert res.outcome == "ok", (tmp_path / "o.log").read_text()
    assert res.autograd == {"module_calls_with_grad": 3, "module_calls_without_grad": 1,
                            "backward_calls": int(train)}
    assert res.inference_with_grad is (not train) and res.to_dict()["inference_with_grad"] is (not train)


def test_no_grad_switch_runs_the_program_with_autograd_off(tmp_path, fake_env):
    cmd = script(tmp_path, AUTOGRAD_PROGRAM.replace("TRAIN", "False"))
    res = run_trial(cmd, record=tmp_path / "rec.pickle", no_grad=True, env=fake_env, capture=tmp_path / "o.log")
    assert res.outcome == "ok" and res.no_grad
    assert "GRAD ON AT EXIT False" in (tmp_path / "o.log").read_text()
    assert res.autograd == {"module_calls_with_grad": 0, "module_calls_without_grad": 4, "backward_calls": 0}
    plain = run_trial(cmd, env=fake_env, capture=tmp_path / "p.log")  # off by default, and not watched
    assert "GRAD ON AT EXIT True" in (tmp_path / "p.log").read_text() and plain.autograd is None


CUDNN_PROGRAM = """
    import torch

    torch.cuda.fake_alloc(1 << 20)
    if SETS_ITSELF:
        torch.backends.cudnn.benchmark = False
    print("BENCHMARK", torch.backends.cudnn.benchmark)
"""


@pytest.mark.parametrize("sets_itself", [False, True])
def test_cudnn_switch_sets_the_flag_and_reads_back_what_the_program_left(tmp_path, fake_env, sets_itself):
    """#29.3: the agent sets torch.backends.cudnn.benchmark at torch import; the report says what the
    program left, so a program that sets the flag itself is seen overriding the switch."""
    cmd = script(tmp_path, CUDNN_PROGRAM.replace("SETS_ITSELF", str(sets_itself)))
    res = run_trial(cmd, cudnn_benchmark=True, env=fake_env, capture=tmp_path / "o.log")
    assert res.outcome == "ok", (tmp_path / "o.log").read_text()
    assert res.cudnn_benchmark_set is True and res.cudnn_benchmark is (not sets_itself)
    assert f"BENCHMARK {not sets_itself}" in (tmp_path / "o.log").read_text()
    plain = run_trial(cmd, env=fake_env, capture=tmp_path / "p.log")  # left alone by default
    assert plain.cudnn_benchmark_set is None and plain.cudnn_benchmark is False
    assert "BENCHMARK False" in (tmp_path / "p.log").read_text()
