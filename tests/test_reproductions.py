"""What a command prints as its reproduction reproduces its number (#39): one min-budget resolution
for every command (`sim.resolution`), so explain's what-if and `simulate --min-budget` of the file
it writes answer the same bytes (they differed by 3.56 MiB when explain bisected to 0.2 % and
simulate to 1 % / 16 MiB)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alloctune.cli import app

DATA = Path(__file__).parent / "data" / "explain_gpu"


@pytest.mark.parametrize("name", ["convnext_leak", "llama_generate", "train_leak"])
def test_a_what_if_and_simulate_of_its_file_print_one_min_budget(tmp_path, name):
    runner = CliRunner()
    out = runner.invoke(app, ["explain", str(DATA / f"{name}.pickle.xz"), "--what-if-dir", str(tmp_path), "--json"])
    assert out.exit_code == 0, out.output
    what_ifs = [w for w in json.loads(out.stdout)["what_if"] if w.get("min_budget")]
    assert what_ifs, "the recording has a what-if with a min budget"
    for k, w in enumerate(what_ifs[:2], 1):
        path = tmp_path / f"what_if_{k}.atrace"
        assert path.exists()
        sim = runner.invoke(app, ["simulate", str(path), "--min-budget", "--json"])
        assert sim.exit_code == 0, sim.output
        rows = json.loads(sim.stdout)["rows"]
        assert rows[0]["min_budget"] == w["min_budget"]
