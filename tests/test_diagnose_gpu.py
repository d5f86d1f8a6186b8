"""`alloctune diagnose` on real CUDA OOMs of four kinds (skipped without a device).

Each scenario runs in a fresh process (allocator settings are read once per process): `shortage` (one
400 GiB request), `cap` (fraction 0.02, 256 MiB tensors until OOM: answered within the cap, a shortage with the
cap contributing), `contention` (a second process holds ~70 % of the GPU: the verdict names its PID), `frag`
(1024 MiB then 600 MiB: every segment keeps a 424 MiB hole -> `fragmentation`), then the `frag` program again
under each allocator string its diagnosis recommended (more live memory at the OOM: the fix works). For every
real message all printed figures are found in the report, and allocated/reserved match
`torch.cuda.memory_stats()` at the OOM within the printed precision.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from decimal import Decimal

import pytest

pytestmark = pytest.mark.gpu

FIGURE = re.compile(r"(\d+(?:\.\d+)?)\s*(bytes|KiB|MiB|GiB|TiB)(?![A-Za-z])")
UNIT = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}

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
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    res = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=env, timeout=170)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, (res.stderr or res.stdout)[-800:]
    return json.loads(line[7:])


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



@pytest.fixture(scope="module")
def frag_run() -> dict:
    return run_child("frag")


@pytest.mark.parametrize("mode, verdict", [("shortage", "shortage"), ("cap", "shortage"),
                                           ("contention", "contention"), ("frag", "fragmentation")])
def test_a_real_oom_gets_its_verdict(mode, verdict, frag_run):
    res = frag_run if mode == "frag" else run_child(mode)
    got = check(res)
    assert got["ok"], got
    assert got["verdict"] == verdict, (res["message"], got["diagnosis"])
    if mode == "contention":
        assert res["holder_pid"] in got["pids"]
    if mode == "cap":
        assert "cap" in got["diagnosis"].get("contributing", ())


def test_the_recommended_fix_leaves_more_memory_live(frag_run):
    fixes = check(frag_run)["fix_confs"]
    assert fixes, "the fragmentation diagnosis recommends no allocator string"
    for conf in fixes:
        res = run_child("frag", conf)
        assert res["live_bytes"] > frag_run["live_bytes"], (conf, res["live_bytes"], frag_run["live_bytes"])
