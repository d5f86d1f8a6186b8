"""A newcomer's first hour (#39): each item the issue found, run with the exact command it names.

Items already pinned elsewhere with their exact command are listed here, not repeated:
- `explain convnext_leak.pickle.xz` names the step that writes WHATIF_DIR, `explain --at 2000` says "at" once:
  tests/test_vocabulary.py::test_explain_text_names_the_step_that_writes_the_what_if_files_and_says_at_once;
- `diagnose --all` lists a JSON error body once: tests/test_diagnose_echo.py::test_diagnose_all_lists_it_once;
- a text log given to explain/simulate/report: tests/test_trace_content.py::test_text_log_points_to_diagnose;
- `simulate rvc_h200`: tests/test_trace_content.py::test_simulate_rvc_h200_and_convert; `demo --trace rvc_ec1`:
  tests/test_demo.py::test_header_names_the_trace_as_it_can_be_passed_again;
- the spellings (`--budget`/`--cap`, `--card`/`--total-memory`, platforms, `1.5GB`, `demo --list --json`,
  utilization): tests/test_vocabulary.py, tests/test_one_parser.py; 80 columns: tests/test_80_columns.py;
  the docs' examples: tests/test_docs_run.py.
Every command a test here runs is the one a user types, through `python -m alloctune` (`_alloctune`), and
where a command prints another command as its reproduction, that command is run as printed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from alloctune.sim.resolution import step
from alloctune.units import MiB, parse_user_size

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
DOCS = ROOT / "docs" / "usage"
EXPLAIN = DATA / "explain_gpu"
SIZES = DATA / "size_recordings"
LLAMA = [f"{SIZES}/size_llama_{s}.pickle.xz:{s}" for s in (512, 1024, 2048, 3072, 4096, 6144)]
HUBERT = [f"{SIZES}/size_hubert_{s}.pickle.xz:{s}" for s in (8, 16, 24)]
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}  # torch sees no CUDA device: what a CPU-only newcomer has


def _alloctune(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None,
               columns: int = 200) -> subprocess.CompletedProcess[str]:
    """`alloctune ARGS` as a user types it (`python -m alloctune` of this venv), in `cwd`."""
    return subprocess.run([sys.executable, "-m", "alloctune", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "COLUMNS": str(columns), **(env or {})}, timeout=600)


def _printed(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a command line one of ours printed (`alloctune ...`, a shell comment allowed) exactly as printed."""
    words = shlex.split(command, comments=True)
    assert words[0] == "alloctune", command
    return _alloctune(*words[1:], cwd=cwd)


def _row(text: str, setting: str) -> list[str]:
    """The cells of a table row (cells are two or more spaces apart) whose first cell is `setting`."""
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] == setting:
            return cells
    raise AssertionError(f"no row {setting!r} in:\n{text}")


def _size(text: str) -> int:
    """`132.44 MiB` as bytes, to the printed precision."""
    return parse_user_size(text.replace(" ", ""), "size")


# ---- 1. a printed command reproduces the printed number ----------------------------------------------------------

@pytest.mark.parametrize("name", ["convnext_leak", "convnext_clean"])
def test_explain_prints_commands_that_reproduce_its_min_budgets(tmp_path, name):
    """`explain tests/data/explain_gpu/convnext_leak.pickle.xz --what-if-dir wi/` printed a what-if of 132.44 MiB
    and `alloctune simulate wi/what_if_1.atrace --min-budget`, which answered 136.00 MiB (while
    `--budget 132MiB` completes); same on convnext_clean. Now the printed command prints the printed number,
    `--budget 132MiB` completing is within the one resolution, and the recording's own min budget is
    `simulate RECORDING --min-budget`'s."""
    rec = f"{EXPLAIN}/{name}.pickle.xz"
    p = _alloctune("explain", rec, "--what-if-dir", "wi/", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    own = re.search(r"min budget of the recording as it ran: (\S+ \S+)", p.stdout)
    assert own
    assert _row(_alloctune("simulate", rec, "--min-budget").stdout, "(default)")[-1] == own.group(1)
    what_ifs = re.findall(r"what if: .*?: (\S+ [KMG]iB) \(saves", p.stdout)
    commands = [line.strip() for line in p.stdout.splitlines() if line.strip().startswith("alloctune simulate wi/")]
    assert len(what_ifs) == len(commands) == len(list(tmp_path.glob("wi/what_if_*.atrace")))
    if name == "convnext_leak":
        assert what_ifs[0] == "132.44 MiB" and commands[0] == "alloctune simulate wi/what_if_1.atrace --min-budget"
        done = _alloctune("simulate", "wi/what_if_1.atrace", "--budget", "132MiB", cwd=tmp_path)
        assert done.returncode == 0 and "out of memory" not in done.stdout
        assert 0 <= _size(what_ifs[0]) - 132 * MiB <= step(_size(what_ifs[0]))  # one answer at the resolution
    for number, command in zip(what_ifs, commands):
        sim = _printed(command, tmp_path)
        assert sim.returncode == 0, sim.stderr
        assert _row(sim.stdout, "(default)")[-1] == number


def test_demo_min_budgets_are_simulate_min_budgets():
    """The demo's table is `simulate --min-budget` of the trace it names in its header, setting for setting."""
    demo = json.loads(_alloctune("demo", "--json", env=NO_GPU).stdout)
    confs = [r["conf"] for r in demo["rows"]][:3]
    args = [a for c in confs for a in ("--conf", c)]
    sim = json.loads(_alloctune("simulate", demo["name"], *args, "--min-budget", "--json").stdout)
    assert [r["min_budget"] for r in sim["rows"]] == [r["min_budget"] for r in demo["rows"][:3]]


def test_diagnose_what_ifs_are_simulate_at_the_budget_its_confirm_command_names():
    """`diagnose SNAPSHOT` prints what-ifs and a command to confirm the best on the GPU; that command's budget is
    the recorded cap to the byte, and `simulate SNAPSHOT --budget` at it gives the what-ifs' peaks."""
    snap = f"{DATA}/cap_oom/convnext.pickle.xz"
    d = json.loads(_alloctune("diagnose", snap, "--json").stdout)
    text = _alloctune("diagnose", snap).stdout
    words = shlex.split(d["confirm"])
    assert d["confirm"] in text and parse_user_size(words[words.index("--budget") + 1], "--budget") == d["budget"]
    confs = [w["config"] for w in d["what_if"]][:2]
    sim = json.loads(_alloctune("simulate", snap, "--budget", f"{d['budget']}B",
                                *[a for c in confs for a in ("--conf", c)], "--json").stdout)
    assert [r["peak_reserved"] for r in sim["rows"]] == [w["peak_reserved"] for w in d["what_if"][:2]]
    assert [w["avoids_oom"] for w in d["what_if"][:2]] == [False, True]  # (default) fails, expandable serves it
    # the recorded failure fails again where diagnose says "fails", and is served where it says "serves"
    assert [r["expected_failures"] == 0 for r in sim["rows"]] == [w["avoids_oom"] for w in d["what_if"][:2]]


# ---- 3. the Llama min budget above the uncapped peak, the docs' claim and the exported stream ---------------------

@pytest.fixture(scope="module")
def llama_plan(tmp_path_factory) -> tuple[Path, str]:
    """`plan` on the Llama recordings under expandable segments at a prompt of 4600 tokens, its stream exported."""
    where = tmp_path_factory.mktemp("llama")
    p = _alloctune("plan", *LLAMA, "--conf", "expandable_segments:True", "--size", "4600",
                   "--export", "4600:llama_4600.atrace", cwd=where)
    assert p.returncode == 0, p.stderr
    return where, p.stdout


def test_llama_min_budget_above_the_uncapped_peak_is_said_and_explained(llama_plan):
    """The issue: plan showed a min budget above the run's uncapped peak (538.00 MiB), the exported stream under
    `--budget 538MiB` with expandable segments ran out of memory at request #716, while run-tune.md said a cap
    at or above peak reserved changes nothing. The simulator is right (PyTorch's `alloc_block` checks the cap
    against the request's whole rounded size even where an expandable segment has part of it mapped); plan says
    so in a note, and the docs claim it for the default setting only."""
    _, text = llama_plan
    row = _row(text, "expandable_segments:True")
    peak, need = _size(row[1]), _size(row[2])
    assert row[1] == "538.00 MiB" and need > peak
    flat = " ".join(text.split())
    assert (f"a min budget above the uncapped peak reserved is no error: expandable_segments:True at size 4600 "
            f"needs {row[2]}, its uncapped run reserves 538.00 MiB") in flat
    assert "checks a cap against a request's whole rounded size" in flat
    doc = " ".join((DOCS / "run-tune.md").read_text(encoding="utf-8").split())
    assert "(a cap at or above a run's peak reserved memory changes nothing the allocator does)" not in doc
    assert ("under the default setting a cap at or above a run's peak reserved memory changes nothing the "
            "allocator does; not so under `expandable_segments:True`") in doc


def test_llama_exported_stream_reproduces_plan_and_fails_at_the_uncapped_peak(llama_plan):
    """The command plan prints for its exported stream answers plan's min budgets; at the uncapped peak
    (`--budget 538MiB`) that stream runs out of memory at request #716, as the issue saw, and at the min budget
    it completes; under the default setting a cap at its uncapped peak changes nothing."""
    where, text = llama_plan
    (command,) = [line.strip() for line in text.splitlines() if line.strip().startswith("alloctune simulate ")]
    assert command == "alloctune simulate llama_4600.atrace --conf expandable_segments:True --min-budget"
    sim = _printed(command, where)
    assert sim.returncode == 0, sim.stderr
    need = _row(text, "expandable_segments:True")[2]
    assert _row(sim.stdout, "expandable_segments:True")[-1] == need
    assert "min budget lies above its uncapped peak reserved" in " ".join(sim.stdout.split())
    capped = _alloctune("simulate", "llama_4600.atrace", "--conf", "expandable_segments:True", "--budget", "538MiB",
                        cwd=where)
    assert capped.returncode == 1 and "out of memory at request #716" in capped.stdout
    exact = json.loads(_printed(command + " --json", where).stdout)["rows"][0]["min_budget"]
    at_need = _alloctune("simulate", "llama_4600.atrace", "--conf", "expandable_segments:True",
                         "--budget", f"{exact}B", cwd=where)
    assert at_need.returncode == 0, at_need.stdout
    default = _alloctune("simulate", "llama_4600.atrace", "--min-budget", cwd=where)
    cells = _row(default.stdout, "(default)")
    assert _size(cells[-1]) <= _size(cells[1])  # the default's min budget is never above its uncapped peak
    peak = _alloctune("simulate", "llama_4600.atrace", "--budget", cells[1].replace(" ", ""), cwd=where)
    assert peak.returncode == 0 and _row(peak.stdout, "(default)")[:5] == cells[:5]  # the cap changes nothing


# ---- 4. plan's range and its calibration hint ---------------------------------------------------------------------

def test_plan_cap_marks_the_search_ceiling_and_its_hint_runs_as_typed():
    """`plan ... --cap 3GiB` printed `256 * .. 384` (384 the search ceiling, unmarked) and the hint
    `alloctune run --budget 3221225472B ... -- bench/real_workloads.py hubert ...` (no `python`, raw bytes)."""
    p = _alloctune("plan", *HUBERT, "--cap", "3GiB")
    assert p.returncode == 0, p.stderr
    assert _row(p.stdout, "cap 3.00 GiB")[1] == "256 * .. ≥ 384 ‡"
    (hint,) = [line for line in p.stdout.splitlines() if "alloctune run " in line]
    assert "alloctune run --budget 3GiB --record calibration-384.pickle.xz -- python bench/real_workloads.py hubert" in hint
    assert "3221225472" not in p.stdout


# ---- 8. demo without a GPU, demo's hint ----------------------------------------------------------------------------

def test_demo_gpu_without_a_gpu_exits_2_and_shows_no_simulation():
    """`demo --gpu` without a GPU exited 0 after printing the simulation."""
    p = _alloctune("demo", "--gpu", env=NO_GPU)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("alloctune: error: --gpu: no CUDA GPU") and p.stderr.count("\n") == 1


def test_demo_budget_hint_follows_the_budget():
    """`demo --budget 1.6GiB` ended with a hint for 5.5 GiB."""
    p = _alloctune("demo", "--budget", "1.6GiB", env=NO_GPU, columns=80)
    assert p.returncode == 0, p.stderr
    lines = [line.strip() for line in p.stdout.splitlines()]
    assert "alloctune tune --budget 1.6GiB -- python your_script.py" in lines and "5.5GiB" not in p.stdout


# ---- 9. one vocabulary: the unset setting, sizes ------------------------------------------------------------------

def test_the_unset_setting_has_one_name_in_simulate_plan_and_demo():
    """`(default)` / `(unset)` / `default (sim)`: simulate, plan and demo name it `(default)`."""
    texts = [_alloctune("simulate", f"{EXPLAIN}/convnext_clean.pickle.xz").stdout,
             _alloctune("plan", *HUBERT, "--budget", "3GiB").stdout,
             _alloctune("demo", env=NO_GPU).stdout]
    for text in texts:
        assert "(default)" in text and "(unset)" not in text and "default (sim)" not in text


def test_report_of_a_simulation_speaks_the_same_vocabulary(tmp_path):
    sim = _alloctune("simulate", f"{EXPLAIN}/convnext_clean.pickle.xz", "--json").stdout
    (tmp_path / "sim.json").write_text(sim, encoding="utf-8")
    p = _alloctune("report", "sim.json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    util = json.loads(sim)["rows"][0]["utilization"]
    assert "default (sim)" not in p.stdout and f"{util * 100:.1f} %" in p.stdout


def test_sizes_are_spelled_one_way():
    """`1024.00 MiB` / `1048576 B (1024.00 KiB)` / `446 MiB`: a size the demo measured is `format_size`'s
    spelling (`324.00 MiB`, not `324 MiB`)."""
    demo = " ".join(_alloctune("demo", env=NO_GPU).stdout.split())
    assert re.search(r"larger than every segment this run ever made \(\d+\.\d\d [KMG]iB\)", demo)


# ---- 11. the docs say what the commands do ------------------------------------------------------------------------

def _doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def test_every_file_the_docs_link_to_exists():
    """scale.md pointed to a HANDOFF file that does not exist: every relative link resolves."""
    missing = []
    for doc in _doc_files():
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (doc.parent / target.split("#")[0]).exists():
                missing.append(f"{doc.name}: {target}")
    assert not missing, missing
    assert "HANDOFF" not in (DOCS / "scale.md").read_text(encoding="utf-8")


def test_simulate_doc_release_range_is_what_simulate_accepts():
    """simulate.md's release range disagreed with what is accepted."""
    from alloctune.config.versions import NEWEST, OLDEST

    doc = (DOCS / "simulate.md").read_text(encoding="utf-8")
    m = re.search(r"\| `--torch V` \| rules of torch release V \((\d+\.\d+) … (\d+\.\d+)", doc)
    assert m and (m.group(1), m.group(2)) == (f"{OLDEST[0]}.{OLDEST[1]}", f"{NEWEST[0]}.{NEWEST[1]}")
    rec = f"{EXPLAIN}/convnext_clean.pickle.xz"
    for version in m.groups():
        assert _alloctune("simulate", rec, "--torch", version).returncode == 0
    beyond = _alloctune("simulate", rec, "--torch", f"{NEWEST[0]}.{NEWEST[1] + 1}")
    assert beyond.returncode == 2 and f"torch {m.group(1)} to {m.group(2)}" in beyond.stderr


def test_report_of_simulations_writes_what_monitor_report_md_says(tmp_path):
    """monitor-report.md promised a `timeline.png` that `report sim.json` does not write: the doc says a
    report of simulations alone has none, and every figure it writes is one the doc names."""
    sim = _alloctune("simulate", f"{EXPLAIN}/convnext_clean.pickle.xz", "--conf", "", "--conf",
                     "expandable_segments:True", "--min-budget", "--json").stdout
    (tmp_path / "sim.json").write_text(sim, encoding="utf-8")
    p = _alloctune("report", "sim.json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    written = {f.stem for f in (tmp_path / "alloctune-report").iterdir() if f.suffix in (".png", ".svg")}
    doc = " ".join((DOCS / "monitor-report.md").read_text(encoding="utf-8").split())
    named = set(re.findall(r"\* `([a-z_]+)\.png`", doc))
    assert written and written <= named and "timeline" not in written
    assert "a report of simulations alone has none" in doc


# ---- 12. progress with counts -------------------------------------------------------------------------------------

def _terminal(monkeypatch):
    import io

    from rich.console import Console

    import alloctune.cli.render as render

    buf = io.StringIO()
    monkeypatch.setattr(render, "err_console", Console(file=buf, force_terminal=True, width=120, color_system=None))
    return buf


def test_plan_with_two_cards_counts_its_steps(monkeypatch, capsys):
    """`plan` with two cards showed step names only: each step now carries its count, at a terminal."""
    from alloctune.plan.service import run

    seen: list[tuple[str, int, int | None]] = []
    run(HUBERT, cards=[4 << 30, 8 << 30], curve=["8", "16"], progress=lambda s, d=0, t=None: seen.append((s, d, t)))
    counted = [(d, t) for _, d, t in seen if t is not None]
    assert counted == [(k, 4) for k in range(5)]  # 2 cards + 2 sizes of the curve, one setting, then done
    from cli_run import run_cli

    drawn = _terminal(monkeypatch)
    code, out, _ = run_cli(capsys, "plan", *HUBERT, "--card", "4GiB,8GiB")
    assert code == 0 and re.search(r"done .* (\d+)/\1\b", drawn.getvalue()), drawn.getvalue()
    assert "largest size on" not in out


def test_report_shows_progress_at_a_terminal(monkeypatch, capsys, tmp_path):
    """`report` showed nothing for seconds: its steps are drawn at a terminal, never on stdout."""
    from cli_run import run_cli

    drawn = _terminal(monkeypatch)
    code, out, err = run_cli(capsys, "report", f"{EXPLAIN}/convnext_clean.pickle.xz", "--no-explain",
                             "--out", str(tmp_path / "r"))
    assert code == 0, err
    assert re.search(r"done .* 2/2\b", drawn.getvalue()) and "reading 1 input(s)" not in out


def test_explain_counts_its_remedy_steps():
    """explain sat at "simulating remedies 2/3" for most of its time: the remedy groups and the utilization
    table are counted steps of their own, in order, and every group's remedies are the same as without them."""
    from alloctune.explain import explain
    from alloctune.remedy.registry import REMEDY_GROUPS

    seen: list[tuple[str, int, int | None]] = []
    path = f"{EXPLAIN}/train_leak.pickle.xz"
    ex = explain(path, progress=lambda s, d=0, t=None: seen.append((s, d, t)))
    steps = [(s, d, t) for s, d, t in seen if s.startswith("simulating remedies")]
    names = [f"simulating remedies: {g}" for g in REMEDY_GROUPS] + ["simulating remedies: the utilization table"]
    assert steps == [(n, k, len(names)) for k, n in enumerate(names)]
    assert [s for s, _, _ in seen][-1] == "done"
    assert [r.name for r in ex.remedies] == [r.name for r in explain(path).remedies]
