"""`trace.fallible.generalise` on real H200 data: HuBERT inference without autograd (the agent's
--no-grad run, recorded with Python stacks) and its calibration runs under caps; real.json holds the
real min budget of the same program with `torch.no_grad()` written by hand (bisection, fresh
processes) and the calibration runs' own trial results, the facts these tests check against.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from alloctune.sim.budget import min_budget
from alloctune.sim.replay import replay
from alloctune.trace import load_trace
from alloctune.trace.fallible import (
    NO_WORKSPACE,
    combine,
    generalise,
    learn_from_calibration,
    scratch_requests,
    untagged_note,
    with_fallbacks,
)

DATA = Path(__file__).parent / "data" / "remedies_gpu"
REAL = json.loads((DATA / "real.json").read_text())
TOL = dict(rel_tol=0.002, abs_tol=1 << 20)
NAME = "hubert_nograd_agent"


@pytest.fixture(scope="module")
def hub():
    trace = load_trace(DATA / f"{NAME}.pickle.xz")
    model = None
    for tag in ("mid", "tight"):
        m = learn_from_calibration(trace, load_trace(DATA / f"{NAME}_cal_{tag}.pickle.xz"))
        model = m if model is None else combine(model, m)
    return trace, model


def test_a_learned_ladder_reaches_every_call_of_its_convolution(hub):
    trace, model = hub
    r = trace.requests
    # the calibration saw 3 calls of the feature extractor's convolutions fall back (the 3 longest clips)
    assert len(model.ladders) == 3 and not model.general
    g = generalise(model, trace)
    site = {r.stack_ids[i] for i in scratch_requests(trace) if r.sizes[i] in model.ladders}
    assert len(site) == 1  # one call site (conv.py _conv_forward under the feature extractor)
    calls = [i for i in scratch_requests(trace) if r.stack_ids[i] in site and r.sizes[i] not in model.ladders]
    assert sorted(g.general) == calls and len(calls) == 39 and g.general_kinds == 1
    # the conservative rule: the ladder that settled on the largest fraction of its request, scaled
    frac = max(lad[-1] / s for s, lad in model.ladders.items() if lad[-1] > NO_WORKSPACE)
    for i in calls:
        assert abs(g.general[i][-1] / r.sizes[i] - frac) < 1e-6
        assert len(g.general[i]) == len(next(lad for s, lad in model.ladders.items() if lad[-1] / s == frac))
    # the other conv call site (the positional convolution) never failed: untouched
    other = [i for i in scratch_requests(trace) if r.stack_ids[i] not in site]
    assert other and not set(other) & set(g.general)
    # every output says it was used
    tagged = with_fallbacks(trace, g)
    info = tagged.meta["fallible"]["generalised"]
    assert info["requests"] == 39 and "same Python stack" in info["note"]
    assert "carried over to 39 request(s)" in untagged_note(tagged)
    assert "generalised" not in with_fallbacks(trace, model).meta["fallible"]  # off: the dict as it was


def test_the_calibration_run_is_still_reproduced(hub):
    # under the tight calibration's own cap the generalised model must replay what the GPU did there
    trace, model = hub
    trial = REAL["agent_trials"][f"{NAME}_cal_tight"]
    res = replay(with_fallbacks(trace, generalise(model, trace)), None, budget=trial["budget"],
                 record_events=False, timeline_points=1)
    assert res.completed and res.peak_reserved == trial["peak_reserved"]
    assert res.peak_allocated == trial["peak_allocated"] and res.stats["num_ooms"] == trial["num_ooms"]


def test_neither_rule_moves_the_answer_below_the_real_program_unnoticed(hub):
    """Against the hand-written no-grad program bisected on the H100 with both ends run (fails at
    674252445 B, completes at 675914530 B): the calibrations at the mid and tight caps alone give a
    conservative answer, and carrying every call down as far as any went lands inside the real bracket."""
    trace, model = hub
    real = REAL["min_budget"]["hubert_nograd"]
    assert any(r["cap"] == real["fails_at"] and r["outcome"] == "oom" for r in real["runs"])  # a run, not a guess
    learned = min_budget(with_fallbacks(trace, model), None, **TOL).budget
    general = min_budget(with_fallbacks(trace, generalise(model, trace)), None, **TOL).budget
    assert real["min_budget"] <= general <= learned
    deep = generalise(model, trace, deepest=True)
    assert len(deep.general) > 39 and "deepest" in deep.general_by
    deepest = min_budget(with_fallbacks(trace, deep), None, **TOL).budget
    assert real["fails_at"] * 0.998 <= deepest <= real["min_budget"] * 1.002


@pytest.mark.parametrize("order", [("mid", "tight", "low"), ("low", "mid", "tight"), ("tight", "low", "mid")])
def test_with_the_low_calibration_the_min_budget_is_within_two_percent_in_any_order(order):
    """The three calibration runs of the agent's --no-grad HuBERT (mid, tight, and low: 0.96 x its peak
    allocated, 75 OOMs caught), combined in any order: the learned and generalised min budget lies within
    2 % of the real program's (bisected on the H100, both ends run). The low run saw the same tries as the
    tight one and more, so its ladders are the ones kept."""
    trace = load_trace(DATA / f"{NAME}.pickle.xz")
    model = None
    for tag in order:
        m = learn_from_calibration(trace, load_trace(DATA / f"{NAME}_cal_{tag}.pickle.xz"))
        model = m if model is None else combine(model, m)
    assert model is not None
    got = min_budget(with_fallbacks(trace, generalise(model, trace)), None, **TOL).budget
    real = REAL["min_budget"]["hubert_nograd"]["min_budget"]
    assert abs(got / real - 1) <= 0.02


def test_without_stacks_or_on_another_trace_nothing_is_carried_over(hub):
    trace, model = hub
    bare = replace(trace, requests=replace(trace.requests, stack_ids=None, stack_table=None))
    assert generalise(model, bare) is model
    g = generalise(model, trace)
    shorter = replace(trace, requests=replace(trace.requests, ops=trace.requests.ops[:-1],
                                              sizes=trace.requests.sizes[:-1], rids=trace.requests.rids[:-1],
                                              streams=trace.requests.streams[:-1],
                                              event_index=trace.requests.event_index[:-1]))
    assert with_fallbacks(shorter, g).requests.fallbacks == with_fallbacks(shorter, model).requests.fallbacks
