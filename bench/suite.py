"""The helpers every bench script shares: paths, a child's environment, alloctune's CLI as one call, and
the process pool of the GPU jobs with its two bisections. Results go through `runlog.py`.

    from suite import ROOT, child_env, pool_options, open_pool   # scripts run as `python bench/NAME.py`

Importing it puts the repository's `src/` first on the path, so a script imports `alloctune` from this
checkout whatever is installed.

The pool runs `bench/capwrap.py` (the program in a fresh process under a cap set by
`set_per_process_memory_fraction`, optionally recording its history, a JSON sidecar beside the prefix)
with at most `--jobs` at once and their memory claims under one total, and stops starting runs after
`--deadline` seconds, so that a job ends within its device call.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
SHARED = ROOT.parent / "shared" / "traces"  # the shared H200 recordings (README there)
SHIPPED = ROOT / "src" / "alloctune" / "data" / "traces"
MiB = 1 << 20
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

T0 = time.monotonic()  # the job's start: `--deadline` counts from here
GPU_MEM = 130 << 30  # what the runs side by side may claim together (an H200 less its contexts)
CONTEXT = 1 << 30  # a CUDA context, kernels and cuDNN handles, roughly


def child_env(conf: str | None = None, **extra: str) -> dict[str, str]:
    """This environment with `src/` first on PYTHONPATH, unbuffered output and the allocator settings
    removed (then `conf`, when given, as PYTORCH_CUDA_ALLOC_CONF)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    return {**env, **extra}


def alloctune(*args: str, cwd: Path | str = ROOT, env: dict[str, str] | None = None,
              timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m alloctune ARGS` in a fresh process of this checkout; output captured as text."""
    return subprocess.run([sys.executable, "-m", "alloctune", *args], cwd=cwd, env=env or child_env(),
                          capture_output=True, text=True, timeout=timeout)


class Pool:
    """Runs capwrap jobs with at most `jobs` at once and their memory claims under `gpu_mem`."""

    def __init__(self, jobs: int, deadline: float, log: Path, gpu_mem: int | None = None):
        self.sem = threading.Semaphore(jobs)
        self.cv = threading.Condition()
        self.claimed = 0
        self.deadline, self.log, self.gpu_mem = deadline, log, gpu_mem or GPU_MEM

    def run(self, prefix: Path, target: list[str], conf: str, cap: int = 0, record: bool = False,
            stacks: str = "python", size: str | None = None, claim: int = 8 << 30,
            timeout: float | None = None) -> dict | None:
        """The sidecar of one fresh-process run of `python TARGET` under `conf` and `cap` (0: none), or
        None when it could not run (the deadline is near, it timed out, it wrote no sidecar)."""
        claim = (cap or claim) + CONTEXT
        with self.sem:
            with self.cv:
                self.cv.wait_for(lambda: self.claimed + claim <= self.gpu_mem)
                self.claimed += claim
            try:
                left = min(self.deadline - (time.monotonic() - T0), timeout or 1e9)
                if left < 20:
                    return None
                cmd = [sys.executable, str(BENCH / "capwrap.py"), "--out", str(prefix), "--cap", str(cap)]
                cmd += (["--record", "--stacks", stacks] if record else []) + (["--size", size] if size else [])
                t = time.monotonic()
                p = subprocess.run([*cmd, "--", *target], cwd=ROOT, env=child_env(conf), capture_output=True,
                                   text=True, timeout=left)
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
    """The options every pooled GPU job takes: its output folder, the runs at once, and the seconds after
    its start when it stops starting runs."""
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=jobs)
    ap.add_argument("--deadline", type=float, default=deadline)


def open_pool(a: argparse.Namespace, gpu_mem: int | None = None) -> tuple[Path, Pool]:
    """The output folder of `pool_options` (made) and a `Pool` logging to log.txt in it."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    return out, Pool(a.jobs, a.deadline, out / "log.txt", gpu_mem)


def bisect_budget(pool: Pool, out: Path, name: str, target: list[str], conf: str, lo: int, hi: int,
                  steps: int) -> dict:
    """Fresh-process bisection of the smallest completing cap between lo and hi, both ends tested.

    The first run confirms hi (widened x1.25 once if it fails), the second tests lo (lowered x0.85 while it
    passes: a program whose convolutions give workspaces up can complete below its peak allocated, so an
    untested lower end is only a guess), the rest halve the bracket; `fails_at` is always a run that failed."""
    runs: list[dict] = []
    hi_ok = None
    lo_failed = False
    for k in range(steps):
        cap = hi if k == 0 else lo if not lo_failed else (lo + hi) // 2
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
    """Largest size that completes under `cap`, by bisection on a 2 % grid between sizes[0] and sizes[-1]
    (fresh processes; `make(size)` is the target)."""
    lo, hi = sizes[0], sizes[-1]
    runs: list[dict] = []
    found = {"name": name, "conf": conf, "cap": cap}
    r = pool.run(out / f"{name}_lo", make(lo), conf, cap=cap)
    if r is None or r["outcome"] != "ok":
        return {**found, "largest_ok": None, "smallest_fail": lo, "runs": runs}
    runs.append({"size": lo, "outcome": "ok"})
    r = pool.run(out / f"{name}_hi", make(hi), conf, cap=cap)
    if r is not None and r["outcome"] == "ok":
        return {**found, "largest_ok": hi, "smallest_fail": None, "runs": runs + [{"size": hi, "outcome": "ok"}]}
    runs.append({"size": hi, "outcome": r["outcome"] if r else "?"})
    k = 0
    while hi > lo * 1.02 and hi - lo > 1 and k < steps:
        mid = (lo + hi) // 2
        r = pool.run(out / f"{name}_s{k}", make(mid), conf, cap=cap)
        if r is None:
            break
        runs.append({"size": mid, "outcome": r["outcome"]})
        lo, hi = (mid, hi) if r["outcome"] == "ok" else (lo, mid)
        k += 1
    return {**found, "largest_ok": lo, "smallest_fail": hi, "runs": runs}
