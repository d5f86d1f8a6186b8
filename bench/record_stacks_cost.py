"""What recording Python stacks with every allocation costs (#27.4: goal < 10 % wall time).

The agent records a history with `context="alloc", stacks="python"` by default (each allocation keeps
the frames that made it, for `alloctune explain`), or with `context=None` (`--stacks none`). This
times each program of `bench/cap_programs.py` in a fresh process under both, in the order
none, python, python, none (drift cancels), and reports the median ratio per program.

Run on a CUDA machine from the repo root:  OUT=/tmp/out python3 bench/record_stacks_cost.py
Writes $OUT/record_stacks_cost.{md,json}; kept as bench/results/record_stacks_cost.md.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ("seg", "convnext", "hubert", "trainkeep")
ORDER = ("none", "python", "python", "none")

CHILD = r"""
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


def run(prog: str, mode: str) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, prog, mode, str(ROOT / "bench")], capture_output=True,
                       text=True, timeout=300)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{prog}/{mode}: rc={r.returncode} {r.stderr[-800:]}")
    dt, n, framed = line.split()[1:]
    return {"program": prog, "mode": mode, "seconds": float(dt), "events": int(n), "events_with_frames": int(framed)}


def main() -> int:
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    runs = [run(p, m) for p in PROGRAMS for m in ORDER]
    rows = []
    for p in PROGRAMS:
        t = {m: [r["seconds"] for r in runs if r["program"] == p and r["mode"] == m] for m in ("none", "python")}
        ev = next(r for r in runs if r["program"] == p and r["mode"] == "python")
        rows.append({"program": p, "none_s": statistics.median(t["none"]), "python_s": statistics.median(t["python"]),
                     "ratio": statistics.median(t["python"]) / statistics.median(t["none"]),
                     "events": ev["events"], "events_with_frames": ev["events_with_frames"]})
    cmd = "OUT=/tmp/out python3 bench/record_stacks_cost.py"
    lines = [f"# Recording cost of Python stacks per allocation ({time.strftime('%Y-%m-%d')}, `{cmd}`)", "",
             "| program | stacks none (s) | stacks python (s) | ratio | events | events with frames |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['program']} | {r['none_s']:.2f} | {r['python_s']:.2f} | {r['ratio']:.3f} | {r['events']} | "
              f"{r['events_with_frames']} |" for r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    sys.path.insert(0, str(ROOT / "bench"))
    from runlog import log_result

    for r in rows:
        log_result(f"{r['program']}: python stacks {r['python_s']:.2f} s vs none {r['none_s']:.2f} s "
                   f"(ratio {r['ratio']:.3f}, median of 2 each)", folder=out)
    (out / "record_stacks_cost.md").write_text(text)
    (out / "record_stacks_cost.json").write_text(json.dumps({"schema": "alloctune.bench-record-stacks/1",
                                                             "command": cmd, "rows": rows, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
