"""bench/results.py builds one results file from the bench outputs (#18.7): figures come from the JSON."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _mod():
    spec = importlib.util.spec_from_file_location("bench_results", ROOT / "bench" / "results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_results_file_is_built_from_the_bench_json(tmp_path):
    fig = {"exact": 7, "rows": 9, "uncapped_exact": 5, "uncapped": 6, "capped_first_failure": 2, "capped": 3,
           "uncapped_peak_reserved": 6, "uncapped_peak_allocated": 6, "with_allocated": 6}
    summary = {"replay": fig, "prediction from one recording": fig, "prediction with modelled addresses": fig,
               "min_budget": {"agree": 4, "rows": 5},
               "measured_min_budget": {"overlap": 1, "rows": 2, "ratio_min": 0.99, "ratio_max": 1.07}}
    (tmp_path / "fidelity_x.json").write_text(json.dumps(
        {"schema": "alloctune.bench.fidelity/2", "command": "python bench/fidelity.py --flat x", "summary": summary,
         "rows": [], "traces": "`x`", "generated": "now"}))
    (tmp_path / "fidelity_x.md").write_text("table")
    (tmp_path / "other.json").write_text(json.dumps({"schema": "someone.else/1"}))
    assert _mod().main(["--dir", str(tmp_path)]) == 0
    text = (tmp_path / "RESULTS.md").read_text()
    assert "**7/9 exact**" in text and "**5/6 exact**" in text and "**2/3**" in text
    assert "**4/5 agree**" in text and "overlap in **1/2**" in text and "0.990–1.070" in text
    assert "[fidelity_x.md](fidelity_x.md)" in text and "python bench/fidelity.py --flat x" in text
    assert "someone.else" not in text


def test_runlog_appends_one_line_per_result_with_the_exact_command(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_runlog", ROOT / "bench" / "runlog.py")
    runlog = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runlog)
    monkeypatch.delenv("BENCH_LOG", raising=False)
    monkeypatch.setenv("ALLOCTUNE_NATIVE", "0")
    argv = [str(ROOT / "bench" / "sim_speed.py"), "--out", "/tmp/a b.md"]
    runlog.log_results(["- replay **3/3 exact**", "", "- min budget 2/2 agree"], argv=argv, folder=tmp_path)
    lines = (tmp_path / "LOG.md").read_text().splitlines()
    results = [line for line in lines if line.startswith("- ")]
    assert len(results) == 2
    assert " · sim_speed · replay 3/3 exact · " in results[0]
    assert results[0].endswith("`ALLOCTUNE_NATIVE=0 python bench/sim_speed.py --out '/tmp/a b.md'`")
