"""Workloads of several processes: the agent in every rank, per-rank reports and recordings, the worst rank wins.

With the fake torch a small launcher plays torchrun (sets RANK/LOCAL_RANK/WORLD_SIZE, starts
the ranks, fails when one fails); the real `torchrun` of a CPU torch checks that the agent
reaches each rank it starts.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from alloctune.run.ranks import RankSummary, neediest, processes_per_gpu, rank_table, summarize_ranks, worst
from alloctune.run.runner import build_env, run_trial
from alloctune.run.trial import TrialResult

from fake_torch import install

PY = sys.executable
MiB = 1 << 20

LAUNCHER = textwrap.dedent("""
    import os, subprocess, sys, time
    n, script = int(sys.argv[1]), sys.argv[2]
    procs = [subprocess.Popen([sys.executable, script], env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r),
                                                                  WORLD_SIZE=str(n))) for r in range(n)]
    while any(p.poll() is None for p in procs):
        if any(p.returncode not in (None, 0) for p in procs):
            for p in procs:
                if p.poll() is None:
                    p.terminate()
        time.sleep(0.05)
    sys.exit(max(p.returncode != 0 for p in procs))
""")

RANK = textwrap.dedent("""
    import os, torch
    rank = int(os.environ["RANK"])
    keep = [torch.cuda.fake_alloc((300 + 600 * rank) << 20)]  # rank 1 needs 900 MiB, rank 0 300 MiB
""")


@pytest.fixture()
def job(tmp_path):
    install(tmp_path / "fake")
    (tmp_path / "launch.py").write_text(LAUNCHER)
    (tmp_path / "rank.py").write_text(RANK)
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "fake"), ALLOCTUNE_STATE_DIR=str(tmp_path / "live"))
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(k, None)
    return [PY, str(tmp_path / "launch.py"), "2", str(tmp_path / "rank.py")], env


def test_every_rank_reports_and_records_under_its_own_name(tmp_path, job):
    cmd, env = job
    res = run_trial(cmd, env=env, record=tmp_path / "rec.pickle", capture=tmp_path / "out.log")
    assert res.outcome == "ok", (tmp_path / "out.log").read_text()
    assert res.processes == 3  # the launcher and two ranks
    ranks = [RankSummary.from_dict(r) for r in res.ranks]
    assert [r.rank for r in ranks] == [0, 1]
    assert [r.peak_reserved for r in ranks] == [300 * MiB, 900 * MiB]
    assert [Path(r.snapshot).name for r in ranks] == ["rec.rank0.pickle", "rec.rank1.pickle"]
    assert all(Path(r.snapshot).stat().st_size > 0 for r in ranks)
    assert res.peak_reserved == 900 * MiB and res.snapshot.endswith("rec.rank1.pickle")  # the neediest rank
    assert processes_per_gpu(res.ranks) == 2  # both ranks on the one (fake) device
    assert TrialResult.from_dict(res.to_dict()) == res  # ranks survive the store


def test_the_trial_is_as_bad_as_its_worst_rank(tmp_path, job):
    cmd, env = job
    res = run_trial(cmd, env=env, budget=600 * MiB, capture=tmp_path / "out.log")
    assert res.outcome == "oom"
    by_rank = {r["rank"]: r for r in res.ranks}
    assert by_rank[1]["outcome"] == "oom" and by_rank[1]["num_ooms"] == 1
    assert by_rank[0]["outcome"] == "ok" and by_rank[0]["peak_reserved"] == 300 * MiB


def test_reports_are_named_by_rank(tmp_path, job):
    cmd, env = job
    seen = []
    import alloctune.run.runner as runner

    real = runner.read_reports

    def spy(folder):
        seen.extend(sorted(p.name.split(".")[1] for p in folder.glob("report.*.json")))
        return real(folder)

    runner.read_reports = spy
    try:
        run_trial(cmd, env=env, capture=tmp_path / "out.log")
    finally:
        runner.read_reports = real
    assert [s for s in seen if s.startswith("rank")] == ["rank0", "rank1"] and len(seen) == 3


def test_rank_helpers():
    reports = [
        {"rank": None, "pid": 1, "outcome": "no-cuda"},  # the launcher
        {"rank": 1, "local_rank": 1, "pid": 3, "device": 1, "outcome": "oom",
         "stats": {"reserved_bytes.all.peak": 5 * MiB}, "exception": {"type": "OutOfMemoryError", "message": "CUDA out\nmore"}},
        {"rank": 0, "local_rank": 0, "pid": 2, "device": 0, "outcome": "ok", "stats": {"reserved_bytes.all.peak": 7 * MiB}},
    ]
    ranks = summarize_ranks(reports)
    assert [r.rank for r in ranks] == [0, 1] and ranks[1].error == "OutOfMemoryError: CUDA out"
    assert neediest(ranks).rank == 0
    assert worst(r.outcome for r in ranks) == "oom" and worst(["ok", "weird"]) == "crash" and worst([]) is None
    assert summarize_ranks([{"rank": None}]) == ()
    assert processes_per_gpu(ranks) == 1 and processes_per_gpu(()) == 1
    assert processes_per_gpu([{"device": 0}, {"device": 0}, {"device": 1}]) == 2
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(rank_table(ranks))
    text = console.export_text()
    assert "rank 0 *" in text and "rank 1" in text and "7.00 MiB" in text and "oom" in text


def test_children_get_nvlink_multicast_off_unless_the_user_set_it(tmp_path):
    env = build_env({"NCCL_NVLS_ENABLE": "1"}, conf=None, agent={}, site_dir=tmp_path)
    assert env["NCCL_NVLS_ENABLE"] == "1" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert build_env({}, conf=None, agent={}, site_dir=tmp_path)["NCCL_NVLS_ENABLE"] == "0"


@pytest.mark.slow
def test_real_torchrun_starts_the_agent_in_every_rank(tmp_path):
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    if not os.path.exists(torchrun):
        pytest.skip("no torchrun (torch not installed)")
    (tmp_path / "w.py").write_text("import torch\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = run_trial([torchrun, "--nproc-per-node", "2", str(tmp_path / "w.py")], env=env, capture=tmp_path / "o.log",
                    timeout=120)
    assert res.processes == 3, (tmp_path / "o.log").read_text()[-2000:]
    assert [(r["rank"], r["local_rank"]) for r in res.ranks] == [(0, 0), (1, 1)]
