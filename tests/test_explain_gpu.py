"""explain against facts a real CUDA process measured itself (bench/explain_workloads.py).

Runs the programs on the GPU (torch.nn + AdamW with a kept-logits leak and its clean twin, a
ConvNeXt keeping its feature maps and its twin, a transformers Llama `generate`), then checks
explain's model_state / optimizer_state / growing bytes against the measured facts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from alloctune.explain import explain

pytestmark = pytest.mark.gpu
SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "explain_workloads.py"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("explain_gpu")
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], check=True, timeout=600)
    return out


def _load(out: Path, name: str):
    return out / f"{name}.pickle", json.loads((out / f"{name}.facts.json").read_text())


def _last_event(path: Path) -> int:
    """The program's last allocation: after it the recording only holds the tear-down (the function
    that held the list returned before the snapshot was dumped, freeing the list)."""
    from alloctune.trace import load_trace
    from alloctune.trace.model import ALLOC

    req = load_trace(path).requests
    last = max(i for i, op in enumerate(req.ops) if op == ALLOC)
    return req.event_index[last]


def _close(a: int, b: int, rel: float) -> bool:
    return abs(a - b) <= rel * max(abs(b), 1)


@pytest.mark.parametrize("name", ["train_leak", "train_clean", "convnext_leak", "convnext_clean", "llama_generate"])
def test_categories_conserve_and_model_state_matches(recorded, name):
    path, facts = _load(recorded, name)
    ex = explain(path, what_if=False)
    assert sum(c.bytes for c in ex.categories) == ex.moment["reserved"]
    assert _close(ex.category("model_state"), facts["param_bytes"], 0.01)
    if facts["optimizer_bytes"]:
        assert _close(ex.category("optimizer_state"), facts["optimizer_bytes"], 0.01)


@pytest.mark.parametrize("leak,clean", [("train_leak", "train_clean"), ("convnext_leak", "convnext_clean")])
def test_the_kept_list_is_the_growing_site(recorded, leak, clean):
    path, facts = _load(recorded, leak)
    ex = explain(path, what_if=False)
    top = max(ex.sites, key=lambda s: s.growing_bytes)
    assert f"explain_workloads.py:{facts['kept_line']}" in top.site
    assert _close(top.bytes_per_repeat, facts["kept_bytes_per_step"], 0.02)
    # at the peak (in the last step, before or after that step's tensor joined the list) the site
    # holds what the list held after the last step or the one before it
    after = facts["kept_after_step"]
    assert any(_close(top.growing_bytes, held, 0.02) for held in after[-2:]), (top.growing_bytes, after[-2:])
    # at the program's last allocation: everything the list holds
    trace_end = explain(path, what_if=False, at=_last_event(path))
    end_top = max(trace_end.sites, key=lambda s: s.growing_bytes)
    assert _close(end_top.growing_bytes, facts["kept_bytes"], 0.02)
    assert not any(s.growing for s in explain(_load(recorded, clean)[0], what_if=False).sites)


@pytest.mark.parametrize("leak,clean", [("train_leak", "train_clean"), ("convnext_leak", "convnext_clean")])
def test_freeing_the_leak_matches_the_leak_free_run_and_against_names_it(recorded, leak, clean):
    from alloctune import api
    from alloctune.sim.sweep import sweep
    from alloctune.trace import load_trace

    path, facts = _load(recorded, leak)
    twin = _load(recorded, clean)[0]
    ex = explain(path)
    site = max(ex.sites, key=lambda s: s.growing_bytes)
    # the twin's min budget to the what-ifs' own resolution (0.2 % or 1 MiB), not the default 1 % or 16 MiB
    twin_min = sweep(load_trace(twin), [""], find_min=True, rel_tol=0.002, abs_tol=1 << 20).rows[0].min_budget
    assert site.min_budget_if_freed is not None and _close(site.min_budget_if_freed, twin_min, 0.02)
    cmp = api.explain(path, against=twin)
    assert sum(cmp.categories.values()) == cmp.gap
    best = max(cmp.sites, key=lambda s: s.delta)
    assert f"explain_workloads.py:{facts['kept_line']}" in best.site
