"""`explain --html`: one self-contained page (no network), well-formed, with the charts and tables."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from cli_run import run_cli
from explain_programs import training_loop, write


class _Check(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.tags: dict[str, int] = {}
        self.external: list[str] = []
        self.site_rows = 0

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        a = dict(attrs)
        for k in ("src", "href"):
            if a.get(k):
                self.external.append(a[k])
        if tag == "tr" and "site-row" in (a.get("class") or ""):
            self.site_rows += 1
        if tag not in ("meta", "line", "circle", "rect", "polyline", "br", "i"):
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in ("meta", "line", "circle", "rect", "polyline", "br", "i"):
            return
        assert self.stack and self.stack[-1] == tag, (self.stack[-3:], tag)
        self.stack.pop()


def test_the_page_is_self_contained_and_complete(tmp_path, capsys):
    snap, _ = training_loop(keep_logits=True)
    path = write(snap, tmp_path / "leak.pickle")
    page = tmp_path / "explain.html"
    code, _, err = run_cli(capsys, "explain", str(path), "--html", str(page))
    assert code == 0, err
    text = page.read_text()
    p = _Check()
    p.feed(text)
    p.close()
    assert not p.external  # nothing fetched
    assert not re.search(r"https?://", text)
    assert p.tags.get("svg", 0) >= 4 and p.tags.get("polyline", 0) >= 3 and p.site_rows >= 3
    assert "the moment explained" in text and "train.py:22" in text and "alloctune simulate" in text
    # every category that holds bytes is drawn, with its bytes in the hover text
    for name in ("model_state", "gradients", "optimizer_state", "growing", "inactive_split"):
        assert f"<title>{name}: " in text


def test_in_a_real_headless_browser(tmp_path, capsys):
    """Chromium (when installed) loads the page without a console error, draws it, and highlights
    the site the URL names (the same function a click calls)."""
    import shutil
    import subprocess

    import pytest

    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no Chromium here")
    snap, _ = training_loop(keep_logits=True)
    path = write(snap, tmp_path / "leak.pickle")
    page = tmp_path / "explain.html"
    code, _, err = run_cli(capsys, "explain", str(path), "--html", str(page), "--no-what-if")
    assert code == 0, err
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run(flags + ["--dump-dom", page.as_uri() + "#site=0"], capture_output=True, text=True,
                         timeout=120)
    assert "CONSOLE" not in dom.stderr and "Uncaught" not in dom.stderr, dom.stderr[-2000:]
    assert re.search(r'class="site s0 hl"', dom.stdout) and re.search(r'class="site s1 dim"', dom.stdout)
    shot = tmp_path / "page.png"
    subprocess.run(flags + [f"--screenshot={shot}", "--window-size=1280,1200", page.as_uri()], capture_output=True,
                   timeout=120)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a drawn page, not a blank one
