"""One idea, one spelling across the commands: `--budget` (a per-process cap) and `--card` (a card's memory)
in every command that takes them, with the old `plan --cap` and `simulate --total-memory` kept as hidden
aliases; one set of platform names for `diagnose` and `config`; sizes read by the standards (`GB` decimal,
`GiB` binary); a `schema` in every JSON; utilization printed one way (`78.1 %`) in text, a fraction in JSON."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from alloctune.cli import command, main
from alloctune.units import GiB, MiB, format_percent, parse_user_size


def _run(capsys, *args):
    try:
        main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    else:
        code = 0
    out = capsys.readouterr()
    return code, out.out, out.err


def _options(name: str) -> dict[str, bool]:
    """{option name: hidden} of one command's options."""
    return {opt: bool(getattr(p, "hidden", False)) for p in command().commands[name].params for opt in p.opts}


# 1 and 2: --budget and --card everywhere; the old names stay usable but are not shown


@pytest.mark.parametrize("name", ["plan", "simulate", "demo", "diagnose", "run", "tune"])
def test_every_command_with_a_budget_calls_it_budget(name):
    opts = _options(name)
    assert opts.get("--budget") is False, opts
    assert "--cap" not in opts or opts["--cap"] is True


@pytest.mark.parametrize(("name", "old"), [("plan", "--cap"), ("simulate", "--total-memory")])
def test_old_spellings_are_hidden_aliases(name, old):
    assert _options(name)[old] is True


@pytest.mark.parametrize("name", ["plan", "simulate"])
def test_card_is_the_card_option(name):
    assert _options(name)["--card"] is False


@pytest.mark.parametrize(("name", "shown", "hidden"),
                         [("plan", "--budget", "--cap"), ("simulate", "--card", "--total-memory")])
def test_help_shows_the_new_name_only(capsys, name, shown, hidden):
    code, out, _ = _run(capsys, name, "--help")
    assert code == 0 and shown in out and hidden not in out


def test_plan_budget_and_cap_mean_the_same(monkeypatch, capsys):
    import alloctune.cli.plan_view as plan_view
    import alloctune.plan.service as service

    seen: list[list[int]] = []
    monkeypatch.setattr(service, "run", lambda inputs, **kw: seen.append(kw["caps"]))
    monkeypatch.setattr(plan_view, "render_report", lambda report, **kw: None)
    for option in ("--budget", "--cap", "-b"):
        assert _run(capsys, "plan", "a.pickle:1", "b.pickle:2", option, "3GiB,1.5GB", "--json")[0] == 0
    assert seen == [[3 * GiB, 1_500_000_000]] * 3
    _run(capsys, "plan", "a.pickle:1", "b.pickle:2", "--budget", "1GiB", "--cap", "2GiB", "--json")
    assert seen[-1] == [GiB, 2 * GiB]


@pytest.mark.parametrize("option", ["--budget", "--cap"])
def test_plan_budget_errors_name_the_option_typed(capsys, option):
    code, out, err = _run(capsys, "plan", "a.pickle:7", option, "4GiB,3")
    assert code == 2 and out == "" and f"{option} 3: give a unit" in err


@pytest.fixture(scope="module")
def rvc_trace(traces_dir):
    path = traces_dir / "rvc_ec0" / "default.pickle.xz"
    if not path.is_file():
        pytest.skip(f"shared trace {path} is absent")
    return str(path)


def test_simulate_card_and_total_memory_mean_the_same(rvc_trace, capsys):
    totals = []
    for option in ("--card", "--total-memory"):
        code, out, err = _run(capsys, "simulate", rvc_trace, option, "24GiB", "--json")
        assert code == 0, err
        totals.append(json.loads(out)["total_memory"])
    assert totals == [24 * GiB, 24 * GiB]


@pytest.mark.parametrize("option", ["--card", "--total-memory"])
def test_simulate_card_errors_name_the_option_typed(rvc_trace, capsys, option):
    code, out, err = _run(capsys, "simulate", rvc_trace, option, "0GiB")
    assert code == 2 and out == "" and f"{option} must be more than 0" in err


# 3: one set of platform names


def test_diagnose_and_config_accept_the_same_platforms():
    from alloctune.config.checks import PLATFORMS as config_platforms
    from alloctune.diagnose import PLATFORMS as diagnose_platforms

    assert tuple(diagnose_platforms) == tuple(config_platforms) == ("linux", "windows", "wsl", "macos")


@pytest.mark.parametrize("platform", ["linux", "windows", "wsl", "macos"])
def test_config_check_takes_every_platform(capsys, platform):
    code, out, err = _run(capsys, "config", "check", "expandable_segments:True", "--platform", platform, "--json")
    assert code == 0, err
    codes = [w["code"] for w in json.loads(out)["warnings"]]
    assert codes == {"windows": ["expandable-windows"], "macos": ["no-cuda-macos"]}.get(platform, [])


def test_wsl_is_checked_as_linux():
    from alloctune.config.checks import check

    for setting in ("expandable_segments:True", "garbage_collection_threshold:0.6", "backend:cudaMallocAsync"):
        assert check(setting, platform="wsl") == check(setting, platform="linux")


def test_macos_defaults_need_no_warning():
    from alloctune.config.checks import check

    assert check("", platform="macos") == []


def test_unknown_platform_lists_the_names(capsys):
    code, _, err = _run(capsys, "config", "check", "", "--platform", "beos")
    assert code == 2 and "linux, windows, wsl, macos" in err


# 4: decimal units are decimal, binary units binary


@pytest.mark.parametrize(("text", "expected"), [
    ("1.5GB", 1_500_000_000), ("1.5GiB", 3 * GiB // 2), ("512MB", 512_000_000), ("512MiB", 512 * MiB),
    ("1.5gb", 1_500_000_000), ("1.5G", 3 * GiB // 2),
])
def test_user_sizes_follow_the_standards(text, expected):
    assert parse_user_size(text, "--budget") == expected


def test_simulate_budget_in_gb_is_decimal(rvc_trace, capsys):
    budgets = {}
    for text in ("1.5GB", "1.5GiB"):
        code, out, err = _run(capsys, "simulate", rvc_trace, "--budget", text, "--json")
        assert code in (0, 1), err
        budgets[text] = json.loads(out)["budget"]
    assert budgets == {"1.5GB": 1_500_000_000, "1.5GiB": 3 * GiB // 2}


# 5: every JSON output names its schema


def test_demo_list_json_carries_a_schema(capsys):
    code, out, _ = _run(capsys, "demo", "--list", "--json")
    assert code == 0 and re.fullmatch(r"alloctune\.[a-z.-]+/[0-9]+", json.loads(out)["schema"])


# 6: utilization one way in text


def test_format_percent():
    assert [format_percent(x) for x in (0.781, 0.82, 1.0, 0.0, None)] == ["78.1 %", "82.0 %", "100.0 %", "0.0 %", "-"]


def test_simulate_text_and_json_show_utilization_one_way(rvc_trace, capsys):
    code, text, _ = _run(capsys, "simulate", rvc_trace)
    assert code == 0
    code, out, _ = _run(capsys, "simulate", rvc_trace, "--json")
    util = json.loads(out)["rows"][0]["utilization"]
    assert 0 < util <= 1 and format_percent(util) in text


def test_demo_text_shows_utilization_one_way(capsys):
    from alloctune.cli.demo_view import render_demo
    from alloctune.demo.core import run_demo

    result = run_demo(None)
    render_demo(result)
    out = capsys.readouterr().out
    assert all(format_percent(row.utilization) in out for row in result.rows)
    assert not any(f"{row.utilization:.0%}" in out for row in result.rows)  # never `78%`


def test_utilization_table_lines_use_percent():
    from alloctune.cli.views import utilization_lines
    from alloctune.explain.utilization import UtilizationRow, UtilizationTable

    rows = (UtilizationRow("recording", "as recorded", "", 2 * GiB, 4 * GiB, 3 * GiB, "simulated"),
            UtilizationRow("remedy", "no peak", "", None, None, None, "needs a confirming run"))
    lines = utilization_lines(UtilizationTable(rows))
    assert "util." in lines[0] and "75.0 %" in lines[1] and "0.750" not in lines[1]
    assert " - " in lines[2]


def test_run_view_shows_utilization_one_way(capsys):
    from alloctune.cli.run_view import render_trial
    from alloctune.run.trial import TrialResult

    render_trial(TrialResult(command=("python", "x.py"), conf="", budget=None, outcome="ok", exit_code=0, wall_s=1.0,
                             peak_reserved=4 * GiB, peak_allocated=3 * GiB))
    assert "75.0 % (peak allocated / peak reserved)" in capsys.readouterr().err


ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, columns: int = 200) -> "subprocess.CompletedProcess[str]":
    """`python -m alloctune ARGS` from the repository root, its text laid out at `columns`."""
    return subprocess.run([sys.executable, "-m", "alloctune", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "COLUMNS": str(columns)})


def test_plan_refuses_a_directory_of_several_programs_in_one_line(tmp_path):
    """`alloctune plan tests/data/size_recordings/ --budget 3GiB` (HuBERT, Llama and RVC recordings side by
    side) planned them as one program with five structures; it is refused, naming the programs."""
    p = _cli("plan", "tests/data/size_recordings/", "--budget", "3GiB")
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1
    assert "3 different programs" in p.stderr and "real_workloads.py hubert" in p.stderr


def test_a_plan_range_ending_at_the_search_ceiling_is_marked_as_a_lower_bound():
    """`plan` of the HuBERT recordings at 8, 16, 24 s under --budget 3GiB printed `256 * .. 384` where 384 is
    the top of the search (16x the largest recording): the optimistic end is shown as `≥ 384 ‡`."""
    rec = ROOT / "tests" / "data" / "size_recordings"
    base = ["plan", *[f"{rec}/size_hubert_{s}.pickle.xz:{s}" for s in (8, 16, 24)], "--budget", "3GiB"]
    item = json.loads(_cli(*base, "--json").stdout)["settings"][0]["largest"][0]
    text = _cli(*base, columns=120).stdout
    assert item["optimistic"] == "384" and "(search 1..384," in text
    assert f"{item['largest']} * .. ≥ 384 ‡" in text


def test_explain_text_names_the_step_that_writes_the_what_if_files_and_says_at_once():
    """Two of the issue's exact commands: `explain convnext_leak.pickle.xz` printed `alloctune simulate
    WHATIF_DIR/what_if_1.atrace` with no step that writes it, and `explain --at 2000` printed "at at"."""
    rec = str(ROOT / "tests" / "data" / "explain_gpu" / "convnext_leak.pickle.xz")
    out = _cli("explain", rec).stdout.splitlines()
    sim = next(i for i, line in enumerate(out) if "alloctune simulate WHATIF_DIR/what_if_1.atrace" in line)
    writes = next(i for i, line in enumerate(out) if "--what-if-dir WHATIF_DIR" in line)
    assert writes < sim and "writes WHATIF_DIR/what_if_1.atrace" in out[writes]
    at = _cli("explain", rec, "--at", "2000", "--no-what-if").stdout
    assert "moment at event 2000" in at and "at at" not in at
