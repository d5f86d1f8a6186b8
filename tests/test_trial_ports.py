"""Every trial gets a rendezvous port of its own (#15): distributed trials side by side do not collide.

Without it, two trials of a 2-rank job started at once both bind torch's default 29500 and one
dies with `DistNetworkError: The server socket has failed to listen on any local network address.
port: 29500, ... EADDRINUSE` (a `crash` on the H200 sweep, not the setting's doing). The end-to-end
test runs such pairs on CPU with gloo through the real executor, runner and agent.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest

from alloctune.run.ports import free_port, shared_port_note, trial_port_env
from alloctune.run.runner import build_env
from alloctune.tune.executors import TrialRequest
from alloctune.tune.executors.local import LocalExecutor
from alloctune.tune.executors.ray_tasks import RayExecutor
from alloctune.tune.executors.spec import SpecRunner, TrialSpec

PY = sys.executable
GiB = 1 << 30
PORT_NAMES = ("PET_MASTER_PORT", "MASTER_PORT")
USER_VARS = (*PORT_NAMES, "PET_MASTER_ADDR", "MASTER_ADDR")
SHOW_PORTS = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {PORT_NAMES!r}}}))"


@pytest.fixture()
def clean_env(monkeypatch):
    """The sweep's own environment without any rendezvous variable (a CI runner might set one)."""
    for name in USER_VARS:
        monkeypatch.delenv(name, raising=False)


def _env(tmp_path, base, command=(PY, "train.py")):
    return build_env(base, conf=None, agent={}, site_dir=tmp_path, command=list(command))


def _run_side_by_side(tmp_path, command, env=None, timeout=90.0):
    """Two trials of `command` at once: LocalExecutor(jobs=2) → SpecRunner → run_trial → the agent."""
    spec = TrialSpec.make(command, tmp_path / "sweep", env=env)
    ex = LocalExecutor(SpecRunner(spec), jobs=2, memory=64 * GiB, context_bytes=512 << 20, processes=2,
                       timeout=timeout)
    got = list(ex.run([TrialRequest("", GiB, repeat=0), TrialRequest("", GiB, repeat=1)]))
    assert len(got) == 2
    return [res for _, res in sorted(got, key=lambda pair: pair[0].repeat)]


# ---- the ports ----------------------------------------------------------------------------------
def test_two_trials_of_one_spec_get_different_ports(tmp_path, clean_env):
    results = _run_side_by_side(tmp_path, [PY, "-c", SHOW_PORTS], timeout=60.0)
    seen = [json.loads(Path(r.log).read_text().strip().splitlines()[-1]) for r in results]
    for ports in seen:  # one port per trial, in both variables
        assert ports["PET_MASTER_PORT"] and ports["PET_MASTER_PORT"] == ports["MASTER_PORT"]
    assert seen[0]["MASTER_PORT"] != seen[1]["MASTER_PORT"]
    assert _env(tmp_path, {})["MASTER_PORT"] != _env(tmp_path, {})["MASTER_PORT"]


def test_free_ports_are_not_handed_out_twice_in_a_row():
    ports = [free_port() for _ in range(40)]
    assert len(set(ports)) == len(ports) and all(0 < p < 65536 for p in ports)


def test_a_port_the_user_set_is_kept(tmp_path):
    env = _env(tmp_path, {"MASTER_PORT": "12345"})
    assert env["MASTER_PORT"] == "12345" and env["PET_MASTER_PORT"].isdigit()  # torchrun still gets its own
    env = _env(tmp_path, {"PET_MASTER_PORT": "23456"})
    assert env["PET_MASTER_PORT"] == "23456" and env["MASTER_PORT"] != "23456"
    # an address the user set may be another host: every node must agree on the port, none is drawn
    env = _env(tmp_path, {"MASTER_ADDR": "node0", "PET_MASTER_ADDR": "node0"})
    assert not any(name in env for name in PORT_NAMES)
    assert "PET_MASTER_PORT" not in _env(tmp_path, {}, ["torchrun", "--master-addr", "node0", "t.py"])


@pytest.mark.parametrize("flag", ["--master-port=29600", "--master_port", "--rdzv-endpoint", "--rdzv_endpoint=h:1",
                                  "--standalone"])
def test_a_command_that_fixes_the_rendezvous_is_left_alone(tmp_path, flag):
    command = ["torchrun", "--nproc-per-node", "2", flag, "29600", "t.py"]
    assert trial_port_env(command, {}) == {}
    assert not any(name in _env(tmp_path, {}, command) for name in PORT_NAMES)
    assert shared_port_note(command, {"MASTER_PORT": "29500"}) is None  # the flag beats the variable: no warning


def test_the_note_names_what_the_user_pinned():
    command = ["torchrun", "--nproc-per-node", "2", "t.py"]
    assert shared_port_note(command, {}) is None
    note = shared_port_note(command, {"MASTER_PORT": "29500", "PATH": "/bin"})
    assert note is not None and note.startswith("MASTER_PORT set by you") and "collide" in note
    assert "--master-addr" in shared_port_note(["torchrun", "--master-addr", "n0", "t.py"], {})


def test_only_executors_that_run_trials_at_once_say_so():
    def local(jobs):
        return LocalExecutor(SpecRunner(TrialSpec.make(["x"], ".")), jobs=jobs, memory=64 * GiB)

    assert local(2).side_by_side and not local(1).side_by_side
    assert RayExecutor(SpecRunner(TrialSpec.make(["x"], "."))).side_by_side


# ---- end to end: two 2-rank gloo jobs at once on CPU -------------------------------------------------
RANKS = textwrap.dedent("""
    import os, time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    time.sleep(1.0)  # hold the rendezvous port while the other trial starts
    dist.barrier()
    print(f"rank {dist.get_rank()} sum {t.item():.0f} port {os.environ['MASTER_PORT']}", flush=True)
    dist.destroy_process_group()
""")
# torchrun as the H200 sweep's torch 2.11 ran it: the static rendezvous on PET_MASTER_PORT, else 29500
# (torch 2.13's picks a free port itself when neither is set, so it would not show the collision).
TORCHRUN_STATIC = textwrap.dedent("""
    import os, sys
    from torch.distributed.run import main
    main(["--master-port", os.environ.get("PET_MASTER_PORT") or "29500", *sys.argv[1:]])
""")
# A script that starts its own ranks and rendezvouses through env://, MASTER_PORT defaulting to 29500
# (forked ranks: torch is imported once, which halves the test's time on a small CPU).
SPAWN = textwrap.dedent("""
    import os, runpy, sys, torch.multiprocessing as mp

    def rank(r):
        os.environ.update(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r))
        runpy.run_path(sys.argv[1])

    if __name__ == "__main__":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        mp.start_processes(rank, nprocs=2, start_method="fork")
""")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (CPU is enough)")
@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
def test_two_distributed_trials_side_by_side_both_complete(tmp_path, clean_env, launcher):
    (tmp_path / "ranks.py").write_text(RANKS)
    if launcher == "torchrun":
        (tmp_path / "torchrun_static.py").write_text(TORCHRUN_STATIC)
        command = [PY, str(tmp_path / "torchrun_static.py"), "--nproc-per-node", "2", str(tmp_path / "ranks.py")]
    else:
        (tmp_path / "spawn.py").write_text(SPAWN)
        command = [PY, str(tmp_path / "spawn.py"), str(tmp_path / "ranks.py")]
    results = _run_side_by_side(tmp_path, command, env={"OMP_NUM_THREADS": "1"})
    ports = set()
    for res in results:
        log = Path(res.log).read_text()
        assert res.exit_code == 0, log[-3000:]
        done = re.findall(r"rank (\d) sum 2 port (\d+)", log)
        assert sorted(r for r, _ in done) == ["0", "1"], log[-3000:]
        ports |= {p for _, p in done}
    assert len(ports) == 2  # each trial met on its own port


def test_a_sweep_that_runs_trials_side_by_side_says_when_the_user_pinned_the_port(tmp_path, monkeypatch):
    from alloctune.tune.session import prepare
    from tune_fakes import FakeEvaluator

    class SideBySide:
        side_by_side = True

    monkeypatch.setenv("MASTER_PORT", "29500")
    command = ["torchrun", "--nproc-per-node", "2", "t.py"]
    s = prepare(command, evaluator=FakeEvaluator(), executor=SideBySide(), store=tmp_path / "a.jsonl")
    assert any("MASTER_PORT set by you" in n for n in s.tuner.notes)
    SideBySide.side_by_side = False  # one trial at a time: nothing to say
    s = prepare(command, evaluator=FakeEvaluator(), executor=SideBySide(), store=tmp_path / "b.jsonl")
    assert not s.tuner.notes
