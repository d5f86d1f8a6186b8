"""bench/record_workloads.py on the CPU: the runner, its parsing and its result files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "record_workloads.py"


def _bench():
    spec = importlib.util.spec_from_file_location("record_workloads", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_parse_output_finds_summary_and_record_json():
    bench = _bench()
    stdout = 'noise\n{"workload":"llm","items":2}\n{\n  "schema": 1,\n  "out": "x.pickle.xz"\n}\n'
    summary, record = bench.parse_output(stdout)
    assert summary == {"workload": "llm", "items": 2}
    assert record == {"schema": 1, "out": "x.pickle.xz"}
    assert bench.parse_output("no json here") == (None, None)


def test_child_env_sets_only_the_requested_setting(monkeypatch):
    bench = _bench()
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "garbage_collection_threshold:0.5")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
    env = bench.child_env("expandable_segments:True")
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True" and "PYTORCH_ALLOC_CONF" not in env
    assert "PYTORCH_CUDA_ALLOC_CONF" not in bench.child_env("")


@pytest.mark.slow  # two fresh interpreters running the tiny train workload
def test_runs_tiny_workloads_and_writes_results(tmp_path):
    bench = _bench()
    code = bench.main(["--out", str(tmp_path), "--tiny", "--device", "cpu", "--no-record",
                       "--workloads", "train", "--confs", "default,max_split_128"])
    assert code == 0
    data = json.loads((tmp_path / "workloads_results.json").read_text())
    assert data["schema"] == 1
    rows = data["rows"]
    assert [(r["workload"], r["conf"], r["rc"]) for r in rows] == [("train", "default", 0), ("train", "max_split_128", 0)]
    assert all(r["summary"]["outcome"] == "ok" and r["summary"]["items"] == 3 for r in rows)
    md = (tmp_path / "workloads_results.md").read_text()
    assert "| train | default | ok | 3 |" in md and "| train | max_split_128 | ok | 3 |" in md
