"""What a user copies from an 80-column terminal (#39): commands and code stay whole, names stay whole.

Every command runs as a user runs it (`python -m alloctune`, stdout a pipe, `COLUMNS=80`, `TERM=dumb`) on shipped
inputs. A line to paste (a command, a line of a snippet) is printed unbroken: the terminal may wrap it on screen, a
paste gives back the one line, so each must appear whole in ONE line of the output. The commands and names to look
for come from the same command's `--json`, never from the text under test.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import alloctune
from alloctune.cli.render import _HARD_BREAK
from cli_run import run_cli

REPO = Path(__file__).resolve().parents[1]
EXPLAIN_REC = "tests/data/explain_gpu/convnext_leak.pickle.xz"
ENV = {**{k: v for k, v in os.environ.items() if k != "LINES"}, "COLUMNS": "80", "TERM": "dumb",
       "PYTHONIOENCODING": "utf-8"}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "alloctune", *args], capture_output=True, text=True, cwd=REPO,
                          env=env or ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def _text_and_json(*args: str) -> tuple[str, dict]:
    return _cli(*args).stdout, json.loads(_cli(*args, "--json").stdout)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()]


def _in_one_line(text: str, wanted: str) -> bool:
    return any(wanted in line for line in text.splitlines())


def _assert_whole(text: str, *wanted: str) -> None:
    broken = [w for w in wanted if not _in_one_line(text, w)]
    assert not broken, broken


def _assert_commands_parse(text: str) -> None:
    """Every line that starts a command is one a shell reads (no quote cut off), and no command is left
    hanging at a line end (`... alloctune` / `... --` then the rest on the next line)."""
    starts = [line for line in _lines(text) if line.startswith(("alloctune ", "python"))]
    for line in starts:
        shlex.split(line)  # ValueError on a quote the wrap cut off
    hanging = [line for line in _lines(text)  # a shell comment after the command may end in anything
               if re.search(r"(^|\s)(alloctune|--)$", re.split(r"\s#\s", line)[0].rstrip())]
    assert not hanging, hanging


# -- demo ----------------------------------------------------------------------------------------------------------

def _snippet(text: str) -> str:
    """The code under the `python` heading of the recommendation: its indented lines, dedented."""
    lines = text.splitlines()
    start = lines.index("  python") + 1
    body = []
    for line in lines[start:]:
        if line.strip() and not line.startswith("    "):
            break
        body.append(line)
    return textwrap.dedent("\n".join(body)).strip("\n")


def test_demo_snippet_compiles_and_its_commands_are_whole():
    from alloctune.config.shells import env_assignments, render_all

    text, data = _text_and_json("demo", "--no-gpu")
    forms = render_all(env_assignments(data["recommended"]["conf"]))
    snippet = _snippet(text)
    compile(snippet, "<demo>", "exec")
    assert [line.rstrip() for line in snippet.splitlines()] == forms["python"].splitlines()  # no line wrapped
    _assert_whole(text, *(line for form in forms.values() for line in form.splitlines() if line.strip()))
    _assert_commands_parse(text)
    commands = [line for line in _lines(text) if line.startswith("alloctune ")]
    assert "alloctune tune --budget 5.5GiB -- python your_script.py" in commands
    for command in commands:  # each hint is a whole command of the CLI, on its own line
        words = shlex.split(command)
        assert words[1] in {"tune", "record", "demo"} and words[-1] not in {"--", "alloctune"}


# -- explain -------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def explained() -> tuple[str, dict]:
    return _text_and_json("explain", EXPLAIN_REC)


def test_explain_commands_and_remedy_code_stay_one_line(explained):
    text, data = explained
    assert data["what_if"] and data["remedies"]
    _assert_whole(text, *(line for w in data["what_if"] for line in w["command"].splitlines()))
    _assert_whole(text, *(r["how_to"] for r in data["remedies"]), *(r["confirm"] for r in data["remedies"] if r["confirm"]))
    _assert_commands_parse(text)


def test_explain_utilization_table_never_cuts_a_name(explained):
    text, data = explained
    rows = data["utilization"]["rows"]
    labels = [f"{r['kind']} {r['name']}" for r in rows]
    assert any(len(label) > 60 for label in labels)  # names that cannot sit beside their figures in 80 columns
    block = text.split("utilization (peak allocated")[1].splitlines()[2:]  # after the title and the header
    shown, figures = [], []
    for i, line in enumerate(block):
        if re.search(r"\d %  \S", line):  # a row's figures end in `util. %  method`
            figures.append(line)
            # the label beside its figures, or on the line above them when it does not fit there
            shown.append(block[i - 1].strip() if line.startswith("    ") else re.split(r"\s{2,}", line.strip())[0])
    assert sorted(shown) == sorted(labels)
    assert any(line.startswith("    ") for line in figures) and all(len(line.rstrip()) <= 80 for line in figures)
    for r in data["remedies"]:
        assert re.search(rf"^  {re.escape(r['name'])}: ", text, re.M), r["name"]


# -- diagnose ------------------------------------------------------------------------------------------------------

def _fix_lines(fixes: list[dict]) -> list[str]:
    """The lines a fix prints to copy (its shell forms, its Python code, the command that checks it), stripped."""
    lines = [line for f in fixes for form in (*f["shell"].values(), f["code"] or "") for line in form.splitlines()]
    return [line.strip() for line in lines + [f["command"] for f in fixes if f["command"]] if line.strip()]


# a fragmentation fix (shell forms and a Python snippet), a long line of code, a command that checks the fix
@pytest.mark.parametrize("entry", ["oom-001", "oom-012", "oom-015", "oom-058"])
def test_diagnose_fix_lines_are_whole(oom_corpus, tmp_path, entry):
    records = [json.loads(line) for line in oom_corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    log = tmp_path / f"{entry}.log"
    log.write_text(next(r["text"] for r in records if r["id"] == entry), encoding="utf-8")
    text, data = _text_and_json("diagnose", str(log))
    fixes = [f for f in data["diagnoses"][0]["fixes"] if f["works"]]
    wanted = _fix_lines(fixes)
    assert wanted and any(len(line) > 76 for line in wanted)  # lines that a wrap at 80 would break
    _assert_whole(text, *wanted)
    _assert_commands_parse(text)


def test_diagnose_log_summary_commands_parse(oom_corpus):
    text = _cli("diagnose", str(oom_corpus)).stdout
    assert "bash:" in text and "python:" in text
    _assert_commands_parse(text)


@pytest.mark.parametrize("name", ["convnext", "trainkeep"])
def test_diagnose_snapshot_confirm_and_next_steps_are_whole(name):
    text, data = _text_and_json("diagnose", "--snapshot", f"tests/data/cap_oom/{name}.pickle.xz")
    steps = [e for e in data["evidence"] if e.startswith("next: ")]
    assert data["confirm"] or steps
    if data["confirm"]:
        assert data["confirm"] in _lines(text)  # the command on a line of its own
    _assert_whole(text, *steps)
    _assert_commands_parse(text)


# -- plan ----------------------------------------------------------------------------------------------------------

def _whole_or_folded(name: str, text: str) -> bool:
    """`name` in one line, or folded only at a separator (`,` `:` ...), never inside a word."""
    if _in_one_line(text, name):
        return True
    tokens = text.split()
    return all(any(piece in t for t in tokens) for piece in _HARD_BREAK.split(name) if piece)


def test_plan_tables_keep_setting_names_and_the_calibration_command():
    rec = "tests/data/size_recordings/size_hubert_{}.pickle.xz:{}"
    confs = ["", "expandable_segments:True", "garbage_collection_threshold:0.6,max_split_size_mb:256"]
    args = [*(rec.format(s, s) for s in (8, 16, 24)), *(a for c in confs for a in ("-c", c)),
            "--card", "6GiB", "--budget", "3GiB", "--size", "20"]
    text, data = _text_and_json("plan", *args)
    tables = text.split("largest size that completes", 1)[1]
    assert "…" not in tables
    assert all(_whole_or_folded(c, tables) for c in confs[1:])
    assert data["fallible"].get("record")
    _assert_whole(text, data["fallible"]["record"])
    _assert_commands_parse(text)


# -- run and tune ------------------------------------------------------------------------------------------------

_RUN_SUMMARY = r'''
import json, sys
from alloctune.cli.run_view import render_trial
from alloctune.run.trial import TrialResult
render_trial(TrialResult.from_dict(json.loads(sys.argv[1])))
'''


def test_run_summary_next_command_is_whole(tmp_path):
    snap = tmp_path / "a folder with spaces" / "alloctune-oom-snapshot-of-a-long-running-job.pickle"
    trial = {"command": ["python", "infer.py"], "conf": "", "budget": 6 << 30, "outcome": "oom", "exit_code": 1,
             "wall_s": 1.0, "oom_snapshot": str(snap)}
    proc = subprocess.run([sys.executable, "-c", _RUN_SUMMARY, json.dumps(trial)], capture_output=True, text=True,
                          env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    command = f"alloctune diagnose --snapshot {shlex.quote(str(snap))}"
    assert command in _lines(proc.stderr)
    assert shlex.split(command)[-1] == str(snap)


# as in test_tune_cli: 600 MiB with expandable segments, 900 MiB under the default
WORK = """
import os, torch
torch.cuda.fake_alloc(400 << 20)
torch.cuda.fake_alloc(200 << 20)
if "expandable_segments:True" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
    torch.cuda.fake_alloc(300 << 20)
"""


def test_tune_next_steps_and_recommendation_lines_are_whole(tmp_path):
    from fake_torch import install

    install(tmp_path / "fake")
    (tmp_path / "w.py").write_text(WORK)
    src = str(Path(alloctune.__file__).resolve().parents[1])  # the alloctune under test
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), src]),
           "ALLOCTUNE_STATE_DIR": str(tmp_path / "live"), "HOME": str(tmp_path / "home")}

    def tune(budget: str, store: str, *extra: str) -> str:
        return _cli("tune", "--budget", budget, "--knobs", "expandable", "--store", str(tmp_path / store), *extra,
                    "--", sys.executable, str(tmp_path / "w.py"), env=env).stdout

    short = json.loads(tune("500MiB", "a.jsonl", "--json"))
    steps = short["shortfall"]["next_steps"]
    assert any("alloctune " in s for s in steps)
    text = tune("500MiB", "b.jsonl")
    _assert_whole(text, *(s.replace(f"{tmp_path}/a.d", f"{tmp_path}/b.d") for s in steps))  # each store its folder
    _assert_commands_parse(text)
    fits = json.loads(tune("800MiB", "c.jsonl", "--json"))["recommendation"]["lines"]
    assert fits
    text = tune("800MiB", "d.jsonl")
    _assert_whole(text, *(line for form in fits.values() for line in form.splitlines() if line.strip()))


# -- help ----------------------------------------------------------------------------------------------------------

def _commands(cmd, path=()):
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        if not sub.hidden:
            yield from _commands(sub, (*path, name))


def test_help_strings_have_no_hard_line_breaks():
    """rich keeps a single newline inside a help paragraph, so a sentence broken in the source is broken on
    screen at any width: each paragraph must be one line of source text."""
    from alloctune.cli import command

    broken = [(path, p[:60]) for path, cmd in _commands(command())
              for p in inspect.cleandoc(cmd.help or "").split("\n\n") if "\n" in p]
    assert not broken, broken


def test_help_at_80_columns_cuts_nothing(capsys, monkeypatch):
    from alloctune.cli import command

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("TERM", "dumb")
    for path, _ in _commands(command()):
        code, out, _ = run_cli(capsys, *path, "--help")
        assert code == 0, path
        assert "…" not in out, (path, [line for line in out.splitlines() if "…" in line])
        assert all(len(line) <= 80 for line in out.splitlines()), path
    code, out, _ = run_cli(capsys, "mcp", "--help")
    assert "pip install 'alloctune[mcp]'" in out  # `[mcp]` is not eaten as a markup tag
