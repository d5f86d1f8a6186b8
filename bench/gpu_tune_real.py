"""`alloctune tune` (the default confirm flow) on real-library workloads and the project's own.

For each workload command it runs `alloctune tune --json` in a fresh store and reports the
GPU runs it used (after the one recorded baseline), its wall time against one run of the
workload (the baseline trial's wall time), the recommendation, and the recommended
setting's simulated and measured min_budget (measured = a tested pass; `verified` = with a
tested failure within 1 % below it). The tunes run side by side (`--jobs`, default all) so
the whole bench fits in a few minutes on one H200: the caps are per process, so memory
results are unaffected, but throughput is measured under load (no throughput claim is
made from this bench).

On the device (writes to $OUT: summary.json, summary.md, logs.tar.gz):

    python bench/gpu_tune_real.py

Afterwards, on any machine, against the independent bisection (fresh processes, 6 steps):

    python bench/gpu_tune_real.py --compare bench/gpu-results/batch8/b/bisect_results.json --summary DIR/summary.json

(rvc and diffusion were bisected with --count 2 / --count 3 but are tuned here with
--count 4, so their rows are compared only where the bisection measured the same command.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
WORKLOADS: dict[str, list[str]] = {
    "hubert": [PY, "bench/real_workloads.py", "hubert"],
    "timm": [PY, "bench/real_workloads.py", "timm"],
    "torchvision": [PY, "bench/real_workloads.py", "torchvision"],
    "llama": [PY, "bench/real_workloads.py", "llama"],
    "rvc": [PY, "-m", "alloctune.workloads.rvc", "--count", "4"],
    "diffusion": [PY, "-m", "alloctune.workloads.diffusion", "--count", "4"],
}
# The bisection's command for each name (bench/gpu_batch_a.py); None = not the same command.
BISECTED_SAME = {"hubert": True, "timm": True, "torchvision": True, "llama": True, "rvc": False, "diffusion": False}
MiB = 1 << 20


def run_all(names: list[str], out: Path, jobs: int, timeout: float, on_row=None) -> list[dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("COLUMNS", "100")
    pending = list(names)
    running: dict[str, tuple[subprocess.Popen, float, Path, list]] = {}
    rows = []
    while pending or running:
        while pending and len(running) < jobs:
            name = pending.pop(0)
            d = out / name
            d.mkdir(parents=True, exist_ok=True)
            cmd = [PY, "-m", "alloctune", "tune", "--json", "--store", str(d / "trials.jsonl"), "--", *WORKLOADS[name]]
            so, se = (d / "tune.json").open("w"), (d / "tune.stderr").open("w")
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=so, stderr=se, start_new_session=True)
            running[name] = (proc, time.monotonic(), d, [so, se])
            print(f"started {name}: {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
        for name, (proc, t0, d, files) in list(running.items()):
            rc = proc.poll()
            if rc is None and time.monotonic() - t0 > timeout:
                os.killpg(proc.pid, 2)  # Ctrl-C: the tune keeps its store and prints what it has
                try:
                    rc = proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, 9)
                    rc = proc.wait()
            if rc is None:
                continue
            del running[name]
            for f in files:
                f.close()
            wall = time.monotonic() - t0
            rows.append(summarize(name, d, rc, wall))
            print(f"finished {name}: rc={rc} in {wall:.0f} s", file=sys.stderr, flush=True)
            if on_row is not None:
                on_row(rows)
        time.sleep(0.5)
    return sorted(rows, key=lambda r: names.index(r["workload"]))


def summarize(name: str, d: Path, rc: int, wall: float) -> dict:
    row: dict = {"workload": name, "command": WORKLOADS[name][1:], "rc": rc, "wall_s": round(wall, 1)}
    try:
        data = json.loads((d / "tune.json").read_text())
    except (OSError, ValueError):
        tail = (d / "tune.stderr").read_text(errors="replace").strip().splitlines()[-3:]
        row["error"] = " | ".join(tail) or "no JSON output"
        store = d / "trials.jsonl"
        if store.exists():  # an interrupted tune: its trials are still in the store (in logs.tar.gz)
            row["trials_in_store"] = sum(1 for line in store.read_text().splitlines() if '"kind":"trial"' in line.replace(' ', ''))
        return row
    trials = data["trials"]
    base = trials[0] if trials else {}
    best = (data.get("ranking") or {}).get("best") or {}
    row.update({
        "gpu_runs_after_baseline": data.get("gpu_runs_after_baseline"),
        "trials": data.get("trial_count"),
        "baseline_wall_s": base.get("wall_s"),
        "wall_over_one_run": round(wall / base["wall_s"], 2) if base.get("wall_s") else None,
        "recommendation": (data.get("recommendation") or {}).get("conf"),
        "summary": (data.get("recommendation") or {}).get("summary"),
        "best": best.get("conf"),
        "sim_min_budget": best.get("sim_min_budget"),
        "min_budget": best.get("min_budget"),
        "infeasible_below": best.get("infeasible_below"),
        "verified": best.get("verified"),
        "sim_agrees": best.get("sim_agrees"),
        "notes": data.get("notes"),
        "candidates": [
            {k: c.get(k) for k in ("conf", "sim_min_budget", "min_budget", "infeasible_below", "verified", "trials", "note")}
            for c in data.get("candidates", [])
        ],
        "probes": [(t.get("conf"), t.get("budget"), t.get("outcome"), t.get("num_ooms")) for t in trials[1:]],
    })
    return row


def _mib(x) -> str:
    return "-" if x is None else f"{x / MiB:.0f}"


def table(rows: list[dict]) -> str:
    lines = ["| workload | GPU runs after baseline | wall s | × one run | recommended | simulated MiB | measured MiB "
             "(fails at) | verified |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['workload']} | - | {r['wall_s']} | - | error: {r['error'][:80]} | | | |")
            continue
        lines.append(
            f"| {r['workload']} | {r['gpu_runs_after_baseline']} | {r['wall_s']} | {r['wall_over_one_run']} | "
            f"{'none' if r['recommendation'] is None else (r['recommendation'] or '(default)')} | "
            f"{_mib(r['sim_min_budget'])} | "
            f"{_mib(r['min_budget'])} ({_mib(r['infeasible_below'])}) | {r['verified']} |")
    return "\n".join(lines)


def compare(summary: Path, bisect: Path) -> str:
    rows = json.loads(summary.read_text())["rows"]
    real = {r["name"]: r for r in json.loads(bisect.read_text()) if "min_budget" in r}
    names = {"": "default", "expandable_segments:True": "expandable", "max_split_size_mb:128": "max_split_128"}
    out = ["| workload | tune: recommended, measured MiB | bisection: that setting MiB | bisection: best setting, MiB | "
           "tune vs best | GPU runs |", "|---|---|---|---|---|---|"]
    for r in rows:
        wl = r["workload"]
        if "error" in r or not BISECTED_SAME.get(wl):
            out.append(f"| {wl} | {r.get('recommendation')} {_mib(r.get('min_budget'))} | (not the same command) | | | "
                       f"{r.get('gpu_runs_after_baseline')} |")
            continue
        measured = {k: real[f"{wl}_{v}"]["min_budget"] for k, v in names.items() if f"{wl}_{v}" in real}
        best_conf = min(measured, key=measured.get)
        same = measured.get(r["recommendation"] or "")
        gap = f"{100 * (r['min_budget'] / measured[best_conf] - 1):+.1f}%" if r.get("min_budget") else "-"
        out.append(f"| {wl} | {r['recommendation'] or '(default)'} {_mib(r['min_budget'])} | {_mib(same)} | "
                   f"{best_conf or '(default)'} {_mib(measured[best_conf])} | {gap} | {r['gpu_runs_after_baseline']} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "gpu-results" / "tune_real"))
    ap.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated workload names")
    ap.add_argument("--jobs", type=int, default=len(WORKLOADS), help="tunes side by side")
    ap.add_argument("--timeout", type=float, default=390.0, help="per tune, seconds (then Ctrl-C; the store keeps its trials)")
    ap.add_argument("--compare", type=Path, default=None, help="bisect_results.json: compare a finished summary")
    ap.add_argument("--summary", type=Path, default=None, help="summary.json of a finished run (with --compare)")
    args = ap.parse_args(argv)
    if args.compare is not None:
        print(compare(args.summary or Path(args.out) / "summary.json", args.compare))
        return 0
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        print(f"gpu_tune_real: error: unknown workload(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # recordings stay outside $OUT (large, many files); summary and logs are rewritten after every
    # finished tune, so a run cut off by the time limit still brings back what finished
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="gpu_tune_real."))
    t0 = time.monotonic()

    def save(rows: list[dict]) -> None:
        total = round(time.monotonic() - t0, 1)
        rows = sorted(rows, key=lambda r: names.index(r["workload"]))
        (out / "summary.json").write_text(json.dumps({"schema": "alloctune.bench.gpu-tune-real/1", "total_wall_s": total,
                                                      "jobs": args.jobs, "rows": rows}, indent=1))
        (out / "summary.md").write_text(table(rows) + f"\n\ntotal wall {total} s, {args.jobs} tune(s) side by side\n")
        with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
            for name in names:
                for f in ("tune.json", "tune.stderr", "trials.jsonl"):
                    if (work / name / f).exists():
                        tar.add(work / name / f, arcname=f"{name}/{f}")

    rows = run_all(names, work, max(1, args.jobs), args.timeout, on_row=save)
    save(rows)
    print((out / "summary.md").read_text())
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
