"""The explain page in a real headless Chromium: it loads without a console error and fetches
nothing, draws (a screenshot that is not blank), and clicking a site highlights that site's
blocks in the map.

The browser is driven over the DevTools protocol through a pipe (tests/browser_cdp.py). Where no
browser is installed the test skips, except in CI (`CI` set), where `.ci/run` installs
Chromium and a missing browser is a failure.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from browser_cdp import Browser, find_browser  # noqa: E402

DATA = Path(__file__).parent / "data" / "explain_gpu"


@pytest.fixture(scope="module")
def browser():
    exe = find_browser()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("CI: no Chromium found (.ci/run installs the Debian package chromium)")
        pytest.skip("no Chromium-like browser on PATH (apt-get install chromium, or set ALLOCTUNE_CHROMIUM)")
    with Browser(exe, width=1280, height=900) as b:
        yield b


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    from alloctune.report.explain_html import write_explain_html

    out = tmp_path_factory.mktemp("page") / "train_leak.html"
    write_explain_html(DATA / "train_leak.pickle.xz", out)
    return out


def _styles(b: Browser, selector: str) -> list[tuple[str, str, str]]:
    return b.evaluate(f"""[...document.querySelectorAll({selector!r})].map(e => {{
        const s = getComputedStyle(e); return [e.dataset.site, s.opacity, s.strokeWidth]; }})""")


def test_page_loads_draws_and_highlights_a_clicked_site(browser, page):
    b = browser
    b.open(page.as_uri())
    assert b.errors() == []
    assert b.requested_urls() == [page.as_uri()]  # the page fetches nothing
    # categories, phases (a training recording), sites, the memory map
    assert b.evaluate("document.querySelectorAll('svg').length") == 4
    # fits 1280 px: nothing wider than the window
    assert b.evaluate("document.documentElement.scrollWidth") <= 1280

    from PIL import Image

    img = Image.open(io.BytesIO(b.screenshot(full_page=True))).convert("RGB")
    assert img.width == 1280 and img.height > 1500
    colors = img.getcolors(maxcolors=1 << 16) or []
    assert len(colors) > 50  # charts and tables, not a blank page
    assert max(n for n, _ in colors) < 0.9 * img.width * img.height

    before = _styles(b, "svg .blk")
    assert before and all(o == "1" for _, o, _ in before)
    # the growing site (the kept logits): click its link in the sites table, as a user does
    anchor = b.evaluate("""(() => { const rows = [...document.querySelectorAll('tr.site')];
        const r = rows.find(r => r.textContent.includes('/rep')); return r.id; })()""")
    x, y = b.evaluate(f"""(() => {{ const a = document.querySelector('a[href="#{anchor}"]');
        a.scrollIntoView({{block: 'center'}}); const q = a.getClientRects()[0];
        return [q.x + q.width / 2, q.y + q.height / 2]; }})()""")
    b.click(x, y)
    assert b.evaluate("location.hash") == f"#{anchor}"
    after = _styles(b, "svg .blk")
    mine = [(o, w) for site, o, w in after if site == anchor]
    others = [(o, w) for site, o, w in after if site != anchor]
    assert mine and others
    assert all(o == "1" and w == "1.5px" for o, w in mine)  # the site's blocks stand out
    assert all(float(o) < 0.5 for o, _ in others)  # every other block is dimmed
    assert b.evaluate(f"getComputedStyle(document.getElementById('{anchor}')).backgroundColor") != \
        b.evaluate("getComputedStyle(document.querySelector('tr.site:not(:target)')).backgroundColor")

    # clicking a block in the map selects its own site
    other = next(site for site, _, _ in after if site != anchor)
    x, y = b.evaluate(f"""(() => {{ const e = document.querySelector('svg .blk[data-site="{other}"]');
        e.scrollIntoView({{block: 'center'}}); const q = e.getBoundingClientRect();
        return [q.x + Math.min(q.width / 2, 2), q.y + q.height / 2]; }})()""")
    b.click(x, y)
    assert b.evaluate("location.hash") == f"#{other}"
    assert all(o == "1" for site, o, _ in _styles(b, "svg .blk") if site == other)
    assert b.errors() == []


def test_the_fetch_check_sees_a_remote_image(browser, tmp_path):
    """Negative control: a page that does fetch something is caught by the same check."""
    page = tmp_path / "remote.html"
    page.write_text('<!DOCTYPE html><html><body><img src="http://198.51.100.1/x.png"></body></html>')
    browser.events.clear()
    browser.call("Page.navigate", session=True, url=page.as_uri())  # not waiting for a load that may hang
    url = "http://198.51.100.1/x.png"
    while url not in browser.requested_urls():  # the request is reported before it is sent
        browser.wait_event("Network.requestWillBeSent")
        browser.events = [e for e in browser.events if e.get("method") != "Network.requestWillBeSent"
                          or e["params"]["request"]["url"] == url]
    assert url in browser.requested_urls()
    browser.open("about:blank")  # leave the fetch behind: the next page starts clean
    browser.events.clear()


def test_the_report_page_renders_its_figures_and_fetches_nothing(browser, traces_dir, tmp_path):
    """`alloctune report` of three real recordings and a tune store: self-contained HTML (no script, no link, no
    remote reference, one embedded image per figure) that draws its reserved/allocated figures on screen."""
    from PIL import Image

    from alloctune.report import build_report, write_report
    from alloctune.report.style import ALLOCATED, RESERVED

    gib = 1 << 30
    store = tmp_path / "store.jsonl"
    store.write_text("".join(json.dumps(r) + "\n" for r in (
        {"config": "", "budget": 2 * gib, "outcome": "ok", "peak_reserved": 1918894080, "peak_allocated": 1498742272},
        {"config": "expandable_segments:True", "budget": 1631059968, "outcome": "ok", "peak_reserved": 1535115264,
         "peak_allocated": 1422531072})))
    inputs = [traces_dir / "rvc_ec1" / f"{n}.pickle.xz" for n in ("default", "max_split_128", "default_cap85")]
    written = write_report(build_report([*inputs, store], title="render check"), tmp_path / "report")
    html = Path(written.html).read_text()
    assert re.findall(r"""(?:src|href)\s*=\s*["']?\s*((?:https?:)?//[^"'\s>]+)""", html, re.I) == []
    assert "<script" not in html.lower() and "<link" not in html.lower()
    assert len(re.findall(r'src="data:image/png;base64,', html)) == len(written.figures) > 0

    page = Path(written.html).resolve().as_uri()
    browser.events.clear()  # what earlier pages reported
    browser.open(page)
    assert browser.errors() == []
    assert [u for u in browser.requested_urls() if not u.startswith("data:image/png;")] == [page]  # embedded only
    img = Image.open(io.BytesIO(browser.screenshot(full_page=True))).convert("RGB")
    colors = dict((rgb, n) for n, rgb in img.getcolors(maxcolors=1 << 20) or [])
    for hex_color in (RESERVED, ALLOCATED):
        want = tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
        near = sum(n for rgb, n in colors.items() if sum(abs(a - b) for a, b in zip(rgb, want)) <= 24)
        assert near > 2000, f"{hex_color} hardly on screen ({near} px)"
