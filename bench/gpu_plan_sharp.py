"""Device data for issue 28 (job `plan-sharp` of bench/gpu.py): sized recordings, calibration runs and
the real largest size under two caps x two settings, for real library code.

Workloads (bench/real_workloads.py, random weights, one item per fresh process): HuBERT audio seconds,
timm ResNet-50 image side (batch 4), a transformers Llama decoder's prompt length (generate, 32 new tokens).

1. record each workload at three sizes, uncapped, default setting (history with Python stacks);
2. calibration: the middle size recorded under caps between its peak allocated and peak reserved
   (where cuDNN/cuBLAS fall back to smaller workspaces), as `plan` would be given;
3. the REAL largest size that completes under two caps (1.6x and 3x the largest recording's peak
   reserved) x default / expandable segments, by bisection on a 2 % size grid between the largest
   recorded size and 10x it, fresh processes (`bench/capwrap.py`).

Everything lands under --out (recordings + sidecars, `truth.json`); `bench/plan_sharp_gpu_data.py`
(pure CPU) scores `plan` against it.

    python bench/gpu_plan_sharp.py --out "$OUT/plan_sharp" --jobs 12 --deadline 520
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_recordings as gr  # noqa: E402

CONFS = {"default": "", "expandable": "expandable_segments:True"}
SIZES = {"hubert": [8, 16, 24], "timm": [256, 384, 512], "llama": [1024, 2048, 3072]}


def target(w: str, s: int) -> list[str]:
    return ["bench/real_workloads.py", w, "--count", "1", "--quiet", "--size", str(s)]


def main() -> None:
    ap = argparse.ArgumentParser()
    gr.pool_options(ap, jobs=12, deadline=520)
    a = ap.parse_args()
    out, pool = gr.open_pool(a)
    rec = [(w, s) for w, sizes in SIZES.items() for s in sizes]
    with ThreadPoolExecutor(len(rec)) as ex:
        side = dict(zip(rec, ex.map(lambda ws: pool.run(out / f"size_{ws[0]}_{ws[1]}", target(*ws), "", record=True,
                                                          stacks="none", size=str(ws[1])), rec)))
    print(f"recordings done at {time.monotonic() - gr.T0:.0f}s", flush=True)
    tasks = []
    for w, sizes in SIZES.items():
        top = side.get((w, sizes[-1]))
        mid = side.get((w, sizes[1]))
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
        futs = [(k, ex.submit(gr.bisect_size if k == "size" else pool.run, *args)) for k, args in tasks]
        results = [f.result() for k, f in futs if k == "size"]
    truth = {"sizes": SIZES, "bisections": results,
             "caps": {r["name"]: r["cap"] for r in results}}
    (out / "truth.json").write_text(json.dumps(truth, indent=1))
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k != "runs"}), flush=True)
    print(f"plan-sharp done in {time.monotonic() - gr.T0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
