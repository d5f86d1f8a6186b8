"""Device data for issue 28 (jobs `plan-sharp` and `plan-confirm` of bench/gpu.py): sized recordings, calibration
runs and the real largest size under two caps x two settings, for real library code; and `plan --confirm` of them.

    python bench/gpu_plan_sharp.py --out "$OUT/plan_sharp" --jobs 12 --deadline 520
    python bench/gpu_plan_sharp.py confirm --data DIR [--cases hubert:c1:default,...] --out "$OUT/plan_confirm"

Workloads (bench/real_workloads.py, random weights, one item per fresh process): HuBERT audio seconds,
timm ResNet-50 image side (batch 4), a transformers Llama decoder's prompt length (generate, 32 new tokens).

1. record each workload at three sizes, uncapped, default setting (history without stacks);
2. calibration: the middle size recorded under caps between its peak allocated and peak reserved
   (where cuDNN/cuBLAS fall back to smaller workspaces), as `plan` would be given;
3. the REAL largest size that completes under two caps (1.6x and 3x the largest recording's peak
   reserved) x default / expandable segments, by bisection on a 2 % size grid between the largest
   recorded size and 10x it, fresh processes (`bench/capwrap.py`).

Everything lands under --out (recordings + sidecars, `truth.json`); `bench/plan_sharp_gpu_data.py`
(pure CPU) scores `plan` against it. `confirm`: the plan of those recordings (and of `--extra` sizes
recorded first: what plan asks for when its bound stops the search), confirmed by running the program at
the predicted size under each cap, against the real largest size bisected; one line per case, confirm.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from suite import BENCH, ROOT, T0, alloctune, bisect_size, child_env, open_pool, pool_options

CONFS = {"default": "", "expandable": "expandable_segments:True"}
SIZES = {"hubert": [8, 16, 24], "timm": [256, 384, 512], "llama": [1024, 2048, 3072]}
DEFAULT_CASES = "hubert:c1:default,hubert:c2:expandable,timm:c1:default,llama:c2:default"


def target(w: str, s: int) -> list[str]:
    return ["bench/real_workloads.py", w, "--count", "1", "--quiet", "--size", str(s)]


def record(a: argparse.Namespace) -> int:
    out, pool = open_pool(a)
    rec = [(w, s) for w, sizes in SIZES.items() for s in sizes]
    with ThreadPoolExecutor(len(rec)) as ex:
        side = dict(zip(rec, ex.map(lambda ws: pool.run(out / f"size_{ws[0]}_{ws[1]}", target(*ws), "", record=True,
                                                          stacks="none", size=str(ws[1])), rec)))
    print(f"recordings done at {time.monotonic() - T0:.0f}s", flush=True)
    tasks = []
    for w, sizes in SIZES.items():
        top, mid = side.get((w, sizes[-1])), side.get((w, sizes[1]))
        if not top or top["outcome"] != "ok":
            continue
        peak = top["stats"]["reserved_bytes.all.peak"]
        for tag, f in (("c1", 1.6), ("c2", 3.0)):
            for c, conf in CONFS.items():
                tasks.append(("size", (pool, out, f"plan_{w}_{c}_{tag}", [sizes[-1], sizes[-1] * 10],
                                       (lambda s, w=w: target(w, s)), conf, int(peak * f), 10)))
        if w in ("hubert", "timm") and mid and mid["outcome"] == "ok":
            al, res = mid["stats"]["allocated_bytes.all.peak"], mid["stats"]["reserved_bytes.all.peak"]
            for tag, cap in (("mid", (al + res) // 2), ("tight", int(al * 1.04))):
                tasks.append(("cal", (out / f"cal_{w}_{sizes[1]}_{tag}", target(w, sizes[1]), "", cap, True,
                                      "none", str(sizes[1]))))
    with ThreadPoolExecutor(len(tasks)) as ex:
        futs = [(k, ex.submit(bisect_size if k == "size" else pool.run, *args)) for k, args in tasks]
        results = [f.result() for k, f in futs if k == "size"]
    truth = {"sizes": SIZES, "bisections": results, "caps": {r["name"]: r["cap"] for r in results}}
    (out / "truth.json").write_text(json.dumps(truth, indent=1))
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k != "runs"}), flush=True)
    print(f"plan-sharp done in {time.monotonic() - T0:.0f}s", flush=True)
    return 0


def fell_back(recording: Path) -> bool:
    """Whether a calibration run shows a fallback (its sidecar counts an OOM that the program caught or
    that ended it): plan refuses one that completed without any, as it teaches nothing."""
    from alloctune.errors import TraceError
    from alloctune.trace.sidecar import read_sidecar

    try:
        meta = read_sidecar(recording)
    except TraceError:
        meta = {}
    if not meta:
        return True  # no readable sidecar: let plan judge the recording itself
    return meta.get("outcome") == "oom" or bool((meta.get("stats") or {}).get("num_ooms"))


def confirm(a: argparse.Namespace) -> int:
    data, out = Path(a.data), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    found = json.loads((data / "truth.json").read_text())
    truth, sizes = {r["name"]: r for r in found["bisections"]}, found["sizes"]
    procs = []
    for spec in filter(None, a.extra.split(";")):
        w, _, ss = spec.partition("=")
        for s in ss.split(","):
            procs.append(subprocess.Popen([sys.executable, str(BENCH / "capwrap.py"), "--out", str(out / f"size_{w}_{s}"),
                                           "--record", "--stacks", "none", "--size", s, "--", *target(w, int(s))],
                                          cwd=ROOT, env=child_env()))
            sizes[w] = sorted(set(sizes[w]) | {int(s)})
    for p in procs:
        p.wait(timeout=300)

    def rec(w: str, s: int) -> str:
        f = out / f"size_{w}_{s}.pickle.xz"
        return f"{f if f.exists() else data / f.name}:{s}"

    rows = []
    for case in a.cases.split(","):
        w, tag, setting = case.split(":")
        t = truth[f"plan_{w}_{setting}_{tag}"]
        cals = [f"--calibration={c}:{c.name.split('_')[2]}" for c in sorted(data.glob(f"cal_{w}_*.pickle.xz"))
                if fell_back(c)]
        prog = f"{sys.executable} bench/real_workloads.py {w} --count 1 --quiet --size {{size}}"
        args = ["plan", *(rec(w, s) for s in sizes[w]), "--cap", f"{t['cap']}B", "-c", CONFS[setting], *cals, "--json",
                "--confirm", prog]
        t0 = time.monotonic()
        p = alloctune(*args, timeout=400)
        (out / f"{w}_{tag}_{setting}.json").write_text(p.stdout)
        (out / f"{w}_{tag}_{setting}.stderr").write_text(p.stderr)
        row = {"case": case, "rc": p.returncode, "wall_s": round(time.monotonic() - t0, 1), "largest_ok": t["largest_ok"],
               "smallest_fail": t["smallest_fail"], "cmd": " ".join(["-m", "alloctune", *args])}
        try:
            res = json.loads(p.stdout)
            row["confirm"] = res.get("confirm") or res.get("confirmations") or []
        except ValueError:
            row["error"] = p.stderr.strip().splitlines()[-1:] if p.stderr.strip() else "no JSON"
        rows.append(row)
        print(json.dumps(row)[:600], flush=True)
    (out / "confirm.json").write_text(json.dumps({"sizes": sizes, "rows": rows}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "confirm":
        ap = argparse.ArgumentParser(prog="gpu_plan_sharp.py confirm", description="plan --confirm on the GPU")
        ap.add_argument("--data", required=True, help="the plan-sharp job's folder (size_*.pickle.xz, truth.json)")
        ap.add_argument("--cases", default=DEFAULT_CASES)
        ap.add_argument("--out", required=True)
        ap.add_argument("--extra", default="timm=640,768", help="more sizes to record first (WORKLOAD=S,S;...)")
        return confirm(ap.parse_args(argv[1:]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pool_options(ap, jobs=12, deadline=520)
    return record(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
