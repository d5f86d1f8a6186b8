"""The built-in demo runs from the package alone (no ../shared, no GPU) and tells the truth
about the shipped trace: folklore max_split values are no-ops, and the recommendation beats
the default."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from alloctune.demo import FOLKLORE_CANDIDATES, run_demo, shipped_traces
from alloctune.config.standard import STANDARD_CONFS


@pytest.fixture(scope="module")
def result():
    return run_demo()


def test_ships_a_trace():
    assert "rvc_h200_ec1.atrace" in shipped_traces()


def test_every_candidate_simulated(result):
    assert [r.conf for r in result.rows][0] == ""
    assert len(result.rows) == len(STANDARD_CONFS)
    assert len(result.folklore) == len(FOLKLORE_CANDIDATES)
    for row in result.rows + result.folklore:
        assert row.peak_reserved >= row.peak_allocated > 0
        assert row.min_budget is not None and row.min_budget <= row.peak_reserved


def test_folklore_values_change_nothing(result):
    default = result.rows[0]
    for row in result.folklore:
        assert (row.peak_reserved, row.min_budget, row.smallest_card_gib) == (
            default.peak_reserved,
            default.min_budget,
            default.smallest_card_gib,
        )
    assert any("nothing changes" in n for n in result.notes)


def test_recommendation_beats_default(result):
    default = result.rows[0]
    best = result.recommended
    assert best.conf != ""
    assert best.min_budget < 0.9 * default.min_budget
    # nothing else is clearly better than the recommendation (ties within the bisection resolution)
    for row in result.rows:
        assert row.min_budget >= best.min_budget - max(16 << 20, best.min_budget // 100)


def test_cli_json(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "alloctune", "demo", "--no-gpu", "--json", "--budget", "1.6GiB"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["schema"] == "alloctune.demo/1"
    fits = {r["conf"]: r["fits_budget"] for r in data["rows"]}
    assert fits[""] is False  # the default needs ~1.79 GiB
    assert fits["expandable_segments:True"] is True
