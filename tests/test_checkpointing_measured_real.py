"""The checkpointing remedy measured by one agent-applied run (`alloctune run --checkpointing --record`,
the program's code unchanged) against the same programs with checkpointing written by hand.

Recorded on an H100 (torch 2.11): bench/train_programs.py bert / encoder / vit with the agent's switch
(tests/data/train_gpu/agentckpt_*: the recording and what the process measured itself). The hand-written
programs' min budgets were bisected in fresh processes (truth.json: `min_budget` passed, `fails_at`
failed) and their peaks measured by the processes themselves (*_ckpt.facts.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alloctune.sim.budget import min_budget
from alloctune.trace import load_trace

DATA = Path(__file__).parent / "data" / "train_gpu"


@pytest.mark.parametrize("model", ["bert", "encoder", "vit"])
def test_the_agent_applied_run_needs_what_the_hand_written_program_needs(model: str) -> None:
    agent = json.loads((DATA / f"agentckpt_{model}.facts.json").read_text())
    hand = json.loads((DATA / f"{model}_ckpt.facts.json").read_text())
    assert agent["checkpointing"] is False  # the program's own flag: off; the agent switched it on
    # the same memory as the program written with checkpointing: its peak allocated within 0.1 %
    assert abs(agent["peak_allocated"] - hand["peak_allocated"]) <= 0.001 * hand["peak_allocated"]
    truth = json.loads((DATA / "truth.json").read_text())["programs"][f"{model}_ckpt"]
    got = min_budget(load_trace(DATA / f"agentckpt_{model}.pickle.xz"), "").budget
    # within the real bisection's bracket (fails_at, min_budget], widened by 0.5 % for the cap's rounding
    assert got is not None and truth["fails_at"] * 0.995 < got <= truth["min_budget"] * 1.005
    assert abs(got - truth["min_budget"]) <= 0.02 * truth["min_budget"]
