"""Every command's tables at `COLUMNS=80` with stdout piped (#18.15): no line wider than 80, no `…`,
and every word, number and setting name of the cells appears whole (a value may only be folded
at a separator such as `,` or `:`, never inside a name or a number).

All commands run in one subprocess (stdout is a pipe, as with `| cat`) to keep this cheap.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from alloctune.cli.render import _HARD_BREAK

MSG = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacity of 6.00 GiB "
       "of which 0 bytes is free. Of the allocated memory 2.93 GiB is allocated by PyTorch, and 2.30 GiB is reserved by "
       "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
LONG = "garbage_collection_threshold:0.6,max_split_size_mb:256,expandable_segments:True"
CHECK = "max_split_size_mb:128,garbage_collection_threshold:0.6,roundup_power2_divisions:[256:1,512:2,>:8]"

_DRIVER = r'''
import json, sys
from alloctune.cli import main

for name, argv in json.loads(sys.argv[1]):
    print(f"@@@ {name}", flush=True)
    if name == "run-summary":  # the `run` summary without a GPU: render a finished trial
        from alloctune.cli.run_cmd import render_trial
        from alloctune.run.trial import TrialResult
        render_trial(TrialResult.from_dict(json.loads(argv[0])))
        continue
    try:
        main(argv)
    except SystemExit as exc:
        print(f"@@@ exit {exc.code}", flush=True)
'''


def _words(*texts: str) -> set[str]:
    return {w for t in texts for w in str(t).split()}


def _whole(word: str, tokens: list[str]) -> bool:
    if any(word in t for t in tokens):
        return True
    pieces = [p for p in _HARD_BREAK.split(word) if p]  # folded only at separators
    return len(pieces) > 1 and all(any(p in t for t in tokens) for p in pieces)


@pytest.fixture(scope="module")
def rendered(traces_dir, tmp_path_factory):
    from alloctune.sim.simulate import simulate

    tmp = tmp_path_factory.mktemp("tables80")
    log = tmp / "oom.log"
    log.write_text(MSG, encoding="utf-8")
    rvc = str(traces_dir / "rvc_ec1" / "default.pickle.xz")
    sim = simulate(rvc, ["", LONG], budget="1GiB")
    (tmp / "sim.json").write_text(json.dumps(sim.to_dict()))
    trial = {"command": ["python", "infer.py"], "conf": LONG, "budget": 6 << 30, "outcome": "oom", "exit_code": 1,
             "wall_s": 12.5, "peak_reserved": 5 << 30, "peak_allocated": 4 << 30, "num_alloc_retries": 3,
             "num_ooms": 1, "device_name": "NVIDIA H200", "total_memory": 150109880320, "torch_version": "2.11.0",
             "oom_message": MSG}
    commands = [
        ("knobs", ["config", "knobs"]),
        ("check", ["config", "check", CHECK]),
        ("simulate", ["simulate", rvc, "-c", "", "-c", LONG, "--budget", "1GiB"]),
        ("trace-info", ["trace", "info", rvc]),
        ("diagnose", ["diagnose", str(log)]),
        ("snapshot", ["diagnose", "--snapshot", str(traces_dir / "llm" / "default_cap85.pickle.xz"), "--no-what-if"]),
        ("report", ["report", str(tmp / "sim.json"), "-o", str(tmp / "report")]),
        ("demo-list", ["demo", "--list"]),
        ("run-summary", [json.dumps(trial)]),
    ]
    env = dict(os.environ, COLUMNS="80", PYTHONIOENCODING="utf-8")
    env.pop("LINES", None)
    proc = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(commands)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    sections: dict[str, str] = {}
    for chunk in proc.stdout.split("@@@ ")[1:]:
        name, _, body = chunk.partition("\n")
        sections[name.strip()] = body
    sections["run-summary"] += proc.stderr  # the run summary goes to stderr (stdout is the command's)
    return sections, sim, trial


def _check(text: str, words: set[str]) -> None:
    lines = text.splitlines()
    too_wide = [line for line in lines if len(line.rstrip()) > 80]
    assert not too_wide, too_wide[:3]
    assert "…" not in text
    tokens = text.split()
    cut = sorted(w for w in words if not _whole(w, tokens))
    assert not cut, cut[:10]


def test_config_knobs(rendered):
    from alloctune.config.knobs import knobs_for

    words = set()
    for k in knobs_for(None):
        words |= _words(k.name, *k.aliases, k.default, k.versions(), k.honoured_by, k.meaning)
    _check(rendered[0]["knobs"], words)


def test_config_check(rendered):
    from alloctune.config.effective import check_setting

    r = check_setting(CHECK)
    # the table and the warnings; the lines to copy into a shell are printed unbroken on purpose
    text = "effective values" + rendered[0]["check"].split("effective values")[1].split("set it (")[0]
    _check(text, set(r.effective) | _words(*(w.message for w in r.warnings)) | {"128", "MiB", "512MiB–1GiB:"})


def test_simulate(rendered):
    from alloctune.units import format_size

    sections, sim, _ = rendered
    words = _words(LONG.replace(",", " "), "(default)")
    for r in sim.rows:
        words |= _words(format_size(r.peak_reserved), format_size(r.peak_allocated))
    _check(sections["simulate"].split("budget:")[0], words)  # the table; the OOM text below is prose


def test_trace_info(rendered):
    from alloctune.trace import load_trace
    from alloctune.trace.summary import summarize

    sections, sim, _ = rendered
    s = summarize(load_trace(sim.trace))
    words = _words("requests streams peak requested (live) segment events OOM inferred empty_cache() device total")
    words |= {f"{k}={v!r}" for k, v in s.allocator_settings.items() if not isinstance(v, dict)}
    _check(sections["trace-info"], words)


def test_diagnose_log(rendered):
    from alloctune.diagnose import diagnose

    d = diagnose(MSG)
    # the panel, the evidence table and the first fix's prose; shell lines are printed unbroken on purpose
    text = rendered[0]["diagnose"].split("   bash:")[0]
    _check(text, _words(*d.evidence, d.verdict.upper(), d.working_fixes[0].title, d.working_fixes[0].why))


def test_diagnose_snapshot(rendered, traces_dir):
    from alloctune.diagnose.service import explain_snapshot
    from alloctune.report.tables import diagnosis_cells

    d = explain_snapshot(traces_dir / "llm" / "default_cap85.pickle.xz", what_if=False)
    _check(rendered[0]["snapshot"], _words(*(f"{k} {v}" for k, v in diagnosis_cells(d))))


def test_report(rendered):
    from alloctune.report.tables import settings_cells

    sections, sim, _ = rendered
    data = json.loads(json.dumps(sim.to_dict()))
    assert data["rows"]
    text = sections["report"]
    assert "Settings" in text
    words = _words(LONG.replace(",", " "), "simulation", "peak reserved", "utilization")
    _check(text, words)
    del settings_cells  # the cells are the report's own; the words above come from the same inputs


def test_run_summary(rendered):
    from alloctune.units import format_size

    sections, _, trial = rendered
    words = _words(LONG.replace(",", " "), format_size(trial["peak_reserved"]), "NVIDIA H200", "2.11.0")
    _check(sections["run-summary"], words)


def test_demo_list(rendered):
    _check(rendered[0]["demo-list"], {"diffusion_h200_max_split_128", "expandable_segments:True", "rvc_h200_ec1"})


def test_demo_table(traces_dir):
    env = dict(os.environ, COLUMNS="80", PYTHONIOENCODING="utf-8")
    proc = subprocess.run([sys.executable, "-m", "alloctune", "demo", "--no-gpu"], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout.split("Rows below the line")[0]
    _check(table, {"max_split_size_mb:256,", "garbage_collection_threshold:0.6", "expandable_segments:True"})
    assert not re.search(r"garbage_co\s", table)
    # #18.11b: a standard row identical to the default says so, like the folklore rows below the line
    assert re.search(r"max_split_size_mb:512\s.*\(no effect\)", table)
