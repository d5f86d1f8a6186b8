"""`alloctune simulate` end to end (through the real entry point, errors included)."""

from __future__ import annotations

import json

import pytest

from alloctune.cli import main
from alloctune.sim import min_budget, replay
from alloctune.sim.settings import SimSettings
from alloctune.trace import load_trace
from alloctune.units import format_size


def _run(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def _ok(capsys, *args):
    try:
        main(list(args))
    except SystemExit as exc:  # typer exits 0 on success in standalone mode
        assert exc.code in (0, None), capsys.readouterr()
    return capsys.readouterr().out


def test_simulate_json_rows(traces_dir, capsys):
    trace = str(traces_dir / "rvc_ec0" / "default.pickle.xz")
    out = _ok(capsys, "simulate", trace, "--conf", "expandable_segments:True", "--conf", "max_split_size_mb:128",
              "--json")
    data = json.loads(out)
    assert data["schema"] == "alloctune.simulate/1"
    exp, mss = data["rows"]
    # the recorded peaks of those settings (sidecar stats of the shared traces)
    rec_exp = json.loads((traces_dir / "rvc_ec0" / "expandable.json").read_text())["stats"]
    rec_mss = json.loads((traces_dir / "rvc_ec0" / "max_split_128.json").read_text())["stats"]
    assert exp["peak_reserved"] == rec_exp["reserved_bytes.all.peak"]
    assert mss["peak_reserved"] == rec_mss["reserved_bytes.all.peak"]
    assert exp["peak_allocated"] == rec_exp["allocated_bytes.all.peak"]
    assert exp["completed"] and exp["oom"] is None
    assert exp["utilization"] == round(exp["peak_allocated"] / exp["peak_reserved"], 4)


def test_simulate_table_with_min_budget(traces_dir, capsys):
    trace = str(traces_dir / "rvc_ec0" / "default.pickle.xz")
    out = _ok(capsys, "simulate", trace, "--conf", "expandable_segments:True", "--min-budget")
    mb = min_budget(load_trace(trace), SimSettings(expandable_segments=True))
    assert format_size(mb.budget) in out
    assert "min budget" in out


def test_min_budget_brackets_the_feasible_cap(traces_dir):
    trace = load_trace(traces_dir / "rvc_ec1" / "default.pickle.xz")
    mb = min_budget(trace, None)
    assert mb.budget - mb.infeasible_below <= max(16 << 20, mb.budget // 100)
    assert replay(trace, None, budget=mb.budget, record_events=False).completed
    assert not replay(trace, None, budget=mb.infeasible_below, record_events=False).completed
    assert mb.budget <= mb.peak_reserved_uncapped


def test_simulate_budget_oom_and_compare(traces_dir, capsys):
    trace = str(traces_dir / "rvc_ec1" / "default.pickle.xz")
    code, out, _ = _run(capsys, "simulate", trace, "--budget", "1GiB", "--json")
    assert code == 1  # a predicted OOM is a failure of the simulated run (#18.17)
    data = json.loads(out)
    assert data["predicted_oom"] is True and data["differs"] is False
    row = data["rows"][0]
    assert not row["completed"] and row["oom"]["request_index"] > 0 and row["budget"] == 1 << 30
    capped = str(traces_dir / "rvc_ec1" / "default_cap85.pickle.xz")
    data = json.loads(_ok(capsys, "simulate", capped, "--compare", capped, "--json"))
    fid = data["rows"][0]["fidelity"]
    assert fid["exact"] and fid["verdict"] == "exact"


def test_simulate_compare_reports_first_difference(traces_dir, capsys):
    trace = str(traces_dir / "rvc_ec0" / "default.pickle.xz")
    other = str(traces_dir / "rvc_ec0" / "max_split_128.pickle.xz")
    code, out, _ = _run(capsys, "simulate", trace, "--compare", other)
    assert code == 1  # a fidelity difference exits 1 (#18.17)
    assert "differs" in out and "first difference" in out and "segment event #" in out


def test_simulate_bad_conf_is_one_line(traces_dir, capsys):
    trace = str(traces_dir / "rvc_ec0" / "default.pickle.xz")
    code, out, err = _run(capsys, "simulate", trace, "--conf", "max_split_size_mb:5")
    assert code == 2 and err.startswith("alloctune: error:") and err.count("\n") == 1


def test_simulate_missing_file(tmp_path, capsys):
    code, _, err = _run(capsys, "simulate", str(tmp_path / "nope.pickle"))
    assert code == 2 and "alloctune: error:" in err


def test_simulate_exit_0_when_it_fits_and_matches(traces_dir, capsys):
    trace = str(traces_dir / "rvc_ec0" / "default.pickle.xz")
    code, out, _ = _run(capsys, "simulate", trace, "--compare", trace, "--json")
    data = json.loads(out)
    assert (code, data["predicted_oom"], data["differs"]) == (0, False, False)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--budget", "6"], "give a unit"),
        (["--budget", "0GiB"], "more than 0"),
        (["--budget", "nan"], "finite"),
        (["--budget=-1GiB"], "more than 0"),
        (["--budget", "4TiB"], "more than the device's memory"),
        (["--total-memory", "0GiB"], "--total-memory must be more than 0"),
        (["--total-memory", "80"], "give a unit"),
        (["--device", "-1"], "--device must be 0 or more"),
        (["--addresses", "guess"], "--addresses"),
    ],
)
def test_simulate_bad_numbers_are_one_line_errors(traces_dir, capsys, args, needle):
    trace = str(traces_dir / "rvc_ec0" / "default.pickle.xz")
    code, out, err = _run(capsys, "simulate", trace, *args)
    assert code == 2 and out == ""
    assert err.startswith("alloctune: error:") and err.count("\n") == 1 and needle in err, err


def test_simulate_is_the_core_function(traces_dir):
    """The CLI renders what `alloctune.sim.simulate.simulate` returns; the API gives the same data."""
    from alloctune.sim.simulate import simulate

    trace = traces_dir / "rvc_ec1" / "default.pickle.xz"
    steps = []
    sim = simulate(trace, ["", "expandable_segments:True"], budget="1GiB",
                   progress=lambda step, done=0, total=None: steps.append((step, done, total)))
    assert [r.conf for r in sim.rows] == ["", "expandable_segments:True"]
    assert sim.failed and sim.predicted_oom and sim.budget == 1 << 30
    assert sim.to_dict()["schema"] == "alloctune.simulate/1"
    assert steps[0][0].startswith("loading") and steps[-1] == ("done", 2, 2)


@pytest.fixture
def rvc0(traces_dir):
    return traces_dir / "rvc_ec0"


def _compare_row(capsys, rvc0, *extra):
    code, out, err = _run(capsys, "simulate", str(rvc0 / "default.pickle.xz"), "--conf", "max_split_size_mb:128",
                          "--compare", str(rvc0 / "max_split_128.pickle.xz"), "--json", *extra)
    assert code in (0, 1), err
    return json.loads(out)["rows"][0], err


def test_default_addresses_are_the_traces_own_a_prediction(rvc0, capsys):
    """#18.2: by default a comparison predicts from one recording (its stream *and* its addresses)."""
    row, err = _compare_row(capsys, rvc0)
    assert row["addresses"] == "trace" and err == ""
    assert row["addresses_from"] == f"recorded:{rvc0 / 'default.pickle.xz'}"
    assert row["fidelity"]["kind"] == "prediction from one recording"


def test_compared_addresses_are_labelled_a_replay(rvc0, capsys):
    row, _ = _compare_row(capsys, rvc0, "--addresses", "compared")
    assert row["addresses"] == "compared"
    assert row["addresses_from"] == f"recorded:{rvc0 / 'max_split_128.pickle.xz'}"
    assert row["fidelity"]["kind"] == "replay"
    row, _ = _compare_row(capsys, rvc0, "--addresses", "model")
    assert (row["addresses_from"], row["fidelity"]["kind"]) == ("model", "prediction with modelled addresses")


@pytest.mark.parametrize(("old", "new"), [("auto", "trace"), ("recorded", "compared")])
def test_deprecated_address_spellings_still_work_with_a_note(rvc0, capsys, old, new):
    row, err = _compare_row(capsys, rvc0, "--addresses", old)
    assert row["addresses"] == new
    assert err.startswith("alloctune: note:") and f"use --addresses {new}" in err and err.count("\n") == 1


def test_text_output_names_the_fidelity_kind(rvc0, capsys):
    trace = str(rvc0 / "default.pickle.xz")
    out = _ok(capsys, "simulate", trace, "--compare", trace, "--conf", "",
              "--conf", "roundup_power2_divisions:[256:1,>:4]")
    assert "fidelity (replay) of (default) vs recording: exact" in out
    assert f"(addresses: as recorded in {trace})" in out
    # a setting with brackets is printed as typed, not read as rich markup
    assert "of roundup_power2_divisions:[256:1,>:4] vs recording" in out


def test_compared_addresses_need_a_comparison(rvc0, capsys):
    code, out, err = _run(capsys, "simulate", str(rvc0 / "default.pickle.xz"), "--addresses", "compared")
    assert code == 2 and out == "" and err.count("\n") == 1 and "needs --compare" in err
