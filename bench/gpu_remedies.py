"""Device data for issue 29 (job `remedies` of bench/gpu.py): what each program-level remedy really
saves, measured on programs with the remedy applied BY HAND (bench/cap_programs.py), next to the
recordings alloctune predicts from.

1. alloctune records the unchanged programs (agent, Python stacks): `hubert` (inference with autograd
   on), `seg` (DeepLabV3 at mixed sizes, the cache fragments), `convnext` (timm ConvNeXt, cuDNN
   workspaces); and `hubert` once more with the agent's `--no-grad` switch (the measured remedy);
2. every program and every hand-remedied variant (`hubert_nograd`, `hubert_cublas`, `seg_ec`,
   `convnext_bench`) runs uncapped (peaks) and then has its REAL min budget bisected (default
   setting, fresh processes, `bench/capwrap.py`, 8 steps between peak allocated and peak reserved).

`bench/remedies_gpu_data.py` (pure CPU) then compares alloctune's simulated / measured answers from
(1) with the real runs of (2).

    python bench/gpu_remedies.py --out "$OUT/remedies" --jobs 8 --deadline 520
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_recordings as gr  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = ["hubert", "hubert_nograd", "hubert_cublas", "seg", "seg_ec", "det", "det_ec", "convnext", "convnext_bench"]
RECORD = {"hubert": [], "hubert_nograd_agent": ["--no-grad"], "seg": [], "det": [], "convnext": []}
# calibration runs (the same program under a cap between its peak allocated and peak reserved, where cuDNN
# falls back to smaller workspaces): what turns the conservative min budget into one number
CALIBRATE = {"hubert_nograd_agent": ["--no-grad"], "seg": [], "det": [], "convnext": [], "hubert": []}


def record(out: Path, name: str, extra: list[str], budget: int = 0, tag: str = "") -> dict:
    prog = name.removesuffix("_agent").removesuffix("_nograd") if extra else name
    extra = extra + (["--budget", f"{budget}B"] if budget else [])
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    cmd = [sys.executable, "-m", "alloctune", "run", *extra, "--record", str(out / f"rec_{name}{tag}.pickle"), "--json",
           "--", sys.executable, "bench/cap_programs.py", prog]
    t = time.monotonic()
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    (out / f"rec_{name}{tag}.log").write_text(p.stdout + "\n--- stderr\n" + p.stderr)
    return {"name": name + tag, "cmd": " ".join(cmd[1:]), "rc": p.returncode, "wall_s": round(time.monotonic() - t, 1)}


def trial(out: Path, name: str) -> dict | None:
    log = out / f"rec_{name}.log"
    if not log.exists():
        return None
    try:
        return json.loads(log.read_text().split("\n--- stderr")[0])
    except ValueError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    gr.pool_options(ap, jobs=8, deadline=520)
    ap.add_argument("--only", default="", help="comma list of programs (peaks + bisections) to run")
    ap.add_argument("--calibrate", action="store_true", help="only the calibration runs (needs the recordings in --out)")
    a = ap.parse_args()
    out, pool = gr.open_pool(a)
    programs = a.only.split(",") if a.only else PROGRAMS
    # with --only, only the recordings of the programs named (hubert_nograd_agent goes with hubert_nograd)
    record_set = {n: x for n, x in RECORD.items() if not a.only or n.removesuffix("_agent") in programs}
    cal_jobs = []
    for name, extra in CALIBRATE.items():
        if a.only and name.removesuffix("_agent") not in programs:
            continue
        r = trial(out, name) if a.calibrate else None
        if r and r.get("peak_allocated") and r.get("peak_reserved"):
            al, res = r["peak_allocated"], r["peak_reserved"]
            # mid: between the peaks; tight: just above peak allocated; low: just below it, where cuDNN must
            # fall back further than the tight run shows (the ladders below it are what a min budget needs)
            cal_jobs += [(name, extra, (al + res) // 2, "_cal_mid"), (name, extra, int(al * 1.04), "_cal_tight"),
                         (name, extra, int(al * 0.96), "_cal_low")]
    with ThreadPoolExecutor(len(programs) + len(record_set) + len(cal_jobs)) as ex:
        recs = [ex.submit(record, out, *j) for j in cal_jobs] if a.calibrate else [
            ex.submit(record, out, n, x) for n, x in record_set.items()]
        peaks = dict(zip(programs, ex.map(lambda p: pool.run(out / f"peak_{p}", ["bench/cap_programs.py", p], ""),
                                          programs)))
        recorded = [r.result() for r in recs]
    print(f"recordings and peaks done at {time.monotonic() - gr.T0:.0f}s", flush=True)
    tasks = []
    for p, r in peaks.items():
        if r and r["outcome"] == "ok":
            st = r["stats"]
            tasks.append((p, int(st["allocated_bytes.all.peak"] * 0.97), int(st["reserved_bytes.all.peak"] * 1.01)))
    with ThreadPoolExecutor(max(1, len(tasks))) as ex:
        bis = list(ex.map(lambda t: gr.bisect_budget(pool, out, f"min_{t[0]}", ["bench/cap_programs.py", t[0]], "",
                                                      t[1], t[2], 10), tasks))
    result = {"recorded": recorded, "peaks": {p: (r or {}).get("stats") for p, r in peaks.items()},
              "min_budget": {b["name"][4:]: b for b in bis}}
    (out / ("remedies_cal.json" if a.calibrate else "remedies.json")).write_text(json.dumps(result, indent=1))
    for b in bis:
        print(json.dumps({k: v for k, v in b.items() if k != "runs"}), flush=True)
    print(f"remedies done in {time.monotonic() - gr.T0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
