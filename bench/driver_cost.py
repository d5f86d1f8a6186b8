"""What the allocator's driver calls and the recording of stacks cost on this GPU (jobs `driver-cost`, `record-stacks`).

    python bench/driver_cost.py [--reps 30] [--out FILE.md]   # driver calls: prints a table, appends it to FILE
    OUT=/tmp/out python3 bench/driver_cost.py stacks          # stacks: $OUT/record_stacks_cost.{md,json}

Driver calls: cudaMalloc / cudaFree, expandable map / unmap. `alloctune tune` skips throughput runs when
the driver calls a setting adds (counted by the simulator) cannot cost `throughput_tolerance` of the run at
`TuneSettings.driver_call_s` per call and `sync_s` per synchronising retry: those constants must be upper
bounds of what is measured here. Each mode runs in a fresh process (the allocator reads its settings once);
caching is off for the plain mode, so every tensor is one cudaMalloc and its release one cudaFree.

Stacks (#27.4: goal < 10 % wall time): the agent records a history with `context="alloc", stacks="python"`
by default (each allocation keeps the frames that made it, for `alloctune explain`), or with `context=None`
(`--stacks none`). Each program of bench/cap_programs.py is timed in a fresh process under both, in the
order none, python, python, none (drift cancels); the median ratio per program. Kept as
bench/results/record_stacks_cost.md.
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

from runlog import log_result, md_table
from suite import BENCH

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
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["stacks"]:
        return stacks()
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
    log_result(f"largest p90 of any driver call {worst:.3f} ms (TuneSettings.driver_call_s "
               f"{_setting('driver_call_s')} s per call)", folder=args.out.parent)
    return 0


def _setting(name: str) -> str:
    try:
        from alloctune.tune.strategy import TuneSettings

        return str(TuneSettings.__dataclass_fields__[name].default)
    except Exception:  # noqa: BLE001 - the table stands without it
        return "?"


# ---- the recording of Python stacks ---------------------------------------------------------------
PROGRAMS = ("seg", "convnext", "hubert", "trainkeep")
ORDER = ("none", "python", "python", "none")

STACKS_CHILD = r"""
import sys, time, torch
sys.path.insert(0, sys.argv[3])
import cap_programs
prog, mode = sys.argv[1], sys.argv[2]
torch.cuda.init()
if mode == "none":
    torch.cuda.memory._record_memory_history(max_entries=5_000_000, context=None, stacks="python")
else:
    torch.cuda.memory._record_memory_history(max_entries=5_000_000, context="alloc", stacks=mode)
t0 = time.perf_counter()
cap_programs.PROGRAMS[prog]()
torch.cuda.synchronize()
dt = time.perf_counter() - t0
snap = torch.cuda.memory._snapshot()
n = len(snap["device_traces"][0])
framed = sum(1 for e in snap["device_traces"][0] if e.get("frames"))
print(f"RESULT {dt:.4f} {n} {framed}", flush=True)
"""


def run_stacks(prog: str, mode: str) -> dict:
    r = subprocess.run([sys.executable, "-c", STACKS_CHILD, prog, mode, str(BENCH)], capture_output=True,
                       text=True, timeout=300)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{prog}/{mode}: rc={r.returncode} {r.stderr[-800:]}")
    dt, n, framed = line.split()[1:]
    return {"program": prog, "mode": mode, "seconds": float(dt), "events": int(n), "events_with_frames": int(framed)}


def stacks() -> int:
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    runs = [run_stacks(p, m) for p in PROGRAMS for m in ORDER]
    rows = []
    for p in PROGRAMS:
        t = {m: [r["seconds"] for r in runs if r["program"] == p and r["mode"] == m] for m in ("none", "python")}
        ev = next(r for r in runs if r["program"] == p and r["mode"] == "python")
        rows.append({"program": p, "none_s": statistics.median(t["none"]), "python_s": statistics.median(t["python"]),
                     "ratio": statistics.median(t["python"]) / statistics.median(t["none"]),
                     "events": ev["events"], "events_with_frames": ev["events_with_frames"]})
    cmd = "OUT=/tmp/out python3 bench/driver_cost.py stacks"
    text = (f"# Recording cost of Python stacks per allocation ({time.strftime('%Y-%m-%d')}, `{cmd}`)\n\n" + md_table(
        ("program", "stacks none (s)", "stacks python (s)", "ratio", "events", "events with frames"),
        [(r["program"], f"{r['none_s']:.2f}", f"{r['python_s']:.2f}", f"{r['ratio']:.3f}", r["events"],
          r["events_with_frames"]) for r in rows]) + "\n")
    print(text)
    for r in rows:
        log_result(f"{r['program']}: python stacks {r['python_s']:.2f} s vs none {r['none_s']:.2f} s "
                   f"(ratio {r['ratio']:.3f}, median of 2 each)", folder=out, bench="record_stacks_cost")
    (out / "record_stacks_cost.md").write_text(text)
    (out / "record_stacks_cost.json").write_text(json.dumps({"schema": "alloctune.bench-record-stacks/1",
                                                             "command": cmd, "rows": rows, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
