"""Differential tests: the native replay core gives exactly the Python model's results.

The Python model is the specification. Every shipped trace under every standard setting,
the shared H200 recordings under their own setting and cap, a range of budgets (the cap,
GC, retry and OOM paths), other torch rule sets and address models, and generated request
streams (hypothesis) go through both cores; `SimResult.to_dict()` — peaks, stats, every
segment event, OOM point and info, expected failures, timeline, adapted requests — must be
equal. The Python side is the slow one, so budgets are chosen on the small traces.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from alloctune.config.standard import STANDARD_CONFS
from alloctune.demo.core import shipped_trace_path, shipped_traces
from alloctune.sim import native
from alloctune.sim.replay import SimResult, replay
from alloctune.sim.settings import SimSettings
from alloctune.trace import load_trace
from alloctune.trace.model import ALLOC, EMPTY_CACHE, FAILED_ALLOC, FREE, RequestStream, Trace
from alloctune.units import MiB

pytestmark = pytest.mark.skipif(not native.available(), reason="native simulator core not built")

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
SETTINGS = (
    *STANDARD_CONFS,
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "max_split_size_mb:64,max_non_split_rounding_mb:128",
)


@functools.lru_cache(maxsize=4)
def _shipped(name: str) -> Trace:
    return load_trace(shipped_trace_path(name))


def both(monkeypatch: pytest.MonkeyPatch, trace: Trace, config, **kw) -> SimResult:
    """Replay through both cores; assert the results are identical; return the native one."""
    monkeypatch.setenv("ALLOCTUNE_SIM", "python")
    want = replay(trace, config, **kw)
    monkeypatch.setenv("ALLOCTUNE_SIM", "native")
    got = replay(trace, config, **kw)
    a, b = got.to_dict(), want.to_dict()
    if a != b:
        diff = sorted(k for k in a if a[k] != b[k])
        raise AssertionError(f"native != python in {diff}")
    return got


@pytest.mark.parametrize("name", shipped_traces())
def test_shipped_traces_every_setting(monkeypatch, name):
    trace = _shipped(name)
    for conf in SETTINGS:
        both(monkeypatch, trace, conf)


@pytest.mark.parametrize("name", ["rvc_h200.atrace", "diffusion_h200.atrace", "train_h200.atrace",
                                  "rvc_h200_ec1.atrace"])
@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "max_split_size_mb:256",
                                  "garbage_collection_threshold:0.6,max_split_size_mb:256"])
def test_budgets_from_failing_to_roomy(monkeypatch, name, conf):
    trace = _shipped(name)
    monkeypatch.setenv("ALLOCTUNE_SIM", "native")
    free_run = replay(trace, conf, record_events=False)
    outcomes = []
    for frac in (0.9, 1.0, 1.05, 1.15, 1.3, 1.6):
        budget = int(free_run.peak_allocated * frac)
        outcomes.append(both(monkeypatch, trace, conf, budget=budget).completed)
    assert True in outcomes and False in outcomes  # both sides of the minimum budget


def test_options_other_rules_and_address_models(monkeypatch):
    trace = _shipped("rvc_h200.atrace")
    peak = replay(trace, "", record_events=False).peak_reserved
    for conf in ("", "max_split_size_mb:128", "expandable_segments:True"):
        both(monkeypatch, trace, conf, addresses="model")
        both(monkeypatch, trace, conf, torch="2.12")  # segment-id tie-break
        both(monkeypatch, trace, conf, torch="2.5")  # old rule-B slack
        both(monkeypatch, trace, conf, budget=int(peak * 0.8), stop_at_oom=False)
        both(monkeypatch, trace, conf, budget=int(peak * 0.8), record_events=False, timeline_points=7)
    both(monkeypatch, trace, "per_process_memory_fraction:0.02", torch="2.10")
    both(monkeypatch, trace, "", reference=_shipped("rvc_h200_max_split_128.atrace"))


def _shared_traces() -> list[Path]:
    return sorted(SHARED.glob("*/*.pickle.xz")) if SHARED.is_dir() else []


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared traces not found at {SHARED}")
@pytest.mark.parametrize("path", _shared_traces(), ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
def test_shared_recordings_under_their_own_setting_and_cap(monkeypatch, path):
    trace = load_trace(path)
    settings = SimSettings.from_allocator_settings(trace.allocator_settings)
    cap = int(trace.meta.get("cap") or 0) or None
    r = both(monkeypatch, trace, settings, budget=cap)
    if trace.requests.count(FAILED_ALLOC):
        assert r.expected_failures or r.unexpected_successes
    if path.parent.name.startswith("rvc") and path.name.startswith("default."):
        for conf in SETTINGS:  # the small recordings also under every standard setting
            both(monkeypatch, trace, conf)


def test_fallbacks_and_a_switch_back_to_python(monkeypatch):
    rs = RequestStream()
    rs.append(ALLOC, 2 << 30, 1, 0, 0)
    rs.append(ALLOC, 3 << 30, 2, 0, 1)
    rs.append(FREE, -1, 2, 0, 2)
    rs.append(ALLOC, 5 << 30, 3, 0, 3)
    rs.fallbacks.update({1: (int(2.5 * (1 << 30)), 1 << 30), 3: (4 << 30,)})
    trace = Trace("synthetic", 0, rs, [], {})
    r = both(monkeypatch, trace, None, budget=4 << 30, addresses="model")
    assert r.adapted == (1,) and not r.completed
    # a stream value beyond int64 cannot go native: the Python model replays it, same answer
    rs.append(ALLOC, 1 << 70, 4, 0, 4)
    monkeypatch.setenv("ALLOCTUNE_SIM", "native")
    assert native.columns(rs) is None
    assert replay(trace, None, addresses="model").requests == 5
    rs.sizes[-1] = 1 << 20
    rs.fallbacks[4] = (1 << 64,)
    assert replay(trace, None, addresses="model").requests == 5


# ---------------------------------------------------------------------------------- fuzz
hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

_SIZES = st.one_of(
    st.integers(0, 4096),
    st.integers(4096, 1 * MiB + 4096),
    st.integers(1 * MiB, 12 * MiB),
    st.sampled_from([2 * MiB, 10 * MiB, 20 * MiB, 64 * MiB, 128 * MiB, 256 * MiB]),
    st.integers(12 * MiB, 600 * MiB),
)


@st.composite
def streams(draw):
    rs = RequestStream()
    live: list[int] = []
    rid = 0
    for i in range(draw(st.integers(1, 250))):
        kind = draw(st.sampled_from("aaaaaffffecx"))
        stream = draw(st.sampled_from([0, 0, 0, 1, 7]))
        if kind == "a" or (kind == "f" and not live):
            rid += 1
            rs.append(ALLOC, draw(_SIZES), rid, stream, i)
            live.append(rid)
            if draw(st.integers(0, 9)) == 0:
                rs.fallbacks[len(rs) - 1] = tuple(draw(st.lists(_SIZES, min_size=1, max_size=3)))
        elif kind == "f":
            r = live.pop(draw(st.integers(0, len(live) - 1)))
            rs.append(FREE, -1, r, stream, i)
        elif kind == "e":
            rs.append(EMPTY_CACHE, -1, -1, stream, i)
        elif kind == "c":
            rs.append(FAILED_ALLOC, draw(_SIZES), -1, stream, i)
        else:  # a free of an id never allocated (a truncated history): ignored by both
            rs.append(FREE, -1, 10_000 + i, stream, i)
    return Trace("fuzz", 0, rs, [], {})


@st.composite
def _conf(draw) -> SimSettings:
    """Valid settings only: 2.11+ requires max_split_size and max_non_split_rounding >= large_segment_size
    (the config parser refuses the rest; the model assumes it: an oversize block is then never a split)."""
    torch = draw(st.sampled_from([(2, 5), (2, 11), (2, 12)]))
    lss = draw(st.sampled_from([None, 12 * MiB, 40 * MiB])) if torch >= (2, 11) else None
    floor = lss or 21 * MiB
    return SimSettings(
        max_split_size=draw(st.sampled_from([None, None, floor, floor + 43 * MiB, 200 * MiB])),
        max_non_split_rounding=draw(st.sampled_from([None, floor, 300 * MiB])),
        garbage_collection_threshold=draw(st.sampled_from([0.0, 0.0, 0.5, 0.9])),
        expandable_segments=draw(st.booleans()),
        large_segment_size=lss,
        roundup_power2_divisions=draw(st.sampled_from([(0,) * 16, (4,) * 16, (1, 2, 4, 8) * 4, (8, 0) * 8])),
        torch=torch,
    )


_CONF = _conf()


@hypothesis.settings(max_examples=300, deadline=None, derandomize=True)
@hypothesis.given(trace=streams(), conf=_CONF, budget=st.sampled_from([None, 64 * MiB, 300 * MiB, 1 << 30]),
                  addresses=st.sampled_from(["model", "recorded"]), stop=st.booleans())
def test_fuzz_generated_streams(trace, conf, budget, addresses, stop):
    with pytest.MonkeyPatch.context() as mp:
        both(mp, trace, conf, budget=budget, addresses=addresses, total_memory=2 << 30, stop_at_oom=stop,
             timeline_points=13)
