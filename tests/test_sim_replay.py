"""replay() / SimResult / state_at on hand-built request streams (no shared data needed)."""

from __future__ import annotations

import json

import pytest

from alloctune.config import AllocatorConfig, ConfigSyntaxError
from alloctune.sim import SimResult, SimSettings, replay
from alloctune.sim.replay import state_at
from alloctune.trace.model import ALLOC, EMPTY_CACHE, FAILED_ALLOC, FREE, RequestStream, Trace

MiB = 1 << 20
TOTAL = 80 << 30


def stream(*ops) -> Trace:
    req = RequestStream()
    for k, (op, size, rid) in enumerate(ops):
        req.append(op, size, rid, 0, k)
    return Trace(source="hand-built", device=0, requests=req, segment_events=[], allocator_settings={},
                 total_memory=TOTAL)


def basic() -> Trace:
    return stream(
        (ALLOC, 30 * MiB, 0),
        (ALLOC, 5 * MiB, 1),
        (FREE, -1, 0),
        (ALLOC, 20 * MiB, 2),  # reuses the freed 30 MiB block (split: 10 MiB remainder)
        (FREE, -1, 1),
        (FREE, -1, 2),
        (EMPTY_CACHE, -1, -1),
    )


def test_replay_peaks_events_timeline_and_json():
    r = replay(basic(), None, addresses="model", timeline_points=3)
    assert r.completed and r.oom is None and r.requests_done == 7
    assert [(e.action, e.size // MiB, e.request_index) for e in r.segment_events] == [
        ("segment_alloc", 30, 0),
        ("segment_alloc", 20, 1),
        ("segment_free", 20, 6),  # empty_cache frees in pool order: ascending size
        ("segment_free", 30, 6),
    ]
    assert r.peak_reserved == 50 * MiB
    assert r.peak_allocated == 35 * MiB  # 30 + 5
    assert r.utilization == 35 / 50
    assert r.stats["reserved_bytes.all.current"] == 0 and r.stats["num_device_free"] == 2
    assert max(r.timeline["reserved"]) == r.peak_reserved
    assert max(r.timeline["allocated"]) == r.peak_allocated
    assert r.timeline["index"][-1] == 7
    d = json.loads(json.dumps(r.to_dict()))
    assert d["schema"] == "alloctune.sim_result/1"
    back = SimResult.from_dict(d)
    assert back.to_dict() == r.to_dict()


def test_budget_oom_point_and_expected_failures():
    # 5 MiB needs a 20 MiB segment: with 40 MiB allowed and 30 MiB held it cannot
    r = replay(basic(), None, budget=40 * MiB, addresses="model")
    assert not r.completed and r.requests_done == 1
    assert (r.oom.request_index, r.oom.size, r.oom.alloc_size, r.oom.reserved) == (1, 5 * MiB, 20 * MiB, 30 * MiB)
    assert r.stats["num_alloc_retries"] == 1 and r.stats["num_ooms"] == 1
    # the same request recorded as failed: expected, the replay continues past it
    t = stream((ALLOC, 30 * MiB, 0), (FAILED_ALLOC, 5 * MiB, -1), (FREE, -1, 0))
    r = replay(t, None, budget=40 * MiB, addresses="model")
    assert r.completed and r.expected_failures == (1,) and r.unexpected_successes == ()
    # with room for it, a recorded failure that now fits is reported, not hidden
    r = replay(t, None, budget=60 * MiB, addresses="model")
    assert r.unexpected_successes == (1,) and r.stats["allocated_bytes.all.current"] == 0


def test_config_objects_and_fraction_key():
    t = basic()
    exp = replay(t, AllocatorConfig.parse("expandable_segments:True"), addresses="model")
    assert {e.action for e in exp.segment_events} == {"segment_map", "segment_unmap"}
    assert exp.peak_reserved == 40 * MiB  # 30 -> two 20 MiB pages; 5 MiB fits in the 10 MiB tail
    frac = replay(t, AllocatorConfig.parse("per_process_memory_fraction:0.0000000005"), addresses="model")
    assert frac.cap == int(0.0000000005 * TOTAL) and not frac.completed


def test_torch_version_changes_the_tiebreak():
    # two 30 MiB segments freed; a 30 MiB request takes the newer (lower address) on 2.11,
    # the older on 2.13; then a 10 MiB request goes to whichever is left in 2.11 / 2.13 alike
    t = stream((ALLOC, 30 * MiB, 0), (ALLOC, 30 * MiB, 1), (FREE, -1, 0), (FREE, -1, 1), (ALLOC, 30 * MiB, 2))
    a11 = state_at(t, SimSettings(), 5, addresses="model")
    a13 = state_at(t, SimSettings(torch=(2, 13)), 5, addresses="model")
    taken11 = [s["address"] for s in a11.segment_table() if s["allocated_size"]]
    taken13 = [s["address"] for s in a13.segment_table() if s["allocated_size"]]
    addrs11 = sorted(s["address"] for s in a11.segment_table())
    assert taken11 == [addrs11[0]]  # lowest address (the newer segment)
    addrs13 = sorted(s["address"] for s in a13.segment_table())
    assert taken13 == [addrs13[1]]  # the older segment, at the higher address


def test_state_at_shows_blocks():
    a = state_at(basic(), None, 4, addresses="model")  # after the 20 MiB reuse
    table = a.segment_table()
    assert [s["total_size"] // MiB for s in table] and sum(s["total_size"] for s in table) == 50 * MiB
    blocks = [(b["size"] // MiB, b["state"]) for s in table for b in s["blocks"]]
    assert sorted(blocks) == [(5, "active_allocated"), (10, "inactive"), (15, "inactive"), (20, "active_allocated")]


def test_simulator_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, alloctune.sim, alloctune.sim.budget; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_oom_message_per_release():
    from alloctune.sim.oom import oom_message

    t = stream((ALLOC, 90 * MiB, 0), (ALLOC, 5 * MiB, 1))
    r = replay(t, None, budget=100 * MiB, addresses="model")
    info = r.oom
    m11 = oom_message(info, total_memory=TOTAL)
    assert m11.startswith("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 80.00 GiB")
    assert "100.00 MiB allowed; Of the allocated memory 90.00 MiB is allocated by PyTorch, and 0 bytes is reserved" in m11
    assert m11.endswith("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
                        "for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html"
                        "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")
    m10 = oom_message(info, total_memory=TOTAL, torch="2.10")
    assert "PYTORCH_ALLOC_CONF=expandable" in m10 and m10.endswith("#environment-variables)")
    m5 = oom_message(info, total_memory=TOTAL, torch="2.5", private_pool_bytes=2 * MiB)
    assert "92.00 MiB is allocated by PyTorch, with 2.00 MiB allocated in private pools (e.g., CUDA Graphs), and" in m5


def test_settings_from_a_conf_string_are_parsed_not_defaulted():
    assert SimSettings.from_config("expandable_segments:True").expandable_segments is True
    assert SimSettings.from_config("max_split_size_mb:128").max_split_size == 128 * 2**20
    assert SimSettings.from_config("") == SimSettings.from_config(None)
    with pytest.raises(ConfigSyntaxError):
        SimSettings.from_config("expandable_segments:maybe")
