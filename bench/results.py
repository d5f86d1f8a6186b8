"""Build the one results file, `bench/results/RESULTS.md`, from the bench outputs in `bench/results/`.

README and docs link this file instead of restating figures, so a figure is written once, by
the script that measured it. Each bench writes `bench/results/NAME.md` (its table) and
`NAME.json` (its rows, with a `schema`); this script reads every such pair it knows, puts the
headline figures first with the command that produced them, and links each full table.

    python bench/results.py [--dir bench/results]

Benches with a JSON reader in `READERS` get their headline figures here; every other table in the
folder is listed by its own first line with a link, so nothing measured is left out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]


def _capped(f: dict[str, Any]) -> str:
    if not f["capped"]:
        return ""
    return f"; capped runs fail at the recorded first request in **{f['capped_first_failure']}/{f['capped']}**"


def _fidelity(d: dict[str, Any]) -> list[str]:
    s = d["summary"]
    rp, pr, md = s["replay"], s["prediction from one recording"], s["prediction with modelled addresses"]
    out = [
        f"- replay (own stream, own addresses): **{rp['exact']}/{rp['rows']} exact**",
        f"- prediction from one recording: **{pr['uncapped_exact']}/{pr['uncapped']} exact** without a recorded failure"
        + _capped(pr),
        f"- prediction with modelled addresses: **{md['uncapped_exact']}/{md['uncapped']} exact**" + _capped(md),
    ]
    if s.get("min_budget", {}).get("rows"):
        out.append(f"- min budget, own stream vs default's: **{s['min_budget']['agree']}/{s['min_budget']['rows']} agree**")
    g = s.get("measured_min_budget") or {}
    if g.get("rows"):
        out.append(f"- min budget simulated vs bisected on the GPU: brackets overlap in **{g['overlap']}/{g['rows']}**, "
                   f"simulated ÷ measured {g['ratio_min']:.3f}–{g['ratio_max']:.3f}")
    return out


def _empty_cache(d: dict[str, Any]) -> list[str]:
    rows = d["rows"]
    counted = [r for r in rows if r.get("known_calls") is not None]
    right = sum(r["limit_aware"] == r["known_calls"] for r in counted)
    marked = [r for r in rows if "marked_calls" in r]
    out = [f"- inferred call count right in **{right}/{len(counted)}** recordings with known counts"]
    if marked:
        tot = sum(r["marked_calls"] for r in marked)
        out.append(f"- agent-marked calls placed right by inference: **{sum(r['positions_right_aware'] for r in marked)}"
                   f"/{tot}**, calls inferred that the program never made: {sum(r['extra_aware'] for r in marked)}")
    return out


def _diagnose_speed(d: dict[str, Any]) -> list[str]:
    out = []
    for r in d["rows"]:
        if r["mode"] in ("--json", "terminal (to a file)", "--json from stdin"):
            out.append(f"- {r['log']}, {r['mode']}: **{r['mb_per_s']:.1f} MB/s**, peak {r['peak_rss_mb']:.0f} MB, "
                       f"output {r['output_bytes']:,} B ({r['found']:,} messages)")
    if d.get("linearity"):
        out.append("- linearity (1.0 = linear): " + ", ".join(f"{m} {v}" for m, v in d["linearity"].items()))
    for s in d.get("snapshots", []):
        out.append(f"- snapshot {s['snapshot']}: safe first load **{s['safe_cpu_x']:.2f}x** the CPU time of plain "
                   f"pickle.load ({s['safe_wall_x']:.2f}x wall, {s['safe_mem_x']:.2f}x memory); scan + load "
                   f"{s['scan_cpu_x']:.2f}x")
    return out


READERS: dict[str, tuple[str, Callable[[dict[str, Any]], list[str]]]] = {
    "alloctune.bench.diagnose_speed/1": ("diagnose speed", _diagnose_speed),
    "alloctune.bench.fidelity/2": ("Simulator fidelity", _fidelity),
    "alloctune.bench.empty_cache/1": ("empty_cache() inference", _empty_cache),
}


def build(folder: Path) -> str:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# alloctune — measured results", "",
             f"Generated {stamp} by `python bench/results.py` from the bench outputs in this folder; every figure "
             "links to the table and command that produced it. Do not edit by hand: re-run the bench, then this.", ""]
    covered = {"RESULTS.md"}
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        reader = READERS.get(data.get("schema", "")) if isinstance(data, dict) else None
        if reader is None:
            continue
        title, fn = reader
        table = path.with_suffix(".md")
        source = data.get("traces") or ""
        lines.append(f"## {title}: {path.stem}" + (f" — {source}" if source else ""))
        lines.append("")
        if data.get("command"):
            lines.append(f"`{data['command']}`" + (f" ({data['generated']})" if data.get("generated") else ""))
            lines.append("")
        lines += fn(data)
        if table.is_file():
            covered.add(table.name)
            lines += ["", f"Full table: [{table.name}]({table.name})"]
        lines.append("")
    others = [p for p in sorted(folder.glob("*.md")) if p.name not in covered]
    if others:
        lines += ["## Other measurements", ""]
        for p in others:
            head = next((ln.lstrip("# ").strip() for ln in p.read_text().splitlines() if ln.strip()), p.stem)
            lines.append(f"- [{p.name}]({p.name}): {head}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    folder = Path(args.dir)
    if not folder.is_dir():
        print(f"results: error: no folder {folder}", file=sys.stderr)
        return 2
    out = folder / "RESULTS.md"
    out.write_text(build(folder))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
