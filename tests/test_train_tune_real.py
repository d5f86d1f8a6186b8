"""`alloctune tune` of training programs where no allocator setting fits, run on an H100 (job
`train-confirm` of bench/gpu.py, tests/data/train_gpu/tune_*.json): the BERT fine-tune under 6 GiB and
the loop that keeps every step's logits on the GPU under 7.9 GiB (bench/train_programs.py).

Checked against the runs themselves and the program's source, not against tune's own summary: at most
3 runs; the first remedy named is activation checkpointing, and a run with it switched on completed under
the same budget on the GPU; for the leaking loop the line named is the line of bench/train_programs.py
that appends to the kept list."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "train_gpu"


def _tune(name: str) -> dict:
    return json.loads((DATA / f"tune_{name}.json").read_text())


def test_no_setting_fits_and_the_first_remedy_named_ran_to_completion_under_the_budget() -> None:
    for name in ("bert6", "leak"):
        d = _tune(name)
        trials = d["trials"]
        assert len(trials) <= 3 and d["recommendation"]["conf"] is None
        capped = [t for t in trials if t["budget"] == d["budget"]]
        assert any(t["outcome"] == "oom" and not t.get("checkpointing") for t in capped)  # the setting alone fails
        first = d["shortfall"]["next_steps"][0]
        assert first.startswith("activation checkpointing") and "measured" in first
        ran = [t for t in capped if t.get("checkpointing")]
        assert ran and ran[0]["outcome"] == "ok" and ran[0]["peak_reserved"] <= d["budget"]


def test_the_leaking_loop_is_named_by_its_line() -> None:
    steps = _tune("leak")["shortfall"]["next_steps"]
    named = [s for s in steps if "growing site" in s]
    assert len(named) == 1
    line = int(re.search(r"train_programs\.py:(\d+)", named[0]).group(1))
    source = (ROOT / "bench" / "train_programs.py").read_text().splitlines()[line - 1]
    assert "kept.append(" in source  # the program's own leak: every step's logits kept on the GPU
    per_step = int(re.search(r"\+(\d+) bytes a repetition", named[0]).group(1))
    assert per_step == 32 * (1 << 18) * 4  # the micro-batch of 32 rows x 2^18 float32 the loop keeps
