"""`alloctune tune` end to end on a fake-CUDA workload: table, recommendation, store, --resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fake_torch import install

PY = sys.executable
MiB = 1 << 20

# Needs 600 MiB with expandable segments; the default "fragments" and needs 900 MiB.
WORK = """
import os, torch
conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
torch.cuda.fake_alloc(400 << 20)
torch.cuda.fake_alloc(200 << 20)
if "expandable_segments:True" not in conf:
    torch.cuda.fake_alloc(300 << 20)
print("throughput: 50 items/s")
"""


@pytest.fixture()
def setup(tmp_path):
    install(tmp_path / "fake")
    (tmp_path / "w.py").write_text(WORK)
    import alloctune

    src = str(Path(alloctune.__file__).resolve().parents[1])  # the alloctune under test, not an installed one
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "fake"), src]),
               ALLOCTUNE_STATE_DIR=str(tmp_path / "live"),
               HOME=str(tmp_path / "home"), COLUMNS="200")
    return tmp_path, env


def tune(tmp_path, env, *extra):
    cmd = [PY, "-m", "alloctune", "tune", "--budget", "800MiB", "--knobs", "expandable", "--store",
           str(tmp_path / "s.jsonl"), *extra, "--", PY, str(tmp_path / "w.py")]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def test_tune_recommends_expandable_with_its_min_budget(setup):
    tmp_path, env = setup
    p = tune(tmp_path, env, "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    rec = data["recommendation"]
    assert rec["conf"] == "expandable_segments:True"
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in rec["lines"]["bash"]
    best = data["ranking"]["best"]
    assert best["infeasible_below"] < 600 * MiB <= best["min_budget"]
    assert best["min_budget"] - best["infeasible_below"] <= 16 * MiB
    # nothing is simulated to fit (the program asks for less under expandable than its recording
    # shows): the closest setting runs at the budget first, then from its pass's peak reserved down
    assert data["trials"][1]["conf"] == "expandable_segments:True" and data["trials"][1]["budget"] == 800 * MiB
    assert data["gpu_runs_after_baseline"] <= 4 and data["shortfall"] is None
    assert "did not complete" in rec["reasons"][""]
    assert data["trials"][0]["purpose"].startswith("baseline") and data["trials"][0]["budget"] is None
    assert data["trials"][0]["throughput"] == 50.0
    assert data["fresh_trials"] == data["trial_count"] == len(data["trials"])
    lines = (tmp_path / "s.jsonl").read_text().splitlines()
    assert len(lines) == 1 + data["trial_count"]
    # the program reads PYTORCH_CUDA_ALLOC_CONF before CUDA: every run starts cold
    assert all(t["started_ahead_s"] is None for t in data["trials"])


def test_the_run_after_the_recording_starts_beside_it(setup):
    """A program that does not read the setting's variable: the run after the recording was started while
    the recording ran, held at its first CUDA call (run/warm.py); the answer is the same."""
    tmp_path, env = setup
    work = WORK.replace('conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")\ntorch.cuda.fake_alloc(400 << 20)\n',
                        'torch.cuda.fake_alloc(400 << 20)\n'
                        'conf = torch.cuda.memory._snapshot()["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"]\n')
    assert work != WORK
    (tmp_path / "w.py").write_text(work + "import time\ntime.sleep(2.0)  # the recording runs long enough to start the next run beside it\n")
    p = tune(tmp_path, env, "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["recommendation"]["conf"] == "expandable_segments:True"
    assert data["trials"][0]["started_ahead_s"] is None and data["trials"][1]["started_ahead_s"] > 0
    assert not any("started cold" in n for n in data["notes"])


def test_resume_reuses_the_store_and_renders_the_table(setup):
    tmp_path, env = setup
    first = tune(tmp_path, env, "--json")
    n = json.loads(first.stdout)["trial_count"]
    p = tune(tmp_path, env)
    assert p.returncode == 2 and "already exists: add --resume" in p.stderr
    p = tune(tmp_path, env, "--resume")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert f"{n} trials (0 run, 0 after the baseline, {n} from the store)" in out
    assert "use expandable_segments:True: completes under 800.00 MiB" in out
    assert "taken from the results store" in out
    assert "recommended" in out


def test_crash_stops_the_sweep_with_one_line_and_partial_table(setup):
    tmp_path, env = setup
    (tmp_path / "w.py").write_text(WORK + "\nif 'expandable' in conf:\n    raise ValueError('broken input file')\n")
    p = tune(tmp_path, env)
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("alloctune: error: trial expandable_segments:True at 800.00 MiB crashed, not for lack of memory: "
                           "ValueError: broken input file")
    assert "trials so far" in p.stdout


def test_ctrl_c_stops_cleanly_with_the_partial_table(setup):
    import signal
    import time

    tmp_path, env = setup
    (tmp_path / "w.py").write_text(WORK + "\nimport time\ntime.sleep(0.5)\n")
    cmd = [PY, "-m", "alloctune", "tune", "--budget", "800MiB", "--knobs", "expandable", "--store",
           str(tmp_path / "s.jsonl"), "--", PY, str(tmp_path / "w.py")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    store = tmp_path / "s.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until two trials are on disk, then press Ctrl-C
        if store.exists() and len(store.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "trials so far (interrupted)" in out
    assert "Traceback" not in err
    assert "continue with --resume" in err + out
    kept = [json.loads(line) for line in store.read_text().splitlines()]
    assert kept[0]["kind"] == "header" and len(kept) >= 3
    assert not list((tmp_path / "live").glob("live-*.json"))  # the interrupted child cleaned up too


def test_exhaustive_strategy_stays_behind_a_flag_and_both_agree(setup):
    tmp_path, env = setup
    confirm = json.loads(tune(tmp_path, env, "--json").stdout)
    (tmp_path / "s.jsonl").unlink()
    old = json.loads(tune(tmp_path, env, "--json", "--strategy", "exhaustive").stdout)
    assert confirm["strategy"] == "confirm" and old["strategy"] == "exhaustive"
    assert confirm["schema"] == "alloctune.tune/2" and "gpu_runs_after_baseline" in confirm
    assert confirm["recommendation"]["conf"] == old["recommendation"]["conf"] == "expandable_segments:True"


def test_unknown_platform_is_one_line(setup):
    tmp_path, env = setup
    p = tune(tmp_path, env, "--platform", "macos")
    assert p.returncode == 2 and p.stderr.strip() == "alloctune: error: --platform 'macos' is not known: use linux or windows"


def test_when_nothing_fits_two_runs_the_shortfall_in_bytes_and_the_next_steps(setup):
    tmp_path, env = setup
    cmd = [PY, "-m", "alloctune", "tune", "--budget", "500MiB", "--knobs", "expandable", "--store",
           str(tmp_path / "n.jsonl"), "--json", "--", PY, str(tmp_path / "w.py")]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["trial_count"] == 2 and data["recommendation"]["conf"] is None
    sf = data["shortfall"]
    # both settings replay to 900 MiB (the recording's peak); the run is of the setting, not the default
    assert sf["conf"] == "expandable_segments:True" and sf["missing"] == sf["need"] - 500 * MiB == 400 * MiB
    assert sf["recording"] and Path(sf["recording"]).exists()
    assert any("alloctune plan" in s for s in sf["next_steps"])
    (tmp_path / "n.jsonl").unlink()
    text = subprocess.run(cmd[:-4] + cmd[-3:], capture_output=True, text=True, env=env, timeout=120).stdout
    assert f"{400 * MiB} bytes" in text and "next:" in text and sf["recording"] in text


# Inference with autograd on (#29.2): the module is called with grad mode on and nothing runs backward; the
# 300 MiB autograd keeps for the backward only exist while grad mode is on.
INFER = """
import torch
class Encoder(torch.nn.Module):
    def forward(self, x):
        torch.cuda.fake_alloc(400 << 20)
        torch.cuda.fake_alloc(200 << 20)
        if torch.is_grad_enabled():
            torch.cuda.fake_alloc(300 << 20)
Encoder()(None)
print("throughput: 50 items/s")
"""


def test_inference_with_autograd_is_confirmed_by_one_run_and_ends_the_shortage(setup):
    tmp_path, env = setup
    (tmp_path / "infer.py").write_text(INFER)
    cmd = [PY, "-m", "alloctune", "tune", "--budget", "700MiB", "--knobs", "expandable", "--store",
           str(tmp_path / "g.jsonl"), "--json", "--", PY, str(tmp_path / "infer.py")]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    # the recording, the closest setting at the budget, and the one run with autograd off by the agent
    assert data["trial_count"] == 3 and data["trials"][0]["inference_with_grad"] is True
    assert [t["no_grad"] for t in data["trials"]] == [False, False, True]
    ng = next(r for r in data["remedies"] if r["name"] == "no_grad")
    assert ng["method"] == "measured" and ng["peak_reserved"] == 600 * MiB and "torch.inference_mode()" in ng["how_to"]
    assert data["shortfall"]["next_steps"][0].startswith("inference without autograd")
    (tmp_path / "g.jsonl").unlink()
    text = subprocess.run(cmd[:-4] + cmd[-3:], capture_output=True, text=True, env=env, timeout=120).stdout
    assert "no_grad: min budget" in text and "with torch.inference_mode()" in text and "utilization" in text
