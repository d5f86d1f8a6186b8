"""The results store: every trial on disk at once, a torn last line survives --resume."""

from __future__ import annotations

import json

import pytest

from alloctune.errors import InputError
from alloctune.tune.candidates import parse_knobs
from alloctune.tune.store import TrialStore, trial_key
from alloctune.tune.strategy import Tuner, TuneSettings
from tune_fakes import COMMAND, MiB, FakeEvaluator

BUDGET = 2600 * MiB


def run(store_path, ev, resume=False):
    store = TrialStore(store_path, COMMAND, resume=resume)
    tuner = Tuner(ev, TuneSettings(command=COMMAND, budget=BUDGET, knobs=parse_knobs(["expandable", "roundup"]), strategy="exhaustive"),
                  store=store)
    return tuner.run(), store


def test_every_trial_is_one_json_line(tmp_path):
    path = tmp_path / "trials.jsonl"
    ev = FakeEvaluator()
    result, _ = run(path, ev)
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["kind"] == "header" and header["command"] == list(COMMAND) and header["schema"] == 1
    trials = [json.loads(line) for line in lines[1:]]
    assert len(trials) == len(ev.calls) == len(result.trials)
    assert trials[0]["key"] == {"command": list(COMMAND), "conf": "", "budget": None, "repeat": 0, "record": True}
    assert trials[1]["result"]["budget"] == BUDGET and trials[1]["result"]["outcome"] == "oom"


def test_resume_after_a_kill_mid_write_reruns_only_the_torn_trial(tmp_path):
    path = tmp_path / "trials.jsonl"
    first_ev = FakeEvaluator()
    first, _ = run(path, first_ev)
    data = path.read_bytes()
    # Simulate a kill while the last trial was being written: half a line, no newline.
    lines = data.splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    ev = FakeEvaluator()
    resumed, store = run(path, ev, resume=True)
    assert store.skipped_lines == 1
    assert len(ev.calls) == 1  # only the torn trial ran again
    assert ev.calls[0][:2] == (first_ev.calls[-1][0], first_ev.calls[-1][1])
    assert [t.reused for t in resumed.trials].count(False) == 1
    assert resumed.ranking.best.candidate.conf == first.ranking.best.candidate.conf
    assert resumed.ranking.best.min_budget == first.ranking.best.min_budget
    # the file is whole again: every line parses, one per trial, nothing duplicated
    reread = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(reread) == len(first.trials) + 1


def test_crashed_trials_are_stored_but_run_again_on_resume(tmp_path):
    path = tmp_path / "s.jsonl"
    store = TrialStore(path, COMMAND)
    key = trial_key(COMMAND, "x", 1, 0, False)
    crash = FakeEvaluator(crash_on="")("", 1)
    store.append(key, crash)
    again = TrialStore(path, COMMAND, resume=True)
    assert len(again) == 1 and again.get(key) is None


def test_existing_store_needs_resume_and_the_same_command(tmp_path):
    path = tmp_path / "s.jsonl"
    TrialStore(path, COMMAND)
    with pytest.raises(InputError, match="--resume"):
        TrialStore(path, COMMAND)
    with pytest.raises(InputError, match="another command"):
        TrialStore(path, ["python", "other.py"], resume=True)
