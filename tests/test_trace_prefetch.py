"""A recording loaded ahead (`trace.prefetch`), the watch that starts it while a recorded run still
exits (`run.child.RecordingWatch`), and the agent's whole-file write that makes the watch safe."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from alloctune.agent.outputs import AgentOutputs
from alloctune.errors import TraceError
from alloctune.run.child import RecordingWatch, recording_watch
from alloctune.trace import load_trace, prefetch_trace
from alloctune.trace import prefetch as pending
from alloctune.trace.model import Trace
from test_trace_load import ev, small_run, write_snapshot


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch):
    monkeypatch.setenv("ALLOCTUNE_CACHE", "0")
    pending._PENDING.clear()
    yield
    pending._PENDING.clear()


def _held(monkeypatch) -> tuple[threading.Event, list[str]]:
    """Make the prefetch thread wait at the start of its load until `go` is set; `loads` names each load."""
    import alloctune.trace.load as load_mod

    go, loads = threading.Event(), []
    real = load_mod.load_through_cache

    def slow(path, device, partial):
        loads.append(threading.current_thread().name)
        assert go.wait(10)
        return real(path, device, partial)

    monkeypatch.setattr(load_mod, "load_through_cache", slow)
    return go, loads


def test_the_next_load_of_the_file_takes_the_prefetched_trace(tmp_path, monkeypatch):
    path = write_snapshot(tmp_path / "rec.pickle", [small_run()], compress=False)
    expected = load_trace(path)
    go, loads = _held(monkeypatch)
    prefetch_trace(path)
    go.set()
    got = load_trace(path)
    assert loads == ["alloctune-prefetch"]  # loaded once, in the prefetch's thread
    assert isinstance(got, Trace) and got.source == str(path)
    assert list(got.requests.ops) == list(expected.requests.ops) and list(got.requests.sizes) == list(expected.requests.sizes)
    assert pending._PENDING == {}
    load_trace(path)  # taken once: the next load reads the file again
    assert loads == ["alloctune-prefetch", "MainThread"]


def test_a_file_changed_after_the_prefetch_is_loaded_again(tmp_path, monkeypatch):
    path = write_snapshot(tmp_path / "rec.pickle", [small_run()], compress=False)
    go, loads = _held(monkeypatch)
    prefetch_trace(path)
    more = [ev("alloc", 0x1000_0400, 64), ev("free_requested", 0x1000_0400, 64), ev("free_completed", 0x1000_0400, 64)]
    write_snapshot(path, [small_run()[:-1] + more + small_run()[-1:]], compress=False)
    os.utime(path, ns=(1, 1))  # a different modification time, even where the clock is coarse
    go.set()
    got = load_trace(path)
    assert loads[-1] == "MainThread"  # the file changed since: the prefetched trace is not this file's
    assert len(got.requests.ops) == len(load_trace(tmp_path / "rec.pickle").requests.ops) > 3
    assert len(got.requests.ops) - 2 == len(load_trace(write_snapshot(tmp_path / "old.pickle", [small_run()])).requests.ops)


def test_a_prefetched_load_that_failed_raises_its_error_in_the_caller(tmp_path):
    path = tmp_path / "bad.pickle"
    path.write_bytes(b"\x80\x04not a pickle at all")
    with pytest.raises(TraceError) as direct:
        load_trace(path)
    prefetch_trace(path)
    with pytest.raises(TraceError) as taken:
        load_trace(path)
    assert str(taken.value) == str(direct.value)


def test_one_load_is_pending_at_most(tmp_path):
    a = write_snapshot(tmp_path / "a.pickle", [small_run()], compress=False)
    b = write_snapshot(tmp_path / "b.pickle", [small_run()], compress=False)
    prefetch_trace(a)
    prefetch_trace(b)
    assert [k[0] for k in pending._PENDING] == [os.path.realpath(b)]
    prefetch_trace(tmp_path / "missing.pickle")  # nothing to load: nothing changes
    assert len(pending._PENDING) == 1


WRITER = """
    import os, sys, time
    path = sys.argv[1]
    time.sleep(0.3)
    with open(path + ".tmp", "wb") as fh:
        fh.write(b"x" * 1000)
    os.replace(path + ".tmp", path)
    time.sleep(float(sys.argv[2]))  # the exit after the recording: the interpreter, the CUDA context
"""


def _child(tmp_path, path, after: float) -> subprocess.Popen:
    prog = tmp_path / "writer.py"
    prog.write_text(textwrap.dedent(WRITER))
    return subprocess.Popen([sys.executable, str(prog), str(path), str(after)])


def test_the_watch_tells_of_the_recording_while_the_run_still_exits(tmp_path):
    path = tmp_path / "baseline.pickle"
    path.write_bytes(b"an earlier run's recording")  # not this run's: no call for it
    seen: list[tuple[float, int]] = []
    watch = recording_watch(path, lambda p: seen.append((time.monotonic(), p.stat().st_size)))
    assert isinstance(watch, RecordingWatch)
    proc = _child(tmp_path, path, after=1.5)
    watch.wait(proc, timeout=30)
    ended = time.monotonic()
    assert proc.returncode == 0
    assert len(seen) == 1 and seen[0][1] == 1000  # once, and the whole file
    assert ended - seen[0][0] > 1.0  # told while the child still ran


def test_the_watch_keeps_the_timeout(tmp_path):
    seen: list = []
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            RecordingWatch(tmp_path / "x.pickle", seen.append).wait(slow, timeout=0.3)
    finally:
        slow.kill()
        slow.wait()
    assert seen == []


def test_no_watch_without_a_plain_name_or_a_listener(tmp_path):
    assert recording_watch(tmp_path / "rec.{pid}.pickle", print) is None  # the agent fills the name
    assert recording_watch(None, print) is None
    assert recording_watch(tmp_path / "rec.pickle", None) is None


def test_the_agent_writes_a_recording_whole_or_not_at_all(tmp_path):
    path = tmp_path / "rec.pickle"
    AgentOutputs._write_snapshot({"device_traces": [small_run()]}, str(path))
    assert load_trace(path).requests.ops
    with pytest.raises(Exception):
        AgentOutputs._write_snapshot({"device_traces": [small_run()], "bad": lambda: 0}, str(tmp_path / "b.pickle"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rec.pickle"]  # no half file, no temporary one
