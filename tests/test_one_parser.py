"""One vocabulary, checked across every command (issue #39): each memory-size option goes through the
one size parser (the same one-line error for the same bad value, the same bytes for the same good
one), and each command's --json carries a `schema`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
DET = str(DATA / "remedies_gpu" / "det.pickle.xz")
SNAP = str(DATA / "cap_oom" / "convnext.pickle.xz")
HUBERT = [f"{DATA}/size_recordings/size_hubert_{s}.pickle.xz:{s}" for s in (8, 16, 24)]

# every option that takes a memory size, with the rest of a command line it is valid in
SIZE_OPTIONS = [
    (["simulate", DET], "--budget"), (["simulate", DET], "--card"), (["plan", *HUBERT], "--budget"),
    (["plan", *HUBERT], "--card"), (["plan", *HUBERT], "--context"), (["demo"], "--budget"),
    (["diagnose", "--snapshot", SNAP], "--budget"), (["config", "check", "expandable_segments:True"], "--card"),
    (["run"], "--budget"), (["tune"], "--budget"),
]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "alloctune", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


@pytest.mark.parametrize("head,option", SIZE_OPTIONS, ids=[f"{h[0]} {o}" for h, o in SIZE_OPTIONS])
def test_every_size_option_goes_through_the_one_parser(head: list[str], option: str) -> None:
    tail = ["--", sys.executable, "-c", "pass"] if head[0] in ("run", "tune") else []
    p = _cli(*head, option, "12XB", *tail)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip() == ("alloctune: error: unknown unit 'XB' in size '12XB': use bytes, KiB, MiB, GiB or TiB "
                                "(or the decimal kB, MB, GB, TB)")


@pytest.mark.parametrize("args", [
    ["simulate", DET, "--budget", "2.5GB"],
    ["plan", *HUBERT, "--budget", "2.5GB", "--max-size", "24"],
    ["explain", DET, "--no-what-if"],
    ["diagnose", "--snapshot", SNAP],
    ["demo"], ["demo", "--list"],
    ["config", "check", "expandable_segments:True"],
    ["trace", "info", DET],
], ids=lambda a: " ".join(x for x in a[:2] if not x.startswith("/")))
def test_every_json_output_carries_a_schema(args: list[str]) -> None:
    p = _cli(*args, "--json")
    assert p.returncode in (0, 1), p.stderr
    data = json.loads(p.stdout)
    assert isinstance(data, dict) and str(data.get("schema", "")).startswith("alloctune."), sorted(data)


def test_a_decimal_budget_is_decimal_in_every_command_that_echoes_it() -> None:
    sim = json.loads(_cli("simulate", DET, "--budget", "2.5GB", "--json").stdout)
    plan = json.loads(_cli("plan", *HUBERT, "--budget", "2.5GB", "--max-size", "24", "--json").stdout)
    assert sim["budget"] == 2_500_000_000
    assert plan["settings"][0]["largest"][0]["bytes"] == 2_500_000_000
