"""#27.7: `simulate --snapshot-out` writes the simulated run as a torch memory snapshot.

The file must be what PyTorch's memory_viz reads (its Python readers run on it), carry each
allocation's recorded frames, and be the simulation itself: loaded back through alloctune's own
(restricted) loader and replayed, it gives the simulated peaks and segment events.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from alloctune.config import AllocatorConfig
from alloctune.sim.export import simulated_snapshot, write_snapshot
from alloctune.sim.replay import replay
from alloctune.trace import load_snapshot, load_trace, trace_from_snapshot
from alloctune.units import GiB, MiB

CASES = [("", None), ("expandable_segments:True", None), ("max_split_size_mb:128", None), ("", int(1.4 * GiB))]


@pytest.fixture(scope="module")
def rvc(traces_dir):
    return load_trace(traces_dir / "rvc_ec1" / "default.pickle.xz")


def _segment_events(snap):
    return [(e["action"], e["addr"], e["size"], e["stream"]) for e in snap["device_traces"][0]
            if e["action"].startswith("segment")]


def _peak(snap):
    level = peak = 0
    for action, _, size, _ in _segment_events(snap):
        level += size if action in ("segment_alloc", "segment_map") else -size
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("conf,budget", CASES)
def test_the_snapshot_is_the_simulation(rvc, conf, budget, tmp_path):
    config = AllocatorConfig.parse(conf, "2.11")
    sim = replay(rvc, config, budget=budget, torch="2.11")
    snap = simulated_snapshot(rvc, config, budget=budget, torch="2.11")
    assert _segment_events(snap) == [(e.action, e.addr, e.size, e.stream) for e in sim.segment_events
                                     if e.action != "oom"]
    assert _peak(snap) == sim.peak_reserved
    events = snap["device_traces"][0]
    assert (events[-1]["action"] == "oom") == (not sim.completed)
    # the segments at the end tile exactly what the history leaves reserved
    level = sum(s if a in ("segment_alloc", "segment_map") else -s for a, _, s, _ in _segment_events(snap))
    assert sum(seg["total_size"] for seg in snap["segments"]) == level
    # written, then read back through alloctune's restricted loader and replayed: the same run again
    path = write_snapshot(snap, tmp_path / "sim.pickle.xz")
    again = trace_from_snapshot(load_snapshot(path), source=str(path), partial=not sim.completed)
    back = replay(again, config, budget=budget, torch="2.11")
    assert back.peak_reserved == sim.peak_reserved and back.peak_allocated == sim.peak_allocated
    assert [(e.action, e.size) for e in back.segment_events if e.action != "oom"] == \
        [(a, s) for a, _, s, _ in _segment_events(snap)]


def test_pytorchs_memory_viz_reads_it(rvc):
    viz = pytest.importorskip("torch.cuda._memory_viz")
    snap = simulated_snapshot(rvc, AllocatorConfig.parse("expandable_segments:True", "2.11"), torch="2.11")
    assert "segments:" in viz.segsum(snap)
    assert viz.trace(snap)  # walks every event of the history
    def lines(text):  # the flame graph's input text, not its drawing (which downloads a script)
        return text

    assert viz.segments(snap, format_flamegraph=lines) and viz.memory(snap, format_flamegraph=lines)
    assert "Active Memory Timeline" in viz.trace_plot(snap) and viz.segment_plot(snap)


def test_each_allocation_keeps_its_recorded_frames():
    frames = [{"filename": "train.py", "line": 12, "name": "step"},
              {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"}]
    A = 1 << 40
    events = [
        {"action": "segment_alloc", "addr": A, "size": 20 * MiB, "stream": 0, "time_us": 1, "frames": frames},
        {"action": "alloc", "addr": A, "size": 3 * MiB, "stream": 0, "time_us": 2, "frames": frames},
        {"action": "alloc", "addr": A + 3 * MiB, "size": 5 * MiB, "stream": 0, "time_us": 3, "frames": frames[:1]},
        {"action": "free_requested", "addr": A, "size": 3 * MiB, "stream": 0, "time_us": 4, "frames": frames},
        {"action": "free_completed", "addr": A, "size": 3 * MiB, "stream": 0, "time_us": 5, "frames": frames},
    ]
    trace = trace_from_snapshot({"segments": [], "device_traces": [events], "allocator_settings": {}})
    snap = simulated_snapshot(trace)
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    assert [e["frames"] for e in allocs] == [frames, frames[:1]]
    live = [b for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]
    assert [b["frames"] for b in live] == [frames[:1]] and live[0]["requested_size"] == 5 * MiB


def test_cli_snapshot_out(traces_dir, tmp_path):
    out = tmp_path / "after.pickle"
    run = subprocess.run([sys.executable, "-m", "alloctune", "simulate", str(traces_dir / "rvc_ec1/default.pickle.xz"),
                          "--conf", "expandable_segments:True", "--json", "--snapshot-out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    row = json.loads(run.stdout)["rows"][0]
    assert _peak(load_snapshot(out)) == row["peak_reserved"]
    two = subprocess.run([sys.executable, "-m", "alloctune", "simulate", str(traces_dir / "rvc_ec1/default.pickle.xz"),
                          "--conf", "", "--conf", "expandable_segments:True", "--snapshot-out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert two.returncode == 2 and two.stderr.startswith("alloctune: error: ") and "one --conf" in two.stderr


def test_recorded_failures_follow_the_replays_rules(traces_dir):
    """A capped run that survived 1881 failed requests (cuDNN falling back): under its cap the snapshot's
    segment events are the replay's, recorded failures included."""
    trace = load_trace(traces_dir / "rvc_ec1" / "default_cap85.pickle.xz")
    cap = trace.meta["cap"]
    sim = replay(trace, None, budget=cap, torch="2.11")
    snap = simulated_snapshot(trace, None, budget=cap, torch="2.11")
    assert _segment_events(snap) == [(e.action, e.addr, e.size, e.stream) for e in sim.segment_events
                                     if e.action != "oom"]
    assert _peak(snap) == sim.peak_reserved == snap["alloctune_simulated"]["peak_reserved"]
