"""The built-in demo runs from the package alone (no ../shared, no GPU) and tells the truth
about the shipped trace: folklore max_split values are no-ops, and the recommendation beats
the default."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from alloctune.config.standard import STANDARD_CONFS
from alloctune.demo.core import FOLKLORE_CANDIDATES, run_demo, shipped_traces
from cli_run import run_cli


@pytest.fixture(scope="module")
def result():
    return run_demo()


def test_ships_a_trace():
    assert "rvc_h200_ec1.atrace" in shipped_traces()


def test_every_candidate_simulated(result):
    assert [r.conf for r in result.rows][0] == ""
    assert len(result.rows) == len(STANDARD_CONFS)
    assert len(result.folklore) == len(FOLKLORE_CANDIDATES)
    for row in result.rows + result.folklore:
        assert row.peak_reserved >= row.peak_allocated > 0
        assert row.min_budget is not None and row.min_budget <= row.peak_reserved


def test_folklore_values_change_nothing(result):
    default = result.rows[0]
    for row in result.folklore:
        assert (row.peak_reserved, row.min_budget, row.smallest_card_gib) == (
            default.peak_reserved,
            default.min_budget,
            default.smallest_card_gib,
        )
    assert any("nothing changes" in n for n in result.notes)


def test_recommendation_beats_default(result):
    default = result.rows[0]
    best = result.recommended
    assert best.conf != ""
    assert best.min_budget < 0.9 * default.min_budget
    # nothing else is clearly better than the recommendation (ties within the bisection resolution)
    for row in result.rows:
        assert row.min_budget >= best.min_budget - max(16 << 20, best.min_budget // 100)


def test_cli_json(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "alloctune", "demo", "--no-gpu", "--json", "--budget", "1.6GiB"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["schema"] == "alloctune.demo/1"
    fits = {r["conf"]: r["fits_budget"] for r in data["rows"]}
    assert fits[""] is False  # the default needs ~1.79 GiB
    assert fits["expandable_segments:True"] is True


def test_rows_identical_to_default_say_no_effect(result):
    """#18.11b: max_split_size_mb:512 is above every segment of this run, so it changes nothing,
    and the demo says so (as it does for the folklore values); rows that differ do not."""
    by_conf = {r.conf: r for r in result.rows + result.folklore}
    assert by_conf["max_split_size_mb:512"].no_effect
    assert all(r.no_effect for r in result.folklore)
    assert not by_conf[""].no_effect  # the reference itself
    assert not by_conf["expandable_segments:True"].no_effect
    assert not by_conf["max_split_size_mb:256"].no_effect
    assert any("max_split_size_mb:512: no effect" in n for n in result.notes)


def test_recommendation_says_why_over_a_smaller_budget():
    """#18.11b: a row that needs a few MiB more than another, within the bisection's resolution, can
    still be recommended; the note says why (the budgets are a tie there; its uncapped peak is lower)."""
    from alloctune.demo.core import DemoRow, _rank_key, why_not_smaller
    from alloctune.sim.resolution import step

    def row(conf: str, mb: int, peak_mib: int) -> DemoRow:
        return DemoRow(conf=conf, peak_reserved=peak_mib << 20, peak_allocated=1 << 30, utilization=0.5, retries=0,
                       min_budget=mb << 20, smallest_card_gib=3, fits_budget=None)

    tol = step(1500 << 20)
    lean, cheap = row("expandable_segments:True", 1501, 1550), row("max_split_size_mb:128", 1500, 2650)
    rows = (cheap, lean)
    best = min(rows, key=lambda r: _rank_key(r, tol))
    assert best is lean
    why = why_not_smaller(best, rows, tol)
    assert why is not None and why.startswith("expandable_segments:True is recommended over max_split_size_mb:128")
    assert "within the simulator's resolution" in why and "holds" in why
    far = row("max_split_size_mb:128", 1400, 2650)  # 100 MiB cheaper: beyond the resolution, it wins
    assert min((far, lean), key=lambda r: _rank_key(r, tol)) is far


def test_tie_without_a_reason_picks_the_smaller_budget():
    """Within the resolution, with equal peaks and retries, the smaller budget wins (not the shorter string)."""
    from alloctune.demo.core import DemoRow, _rank_key, why_not_smaller

    def row(conf: str, mb: int) -> DemoRow:
        return DemoRow(conf=conf, peak_reserved=2 << 30, peak_allocated=1 << 30, utilization=0.5, retries=0,
                       min_budget=mb << 20, smallest_card_gib=3, fits_budget=None)

    long_small, short_big = row("max_split_size_mb:128", 1500), row("roundup_power2_divisions:4", 1510)
    tol = 16 << 20
    assert min((short_big, long_small), key=lambda r: _rank_key(r, tol)) is long_small
    assert why_not_smaller(long_small, (short_big, long_small), tol) is None


def test_gpu_flag_without_cuda_is_an_error(monkeypatch, capsys):
    """`demo --gpu` on a machine whose torch sees no CUDA never says "GPU found" and never shows a
    simulation nobody asked for: one line saying the GPU part cannot run, exit 2."""
    from alloctune.demo import core as demo

    monkeypatch.setattr(demo, "cuda_available", lambda: False)
    for args in (["demo", "--gpu"], ["demo", "--gpu", "--json"], ["demo", "--gpu", "--budget", "1.6GiB"]):
        code, out, err = run_cli(capsys, *args)
        assert code == 2 and out == "", args
        assert err.startswith("alloctune: error: --gpu: no CUDA GPU") and err.count("\n") == 1, err
        assert "GPU found" not in out + err


def test_view_renders_a_result_it_is_given():
    """The demo's view only renders (no simulation): a hand-made result comes out as written,
    with its no-effect row marked, the notes, and the recommendation's shell lines."""
    from alloctune.cli.common import console
    from alloctune.cli.demo_view import render_demo
    from alloctune.demo.core import DemoResult, DemoRow

    def row(conf: str, mb: int, no_effect: bool = False) -> DemoRow:
        return DemoRow(conf=conf, peak_reserved=mb << 20, peak_allocated=mb << 19, utilization=0.5, retries=0,
                       min_budget=mb << 20, smallest_card_gib=3, fits_budget=None, no_effect=no_effect)

    best = row("max_split_size_mb:64", 1024)
    made = DemoResult(trace="t", workload="hand-made", requests=7, budget=None,
                      rows=(row("", 2048), best, row("max_split_size_mb:999", 2048, True)), folklore=(),
                      recommended=best, notes=("a note written by hand",))
    with console.capture() as cap:
        render_demo(made)
    text = cap.get()
    assert "trace: t (hand-made; 7 allocator requests)" in text and "a note written by hand" in text
    assert "(-50%)" in text and "(no effect)" in text
    assert "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64" in text


def test_demo_command_only_parses_calls_and_renders():
    """`cli/demo_cmd.py` stays thin (#18 review): the GPU probe and command live in the core, the
    wording in `cli/demo_view.py`."""
    import alloctune.cli.demo_cmd as cmd
    from alloctune.demo import core as demo

    source = open(cmd.__file__, encoding="utf-8").read()
    assert len(source.splitlines()) <= 120
    assert "def _render" not in source and "subprocess.run" not in source
    assert demo.gpu_demo_command(json_out=True)[3:6] == ["tune", "--budget", demo.GPU_DEMO_BUDGET]
    assert demo.gpu_demo_command(budget=1717986918)[3:6] == ["tune", "--budget", "1.6GiB"]


# ---- every name the demo prints is one it (and every command) accepts ----------------------
def test_header_names_the_trace_as_it_can_be_passed_again(capsys):
    """The header names the shipped trace (then its workload), and `demo --trace` takes both names."""
    code, out, _ = run_cli(capsys, "demo", "--no-gpu")
    assert code == 0
    header = next(line for line in out.splitlines() if line.startswith("trace: "))
    assert header.startswith("trace: rvc_h200_ec1 (rvc_ec1; ")
    for name in ("rvc_ec1", "rvc_h200_ec1", "rvc_h200_ec1.atrace"):
        code, out, err = run_cli(capsys, "demo", "--trace", name, "--json")
        assert code == 0, err
        data = json.loads(out)
        assert data["name"] == "rvc_h200_ec1" and data["trace"].endswith("rvc_h200_ec1.atrace")


def test_every_listed_name_is_accepted():
    from alloctune.demo.core import shipped_trace_info, shipped_trace_path

    for row in shipped_trace_info():
        assert shipped_trace_path(row["name"]).name == row["name"] + ".atrace"


def test_unknown_name_lists_the_names(capsys):
    code, out, err = run_cli(capsys, "demo", "--trace", "rvc")  # three rvc traces: not a unique workload
    assert code == 2 and err.count("\n") == 1
    assert "no shipped trace named 'rvc'" in err and "rvc_h200_ec1," in err and ".atrace," not in err


def test_hint_follows_the_budget_given(capsys):
    """`demo --budget 1.6GiB` ends with a hint to tune under 1.6 GiB, not the default 5.5 GiB."""
    code, out, _ = run_cli(capsys, "demo", "--no-gpu", "--budget", "1.6GiB")
    assert code == 0
    flat = " ".join(out.split())
    assert "alloctune tune --budget 1.6GiB -- python your_script.py" in flat and "5.5GiB" not in flat
    code, out, _ = run_cli(capsys, "demo", "--no-gpu")
    assert "alloctune tune --budget 5.5GiB --" in " ".join(out.split())


def test_list_json_carries_a_schema(capsys):
    code, out, _ = run_cli(capsys, "demo", "--list", "--json")
    data = json.loads(out)
    assert code == 0 and data["schema"] == "alloctune.demo.list/1"
    assert {r["name"] for r in data["traces"]} >= {"rvc_h200", "rvc_h200_ec1", "llm_h200"}
