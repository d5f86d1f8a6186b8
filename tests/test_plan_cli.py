"""`alloctune plan` end to end on snapshot files written like torch's `_dump_snapshot`."""

import json
import pickle

import pytest
from plan_programs import program, snapshot

from record_child import cli_exit
from alloctune.sim.replay import replay


@pytest.fixture(scope="module")
def snaps(tmp_path_factory):
    d = tmp_path_factory.mktemp("snaps")
    out = {}
    for x in (256, 512, 1024, 2048):
        p = d / f"run{x}.pickle"
        p.write_bytes(pickle.dumps(snapshot(program(x))))
        out[x] = p
    return out


def _specs(snaps, sizes=(256, 512, 1024, 2048)):
    return [f"{snaps[x]}:{x}" for x in sizes]


def test_plan_json_on_plain_snapshots(snaps, capfd, tmp_path):
    save = tmp_path / "p.atraceset"
    code = cli_exit(["plan", *_specs(snaps), "--cap", "1GiB", "--card", "2GiB", "-c", "", "-c",
                 "expandable_segments:True", "--size", "1500", "--curve", "512,1500", "--save", str(save),
                 "--hold-back", "1024", "--json"])
    out = capfd.readouterr().out
    assert code == 0, out
    d = json.loads(out)
    assert d["schema"] == "alloctune.plan/1" and d["report_schema"] == "alloctune.plan_report/1"
    assert d["recorded_sizes"] == ["256", "512", "1024", "2048"] and d["conservative"] is True
    assert [s["conf"] for s in d["settings"]] == ["", "expandable_segments:True"]
    assert d["holdout"]["fitted_on"] == ["256", "512", "2048"] and abs(d["holdout"]["error_vs_replay"]) < 0.01
    assert d["total_wall_s"] >= d["wall_s"] > 0
    cap = d["settings"][0]["largest"][1]
    assert cap["label"] == "cap 1024.00 MiB"
    # the answer is the program's own boundary (the snapshot streams drop nothing the replay needs)
    x = int(cap["largest"])
    assert replay(program(x), budget=1 << 30, record_events=False).completed
    assert not replay(program(x + 1), budget=1 << 30, record_events=False).completed
    # the saved trace set gives the same answers without the snapshots
    assert cli_exit(["plan", str(save), "--cap", "1GiB", "--curve", "512", "--json"]) == 0
    again = json.loads(capfd.readouterr().out)
    assert again["settings"][0]["largest"][0]["largest"] == cap["largest"]
    gen = tmp_path / "g1500.atrace"
    assert cli_exit(["plan", str(save), "--export", f"1500:{gen}", "--curve", "512", "--json"]) == 0
    assert json.loads(capfd.readouterr().out)["exported"] == str(gen)
    assert cli_exit(["simulate", str(gen), "--json"]) == 0  # the rest of alloctune reads the generated stream
    sim = json.loads(capfd.readouterr().out)["rows"][0]
    assert sim["completed"] and sim["peak_reserved"] == replay(program(1500)).peak_reserved
    assert cli_exit(["plan", str(save), "--hold-back", "512"]) == 2
    assert "not a saved trace set" in capfd.readouterr().err


def test_plan_table_output(snaps, capfd, tmp_path):
    png = tmp_path / "b.png"
    assert cli_exit(["plan", *_specs(snaps), "--card", "4GiB,8GiB", "--curve", "512", "--rvc", "--png", str(png)]) == 0
    out = capfd.readouterr().out
    # the search runs past 4x the largest recording (8192) to the size that fails
    assert "card 4.00 GiB" in out and "card 8.00 GiB" in out and "12175 *" in out and "≥" not in out
    assert "RVC" in out and "low" in out and "fp16" in out  # RVC's presets for a 4 and an 8 GB card
    assert "plan took" in out and "conservative" in out
    pytest.importorskip("matplotlib")
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plan"], "Missing argument"),
        (["plan", "nope.pickle:12"], "no such file"),
        (["plan", "{a}:abc"], "is not a number"),
        (["plan", "{a}"], "give the input size"),
        (["plan", "{a}:256"], "two or more input sizes"),
        (["plan", "{a}:256", "{b}:512", "--cap", "lots"], "lots"),
        (["plan", "{a}:256", "{b}:512", "--cap", "200TiB"], "larger than the recording's device"),
        (["plan", "{a}:256", "{b}:512", "-c", "max_split_size_mb:oops"], "max_split_size_mb"),
        (["plan", "{a}:256", "{b}:512", "--hold-back", "512"], "three or more sizes"),
        (["plan", "{bad}"], "trace set"),
        (["plan", "{a}:256", "{oom}:512"], "ran out of memory"),
    ],
)
def test_bad_input_is_one_line_exit_2(snaps, capfd, tmp_path, argv, message):
    bad = tmp_path / "bad.atraceset"
    bad.write_text('{"format": "alloctune.traceset", "version": 7}')
    oom = tmp_path / "oom.pickle"
    snap = snapshot(program(512))
    snap["device_traces"][0].append({"action": "oom", "addr": 0, "size": 1 << 40, "stream": 0, "time_us": 0,
                                     "device_free": 0})
    oom.write_bytes(pickle.dumps(snap))
    sub = {"{a}": str(snaps[256]), "{b}": str(snaps[512]), "{bad}": str(bad), "{oom}": str(oom)}
    for key, value in sub.items():
        argv = [a.replace(key, value) for a in argv]
    assert cli_exit(argv) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert message in "\n".join(err)
    if message != "Missing argument":
        assert len(err) == 1 and err[0].startswith("alloctune: error:"), err


def test_the_search_is_open_ended_up_to_the_size_that_fails_and_says_why_it_stopped(snaps, capfd):
    from alloctune.sim.driver import DEFAULT_OVERHEAD

    card = 4 << 30
    assert cli_exit(["plan", *_specs(snaps), "--card", "4GiB,140GiB", "--curve", "512", "--json"]) == 0
    d = json.loads(capfd.readouterr().out)
    small, big = d["settings"][0]["largest"]
    # 4 GiB: the answer lies beyond the old 4x ceiling (8192), and it is the program's own boundary
    x = int(small["largest"])
    assert x > 4 * 2048 and small["stopped"] == "exceeded" and int(small["first_failing"]) == x + 1
    assert replay(program(x), total_memory=card, overhead=DEFAULT_OVERHEAD, record_events=False).completed
    assert not replay(program(x + 1), total_memory=card, overhead=DEFAULT_OVERHEAD, record_events=False).completed
    # 140 GiB: everything up to 16x the largest recording fits; the search says so instead of guessing on
    assert big["largest"] == str(16 * 2048) and big["first_failing"] is None and big["stopped"] == "extrapolation"
    assert "record a larger size" in big["stopped_why"] and d["search"][1] == str(16 * 2048)
    assert cli_exit(["plan", *_specs(snaps), "--card", "140GiB", "--max-size", "4096", "--curve", "512", "--json"]) == 0
    capped = json.loads(capfd.readouterr().out)["settings"][0]["largest"][0]
    assert capped["largest"] == "4096" and capped["stopped"] == "max-size"
