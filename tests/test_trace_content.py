"""Every command that takes a recording recognises what it was given, and takes shipped traces by name.

A text log given to `explain`, `simulate`, `report` or `trace info` is named as one, with the command
that reads it (`diagnose`); JSON, images and archives get one line saying what they are; a name that
is no file but a shipped trace's (`alloctune demo --list`) loads that trace, in every command.
"""

from __future__ import annotations

import gzip
import json
import pickle

import pytest

from alloctune.errors import TraceError, UnsafePickleError
from alloctune.trace import load_snapshot, load_trace
from alloctune.trace.content import sniff_content
from alloctune.trace.shipped import resolve_recording, shipped_names, shipped_path
from cli_run import run_cli

RECORDING_COMMANDS = (["explain"], ["simulate"], ["report"], ["trace", "info"])


def _one_line(code: int, err: str) -> str:
    assert code == 2 and err.startswith("alloctune: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err.strip()


@pytest.fixture(scope="module")
def oom_text(oom_corpus, tmp_path_factory):
    """A real OOM message from the shared corpus, saved as the .txt a user would hand over."""
    entry = json.loads(oom_corpus.read_text(encoding="utf-8").splitlines()[0])
    path = tmp_path_factory.mktemp("logs") / f"{entry['id']}.txt"
    path.write_text(entry["text"], encoding="utf-8")
    return path


@pytest.mark.parametrize("command", RECORDING_COMMANDS, ids=" ".join)
def test_text_log_points_to_diagnose(capsys, oom_text, command):
    code, _, err = run_cli(capsys, *command, str(oom_text))
    line = _one_line(code, err)
    assert line == (f"alloctune: error: {oom_text} is a text log, not a recording: "
                    f"try `alloctune diagnose {oom_text}`")
    assert "opcode" not in line


def test_compressed_log_is_a_log_too(capsys, oom_text, tmp_path):
    gz = tmp_path / "train.log.gz"
    gz.write_bytes(gzip.compress(oom_text.read_bytes()))
    code, _, err = run_cli(capsys, "simulate", str(gz))
    assert "is a text log, not a recording" in _one_line(code, err)


def test_log_starting_with_a_pickle_opcode_is_still_a_log(tmp_path):
    """`c` is pickle's GLOBAL opcode: a log starting "cuda runtime error" is a log, not a pickle
    asking for the global 'uda runtime error ...'."""
    log = tmp_path / "old.log"
    log.write_text("cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCCachingAllocator.cpp:510\n"
                   "Traceback (most recent call last):\n")
    with pytest.raises(TraceError, match="is a text log, not a recording: try `alloctune diagnose"):
        load_trace(log)


def test_tampered_text_pickle_is_still_refused_by_name(tmp_path):
    """A protocol-0 pickle is ASCII: one that asks for `os.system` is named as such, not as a log."""
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(b"cos\nsystem\n(S'true'\ntR.")
    with pytest.raises(UnsafePickleError, match=r"os\.system") as info:
        load_trace(evil)
    assert info.value.refused == "os.system"


def test_protocol_0_snapshot_still_loads(tmp_path):
    snap = {"device_traces": [[{"action": "alloc", "addr": 1 << 20, "size": 512, "stream": 0, "time_us": 1},
                               {"action": "free_completed", "addr": 1 << 20, "size": 512, "stream": 0,
                                "time_us": 2}]],
            "segments": [], "allocator_settings": {}}
    path = tmp_path / "p0.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=0))
    assert sniff_content(path.read_bytes()).kind == "text"
    assert len(load_trace(path).requests) == 2
    assert load_snapshot(path)["device_traces"] == snap["device_traces"]


def test_json_image_and_binary_say_what_they_are(capsys, tmp_path):
    js = tmp_path / "sim.json"
    js.write_text('{"schema": "alloctune.simulate/1", "rows": []}')
    code, _, err = run_cli(capsys, "explain", str(js))
    assert f"{js} is JSON, not a recording" in _one_line(code, err) and "alloctune report" in err
    png = tmp_path / "plot.pickle"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    code, _, err = run_cli(capsys, "simulate", str(png))
    assert f"{png} is a PNG image, not a recording" in _one_line(code, err)
    ckpt = tmp_path / "model.pt"
    ckpt.write_bytes(b"PK\x03\x04" + bytes(100))
    code, _, err = run_cli(capsys, "trace", "info", str(ckpt))
    assert "ZIP archive (a torch.save checkpoint is one), not a recording" in _one_line(code, err)
    zeros = tmp_path / "zeros.bin"
    zeros.write_bytes(bytes(1000))
    code, _, err = run_cli(capsys, "simulate", str(zeros))
    line = _one_line(code, err)
    assert "binary data that is neither a torch memory snapshot nor an alloctune trace" in line
    assert "not a readable pickle" in line


# ---- shipped traces by name ---------------------------------------------------------------------------
def test_names_resolve_with_and_without_suffix():
    names = shipped_names()
    assert "rvc_h200" in names and all(not n.endswith(".atrace") for n in names)
    assert shipped_path("rvc_h200") == shipped_path("rvc_h200.atrace")
    assert shipped_path("rvc_ec1").name == "rvc_h200_ec1.atrace"  # a workload name one trace carries
    assert shipped_path("rvc") is None  # three traces record the rvc workload
    assert shipped_path("nope") is None and shipped_path("sub/rvc_h200") is None


def test_a_file_of_that_name_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rvc_h200").write_text("my own notes\n")
    assert resolve_recording("rvc_h200") == tmp_path.joinpath("rvc_h200").relative_to(tmp_path)
    with pytest.raises(TraceError, match="is a text log"):
        load_trace("rvc_h200")


@pytest.mark.parametrize("command", [["simulate"], ["explain", "--no-what-if"], ["trace", "info"]], ids=" ".join)
def test_every_recording_command_takes_a_shipped_name(capsys, command):
    code, out, err = run_cli(capsys, *command, "rvc_h200_ec1", "--json")
    assert code == 0, err
    assert json.loads(out)["schema"].startswith("alloctune.")


def test_simulate_rvc_h200_and_convert(capsys, tmp_path):
    code, out, err = run_cli(capsys, "simulate", "rvc_h200")
    assert code == 0 and "no such file" not in err
    out_file = tmp_path / "rvc.atrace"
    code, out, err = run_cli(capsys, "trace", "convert", "rvc_h200", str(out_file))
    assert code == 0, err
    assert len(load_trace(out_file).requests) == len(load_trace("rvc_h200").requests)


def test_report_on_a_shipped_name_says_how_to_go_on(capsys, tmp_path):
    code, _, err = run_cli(capsys, "report", "rvc_h200", "--out", str(tmp_path / "r"))
    line = _one_line(code, err)
    assert "compact trace keeps the request stream" in line and "alloctune simulate" in line
    assert "no such file" not in line


def test_unknown_name_points_to_the_list(capsys):
    code, _, err = run_cli(capsys, "simulate", "rvc_h201")
    assert _one_line(code, err) == ("alloctune: error: rvc_h201: no such file: not a file, nor a shipped trace "
                                    "name (see alloctune demo --list)")
