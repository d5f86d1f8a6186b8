"""GPU evidence for `alloctune diagnose` under a cap (job `diagnose-cap` of bench/gpu.py).

    OUT=/tmp/out python3 bench/diagnose_cap_gpu.py [PROG ...]

Real OOMs of four kinds and the recommended fix re-run are tests/test_diagnose_gpu.py (job `diagnose`).

Under a cap (#30.0), the user's flow on real library programs (bench/cap_programs.py): `alloctune run --budget
CAP --on-oom snapshot -- python prog.py` dies with an OOM, then `alloctune diagnose --snapshot SNAP --json` with
no other flag. Its budget must be the cap; its verdict, what-ifs and recommendation are compared with real
runs of every standard setting under the same cap (fresh processes). The same snapshot with its run record
removed (a plain torch snapshot) must get no what-if answers. Caps come from one uncapped recording of each
program: for `seg`/`convnext` between the simulated min budgets of expandable segments and the default (a
setting should fix it), for `hubert`/`trainkeep` below every setting's (none should). The real runs are the
truth, not the choice. Writes $OUT/diagnose_cap.{json,md} and $OUT/cap_snapshots.tar.xz (the OOM snapshots,
to re-diagnose on a CPU); the table is kept as bench/results/diagnose_cap_gpu.md.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import pickle
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from runlog import log_result, md_table
from suite import BENCH
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


def main(argv: list[str]) -> int:
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
