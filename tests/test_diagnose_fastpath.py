"""Issue 30, item 4: a long log's groups are built from `verdict_only` (the verdict's branches
without their text) and the full diagnosis only for the messages shown. These tests hold the
fast path to the full one: the same verdict, shortfall and first working fix for every message
of the shared corpus, for generated variants of each (every figure varied, so every branch is
reached), on every platform; and the same groups, worst cases and fixes for a whole log."""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter

import pytest

from alloctune.diagnose import PLATFORMS, find_reports
from alloctune.diagnose.groups import summarise
from alloctune.diagnose.report import BYTE_FIELDS
from alloctune.diagnose.scan import scan_reports
from alloctune.diagnose.groups import _demand
from alloctune.diagnose.verdict import FirstFix, Verdict, diagnose_report, verdict_only
from alloctune.units import GiB, MiB

from test_diagnose_stream import varied_log


def corpus_reports(path) -> list:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            out += find_reports(json.loads(line)["text"])
    return out


def full_verdict(r, platform) -> Verdict:
    d = diagnose_report(r, platform)
    return Verdict(d.verdict, d.shortfall, next((f for f in d.fixes if f.works), None))


def variants(r, rnd: random.Random, n: int) -> list:
    """`r` with every figure it prints drawn again (small, large, equal to another), processes too."""
    out = []
    scales = (MiB, 100 * MiB, GiB, 20 * GiB)
    for _ in range(n):
        new = {}
        for name in BYTE_FIELDS:
            if getattr(r, name) is not None:
                new[name] = rnd.choice((0, rnd.randrange(1, 4 * scales[rnd.randrange(4)]), getattr(r, name)))
        if r.requested is not None and rnd.random() < 0.2:
            new["requested"] = rnd.choice(list(new.values()) or [1])  # ties: the rounding rules
        if r.other_processes:
            new["other_processes"] = tuple((pid, rnd.randrange(1, 30 * GiB)) for pid, _ in r.other_processes)
        out.append(dataclasses.replace(r, **new))
    return out


def test_verdict_only_equals_the_full_diagnosis_on_every_message_and_variant(oom_corpus):
    reports = corpus_reports(oom_corpus)
    assert len(reports) >= 90
    rnd = random.Random(30)
    seen: Counter = Counter()
    checked = probed = 0
    for r in reports:
        for v in [r, *variants(r, rnd, 40)]:
            for platform in (None, *PLATFORMS):
                got, want = verdict_only(v, platform), full_verdict(v, platform)
                assert got == want, (v.raw[:120], platform)
                if isinstance(got.top, FirstFix):  # the probe said what the fix it stands for says
                    built = got.top.build()
                    assert (got.top.id, got.top.demand, built.works) == (built.id, _demand(built), True)
                    probed += 1
                seen[want.verdict] += 1
                checked += 1
    assert checked > 20_000
    assert probed > checked // 2  # most first fixes come from probes
    assert set(seen) == {"fragmentation", "cap", "contention", "shortage", "unknown"}  # every branch reached


@pytest.mark.parametrize("platform", [None, "windows"])
def test_groups_from_verdicts_equal_groups_from_full_diagnoses(oom_corpus, platform):
    text = varied_log(oom_corpus, 1200, seed=11)
    found = list(scan_reports([text[i:i + 70_000] for i in range(0, len(text), 70_000)], platform))
    every: list = []
    lite = summarise(iter(found), platform)
    full = summarise(iter(found), platform, on_message=lambda f, d: every.append(d))  # the full path
    assert len(every) == lite.messages == len(found)
    assert len(lite.groups) > 10
    assert lite.to_dict() == full.to_dict()
    # and against the diagnoses themselves: each group's count and worst case
    by_key = Counter((d.verdict, d.report.device, f.rank) for f, d in zip(found, every))
    for g in lite.groups:
        members = [(f, d) for f, d in zip(found, every)
                   if (d.verdict, d.report.device, f.rank) == (g.verdict, g.device, g.rank)
                   and (g.requests is None) == (d.report.requested is None)
                   and (g.requests is None or g.requests[0] <= d.report.requested < g.requests[1])]
        assert len(members) == g.count
        worst = max(members, key=lambda fd: ((fd[1].shortfall or 0), (fd[1].report.requested or 0)))
        assert g.worst.to_dict() == worst[1].to_dict()
    assert sum(by_key.values()) == sum(g.count for g in lite.groups)


# ---- the templates stop where the grammar stops ------------------------------------------------------------

def test_templates_equal_the_grammar_on_a_log_with_other_lines_between(oom_corpus):
    """Lines after a message that begin like a clause, or almost (a first word shared with one, an
    escape, an entity, a wrapped clause): the template must leave every one to the grammar that
    the grammar would read on into, and may keep the others."""
    from alloctune.diagnose.fast import _CLAUSE_STARTS
    from alloctune.diagnose.find import BIG_TEXT, ReportFinder

    rnd = random.Random(3)
    starts = [lit for lit, _ in _CLAUSE_STARTS if lit] + ["GPU 3 has a total capacity of 8.00 GiB", "12.00 GiB free",
                                                           "XPU 1 has", "NPU"]
    nexts = ["INFO [rank1] step 3 loss=0.5", "Iteration 4", "Ofsted", "Proc 12", "with care", "and then", "(note)",
             "Seeing", "Tried", "Free memory", "Requested by", "&nbsp;Process 12 has 1.00 GiB memory in use.",
             "\\nIncluding non-PyTorch memory", "<br>Of the allocated memory 1.00 GiB is allocated by PyTorch",
             "2026-01-01 12:00:00 INFO done", "   ", "", "Traceback (most recent call last):"]
    lines = []
    forms = [r.raw for r in corpus_reports(oom_corpus) if "\n" not in r.raw and r.requested is not None]
    for k in range(1500):
        lines.append(f"[rank{k % 4}] " + rnd.choice(forms))
        lit = rnd.choice(starts)
        cut = rnd.choice((lit, lit[: rnd.randrange(1, len(lit) + 1)], lit[:3] + "x" + lit[4:], rnd.choice(nexts)))
        lines.append(rnd.choice(("", "[rank0]: ", "2026-01-01 12:00:00 ", "  ")) + cut)
    text = "\n".join(lines) + "\n"
    big = len(text) > BIG_TEXT
    fast = ReportFinder()
    got = list(fast.scan(text, 0, len(text), big=big))
    want = list(ReportFinder(fast=False).scan(text, 0, len(text), big=big))
    assert got == want
    assert len(got) >= 1500


def test_the_mixed_bench_log_reads_through_templates_as_through_the_grammar(tmp_path, oom_corpus):
    import importlib.util
    import sys
    from pathlib import Path

    from alloctune.diagnose.find import ReportFinder

    bench = Path(__file__).resolve().parents[1] / "bench" / "diagnose_speed.py"
    spec = importlib.util.spec_from_file_location("diagnose_speed_bench", bench)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    path = tmp_path / "mixed.txt"
    n = mod.write_log(path, 1_500_000, mod.message_forms(), mixed=True, seed=4)
    text = path.read_text(encoding="utf-8")
    fast = ReportFinder()
    got = list(fast.scan(text, 0, len(text), big=True))
    assert got == list(ReportFinder(fast=False).scan(text, 0, len(text), big=True))
    assert len(got) == n
    assert fast.fast.count < 100  # a shape is learnt once, not once per message
