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
    # the peak is in the last repetition, when the list holds what it holds at the end
    assert _close(top.growing_bytes, facts["kept_bytes"], 0.02)
    assert not any(s.growing for s in explain(_load(recorded, clean)[0], what_if=False).sites)
