"""Write the explain page of a real recording and screenshot it in headless Chromium.

    PYTHONPATH=src python docs/images/make_explain_screenshot.py \
        tests/data/explain_gpu/convnext_leak.pickle.xz docs/images/explain-convnext-leak.png

The growing site is clicked first, so the picture shows its blocks highlighted in the map. The
PNG is reduced to a 256-colour palette to stay small (Pillow).
"""

from __future__ import annotations

import io
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from browser_cdp import Browser, find_browser  # noqa: E402


def main(recording: str, out: str) -> None:
    from PIL import Image

    from alloctune.report.explain_html import write_explain_html

    exe = find_browser()
    if exe is None:
        raise SystemExit("no Chromium found (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "explain.html"
        write_explain_html(recording, page)
        with Browser(exe, width=1280, height=900) as b:
            b.open(page.as_uri())
            if b.errors():
                raise SystemExit(f"the page reported errors: {b.errors()}")
            anchor = b.evaluate("""(() => { const r = [...document.querySelectorAll('tr.site')]
                .find(r => r.textContent.includes('/rep')); return r ? r.id : null; })()""")
            if anchor:
                x, y = b.evaluate(f"""(() => {{ const a = document.querySelector('a[href="#{anchor}"]');
                    a.scrollIntoView({{block: 'center'}}); const q = a.getClientRects()[0];
                    return [q.x + q.width / 2, q.y + q.height / 2]; }})()""")
                b.click(x, y)
                b.evaluate("window.scrollTo(0, 0)")
            png = b.screenshot(full_page=True)
    img = Image.open(io.BytesIO(png)).convert("RGB").quantize(256, dither=Image.Dither.NONE)
    img.save(out, optimize=True)
    print(f"{out}: {img.width}x{img.height}, {Path(out).stat().st_size} bytes")


if __name__ == "__main__":
    main(*sys.argv[1:3])
