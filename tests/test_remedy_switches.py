"""A remedy's confirming run reaches the agent with its switch on, and is stored apart from the plain
run of the same setting and budget. (On the H100, tune's checkpointing run of a BERT fine-tune under
6 GiB ran out of memory at 5.99 GiB: the switch never left the request, so the run was the plain one.)"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from alloctune.run import runner
from alloctune.run.trial import TrialResult
from alloctune.tune.executors import TrialRequest
from alloctune.tune.executors.spec import SpecRunner, TrialSpec
from alloctune.tune.executors.stored import request_key
from alloctune.tune.executors.tasks import TrialTask

SWITCHES = {"no_grad": True, "cudnn_benchmark": False, "checkpointing": True}


def test_every_request_field_run_trial_takes_is_passed_on(tmp_path, monkeypatch):
    seen: list[dict] = []

    def fake_run_trial(command, **kwargs):  # noqa: ANN001, ANN202 - the runner's signature, recorded
        seen.append(kwargs)
        return TrialResult(command=list(command), conf=kwargs["conf"], budget=kwargs["budget"], outcome="ok",
                           exit_code=0, wall_s=0.0)

    params = set(inspect.signature(runner.run_trial).parameters)
    monkeypatch.setattr(runner, "run_trial", fake_run_trial)
    shared = [f.name for f in dataclasses.fields(TrialRequest) if f.name in params and f.name not in ("record",)]
    assert set(SWITCHES) <= set(shared)  # the remedy switches are run_trial parameters
    spec = TrialSpec.make(["python", "x.py"], tmp_path)
    for name, value in SWITCHES.items():
        req = TrialRequest("expandable_segments:True", 6 << 30, **{name: value})
        SpecRunner(spec).run_task(TrialTask(req, 1), {})
        got = seen[-1]
        for field in shared:
            assert got[field] == getattr(req, field), (name, field)


@pytest.mark.parametrize("name", sorted(SWITCHES))
def test_a_remedy_run_is_stored_apart_from_the_plain_run(name):
    plain = TrialRequest("expandable_segments:True", 6 << 30, record=True, ensure_cap=True)
    remedy = dataclasses.replace(plain, **{name: SWITCHES[name]})
    assert request_key(["python", "x.py"], plain) != request_key(["python", "x.py"], remedy)
