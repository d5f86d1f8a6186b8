"""Real recordings and independent ground truth, side by side on one GPU (jobs `recordings`, `bisections`, `truth`).

    python bench/gpu_recordings.py record --out $OUT/a --jobs 12 --deadline 500
    python bench/gpu_recordings.py bisect --sidecars DIR --out $OUT/b --jobs 14 --deadline 540
    python bench/gpu_recordings.py truth --out $OUT --jobs 10 --deadline 540 [--tunes hubert,timm,...]

Every run is a fresh process (`bench/capwrap.py`: the cap by `set_per_process_memory_fraction`, the bench's
own code, not alloctune's agent), side by side on one GPU under a memory claim (suite.Pool).

record: real-library workloads (hubert, timm, torchvision, llama) under default / expandable /
max_split_128, uncapped, history recorded (Python stacks): fidelity on recordings no model was fitted to;
hubert with C++ stacks (`stacks="all"`): which frames ask for workspaces; capped recordings of the
convolution workloads between peak allocated and peak reserved (the calibration runs in which cuDNN falls
back to smaller workspaces); rvc / diffusion uncapped under the three settings (peaks only); size sweeps for
capacity planning: rvc audio seconds, timm image side, llama prompt tokens.

bisect (reads the record stage's sidecars): min-budget bisection of every workload x setting, 6 steps;
the largest size that completes under two caps x two settings (2 % size grid).

truth: each standard setting's smallest working cap with both ends tested (the bisect stage assumed its
lower end, 0.97 x peak allocated, fails and never ran it, so on convolution workloads, which adapt under a
cap, its answer was only an upper bound): an opening round of caps at 0.70, 0.85, 1.00 and 1.15 x a prior P
(the earlier bisection's tested pass for this workload and setting, else the default's), widened by x0.6
downwards while the lowest passes and by x1.3 upwards while the highest fails; then rounds of three caps
side by side, each splitting the bracket in four, until the tested pass and the tested failure are within
1 % of the pass. Rows are appended to `truth.jsonl` as each setting finishes (a run cut off keeps what
finished); `--tunes` runs gpu_tune.py's tunes of the same commands beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runlog import log_result
from suite import BENCH, T0, bisect_budget, bisect_size, open_pool, pool_options

CONFS = {"default": "", "expandable": "expandable_segments:True", "max_split_128": "max_split_size_mb:128"}
STANDARD = {**CONFS, "max_split_256": "max_split_size_mb:256", "max_split_512": "max_split_size_mb:512",
            "gc_split_256": "garbage_collection_threshold:0.6,max_split_size_mb:256",
            "roundup_4": "roundup_power2_divisions:4"}
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
PRIOR = BENCH / "gpu-results" / "batch8" / "b" / "bisect_results.json"
ALIGN = 2 << 20
LOCK = threading.Lock()


def stage_record(a: argparse.Namespace) -> None:
    out, pool = open_pool(a)
    jobs = [(out / f"{w}_{c}", target, conf, 0, w in REAL, "python", None)
            for w, target in {**REAL, **OWN}.items() for c, conf in CONFS.items()]
    jobs += [(out / f"size_{w}_{s}", make(s), "", 0, True, "python", str(s)) for w, (sizes, make) in SIZES.items()
             for s in sizes]
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


def stage_bisect(a: argparse.Namespace) -> None:
    out, pool = open_pool(a)
    side = {p.name[:-5]: json.loads(p.read_text()) for p in Path(a.sidecars).glob("*.json")}
    tasks = []
    for w, target in {**REAL, **OWN}.items():
        for c, conf in CONFS.items():
            r = side.get(f"{w}_{c}")
            if r and r["outcome"] == "ok":
                lo, hi = int(r["stats"]["allocated_bytes.all.peak"] * 0.97), int(r["stats"]["reserved_bytes.all.peak"] * 1.01)
                tasks.append((bisect_budget, (pool, out, f"{w}_{c}", target, conf, lo, hi, a.steps)))
    for w, (sizes, make) in SIZES.items():
        peaks = [side.get(f"size_{w}_{s}", {}).get("stats", {}).get("reserved_bytes.all.peak") for s in sizes]
        if None not in peaks:
            tasks += [(bisect_size, (pool, out, f"plan_{w}_{c}_{tag}", sizes, make, CONFS[c], cap, 7))
                      for tag, cap in (("c1", peaks[2]), ("c2", peaks[4])) for c in ("default", "expandable")]
    with ThreadPoolExecutor(len(tasks)) as ex:
        results = [f.result() for f in [ex.submit(fn, *args) for fn, args in tasks]]
    (out / "bisect_results.json").write_text(json.dumps(results, indent=1))
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k != "runs"}), flush=True)
        log_result(", ".join(f"{k} {v}" for k, v in r.items() if k != "runs"), folder=out)
    print(f"bisect stage done in {time.monotonic() - T0:.0f}s", flush=True)


def _align(n: int) -> int:
    return max(ALIGN, n // ALIGN * ALIGN)


def truth(pool, out: Path, workload: str, setting: str, prior: int) -> dict:
    target, conf = {**REAL, **OWN}[workload], STANDARD[setting]
    runs: list[dict] = []
    name = f"{workload}_{setting}"
    passed: int | None = None
    failed: int | None = None

    def probe(caps: list[int]) -> None:
        nonlocal passed, failed
        caps = sorted(set(caps))
        with ThreadPoolExecutor(len(caps)) as ex:
            res = list(ex.map(lambda c: pool.run(out / "runs" / f"{name}_{c >> 20}", target, conf, cap=c), caps))
        for c, r in zip(caps, res):
            runs.append({"cap": c, "outcome": None if r is None else r["outcome"],
                         "num_ooms": None if r is None else r["stats"].get("num_ooms")})
            if r is not None and r["outcome"] == "ok":  # a crash or error is no evidence either way
                passed = c if passed is None else min(passed, c)
            elif r is not None and r["outcome"] == "oom":
                failed = c if failed is None else max(failed, c)

    probe([_align(int(prior * f)) for f in (0.70, 0.85, 1.00, 1.15)])
    lo_f, hi_f = 0.70, 1.15
    while passed is not None and failed is None and lo_f > 0.05:  # everything passed: lower
        lo_f *= 0.6
        probe([_align(int(prior * lo_f))])
    while passed is None and hi_f < 4 and (failed is not None or not runs or runs[-1]["outcome"] is not None):
        hi_f *= 1.3  # everything failed: higher
        probe([_align(int(prior * hi_f))])
    for _ in range(4):  # two rounds from the opening grid; more only after a widening
        if passed is None or failed is None or passed - failed <= max(ALIGN, passed // 100):
            break
        step = (passed - failed) / 4
        caps = [c for c in (_align(int(failed + step * k)) for k in (1, 2, 3)) if failed < c < passed]
        if not caps:
            break
        probe(caps)
    row = {"workload": workload, "setting": setting, "conf": conf, "command": target, "prior": prior,
           "min_budget": passed, "fails_at": failed, "runs": runs}
    with LOCK, (out / "truth.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps({k: v for k, v in row.items() if k not in ("runs", "command")}), flush=True)
    log_result(f"{workload} {setting}: min budget {passed} B, fails at {failed} B ({len(runs)} runs)", folder=out,
               bench="gpu_truth")
    return row


def stage_truth(a: argparse.Namespace) -> None:
    out, pool = open_pool(a)
    (out / "runs").mkdir(exist_ok=True)
    done = set()
    if a.skip_done and a.skip_done.exists():
        done = {(r["workload"], r["setting"]) for r in map(json.loads, a.skip_done.read_text().splitlines())
                if r.get("min_budget") and r.get("fails_at")
                and r["min_budget"] - r["fails_at"] <= max(ALIGN, r["min_budget"] // 100)}
    try:  # the earlier bisection's tested passes by "{workload}_{setting}" (a starting point only)
        prior = {r["name"]: r["min_budget"] for r in json.loads(PRIOR.read_text()) if r.get("min_budget")}
    except (OSError, ValueError):
        prior = {}
    tunes = None
    if a.tunes:
        import gpu_tune

        tunes = threading.Thread(target=gpu_tune.main, args=(["real", "--out", str(out / "tune"), "--only", a.tunes,
                                                               "--timeout", str(a.deadline - 30)],), daemon=True)
        tunes.start()
    # settings in order of importance, so a deadline cuts the least useful ones
    tasks = [(w, s) for s in a.settings.split(",") for w in a.workloads.split(",") if (w, s) not in done]
    with ThreadPoolExecutor(max(2, a.jobs // 2)) as ex:  # a few settings at a time, in order
        futs = [ex.submit(truth, pool, out, w, s, prior.get(f"{w}_{s}") or prior.get(f"{w}_default") or (1 << 30))
                for w, s in tasks]
        for f in futs:
            try:
                f.result()
            except Exception as exc:  # noqa: BLE001 - one setting's failure must not lose the others
                print(f"truth: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    if tunes is not None:
        tunes.join(timeout=max(1.0, a.deadline - (time.monotonic() - T0)))
    print(f"truth done in {time.monotonic() - T0:.0f}s", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=("record", "bisect", "truth"))
    pool_options(ap, jobs=0, deadline=0)  # 0: the stage's own (record, bisect: 12 and 500 s; truth: 10 and 540 s)
    ap.add_argument("--sidecars", help="bisect: the record stage's folder")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--workloads", default=",".join({**REAL, **OWN}), help="truth: comma list")
    ap.add_argument("--settings", default=",".join(STANDARD), help="truth: comma list of STANDARD names")
    ap.add_argument("--tunes", default="", help="truth: also run gpu_tune.py's tunes for these workloads, side by side")
    ap.add_argument("--skip-done", type=Path, default=None, help="truth: a truth.jsonl whose rows are not measured again")
    a = ap.parse_args(argv)
    a.jobs, a.deadline = a.jobs or (10 if a.stage == "truth" else 12), a.deadline or (540 if a.stage == "truth" else 500)
    {"record": stage_record, "bisect": stage_bisect, "truth": stage_truth}[a.stage](a)


if __name__ == "__main__":
    main()
