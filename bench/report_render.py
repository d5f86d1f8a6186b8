"""Open `alloctune report`'s HTML in headless Chromium: it renders, shows its figures, fetches nothing.

Run from the repo root: `.venv/bin/python bench/report_render.py [--out DIR] [--no-results]`.
Needs Debian's `chromium` (`apt-get install -y chromium`) and the shared traces in
../shared/traces. Steps:

1. build a report from three shared traces (uncapped default, max_split_size_mb:128, and the
   capped run with an OOM) plus a small tune store;
2. static check of the HTML: no http(s) or protocol-relative URL in any src/href, no script,
   no <link>, one data: image per figure;
3. Chromium (headless, fresh profile, background networking off) loads it with a net log and
   takes a screenshot: the page must not be blank, the figures' colours must be on screen,
   and the net log must hold no http(s) request;
4. negative control: the same check on a copy with one remote image must report the request
   (so a clean result means something);
5. prints a table and logs the result to bench/results/LOG.md.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runlog import log_result
from suite import SHARED as TRACES

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-default-apps",
    "--hide-scrollbars",
]
FIGURE_RGB = {"orange (reserved)": (0xDD, 0x6B, 0x20), "blue (allocated)": (0x2B, 0x6C, 0xB0)}


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("chromium not found: apt-get update && apt-get install -y chromium")


def static_check(html: str) -> dict:
    remote = re.findall(r"""(?:src|href)\s*=\s*["']?\s*((?:https?:)?//[^"'\s>]+)""", html, re.I)
    return {
        "remote_refs": len(remote),
        "scripts": html.lower().count("<script"),
        "links": html.lower().count("<link"),
        "data_images": len(re.findall(r'src="data:image/png;base64,', html)),
    }


def render(chromium: str, html_path: Path, shot: Path, netlog: Path, height: int) -> float:
    profile = Path(tempfile.mkdtemp(prefix="alloctune-chromium-"))
    cmd = [chromium, *FLAGS, f"--user-data-dir={profile}", f"--window-size=1280,{height}",
           f"--screenshot={shot}", f"--log-net-log={netlog}", "--net-log-capture-mode=Default",
           html_path.resolve().as_uri()]
    t0 = time.monotonic()
    try:
        subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if not shot.is_file():
        sys.exit(f"chromium wrote no screenshot; command: {' '.join(cmd)}")
    return time.monotonic() - t0


def network_requests(netlog: Path) -> tuple[list[str], list[str]]:
    """(page, browser) http(s) URLs whose request started, from Chromium's net log.

    A request made for the page carries the page's network isolation key (`file://`); the
    browser's own background traffic (update checks, time sync) has none of it and is listed
    separately: it is not something the report asked for.
    """
    if not netlog.is_file():
        return [], []
    data = json.loads(netlog.read_text(errors="replace"))
    start = data["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    page, browser = set(), set()
    for ev in data.get("events", []):
        if ev.get("type") != start:
            continue
        params = ev.get("params") or {}
        url = str(params.get("url", ""))
        if not re.match(r"https?://", url):
            continue
        (page if "file://" in str(params.get("network_isolation_key", "")) else browser).add(url.split("?")[0])
    return sorted(page), sorted(browser)


def _hosts(urls: list[str]) -> list[str]:
    return sorted({u.split("/")[2] for u in urls})


def pixels(shot: Path) -> dict:
    import numpy as np
    from matplotlib.image import imread

    img = imread(str(shot))[..., :3]
    rgb = (img * 255).round().astype(int) if img.dtype != np.uint8 else img.astype(int)
    not_white = float((rgb.sum(axis=2) < 3 * 245).mean())
    counts = {}
    for name, color in FIGURE_RGB.items():
        counts[name] = int((np.abs(rgb - np.array(color)).sum(axis=2) <= 24).sum())
    return {"size": f"{rgb.shape[1]}x{rgb.shape[0]}", "not_white": not_white, **counts}


def tune_store(path: Path) -> Path:
    gib = 1 << 30
    recs = [
        {"config": "", "budget": 2 * gib, "outcome": "ok", "peak_reserved": 1918894080, "peak_allocated": 1498742272},
        {"config": "", "budget": 1631059968, "outcome": "ok", "peak_reserved": 1606418432, "peak_allocated": 1422531072},
        {"config": "expandable_segments:True", "budget": 1631059968, "outcome": "ok", "peak_reserved": 1535115264,
         "peak_allocated": 1422531072},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="alloctune-render-")))
    ap.add_argument("--no-results", action="store_true", help="do not log the result (bench/results/LOG.md)")
    args = ap.parse_args()
    from alloctune.report import build_report, write_report

    chromium = find_chromium()
    version = subprocess.run([chromium, "--version"], capture_output=True, text=True).stdout.strip()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    inputs = [TRACES / "rvc_ec1" / f"{n}.pickle.xz" for n in ("default", "max_split_128", "default_cap85")]
    inputs.append(tune_store(out / "store.jsonl"))
    t0 = time.monotonic()
    written = write_report(build_report(inputs, title="alloctune render check"), out / "report")
    build_s = time.monotonic() - t0
    html_path = Path(written.html)
    html = html_path.read_text()
    static = static_check(html)

    shot = out / "screenshot.png"
    render_s = render(chromium, html_path, shot, out / "netlog.json", 9000)
    requests, background = network_requests(out / "netlog.json")
    px = pixels(shot)

    # Negative control: a remote image must show up in both checks.
    bad = out / "report" / "control.html"
    bad.write_text(html.replace("<body>", '<body><img src="http://127.0.0.1:9/x.png" alt="remote">', 1))
    control_static = static_check(bad.read_text())
    render(chromium, bad, out / "control.png", out / "control-netlog.json", 800)
    control_requests, _ = network_requests(out / "control-netlog.json")

    checks = {
        "no remote src/href": static["remote_refs"] == 0,
        "no script/link": static["scripts"] == 0 and static["links"] == 0,
        "one data: image per figure": static["data_images"] == len(written.figures),
        "not blank (>5% non-white)": px["not_white"] > 0.05,
        "figures on screen": all(px[k] > 2000 for k in FIGURE_RGB),
        "page made no http(s) request": not requests,
        "control caught (static)": control_static["remote_refs"] == 1,
        "control caught (net log)": any("127.0.0.1:9" in u for u in control_requests),
    }
    rows = [
        ("chromium", version),
        ("report", f"{html_path} ({html_path.stat().st_size // 1024} KiB, {len(written.figures)} figures, "
                   f"built in {build_s:.1f} s)"),
        ("screenshot", f"{shot} {px['size']}, {px['not_white']:.1%} non-white, "
                       + ", ".join(f"{k} {px[k]} px" for k in FIGURE_RGB) + f", rendered in {render_s:.1f} s"),
        ("net log: page requests", f"{len(requests)} http(s)" + (f": {requests[:3]}" if requests else "")),
        ("net log: browser's own", f"{len(background)} (Chromium background: {', '.join(_hosts(background))})"),
        ("control", f"static {control_static['remote_refs']} remote ref, page requests {control_requests}"),
    ] + [(name, "PASS" if ok else "FAIL") for name, ok in checks.items()]
    width = max(len(k) for k, _ in rows)
    table = "\n".join(f"| {k.ljust(width)} | {v} |" for k, v in rows)
    print(table)
    ok = all(checks.values())
    print("ALL PASS" if ok else "SOME CHECKS FAILED")
    if not args.no_results:
        log_result(f"self-contained HTML report rendered in headless Chromium: {sum(checks.values())}/{len(checks)} "
                   f"checks pass ({'all' if ok else 'SOME FAILED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
