"""What one allocator driver call costs on this GPU: cudaMalloc / cudaFree, expandable map / unmap.

Why: `alloctune tune` skips throughput runs when the driver calls a setting adds (counted by the
simulator) cannot cost `throughput_tolerance` of the run at `TuneSettings.driver_call_s` per call
and `sync_s` per synchronising retry. Those two constants must be upper bounds of what is measured
here. Each mode runs in a fresh process (the allocator reads its settings once); caching is off
for the plain mode, so every tensor is one cudaMalloc and its release one cudaFree.

    python bench/driver_cost.py [--reps 30] [--out FILE.md]   (needs CUDA; prints a table, appends to FILE)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIZES_MIB = (2, 20, 64, 256, 1024)
CHILD = r"""
import json, sys, time, torch
mode, reps, sizes = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")]
torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()
out = {}
for mib in sizes:
    n = mib << 20
    get, put = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter(); x = torch.empty(n, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
        t1 = time.perf_counter(); del x
        if mode == "expandable":
            torch.cuda.empty_cache()  # unmaps the pages the tensor mapped
        torch.cuda.synchronize(); t2 = time.perf_counter()
        get.append(t1 - t0); put.append(t2 - t1)
    out[mib] = {"alloc": get, "free": put}
print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "mode": mode, "data": out}))
"""


def run(mode: str, reps: int) -> dict:
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if mode == "plain":
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    else:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    p = subprocess.run([sys.executable, "-c", CHILD, mode, str(reps), ",".join(map(str, SIZES_MIB))],
                       capture_output=True, text=True, env=env, timeout=300)
    if p.returncode != 0:
        raise SystemExit(f"driver_cost: error: the {mode} child failed: {p.stderr.strip().splitlines()[-1:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def ms(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return 1e3 * xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "driver_cost.md")
    args = ap.parse_args(argv)
    runs = [run(m, args.reps) for m in ("plain", "expandable")]
    head = runs[0]
    lines = [f"## Allocator driver call cost — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             f"Command: `python bench/driver_cost.py --reps {args.reps}` on {head['device']}, torch {head['torch']}. "
             "First call of each size included (a fresh process per mode). ms per call: median / p90 / max.", "",
             "| mode | size MiB | alloc median | alloc p90 | alloc max | free median | free p90 | free max |",
             "|---|---|---|---|---|---|---|---|"]
    worst = 0.0
    for r in runs:
        name = "cudaMalloc / cudaFree (caching off)" if r["mode"] == "plain" else "expandable map / unmap (empty_cache)"
        for mib, d in r["data"].items():
            a, f = d["alloc"], d["free"]
            worst = max(worst, ms(a, 0.9), ms(f, 0.9))
            lines.append(f"| {name} | {mib} | {1e3 * statistics.median(a):.3f} | {ms(a, 0.9):.3f} | {1e3 * max(a):.3f} | "
                         f"{1e3 * statistics.median(f):.3f} | {ms(f, 0.9):.3f} | {1e3 * max(f):.3f} |")
    lines += ["", f"- largest p90 of any call: **{worst:.3f} ms**; `TuneSettings.driver_call_s` is "
              f"{_setting('driver_call_s')} s per call.", ""]
    text = "\n".join(lines)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as fh:
        fh.write(text + "\n")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runlog import log_result

    log_result(f"largest p90 of any driver call {worst:.3f} ms (TuneSettings.driver_call_s "
               f"{_setting('driver_call_s')} s per call)", folder=args.out.parent)
    return 0


def _setting(name: str) -> str:
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
        from alloctune.tune.strategy import TuneSettings

        return str(TuneSettings.__dataclass_fields__[name].default)
    except Exception:  # noqa: BLE001 - the table stands without it
        return "?"


if __name__ == "__main__":
    raise SystemExit(main())
