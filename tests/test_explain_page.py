"""The explain page (`explain --html`, and `report` on a recording with stacks), without a browser.

On two real H200 recordings with Python stacks (tests/data/explain_gpu: a training loop that
keeps each step's logits, a ConvNeXt that keeps its feature maps). What is checked against the
recording itself, not against the tool: the reserved bytes over time (the recording's own
segment events), and the owner of every live block in the map at the peak (the snapshot's own
alloc/free events by address, with their sizes and frames)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from alloctune.explain.model import CATEGORIES
from alloctune.report.explain_view import OTHER, explain_recording

DATA = Path(__file__).parent / "data" / "explain_gpu"
LEAKS = ["train_leak", "convnext_leak"]


@pytest.fixture(scope="module", params=LEAKS)
def view(request):
    return request.param, explain_recording(DATA / f"{request.param}.pickle.xz", what_if=False)


def _facts(name: str) -> dict:
    return json.loads((DATA / f"{name}.facts.json").read_text())


def test_over_time_conserves_and_follows_the_recording(view):
    name, v = view
    ot = v.over_time
    assert 24 <= len(ot.request) <= 241 and list(ot.request) == sorted(set(ot.request))
    for i in range(len(ot.request)):
        assert sum(ot.categories[c][i] for c in CATEGORIES) == ot.reserved[i]
    # the replay holds what the recording's own segment events say, at every point
    assert ot.reserved == ot.recorded_reserved
    # the explained moment is a point, and there the page's numbers are explain's
    ex = v.explanation
    assert ot.request[ot.moment] == ex.moment["request"]
    assert {c: ot.categories[c][ot.moment] for c in CATEGORIES} == {c.name: c.bytes for c in ex.categories}
    assert ot.reserved[ot.moment] == max(ot.reserved) == ex.reserved


def test_the_kept_line_grows_over_time(view):
    name, v = view
    facts = _facts(name)
    ex, ot = v.explanation, v.over_time
    series = {ex.sites[row].site: col for row, col in ot.sites}
    (kept,) = [s for s in series if f":{facts['kept_line']} " in s]
    col = series[kept]
    assert col[ot.moment] == next(s.bytes for s in ex.sites if s.site == kept)
    # what the list holds rises over the run: the median of each quarter of the run (up to the
    # moment, not the tear-down) above the one before by at least half a quarter of the kept bytes
    import statistics

    run = col[: ot.moment + 1]
    q = len(run) // 4
    mid = [statistics.median(run[i * q:(i + 1) * q]) for i in range(4)]
    step = facts["kept_bytes_per_step"] * facts["steps"] // 4
    assert all(b - a > step // 2 for a, b in zip(mid, mid[1:])), (mid, step)


def _recorded_live(path: Path, event: int) -> dict[int, dict]:
    """Live allocations by address after recording event `event`, read from the snapshot alone."""
    from alloctune.trace.load import load_snapshot

    snap = load_snapshot(path)
    live: dict[int, dict] = {}
    for e in snap["device_traces"][0][: event + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    return live


def test_every_live_block_of_the_map_has_its_recorded_owner(view):
    name, v = view
    ex = v.explanation
    live = _recorded_live(DATA / f"{name}.pickle.xz", ex.moment["event"])
    blocks = [b for s in v.memory_map.segments for b in s.blocks if b.allocated]
    assert len(blocks) == len(v.owners) == len(live)
    for b in blocks:
        row, cat = v.owners[b.addr]
        rec = live[b.addr]  # the recording allocated exactly this address
        assert rec["size"] == b.requested and cat in CATEGORIES
        if row == OTHER:
            continue
        site = ex.sites[row].site
        m = re.match(r"(.+):(\d+) \(", site)
        if m:  # a user line: it is among the frames the recording kept for this allocation
            assert any(f["filename"] == m[1] and f["line"] == int(m[2]) for f in rec.get("frames", [])), site
        else:
            assert site.startswith("(no Python frames") and not rec.get("frames")
    # the kept list's blocks at the peak: the growing bytes explain reports, block by block
    grow = sum(b.requested for b in blocks if v.owners[b.addr][1] == "growing")
    assert grow == ex.category("growing")


def test_page_is_self_contained_and_links_sites_to_their_blocks(view, tmp_path):
    from alloctune.report.explain_html import explain_page

    name, v = view
    html = explain_page(v)
    assert "<script" not in html.lower() and "<link" not in html.lower() and "url(" not in html
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:|//)""", html, re.I)
    import html as htmlmod

    text = htmlmod.unescape(html)
    ex = v.explanation
    from alloctune.units import format_size

    for c in ex.categories:  # the numbers explain prints
        assert f"<td>{c.name}</td><td class=num>{format_size(c.bytes)}</td>" in text
    rows = re.findall(r'<tr class="site" id="(site-[^"]+)">', html)
    assert len(rows) == len(ex.sites)
    for anchor in rows:
        n = html.count(f'<rect class="blk" data-site="{anchor}"')
        assert n >= 1, anchor  # every listed site has blocks at the moment, each linked to its row
        assert f'body:has(#{anchor}:target) svg .blk[data-site="{anchor}"]' in html
    charts = 3 if v.over_time.phases else 2  # categories, sites, and phases on a training recording
    assert html.count('class="col"') == charts * len(v.over_time.request)  # hover targets of every chart


def test_cli_explain_html(tmp_path):
    rec = DATA / "convnext_leak.pickle.xz"
    page = tmp_path / "page.html"
    run = [sys.executable, "-m", "alloctune", "explain", str(rec), "--no-what-if", "--html", str(page)]
    out = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith(f"wrote {page}") and "<svg" in page.read_text()
    out = subprocess.run(run[:-1] + [str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.startswith("alloctune: error: --html") and out.stderr.count("\n") == 1
    out = subprocess.run(run + ["--against", str(rec)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.startswith("alloctune: error: ") and out.stderr.count("\n") == 1


def test_report_adds_explain_for_recordings_with_stacks(tmp_path):
    from alloctune.report import build_report, write_report

    data = build_report([DATA / "convnext_leak.pickle.xz"])
    (v,) = data.explains
    assert v.explanation.what_if  # the what-if table is on the page
    html = Path(write_report(data, tmp_path / "r").html).read_text()
    assert "Where the memory goes" in html and 'id="x0-site-0"' in html and 'data-site="x0-site-0"' in html
    assert json.loads((tmp_path / "r" / "report.json").read_text())["explains"][0]["explanation"]["schema"] == \
        "alloctune.explain/2"
    assert not build_report([DATA / "convnext_leak.pickle.xz"], explain=False).explains


@pytest.mark.parametrize("name", ["train_h200", "rvc_h200_ec1", "diffusion_h200_expandable"])
def test_shipped_compact_traces(name):
    """Recordings without stacks (and an expandable-segments run): the replay follows the recorded
    reserved bytes at every point, every live block of the map has its allocation, and the
    page draws."""
    from alloctune.report.explain_html import explain_page

    path = Path(__file__).parents[1] / "src" / "alloctune" / "data" / "traces" / f"{name}.atrace"
    v = explain_recording(path, what_if=False)
    ot = v.over_time
    assert ot.reserved == ot.recorded_reserved
    for i in range(len(ot.request)):
        assert sum(ot.categories[c][i] for c in CATEGORIES) == ot.reserved[i]
    assert {c: ot.categories[c][ot.moment] for c in CATEGORIES} == {c.name: c.bytes for c in v.explanation.categories}
    live = [b for s in v.memory_map.segments for b in s.blocks if b.allocated]
    assert len(v.owners) == len(live) and not v.notes
    assert explain_page(v).count('class="blk"') >= 1


def test_a_crowded_map_stays_bounded(view, monkeypatch):
    """Above MAX_MAP_BLOCKS live blocks, sub-pixel neighbours of different sites share one rect:
    fewer rects, every byte still drawn, the largest owner's site still linked."""
    from alloctune.report import explain_html as eh

    name, v = view
    exact = eh.segment_map_svg(v).decode()
    monkeypatch.setattr(eh, "MAX_MAP_BLOCKS", 0)
    crowded = eh.segment_map_svg(v).decode()
    assert crowded.count('class="blk"') <= exact.count('class="blk"')

    def drawn(svg: str) -> float:  # total width of all rects (live and free): the reserved bytes
        return sum(float(w) for w in re.findall(r'class="(?:blk|free)"[^>]*? width="([0-9.]+)"', svg))

    assert abs(drawn(crowded) - drawn(exact)) < 0.01 * drawn(exact)
    assert 'data-site="site-0"' in crowded
