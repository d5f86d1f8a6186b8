"""#30.0: a snapshot is diagnosed within the cap the run had, and says what it cannot know.

The core flow: `alloctune run --budget CAP --on-oom snapshot` dies with an OOM, then the snapshot it
wrote is diagnosed with no flags. The cap must travel inside the snapshot (the report beside it is
gone), the verdict and every what-if are computed within it, and a snapshot whose cap is unknown
gets no what-if answers.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest
from fake_torch import install

from alloctune.diagnose.snapshot import diagnose_snapshot
from alloctune.diagnose.service import diagnose_input
from alloctune.errors import TraceError
from alloctune.trace import load_snapshot
from alloctune.trace.load import read_sidecar
from alloctune.units import GiB, MiB, format_size

CAPPED = "rvc_ec1/default_cap85.pickle.xz"  # a real H200 run under a cap; the sidecar holds the cap


def _recorded(traces_dir, name=CAPPED):
    path = traces_dir / name
    return load_snapshot(path), read_sidecar(path)


def test_the_cap_recorded_inside_the_snapshot_is_the_budget(traces_dir):
    snap, side = _recorded(traces_dir)
    snap["alloctune_run"] = {"cap": side["cap"], "total_memory": side["total_memory"], "torch": side["torch"],
                             "cmd": ["infer.py", "--in", "a b.wav"]}
    d = diagnose_snapshot(snap)  # a dict: no sidecar can be found, only the record inside
    assert (d.budget, d.budget_source) == (side["cap"], "recorded cap")
    assert d.reproduced is True and d.what_if[0].avoids_oom is False
    assert d.verdict == "fragmentation" and d.recommendation == "expandable_segments:True"
    assert d.confirm == (f"alloctune run --conf expandable_segments:True --budget {side['cap']}B --on-oom snapshot "
                         "-- python infer.py --in 'a b.wav'")


def test_without_its_cap_a_capped_snapshot_gets_no_what_if_answers(traces_dir):
    snap, side = _recorded(traces_dir)
    d = diagnose_snapshot(snap)
    assert d.budget_source.startswith("assumed") and d.budget > 100 * GiB  # the whole device
    assert d.reproduced is False and d.verdict == "unknown" and d.recommendation is None
    assert [w.config for w in d.what_if] == [""] and "does NOT reproduce" in d.what_if[0].note
    assert "--budget" in d.undecided
    # the hint brackets the cap the run really had (the sidecar's figure, written by the recording process)
    low, high = (int(x) for x in _bracket_bytes(d.undecided))
    assert low <= side["cap"] < high


def _bracket_bytes(text):
    import re

    from alloctune.units import parse_size

    m = re.search(r"lay between (\S+ \S+) .* and (\S+ \S+) \(reserved", text)
    return parse_size(m.group(1).replace(" ", "")), parse_size(m.group(2).replace(" ", ""))


def test_the_oom_text_beside_a_snapshot_gives_its_cap(traces_dir, tmp_path):
    snap, side = _recorded(traces_dir)
    path = tmp_path / "plain.pickle"
    import pickle

    path.write_bytes(pickle.dumps(snap))  # a plain torch snapshot: no record, no sidecar
    # the message torch prints under a memory fraction, with this run's figures at the OOM
    probe = diagnose_snapshot(snap, budget=side["cap"], candidates=None)
    fs = format_size
    message = (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {fs(probe.alloc_size)}. GPU 0 has a "
               f"total capacity of {fs(side['total_memory'])} of which {fs(probe.device_free)} is free. "
               f"{fs(side['cap'])} allowed; Of the allocated memory {fs(probe.allocated)} is allocated by PyTorch, "
               f"and {fs(probe.reserved_free)} is reserved by PyTorch but unallocated.")
    log = tmp_path / "err.log"
    log.write_text(f"step 7 [INFO] {message}\n")
    kind, d = diagnose_input(log, snapshot=path)
    assert kind == "snapshot" and d.budget_source == "the OOM message's 'allowed'"
    assert abs(d.budget - side["cap"]) <= 5 * MiB  # printed to 2 decimals of a GiB
    assert d.reproduced is True and d.recommendation == "expandable_segments:True"


def _history(*items):
    events, t = [], 0
    for action, addr, size in items:
        t += 1
        e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t}
        if action == "oom":
            e.update(addr=0, device_free=100 * GiB)
        events.append(e)
    return events


A = 1 << 40


def _at_oom(events, settings=None):
    from alloctune.memory_map.build import replay_history

    mm = replay_history(events, capture=[len(events) - 1]).maps[len(events) - 1]
    segs = [{"address": s.addr, "total_size": s.size, "stream": s.stream, "segment_type": s.pool,
             "is_expandable": s.expandable,
             "blocks": [{"address": b.addr, "size": b.size, "requested_size": b.requested,
                         "state": "active_allocated" if b.allocated else "inactive"} for b in s.blocks]}
            for s in mm.segments]
    return {"segments": segs, "device_traces": [events],
            "allocator_settings": settings or {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                               "expandable_segments": False}}


def test_shortage_within_the_cap_says_how_much_the_run_needs():
    # 300 MiB live, then a 300 MiB request under a 500 MiB cap: no setting can serve it
    snap = _at_oom(_history(("segment_alloc", A, 300 * MiB), ("alloc", A, 300 * MiB), ("oom", 0, 300 * MiB)))
    snap["alloctune_run"] = {"cap": 500 * MiB}
    d = diagnose_snapshot(snap)
    assert d.reproduced is True and d.verdict == "shortage" and d.recommendation is None
    assert not any(w.avoids_oom for w in d.what_if)
    # the bisection's answer brackets what the live tensors and the request need (1 % or 16 MiB)
    assert 600 * MiB <= d.needs <= 600 * MiB + 16 * MiB
    assert "more" in d.summary and d.ends_at_oom
    nexts = [e for e in d.evidence if e.startswith("next: ")]
    assert "alloctune explain SNAPSHOT" in nexts[0] and "alloctune plan sizes/ --budget 500MiB" in nexts[1]


def test_a_budget_the_replays_cannot_bear_out_is_said_and_not_used():
    # the run held 896 MiB before; a 500 MiB "cap" fails far earlier in the replay: not the run's budget
    from test_snapshot_diag import _pinned_pattern_snapshot

    d = diagnose_snapshot(_pinned_pattern_snapshot(), budget=500 * MiB)
    assert d.reproduced is False and d.recommendation is None and len(d.what_if) == 1
    assert d.verdict == "shortage"  # live 336 MiB + 200 MiB request > 500 MiB: certain without replays
    assert "fails earlier" in d.undecided


def test_a_malformed_run_record_is_one_clear_error(traces_dir):
    snap, _ = _recorded(traces_dir)
    for bad in ([1, 2], {"cap": "1GiB"}, {"cap": -5}, {"cmd": "python x.py"}, {"cap": True}):
        snap["alloctune_run"] = bad
        with pytest.raises(TraceError, match="alloctune_run"):
            diagnose_snapshot(snap)


@pytest.fixture()
def fake_env(tmp_path):
    install(tmp_path / "fake")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    env.update(PYTHONPATH=str(tmp_path / "fake"), ALLOCTUNE_STATE_DIR=str(tmp_path / "live"))
    return env


def test_run_with_a_budget_writes_the_cap_into_its_oom_snapshot(tmp_path, fake_env):
    """The whole flow on the fake CUDA: run under a cap, OOM, diagnose the snapshot with no flags."""
    from alloctune.run.runner import run_trial

    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent("""
        import torch
        keep = torch.empty(600 << 20, device="cuda")
        more = torch.empty(600 << 20, device="cuda")
    """))
    res = run_trial([sys.executable, str(prog)], budget=GiB, on_oom="snapshot", oom_dir=tmp_path, env=fake_env,
                    capture=tmp_path / "o.log")
    assert res.outcome == "oom" and res.oom_snapshot
    d = diagnose_snapshot(res.oom_snapshot)
    assert d.budget_source == "recorded cap" and GiB <= d.budget < GiB + 16  # int(fraction * total) >= budget
    assert d.reserved == 600 * MiB and d.allocated == 600 * MiB and d.request == 600 * MiB
    assert d.reproduced is True and d.verdict == "shortage" and 1200 * MiB <= d.needs <= 1216 * MiB


# ---- real OOM snapshots of real library code, checked against real runs under the same cap --------------

DATA = __import__("pathlib").Path(__file__).parent / "data" / "cap_oom"


def _real_runs():
    return json.loads((DATA / "real_runs.json").read_text())["programs"]


@pytest.mark.parametrize("program", ["seg", "convnext", "hubert", "trainkeep"])
def test_real_capped_oom_snapshots_agree_with_real_runs(program):
    """Snapshots `alloctune run --budget CAP --on-oom snapshot` wrote on an H200 (bench/diagnose_cap_gpu.py),
    diagnosed with no flag; `real_runs.json` holds what real runs of every standard setting did under the cap."""
    facts = _real_runs()[program]
    d = diagnose_snapshot(DATA / f"{program}.pickle.xz")
    assert d.budget_source == "recorded cap" and 0 <= d.budget - facts["cap"] < 16  # int(fraction * total)
    assert d.reproduced is True and d.ends_at_oom
    completed = {c for c, ok in facts["completed"].items() if ok}
    serving = {w.config for w in d.what_if if w.avoids_oom}
    if completed:  # a setting fixes it for real: the replays name exactly the settings that completed
        assert d.verdict == "fragmentation" and serving == completed and d.recommendation in completed
        assert d.margin is not None and not d.margin.thin and d.to_dict()["margin"]["bytes"] == d.margin.bytes > 0
        assert d.confirm.startswith(f"alloctune run --conf {d.recommendation} --budget ")
    elif serving:  # no setting completes, yet one serves the failed request: only just, and nothing recommended
        assert d.verdict == "borderline" and "thin" in d.summary and d.recommendation is None
        assert d.margin is not None and d.margin.thin and d.to_dict()["margin"]["thin"] is True
        assert d.margin.bytes == d.budget - max(w.peak_reserved for w in d.what_if if w.avoids_oom)
        # the real run under that setting got past the failed request, to the very peak the replay gives
        w = next(w for w in d.what_if if w.avoids_oom)
        assert facts["real_peak_reserved"][w.config] == w.peak_reserved
    else:  # every setting failed for real: the best what-if has no margin, and JSON says so
        assert d.verdict == "shortage" and d.needs > d.budget and d.recommendation is None
        assert d.margin is not None and d.margin.bytes == d.budget - d.needs < 0 and d.margin.thin
        assert d.to_dict()["margin"] == {"bytes": d.margin.bytes, "fraction": d.margin.bytes / d.budget, "thin": True}


def test_real_capped_snapshot_without_its_record_gets_no_answers():
    snap = load_snapshot(DATA / "seg.pickle.xz")
    cap = snap.pop("alloctune_run")["cap"]
    d = diagnose_snapshot(snap)
    assert d.reproduced is False and d.recommendation is None and len(d.what_if) == 1
    low, high = _bracket_bytes(d.undecided)
    assert low <= cap < high


def test_the_run_record_survives_the_trace_cache_and_a_sidecar_does_not_leak(traces_dir, tmp_path, monkeypatch):
    import pickle
    import shutil

    from alloctune.trace import load_trace

    monkeypatch.setenv("ALLOCTUNE_CACHE_DIR", str(tmp_path / "cache"))
    snap, side = _recorded(traces_dir)
    snap["alloctune_run"] = {"cap": side["cap"], "total_memory": side["total_memory"]}
    path = tmp_path / "rec.pickle"
    path.write_bytes(pickle.dumps(snap))
    first, second = load_trace(path), load_trace(path)  # the second comes from the cache
    assert first.meta["cap"] == second.meta["cap"] == side["cap"]
    # a copy of a file whose cap sat only in its sidecar does not inherit that cap from the cache
    capped = traces_dir / CAPPED
    load_trace(capped)
    bare = tmp_path / "bare.pickle.xz"
    shutil.copy(capped, bare)
    assert "cap" not in load_trace(bare).meta
