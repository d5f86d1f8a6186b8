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

Batch 9 tuned the real-library workloads with their default --count (8/8/6/6) while the
bisection ran --count 6/6/4/4: its comparison was of different programs. The commands below
are the bisection's own.
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
# The same commands as the independent bisections (gpu_recordings.py REAL/OWN, gpu_truth.py), so the
# tune's answer and the ground truth are about the same program and inputs.
WORKLOADS: dict[str, list[str]] = {
    "hubert": [PY, "bench/real_workloads.py", "hubert", "--count", "6", "--quiet"],
    "timm": [PY, "bench/real_workloads.py", "timm", "--count", "6", "--quiet"],
    "torchvision": [PY, "bench/real_workloads.py", "torchvision", "--count", "4", "--quiet"],
    "llama": [PY, "bench/real_workloads.py", "llama", "--count", "4", "--quiet"],
    "rvc": [PY, "-m", "alloctune.workloads.rvc", "--count", "2", "--quiet"],
    "diffusion": [PY, "-m", "alloctune.workloads.diffusion", "--count", "3", "--quiet"],
    # the capped programs of bench/diagnose_cap_gpu.py (issue 28: tune under budgets where the default fails)
    "seg": [PY, "bench/cap_programs.py", "seg"],
    "convnext": [PY, "bench/cap_programs.py", "convnext"],
    "hubert_grad": [PY, "bench/cap_programs.py", "hubert"],  # inference with autograd left on: no setting fits
}
# budgets where the default fails and some setting fits (ground truth: bench/results/diagnose_cap_gpu.md for seg and
# convnext, batch 13's bisections for hubert and llama): `--budgets sharp`
SHARP = {"hubert": "740MiB", "llama": "415MiB", "seg": "1434MiB", "convnext": "517MiB", "hubert_grad": "1.05GiB"}
MiB = 1 << 20


def run_all(names: list[str], out: Path, jobs: int, timeout: float, on_row=None,
            budgets: dict[str, str] | None = None, extra: list[str] | None = None) -> list[dict]:
    budgets = budgets or {}
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
            cmd = [PY, "-m", "alloctune", "tune", "--json", "--store", str(d / "trials.jsonl"),
                   *(["--budget", budgets[name]] if name in budgets else []), *(extra or []), "--", *WORKLOADS[name]]
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
        row["budget"] = json.loads((d / "tune.json").read_text()).get("budget")
    except (OSError, ValueError):
        pass
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
        "throughput_samples": best.get("throughput_samples"),  # runs of the best alone on the GPU that gave a rate
        "best_note": best.get("note"),  # says what was and was not measured about throughput
        "notes": data.get("notes"),
        "candidates": [
            {k: c.get(k) for k in ("conf", "sim_min_budget", "min_budget", "infeasible_below", "verified", "trials", "note")}
            for c in data.get("candidates", [])
        ],
        "probes": [(t.get("conf"), t.get("budget"), t.get("outcome"), t.get("num_ooms"), t.get("purpose")) for t in trials[1:]],
        "throughput_runs": sum(1 for t in trials[1:] if not t.get("reused") and "throughput" in (t.get("purpose") or "")),
        "memory_runs": sum(1 for t in trials[1:] if not t.get("reused") and "throughput" not in (t.get("purpose") or "")),
    })
    return row


def _snapshots(d: Path) -> list[Path]:
    """The recordings a tune made (baseline and recorded capped probes), wherever its store put them."""
    found = set(d.rglob("*.pickle")) | set(d.rglob("*.pickle.xz"))
    store = d / "trials.jsonl"
    if store.exists():
        for line in store.read_text(errors="replace").splitlines():
            try:
                snap = (json.loads(line).get("result") or {}).get("snapshot")
            except (ValueError, AttributeError):
                continue
            if snap and Path(snap).is_file():
                found.add(Path(snap))
    return sorted(found)


def _mib(x) -> str:
    return "-" if x is None else f"{x / MiB:.0f}"


def table(rows: list[dict]) -> str:
    lines = ["| workload | GPU runs after baseline | wall s | × one run | recommended | simulated MiB | measured MiB "
             "(fails at) | verified | samples alone |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['workload']} | - | {r['wall_s']} | - | error: {r['error'][:80]} | | | | |")
            continue
        lines.append(
            f"| {r['workload']} | {r['gpu_runs_after_baseline']} | {r['wall_s']} | {r['wall_over_one_run']} | "
            f"{'none' if r['recommendation'] is None else (r['recommendation'] or '(default)')} | "
            f"{_mib(r['sim_min_budget'])} | "
            f"{_mib(r['min_budget'])} ({_mib(r['infeasible_below'])}) | {r['verified']} | {r.get('throughput_samples') or 0} |")
    said = [f"- {r['workload']}: {r['best_note']}" for r in rows if "throughput" in (r.get("best_note") or "")]
    return "\n".join(lines + ([""] + said if said else []))


def load_truth(path: Path) -> dict[str, dict[str, dict]]:
    """workload -> conf -> row, from gpu_truth.py's truth.jsonl (both ends tested) or, for old
    data, gpu_recordings.py's bisect_results.json (lower end assumed, not tested)."""
    text = path.read_text()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" else json.loads(text)
    out: dict[str, dict[str, dict]] = {}
    for r in rows:
        if "workload" not in r:  # old format: name = workload_setting
            if "min_budget" not in r:
                continue
            r = {**r, "workload": r["name"].split("_", 1)[0]}
        out.setdefault(r["workload"], {})[r["conf"]] = r
    return out


def compare(summary: Path, truth_path: Path) -> str:
    rows = json.loads(summary.read_text())["rows"]
    truth = load_truth(truth_path)
    out = ["| workload | tune: recommended, measured MiB (fails at) | truth: that setting (fails at) | truth: best setting | "
           "tune vs best | memory runs | throughput runs | × one run |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        wl = r["workload"]
        t = {c: v for c, v in truth.get(wl, {}).items() if v.get("min_budget")}
        if "error" in r or not t:
            out.append(f"| {wl} | {r.get('recommendation')} {_mib(r.get('min_budget'))} | (no ground truth) | | | "
                       f"{r.get('memory_runs')} | {r.get('throughput_runs')} | {r.get('wall_over_one_run')} |")
            continue
        best_conf = min(t, key=lambda c: t[c]["min_budget"])
        rec = r.get("recommendation") or ""
        same = t.get(rec, {})
        gap = f"{100 * (r['min_budget'] / t[best_conf]['min_budget'] - 1):+.1f}%" if r.get("min_budget") else "-"
        out.append(f"| {wl} | {rec or '(default)'} {_mib(r.get('min_budget'))} ({_mib(r.get('infeasible_below'))}) | "
                   f"{_mib(same.get('min_budget'))} ({_mib(same.get('fails_at'))}) | "
                   f"{best_conf or '(default)'} {_mib(t[best_conf]['min_budget'])} ({_mib(t[best_conf].get('fails_at'))}) | "
                   f"{gap} | {r.get('memory_runs')} | {r.get('throughput_runs')} | {r.get('wall_over_one_run')} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "gpu-results" / "tune_real"))
    ap.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated workload names")
    ap.add_argument("--jobs", type=int, default=len(WORKLOADS), help="tunes side by side")
    ap.add_argument("--timeout", type=float, default=390.0, help="per tune, seconds (then Ctrl-C; the store keeps its trials)")
    ap.add_argument("--compare", type=Path, default=None, help="truth.jsonl (gpu_truth.py) or bisect_results.json: compare a finished summary")
    ap.add_argument("--summary", type=Path, default=None, help="summary.json of a finished run (with --compare)")
    ap.add_argument("--budgets", default="", help="'sharp' (SHARP: budgets where the default fails) or NAME=SIZE,...; "
                    "default: the whole card")
    ap.add_argument("--throughput", default=None, choices=("auto", "measure"), help="the tunes' --throughput (default: tune's own)")
    args = ap.parse_args(argv)
    budgets = dict(SHARP) if args.budgets == "sharp" else dict(
        kv.split("=", 1) for kv in args.budgets.split(",") if "=" in kv)
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
                for snap in _snapshots(work / name):  # the recordings: the before/after table is computed from them
                    tar.add(snap, arcname=f"{name}/rec/{snap.name}")

    rows = run_all(names, work, max(1, args.jobs), args.timeout, on_row=save, budgets=budgets,
                   extra=["--throughput", args.throughput] if args.throughput else None)
    save(rows)
    print((out / "summary.md").read_text())
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runlog import log_result

    for r in rows:
        if "error" in r:
            log_result(f"{r['workload']}: error {r['error'][:120]}", folder=out)
            continue
        log_result(f"{r['workload']}: {r['gpu_runs_after_baseline']} GPU runs after the baseline, {r['wall_s']} s "
                   f"({r['wall_over_one_run']}x one run), recommended {r['recommendation'] or '(default)'}, simulated "
                   f"{_mib(r['sim_min_budget'])} MiB, measured {_mib(r['min_budget'])} MiB (fails at "
                   f"{_mib(r['infeasible_below'])}), verified {r['verified']}", folder=out)
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
