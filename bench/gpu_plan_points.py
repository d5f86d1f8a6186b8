"""Real runs at the sizes where plan's simulation says the program is not monotone in its size (#28, job
`plan-points` of bench/gpu.py): does a Llama prompt of exactly 24576 tokens fail under a cap that 24575 and
25100 fit (132 MiB blocks that fill their segments exactly), and does a timm ResNet-50 side that is not a
multiple of 4 fail where the multiples of 4 around it fit (activations rounded up, blocks a hair apart)?
Does HuBERT fail at 188 s of audio under the cap that 187 and 189..195 fit?

The bisections of `truth.json` ran sizes on a grid that missed these (24576; timm sides 757..799 and
1081..1195 other than multiples of 4; HuBERT 188 s), so each point here is a size plan answers about that no real run
has decided yet. One fresh process per point, the same wrapper and caps as `bench/gpu_plan_sharp.py`;
outcomes land in `points.json`, which `bench/plan_sharp_gpu_data.py` sets against the simulation.

    python bench/gpu_plan_points.py --out "$OUT/plan_points" --jobs 8 --deadline 300
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

from gpu_plan_sharp import target
from suite import T0, open_pool, pool_options

EXP = "expandable_segments:True"
# (bisection name in truth.json, allocator setting, cap bytes, sizes): the caps of truth.json
POINTS = [
    ("plan_llama_default_c2", "", 1623195648, [24575, 24576, 24577, 25100, 25101]),
    ("plan_llama_expandable_c1", EXP, 865704345, [10932, 10933, 10965, 10968, 10969, 11100, 11101]),
    ("plan_timm_default_c1", "", 385875968, [756, 757, 760, 769, 771, 772, 801, 804, 832]),
    ("plan_timm_default_c2", "", 723517440, [1073, 1076, 1081, 1084, 1085, 1148, 1150]),
    ("plan_timm_expandable_c1", EXP, 385875968, [796, 800, 805]),
    ("plan_hubert_default_c2", "", 1491075072, [187, 188, 189]),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    pool_options(ap, jobs=8, deadline=300)
    a = ap.parse_args()
    out, pool = open_pool(a)
    tasks = [(name, conf, cap, s) for name, conf, cap, sizes in POINTS for s in sizes]

    def one(t: tuple) -> dict:
        name, conf, cap, s = t
        workload = name.split("_")[1]
        side = pool.run(out / f"{name}_{s}", target(workload, s), conf, cap, False, size=str(s))
        return {"name": name, "conf": conf, "cap": cap, "size": s,
                "outcome": side.get("outcome") if side else "no-result"}

    with ThreadPoolExecutor(len(tasks)) as ex:
        results = list(ex.map(one, tasks))
    (out / "points.json").write_text(json.dumps({"points": results}, indent=1))
    for r in results:
        print(json.dumps(r), flush=True)
    print(f"plan-points done in {time.monotonic() - T0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
