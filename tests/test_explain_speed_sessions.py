"""The replay core's paused replays and what `explain`'s speed rests on give exactly the answers of
full replays (`sim.session`, `sim.budget`, the native address models, the request-id table, the
native splice of a rewrite and the int64 columns).

Each test holds a fast path to the slow one it stands for: a replay run in pieces or copied halfway
to the replay run in one go, a copy given a cap where the runs still agree to the capped replay,
the bisection that starts its probes from kept states to the one that replays every probe, the
native twins of the address models to the Python models called back, the native splice to the
Python copy.
"""

from __future__ import annotations

import functools
import time
from array import array

import pytest

from alloctune.demo.core import shipped_trace_path
from alloctune.sim import native
from alloctune.sim.budget import min_budget
from alloctune.sim.driver import DriverVA, RecordedAddresses
from alloctune.sim.replay import allocator_cap, replay, start
from alloctune.sim.settings import SimSettings
from alloctune.trace import load_trace
from alloctune.trace.model import ALLOC, FREE, RequestStream, Trace

pytestmark = pytest.mark.skipif(not native.available(), reason="native simulator core not built")

SETTINGS = ("", "expandable_segments:True", "max_split_size_mb:128", "garbage_collection_threshold:0.6,max_split_size_mb:256")


@functools.lru_cache(maxsize=4)
def _shipped(name: str) -> Trace:
    return load_trace(shipped_trace_path(name))


def _finished(session, stops=()):
    for stop in stops:
        session.run(stop)
    session.run(1 << 62)
    return session.result()


@pytest.mark.parametrize("conf", SETTINGS)
def test_a_replay_run_in_pieces_or_copied_halfway_is_the_replay_run_at_once(conf):
    trace = _shipped("rvc_h200.atrace")
    n = len(trace.requests)
    whole = _finished(start(trace, conf or None, record_events=True))
    assert _finished(start(trace, conf or None, record_events=True), range(0, n, 997)) == whole
    half = start(trace, conf or None, record_events=True)
    half.run(n // 2)
    copy = half.clone()
    assert _finished(copy) == whole
    assert _finished(half) == whole  # the original goes on unchanged by its copy


def test_the_python_model_paused_and_run_on_is_its_replay_run_at_once(monkeypatch):
    monkeypatch.setenv("ALLOCTUNE_SIM", "python")
    trace = _shipped("rvc_h200_ec1.atrace")
    n = len(trace.requests)
    a, b = start(trace, None, record_events=True), start(trace, None, record_events=True)
    a.run(n)
    for stop in range(0, n + 1, 1009):
        b.run(stop)
    b.run(n)
    x, y = a.output(), b.output()
    assert x.stats.as_dict() == y.stats.as_dict()
    x.stats = y.stats
    assert x == y


@pytest.mark.parametrize("conf", SETTINGS[:3])
def test_a_copy_given_a_cap_where_the_runs_agree_is_the_capped_replay(conf):
    """A state of the uncapped run whose cap comparisons all stayed at or below `vmax` is the state
    of the run under any cap >= vmax: copied there and given the cap, it runs on as the capped replay
    (every result, the OOM point and the failures' recorded cap included)."""
    trace = _shipped("train_h200.atrace")
    settings = SimSettings.from_config(conf or None)
    n, total = len(trace.requests), trace.total_memory or 150_109_880_320
    peak = replay(trace, conf or None, record_events=False).peak_allocated
    outcomes = set()
    for frac in (0.9, 1.0, 1.05, 1.15, 1.3):
        budget = int(peak * frac)
        cap = allocator_cap(settings, budget, total)
        want = _finished(start(trace, conf or None, budget=budget, record_events=True))
        outcomes.add(want[3] is None)
        uncapped = start(trace, conf or None, record_events=True)
        for stop in range(0, n, n // 7):
            uncapped.run(stop)
            assert not uncapped.diverged  # no cap: every comparison passes
            if cap is not None and uncapped.vmax > cap:
                break
            copy = uncapped.clone()
            copy.set_cap(cap)
            assert _finished(copy) == want, (frac, stop)
    assert outcomes == {True, False}  # budgets on both sides of the min budget


@pytest.mark.parametrize("name", ["rvc_h200.atrace", "train_h200.atrace", "diffusion_h200.atrace"])
@pytest.mark.parametrize("conf", SETTINGS)
def test_the_bisection_from_kept_states_is_the_bisection_of_full_replays(name, conf):
    trace = _shipped(name)
    with_states = replay(trace, conf or None, record_events=False, timeline_points=1, keep_states=True)
    without = replay(trace, conf or None, record_events=False, timeline_points=1)
    assert without.states is None
    if "garbage_collection" not in conf:
        assert with_states.states is not None and with_states.states.states
    fast = min_budget(trace, conf or None, uncapped=with_states)
    slow = min_budget(trace, conf or None, uncapped=without)
    assert fast == slow


def test_the_bisection_of_the_python_model_is_the_native_ones(monkeypatch):
    trace = _shipped("rvc_h200_ec1.atrace")
    fast = min_budget(trace, "expandable_segments:True")
    monkeypatch.setenv("ALLOCTUNE_SIM", "python")
    assert min_budget(trace, "expandable_segments:True") == fast


def test_states_of_a_recording_serve_its_copy_with_fallbacks():
    """The workspace floor's recording (the same requests, some made fallible) bisects from the states
    of the recording's own uncapped replay: no allocation failed before a kept state."""
    from alloctune.remedy.model import low_end

    trace = load_trace("tests/data/remedies_gpu/det.pickle.xz")
    low = low_end(trace)
    assert low is not None and low.requests.fallbacks
    run = replay(trace, None, record_events=False, timeline_points=1, keep_states=True)
    assert native.columns(low.requests) is run.states.columns  # shared columns: the states are used
    fresh = replay(low, None, record_events=False, timeline_points=1)
    assert min_budget(low, None, uncapped=run) == min_budget(low, None, uncapped=fresh)


class _CalledBack:
    """An address model the replay core can only call back (not one of driver.py's classes)."""

    def __init__(self, model) -> None:
        self.model = model

    def alloc(self, size: int) -> int:
        return self.model.alloc(size)

    def free(self, addr: int, size: int) -> None:
        self.model.free(addr, size)


@pytest.mark.parametrize("conf", SETTINGS)
def test_the_native_address_models_place_segments_as_the_python_models(conf):
    for name in ("rvc_h200.atrace", "rvc_h200_ec1.atrace"):
        trace = _shipped(name)
        recorded = [(e.size, e.addr) for e in trace.segment_events if e.action == "segment_alloc"]
        for twin, python in (("recorded", RecordedAddresses(recorded)), ("model", DriverVA())):
            for budget in (None, int(replay(trace, conf or None, record_events=False).peak_reserved * 0.9)):
                a = replay(trace, conf or None, budget=budget, addresses=twin).to_dict()
                b = replay(trace, conf or None, budget=budget, addresses=_CalledBack(python)).to_dict()
                a.pop("addresses"), b.pop("addresses")
                if twin == "recorded":
                    b["address_divergence"] = python.diverged_at
                python.__init__(*([recorded] if twin == "recorded" else []))
                assert a == b, (name, twin, budget)


def _ids_that_pile_up(kind: str) -> Trace:
    rs = RequestStream()
    if kind == "long run":  # 6000 ids kept live, then ids a table size later land on their slots
        for rid in range(6000):
            rs.append(ALLOC, 4096, rid, 0, rid)
        for j in range(100_000):
            rs.append(ALLOC, 512, 6000 + j, 0, 0)
            rs.append(FREE, -1, 6000 + j, 0, 0)
    else:  # ids spaced a power of two apart
        for j in range(50_000):
            rs.append(ALLOC, 512, j << 20, 0, 0)
            if j % 3:
                rs.append(FREE, -1, j << 20, 0, 0)
    return Trace(kind, 0, rs, [], {})


@pytest.mark.parametrize("kind", ["long run", "spaced"])
def test_request_ids_that_pile_up_replay_as_in_python_and_fast(monkeypatch, kind):
    trace = _ids_that_pile_up(kind)
    t = time.perf_counter()
    got = replay(trace, None, addresses="model").to_dict()
    assert time.perf_counter() - t < 5  # (a table of ids kept in their own order alone: quadratic)
    monkeypatch.setenv("ALLOCTUNE_SIM", "python")
    assert replay(trace, None, addresses="model").to_dict() == got


def test_int64_columns_are_the_arrays_of_the_lists():
    req = _shipped("rvc_h200.atrace").requests
    cols = native.columns(req)
    assert cols is not None and cols is native.columns(req)  # made once
    assert all(c == array("q", lst) for c, lst in zip(cols, (req.ops, req.sizes, req.rids, req.streams)))
    assert native._int64([1, -2, True, (1 << 63) - 1]) == array("q", [1, -2, 1, (1 << 63) - 1])
    with pytest.raises(OverflowError):
        native._int64([1 << 63])


def test_the_native_splice_is_the_python_copy(monkeypatch):
    """Every rewrite of a training recording and of an inference one: the native core's copy (and the
    int64 columns made with it) against `_spliced_lists`."""
    from alloctune.analysis.core import analyse
    from alloctune.remedy import model as rm
    from alloctune.remedy.release import free_at_repeat_end, repetition_ends, with_empty_cache
    from alloctune.remedy.training import block_windows, with_checkpointing
    from alloctune.remedy.workspaces import resized

    made = []
    real = rm.spliced

    def both(trace, before, changed, *, given_stacks=False):
        got = real(trace, before, changed, given_stacks=given_stacks)
        monkeypatch.setenv("ALLOCTUNE_SIM", "python")
        want = real(trace, before, changed, given_stacks=given_stacks)
        monkeypatch.delenv("ALLOCTUNE_SIM")
        a, b = got.requests, want.requests
        assert (a.ops, a.sizes, a.rids, a.streams, a.event_index, a.stack_ids, a.fallbacks, a.annotations) == \
               (b.ops, b.sizes, b.rids, b.streams, b.event_index, b.stack_ids, b.fallbacks, b.annotations)
        assert got.segment_events == want.segment_events
        cols = native.cached_columns(a)
        assert cols is not None and all(c == array("q", lst) for c, lst in zip(cols, (a.ops, a.sizes, a.rids, a.streams)))
        made.append(got)
        return got

    for mod in ("release", "training", "workspaces"):
        monkeypatch.setattr(f"alloctune.remedy.{mod}.spliced", both)
    for path in ("tests/data/explain_gpu/train_leak.pickle.xz", "tests/data/remedies_gpu/det.pickle.xz"):
        trace = load_trace(path)
        native.columns(trace.requests)
        an = analyse(trace)
        ends = repetition_ends(an)
        with_empty_cache(trace, ends)
        with_empty_cache(trace, ends[1::2] + [len(trace.requests)])
        free_at_repeat_end(an, [i for i, (g, _) in an.growth.items() if g] or list(range(len(an.labels))))
        if "train" in path:
            with_checkpointing(an, block_windows(an))
        sizes = {i: 512 for i, op in enumerate(trace.requests.ops[:200]) if op == ALLOC}
        resized(trace, sizes)
    assert len(made) >= 8
