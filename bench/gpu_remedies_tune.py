"""#29 on the H200: the remedies `tune` and `explain` offer, against the same programs with the remedy
applied by hand (bench/cap_programs.py), and tune's run counts (#28.5).

1. hubert (transformers HuBERT, inference with autograd left on) under 1.05 GiB: `alloctune tune --json`
   -- runs in all (target: the recording, the closest setting at the budget, ONE no-grad run = 3), the
   no_grad remedy (measured) and its min budget; truth: the real min budget of `hubert_nograd` (the line
   added by hand) under the same setting, by k-ary search in fresh processes (real_min_budget.py).
2. convnext (timm, mixed resolutions) under 542099349 B (the budget of the 4-run tune in LOG.md): tune's
   runs in all (target <= 3) and its answer against the earlier one (max_split_size_mb:32, 450 MiB).
3. seg (torchvision DeepLabV3, mixed sizes): recorded uncapped, `alloctune explain --json` gives the
   empty_cache_each_repetition remedy (peak reserved, min budget); truth: `seg_ec` (empty_cache()
   after every image, by hand): its real peak reserved (one uncapped run) and real min
   budget (k-ary search).

On the device (writes $OUT/gpu_remedies.json and $OUT/gpu_remedies.md, and the tune stores/recordings):

    python bench/gpu_remedies_tune.py [--only hubert,convnext,seg]
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
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
PROG = [PY, str(ROOT / "bench" / "cap_programs.py")]
MiB = 1 << 20


def _alloctune(*args: str, timeout: float = 1800) -> dict:
    r = subprocess.run([PY, "-m", "alloctune", *args], env=ENV, capture_output=True, text=True, timeout=timeout)
    try:  # run exits with the program's own code (an OOM's too): the JSON is the answer
        return json.loads(r.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"alloctune {' '.join(args[:3])} failed ({r.returncode}): {r.stderr[-2000:]}") from None


def _real_min(cmd: list[str], lo: str, hi: str, conf: str = "") -> dict:
    r = subprocess.run([PY, str(ROOT / "bench" / "real_min_budget.py"), "--lo", lo, "--hi", hi, "--conf", conf,
                        "--", *cmd], env=ENV, capture_output=True, text=True, timeout=3600)
    return json.loads(r.stdout.strip().splitlines()[-1])


def _tune(name: str, budget: str, out: Path) -> dict:
    t0 = time.perf_counter()
    d = _alloctune("tune", "--budget", budget, "--json", "--store", str(out / f"tune_{name}.jsonl"), "--",
                   *PROG, name)
    d["_wall_s"] = time.perf_counter() - t0
    return d


def hubert(out: Path) -> dict:
    d = _tune("hubert", "1.05GiB", out)
    ng = next((r for r in d["remedies"] if r["name"] == "no_grad"), None)
    row = {"case": "hubert under 1.05 GiB", "runs": d["trial_count"], "wall_s": round(d["_wall_s"], 1),
           "baseline_wall_s": d["trials"][0]["wall_s"], "recommendation": d["recommendation"]["conf"],
           "shortfall": d["shortfall"], "no_grad": ng}
    if ng is not None:
        truth = _real_min([*PROG, "hubert_nograd"], "256MiB", "1.05GiB", ng["conf"])
        row["truth_nograd"] = truth
        if ng["min_budget"] and truth["min_budget"]:
            row["error"] = ng["min_budget"] / truth["min_budget"] - 1
    return row


def convnext(out: Path) -> dict:
    d = _tune("convnext", "542099349B", out)
    best = d["ranking"]["best"] or {}
    return {"case": "convnext under 542099349 B", "runs": d["trial_count"], "wall_s": round(d["_wall_s"], 1),
            "baseline_wall_s": d["trials"][0]["wall_s"], "recommendation": d["recommendation"]["conf"],
            "min_budget": best.get("min_budget"), "verified": best.get("verified"),
            "sim_min_budget": best.get("sim_min_budget"), "earlier": "max_split_size_mb:32 at 450 MiB, 4 runs",
            "remedies": [(r["name"], r["min_budget"], r["method"]) for r in d["remedies"]]}


def seg(out: Path) -> dict:
    rec = out / "seg.pickle"
    run = _alloctune("run", "--record", str(rec), "--json", "--", *PROG, "seg")
    ex = _alloctune("explain", str(rec), "--json", "--top", "5")
    rem = next((r for r in ex["remedies"] if r["name"] == "empty_cache_each_repetition"), None)
    real = _alloctune("run", "--json", "--", *PROG, "seg_ec")
    row = {"case": "seg, empty_cache() after every image", "repetitions": ex["repeats"].get("count"),
           "recorded_peak_reserved": run.get("peak_reserved"), "remedy": rem,
           "real_peak_reserved": real.get("peak_reserved"), "utilization": ex.get("utilization")}
    if rem is not None:
        truth = _real_min([*PROG, "seg_ec"], "1GiB", f"{(run.get('peak_reserved') or 8 << 30) + 512 * MiB}B")
        row["truth_min"] = truth
        row["peak_error"] = (rem["peak_reserved"] / real["peak_reserved"] - 1) if real.get("peak_reserved") else None
        row["min_error"] = (rem["min_budget"] / truth["min_budget"] - 1) if truth.get("min_budget") else None
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="hubert,convnext,seg")
    args = ap.parse_args(argv)
    out = Path(os.environ.get("OUT", "/tmp/gpu_remedies"))
    out.mkdir(parents=True, exist_ok=True)
    cases = {"hubert": hubert, "convnext": convnext, "seg": seg}
    rows = []
    for name in args.only.split(","):
        try:
            rows.append(cases[name](out))
        except Exception as exc:  # noqa: BLE001 - one case's failure is a result too
            rows.append({"case": name, "error": f"{type(exc).__name__}: {exc}"})
        (out / "gpu_remedies.json").write_text(json.dumps(rows, indent=1, default=str))
    md = ["# #29 on the H200: remedies vs the programs with the remedy applied by hand", "",
          "`python bench/gpu_remedies_tune.py`", ""]
    md += [f"- {json.dumps(r, default=str)}" for r in rows]
    (out / "gpu_remedies.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
