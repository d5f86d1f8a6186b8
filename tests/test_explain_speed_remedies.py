"""`explain`'s what-ifs and remedies made faster give the answers they gave made the slow way:
the work they share (`remedy.model.Shared`) made once, the replays in a thread of their own, the
Janitor driven through one paused replay, a replay's driver work read from its counters.
"""

from __future__ import annotations

import json

import pytest

from alloctune.analysis.core import analyse
from alloctune.demo.core import shipped_trace_path
from alloctune.explain import explain
from alloctune.remedy import model as rm
from alloctune.sim import native
from alloctune.sim.replay import replay
from alloctune.trace import load_trace

TRAINING = "tests/data/explain_gpu/train_leak.pickle.xz"


def _json(ex) -> str:
    return json.dumps(ex.to_dict(), sort_keys=True, default=str)


@pytest.mark.parametrize("path", [TRAINING, "tests/data/remedies_gpu/det.pickle.xz",
                                  str(shipped_trace_path("rvc_h200.atrace"))])
def test_remedies_made_in_the_background_are_those_made_in_turn(monkeypatch, path):
    trace = load_trace(path)
    background = _json(explain(trace))
    init = rm.Shared.__init__

    def in_turn(self, recording, background=False):
        init(self, recording, background=False)

    monkeypatch.setattr(rm.Shared, "__init__", in_turn)
    assert _json(explain(trace)) == background


def test_a_rewrite_with_the_recordings_very_requests_is_the_recording(monkeypatch):
    trace = load_trace(TRAINING)
    calls = []
    real = rm.uncapped_run
    monkeypatch.setattr(rm, "uncapped_run", lambda t, conf, ref: calls.append(t) or real(t, conf, ref))
    shared = rm.Shared(trace)
    base = shared.min_budget(trace, "")
    copy = rm.spliced(trace, {}, {})  # the same requests, another object
    assert copy is not trace and shared.min_budget(copy, "") == base
    assert calls == [trace]  # one replay for both
    shared.rewrite(("k",), lambda: copy)
    assert shared.rewrite(("k",), lambda: pytest.fail("made twice")) is copy


def test_the_leak_remedy_is_the_what_if_of_its_growing_site(monkeypatch):
    trace = load_trace(TRAINING)
    made = []
    real = rm.uncapped_run
    monkeypatch.setattr(rm, "uncapped_run", lambda t, conf, ref: made.append(t) or real(t, conf, ref))
    ex = explain(trace)
    leak = next(r for r in ex.remedies if r.name == "free_growing")
    assert any(w.min_budget == leak.min_budget for w in ex.what_if)
    assert sum(t is leak.trace for t in made) == 1  # replayed once, for the what-if and the remedy


@pytest.mark.parametrize("by_size", [False, True])
def test_janitor_points_of_the_python_model_are_the_native_cores(monkeypatch, by_size):
    from alloctune.remedy.janitor import janitor_points

    an = analyse(load_trace(shipped_trace_path("rvc_h200.atrace")))
    got = janitor_points(an, "", {}, by_size)
    monkeypatch.setenv("ALLOCTUNE_SIM", "python")
    assert janitor_points(an, "", {}, by_size) == got


@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "garbage_collection_threshold:0.6,max_split_size_mb:256"])
def test_driver_work_read_from_the_counters_is_the_segment_events(conf):
    """`activity_of` reads the bytes reserved or released from the reserved counter; every segment
    event but an OOM moves exactly its size."""
    for name in ("rvc_h200.atrace", "train_h200.atrace", "llm_h200_expandable.atrace"):
        trace = load_trace(shipped_trace_path(name))
        free = replay(trace, conf or None)
        for budget in (None, int(free.peak_reserved * 0.9)):
            run = replay(trace, conf or None, budget=budget)
            moved = sum(e.size for e in run.segment_events if e.action != "oom")
            assert rm.activity_of(run)[3] == moved >> 20
            calls = run.stats["num_device_alloc"] + run.stats["num_device_free"]
            assert rm.activity_of(run)[2] == calls


@pytest.mark.skipif(not native.available(), reason="native simulator core not built")
def test_the_shared_replays_thread_is_gone_after_explain():
    import sys
    import threading

    interval = sys.getswitchinterval()
    explain(load_trace(TRAINING))
    assert not [t for t in threading.enumerate() if t.name.startswith("alloctune-replays")]
    assert sys.getswitchinterval() == interval
