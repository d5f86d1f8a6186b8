"""Damaged and contended result stores: every complete trial kept, each bad line named, one sweep per
store (issue #19, item 5). Trials come from the fake evaluator of the tune tests (no GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import hostile_probes as hp
from alloctune.tune.candidates import parse_knobs
from alloctune.tune.store import StoreBusy, TrialStore
from alloctune.tune.strategy import Tuner, TuneSettings
from tune_fakes import COMMAND, MiB, FakeEvaluator

BUDGET = 2600 * MiB


def sweep(path, resume=False):
    ev = FakeEvaluator()
    with TrialStore(path, COMMAND, resume=resume) as store:
        result = Tuner(ev, TuneSettings(command=COMMAND, budget=BUDGET, knobs=parse_knobs(["expandable"])),
                       store=store).run()
    return result, ev, store


@pytest.fixture()
def finished(tmp_path):
    path = tmp_path / "trials.jsonl"
    result, ev, _ = sweep(path)
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) == len(ev.calls) + 1
    return path, lines, len(ev.calls)


def reopen(path):
    with TrialStore(path, COMMAND, resume=True) as store:
        return store, len(store), list(store.warnings)


def test_missing_final_newline_keeps_the_finished_trial(finished):
    path, lines, n = finished
    path.write_bytes(b"".join(lines)[:-1])  # the last trial is whole, only its newline is lost
    store, kept, warnings = reopen(path)
    assert kept == n and warnings == []
    assert path.read_bytes().endswith(b"\n")
    _, ev, _ = sweep(path, resume=True)
    assert ev.calls == []  # nothing ran again


def test_torn_last_line_is_named_and_only_that_trial_runs_again(finished):
    path, lines, n = finished
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][:30])
    store, kept, warnings = reopen(path)
    assert kept == n - 1
    assert len(warnings) == 1 and f"line {len(lines)}: torn" in warnings[0]
    _, ev, _ = sweep(path, resume=True)
    assert len(ev.calls) == 1


@pytest.mark.parametrize("junk", [b"[1, 2, 3]", b"42", b'"text"', b'{"kind": "note", "schema": 1}',
                                  b'{"kind": "trial", "schema": 1, "key": 5, "result": {}}', b"null"])
def test_valid_json_that_is_not_a_trial_is_skipped_with_its_line(finished, junk):
    path, lines, n = finished
    path.write_bytes(b"".join(lines[:3]) + junk + b"\n" + b"".join(lines[3:]))
    store, kept, warnings = reopen(path)
    assert kept == n
    assert len(warnings) == 1 and "line 4:" in warnings[0] and "\n" not in warnings[0]


def test_lost_header_keeps_every_trial_with_a_warning(finished):
    path, lines, n = finished
    path.write_bytes(b"".join(lines[1:]))
    store, kept, warnings = reopen(path)
    assert kept == n
    assert any("no header line" in w for w in warnings)


def test_garbage_in_the_middle_and_a_torn_end_together(finished):
    path, lines, n = finished
    path.write_bytes(b"".join(lines[:2]) + b"\x00\xff garbage\n" + b"".join(lines[2:-1]) + lines[-1][:-20])
    store, kept, warnings = reopen(path)
    assert kept == n - 1 and len(warnings) == 2


HOLD = """
import sys, time
sys.path.insert(0, sys.argv[2])
from alloctune.tune.store import TrialStore
s = TrialStore(sys.argv[1], ["python", "work.py"], resume=True)
print("locked", flush=True)
time.sleep(60)
"""


def test_a_second_sweep_on_a_store_is_refused_until_the_first_dies(finished, tmp_path):
    path, _, n = finished
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(hp.REPO / "src")], stdout=subprocess.PIPE,
                              text=True, env=hp.cli_env())
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StoreBusy, match=rf"in use by another alloctune tune \(pid {holder.pid}\)"):
            TrialStore(path, COMMAND, resume=True)
        # the CLI says it in one line, exit 2, before any trial runs
        out = hp.run_cli(["tune", "--store", str(path), "--resume", "--", "python", "work.py"], timeout=60)
        assert hp.verdict(out) == "clean" and out.rc == 2 and "in use" in out.stderr
        holder.kill()
        holder.wait()
        store, kept, _ = reopen(path)  # kill -9 released the lock: no stale lock file to delete
        assert kept == n
    finally:
        holder.kill()


def test_one_process_may_reopen_its_own_store(tmp_path):
    path = tmp_path / "s.jsonl"
    a = TrialStore(path, COMMAND)
    b = TrialStore(path, COMMAND, resume=True)  # same process: shares the lock
    b.close()
    a.close()
    c = TrialStore(path, COMMAND, resume=True)
    c.close()


def test_concurrent_cli_tunes_on_one_store_only_one_sweeps(tmp_path):
    """Two real `alloctune tune` processes started together: exactly one runs trials."""
    work = tmp_path / "w.py"
    work.write_text("import time; time.sleep(5)\n")
    store = tmp_path / "s.jsonl"
    cmd = [sys.executable, "-m", "alloctune", "tune", "--store", str(store), "--knobs", "expandable", "--",
           sys.executable, str(work)]
    env = hp.cli_env({"TMPDIR": str(tmp_path), "HOME": str(tmp_path / "home")})
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=90) for p in procs]
    busy = [o for o in outs if "in use by another alloctune tune" in o[1]]
    assert len(busy) == 1, [o[1][-500:] for o in outs]
    assert busy[0][1].strip().count("\n") == 0
    busy_proc = procs[outs.index(busy[0])]
    assert busy_proc.returncode == 2
    header = [json.loads(line) for line in store.read_text().splitlines() if line.strip()]
    assert sum(r.get("kind") == "header" for r in header) == 1
