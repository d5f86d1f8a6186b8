"""`plan --confirm` on the GPU (issue 28 item 4; job `plan-confirm` of bench/gpu.py): the plan of the
size recordings of `bench/gpu_plan_sharp.py`, confirmed by running the program at the predicted size
under each cap, against the real largest size that job bisected (`truth.json` beside the recordings).

    python bench/gpu_plan_confirm.py --data DIR [--cases hubert:c1:default,...] --out "$OUT/plan_confirm"

Prints one line per case (predicted, confirmed, GPU runs, real largest size / smallest failing size)
and writes confirm.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
CONFS = {"default": "", "expandable": "expandable_segments:True"}
DEFAULT_CASES = "hubert:c1:default,hubert:c2:expandable,timm:c1:default,llama:c2:default"


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="the plan-sharp job's folder (size_*.pickle.xz, truth.json)")
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--out", required=True)
    ap.add_argument("--extra", default="timm=640,768", help="more sizes to record first (WORKLOAD=S,S;...): "
                    "what plan asks for when its bound stops the search")
    a = ap.parse_args()
    data, out = Path(a.data), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    truth = {r["name"]: r for r in json.loads((data / "truth.json").read_text())["bisections"]}
    sizes = json.loads((data / "truth.json").read_text())["sizes"]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    procs = []
    for spec in filter(None, a.extra.split(";")):
        w, _, ss = spec.partition("=")
        for s in ss.split(","):
            prefix = out / f"size_{w}_{s}"
            procs.append(subprocess.Popen([sys.executable, "bench/capwrap.py", "--out", str(prefix), "--record",
                                           "--stacks", "none", "--size", s, "--", "bench/real_workloads.py", w,
                                           "--count", "1", "--quiet", "--size", s], cwd=ROOT, env=env))
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
        inputs = [rec(w, s) for s in sizes[w]]
        cals = [f"--calibration={c}:{c.name.split('_')[2]}" for c in sorted(data.glob(f"cal_{w}_*.pickle.xz"))
                if fell_back(c)]
        prog = f"{sys.executable} bench/real_workloads.py {w} --count 1 --quiet --size {{size}}"
        cmd = [sys.executable, "-m", "alloctune", "plan", *inputs, "--cap", f"{t['cap']}B", "-c", CONFS[setting],
               *cals, "--json", "--confirm", prog]
        t0 = time.monotonic()
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
        wall = time.monotonic() - t0
        (out / f"{w}_{tag}_{setting}.json").write_text(p.stdout)
        (out / f"{w}_{tag}_{setting}.stderr").write_text(p.stderr)
        row = {"case": case, "rc": p.returncode, "wall_s": round(wall, 1), "largest_ok": t["largest_ok"],
               "smallest_fail": t["smallest_fail"], "cmd": " ".join(cmd[1:])}
        try:
            res = json.loads(p.stdout)
            conf = res.get("confirm") or res.get("confirmations") or []
            row["confirm"] = conf
        except ValueError:
            row["error"] = p.stderr.strip().splitlines()[-1:] if p.stderr.strip() else "no JSON"
        rows.append(row)
        print(json.dumps(row)[:600], flush=True)
    (out / "confirm.json").write_text(json.dumps({"sizes": sizes, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
