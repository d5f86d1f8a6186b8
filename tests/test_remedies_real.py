"""The release-point remedy against a real program that calls `empty_cache()` by hand (H200 data,
tests/data/remedies_gpu/real.json says how it was measured).

`seg` is torchvision DeepLabV3 at mixed image sizes; `seg_ec` is the same program with
`torch.cuda.empty_cache()` after every image. alloctune sees only `seg`'s recording; the facts it
is checked against are what the other process did and measured: where its calls fell in its own
request stream, its peak reserved (a separate uncapped run) and its real min budget (bisection).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alloctune.analysis.core import analyse
from alloctune.remedy.release import repetition_ends, with_empty_cache
from alloctune.sim.budget import min_budget
from alloctune.sim.replay import replay
from alloctune.trace import load_trace
from alloctune.trace.fallible import optimistic
from alloctune.trace.model import EMPTY_CACHE

DATA = Path(__file__).parent / "data" / "remedies_gpu"
REAL = json.loads((DATA / "real.json").read_text())


@pytest.fixture(scope="module")
def seg():
    return load_trace(DATA / "seg.pickle.xz")


def test_release_points_fall_where_the_program_called_empty_cache(seg):
    """The loop's frame puts each point just before the body's first allocation of the next image:
    the place of the hand-written call, as the other recording shows it (its own empty_cache
    requests, mapped back to `seg`'s request indices)."""
    real = load_trace(DATA / "seg_ec.pickle.xz").requests
    calls = [i for i, op in enumerate(real.ops) if op == EMPTY_CACHE]
    in_seg = [i - k for k, i in enumerate(calls)]
    ends = repetition_ends(analyse(seg))
    assert ends == in_seg[: len(ends)]
    assert len(ends) == len(in_seg) - 1  # the call after the last image comes after the work is done


def test_release_points_predict_the_real_peak_reserved(seg):
    ends = repetition_ends(analyse(seg))
    r = replay(with_empty_cache(seg, ends), None)
    assert r.peak_reserved == REAL["peaks"]["seg_ec"]["reserved"]
    assert r.peak_reserved < REAL["peaks"]["seg"]["reserved"]


def test_release_points_min_budget_brackets_the_real_one(seg):
    """Under a cap cuDNN falls back to smaller workspaces; with no calibration the replay gives a
    conservative end (workspaces fixed) and an optimistic one (workspace-shaped requests fallible
    down to nothing). The real min budget of the hand-remedied program lies between, and for this
    network (its convolutions fall back to algorithms without a workspace) within 0.5 % of the
    optimistic end."""
    w = with_empty_cache(seg, repetition_ends(analyse(seg)))
    cons = min_budget(w, None, rel_tol=0.002, abs_tol=1 << 20).budget
    opt = min_budget(optimistic(w), None, rel_tol=0.002, abs_tol=1 << 20).budget
    real = REAL["min_budget"]["seg_ec"]
    assert real["fails_at"] < cons and opt <= real["min_budget"] * 1.005
    assert abs(opt - real["min_budget"]) <= 0.005 * real["min_budget"]


def test_a_calibration_that_died_still_teaches_the_fallback_it_survived(seg):
    """DeepLabV3's tight calibration run gave its 288 MiB convolution workspace up (7 tries) and then
    died on the next layer's output. That fallback, carried to the other calls of the same convolution,
    puts the simulated min budget within 2 % of the real one (bisected with fresh processes); as
    recorded it is 6 % over. Never below the smallest budget seen to fail."""
    from alloctune.trace.fallible import generalise, learn_from_calibration, with_fallbacks

    model = learn_from_calibration(seg, load_trace(DATA / "seg_cal_tight.pickle.xz"))
    assert model.ladders and all(lad[-1] < size for size, lad in model.ladders.items())
    learned = min_budget(with_fallbacks(seg, generalise(model, seg)), rel_tol=0.002, abs_tol=1 << 20).budget
    real = REAL["min_budget"]["seg"]
    assert abs(learned / real["min_budget"] - 1) <= 0.02 and learned > real["fails_at"]
    assert min_budget(seg, rel_tol=0.002, abs_tol=1 << 20).budget > real["min_budget"] * 1.05


def test_a_rewritten_recording_keeps_its_call_sites(seg):
    """empty_cache() inserted at the release points: every original request keeps its Python stack (the
    learned fallbacks of a call site reach the rewritten recording too)."""
    ec = with_empty_cache(seg, repetition_ends(analyse(seg)))
    req, out = seg.requests, ec.requests
    kept = [i for i, op in enumerate(out.ops) if op != EMPTY_CACHE]
    assert len(kept) == len(req) and [out.stack_ids[i] for i in kept] == req.stack_ids
    assert all(out.stack_ids[i] == -1 for i, op in enumerate(out.ops) if op == EMPTY_CACHE)


def test_tunes_simulator_learns_the_same_from_the_capped_run(seg):
    """tune's simulator, handed the tight run as one of its capped trials, re-simulates the default within
    2 % of the real min budget (the ladder carried to the other calls of the same convolution)."""
    from alloctune.run.trial import TrialResult
    from alloctune.tune.simulator import SimulatorFromTrace

    sim = SimulatorFromTrace(TrialResult(command=("x",), conf="", budget=None, outcome="ok", exit_code=0, wall_s=1.0,
                                         snapshot=str(DATA / "seg.pickle.xz")))
    before = sim.estimates([""])[""]
    cal = REAL["agent_trials"]["seg_cal_tight"]
    said = sim.calibrate(TrialResult(command=("x",), conf="", budget=cal["budget"], outcome="oom", exit_code=1, wall_s=1.0,
                                     num_ooms=cal["num_ooms"], snapshot=str(DATA / "seg_cal_tight.pickle.xz")))
    assert said and "carried over to" in said
    after = sim.estimates([""])[""]
    real = REAL["min_budget"]["seg"]
    assert before > real["min_budget"] * 1.05 and real["fails_at"] < after <= real["min_budget"] * 1.02


def test_explain_with_a_calibration_gives_the_min_budget_of_the_capped_program(tmp_path):
    """`alloctune explain seg --calibration seg_cal_tight`: the recording's min budget (what-ifs and remedies
    compare with it) within 2 % of the real one, said with what taught it; the release point's too is lower
    than without. A calibration of another program teaches nothing, and says so."""
    import subprocess
    import sys

    import alloctune

    src = str(Path(alloctune.__file__).resolve().parents[1])

    def run(*args):
        out = subprocess.run([sys.executable, "-m", "alloctune", "explain", str(DATA / "seg.pickle.xz"), "--json",
                              "--top", "3", *args], capture_output=True, text=True, env={"PYTHONPATH": src},
                             timeout=600)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    plain, cal = run(), run("--calibration", str(DATA / "seg_cal_tight.pickle.xz"))
    real = REAL["min_budget"]["seg"]
    assert plain["min_budget"] > real["min_budget"] * 1.05
    assert real["fails_at"] < cal["min_budget"] <= real["min_budget"] * 1.02
    assert any("calibration run(s) (capped at 1272 MiB) taught" in n for n in cal["notes"])
    ec = [next(r["min_budget"] for r in d["remedies"] if r["name"] == "empty_cache_each_repetition") for d in (plain, cal)]
    assert ec[1] < ec[0]
    other = run("--calibration", str(DATA / "convnext_cal_tight.pickle.xz"))
    assert other["min_budget"] == plain["min_budget"] and any("taught no fallback" in n for n in other["notes"])


def test_the_no_grad_remedy_from_its_run_is_a_range_that_holds_the_real_min_budget():
    """tune's no-grad remedy from the agent's --no-grad recording of HuBERT: a run that cuDNN was not pressed
    in gives a range (every workspace-shaped request given up .. as recorded), said as one, and the real min
    budget of the program with torch.no_grad() written by hand lies in it."""
    from alloctune.remedy.measured import no_grad_remedy
    from alloctune.run.trial import TrialResult
    from alloctune.tune.simulator import SimulatorFromTrace

    trial = TrialResult(command=("x",), conf="", budget=1075 * 2**20, outcome="ok", exit_code=0, wall_s=1.0,
                        no_grad=True, autograd={"module_calls_with_grad": 0, "backward_calls": 0},
                        snapshot=str(DATA / "hubert_nograd_agent.pickle.xz"))
    r = no_grad_remedy(trial, "", None, SimulatorFromTrace, "python hubert.py")
    real = REAL["min_budget"]["hubert_nograd"]["min_budget"]
    assert r.method == "measured" and r.bound is not None and r.bound < real < r.min_budget
    assert " .. " in r.notes[0] and "settles it" in r.notes[1]


def test_a_workspace_chosen_smaller_without_a_failure_is_learned_and_the_run_aligns_to_its_end():
    """The agent's no-grad HuBERT capped at 669 MiB on an H100 (hubert_nograd_agent_cal_low): at request 706
    the capped run asked for 51573107 bytes where the uncapped one asked for 54719091, with no failed request
    before it (cuDNN chose another algorithm from the free memory it saw), and both streams free it next.
    That is a fallback settled smaller: the walk learns it and aligns the whole capped run."""
    from alloctune.trace.fallible import learn_from_calibration
    from alloctune.trace.model import FAILED_ALLOC

    uncapped = load_trace(DATA / "hubert_nograd_agent.pickle.xz")
    capped = load_trace(DATA / "hubert_nograd_agent_cal_low.pickle.xz")
    u, c = uncapped.requests, capped.requests
    assert (u.sizes[706], c.sizes[706]) == (54719091, 51573107) and FAILED_ALLOC not in c.ops[:706]
    model = learn_from_calibration(uncapped, capped)
    assert model.unaligned_requests == 0 and model.sites.get(706) == (51573107,)
    assert model.ladders[54719091] == (51573107,) and model.conflicts == 0
