"""Hostile recordings for `explain`: one line, exit 2, bounded memory; replay is unaffected."""

from __future__ import annotations

import pickle

import pytest

from cli_run import run_cli
from explain_programs import training_loop, write


def _with_frames(tmp_path, mutate):
    snap, _ = training_loop(steps=4)
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    mutate(allocs)
    return write(snap, tmp_path / "bad.pickle")


@pytest.mark.parametrize("mutate", [
    lambda a: a[1].__setitem__("frames", "not a list"),
    lambda a: a[1].__setitem__("frames", [{"filename": ["x"], "line": 1, "name": "f"}]),
    lambda a: a[1].__setitem__("frames", [{"line": 1}]),
    lambda a: a[1].__setitem__("frames", [{"filename": "a.py", "line": "1", "name": "f"}]),
    lambda a: a[1].__setitem__("frames", [{"filename": "a.py", "line": 1, "name": "f"}] * 5000),
], ids=["not-a-list", "unhashable", "missing-keys", "line-not-int", "enormous"])
def test_malformed_frames_are_one_line_and_exit_2(tmp_path, capsys, mutate, monkeypatch):
    monkeypatch.setenv("ALLOCTUNE_CACHE", "0")
    path = _with_frames(tmp_path, mutate)
    code, out, err = run_cli(capsys, "explain", str(path), "--no-what-if")
    assert code == 2
    assert err.startswith("alloctune: error: ") and err.count("\n") == 1
    assert "stacks" in err
    code, _, err = run_cli(capsys, "simulate", str(path))  # replay does not need the frames
    assert code == 0, err


def test_millions_of_distinct_stacks_are_bounded(tmp_path, capsys, monkeypatch):
    import alloctune.trace.stacks as stacks

    monkeypatch.setenv("ALLOCTUNE_CACHE", "0")
    monkeypatch.setattr(stacks, "MAX_STACKS", 50)  # the bound, made small enough to reach in a test
    snap, _ = training_loop(steps=4)
    for i, e in enumerate(x for x in snap["device_traces"][0] if x["action"] == "alloc"):
        e["frames"] = [{"filename": f"/u/gen_{i}.py", "line": i, "name": "f"}]
    path = write(snap, tmp_path / "many.pickle")
    code, _, err = run_cli(capsys, "explain", str(path), "--no-what-if")
    assert code == 2 and "more than 50 distinct stacks" in err and err.count("\n") == 1


def test_a_damaged_compact_stack_table_is_refused(tmp_path, capsys):
    import hashlib
    import json
    import lzma

    from alloctune.trace import load_trace
    from alloctune.trace.compact import FORMAT, SCHEMA, to_compact_dict

    snap, _ = training_loop(steps=3)
    trace = load_trace(write(snap, tmp_path / "ok.pickle"))
    d = to_compact_dict(trace)
    d["stacks"]["alloc_stack"][0] = 10 ** 6
    body = json.dumps(d).encode()
    head = f"{FORMAT} {SCHEMA} sha256={hashlib.sha256(body).hexdigest()} bytes={len(body)}\n".encode()
    bad = tmp_path / "bad.atrace"
    bad.write_bytes(lzma.compress(head + body))
    code, _, err = run_cli(capsys, "explain", str(bad), "--no-what-if")
    assert code == 2 and "damaged" in err and err.count("\n") == 1


@pytest.mark.parametrize("args", [["--at", "soon"], ["--at", "99999999"], ["--group", "package"]])
def test_bad_options_are_one_line(tmp_path, capsys, args):
    snap, _ = training_loop(steps=3)
    path = write(snap, tmp_path / "ok.pickle")
    code, _, err = run_cli(capsys, "explain", str(path), "--no-what-if", *args)
    assert code == 2 and err.startswith("alloctune: error: ") and err.count("\n") == 1


def test_not_a_snapshot(tmp_path, capsys):
    p = tmp_path / "x.pickle"
    p.write_bytes(pickle.dumps({"hello": 1}))
    code, _, err = run_cli(capsys, "explain", str(p))
    assert code == 2 and err.count("\n") == 1
