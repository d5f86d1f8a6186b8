"""GPU evidence for `alloctune run` and `alloctune tune` (the `tune` job of bench/gpu.py, one H200).

Steps, all through the real CLI (`python3 -m alloctune ...`) on bench/frag_workload.py:

1. `run` check: one uncapped run whose workload writes its own `torch.cuda.memory_stats()`;
   the agent's report must carry the same numbers. Plus: an OOM at a tiny budget is
   classified `oom` (exit 1) with an OOM snapshot, and a budget above the card exits 2.
2. Pick the budget B: the simulator's estimate halfway between the best setting and the
   default, checked on the GPU so that the default really fails at B (lowered if not).
3. `tune --budget B` (auto), `tune --strategy grid` over the same candidates (continuing
   the auto store with --resume, so shared trials are not repeated; counts are reported
   both ways), and `tune --simulate-first` in a fresh store.
4. A table: recommendation and min_budget of each, the gap to the grid's best (must be
   within 2 %), trial counts, and whether simulate-first agrees with fewer trials.

Writes JSON files and `summary.md` into $OUT (or ./gpu-tune-out).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import frag_workload  # noqa: E402

MiB = 1 << 20
PY = os.environ.get("PYTHON", sys.executable)
OUT = Path(os.environ.get("OUT") or "gpu-tune-out")
WORK = Path(os.environ.get("TUNE_WORK") or "/tmp/alloctune-gpu-tune")
SEED = int(os.environ.get("TUNE_SEED", "2"))
ITEMS = int(os.environ.get("TUNE_ITEMS", "40"))
WORKLOAD = [PY, str(Path(__file__).resolve().parent / "frag_workload.py"), "--seed", str(SEED), "--items", str(ITEMS)]


LIVE_PROBE = """
import json, os, time, torch
x = torch.empty(300 << 20, dtype=torch.uint8, device="cuda")
path = os.path.join(os.environ["ALLOCTUNE_STATE_DIR"], f"live-{os.getpid()}.json")
time.sleep(1.5)
print("LIVE " + open(path).read().replace(chr(10), " "))
"""


def alloctune(*args: str, timeout: float = 600, env: dict | None = None, cwd: Path | None = None
              ) -> subprocess.CompletedProcess:
    cmd = [PY, "-m", "alloctune", *args]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    print(f"$ alloctune {' '.join(args)}\n  -> exit {p.returncode} in {time.monotonic() - t0:.1f} s", flush=True)
    if p.returncode not in (0, 1) or os.environ.get("VERBOSE"):
        print(p.stderr[-3000:], flush=True)
    return p


def save(name: str, data) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / name).write_text(json.dumps(data, indent=1, default=str))


def overhead_check(n: int = 3) -> dict:
    """The workload's own throughput without and with the agent (live sampler on): no slowdown expected."""
    import re
    import statistics

    def rate(text: str) -> float:
        return float(re.findall(r"throughput: ([0-9.]+)", text)[-1])

    bare, agent = [], []
    for _ in range(n):
        p = subprocess.run(WORKLOAD, capture_output=True, text=True, timeout=300)
        bare.append(rate(p.stdout))
        q = alloctune("run", "--json", "--", *WORKLOAD)
        agent.append(rate(q.stderr))  # --json sends the command's stdout to stderr
    b, a = statistics.median(bare), statistics.median(agent)
    return {"bare": bare, "agent": agent, "median_bare": b, "median_agent": a, "slowdown_pct": 100 * (b - a) / b}


def run_check() -> dict:
    own = WORK / "own_stats.json"
    p = alloctune("run", "--json", "--", *WORKLOAD, "--stats-out", str(own))
    report = json.loads(p.stdout)
    mine = json.loads(own.read_text())
    diffs = {k: (mine[k], report["stats"].get(k)) for k in mine if report["stats"].get(k) != mine[k]}
    tiny = alloctune("run", "--json", "--budget", "200MiB", "--on-oom", "snapshot", "--", *WORKLOAD, cwd=WORK)
    tiny_r = json.loads(tiny.stdout) if tiny.stdout.strip() else {}
    big = alloctune("run", "--budget", "100TiB", "--", *WORKLOAD)
    exp = alloctune("run", "--json", "--conf", "expandable_segments:True", "--", *WORKLOAD)
    exp_r = json.loads(exp.stdout) if exp.stdout.strip() else {}
    live_env = dict(os.environ, ALLOCTUNE_STATE_DIR=str(WORK / "live"))
    live = alloctune("run", "--json", "--", PY, "-c", LIVE_PROBE, env=live_env)
    try:
        sample = json.loads(live.stderr.split("LIVE ", 1)[1].splitlines()[0])
    except (IndexError, ValueError):
        sample = {}
    result = {
        "uncapped": {k: report.get(k) for k in ("outcome", "peak_reserved", "peak_allocated", "num_alloc_retries",
                                                 "num_ooms", "allocator_settings", "device_name", "torch_version",
                                                 "total_memory", "throughput", "wall_s")},
        "own_stats": mine,
        "stats_mismatch": diffs,
        "tiny_budget": {"exit": tiny.returncode, "outcome": tiny_r.get("outcome"),
                        "oom_message": tiny_r.get("oom_message"), "oom_snapshot": tiny_r.get("oom_snapshot"),
                        "snapshot_exists": bool(tiny_r.get("oom_snapshot")) and Path(tiny_r["oom_snapshot"]).exists()},
        "budget_above_card": {"exit": big.returncode, "stderr": big.stderr.strip().splitlines()[-1:]},
        "expandable": {"exit": exp.returncode, "settings": exp_r.get("allocator_settings"),
                       "warnings": exp_r.get("warnings"), "peak_reserved": exp_r.get("peak_reserved")},
        "live_sample": {"reserved_current": (sample.get("stats") or {}).get("reserved_bytes.all.current"),
                        "keys": sorted(sample), "left_behind": sorted(os.listdir(WORK / "live"))
                        if (WORK / "live").exists() else None},
    }
    return result


def sim_estimates() -> dict:
    """The simulator's min_budget per setting for the workload's plan (CPU only)."""
    from alloctune.config import AllocatorConfig
    from alloctune.sim import min_budget, replay
    from alloctune.trace.model import ALLOC, FREE, RequestStream, Trace

    rs, rid, n = RequestStream(), {}, 0
    for i, (op, ident, size) in enumerate(frag_workload.plan(ITEMS, SEED)):
        if op == "alloc":
            rid[ident] = n
            rs.append(ALLOC, size, n, 0, i)
            n += 1
        else:
            rs.append(FREE, 0, rid[ident], 0, i)
    tr = Trace(source="plan", device=0, requests=rs, segment_events=[], allocator_settings={},
               total_memory=150109880320)
    base = replay(tr, None)
    confs = ["", "expandable_segments:True", "garbage_collection_threshold:0.6", "roundup_power2_divisions:4"] + [
        f"max_split_size_mb:{v}" for v in (32, 64, 128, 256, 512)]
    est = {c: min_budget(tr, AllocatorConfig.parse(c)).budget for c in confs}
    return {"peak_reserved": base.peak_reserved, "peak_allocated": base.peak_allocated, "min_budget": est}


def pick_budget(est: dict) -> tuple[int, list]:
    mb = est["min_budget"]
    best = min(v for v in mb.values() if v)
    budget = ((best + mb[""]) // 2) // (2 * MiB) * (2 * MiB)
    tries = []
    for _ in range(4):
        p = alloctune("run", "--json", "--budget", f"{budget}", "--conf", "", "--", *WORKLOAD)
        outcome = json.loads(p.stdout)["outcome"] if p.stdout.strip() else f"exit {p.returncode}"
        tries.append((budget, outcome))
        if outcome != "ok":
            break
        budget = int(budget * 0.93) // (2 * MiB) * (2 * MiB)
    return budget, tries


def tune(name: str, budget: int, *extra: str, store: Path) -> dict:
    t0 = time.monotonic()
    p = alloctune("tune", "--json", "--budget", str(budget), "--store", str(store), *extra, "--", *WORKLOAD,
                  timeout=900)
    if p.returncode != 0:
        print(p.stderr[-4000:])
        return {"error": p.stderr.strip().splitlines()[-1:] if p.stderr else p.returncode}
    data = json.loads(p.stdout)
    data["elapsed_wall_s"] = round(time.monotonic() - t0, 1)
    save(f"tune_{name}.json", data)
    return data


def main() -> int:
    if WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True)
    t_start = time.monotonic()
    est = sim_estimates()
    print("simulator estimates (MiB):", {k or "default": v // MiB for k, v in est["min_budget"].items()}, flush=True)
    check = run_check()
    check["overhead"] = overhead_check()
    save("run_check.json", check)
    budget, tries = pick_budget(est)
    print(f"budget B = {budget} ({budget / MiB:.0f} MiB); default at B: {tries}", flush=True)
    auto = tune("auto", budget, store=WORK / "auto.jsonl")
    shutil.copy(WORK / "auto.jsonl", WORK / "grid.jsonl")
    grid = tune("grid", budget, "--strategy", "grid", "--resume", store=WORK / "grid.jsonl")
    sim = tune("simfirst", budget, "--simulate-first", store=WORK / "sim.jsonl")

    def best(d):
        b = (d.get("ranking") or {}).get("best") or {}
        return b.get("conf"), b.get("min_budget")

    rows = []
    for name, d in (("auto", auto), ("grid", grid), ("simulate-first", sim)):
        conf, mbud = best(d)
        rows.append((name, conf, mbud, d.get("trial_count"), d.get("fresh_trials"), d.get("elapsed_wall_s")))
    grid_best = best(grid)[1]
    lines = [
        f"## gpu_tune ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}) — `python bench/gpu.py tune`",
        "",
        f"device: {check['uncapped'].get('device_name')}, torch {check['uncapped'].get('torch_version')}; "
        f"workload: `frag_workload.py {' '.join(WORKLOAD[2:])}`; budget B = {budget / MiB:.0f} MiB (default at B: "
        f"{tries[-1][1] if tries else '?'})",
        "",
        "| run | recommendation | min_budget | vs grid best | trials (logical) | trials run | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, conf, mbud, n, fresh, wall in rows:
        gap = f"{100 * (mbud - grid_best) / grid_best:+.1f} %" if mbud and grid_best else "-"
        shown = "none" if conf is None else (conf or "(default)")
        lines.append(f"| {name} | `{shown}` | "
                     f"{mbud / MiB if mbud else float('nan'):.0f} MiB | {gap} | {n} | {fresh} | {wall} |")
    sim_conf, sim_mb = best(sim)
    lines += [
        "",
        f"simulate-first same recommendation as grid: {sim_conf == best(grid)[0]}; "
        f"auto within 2 % of grid best: {bool(best(auto)[1] and grid_best and best(auto)[1] <= grid_best * 1.02)}",
        f"`run` report vs workload's own memory_stats: "
        f"{'identical' if not check['stats_mismatch'] else 'DIFFER ' + json.dumps(check['stats_mismatch'])} "
        f"({len(check['own_stats'])} counters); tiny budget → exit {check['tiny_budget']['exit']} "
        f"outcome {check['tiny_budget']['outcome']}, OOM snapshot written: {check['tiny_budget']['snapshot_exists']}; "
        f"budget above card → exit {check['budget_above_card']['exit']}; expandable read back: "
        f"{(check['expandable']['settings'] or {}).get('expandable_segments')} (warnings {check['expandable']['warnings']}); "
        f"live sample reserved {check['live_sample']['reserved_current']} bytes, files left after exit: "
        f"{check['live_sample']['left_behind']}",
        f"agent overhead: workload throughput {check['overhead']['median_bare']:.1f} items/s bare vs "
        f"{check['overhead']['median_agent']:.1f} with the agent ({check['overhead']['slowdown_pct']:+.1f} % slowdown, "
        f"median of {len(check['overhead']['bare'])})",
        "trials whose setting did not take effect: " + str(sum(
            1 for d in (auto, grid, sim) for t in d.get("trials", []) if t.get("warnings"))),
        f"simulator estimates (MiB): " + ", ".join(
            f"{k or 'default'} {v / MiB:.0f}" for k, v in est["min_budget"].items() if v),
        f"total bench time {time.monotonic() - t_start:.0f} s",
    ]
    for name, d in (("grid", grid), ("simulate-first", sim)):
        lines += ["", f"{name} candidates:", "", "| setting | at B | min_budget | simulated | throughput | trials | verdict |",
                  "|---|---|---|---|---|---|---|"]
        reasons = (d.get("ranking") or {}).get("reasons") or {}
        for c in d.get("candidates", []):
            mb_, sm_ = c.get("min_budget"), c.get("sim_min_budget")
            lines.append(
                f"| `{c['conf'] or '(default)'}` | {c.get('outcome') or '-'} | {mb_ / MiB if mb_ else float('nan'):.0f} | "
                f"{sm_ / MiB if sm_ else float('nan'):.0f} | {c.get('throughput')} | {c.get('trials')} | "
                f"{reasons.get(c['conf'], 'recommended')} |")
    text = "\n".join(lines) + "\n"
    (OUT / "summary.md").write_text(text)
    print("\n" + text)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runlog import log_result

    for name, conf, mbud, n, fresh, wall in rows:
        log_result(f"{name}: recommended {'none' if conf is None else (conf or '(default)')}, min budget "
                   f"{mbud / MiB if mbud else float('nan'):.0f} MiB, {fresh} trial(s) run, {wall} s", folder=OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
