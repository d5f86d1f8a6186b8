"""The size-parametric trace on real H200 recordings at several sizes (batch 8 on the H200, kept as fixtures).

`tests/data/size_recordings/size_{workload}_{S}.pickle.xz`: one item of size S per fresh process, default setting; the
held-back check fits on the other sizes and must reproduce the GPU's peak reserved.
"""

from pathlib import Path

import pytest

from alloctune.plan.holdout import holdout
from alloctune.trace.load import load_trace

DATA = Path(__file__).resolve().parent / "data" / "size_recordings"


def _recs(workload, sizes):
    paths = [DATA / f"size_{workload}_{s}.pickle.xz" for s in sizes]
    if not all(p.is_file() for p in paths):
        pytest.skip(f"no {workload} size recordings in {DATA}")
    return [(s, load_trace(p)) for s, p in zip(sizes, paths)]


def test_llama_prompt_length_held_back_exactly():
    recs = _recs("llama", [512, 1024, 2048, 3072, 4096, 6144])
    h = holdout(recs, 3072)
    assert h.same_structure and h.peak_real and abs(h.error_vs_real) <= 0.01


def test_rvc_audio_seconds_held_back_within_one_percent():
    recs = _recs("rvc", [10, 20, 30, 40, 50, 60])
    h = holdout(recs, 50)
    assert h.same_structure and abs(h.error_vs_real) <= 0.01


def _hubert_plan(calibrations, extra=()):
    import json

    from alloctune.plan.service import run

    truth = json.loads((DATA / "truth_hubert.json").read_text())
    specs = [f"{DATA / f'size_hubert_{s}.pickle.xz'}:{s}" for s in truth["sizes"]["hubert"]]
    if not all(Path(s.rsplit(":", 1)[0]).is_file() for s in specs):
        pytest.skip(f"no hubert size recordings in {DATA}")
    bis = {b["name"]: b for b in truth["bisections"]}
    caps = sorted({b["cap"] for b in bis.values()})
    confs = {"default": "", "expandable": "expandable_segments:True"}
    rep = run(specs, caps=caps, confs=list(confs.values()), curve=[],
              calibrations=[f"{DATA / c}:16" for c in calibrations] + list(extra))
    out = []
    for s, name in zip(rep.result.settings, confs):
        for x in s.largest:
            b = bis[f"plan_hubert_{name}_c{caps.index(x.target.bytes) + 1}"]
            out.append((x, b["largest_ok"], b["smallest_fail"]))
    return rep.result, out


@pytest.mark.parametrize("cal", ["cal_hubert_16_mid.pickle.xz", "cal_hubert_16_tight.pickle.xz"])
def test_hubert_with_a_calibration_run_is_one_number_at_the_real_largest_size(cal):
    """HuBERT's convolutions give up cuDNN workspaces under a cap; one capped run at size 16 teaches which.
    Against the real bisection (fresh processes on the H200) under two caps x two settings: one number each,
    below the smallest size that failed, within 2 % of the largest that completed."""
    res, answers = _hubert_plan([cal])
    assert res.fallible["decided_by"] == "calibration" and not res.fallible["range"]
    for x, ok, fail in answers:
        assert x.optimistic is None and x.first_failing is not None, x
        assert int(x.largest) < fail and abs(int(x.largest) / ok - 1) <= 0.02, (x.target.label, x.largest, ok, fail)


def test_hubert_without_evidence_is_a_range_that_names_the_calibration_to_record():
    res, answers = _hubert_plan([])
    assert res.fallible["decided_by"] == "none" and res.fallible["range"]
    assert "--calibration calibration-" in res.fallible["record"] and "hubert" in res.fallible["record"]
    assert any(int(x.largest) < 0.9 * ok for x, ok, _ in answers)  # the conservative end is far below the truth


def test_hubert_frames_from_a_run_of_other_inputs_decide_too():
    """A recording with C++ stacks of the same program on other clips (an earlier session): its cuDNN frames name
    the workspaces, placed on the size recordings by alignment; the answers are the real largest sizes."""
    cpp = DATA / "hubert_2clips_cpp.pickle.xz"
    if not cpp.is_file():
        pytest.skip("no hubert C++-stack recording")
    res, answers = _hubert_plan([], extra=[str(cpp)])
    assert res.fallible["decided_by"] == "frames" and not res.fallible["range"]
    for x, ok, fail in answers:
        assert x.optimistic is None and int(x.largest) < fail and abs(int(x.largest) / ok - 1) <= 0.02, x
