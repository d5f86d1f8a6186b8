"""Verdicts and advice that agree with their own numbers, and partial pastes still diagnosed (#18.8-12)."""

from __future__ import annotations

import json

import pytest

from alloctune.diagnose import diagnose
from alloctune.diagnose.text import decode_log
from alloctune.units import GiB, MiB

OLD = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 3.79 GiB total capacity; "
       "654.97 MiB already allocated; 6.00 MiB free; 666.00 MiB reserved in total by PyTorch)")


# 8 -- a capped GC run whose live tensors + request fit in the budget is fragmentation
def test_snapshot_verdict_follows_its_own_figures(traces_dir):
    from alloctune.diagnose.snapshot import diagnose_snapshot

    d = diagnose_snapshot(traces_dir / "rvc_ec1" / "gc07_split256_cap115a.pickle.xz",
                          candidates=("expandable_segments:True",))
    assert d.allocated + d.request < d.budget  # 1.08 GiB + 322.58 MiB < 1.60 GiB
    assert d.verdict == "fragmentation" and "live tensors themselves did not fit" not in d.summary
    assert d.recommendation == "expandable_segments:True"


def test_snapshot_shortage_by_numbers_when_live_tensors_exceed_the_budget(traces_dir):
    from alloctune.diagnose.snapshot import diagnose_snapshot

    path = traces_dir / "rvc_ec1" / "gc07_split256_cap115a.pickle.xz"
    probe = diagnose_snapshot(path, candidates=None)
    tight = diagnose_snapshot(path, candidates=None, budget=probe.allocated + probe.request // 2)
    assert tight.verdict == "shortage" and "more than the" in tight.summary and tight.needs == probe.allocated + probe.request


# 9 -- the MPS advice never repeats the default it assumes
@pytest.mark.parametrize("text", [
    "RuntimeError: MPS backend out of memory (MPS allocated: 8.89 GB, other allocations: 172.98 MB, max allowed: "
    "9.07 GB). Tried to allocate 6.25 MB on private pool.",
    "MPS backend out of memory (MPS allocated: 9.57 GiB, other allocations: 17.35 GiB, max allowed: 27.20 GiB). "
    "Tried to allocate 292.50 MiB on private pool.",
])
def test_mps_ratio_is_above_the_default(text):
    d = diagnose(text)
    w = next(f for f in d.fixes if f.id == "mps_high_watermark")
    ratio = dict(w.extra)["ratio"]
    assert ratio > 1.7 and "1.70" not in w.title


# 10 -- an evidence line never calls a figure small when it is over the threshold it names
def test_device_free_above_the_margin_is_not_called_small():
    text = ("CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total capacity of 7.75 GiB of which 1.17 GiB "
            "is free. Including non-PyTorch memory, this process has 5.02 GiB memory in use. Of the allocated memory "
            "4.81 GiB is allocated by PyTorch, and 18.97 MiB is reserved by PyTorch but unallocated.")
    d = diagnose(text)
    assert not any("is small" in e for e in d.evidence)
    line = next(e for e in d.evidence if e.startswith("device free 1.17 GiB exceeds"))
    assert "by only 10.24 MiB" in line
    assert "effectively full" in d.reason and "device effectively full" in d.contributing


# 12 -- partial pastes
def test_parenthesised_figures_without_the_first_line():
    d = diagnose("(GPU 0; 3.79 GiB total capacity; 654.97 MiB already allocated; 6.00 MiB free; "
                 "666.00 MiB reserved in total by PyTorch)")
    assert d.verdict == "unknown" and "first line" in d.reason
    assert "at most 17.03 MiB" in d.reason  # cached 11.03 MiB + free 6.00 MiB
    assert d.fixes[0].id == "capture_full_message" and "alloctune run" in d.fixes[0].code


def test_a_lone_parenthesis_is_not_a_message():
    from alloctune.errors import NoOOMFound

    with pytest.raises(NoOOMFound):
        diagnose("see (GPU 0; 3.79 GiB total capacity) in the spec")


def test_comfyui_cut_line_says_what_to_run():
    d = diagnose("torch.OutOfMemoryError: Allocation on device")
    assert d.verdict == "unknown"
    assert d.fixes[0].id == "capture_full_message" and "alloctune diagnose" in d.fixes[0].code


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-8-sig"])
def test_powershell_logs_are_read(encoding):
    data = ("PS C:\\> python infer.py\r\n" + OLD + "\r\n").encode(encoding)
    assert "Tried to allocate 20.00 MiB" in decode_log(data)
    assert diagnose(data).report.requested == 20 * MiB


def test_cli_reads_a_utf16_log(tmp_path):
    from typer.testing import CliRunner

    from alloctune.cli import app

    log = tmp_path / "log.txt"
    log.write_bytes(("\ufeff" + OLD).encode("utf-16-le"))
    res = CliRunner().invoke(app, ["diagnose", str(log), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    (only,) = data["diagnoses"] if isinstance(data, dict) else data  # list today; the cli branch wraps it
    assert only["report"]["requested"] == 20 * MiB


