"""The empty_cache remedy on a detector whose cuDNN workspaces adapt under a cap (#37): a torchvision
Faster R-CNN v2 at mixed image sizes recorded on an H100 (tests/data/remedies_gpu/det.pickle.xz), and
the real min budgets -- bisected in fresh processes -- of it and of the same program with
`torch.cuda.empty_cache()` after every batch written by hand (real.json: det, det_ec).

With no C++ frames and no calibration run, nothing says which workspace-shaped requests the program
can give up, so explain gives each min budget as a range (given up .. as recorded); the real need must
lie in it, and the remedy must have the real sign (here it costs memory)."""

from __future__ import annotations

import json
from pathlib import Path

from alloctune.analysis.core import analyse
from alloctune.explain.api import with_remedies
from alloctune.explain.core import explain_trace
from alloctune.trace import load_trace

DATA = Path(__file__).parent / "data" / "remedies_gpu"


def test_the_ranges_hold_the_real_min_budgets_and_the_remedy_has_the_real_sign() -> None:
    real = json.loads((DATA / "real.json").read_text())["min_budget"]
    trace = load_trace(DATA / "det.pickle.xz")
    an = analyse(trace)
    ex = with_remedies(an, explain_trace(trace, analysis=an))
    assert ex.min_budget_floor is not None and ex.min_budget is not None
    assert ex.min_budget_floor <= real["det"]["min_budget"] <= ex.min_budget
    assert ex.to_dict()["min_budget_range"] == [ex.min_budget_floor, ex.min_budget]
    ec = next(r for r in ex.remedies if r.name == "empty_cache_each_repetition")
    assert ec.bound is not None and ec.min_budget is not None
    # the real need with the line written by hand: inside the range, within 2 % of its low end
    assert real["det_ec"]["fails_at"] <= ec.min_budget and ec.bound <= real["det_ec"]["min_budget"] * 1.002
    assert abs(ec.bound - real["det_ec"]["min_budget"]) <= 0.02 * real["det_ec"]["min_budget"]
    assert ec.to_dict()["min_budget_range"] == [ec.bound, ec.min_budget]
    # the sign: the program with the release needs more than without it, and so do both ends of the ranges
    assert real["det_ec"]["min_budget"] > real["det"]["min_budget"]
    assert ec.saving is not None and ec.saving < 0 and ec.bound > ex.min_budget_floor


def test_one_calibration_run_turns_the_range_into_one_number_with_the_real_sign() -> None:
    """With the run capped at 2.35 GiB (five workspaces given up, det_cal_mid), explain answers one number
    per remedy: empty_cache after every batch within 2 % of the program written that way, costing memory
    as it really does."""
    from alloctune.explain.api import with_calibrations

    real = json.loads((DATA / "real.json").read_text())["min_budget"]
    trace, note = with_calibrations(load_trace(DATA / "det.pickle.xz"), [DATA / "det_cal_mid.pickle.xz"])
    assert note is not None and "taught" in note
    an = analyse(trace)
    ex = with_remedies(an, explain_trace(trace, analysis=an))
    ec = next(r for r in ex.remedies if r.name == "empty_cache_each_repetition")
    assert ec.bound is None and ec.min_budget is not None and ex.min_budget is not None
    assert abs(ec.min_budget - real["det_ec"]["min_budget"]) <= 0.02 * real["det_ec"]["min_budget"]
    assert ec.min_budget > ex.min_budget and ec.saving is not None and ec.saving < 0
