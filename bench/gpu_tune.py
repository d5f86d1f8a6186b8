"""`alloctune tune` on the GPU: the default confirm flow on real-library workloads and the project's own, and
the strategies (auto, grid, simulate-first) against each other (jobs `tune-real`, `tune-sharp`, `tune`).

    python bench/gpu_tune.py real [--only hubert,timm] [--jobs 1] [--timeout 150] [--budgets sharp] [--out DIR]
    python bench/gpu_tune.py real --compare TRUTH [--summary DIR/summary.json]     # afterwards, on any machine
    python bench/gpu_tune.py strategies                                             # writes into $OUT

real: for each workload command, `alloctune tune --json` in a fresh store; reports the GPU runs it used
(after the one recorded baseline), its wall time against one run of the workload (the baseline trial's),
the recommendation, and the recommended setting's simulated and measured min_budget (measured = a tested
pass; `verified` = with a tested failure within 1 % below it). `--jobs N` runs N tunes side by side (the
caps are per process, so memory results hold, but throughput is then measured under load). `--budgets
sharp` tunes under budgets where the default fails (SHARP), else the whole card. Writes summary.json,
summary.md and logs.tar.gz (stores, logs, recordings) to --out, rewritten after every finished tune.
`--compare` sets a finished summary against the independent ground truth: gpu_recordings.py truth's
truth.jsonl (both ends tested) or, for old data, the bisect stage's bisect_results.json.

strategies (on bench/frag_workload.py, through the real CLI): pick a budget B halfway between the
simulator's min budget of the best setting and the default's, checked on the GPU so that the default
really fails at B (lowered if not); then `tune --budget B` (auto), `tune --strategy grid` over the same
candidates (continuing the auto store with --resume, so shared trials are not repeated) and `tune
--simulate-first` in a fresh store; a table of recommendation, min_budget, the gap to the grid's best (must
be within 2 %) and trial counts. The agent and `alloctune run` themselves: tests/test_agent_gpu.py (the job
runs it first).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import frag_workload
from runlog import log_result, md_table
from suite import BENCH, ROOT, MiB, alloctune, child_env

PY = sys.executable
# The same commands as the independent bisections (gpu_recordings.py), so the tune's answer and the ground
# truth are about the same program and inputs.
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


def _mib(x) -> str:
    return "-" if x is None else f"{x / MiB:.0f}"


# ---- real: the confirm flow on real workloads ----------------------------------------------------------
def run_all(names: list[str], out: Path, jobs: int, timeout: float, on_row, budgets: dict[str, str],
            extra: list[str]) -> list[dict]:
    env = child_env(COLUMNS=os.environ.get("COLUMNS", "100"))
    pending, running, rows = list(names), {}, []
    while pending or running:
        while pending and len(running) < jobs:
            name = pending.pop(0)
            d = out / name
            d.mkdir(parents=True, exist_ok=True)
            cmd = [PY, "-m", "alloctune", "tune", "--json", "--store", str(d / "trials.jsonl"),
                   *(["--budget", budgets[name]] if name in budgets else []), *extra, "--", *WORKLOADS[name]]
            files = [(d / "tune.json").open("w"), (d / "tune.stderr").open("w")]
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=files[0], stderr=files[1], start_new_session=True)
            running[name] = (proc, time.monotonic(), d, files)
            print(f"started {name}: {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
        for name, (proc, t0, d, files) in list(running.items()):
            rc = proc.poll()
            if rc is None and time.monotonic() - t0 > timeout:
                os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the tune keeps its store and prints what it has
                try:
                    rc = proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    rc = proc.wait()
            if rc is None:
                continue
            del running[name]
            for f in files:
                f.close()
            rows.append(summarize(name, d, rc, time.monotonic() - t0))
            print(f"finished {name}: rc={rc} in {rows[-1]['wall_s']:.0f} s", file=sys.stderr, flush=True)
            on_row(rows)
        time.sleep(0.05)  # a tune's wall time is read to this step: it is compared with one run's
    return sorted(rows, key=lambda r: names.index(r["workload"]))


def summarize(name: str, d: Path, rc: int, wall: float) -> dict:
    row: dict = {"workload": name, "command": WORKLOADS[name][1:], "rc": rc, "wall_s": round(wall, 1)}
    try:
        data = json.loads((d / "tune.json").read_text())
        row["budget"] = data.get("budget")
    except (OSError, ValueError):
        tail = (d / "tune.stderr").read_text(errors="replace").strip().splitlines()[-3:]
        row["error"] = " | ".join(tail) or "no JSON output"
        store = d / "trials.jsonl"
        if store.exists():  # an interrupted tune: its trials are still in the store (in logs.tar.gz)
            row["trials_in_store"] = sum('"kind":"trial"' in line.replace(" ", "") for line in store.read_text().splitlines())
        return row
    trials = data["trials"]
    base = trials[0] if trials else {}
    best = (data.get("ranking") or {}).get("best") or {}
    fresh = [t for t in trials[1:] if not t.get("reused")]
    row.update({
        "gpu_runs_after_baseline": data.get("gpu_runs_after_baseline"), "trials": data.get("trial_count"),
        "baseline_wall_s": base.get("wall_s"),
        "wall_over_one_run": round(wall / base["wall_s"], 2) if base.get("wall_s") else None,
        "recommendation": (data.get("recommendation") or {}).get("conf"),
        "summary": (data.get("recommendation") or {}).get("summary"),
        **{k: best.get(k) for k in ("sim_min_budget", "min_budget", "infeasible_below", "verified", "sim_agrees")},
        "best": best.get("conf"),
        "throughput_samples": best.get("throughput_samples"),  # runs of the best alone on the GPU that gave a rate
        "best_note": best.get("note"),  # says what was and was not measured about throughput
        "notes": data.get("notes"),
        "candidates": [{k: c.get(k) for k in ("conf", "sim_min_budget", "min_budget", "infeasible_below", "verified",
                                              "trials", "note")} for c in data.get("candidates", [])],
        "probes": [(t.get("conf"), t.get("budget"), t.get("outcome"), t.get("num_ooms"), t.get("purpose")) for t in trials[1:]],
        "throughput_runs": sum("throughput" in (t.get("purpose") or "") for t in fresh),
        "memory_runs": sum("throughput" not in (t.get("purpose") or "") for t in fresh),
        "started_ahead": sum(t.get("started_ahead_s") is not None for t in fresh),  # run/warm.py
        # the tune's time with no run of the program going (its `in_runs_s` against its `elapsed_s`)
        "own_s": round(data["elapsed_s"] - data["in_runs_s"], 2) if "in_runs_s" in data else None,
    })
    return row


def _snapshots(d: Path) -> list[Path]:
    """The recordings a tune made (baseline and recorded capped probes), wherever its store put them."""
    found = set(d.rglob("*.pickle")) | set(d.rglob("*.pickle.xz"))
    store = d / "trials.jsonl"
    for line in store.read_text(errors="replace").splitlines() if store.exists() else ():
        try:
            snap = (json.loads(line).get("result") or {}).get("snapshot")
        except (ValueError, AttributeError):
            continue
        if snap and Path(snap).is_file():
            found.add(Path(snap))
    return sorted(found)


def table(rows: list[dict]) -> str:
    cells = []
    for r in rows:
        if "error" in r:
            cells.append((r["workload"], "-", r["wall_s"], "-", f"error: {r['error'][:80]}", "", "", "", "", "", ""))
            continue
        rec = "none" if r["recommendation"] is None else (r["recommendation"] or "(default)")
        cells.append((r["workload"], r["gpu_runs_after_baseline"], r["wall_s"], r["wall_over_one_run"], rec,
                      _mib(r["sim_min_budget"]), f"{_mib(r['min_budget'])} ({_mib(r['infeasible_below'])})",
                      r["verified"], r.get("throughput_samples") or 0, r.get("started_ahead", 0), "-" if r.get("own_s") is None else r["own_s"]))
    said = [f"- {r['workload']}: {r['best_note']}" for r in rows if "throughput" in (r.get("best_note") or "")]
    return "\n".join([md_table(("workload", "GPU runs after baseline", "wall s", "× one run", "recommended",
                                "simulated MiB", "measured MiB (fails at)", "verified", "samples alone",
                                "started ahead", "alloctune's own s"), cells)]
                     + ([""] + said if said else []))


def load_truth(path: Path) -> dict[str, dict[str, dict]]:
    """workload -> conf -> row, from the truth stage's truth.jsonl (both ends tested) or, for old data, the
    bisect stage's bisect_results.json (lower end assumed, not tested)."""
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
    truth = load_truth(truth_path)
    cells = []
    for r in json.loads(summary.read_text())["rows"]:
        wl = r["workload"]
        t = {c: v for c, v in truth.get(wl, {}).items() if v.get("min_budget")}
        if "error" in r or not t:
            cells.append((wl, f"{r.get('recommendation')} {_mib(r.get('min_budget'))}", "(no ground truth)", "", "",
                          r.get("memory_runs"), r.get("throughput_runs"), r.get("wall_over_one_run")))
            continue
        best = min(t, key=lambda c: t[c]["min_budget"])
        rec = r.get("recommendation") or ""
        same = t.get(rec, {})
        gap = f"{100 * (r['min_budget'] / t[best]['min_budget'] - 1):+.1f}%" if r.get("min_budget") else "-"
        cells.append((wl, f"{rec or '(default)'} {_mib(r.get('min_budget'))} ({_mib(r.get('infeasible_below'))})",
                      f"{_mib(same.get('min_budget'))} ({_mib(same.get('fails_at'))})",
                      f"{best or '(default)'} {_mib(t[best]['min_budget'])} ({_mib(t[best].get('fails_at'))})", gap,
                      r.get("memory_runs"), r.get("throughput_runs"), r.get("wall_over_one_run")))
    return md_table(("workload", "tune: recommended, measured MiB (fails at)", "truth: that setting (fails at)",
                     "truth: best setting", "tune vs best", "memory runs", "throughput runs", "× one run"), cells)


def real(args: argparse.Namespace) -> int:
    budgets = dict(SHARP) if args.budgets == "sharp" else dict(kv.split("=", 1) for kv in args.budgets.split(",") if "=" in kv)
    if args.compare is not None:
        print(compare(args.summary or Path(args.out) / "summary.json", args.compare))
        return 0
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        print(f"gpu_tune: error: unknown workload(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # recordings stay outside $OUT (large, many files); summary and logs are rewritten after every
    # finished tune, so a run cut off by the time limit still brings back what finished
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

    rows = run_all(names, work, max(1, args.jobs), args.timeout, save, budgets,
                   ["--throughput", args.throughput] if args.throughput else [])
    save(rows)
    print((out / "summary.md").read_text())
    for r in rows:
        log_result(f"{r['workload']}: error {r['error'][:120]}" if "error" in r else
                   f"{r['workload']}: {r['gpu_runs_after_baseline']} GPU runs after the baseline, {r['wall_s']} s "
                   f"({r['wall_over_one_run']}x one run), recommended {r['recommendation'] or '(default)'}, simulated "
                   f"{_mib(r['sim_min_budget'])} MiB, measured {_mib(r['min_budget'])} MiB (fails at "
                   f"{_mib(r['infeasible_below'])}), verified {r['verified']}", folder=out, bench="gpu_tune_real")
    shutil.rmtree(work, ignore_errors=True)
    return 0


# ---- strategies: auto, grid and simulate-first on the fragmenting workload ---------------------------------
def sim_estimates(items: int, seed: int) -> dict:
    """The simulator's min_budget per setting for the workload's plan (CPU only)."""
    from alloctune.config import AllocatorConfig
    from alloctune.sim import min_budget, replay
    from alloctune.trace.model import ALLOC, FREE, RequestStream, Trace

    rs, rid = RequestStream(), {}
    for i, (op, ident, size) in enumerate(frag_workload.plan(items, seed)):
        if op == "alloc":
            rid[ident] = len(rid)
            rs.append(ALLOC, size, rid[ident], 0, i)
        else:
            rs.append(FREE, 0, rid[ident], 0, i)
    tr = Trace(source="plan", device=0, requests=rs, segment_events=[], allocator_settings={}, total_memory=150109880320)
    base = replay(tr, None)
    confs = ["", "expandable_segments:True", "garbage_collection_threshold:0.6", "roundup_power2_divisions:4"] + [
        f"max_split_size_mb:{v}" for v in (32, 64, 128, 256, 512)]
    return {"peak_reserved": base.peak_reserved, "peak_allocated": base.peak_allocated,
            "min_budget": {c: min_budget(tr, AllocatorConfig.parse(c)).budget for c in confs}}


def strategies(args: argparse.Namespace) -> int:
    out = Path(os.environ.get("OUT") or "gpu-tune-out")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="alloctune-gpu-tune."))
    workload = [PY, str(BENCH / "frag_workload.py"), "--seed", str(args.seed), "--items", str(args.items)]
    t_start = time.monotonic()
    est = sim_estimates(args.items, args.seed)
    mb = est["min_budget"]
    print("simulator estimates (MiB):", {k or "default": v // MiB for k, v in mb.items()}, flush=True)
    budget, tries = ((min(v for v in mb.values() if v) + mb[""]) // 2) // (2 * MiB) * (2 * MiB), []
    for _ in range(4):  # B: the default must really fail there
        p = alloctune("run", "--json", "--budget", f"{budget}B", "--conf", "", "--", *workload)
        tries.append((budget, json.loads(p.stdout)["outcome"] if p.stdout.strip() else f"exit {p.returncode}"))
        if tries[-1][1] != "ok":
            break
        budget = int(budget * 0.93) // (2 * MiB) * (2 * MiB)
    print(f"budget B = {budget} ({budget / MiB:.0f} MiB); default at B: {tries}", flush=True)

    def tune(name: str, *extra: str, store: Path) -> dict:
        t0 = time.monotonic()
        p = alloctune("tune", "--json", "--budget", f"{budget}B", "--store", str(store), *extra, "--", *workload, timeout=900)
        if p.returncode != 0:
            print(p.stderr[-4000:])
            return {"error": p.stderr.strip().splitlines()[-1:] if p.stderr else p.returncode}
        data = {**json.loads(p.stdout), "elapsed_wall_s": round(time.monotonic() - t0, 1)}
        (out / f"tune_{name}.json").write_text(json.dumps(data, indent=1, default=str))
        return data

    runs = {"auto": tune("auto", store=work / "auto.jsonl")}
    shutil.copy(work / "auto.jsonl", work / "grid.jsonl")
    runs["grid"] = tune("grid", "--strategy", "grid", "--resume", store=work / "grid.jsonl")
    runs["simulate-first"] = tune("simfirst", "--simulate-first", store=work / "sim.jsonl")
    best = {k: (((d.get("ranking") or {}).get("best") or {}).get("conf"), ((d.get("ranking") or {}).get("best") or {})
                .get("min_budget")) for k, d in runs.items()}
    grid_best = best["grid"][1]
    cells = [(name, f"`{'none' if conf is None else (conf or '(default)')}`", f"{mbud / MiB if mbud else float('nan'):.0f} MiB",
              f"{100 * (mbud - grid_best) / grid_best:+.1f} %" if mbud and grid_best else "-", d.get("trial_count"),
              d.get("fresh_trials"), d.get("elapsed_wall_s")) for (name, (conf, mbud)), d in zip(best.items(), runs.values())]
    lines = [f"## gpu_tune strategies ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}) — `python bench/gpu.py tune`",
             "", f"workload: `frag_workload.py {' '.join(workload[2:])}`; budget B = {budget / MiB:.0f} MiB (default at B: "
             f"{tries[-1][1] if tries else '?'})", "",
             md_table(("run", "recommendation", "min_budget", "vs grid best", "trials (logical)", "trials run", "wall s"), cells),
             "", f"simulate-first same recommendation as grid: {best['simulate-first'][0] == best['grid'][0]}; auto within "
             f"2 % of grid best: {bool(best['auto'][1] and grid_best and best['auto'][1] <= grid_best * 1.02)}",
             "trials whose setting did not take effect: "
             + str(sum(1 for d in runs.values() for t in d.get("trials", []) if t.get("warnings"))),
             "simulator estimates (MiB): " + ", ".join(f"{k or 'default'} {v / MiB:.0f}" for k, v in mb.items() if v),
             f"total bench time {time.monotonic() - t_start:.0f} s"]
    for name in ("grid", "simulate-first"):
        d = runs[name]
        reasons = (d.get("ranking") or {}).get("reasons") or {}
        nan = float("nan")
        lines += ["", f"{name} candidates:", "", md_table(
            ("setting", "at B", "min_budget", "simulated", "throughput", "trials", "verdict"),
            [(f"`{c['conf'] or '(default)'}`", c.get("outcome") or "-", *(f"{c[k] / MiB if c.get(k) else nan:.0f}"
              for k in ("min_budget", "sim_min_budget")), c.get("throughput"), c.get("trials"),
              reasons.get(c["conf"], "recommended")) for c in d.get("candidates", [])])]
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    print("\n" + text)
    for name, conf, mbud, _, _, fresh, wall in cells:
        log_result(f"{name}: recommended {conf.strip('`')}, min budget {mbud}, {fresh} trial(s) run, {wall} s", folder=out)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="part", required=True)
    r = sub.add_parser("real", help="the confirm flow on real workloads (jobs tune-real, tune-sharp)")
    r.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "gpu-results" / "tune_real"))
    r.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated workload names")
    r.add_argument("--jobs", type=int, default=len(WORKLOADS), help="tunes side by side")
    r.add_argument("--timeout", type=float, default=390.0, help="per tune, seconds (then Ctrl-C; the store keeps its trials)")
    r.add_argument("--compare", type=Path, default=None, help="truth.jsonl or bisect_results.json: compare a finished summary")
    r.add_argument("--summary", type=Path, default=None, help="summary.json of a finished run (with --compare)")
    r.add_argument("--budgets", default="", help="'sharp' (budgets where the default fails) or NAME=SIZE,...; default: the card")
    r.add_argument("--throughput", default=None, choices=("auto", "measure"), help="the tunes' --throughput")
    s = sub.add_parser("strategies", help="auto vs grid vs simulate-first on the fragmenting workload (job tune)")
    s.add_argument("--seed", type=int, default=int(os.environ.get("TUNE_SEED", "2")))
    s.add_argument("--items", type=int, default=int(os.environ.get("TUNE_ITEMS", "40")))
    args = ap.parse_args(argv)
    return real(args) if args.part == "real" else strategies(args)


if __name__ == "__main__":
    sys.exit(main())
