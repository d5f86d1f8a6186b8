"""#29 on a real CUDA device: `tune`'s no-grad remedy and the release points against the same torch program
with the remedy written by hand (its own memory_stats, fresh processes). Small programs (a few hundred MiB),
so this runs in a couple of minutes; bench/gpu_remedies.py does the same on real library models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20

# A stack of Linear layers called with autograd on (no backward): every layer's input is kept for a
# backward that never comes. NOGRAD=1: the same with the line tune offers (torch.inference_mode()).
# EC=1: torch.cuda.empty_cache() at the end of each batch (y still held, as the simulated release point has it).
PROGRAM = """
import contextlib, json, os, sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda().eval()
ctx = torch.inference_mode() if os.environ.get("NOGRAD") == "1" else contextlib.nullcontext()
with ctx:
    for b in (512, 2048, 1024, 3072, 768, 2560):
        y = model(torch.randn(b, 4096, device="cuda"))
        y.sum().item()
        if os.environ.get("EC") == "1":  # exactly the remedy: the call at the end of every repetition
            torch.cuda.empty_cache()
torch.cuda.synchronize()
s = torch.cuda.memory_stats()
print(json.dumps({"peak_reserved": s["reserved_bytes.all.peak"]}), file=sys.stderr)
"""


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}", **extra}


def _alloctune(*args: str, **env: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "alloctune", *args], env=_env(**env), capture_output=True, text=True,
                       timeout=900)
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rem_gpu")
    (d / "p.py").write_text(PROGRAM)
    return d


def test_no_grad_remedy_matches_the_program_with_inference_mode(program):
    rec = program / "plain.pickle"
    plain = _alloctune("run", "--record", str(rec), "--json", "--", sys.executable, str(program / "p.py"))
    assert plain["inference_with_grad"] is True
    budget = int(plain["peak_reserved"] * 0.7)  # no setting closes a 30 % gap left by kept activations
    d = _alloctune("tune", "--budget", f"{budget}B", "--knobs", "expandable", "--json", "--store",
                   str(program / "t.jsonl"), "--", sys.executable, str(program / "p.py"))
    ng = next(r for r in d["remedies"] if r["name"] == "no_grad")
    assert ng["method"] == "measured" and d["trial_count"] <= 3 + 1
    assert ng["min_budget"] is not None, ng["notes"]
    # the truth: the program with the line added by hand, its real min budget under the same setting
    # (k-ary search over fresh capped processes, bench/real_min_budget.py)
    hand = _alloctune("run", "--json", "--", sys.executable, str(program / "p.py"), NOGRAD="1")
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "real_min_budget.py"), "--lo",
                        f"{hand['peak_reserved'] // 3}B", "--hi", f"{hand['peak_reserved'] + 64 * MiB}B",
                        "--conf", ng["conf"], "--", sys.executable, str(program / "p.py")],
                       env=_env(NOGRAD="1"), capture_output=True, text=True, timeout=1800)
    truth = json.loads(r.stdout.strip().splitlines()[-1])
    assert truth["min_budget"] and abs(ng["min_budget"] - truth["min_budget"]) <= 0.02 * truth["min_budget"]


def test_release_point_peak_matches_the_program_that_empties_the_cache(program):
    rec = program / "mixed.pickle"
    _alloctune("run", "--record", str(rec), "--json", "--", sys.executable, str(program / "p.py"), NOGRAD="1")
    ex = _alloctune("explain", str(rec), "--json", "--top", "3")
    every = next((r for r in ex["remedies"] if r["name"] == "empty_cache_each_repetition"), None)
    if every is None:
        pytest.skip(f"no repetitions found ({ex['repeats']})")
    real = _alloctune("run", "--json", "--", sys.executable, str(program / "p.py"), NOGRAD="1", EC="1")
    assert abs(every["peak_reserved"] - real["peak_reserved"]) <= 0.02 * real["peak_reserved"]
