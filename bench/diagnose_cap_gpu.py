"""GPU evidence for `alloctune diagnose` (jobs `diagnose-cap` and `diagnose` of bench/gpu.py).

    OUT=/tmp/out python3 bench/diagnose_cap_gpu.py [PROG ...]     # #30.0: snapshots written under a cap
    OUT=/tmp/out python3 bench/diagnose_cap_gpu.py provoked       # real OOMs of four kinds, and the fix re-run

Under a cap (#30.0), the user's flow on real library programs (bench/cap_programs.py): `alloctune run --budget
CAP --on-oom snapshot -- python prog.py` dies with an OOM, then `alloctune diagnose --snapshot SNAP --json` with
no other flag. Its budget must be the cap; its verdict, what-ifs and recommendation are compared with real
runs of every standard setting under the same cap (fresh processes). The same snapshot with its run record
removed (a plain torch snapshot) must get no what-if answers. Caps come from one uncapped recording of each
program: for `seg`/`convnext` between the simulated min budgets of expandable segments and the default (a
setting should fix it), for `hubert`/`trainkeep` below every setting's (none should). The real runs are the
truth, not the choice. Writes $OUT/diagnose_cap.{json,md} and $OUT/cap_snapshots.tar.xz (the OOM snapshots,
to re-diagnose on a CPU); the table is kept as bench/results/diagnose_cap_gpu.md.

provoked: each scenario in a fresh process (allocator settings are read once per process): `shortage` (one
400 GiB request), `cap` (fraction 0.02, 256 MiB tensors until OOM), `contention` (a second process holds ~70 %
of the GPU: the verdict must name its PID), `frag` (1024 MiB then 600 MiB: every segment keeps a 424 MiB hole
-> `fragmentation`), then `frag+fix:<conf>` with each allocator string the `frag` diagnosis recommended (more
live memory at the OOM: the fix works). For every real message all printed figures must be found in the
report, and allocated/reserved must match `torch.cuda.memory_stats()` at the OOM within the printed
precision. Writes $OUT/gpu_diagnose.{json,md}.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import pickle
import re
import subprocess
import sys
import tarfile
import time
from decimal import Decimal
from pathlib import Path

from runlog import log_result, md_table
from suite import BENCH, child_env
from suite import alloctune as run_alloctune

# isort: split
from alloctune.config.standard import STANDARD_CONFS  # after suite, which puts src/ on the path
from alloctune.units import format_size

OUT = Path(os.environ.get("OUT", "/tmp/out"))
WORK = Path(os.environ.get("WORK", "/tmp/diagnose_cap"))
FIXABLE = ("seg", "convnext")
LOG = []


def log(msg: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    LOG.append(line)


def alloctune(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return run_alloctune(*args, cwd=cwd, timeout=timeout)


def prog_cmd(name: str) -> list[str]:
    return [sys.executable, str(BENCH / "cap_programs.py"), name]


def record(name: str) -> dict:
    d = WORK / name
    d.mkdir(parents=True, exist_ok=True)
    r = alloctune("record", "--out", str(d / "uncapped.pickle"), "--", *prog_cmd(name), cwd=d)
    side = d / "uncapped.json"
    if r.returncode != 0 or not side.exists():
        raise RuntimeError(f"{name}: record failed rc={r.returncode}: {r.stdout[-1000:]} {r.stderr[-2000:]}")
    return json.loads(side.read_text())


def simulated_min_budgets(name: str) -> dict[str, int | None]:
    from alloctune.sim.sweep import sweep
    from alloctune.trace import load_trace

    trace = load_trace(WORK / name / "uncapped.pickle")
    return {r.conf: r.min_budget for r in sweep(trace, STANDARD_CONFS, find_min=True).rows}


def choose_cap(name: str, mb: dict[str, int | None]) -> int:
    known = [v for v in mb.values() if v]
    if name in FIXABLE:
        lo, hi = mb["expandable_segments:True"], mb[""]
        return (lo + hi) // 2
    return int(min(known) * 0.93)


def capped_run(name: str, conf: str, cap: int, snapshot: bool) -> dict:
    d = WORK / name / ("snap" if snapshot else f"conf{STANDARD_CONFS.index(conf)}")
    d.mkdir(parents=True, exist_ok=True)
    args = ["run", "--conf", conf, "--budget", f"{cap}B", "--json", "--timeout", "200"]
    if snapshot:
        args += ["--on-oom", "snapshot"]
    t0 = time.time()
    r = alloctune(*args, "--", *prog_cmd(name), cwd=d)
    try:
        trial = json.loads(r.stdout)
    except ValueError:
        trial = {"outcome": f"no-json rc={r.returncode}", "stderr": r.stderr[-1500:]}
    done = "DONE items=" in r.stderr
    return {"conf": conf, "outcome": trial.get("outcome"), "completed": trial.get("outcome") == "ok" and done,
            "peak_reserved": trial.get("peak_reserved"), "oom_snapshot": trial.get("oom_snapshot"),
            "wall_s": round(time.time() - t0, 1)}


def diagnose(path: str, cwd: Path) -> dict:
    r = alloctune("diagnose", "--snapshot", path, "--json", cwd=cwd)
    if r.returncode != 0:
        return {"error": r.stderr.strip()[-500:]}
    d = json.loads(r.stdout)
    d.pop("memory_map", None)
    return d


def strip_record(path: str) -> str:
    """The same snapshot as plain torch writes it: the agent's run record removed (our own file)."""
    with open(path, "rb") as fh:
        snap = pickle.load(fh)  # written by our agent in this run: trusted
    snap.pop("alloctune_run", None)
    out = str(Path(path).with_name("plain-" + Path(path).name))
    with open(out, "wb") as fh:
        pickle.dump(snap, fh)
    return out


def one_program(name: str) -> dict:
    t0 = time.time()
    rec = record(name)
    mb = simulated_min_budgets(name)
    cap = choose_cap(name, mb)
    peak = (rec.get("stats") or {}).get("reserved_bytes.all.peak") or 0
    log(f"{name}: recorded (peak reserved {format_size(peak)}), simulated min budgets "
        + ", ".join(f"{c or 'default'}={format_size(v) if v else '-'}" for c, v in mb.items())
        + f"; cap {format_size(cap)}")
    snap_run = capped_run(name, "", cap, snapshot=True)
    res = {"program": name, "cap": cap, "sim_min_budgets": mb, "snapshot_run": snap_run}
    if snap_run["oom_snapshot"]:
        res["diagnosis"] = diagnose(snap_run["oom_snapshot"], WORK / name)
        res["diagnosis_plain"] = diagnose(strip_record(snap_run["oom_snapshot"]), WORK / name)
    with cf.ThreadPoolExecutor(4) as ex:
        res["real"] = list(ex.map(lambda c: capped_run(name, c, cap, snapshot=False), STANDARD_CONFS))
    res["wall_s"] = round(time.time() - t0, 1)
    log(f"{name}: done in {res['wall_s']} s")
    return res


def verdict_row(r: dict) -> dict:
    d = r.get("diagnosis") or {}
    plain = r.get("diagnosis_plain") or {}
    completing = [x["conf"] or "(default)" for x in r["real"] if x["completed"]]
    serving = [w["config"] or "(default)" for w in d.get("what_if", []) if w.get("avoids_oom")]
    rec = d.get("recommendation")
    rec_real = next((x["completed"] for x in r["real"] if x["conf"] == rec), None) if rec is not None else None
    if d.get("verdict") == "fragmentation":
        agree = bool(rec_real)
    elif d.get("verdict") == "shortage":
        agree = not completing
    else:
        agree = None
    return {
        "program": r["program"], "cap": format_size(r["cap"]),
        "default OOMs": r["snapshot_run"]["outcome"],
        "budget (source)": f"{format_size(d['budget'])} ({d.get('budget_source')})" if d.get("budget") else "-",
        "verdict": d.get("verdict", d.get("error", "-")), "reproduced": d.get("reproduced"),
        "serve failed request (sim)": ", ".join(serving) or "none",
        "recommendation": rec or "-", "complete under the cap (real)": ", ".join(completing) or "none",
        "agree": agree,
        "plain snapshot": f"{plain.get('verdict')}, what-ifs {len(plain.get('what_if', []))}, reproduced "
                          f"{plain.get('reproduced')}" if plain else "-",
    }


# ---- provoked OOMs ---------------------------------------------------------------------------------
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
    env = child_env(conf)
    t0 = time.time()
    res = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=env, timeout=170)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        return {"mode": mode, "conf": conf or "", "error": (res.stderr or res.stdout)[-800:]}
    data = json.loads(line[7:])
    data["wall_s"] = round(time.time() - t0, 2)
    return data


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


def provoked() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device: nothing to measure (run this on the GPU machine)")
            return 0
    except ImportError:
        print("torch not installed")
        return 0
    # a CUDA memory fraction is answered within it (docs/usage/diagnose.md): a shortage, the cap contributing
    expected = {"shortage": "shortage", "cap": "shortage", "contention": "contention", "frag": "fragmentation"}
    rows = []
    for mode, want in expected.items():
        res = run_child(mode)
        chk = check(res)
        if mode == "contention" and chk.get("verdict") == "contention":
            chk["ok"] = chk["ok"] and res.get("holder_pid") in chk["pids"]
        chk["ok"] = chk["ok"] and (mode != "cap" or "cap" in (chk.get("diagnosis") or {}).get("contributing", ()))
        rows.append({"scenario": mode, "expect": want, **res, **chk, "pass": chk.get("ok") and chk.get("verdict") == want})
    frag = next(r for r in rows if r["scenario"] == "frag")
    for conf in frag.get("fix_confs", []):
        res = run_child("frag", conf)
        chk = check(res)
        better = res.get("live_bytes", 0) > frag.get("live_bytes", 0)
        rows.append({"scenario": f"frag+fix:{conf}", "expect": "more live memory", **res, **chk, "pass": bool(better)})
    (OUT / "gpu_diagnose.json").write_text(json.dumps(rows, indent=2, default=str))
    table = md_table(("scenario", "expect", "verdict", "live at OOM", "parse ok", "pass"), [
        (r["scenario"], r["expect"], r.get("verdict", r.get("error", "?"))[:40],
         f"{r.get('live_bytes', 0) / 2**30:.1f} GiB" if "live_bytes" in r else "-", r.get("ok"), r["pass"]) for r in rows])
    (OUT / "gpu_diagnose.md").write_text(table + "\n")
    print(table)
    for r in rows:
        if r.get("message"):
            print(f"\n[{r['scenario']}] {r['message'][:400]}")
    for r in rows:
        log_result(f"{r['scenario']}: verdict {r.get('verdict')}, expected {r['expect']}, pass {r['pass']}", folder=OUT)
    return 0 if all(r["pass"] for r in rows) else 1



def main(argv: list[str]) -> int:
    if argv[:1] == ["provoked"]:
        return provoked()
    names = [a for a in argv if not a.startswith("--")] or ["seg", "convnext", "hubert", "trainkeep"]
    OUT.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    results = []
    with cf.ThreadPoolExecutor(len(names)) as ex:
        for fut in [ex.submit(one_program, n) for n in names]:
            try:
                results.append(fut.result())
            except Exception as exc:  # one program's failure must not lose the others
                log(f"FAILED: {type(exc).__name__}: {exc}")
    rows = [verdict_row(r) for r in results]
    text = md_table(list(rows[0]) if rows else [], [r.values() for r in rows])
    print(text)
    (OUT / "diagnose_cap.json").write_text(json.dumps({"results": results, "rows": rows}, indent=1, default=str))
    (OUT / "diagnose_cap.md").write_text(text + "\n\n" + "\n".join(LOG) + "\n")
    for r in rows:
        log_result(f"{r['program']} under {r['cap']}: diagnosis {r['verdict']} (budget {r['budget (source)']}), "
                   f"recommended {r['recommendation']}; served in the replay: {r['serve failed request (sim)']}; "
                   f"completed for real: {r['complete under the cap (real)']}; plain snapshot: {r['plain snapshot']}",
                   folder=OUT)
    with tarfile.open(OUT / "cap_snapshots.tar.xz", "w:xz") as tar:
        for r in results:
            p = r["snapshot_run"].get("oom_snapshot")
            if p and os.path.exists(p):
                tar.add(p, arcname=f"{r['program']}.pickle")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
