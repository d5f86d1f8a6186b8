"""Fidelity against the real H200 traces in ../shared/traces (skipped when absent).

Uncapped runs: `default`'s request stream replayed under setting X must reproduce X's
recorded segment_alloc/segment_free sequence and its peaks. Capped runs: the run's own
stream under its setting and cap must fail exactly the requests that failed on the GPU.
"""

from __future__ import annotations

import pytest

from alloctune.sim.compare import compare
from alloctune.sim.replay import replay
from alloctune.sim.settings import SimSettings
from alloctune.trace import load_trace

UNCAPPED = ["default", "max_split_128", "max_split_512", "expandable", "roundup4", "roundup_intervals"]
CAPPED = ["default_cap95", "default_cap85", "expandable_cap95", "expandable_cap85", "gc07_split256_cap115a"]
RVC = ["rvc_ec0", "rvc_ec1"]

_cache: dict[str, object] = {}


def _load(traces_dir, workload, name):
    path = traces_dir / workload / f"{name}.pickle.xz"
    if not path.exists():
        pytest.skip(f"{path} not found")
    key = str(path)
    if key not in _cache:
        _cache[key] = load_trace(path)
    return _cache[key]


def _run(traces_dir, workload, name, source):
    """`source` in sim.addresses' vocabulary: "compared" = the run's own addresses (a replay);
    "trace" = those of the replayed trace (for uncapped runs default's: a prediction); "model"."""
    from alloctune.sim.addresses import replay_addresses

    ref = _load(traces_dir, workload, name)
    cap = ref.meta.get("cap") or None
    stream = ref if cap else _load(traces_dir, workload, "default")
    settings = SimSettings.from_allocator_settings(ref.allocator_settings)
    addresses, reference = replay_addresses(source, stream, ref)
    result = replay(stream, settings, budget=cap, addresses=addresses, reference=reference)
    return result, compare(result, ref, stream_trace=None if stream is ref else stream), ref


@pytest.mark.parametrize("workload", RVC)
@pytest.mark.parametrize("name", UNCAPPED + CAPPED)
def test_rvc_exact_with_recorded_addresses(traces_dir, workload, name):
    result, fid, ref = _run(traces_dir, workload, name, "compared")
    assert fid.exact, fid.verdict + "\n" + fid.context
    assert fid.events_recorded > 0
    assert result.address_divergence is None  # every recorded address was used, in order
    stats = ref.meta["stats"]
    assert result.peak_reserved == stats["reserved_bytes.all.peak"]
    assert result.stats["num_ooms"] == stats["num_ooms"]


@pytest.mark.parametrize("workload", RVC)
@pytest.mark.parametrize("name", UNCAPPED[1:])
def test_rvc_exact_from_default_recording_alone(traces_dir, workload, name):
    """What a user has: one recording (default). Its stream and addresses predict the others."""
    result, fid, _ = _run(traces_dir, workload, name, "trace")
    assert fid.exact, fid.verdict + "\n" + fid.context


@pytest.mark.parametrize("workload", RVC)
@pytest.mark.parametrize("name", UNCAPPED + CAPPED)
def test_rvc_predicted_addresses_reproduce_events_and_peaks(traces_dir, workload, name):
    """With the driver model instead of recorded addresses: same events and headline stats."""
    result, fid, _ = _run(traces_dir, workload, name, "model")
    assert fid.events_match, fid.context
    assert fid.headline_match, fid.stats
    assert fid.failures_match


def test_capped_runs_fail_exactly_the_recorded_requests(traces_dir):
    result, fid, ref = _run(traces_dir, "rvc_ec0", "gc07_split256_cap115a", "compared")
    failed = [i for i, op in enumerate(ref.requests.ops) if op == 3]
    assert len(failed) == ref.meta["stats"]["num_ooms"] == 705
    assert list(result.expected_failures) == failed
    assert result.unexpected_successes == () and result.oom is None


def test_a_wrong_setting_is_caught(traces_dir):
    """The comparison can fail: default's stream under max_split 128 is not the default run."""
    d = _load(traces_dir, "rvc_ec0", "default")
    ref = _load(traces_dir, "rvc_ec0", "max_split_128")
    result = replay(d, SimSettings(), addresses="model")
    fid = compare(result, ref, stream_trace=d)
    assert not fid.exact and fid.first_difference is not None
    assert "segment event #" in fid.context and "requests:" in fid.context
    assert "simulated state before request" in fid.context


def test_budget_below_need_ooms_at_a_request(traces_dir):
    d = _load(traces_dir, "rvc_ec1", "default")
    result = replay(d, None, budget=1 << 30)
    assert not result.completed and result.oom is not None
    assert result.oom.request_index == result.requests_done
    assert result.oom.reserved + result.oom.alloc_size > result.cap


@pytest.mark.slow
def test_llm_roundup4_exact_from_default_recording(traces_dir):
    result, fid, _ = _run(traces_dir, "llm", "roundup4", "trace")
    assert fid.exact, fid.verdict + "\n" + fid.context
    assert len(result.segment_events) == fid.events_recorded


@pytest.mark.parametrize(
    "name", ["default_cap85", pytest.param("default_cap95", marks=pytest.mark.slow),
             pytest.param("expandable_cap85", marks=pytest.mark.slow),
             pytest.param("gc07_split256_cap115a", marks=pytest.mark.slow)],
)
def test_llm_oom_message_matches_the_gpu(traces_dir, name):
    """The simulated OOM text equals PyTorch's, except the driver's free figure and NVML process list."""
    from alloctune.sim.oom import oom_message
    from alloctune.units import format_size

    result, fid, ref = _run(traces_dir, "llm", name, "compared")
    assert fid.exact
    recorded = ref.meta["oom_message"]
    simulated = oom_message(result.failures[-1], total_memory=ref.total_memory)
    assert simulated.split(" of which ")[0] == recorded.split(" of which ")[0]  # Tried to allocate X. GPU 0 ... T
    allowed = format_size(result.cap) + " allowed; "
    assert simulated[simulated.index(allowed):] == recorded[recorded.index(allowed):]
