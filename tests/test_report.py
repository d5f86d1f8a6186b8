"""`alloctune report`: rows, figures and the self-contained HTML page from stores, simulations and traces."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys

import pytest

from alloctune.errors import InputError
from alloctune.report import build_report, write_report
from alloctune.report.model import downsample, min_budgets, read_tune_store
from alloctune.units import GiB, MiB

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _assert_self_contained(html: str) -> None:
    # Nothing that a browser would fetch: no http(s) in src/href, no script, no external link/font.
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:|//)""", html, re.I)
    assert "<script" not in html.lower()
    assert "<link" not in html.lower()
    assert "@import" not in html and "url(" not in html


def _store(tmp_path):
    """A tune store written through `alloctune.tune.store.TrialStore`, as `alloctune tune` does."""
    from alloctune.run.trial import TrialResult
    from alloctune.tune.store import TrialStore, trial_key

    cmd = ["python", "infer.py"]
    store = TrialStore(tmp_path / "store.jsonl", cmd)
    trials = [
        ("", 6 * GiB, "ok", 5 * GiB, 4 * GiB, 0, 0),
        ("", 5 * GiB, "oom", 5 * GiB, 4 * GiB, 3, 1),
        ("", 5632 * MiB, "ok", 5376 * MiB, 4 * GiB, 2, 0),
        ("expandable_segments:True", 5 * GiB, "ok", 4352 * MiB, 4 * GiB, 0, 0),
    ]
    for conf, budget, outcome, resv, alloc, retries, ooms in trials:
        store.append(trial_key(cmd, conf, budget), TrialResult(
            command=tuple(cmd), conf=conf, budget=budget, outcome=outcome, exit_code=0 if outcome == "ok" else 1,
            wall_s=10.0, peak_reserved=resv, peak_allocated=alloc, num_alloc_retries=retries, num_ooms=ooms))
    # A flat record with a bisection result (the form other tools may append) is read too.
    with open(store.path, "a") as fh:
        fh.write(json.dumps({"config": "max_split_size_mb:256", "min_budget": 4800 * MiB, "outcome": "ok"}) + "\n")
    return store.path


def test_tune_store_rows_and_min_budget(tmp_path):
    rows = read_tune_store(_store(tmp_path))
    assert [r.label for r in rows] == ["(default)", "(default)", "(default)", "expandable_segments:True",
                                       "max_split_size_mb:256"]
    exp = rows[3]
    assert exp.peak_reserved == 4352 * MiB and exp.utilization == pytest.approx(4096 / 4352)
    assert rows[1].num_ooms == 1 and rows[1].outcome == "oom"
    mb = min_budgets(rows)
    assert mb == {
        "(default)": (5632 * MiB, "smallest ok trial"),
        "expandable_segments:True": (5 * GiB, "smallest ok trial"),
        "max_split_size_mb:256": (4800 * MiB, "bisection"),
    }


def test_report_from_tune_store(tmp_path):
    data = build_report([_store(tmp_path)], title="demo <tune>")
    written = write_report(data, tmp_path / "out")
    names = [p.rsplit("/", 1)[1] for p in written.figures]
    assert names == ["min_budget.png", "peaks.png"]
    w, h = _png_size((tmp_path / "out" / "min_budget.png").read_bytes())
    assert w == 900 and h > 150
    html = (tmp_path / "out" / "report.html").read_text()
    _assert_self_contained(html)
    assert "demo &lt;tune&gt;" in html  # input text is escaped
    assert html.count('src="data:image/png;base64,') == 2
    assert "5.50 GiB (≤)" in html and "4.69 GiB" in html  # min_budget: upper bound marked; bisection not
    assert any("upper bound" in n for n in data.notes)
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["schema"] == "alloctune.report/1" and len(saved["rows"]) == 5


def test_report_from_shared_traces(traces_dir, tmp_path):
    names = ["rvc_ec1/default", "rvc_ec1/max_split_128", "rvc_ec1/default_cap85"]
    data = build_report([traces_dir / f"{n}.pickle.xz" for n in names])
    stats = {n: json.loads((traces_dir / f"{n}.json").read_text())["stats"] for n in names}
    assert [r.label for r in data.rows] == names
    for r, n in zip(data.rows, names):
        assert r.peak_reserved == stats[n]["reserved_bytes.all.peak"]
        assert r.peak_allocated == stats[n]["allocated_bytes.all.peak"]
        assert r.num_alloc_retries == stats[n]["num_alloc_retries"]
    assert data.rows[1].config == "max_split_size_mb:128"
    # max_split_size_mb:128 fragments this workload: lower utilization than the default.
    assert data.rows[1].utilization < data.rows[0].utilization
    assert len(data.series) == 3 and all(len(s.x) <= 1500 for s in data.series)
    assert max(data.series[0].reserved) == stats[names[0]]["reserved_bytes.all.peak"]  # downsampling keeps the peak
    assert "peak" in data.maps[0].caption and "OOM" in data.maps[2].caption
    assert data.maps[2].request == 287564288
    (diag,) = data.diagnoses
    assert diag.verdict == "fragmentation" and diag.source.endswith("default_cap85.pickle.xz")

    written = write_report(data, tmp_path / "r")
    html = (tmp_path / "r" / "report.html").read_text()
    _assert_self_contained(html)
    imgs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(imgs) == len(written.figures) == 5  # peaks, timeline, 3 segment maps
    for b64 in imgs:
        _png_size(base64.b64decode(b64))
    assert "OOM diagnosis" in html and "Fragmentation:" in html


def test_report_from_simulation_results(traces_dir, tmp_path):
    from alloctune.config import AllocatorConfig
    from alloctune.sim import replay
    from alloctune.trace import load_trace

    trace = load_trace(traces_dir / "rvc_ec1" / "default.pickle.xz")
    results = [replay(trace, AllocatorConfig.parse(c)).to_dict() for c in ("", "expandable_segments:True")]
    path = tmp_path / "sim.json"
    path.write_text(json.dumps({"results": results}))
    data = build_report([path])
    assert [r.label for r in data.rows] == ["(default) (sim)", "expandable_segments:True (sim)"]
    assert [r.peak_reserved for r in data.rows] == [res["peak_reserved"] for res in results]
    assert all(r.outcome == "ok" and r.kind == "simulation" for r in data.rows)
    assert [s.label for s in data.series] == ["(default) (sim)", "expandable_segments:True (sim)"]
    written = write_report(data, tmp_path / "o")
    assert sorted(p.rsplit("/", 1)[1] for p in written.figures) == ["peaks.png", "timeline.png"]


def test_report_from_simulate_cli_json(traces_dir, tmp_path):
    path = tmp_path / "simulate.json"
    out = subprocess.run([sys.executable, "-m", "alloctune", "simulate", str(traces_dir / "rvc_ec1/default.pickle.xz"),
                          "--conf", "", "--conf", "expandable_segments:True", "--min-budget", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    path.write_text(out.stdout)
    sim = json.loads(out.stdout)["rows"]
    data = build_report([path])
    assert [(r.label, r.peak_reserved, r.min_budget) for r in data.rows] == [
        ("(default) (sim)", sim[0]["peak_reserved"], sim[0]["min_budget"]),
        ("expandable_segments:True (sim)", sim[1]["peak_reserved"], sim[1]["min_budget"]),
    ]
    assert min_budgets(data.rows)["expandable_segments:True (sim)"] == (sim[1]["min_budget"], "bisection")
    written = write_report(data, tmp_path / "o")
    assert sorted(p.rsplit("/", 1)[1] for p in written.figures) == ["min_budget.png", "peaks.png"]


def test_downsample_keeps_every_peak():
    x = list(range(10_000))
    y = [i % 97 for i in x]
    xs, ys = downsample(x, y, max_points=100)
    assert len(xs) == 100 and max(ys) == 96 and xs[-1] == 9999


def test_bad_inputs_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        build_report([tmp_path / "missing.jsonl"])
    bad = tmp_path / "s.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(InputError, match=r"s.jsonl:1: not a JSON line"):
        build_report([bad])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="holds no snapshots"):
        build_report([empty])


def test_report_core_does_not_import_torch():
    code = ("import sys, alloctune.report, alloctune.report.figures, alloctune.report.html, "
            "alloctune.diagnose.snapshot, alloctune.monitor; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_cli_report(tmp_path):
    store = _store(tmp_path)
    out = subprocess.run([sys.executable, "-m", "alloctune", "report", str(store), "--out", str(tmp_path / "o"),
                          "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["written"]["html"].endswith("report.html")
    assert len(data["written"]["figures"]) == 2
    out = subprocess.run([sys.executable, "-m", "alloctune", "report", str(tmp_path / "nope.jsonl")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("alloctune: error: ") and "no such file" in out.stderr


# ---- #18.18: the HTML report without matplotlib ---------------------------------------------


def test_report_without_matplotlib_has_inline_svg_figures(traces_dir, tmp_path):
    """matplotlib blocked in a fresh interpreter: the page is complete, its figures inline SVG."""
    store = _store(tmp_path)
    trace = traces_dir / "rvc_ec1" / "default_cap85.pickle.xz"
    code = (
        "import sys, json; sys.modules['matplotlib'] = None\n"
        "from alloctune.report import build_report, write_report\n"
        f"w = write_report(build_report([{str(store)!r}, {str(trace)!r}]), {str(tmp_path / 'out')!r})\n"
        "print(json.dumps(w.to_dict()))\n"
        "assert 'matplotlib' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    written = json.loads(out.stdout)
    names = [p.rsplit("/", 1)[1] for p in written["figures"]]
    assert names == ["min_budget.svg", "peaks.svg", "timeline.svg", "segments_rvc_ec1_default_cap85.svg"]
    html = (tmp_path / "out" / "report.html").read_text()
    _assert_self_contained(html)
    assert html.count("<svg ") == 4 and "data:image/png" not in html
    assert "Fragmentation:" in html and "5.50 GiB (≤)" in html  # the tables are all there too
    seg = (tmp_path / "out" / names[-1]).read_text()
    assert seg.startswith("<svg") and seg.count("<rect") > 20
    import xml.etree.ElementTree as ET

    for name in names:  # every figure is well-formed SVG a browser will draw
        root = ET.fromstring((tmp_path / "out" / name).read_bytes())
        assert root.tag == "{http://www.w3.org/2000/svg}svg" and int(root.get("height")) > 50


def test_svg_escapes_input_text(tmp_path):
    from alloctune.report.model import SettingRow
    from alloctune.report.svg import peaks_svg

    svg = peaks_svg([SettingRow(label="<script>x</script>", config="", kind="trial", peak_reserved=GiB,
                                peak_allocated=GiB // 2)]).decode()
    assert "<script>" not in svg and "&lt;script&gt;" in svg
