"""GPU evidence for `alloctune diagnose`: provoke real OOMs, check the parse and the verdict, and check
that the fix the diagnosis recommends really lets the same workload get further.

Each scenario runs in a fresh Python process (allocator settings are read once per process):

* `shortage`      one 400 GiB request on a ~140 GiB device                  -> expect `shortage`
* `cap`           memory fraction 0.02, allocate 256 MiB tensors until OOM  -> expect `cap`
* `contention`    a second process holds ~70% of the GPU, then we fill it   -> expect `contention` with its PID
* `frag`          the "1024 MiB then 600 MiB" pattern: every segment keeps a 424 MiB hole; fill the device
                                                                              -> expect `fragmentation`
* `frag+fix:<conf>` the same pattern with each allocator string the `frag` diagnosis recommended
                    -> expect more live memory at the OOM (the fix works)

For every real message: all printed figures must be found in the report (same checker as the corpus
test), and `allocated`/`reserved` must match `torch.cuda.memory_stats()` taken at the OOM within the
printed precision. Run: python bench/gpu.py diagnose
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

OUT = Path(os.environ.get("OUT", "/tmp/out"))
FIGURE = re.compile(r"(\d+(?:\.\d+)?)\s*(bytes|KiB|MiB|GiB|TiB)(?![A-Za-z])")
UNIT = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}

# ---------------------------------------------------------------- child side (runs on the GPU) --

CHILD = r'''
import json, os, sys, time, subprocess
import torch
mode = sys.argv[1]
MiB = 2**20
keep = []
out = {"mode": mode, "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "torch": torch.__version__}
holder = None
try:
    torch.cuda.init()
    if mode == "shortage":
        keep.append(torch.empty(256 * MiB, dtype=torch.uint8, device="cuda"))
        torch.empty(400 * 1024 * MiB, dtype=torch.uint8, device="cuda")
    elif mode == "cap":
        torch.cuda.set_per_process_memory_fraction(0.02)
        while True:
            keep.append(torch.empty(256 * MiB, dtype=torch.uint8, device="cuda"))
    elif mode == "contention":
        free, total = torch.cuda.mem_get_info()
        code = ("import torch,sys,time; x=torch.empty(int(sys.argv[1]),dtype=torch.uint8,device='cuda'); "
                "torch.cuda.synchronize(); print('held', flush=True); time.sleep(120)")
        holder = subprocess.Popen([sys.executable, "-c", code, str(int(total * 0.7))], stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "held"
        out["holder_pid"] = holder.pid
        while True:
            keep.append(torch.empty(2048 * MiB, dtype=torch.uint8, device="cuda"))
    elif mode == "frag":
        while True:
            big = torch.empty(1024 * MiB, dtype=torch.uint8, device="cuda")
            del big
            keep.append(torch.empty(600 * MiB, dtype=torch.uint8, device="cuda"))
    raise SystemExit("no OOM happened")
except torch.OutOfMemoryError as exc:
    st = torch.cuda.memory_stats()
    out.update(message=str(exc), allocated=st["allocated_bytes.all.current"], reserved=st["reserved_bytes.all.current"],
               live_tensors=len(keep), live_bytes=sum(t.numel() for t in keep),
               free_after=torch.cuda.mem_get_info()[0], num_alloc_retries=st["num_alloc_retries"])
finally:
    if holder is not None:
        holder.kill()
print("RESULT " + json.dumps(out))
'''


def run_child(mode: str, conf: str | None = None) -> dict:
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    t0 = time.time()
    res = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=env, timeout=170)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        return {"mode": mode, "conf": conf or "", "error": (res.stderr or res.stdout)[-800:]}
    data = json.loads(line[7:])
    data["wall_s"] = round(time.time() - t0, 2)
    return data


# ---------------------------------------------------------------- checks (pure, run here) --------


def close(num: str, unit: str, value: int) -> bool:
    exact = Decimal(num) * UNIT[unit]
    dec = len(num.split(".")[1]) if "." in num else 0
    slack = Decimal(UNIT[unit]) / (2 * 10**dec) if unit != "bytes" else Decimal(0)
    return abs(Decimal(value) - exact) <= slack + 1


def check(result: dict) -> dict:
    from alloctune.diagnose import diagnose_all

    msg = result.get("message")
    if not msg:
        return {"ok": False, "why": result.get("error", "no message")}
    diags = diagnose_all(msg)
    d = diags[-1]
    r = d.report
    figs = list(r.figures().values())
    missing = [f"{n} {u}" for n, u in FIGURE.findall(r.text) if not any(close(n, u, v) for v in figs)]
    stats_ok = True
    notes = []
    for name in ("allocated", "reserved"):
        val = getattr(r, name)
        if val is None:
            continue
        # the message prints format_size(): compare within its rounding
        from alloctune.diagnose.verdict import tol

        if abs(val - result[name]) > tol(result[name]) + 1:
            stats_ok = False
            notes.append(f"{name}: parsed {val} vs memory_stats {result[name]}")
    return {
        "ok": not missing and stats_ok and len(diags) == 1,
        "verdict": d.verdict,
        "shortfall": d.shortfall,
        "missing_figures": missing,
        "notes": notes,
        "format": r.format,
        "torch_hint": r.torch_hint,
        "fix_confs": [f.conf for f in d.working_fixes if f.conf],
        "pids": [pid for pid, _ in r.other_processes],
        "diagnosis": d.to_dict(),
    }


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    try:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device: nothing to measure (run this on the GPU machine)")
            return 0
    except ImportError:
        print("torch not installed")
        return 0
    expected = {"shortage": "shortage", "cap": "cap", "contention": "contention", "frag": "fragmentation"}
    rows = []
    for mode, want in expected.items():
        res = run_child(mode)
        chk = check(res)
        if mode == "contention" and chk.get("verdict") == "contention":
            chk["ok"] = chk["ok"] and res.get("holder_pid") in chk["pids"]
        rows.append({"scenario": mode, "expect": want, **res, **chk, "pass": chk.get("ok") and chk.get("verdict") == want})
    frag = next(r for r in rows if r["scenario"] == "frag")
    for conf in frag.get("fix_confs", []):
        res = run_child("frag", conf)
        chk = check(res)
        better = res.get("live_bytes", 0) > frag.get("live_bytes", 0)
        rows.append({"scenario": f"frag+fix:{conf}", "expect": "more live memory", **res, **chk, "pass": bool(better)})
    (OUT / "gpu_diagnose.json").write_text(json.dumps(rows, indent=2, default=str))
    lines = ["| scenario | expect | verdict | live at OOM | parse ok | pass |", "|---|---|---|---|---|---|"]
    for r in rows:
        live = f"{r.get('live_bytes', 0) / 2**30:.1f} GiB" if "live_bytes" in r else "-"
        lines.append(f"| {r['scenario']} | {r['expect']} | {r.get('verdict', r.get('error', '?'))[:40]} | {live} | "
                     f"{r.get('ok')} | {r['pass']} |")
    table = "\n".join(lines)
    (OUT / "gpu_diagnose.md").write_text(table + "\n")
    print(table)
    for r in rows:
        if r.get("message"):
            print(f"\n[{r['scenario']}] {r['message'][:400]}")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runlog import log_result

    for r in rows:
        log_result(f"{r['scenario']}: verdict {r.get('verdict')}, expected {r['expect']}, pass {r['pass']}", folder=OUT)
    return 0 if all(r["pass"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
