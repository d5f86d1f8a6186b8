"""One OOM quoted twice in one record is one OOM: `diagnose --all` lists a JSON error body that carries
its message under both error and warnings once, not "seen 2x". Repeats on their own lines are separate
OOMs, and every reader (one pass, the stream, parallel chunks) agrees."""

from __future__ import annotations

import json

import pytest

from alloctune.diagnose import diagnose_all, find_reports
from alloctune.diagnose.groups import summarise
from alloctune.diagnose.parallel import summarise_parallel
from alloctune.diagnose.scan import scan_reports
from cli_run import run_cli


@pytest.fixture(scope="module")
def json_body(oom_corpus) -> str:
    """The corpus entry whose message a server's JSON error body carries twice (error + warnings)."""
    for line in oom_corpus.read_text(encoding="utf-8").splitlines():
        text = json.loads(line)["text"]
        if '"warnings":["CUDA out of memory' in text and "inference error: CUDA out of memory" in text:
            return text
    pytest.skip("no JSON error body with a repeated message in the corpus")


def test_json_error_body_counts_one_oom(json_body):
    assert len(find_reports(json_body)) == 1
    (d,) = diagnose_all(json_body)
    assert d.occurrences == 1


def test_diagnose_all_lists_it_once(capsys, json_body, tmp_path):
    log = tmp_path / "server.log"
    log.write_text(json_body, encoding="utf-8")
    code, out, err = run_cli(capsys, "diagnose", "--all", "--json", str(log))
    assert code == 0, err
    lines = [json.loads(x) for x in out.splitlines() if x.strip()]
    messages = [x for x in lines if x["schema"] == "alloctune.diagnose-message/1"]
    summary = lines[-1]
    assert len(messages) == 1 and summary["messages"] == 1 and summary["groups"][0]["count"] == 1
    code, out, _ = run_cli(capsys, "diagnose", "--all", str(log))
    assert code == 0 and "seen 2x" not in out and out.count("line 3: FRAGMENTATION") == 1


def test_repeats_on_other_lines_still_count(json_body):
    twice = json_body + "\n" + json_body
    assert len(find_reports(twice)) == 2
    assert diagnose_all(twice)[0].occurrences == 2


def test_same_text_in_one_line_of_a_long_log_agrees_across_readers(json_body):
    """One pass, the stream reader and the parallel chunks see the same (stateless) rule."""
    body = json_body.replace("\n", " ")
    log = "\n".join(f"step {i} ok" if i % 7 else body for i in range(4000)) + "\n"
    expected = sum(1 for i in range(4000) if i % 7 == 0)
    assert len(find_reports(log)) == expected
    one = summarise(scan_reports([log[i:i + 5000] for i in range(0, len(log), 5000)]), None)
    par = summarise_parallel([log], None, n=2, size=1 << 16, small=1 << 15, first=1 << 14)
    assert one.to_dict()["messages"] == par.to_dict()["messages"] == expected
