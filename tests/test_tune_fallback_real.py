"""The budget where a recommendation needs no fallback, against real runs on an H100.

`alloctune tune --budget 740MiB` of a HuBERT encoder (tests/data/tune_fallback, bench/gpu.py tune-sharp)
recommended expandable_segments:True, whose completing run at 648 MiB survived 83 OOMs that cuDNN caught
and answered with smaller workspaces. The fallback-free budget tune states is the recording replayed as
it was made; real runs of the same command under that setting say whether torch counted any OOM there
(none) and just below it (40 at 0.98x and at 0.95x).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from alloctune.run.trial import TrialResult
from alloctune.tune.recommend import caught_fallbacks
from alloctune.tune.simulator import SimulatorFromTrace

DATA = Path(__file__).parent / "data" / "tune_fallback"
FACTS = json.loads((DATA / "hubert_tune.json").read_text())
CONF = "expandable_segments:True"


def _as_recorded() -> int:
    base = FACTS["trials"][0]
    trial = TrialResult(command=tuple(FACTS["command"]), conf="", budget=None, outcome=base["outcome"], exit_code=0,
                        wall_s=base["wall_s"], total_memory=FACTS["total_memory"], torch_version="2.11.0+cu130",
                        snapshot=str(DATA / "hubert_baseline.pickle.xz"))
    need = SimulatorFromTrace(trial).estimates([CONF])[CONF]
    assert need is not None
    return need


def test_the_stated_fallback_free_budget_is_where_real_runs_stop_catching_ooms():
    need = _as_recorded()
    runs = {r["budget"]: r for r in FACTS["fallback_free_runs"]}
    at = runs[need]  # the GPU ran at the budget tune states
    assert at["outcome"] == "ok" and at["num_ooms"] == 0
    below = [r for b, r in runs.items() if b < need]
    assert below and all(r["outcome"] == "ok" and r["num_ooms"] > 0 for r in below)
    nearest = max(r["budget"] for r in below)
    assert (need - nearest) / need <= 0.0201  # the edge lies within 2 % below the stated budget


def test_the_recommendation_states_it_from_the_runs_tune_made():
    """tune's own trials (the recording, the failure at 636 MiB, the pass at 648 MiB with 83 OOMs caught)
    and the recommended setting's as-recorded need: the recommendation says how many OOMs were caught and
    gives the fallback-free budget, simulated, above the user's budget here."""
    need = _as_recorded()
    trials = [SimpleNamespace(result=SimpleNamespace(conf=t["conf"], passed=t["outcome"] == "ok", budget=t["budget"],
                                                     num_ooms=t["num_ooms"])) for t in FACTS["trials"]]
    result = SimpleNamespace(trials=trials, budget=FACTS["budget"])
    best = SimpleNamespace(candidate=SimpleNamespace(conf=CONF), sim_as_recorded=need)
    fb = caught_fallbacks(result, best)  # type: ignore[arg-type]
    assert fb == {"ooms_caught": 83, "run_budget": 679477248, "fallback_free_budget": need,
                  "fallback_free_method": "simulated"}
    assert need > FACTS["budget"]  # no budget the user allowed avoids the fallbacks
