"""The 98 real OOM messages: every one is found, every printed figure lands in a byte field,
and `alloctune diagnose --json` gives each a verdict."""

from __future__ import annotations

import json
import re
from collections import Counter
from decimal import Decimal

import pytest
from typer.testing import CliRunner

from alloctune.cli import app
from alloctune.diagnose import VERDICTS, diagnose_all, find_reports

# Independent of the parser: any "<number> <unit>" inside the matched message text.
FIGURE = re.compile(r"(\d+(?:\.\d+)?)\s*(bytes|KiB|MiB|GiB|TiB|KB|MB|GB)(?![A-Za-z])")
UNIT = {"bytes": 1, "KiB": 2**10, "KB": 2**10, "MiB": 2**20, "MB": 2**20, "GiB": 2**30, "GB": 2**30, "TiB": 2**40}


def _entries(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _close(figure: tuple[str, str], value: int) -> bool:
    num, unit = figure
    exact = Decimal(num) * UNIT[unit]
    decimals = len(num.split(".")[1]) if "." in num else 0
    slack = Decimal(UNIT[unit]) / (2 * 10**decimals) if unit != "bytes" else Decimal(0)
    return abs(Decimal(value) - exact) <= slack + 1


def test_corpus_every_message_found_and_every_figure_extracted(oom_corpus):
    entries = _entries(oom_corpus)
    assert len(entries) == 98
    problems = []
    for e in entries:
        reports = find_reports(e["text"])
        if not reports:
            problems.append(f"{e['id']}: no report")
            continue
        for r in reports:
            assert e["text"][r.span[0]:r.span[1]] == r.raw
            values = list(r.figures().values())
            for fig in FIGURE.findall(r.text):
                if not any(_close(fig, v) for v in values):
                    problems.append(f"{e['id']}: figure {' '.join(fig)} not among {r.figures()}")
    assert problems == []


def test_corpus_figures_cover_the_visible_message(oom_corpus):
    """The checker above only sees what the parser matched; make sure the match is not cut short:
    every figure that follows the head on the same normalised line run is inside the match."""
    missed = []
    for e in _entries(oom_corpus):
        for r in find_reports(e["text"]):
            after = e["text"][r.span[1]:r.span[1] + 200]
            # figures directly continuing the message (same sentence structure) would show up as ';' or ','
            # separated "<n> <unit> <label>" right after the match
            if re.match(r"[;,]\s*\d+(?:\.\d+)?\s*(?:bytes|[KMG]iB)", after):
                missed.append((e["id"], after[:60]))
    assert missed == []


def test_corpus_diagnosis_verdicts(oom_corpus):
    counts = Counter()
    for e in _entries(oom_corpus):
        for d in diagnose_all(e["text"]):
            assert d.verdict in VERDICTS
            assert d.reason
            if d.verdict != "unknown":
                assert d.evidence, e["id"]
            counts[d.verdict] += 1
    # every verdict occurs in real messages; fragmentation is the largest class (the allocator's
    # own hint appears in most of them)
    assert set(counts) == set(VERDICTS)
    assert counts.most_common(1)[0][0] == "fragmentation"


@pytest.mark.parametrize("chunk", range(4))
def test_cli_json_gives_a_verdict_for_each(oom_corpus, tmp_path, chunk):
    runner = CliRunner()
    entries = _entries(oom_corpus)[chunk::4]
    for e in entries:
        path = tmp_path / f"{e['id']}.log"
        path.write_text(e["text"], encoding="utf-8")
        res = runner.invoke(app, ["diagnose", str(path), "--json"])
        assert res.exit_code == 0, (e["id"], res.output)
        data = json.loads(res.output)["diagnoses"]
        assert isinstance(data, list) and data
        for d in data:
            assert d["schema"] == "alloctune.diagnosis/1"
            assert d["verdict"] in VERDICTS
            for f in d["fixes"]:
                if f["env"]:
                    assert set(f["shell"]) == {"bash", "powershell", "cmd", "python"}
