"""Real recordings and independent ground truth, side by side on one GPU (jobs `recordings`, `bisections` of bench/gpu.py).

Stage `record` (fresh process per run, `bench/capwrap.py`):
  * real-library workloads (hubert, timm, torchvision, llama) under default / expandable /
    max_split_128, uncapped, history recorded (Python stacks): fidelity on recordings no
    model was fitted to, and the fallible-request (workspace fallback) data;
  * hubert with C++ stacks (`stacks="all"`): which frames ask for workspaces;
  * capped recordings of the convolution workloads between peak allocated and peak reserved:
    the calibration runs in which cuDNN falls back to smaller workspaces;
  * rvc / diffusion uncapped under the three settings (peaks only);
  * size sweeps for capacity planning: rvc audio seconds, timm image side, llama prompt tokens.
Stage `bisect` (reads the record stage's sidecars):
  * independent min-budget bisection: every workload x setting, 6 steps, fresh processes;
  * largest size that completes under two caps x two settings (2 % size grid), fresh processes.

    python bench/gpu_recordings.py record --out $OUT/a --jobs 12 --deadline 500
    python bench/gpu_recordings.py bisect --sidecars DIR --out $OUT/b --jobs 14 --deadline 540
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFS = {"default": "", "expandable": "expandable_segments:True", "max_split_128": "max_split_size_mb:128"}
REAL = {
    "hubert": ["bench/real_workloads.py", "hubert", "--count", "6", "--quiet"],
    "timm": ["bench/real_workloads.py", "timm", "--count", "6", "--quiet"],
    "torchvision": ["bench/real_workloads.py", "torchvision", "--count", "4", "--quiet"],
    "llama": ["bench/real_workloads.py", "llama", "--count", "4", "--quiet"],
}
OWN = {
    "rvc": ["-m", "alloctune.workloads.rvc", "--count", "2", "--quiet"],
    "diffusion": ["-m", "alloctune.workloads.diffusion", "--count", "3", "--quiet"],
}
SIZES = {
    "rvc": ([10, 20, 30, 40, 50, 60], lambda s: ["-m", "alloctune.workloads.rvc", "--count", "1", "--quiet",
                                                  "--min-seconds", str(s), "--max-seconds", str(s)]),
    "timm": ([256, 384, 512, 640, 768, 896], lambda s: ["bench/real_workloads.py", "timm", "--count", "1",
                                                         "--quiet", "--size", str(s)]),
    "llama": ([512, 1024, 2048, 3072, 4096, 6144], lambda s: ["bench/real_workloads.py", "llama", "--count", "1",
                                                               "--quiet", "--size", str(s)]),
}
GPU_MEM = 130 << 30  # what the runs side by side may claim together
CONTEXT = 1 << 30  # a CUDA context, kernels and cuDNN handles, roughly
T0 = time.monotonic()


class Pool:
    """Runs capwrap jobs with at most `jobs` at once and their memory claims under GPU_MEM."""

    def __init__(self, jobs: int, deadline: float, log: Path):
        self.sem = threading.Semaphore(jobs)
        self.cv = threading.Condition()
        self.claimed = 0
        self.deadline = deadline
        self.log = log

    def run(self, prefix: Path, target: list[str], conf: str, cap: int = 0, record: bool = False,
            stacks: str = "python", size: str | None = None, claim: int = 8 << 30,
            timeout: float | None = None) -> dict | None:
        claim = (cap or claim) + CONTEXT
        with self.sem:
            with self.cv:
                self.cv.wait_for(lambda: self.claimed + claim <= GPU_MEM)
                self.claimed += claim
            try:
                left = min(self.deadline - (time.monotonic() - T0), timeout or 1e9)
                if left < 20:
                    return None
                env = dict(os.environ, PYTHONPATH=str(REPO / "src"), PYTHONUNBUFFERED="1")
                env.pop("PYTORCH_ALLOC_CONF", None)
                if conf:
                    env["PYTORCH_CUDA_ALLOC_CONF"] = conf
                else:
                    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
                cmd = [sys.executable, str(REPO / "bench/capwrap.py"), "--out", str(prefix), "--cap", str(cap)]
                cmd += (["--record", "--stacks", stacks] if record else []) + (["--size", size] if size else [])
                cmd += ["--", *target]
                t = time.monotonic()
                p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=left)
                with open(self.log, "a") as f:
                    f.write(f"[{time.monotonic() - T0:6.1f}s] {prefix.name} rc={p.returncode} "
                            f"{time.monotonic() - t:.1f}s {p.stdout.strip()[-200:]} {p.stderr.strip()[-400:]}\n")
                side = Path(str(prefix) + ".json")
                return json.loads(side.read_text()) if side.exists() else None
            except subprocess.TimeoutExpired:
                return None
            finally:
                with self.cv:
                    self.claimed -= claim
                    self.cv.notify_all()


def pool_options(ap: argparse.ArgumentParser, jobs: int, deadline: float) -> None:
    """The options every GPU job of bench/ takes: its output folder, the runs at once, and the
    seconds after its start when it stops starting runs (so that it ends within the device's call)."""
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=jobs)
    ap.add_argument("--deadline", type=float, default=deadline)


def open_pool(a: argparse.Namespace) -> tuple[Path, Pool]:
    """The output folder of `pool_options` (made) and a `Pool` logging to log.txt in it."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    return out, Pool(a.jobs, a.deadline, out / "log.txt")


def stage_record(a: argparse.Namespace) -> None:
    out, pool = open_pool(a)
    jobs = []
    for w, target in REAL.items():
        for c, conf in CONFS.items():
            jobs.append((out / f"{w}_{c}", target, conf, 0, True, "python", None))
    for w, target in OWN.items():
        for c, conf in CONFS.items():
            jobs.append((out / f"{w}_{c}", target, conf, 0, False, "python", None))
    for w, (sizes, make) in SIZES.items():
        for s in sizes:
            jobs.append((out / f"size_{w}_{s}", make(s), "", 0, True, "python", str(s)))
    # C++ stacks make every allocation slow to record: a short run, its own time limit, queued last
    jobs.append((out / "hubert_default_cpp", REAL["hubert"][:3] + ["2", "--quiet"], "", 0, True, "all", None,
                 8 << 30, 150.0))
    with ThreadPoolExecutor(len(jobs)) as ex:
        results = dict(zip([j[0].name for j in jobs], ex.map(lambda j: pool.run(*j), jobs)))
    # calibration: convolution workloads capped between peak allocated and peak reserved
    cal = []
    for w in ("hubert", "timm", "torchvision"):
        r = results.get(f"{w}_default")
        if not r:
            continue
        alloc, res = r["stats"]["allocated_bytes.all.peak"], r["stats"]["reserved_bytes.all.peak"]
        for tag, cap in (("mid", (alloc + res) // 2), ("tight", int(alloc * 1.04))):
            cal.append((out / f"{w}_default_cap_{tag}", REAL[w], "", cap, True, "python", None))
    with ThreadPoolExecutor(max(1, len(cal))) as ex:
        list(ex.map(lambda j: pool.run(*j), cal))
    print(f"record stage done in {time.monotonic() - T0:.0f}s", flush=True)


def bisect_budget(pool: Pool, out: Path, name: str, target: list[str], conf: str, lo: int, hi: int,
                  steps: int) -> dict:
    """Fresh-process bisection of the smallest completing cap between lo and hi, both ends tested.

    The first run confirms hi (widened ×1.25 once if it fails), the second tests lo (lowered ×0.85 while it
    passes: a program whose convolutions give workspaces up can complete below its peak allocated, so an
    untested lower end is only a guess), the rest halve the bracket; `fails_at` is always a run that failed."""
    runs: list[dict] = []
    hi_ok = None
    lo_failed = False
    for k in range(steps):
        if k == 0:
            cap = hi
        elif not lo_failed:
            cap = lo
        else:
            cap = (lo + hi) // 2
        r = pool.run(out / f"{name}_b{k}", target, conf, cap=cap)
        if r is None:
            break
        ok = r["outcome"] == "ok"
        runs.append({"cap": cap, "outcome": r["outcome"], "num_ooms": r["stats"].get("num_ooms", 0)})
        if k == 0:
            if not ok:  # the uncapped peak did not fit under its own cap: widen once
                lo, hi = hi, int(hi * 1.25)
                lo_failed = True
                continue
            hi_ok = hi
        elif not lo_failed and cap == lo:
            if ok:
                hi, hi_ok, lo = lo, lo, int(lo * 0.85)
            else:
                lo_failed = True
        elif ok:
            hi, hi_ok = cap, cap
        else:
            lo = cap
    return {"name": name, "conf": conf, "min_budget": hi_ok, "fails_at": lo if lo_failed else None, "runs": runs}


def bisect_size(pool: Pool, out: Path, name: str, sizes: list[int], make, conf: str, cap: int, steps: int) -> dict:
    """Largest size that completes under `cap`, by bisection on a 2 % grid (fresh processes)."""
    lo, hi = sizes[0], sizes[-1]
    runs = []
    r = pool.run(out / f"{name}_lo", make(lo), conf, cap=cap)
    if r is None or r["outcome"] != "ok":
        return {"name": name, "conf": conf, "cap": cap, "largest_ok": None, "smallest_fail": lo, "runs": runs}
    runs.append({"size": lo, "outcome": "ok"})
    r = pool.run(out / f"{name}_hi", make(hi), conf, cap=cap)
    if r is not None and r["outcome"] == "ok":
        return {"name": name, "conf": conf, "cap": cap, "largest_ok": hi, "smallest_fail": None,
                "runs": runs + [{"size": hi, "outcome": "ok"}]}
    runs.append({"size": hi, "outcome": r["outcome"] if r else "?"})
    k = 0
    while hi > lo * 1.02 and hi - lo > 1 and k < steps:
        mid = (lo + hi) // 2
        r = pool.run(out / f"{name}_s{k}", make(mid), conf, cap=cap)
        if r is None:
            break
        runs.append({"size": mid, "outcome": r["outcome"]})
        if r["outcome"] == "ok":
            lo = mid
        else:
            hi = mid
        k += 1
    return {"name": name, "conf": conf, "cap": cap, "largest_ok": lo, "smallest_fail": hi, "runs": runs}


def stage_bisect(a: argparse.Namespace) -> None:
    out, pool = open_pool(a)
    side = {p.name[:-5]: json.loads(p.read_text()) for p in Path(a.sidecars).glob("*.json")}
    tasks = []
    for w, target in {**REAL, **OWN}.items():
        for c, conf in CONFS.items():
            r = side.get(f"{w}_{c}")
            if not r or r["outcome"] != "ok":
                continue
            st = r["stats"]
            lo = int(st["allocated_bytes.all.peak"] * 0.97)
            hi = int(st["reserved_bytes.all.peak"] * 1.01)
            tasks.append(("budget", (pool, out, f"{w}_{c}", target, conf, lo, hi, a.steps)))
    for w, (sizes, make) in SIZES.items():
        peaks = [side.get(f"size_{w}_{s}", {}).get("stats", {}).get("reserved_bytes.all.peak") for s in sizes]
        if None in peaks:
            continue
        for tag, cap in (("c1", peaks[2]), ("c2", peaks[4])):
            for c in ("default", "expandable"):
                tasks.append(("size", (pool, out, f"plan_{w}_{c}_{tag}", sizes, make, CONFS[c], cap, 7)))
    with ThreadPoolExecutor(len(tasks)) as ex:
        futs = [ex.submit(bisect_budget if kind == "budget" else bisect_size, *args) for kind, args in tasks]
        results = [f.result() for f in futs]
    (out / "bisect_results.json").write_text(json.dumps(results, indent=1))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runlog import log_result

    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k != "runs"}), flush=True)
        log_result(", ".join(f"{k} {v}" for k, v in r.items() if k != "runs"), folder=out)
    print(f"bisect stage done in {time.monotonic() - T0:.0f}s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=("record", "bisect"))
    pool_options(ap, jobs=12, deadline=500)
    ap.add_argument("--sidecars")
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    (stage_record if a.stage == "record" else stage_bisect)(a)


if __name__ == "__main__":
    main()
