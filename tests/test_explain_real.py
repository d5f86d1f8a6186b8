"""#27 must-show, on real recordings of real library code (H200, torch 2.11, Python stacks on):
`tests/data/explain_gpu/` holds what bench/explain_workloads.py recorded, the facts each recording
process measured itself (parameter/buffer and AdamW state storages, what the kept list holds), and the
real min budgets of each program by k-ary search on the GPU (bench/real_min_budget.py). explain is
checked against those facts, never against its own output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alloctune import api
from alloctune.trace import load_snapshot

DATA = Path(__file__).parent / "data" / "explain_gpu"
PROGRAMS = ("train_leak", "train_clean", "convnext_leak", "convnext_clean", "llama_generate")


def facts(name):
    return json.loads((DATA / f"{name}.facts.json").read_text())


def real_min_budget(name):
    return json.loads((DATA / "real_min_budgets.json").read_text())["programs"][name]["min_budget"]


@pytest.fixture(scope="module")
def explained():
    return {name: api.explain(DATA / f"{name}.pickle.xz") for name in PROGRAMS}


def _recorded_reserved(name, event):
    """Reserved bytes after history event `event`, from the recording's own segment events."""
    events = load_snapshot(DATA / f"{name}.pickle.xz")["device_traces"][0]
    level = 0
    for e in events[: event + 1]:
        if e["action"] in ("segment_alloc", "segment_map"):
            level += e["size"]
        elif e["action"] in ("segment_free", "segment_unmap"):
            level -= e["size"]
    return level


@pytest.mark.parametrize("name", PROGRAMS)
def test_categories_sum_to_the_recorded_reserved_memory(explained, name):
    ex = explained[name]
    assert sum(c.bytes for c in ex.categories) == ex.reserved == _recorded_reserved(name, ex.moment["event"])


@pytest.mark.parametrize("name", PROGRAMS)
def test_model_state_is_the_parameter_and_buffer_storages(explained, name):
    assert explained[name].category("model_state") == pytest.approx(facts(name)["param_bytes"], rel=0.01)


@pytest.mark.parametrize("name", ["train_leak", "train_clean"])
def test_optimizer_state_is_adamws_state_storages(explained, name):
    assert explained[name].category("optimizer_state") == pytest.approx(facts(name)["optimizer_bytes"], rel=0.01)


@pytest.mark.parametrize("name", ["train_leak", "convnext_leak"])
def test_the_kept_results_leak_is_found_at_its_line(explained, name):
    f = facts(name)
    ex = explained[name]
    top = max(ex.sites, key=lambda s: s.growing_bytes)
    assert top.growing and top.site.split(" ")[0].endswith(f".py:{f['kept_line']}"), top
    assert top.bytes_per_repeat == pytest.approx(f["kept_bytes_per_step"], rel=0.02)
    # at the peak the list holds every step's tensor but the current step's, or all of them
    per, steps = f["kept_bytes_per_step"], f["steps"]
    assert (steps - 1) * per * 0.98 <= top.growing_bytes <= steps * per * 1.02
    assert ex.category("growing") == top.growing_bytes


@pytest.mark.parametrize("name", ["train_clean", "convnext_clean"])
def test_no_growing_site_without_the_leak(explained, name):
    assert not any(s.growing for s in explained[name].sites) and explained[name].category("growing") == 0


@pytest.mark.parametrize("leak,clean", [("train_leak", "train_clean"), ("convnext_leak", "convnext_clean")])
def test_freeing_the_leak_gives_the_real_min_budget_of_the_program_without_it(explained, leak, clean):
    ex = explained[leak]
    top = max(ex.sites, key=lambda s: s.growing_bytes)
    assert top.min_budget_if_freed == pytest.approx(real_min_budget(clean), rel=0.02)
    assert ex.min_budget == pytest.approx(real_min_budget(leak), rel=0.02)


@pytest.mark.parametrize("leak,clean", [("train_leak", "train_clean"), ("convnext_leak", "convnext_clean")])
def test_against_the_leak_free_run_the_gap_splits_exactly(leak, clean):
    cmp = api.explain(DATA / f"{leak}.pickle.xz", against=DATA / f"{clean}.pickle.xz")
    assert sum(cmp.categories.values()) == cmp.gap == cmp.this.reserved - cmp.other.reserved
    assert sum(s.delta for s in cmp.sites) + sum(b for _, b in cmp.other_only) + sum(
        cmp.categories[k] for k in ("cached_free", "inactive_split", "rounding")) == cmp.gap
    best = max(cmp.sites, key=lambda s: s.delta or 0)
    assert best.site.split(" ")[0].endswith(f".py:{facts(leak)['kept_line']}")


@pytest.mark.parametrize("name", ["train_leak", "convnext_leak"])
def test_at_the_last_allocation_the_growing_bytes_are_what_the_list_holds(name):
    """After the program's last allocation only its tear-down is left (the function that held the list
    returned before the dump): there the list held every step's tensor, as the process measured."""
    from alloctune.trace import load_trace
    from alloctune.trace.model import ALLOC

    path = DATA / f"{name}.pickle.xz"
    req = load_trace(path).requests
    last = max(i for i, op in enumerate(req.ops) if op == ALLOC)
    ex = api.explain(path, what_if=False, at=req.event_index[last])
    top = max(ex.sites, key=lambda s: s.growing_bytes)
    assert top.growing_bytes == pytest.approx(facts(name)["kept_bytes"], rel=0.02)
