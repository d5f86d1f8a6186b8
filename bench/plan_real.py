"""Capacity planning against the GPU: predicted vs real largest input size, and held-back fits.

Reads the lead's H200 recordings (`bench/gpu-results/batch8`, README there): `a/size_{rvc,timm,llama}_{S}`
(one item of size S per fresh process, default setting, uncapped, recorded) and
`b/bisect_results.json` (`plan_{workload}_{setting}_{c1,c2}`: the REAL largest size that
completes under cap c1 / c2, by bisection on a 2 % size grid with fresh processes).

For each workload it prints and writes to `bench/results/plan.md`:
1. the held-back check: for every recorded size, a trace set fitted on the *other* sizes
   generates the stream at that size; its simulated peak reserved vs the GPU's peak
   (target: within 1 %), and vs the simulator replaying the recording itself (the fit's
   own error, without the simulator's address model);
2. predicted vs real largest size under each cap and setting, searched over the same range
   as the real bisection (smallest..largest recorded size, step 1): a hit when the
   prediction is within one step of the real 2 % grid;
3. the wall time of the full plan, and the RVC chunk table for 4/6/8/12/24 GB cards.

Usage: python bench/plan_real.py [--data bench/gpu-results/batch8] [--out bench/results/plan.md]
Pure CPU; no GPU needed (the GPU work is the recordings).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from alloctune.plan.answer import plan  # noqa: E402
from alloctune.plan.holdout import holdout  # noqa: E402
from alloctune.plan.rvc import rvc_rows  # noqa: E402
from alloctune.plan.traceset import build  # noqa: E402
from alloctune.trace.load import load_trace  # noqa: E402
from alloctune.units import format_size  # noqa: E402

WORKLOADS = {"rvc": "audio seconds (one unsplit file)", "timm": "image side (resnet50, batch 4)",
             "llama": "prompt tokens (batch 1, 32 new)"}
SETTINGS = {"default": "", "expandable": "expandable_segments:True"}
GiB = 1 << 30


def recordings(data: Path, workload: str) -> list[tuple[str, object]]:
    found = []
    for p in data.glob(f"a/size_{workload}_*.pickle.xz"):
        m = re.fullmatch(rf"size_{workload}_(\d+(?:\.\d+)?)\.pickle\.xz", p.name)
        if m:
            found.append((m.group(1), p))
    found.sort(key=lambda t: float(t[0]))
    return [(s, load_trace(p)) for s, p in found]


def real_ooms(data: Path, key: str, size: float) -> int | None:
    """OOMs the real run at `size` caught and survived (cuDNN workspace fallbacks), from its step sidecar."""
    for p in sorted(data.glob(f"b/{key}_*.json")):
        d = json.loads(p.read_text())
        nums = re.findall(r"(?:--size|--max-seconds)\s+(\d+(?:\.\d+)?)", str(d.get("workload", "")))
        if nums and float(nums[-1]) == float(size):
            return int((d.get("stats") or {}).get("num_ooms", 0))
    return None


def probe_agreement(data: Path, w: str, ts) -> list[str]:  # noqa: ANN001
    """Every real fresh-process run of the size bisections, replayed from the generated stream at its
    size, setting and cap: does the simulation call it the same (completes / OOM), and at an OOM, is
    the peak reserved the same? Runs that survived OOMs (workspace fallbacks) are counted apart."""
    from alloctune.sim.replay import replay

    rows = []
    for p in sorted(data.glob(f"b/plan_{w}_*_*.json")):
        d = json.loads(p.read_text())
        nums = re.findall(r"(?:--size|--max-seconds)\s+(\d+(?:\.\d+)?)", str(d.get("workload", "")))
        if not nums or not d.get("cap"):
            continue
        size = nums[-1]
        r = replay(ts.generate(size).trace, d.get("conf") or "", budget=int(d["cap"]), record_events=False,
                   timeline_points=1)
        real_ok = d.get("outcome") == "ok"
        stats = d.get("stats") or {}
        survived = real_ok and int(stats.get("num_ooms", 0)) > 0
        same_peak = (not real_ok and not r.completed and r.peak_reserved == stats.get("reserved_bytes.all.peak"))
        rows.append((real_ok == r.completed, survived, same_peak, real_ok))
    if not rows:
        return []
    plain = [r for r in rows if not r[1]]
    ooms = [r for r in rows if not r[3]]
    return ["", f"Every real run of the size bisections ({len(rows)} fresh processes) replayed from the generated "
            f"stream at its size, setting and cap: the simulation agrees on completes/OOM for "
            f"{sum(r[0] for r in plain)}/{len(plain)} runs that did not survive an OOM, and "
            f"{sum(r[0] for r in rows if r[1])}/{len(rows) - len(plain)} of those that did (workspace fallbacks, "
            f"not modelled); of the {len(ooms)} real OOMs, {sum(r[2] for r in ooms)} end at exactly the real peak "
            "reserved, byte for byte."]


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2%}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="bench/gpu-results/batch8")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "plan.md"))
    args = ap.parse_args()
    data = Path(args.data)
    real = {r["name"]: r for r in json.loads((data / "b" / "bisect_results.json").read_text())}
    lines = [f"# Capacity planning vs the GPU ({datetime.date.today()}, `bench/plan_real.py`)", "",
             f"Data: `{data}` (H200, torch 2.11; README there). Prediction: alloctune's simulator replaying streams "
             "generated from the size-parametric trace; no GPU involved.", ""]
    summary = []
    for w, unit in WORKLOADS.items():
        recs = recordings(data, w)
        if len(recs) < 3:
            lines += [f"## {w}: fewer than three recordings, skipped", ""]
            continue
        sizes = [s for s, _ in recs]
        t0 = time.perf_counter()
        ts = build(recs, meta={"workload": w})
        build_s = time.perf_counter() - t0
        lines += [f"## {w} — size = {unit}", "",
                  f"Recorded sizes: {', '.join(sizes)}; {len(ts.variants[0].ops)} requests; laws "
                  f"{json.dumps(ts.summary()['laws'])}; structures: "
                  + "; ".join(f"[{', '.join(v['sizes'])}]" for v in ts.summary()["variants"]), "",
                  "### Held-back fit (fit on the other sizes, generate this one)", "",
                  "| size | fitted on | same structure | sizes exact | peak generated | peak on GPU | error vs GPU "
                  "| error vs replay of the recording | within 1 % |", "|---|---|---|---|---|---|---|---|---|"]
        for s in sizes:
            h = holdout(recs, s)
            ok = h.error_vs_real is not None and abs(h.error_vs_real) <= 0.01
            exact = "n/a" if h.sizes_exact is None else f"{h.sizes_exact:.1%}"
            lines.append(f"| {s}{' (extrapolated)' if h.extrapolated else ''} | {', '.join(h.fitted_on)} | "
                         f"{'yes' if h.same_structure else 'no'} | {exact} | {format_size(h.peak_generated)} | "
                         f"{format_size(h.peak_real) if h.peak_real else 'n/a'} | {pct(h.error_vs_real)} | "
                         f"{pct(h.error_vs_replay)} | {'yes' if ok else 'NO'} |")
            summary.append(("holdout", w, s, ok, h.extrapolated))
        caps = sorted({r["cap"] for k, r in real.items() if k.startswith(f"plan_{w}_")})
        t0 = time.perf_counter()
        res = plan(ts, confs=list(SETTINGS.values()), caps=caps, max_size=sizes[-1], curve=[sizes[0], sizes[-1]])
        plan_s = time.perf_counter() - t0
        lines += ["", "### Largest size under a cap: predicted vs real (fresh processes, 2 % grid)", "",
                  "| setting | cap | predicted largest (conservative) | optimistic (workspaces fallible) | real largest ok "
                  "| real smallest fail | OOMs the real run survived at its largest ok | grid step | conservative within "
                  "one step | real inside [conservative, optimistic] ± one step |", "|---|---|---|---|---|---|---|---|---|---|"]
        for (name, conf), sp in zip(SETTINGS.items(), res.settings):
            for item in sp.largest:
                key = next((k for k, r in real.items() if k.startswith(f"plan_{w}_{name}_")
                            and r["cap"] == item.target.bytes), None)
                if key is None:
                    continue
                r = real[key]
                pred = None if item.largest is None else float(item.largest)
                lo, hi = r["largest_ok"], r["smallest_fail"]
                step = (hi - lo) if hi is not None else max(1.0, 0.02 * lo)
                if pred is None:
                    hit = False
                elif hi is None:
                    hit = pred >= lo - step
                else:
                    hit = lo - step <= pred <= hi + step - 1e-9 and (item.first_failing is not None or pred >= lo)
                survived = real_ooms(data, key, lo)
                why = "" if hit else (" (the real run survived OOMs: workspace fallbacks)" if survived else "")
                top = float(item.optimistic) if item.optimistic is not None else pred
                inside = pred is not None and pred - step <= lo and (hi is None or lo <= top + step)
                if hi is None and pred is not None:
                    inside = top >= lo - step
                again = f" (bisection alone: {item.completes_again})" if item.completes_again else ""
                lines.append(f"| {name} | {format_size(item.target.bytes)} | {item.largest or 'none'}"
                             f"{' (all fit)' if item.first_failing is None else ''}{again} | {item.optimistic or '—'} | "
                             f"{lo} | {hi if hi else '—'} | {survived if survived is not None else 'n/a'} | "
                             f"{step:g} | {'yes' if hit else 'NO' + why} | {'yes' if inside else 'NO'} |")
                summary.append(("largest", w, f"{name}/{format_size(item.target.bytes)}", hit, inside))
        lines += probe_agreement(data, w, ts)
        lines += ["", f"Wall time: building the trace set {build_s:.2f} s; the plan (2 settings x {len(caps)} caps, "
                  f"bisection on size, min budget at 2 sizes) {plan_s:.2f} s, {res.replays} simulated replays "
                  f"({plan_s / max(1, res.replays) * 1000:.1f} ms each). Notes: " + " ".join(res.notes), ""]
        if w == "rvc":
            cards = [4 * GiB, 6 * GiB, 8 * GiB, 12 * GiB, 24 * GiB]
            t0 = time.perf_counter()
            rv = plan(ts, confs=list(SETTINGS.values()), cards=cards, max_size=120, curve=[sizes[-1]])
            rv_s = time.perf_counter() - t0
            lines += ["### RVC: longest unsplit audio per card vs RVC's chunk presets", "",
                      "Search up to 120 s of one unsplit file (RVC itself splits above 65 s; beyond the recorded 60 s "
                      "the stream is extrapolated). Chunk = audio + 2 x 3 s padding + 10 ms. "
                      "Card = total memory with a 518 MiB CUDA context (the H200's; smaller cards' contexts differ).",
                      "", "| setting | card | RVC preset | preset's longest chunk s | fits audio s | fits chunk s | verdict |",
                      "|---|---|---|---|---|---|---|"]
            for r in rvc_rows(rv):
                lines.append(f"| {r.conf or '(unset)'} | {r.target} | {r.preset} | {r.preset_chunk_s:g} | "
                             f"{r.fits_audio_s if r.fits_audio_s is not None else '-'} | "
                             f"{r.fits_chunk_s if r.fits_chunk_s is not None else '-'} | {r.verdict} |")
            lines += ["", f"RVC card plan: {rv_s:.2f} s, {rv.replays} replays.", ""]
    held = [s for s in summary if s[0] == "holdout"]
    inside = [s for s in held if not s[4]]
    big = [s for s in summary if s[0] == "largest"]
    lines += ["## Summary", "",
              f"- held-back peak within 1 %: {sum(s[3] for s in inside)}/{len(inside)} inside the fitted range, "
              f"{sum(s[3] for s in held) - sum(s[3] for s in inside)}/{len(held) - len(inside)} extrapolated",
              f"- predicted (conservative) largest size within one 2 % grid step of the real one: "
              f"{sum(s[3] for s in big)}/{len(big)}",
              f"- real largest size inside [conservative, optimistic] (± one step): {sum(s[4] for s in big)}/{len(big)}",
              ""]
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runlog import log_results

    log_results(lines[lines.index("## Summary") + 2:], folder=out.parent)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
