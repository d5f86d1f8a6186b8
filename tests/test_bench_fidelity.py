"""bench/fidelity.py reports three separate fidelity figures and says what it compared (#18.1, #18.4)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_fidelity", ROOT / "bench" / "fidelity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_three_figures_with_what_was_compared(traces_dir, tmp_path):
    bench = _bench()
    out = tmp_path / "fidelity.md"
    rc = bench.main(["--traces", str(traces_dir), "--workloads", "rvc_ec1",
                     "--runs", "default,max_split_128,default_cap85", "--out", str(out)])
    text = out.read_text()
    data = json.loads(out.with_suffix(".json").read_text())
    assert rc == 0 and data["summary"]["replay"]["rows"] == 3
    for figure in ("**replay**", "**prediction from one recording**", "**prediction with modelled addresses**"):
        assert figure in text
    rows = {r["run"]: r for r in data["rows"]}
    default_source = str(traces_dir / "rvc_ec1" / "default.pickle.xz")
    # a prediction uses nothing of the run it predicts: default's stream and default's addresses
    pred = rows["max_split_128"]["prediction from one recording"]
    assert pred["addresses"] == f"recorded:{default_source}"
    assert rows["max_split_128"]["replay"]["addresses"].endswith("max_split_128.pickle.xz")
    assert rows["max_split_128"]["prediction with modelled addresses"]["addresses"] == "model"
    assert rows["default"]["prediction from one recording"] is None  # default is the recording itself
    # the sidecar's stats were really compared, and the table says so
    assert {"allocated_bytes.all.peak", "num_alloc_retries", "segment.all.peak"} <= set(pred["compared_stats"])
    assert "| sidecar |" in text
    # a capped run that failed is predicted by where it fails first, not by its reaction to the failure
    capped = rows["default_cap85"]["prediction from one recording"]
    assert capped["judged_by"] == "first failure"
    assert capped["first_failure"]["recorded"] is not None


def test_without_sidecar_stats_the_table_says_events_only(tmp_path):
    bench = _bench()
    out = tmp_path / "fidelity.md"
    assert bench.main(["--shipped", "--workloads", "diffusion", "--runs", "default,expandable", "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    row = next(r for r in data["rows"] if r["run"] == "expandable")
    assert row["sidecar_stats"] is False
    assert set(row["replay"]["compared_stats"]) == {"reserved_bytes.all.peak", "num_ooms"}
    assert "| events only |" in out.read_text()


def test_flat_folder_and_gpu_measured_min_budget(traces_dir, tmp_path):
    """#18.5: recordings laid out flat (as bench/gpu-results/batch8/a) are scored, and the simulated min budget
    is set beside one bisected on the GPU."""
    bench = _bench()
    flat = tmp_path / "a"
    flat.mkdir()
    for run in ("default", "max_split_128"):
        for suffix in (".pickle.xz", ".json"):
            (flat / f"rvc_{run}{suffix}").symlink_to(traces_dir / "rvc_ec1" / f"{run}{suffix}")
    assert set(bench.flat_groups(flat)["rvc"]) == {"default", "max_split_128"}
    measured = tmp_path / "bisect.json"
    measured.write_text(json.dumps([
        {"name": "rvc_default", "conf": "", "min_budget": 2 << 30, "fails_at": 1 << 30},  # wide: must overlap
        {"name": "rvc_max_split_128", "conf": "max_split_size_mb:128", "min_budget": 1 << 20, "fails_at": 1 << 19},
    ]))
    out = tmp_path / "f.md"
    assert bench.main(["--flat", str(flat), "--measured", str(measured), "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    rows = {r["run"]: r for r in data["rows"]}
    assert rows["default"]["measured_min_budget"]["overlap"] is True
    assert rows["max_split_128"]["measured_min_budget"]["overlap"] is False  # 1 MiB cannot be right
    assert data["summary"]["measured_min_budget"]["rows"] == 2
    assert "min budget against the GPU" in out.read_text()
