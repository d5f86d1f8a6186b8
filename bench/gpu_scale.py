"""GPU evidence for scale-out (issue #15) on one H200, ~4 min: parallel memory trials and a 2-rank torchrun job.

1. **CUDA context**: how much a trial's process holds outside its cap (the packing margin),
   measured in a child as total − free − reserved on an otherwise idle card.
2. **Parallel vs sequential min_budget search** on bench/frag_workload.py: one recorded
   baseline gives the bracket [peak allocated, default's peak reserved + 64 MiB]; then the
   same bisection per setting (to 1 % or 16 MiB, 2 MiB steps, as `tune` does) runs twice:
   sequentially (`SerialExecutor` + `runner.TrialEvaluator`, today's path) and with the
   settings' trials side by side on the card (`LocalExecutor` + `SpecRunner`, memory-packed).
   Expect identical min budgets and recommendation (smallest min_budget), and less wall time.
   If this checkout's `alloctune tune` has `--jobs`, it also runs `tune --jobs 1` vs `--jobs N`.
3. **torchrun --nproc-per-node 2** (gloo, both ranks on cuda:0) on bench/scale_ranks_workload.py:
   `alloctune run --record` gives one report and one recording per rank; `alloctune simulate`
   on each rank's recording must reproduce that rank's peak reserved; then a min_budget
   search of two settings on the 2-rank job (each trial books two caps and two contexts),
   the worst rank deciding each trial, with the ranks side by side.
4. **Several GPUs** (only when ≥ 2 are visible, issue #16): the same search on the `gpus`
   executor (and on a local Ray if it is installed), compared with the one-GPU sequential run;
   and the torchrun job with `--backend nccl`, one rank per GPU, recorded and simulated per rank.

Writes JSON files and summary.md into $OUT (default ./gpu-scale-out). Knobs: SCALE_ITEMS,
SCALE_JOBS, SCALE_SKIP (comma list of parts: context,search,tune_cli,ranks,multi), SCALE_MEMORY (bytes
the parallel trials may share; default NVML's free memory).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from runlog import log_results
from suite import BENCH as HERE

# isort: split
from alloctune.progress import LiveTrialTable  # after suite, which puts src/ on the path
from alloctune.run.runner import TrialEvaluator
from alloctune.tune.executors import SerialExecutor, TrialRequest
from alloctune.tune.executors.local import LocalExecutor
from alloctune.tune.executors.spec import SpecRunner, TrialSpec

MiB = 1 << 20
PY = os.environ.get("PYTHON", sys.executable)
OUT = Path(os.environ.get("OUT") or "gpu-scale-out")
WORK = Path(os.environ.get("SCALE_WORK") or "/tmp/alloctune-gpu-scale")
ITEMS = int(os.environ.get("SCALE_ITEMS", "30"))
JOBS = int(os.environ["SCALE_JOBS"]) if os.environ.get("SCALE_JOBS") else None
RANKS_TOL = float(os.environ.get("SCALE_RANKS_TOL", "0.04"))  # coarser: a 2-rank trial takes ~3x longer
MEMORY = int(os.environ["SCALE_MEMORY"]) if os.environ.get("SCALE_MEMORY") else None  # dry runs without NVML
SKIP = set(filter(None, os.environ.get("SCALE_SKIP", "").split(",")))
WORKLOAD = [PY, str(HERE / "frag_workload.py"), "--seed", "2", "--items", str(ITEMS)]
CONFS = ["", "expandable_segments:True", "max_split_size_mb:128"]
SUMMARY: list[str] = []
STATE: dict = {}  # the one-GPU search's bracket and results, for the several-GPU comparison


def save(name: str, data) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / name).write_text(json.dumps(data, indent=1, default=str))


def say(line: str = "") -> None:
    print(line, flush=True)
    SUMMARY.append(line)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "summary.md").write_text("\n".join(SUMMARY) + "\n")


def alloctune(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    p = subprocess.run([PY, "-m", "alloctune", *args], capture_output=True, text=True, timeout=timeout)
    print(f"$ alloctune {' '.join(args)}\n  -> exit {p.returncode} in {time.monotonic() - t0:.1f} s", flush=True)
    if p.returncode not in (0, 1):
        print(p.stderr[-3000:], flush=True)
    return p


# ---- 1. the CUDA context ------------------------------------------------------------------------
CONTEXT_PROBE = """
import torch
torch.ones(1, device="cuda")
free, total = torch.cuda.mem_get_info()
import json; print(json.dumps({"total": total, "free": free, "reserved": torch.cuda.memory_reserved()}))
"""


def measure_context() -> int | None:
    """The context size; also fills MEMORY from the probe's free memory when NVML/nvidia-smi see nothing."""
    global MEMORY
    p = subprocess.run([PY, "-c", CONTEXT_PROBE], capture_output=True, text=True, timeout=120)
    try:
        d = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        say(f"context probe failed: {p.stderr[-500:]}")
        return None
    used = d["total"] - d["free"] - d["reserved"]
    from alloctune.tune.executors.gpuinfo import probe

    seen = probe()
    source = "NVML/nvidia-smi"
    if MEMORY is None and not (seen and seen[0].free):
        MEMORY, source = int(d["free"] * 0.98), "the probe's mem_get_info"
    save("context.json", {**d, "context_bytes": used, "gpus": [g.to_dict() for g in seen], "memory_source": source})
    say(f"- CUDA context of one process (total − free − reserved, idle card): {used / MiB:.0f} MiB; "
        f"free memory for packing from {source}")
    return used


# ---- 2. the same bisection, sequential and parallel ---------------------------------------------------
def _align(n: int) -> int:
    return -(-n // (2 * MiB)) * (2 * MiB)


def search(executor, confs: list[str], lo: int, hi: int, tag: str, tol: float = 0.01) -> dict:
    """min_budget of each setting by bisection in [lo (fails), hi (must pass)] to `tol` or 16 MiB;
    one trial per setting per round (the settings' trials side by side when the executor allows)."""
    state = {c: [lo, hi] for c in confs}
    trials, rounds, worst = 0, 0, {}
    t0 = time.monotonic()
    todo = [TrialRequest(c, hi, purpose=f"{tag}: feasible at {hi // MiB} MiB") for c in confs]
    feasible = {}
    for req, res in executor.run(todo):
        trials += 1
        feasible[req.conf] = res.outcome == "ok"
        worst[req.conf] = res.ranks
    live = [c for c in confs if feasible.get(c)]
    while True:
        batch = []
        for c in live:
            a, b = state[c]
            if b - a <= max(16 * MiB, int(b * tol)):
                continue
            mid = _align((a + b) // 2)
            if mid >= b or mid <= a:
                continue
            batch.append(TrialRequest(c, mid, purpose=f"{tag}: bisect"))
        if not batch:
            break
        rounds += 1
        for req, res in executor.run(batch):
            trials += 1
            if res.outcome == "ok":
                state[req.conf][1] = req.budget
                worst[req.conf] = res.ranks
            elif res.outcome in ("oom", "timeout"):
                state[req.conf][0] = req.budget
            else:
                raise SystemExit(f"{tag}: trial {req.conf!r} @ {req.budget} crashed: {res.error} (log {res.log})")
    mins = {c: (state[c][1] if feasible.get(c) else None) for c in confs}
    passing = {c: v for c, v in mins.items() if v is not None}
    best = min(passing, key=lambda c: (passing[c], confs.index(c))) if passing else None
    return {"min_budget": mins, "recommended": best, "trials": trials, "rounds": rounds,
            "wall_s": round(time.monotonic() - t0, 1), "ranks_at_min": worst}


def baseline(workload: list[str], work: Path) -> dict:
    ev = TrialEvaluator(workload, work)
    res = ev("", None, record=True)
    if res.outcome != "ok":
        raise SystemExit(f"baseline failed: {res.outcome} {res.error}")
    return res.to_dict()


def parallel_vs_sequential(context: int | None) -> None:
    work = WORK / "search"
    base = baseline(WORKLOAD, work / "base")
    lo = _align(base["peak_allocated"]) - 2 * MiB
    hi = _align(base["peak_reserved"]) + 64 * MiB
    say(f"- workload {' '.join(WORKLOAD[1:])}: peak allocated {base['peak_allocated'] / MiB:.0f} MiB, "
        f"default peak reserved {base['peak_reserved'] / MiB:.0f} MiB, baseline {base['wall_s']:.1f} s; "
        f"bracket [{lo // MiB}, {hi // MiB}] MiB")
    seq = search(SerialExecutor(TrialEvaluator(WORKLOAD, work / "seq", timeout=max(60.0, 5 * base["wall_s"]))),
                 CONFS, lo, hi, "sequential")
    spec = TrialSpec.make(WORKLOAD, work / "par")
    ctx = context if context else 512 * MiB
    ex = LocalExecutor(SpecRunner(spec), jobs=JOBS, memory=MEMORY, budget_hint=hi, context_bytes=ctx, progress=LiveTrialTable(),
                       command=WORKLOAD, timeout=max(60.0, 5 * base["wall_s"]))
    par = search(ex, CONFS, lo, hi, "parallel")
    par["jobs"], par["memory"], par["peak_booked"] = ex.jobs, ex.memory, ex.peak_bytes
    STATE.update(lo=lo, hi=hi, seq=seq, par=par, timeout=max(60.0, 5 * base["wall_s"]), ctx=ctx)
    save("search.json", {"baseline": base, "sequential": seq, "parallel": par, "context_bytes": ctx})
    same = seq["min_budget"] == par["min_budget"] and seq["recommended"] == par["recommended"]
    say("\n| setting | min_budget sequential | min_budget parallel |\n|---|---|---|")
    for c in CONFS:
        s, p = seq["min_budget"][c], par["min_budget"][c]
        say(f"| {c or '(default)'} | {'-' if s is None else f'{s / MiB:.0f} MiB'} | "
            f"{'-' if p is None else f'{p / MiB:.0f} MiB'} |")
    say(f"\n- recommendation: sequential {seq['recommended']!r}, parallel {par['recommended']!r} -> "
        f"{'SAME' if same else 'DIFFERENT'} min budgets and recommendation")
    say(f"- wall: sequential {seq['wall_s']} s ({seq['trials']} trials), parallel {par['wall_s']} s "
        f"({par['trials']} trials, jobs={ex.jobs}, memory given {ex.memory and ex.memory / MiB:.0f} MiB, "
        f"most booked at once {max(ex.peak_bytes.values()) / MiB:.0f} MiB)")


def tune_cli_jobs() -> None:
    helptext = alloctune("tune", "--help").stdout
    if "--jobs" not in helptext:
        say("- `alloctune tune --jobs` not wired in this checkout: skipped the CLI comparison")
        return
    out = {}
    for jobs in ("1", str(JOBS or 4)):
        store = WORK / f"tune-jobs{jobs}" / "trials.jsonl"
        shutil.rmtree(store.parent, ignore_errors=True)
        t0 = time.monotonic()
        p = alloctune("tune", "--json", "--jobs", jobs, "--store", str(store), "--knobs", "expandable,max_split",
                      "--", *WORKLOAD, timeout=240)
        data = json.loads(p.stdout) if p.stdout.strip().startswith("{") else {"stderr": p.stderr[-2000:]}
        out[jobs] = {"exit": p.returncode, "wall_s": round(time.monotonic() - t0, 1),
                     "recommendation": (data.get("recommendation") or {}).get("conf"), "raw": data}
    save("tune_cli.json", out)
    say("- tune CLI: " + "; ".join(f"--jobs {j}: exit {o['exit']}, {o['wall_s']} s, recommends {o['recommendation']!r}"
                                   for j, o in out.items()))


# ---- 3. torchrun, two ranks on one GPU ------------------------------------------------------------------
def torchrun_ranks(context: int | None, backend: str = "gloo", tag: str = "ranks", search_too: bool = True) -> None:
    torchrun = os.environ.get("SCALE_TORCHRUN") or shutil.which("torchrun") or str(Path(PY).with_name("torchrun"))
    script = os.environ.get("SCALE_RANKS_SCRIPT") or str(HERE / "scale_ranks_workload.py")  # overrides: CPU dry runs
    job = [torchrun, "--nproc-per-node", "2", script, "--items", "24", "--backend", backend]
    rec = WORK / tag / "rec.pickle"
    rec.parent.mkdir(parents=True, exist_ok=True)
    p = alloctune("run", "--json", "--record", str(rec), "--", *job)
    try:
        run = json.loads(p.stdout)
    except ValueError:
        say(f"- torchrun run failed (exit {p.returncode}): {p.stderr[-1500:]}")
        return
    ranks = run.get("ranks") or []
    say(f"\n- `alloctune run --record -- torchrun --nproc-per-node 2 ... --backend {backend}`: exit {p.returncode}, "
        f"outcome {run.get('outcome')}, {run.get('processes')} agent reports, {len(ranks)} ranks")
    say("\n| rank | device | outcome | peak reserved | peak allocated | simulated peak reserved | recording |\n"
        "|---|---|---|---|---|---|---|")
    sims = {}
    for r in ranks:
        sim_peak = None
        if r.get("snapshot") and Path(r["snapshot"]).exists():
            s = alloctune("simulate", "--json", r["snapshot"])
            try:
                sims[r["rank"]] = json.loads(s.stdout)
                sim_peak = sims[r["rank"]]["rows"][0]["peak_reserved"]
            except (ValueError, KeyError, IndexError):
                sims[r["rank"]] = {"exit": s.returncode, "stderr": s.stderr[-1500:]}
        match = "" if sim_peak is None else (" (exact)" if sim_peak == r.get("peak_reserved") else " (DIFFERS)")
        say(f"| {r['rank']} | cuda:{r.get('device')} | {r.get('outcome')} | {(r.get('peak_reserved') or 0) / MiB:.0f} MiB | "
            f"{(r.get('peak_allocated') or 0) / MiB:.0f} MiB | "
            f"{'-' if sim_peak is None else f'{sim_peak / MiB:.0f} MiB'}{match} | {Path(r.get('snapshot') or '-').name} |")
    save(f"{tag}_run.json", {"run": run, "simulate": sims})
    if not ranks or not search_too:
        return
    neediest = max(ranks, key=lambda r: r.get("peak_reserved") or 0)
    lo = _align(min(r.get("peak_allocated") or 0 for r in ranks)) - 2 * MiB
    hi = _align(neediest["peak_reserved"]) + 64 * MiB
    spec = TrialSpec.make(job, WORK / tag / "tune")
    ex = LocalExecutor(SpecRunner(spec), jobs=2, memory=MEMORY, budget_hint=hi, context_bytes=context or 512 * MiB,
                       processes=2, progress=LiveTrialTable(), command=job, timeout=max(90.0, 5 * run["wall_s"]))
    res = search(ex, CONFS[:2], lo, hi, "torchrun", tol=RANKS_TOL)
    save(f"{tag}_tune.json", res)
    say(f"\n- min_budget per rank-process of the 2-rank job to {RANKS_TOL:.0%} (worst rank decides; {res['trials']} trials, "
        f"{res['wall_s']} s, 2 trials side by side = 4 processes): "
        + ", ".join(f"{c or '(default)'}: {'-' if v is None else f'{v / MiB:.0f} MiB'}" for c, v in res["min_budget"].items())
        + f"; recommended {res['recommended']!r}")
    for c, rows in res["ranks_at_min"].items():
        say(f"  - {c or '(default)'} at its min budget: " + ", ".join(
            f"rank {r['rank']} {r['outcome']} peak reserved {(r.get('peak_reserved') or 0) / MiB:.0f} MiB" for r in rows))


# ---- 4. several GPUs (issue #16): the gpus executor, Ray if installed, torchrun with NCCL ---------------
def several_gpus(context: int | None) -> None:
    from alloctune.tune.executors.gpuinfo import probe
    from alloctune.tune.executors.gpus import GpusExecutor

    gpus = probe()
    if len(gpus) < 2:
        say(f"\n- several GPUs: {len(gpus)} visible, skipped (issue #16 runs this part on nvidia-h200-x2)")
        return
    if "seq" not in STATE:
        say("\n- several GPUs: the one-GPU search did not run (SCALE_SKIP=search?), skipped the comparison")
    else:
        seq, lo, hi = STATE["seq"], STATE["lo"], STATE["hi"]
        rows = {}
        spec = TrialSpec.make(WORKLOAD, WORK / "gpus")
        ex = GpusExecutor(SpecRunner(spec), gpus=gpus, context_bytes=STATE["ctx"], timeout=STATE["timeout"],
                          progress=LiveTrialTable(), command=WORKLOAD)
        rows["gpus"] = search(ex, CONFS, lo, hi, "gpus")
        try:
            import ray  # noqa: F401
        except ImportError:
            say("- Ray not installed on this machine: `--executor ray` part skipped")
        else:
            from alloctune.tune.executors.ray_tasks import RayExecutor

            rex = RayExecutor(SpecRunner(TrialSpec.make(WORKLOAD, WORK / "ray")), context_bytes=STATE["ctx"],
                              timeout=STATE["timeout"], command=WORKLOAD,
                              init_kwargs={"num_cpus": len(gpus) * 4, "num_gpus": len(gpus)})
            try:
                rex._ray()  # start Ray outside the timed search
                rows["ray"] = search(rex, CONFS, lo, hi, "ray")
            finally:
                rex.close()
        save("several_gpus.json", {"gpus": [g.to_dict() for g in gpus], **rows, "sequential_one_gpu": seq})
        for name, res in rows.items():
            same = res["min_budget"] == seq["min_budget"] and res["recommended"] == seq["recommended"]
            say(f"- `{name}` on {len(gpus)} GPUs: {res['wall_s']} s for {res['trials']} trials "
                f"(sequential on one GPU: {seq['wall_s']} s); min budgets and recommendation "
                f"{'SAME as' if same else 'DIFFERENT from'} the one-GPU sequential run")
    torchrun_ranks(context, backend="nccl", tag="nccl", search_too=False)


def main() -> int:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    say(f"# gpu_scale ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
    context = None if "context" in SKIP else measure_context()
    for name, fn in (("search", lambda: parallel_vs_sequential(context)), ("tune_cli", tune_cli_jobs),
                     ("ranks", lambda: torchrun_ranks(context)), ("multi", lambda: several_gpus(context))):
        if name in SKIP:
            continue
        t0 = time.monotonic()
        try:
            fn()
        except SystemExit as exc:
            say(f"- {name}: stopped: {exc}")
        print(f"== {name} took {time.monotonic() - t0:.0f} s", flush=True)
    log_results([line for line in SUMMARY if line.startswith("- ")], folder=OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
