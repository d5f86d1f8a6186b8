"""Answers from a trace set agree with the simulator run on the program itself."""

import pytest
from plan_programs import program

from alloctune.errors import InputError
from alloctune.plan import plan
from alloctune.plan.answer import CARD_TOL, SCHEMA
from alloctune.plan.traceset import build
from alloctune.sim.replay import replay
from alloctune.sim.settings import SimSettings

GiB = 1 << 30
MiB = 1 << 20
CONFS = ["", "expandable_segments:True"]


@pytest.fixture(scope="module")
def mixed():
    ts = build([(x, program(x)) for x in (256, 512, 1024, 2048)])
    return ts, plan(ts, confs=CONFS, cards=[2 * GiB], caps=[GiB], size=3000, curve=[512, 1536, 3000])


def _completes(x, conf, target):
    kw = {"budget": target["bytes"]} if target["target"] == "cap" else {"total_memory": target["bytes"]}
    return replay(program(x), SimSettings.from_config(conf), record_events=False, **kw).completed


def test_largest_size_is_the_programs_own_boundary(mixed):
    _, res = mixed
    assert res.to_dict()["schema"] == SCHEMA
    for s in res.settings:
        for item in s.largest:
            d = item.to_dict()
            x = int(d["largest"])
            assert int(d["first_failing"]) == x + 1 and d["extrapolated"]  # beyond 2048: flagged
            assert _completes(x, s.conf, d) and not _completes(x + 1, s.conf, d)


def test_min_budget_curve_holds_for_the_program(mixed):
    _, res = mixed
    default = res.settings[0]
    assert [p.size for p in default.curve] == ["512", "1536", "3000"]
    for s in res.settings:
        st = SimSettings.from_config(s.conf)
        for p in s.curve:
            # a cap can need more than the uncapped peak (a cap changes what gets released), never less
            # than the live bytes; the program itself completes under the budget found
            assert p.peak_allocated <= p.min_budget
            assert replay(program(int(p.size)), st, record_events=False, budget=p.min_budget).completed
    assert default.curve[-1].min_budget > default.curve[0].min_budget
    assert [s.conf for s in res.settings] == CONFS


def test_one_size_needs(mixed):
    _, res = mixed
    for s in res.settings:
        at = s.at_size
        assert at.size == "3000" and "outside the recorded range" in at.notes[0]
        st = SimSettings.from_config(s.conf)
        assert replay(program(3000), st, record_events=False, total_memory=at.smallest_card).completed
        assert not replay(program(3000), st, record_events=False, total_memory=at.smallest_card - CARD_TOL).completed
        assert at.completes == {"card 2.00 GiB": True, "cap 1024.00 MiB": True}


def test_no_fallible_model_is_marked_conservative(mixed):
    ts, res = mixed
    assert not ts.fallbacks and res.conservative
    assert any(n.startswith("conservative") for n in res.notes)
    assert res.replays > 0 and res.wall_s > 0


def test_fallbacks_are_honoured_when_the_recording_has_them():
    base = program(512)
    ws = next(i for i, s in enumerate(base.requests.sizes) if s > 0)  # the first weight, as a stand-in
    recs = []
    for x in (256, 512, 1024):
        t = program(x)
        t.requests.fallbacks = {ws: (MiB,)}
        recs.append((x, t))
    ts = build(recs)
    res = plan(ts, caps=[GiB], curve=[512])
    assert not res.conservative and ts.generate(700).trace.requests.fallbacks == {ws: (MiB,)}


def test_bad_requests_are_input_errors(mixed):
    ts, _ = mixed
    with pytest.raises(InputError):
        plan(ts, caps=[10**15])
    with pytest.raises(InputError):
        plan(ts, size="big")
    with pytest.raises(InputError):
        plan(ts, caps=[0])


def test_optimistic_bound_when_workspaces_have_no_law():
    def with_workspace(x):
        t = program(x)
        # a workspace whose size jumps with the shape: no exact law, the kind cuDNN picks
        ws = 48 * MiB if x % 3 else 8 * MiB
        req = t.requests
        rid = max(req.rids) + 1
        at = 12
        req.ops[at:at] = [0, 1]
        req.sizes[at:at] = [ws, -1]
        req.rids[at:at] = [rid, rid]
        req.streams[at:at] = [0, 0]
        req.event_index[at:at] = [0, 0]
        return t

    ts = build([(x, with_workspace(x)) for x in (256, 512, 1024, 1536, 2048)])
    assert "table (inexact)" in ts.summary()["laws"]
    res = plan(ts, caps=[256 * MiB], curve=[512])
    item = res.settings[0].largest[0]
    assert item.optimistic is not None and int(item.optimistic) >= int(item.largest)
    assert "optimistic" in res.notes[0]
    assert plan(ts, caps=[256 * MiB], curve=[512], bounds=False).settings[0].largest[0].optimistic is None


class _Stub:
    """A prober whose program fails at 100..119 but fits again at 120..250 (the allocator is not monotone)."""

    replays = 0

    def completes(self, x, st, t):
        self.replays += 1
        return x < 100 or 120 <= x <= 250


def test_largest_checks_bisections_monotone_assumption():
    from fractions import Fraction as Fr

    from alloctune.plan.answer import Target, _largest

    t = Target("cap", GiB)
    got = _largest(_Stub(), None, t, Fr(1), Fr(400), [Fr(10), Fr(200)])
    assert got.largest == "99" and got.first_failing == "100" and got.completes_again == "250"
    plain = _largest(_Stub(), None, t, Fr(1), Fr(400), [Fr(10), Fr(200)], scan=False)
    assert plain.largest == "250" and plain.completes_again is None  # what bisection alone would say


def test_context_larger_than_a_card_is_an_input_error(mixed):
    ts, _ = mixed
    with pytest.raises(InputError, match="context"):
        plan(ts, cards=[256 * MiB], context=512 * MiB)


def _cubic_truth(cap):
    from alloctune.sim.replay import replay as _replay

    lo, hi = 1, 1 << 14
    while hi - lo > 1:
        m = (lo + hi) // 2
        lo, hi = (m, hi) if _replay(program(m, law="cubic"), budget=cap, record_events=False).completed else (lo, m)
    return lo


@pytest.fixture(scope="module")
def cubic_specs(tmp_path_factory):
    import pickle

    from plan_programs import snapshot

    d = tmp_path_factory.mktemp("cubic")
    specs = []
    for x in (256, 512, 768, 1024):
        p = d / f"c{x}.pickle"
        p.write_bytes(pickle.dumps(snapshot(program(x, law="cubic"))))
        specs.append(f"{p}:{x}")
    return specs


@pytest.mark.parametrize("cap_mib", [150, 400, 600])
def test_plan_never_over_promises_where_its_own_check_shows_the_extrapolation_is_off(cubic_specs, cap_mib):
    # a term the fit cannot see (cubic, fitted with at most a quadratic on three sizes): the answer
    # without a bound lies above the program's real largest size at 400 and 600 MiB
    from alloctune.plan.service import run as plan_run

    cap = cap_mib << 20
    truth = _cubic_truth(cap)
    rep = plan_run(cubic_specs, caps=[cap], curve=[256])
    item = rep.result.settings[0].largest[0]
    assert rep.result.errors["checked"] > 0.05  # the largest recording, generated from the others, is off
    assert int(item.largest) <= truth  # never over
    assert item.bound is not None and item.bound <= 0.25
    if item.stopped == "bound":  # said as "at least", with why
        assert item.first_failing is None and int(item.largest) > 1024
    else:
        assert item.stopped == "exceeded" and int(item.largest) >= 0.98 * truth
    raw = plan_run(cubic_specs, caps=[cap], curve=[256], check=False).result.settings[0].largest[0]
    if cap_mib > 150:
        assert int(raw.largest) > truth  # what the unchecked answer would have promised


def test_exact_laws_keep_their_exact_answers_with_a_zero_bound(cubic_specs, tmp_path):
    import pickle

    from alloctune.plan.service import run as plan_run
    from plan_programs import snapshot

    specs = []
    for x in (256, 512, 1024, 2048):
        p = tmp_path / f"m{x}.pickle"
        p.write_bytes(pickle.dumps(snapshot(program(x))))
        specs.append(f"{p}:{x}")
    rep = plan_run(specs, caps=[1 << 30], curve=[256])
    item = rep.result.settings[0].largest[0]
    assert rep.result.errors["checked"] == 0 and item.bound == 0.0
    x = int(item.largest)
    from alloctune.sim.replay import replay as _replay

    assert _replay(program(x), budget=1 << 30, record_events=False).completed
    assert not _replay(program(x + 1), budget=1 << 30, record_events=False).completed
