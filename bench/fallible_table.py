"""Simulated vs real min_budget, before and after modelling how programs adapt (issue #13 step 1).

For each workload and standard setting, against the ground truth of `gpu_truth.py` (a tested
pass and a tested failure, fresh processes):

* **before**: the uncapped recording replayed as recorded (every request a fixed need);
* **optimistic**: the same recording with every workspace-shaped request (>= 1 MiB, freed by
  the very next request) allowed to fail down to no workspace (`fallible.optimistic`);
* **calibrated**: the recording after learning fallback ladders from the tune's own recorded
  capped runs (`SimulatorFromTrace.calibrate`; only runs that hit OOMs teach anything).

Information used: the default's uncapped recording a tune made of the same command (its
baseline) and, for "calibrated", that tune's capped recordings -- never the truth runs.

    python bench/fallible_table.py --truth bench/gpu-results/batch12/truth.jsonl --recordings DIR [--out FILE.md]

DIR: the extracted `gpu_tune_real.py` logs (`tar xzf bench/gpu-results/batch12/tune/logs.tar.gz -C DIR`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

MiB = 1 << 20
WORKLOADS = ("hubert", "timm", "torchvision", "llama", "rvc", "diffusion")


class _Baseline:
    def __init__(self, snap: Path):
        self.snapshot, self.total_memory, self.torch_version = str(snap), 150109880320, "2.11.0"


def _err(sim: int | None, real: int | None) -> str:
    return "-" if sim is None or not real else f"{100 * (sim / real - 1):+.1f}%"


def _inside(sim: int | None, lo: int | None, hi: int | None) -> bool:
    return sim is not None and lo is not None and hi is not None and lo < sim <= hi


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--truth", type=Path, required=True)
    ap.add_argument("--recordings", type=Path, required=True)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--out", type=Path, default=None, help="also write the table (markdown) here")
    a = ap.parse_args(argv)

    from alloctune.run.trial import TrialResult
    from alloctune.tune.simulator import SimulatorFromTrace

    truth = [json.loads(line) for line in a.truth.read_text().splitlines() if line.strip()]
    lines = [f"## Simulated vs real min_budget: before / optimistic / calibrated — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             "", f"Command: `PYTHONPATH=src python bench/fallible_table.py --truth {a.truth} --recordings DIR` "
             "(DIR = the extracted tune logs). Real = `gpu_truth.py` (tested failure, tested pass); errors against the "
             "tested pass. Inputs: the tune's uncapped default recording of the same command; \"calibrated\" also its "
             "recorded capped runs that hit OOMs (never the truth runs).", "",
             "| workload | setting | real (fails at, passes] MiB | before | err | optimistic | err | calibrated | err | calibrations |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    stats = {"before": [], "optimistic": [], "calibrated": []}
    for wl in a.workloads.split(","):
        rec = a.recordings / wl / "rec"
        base = rec / "baseline.pickle"
        if not base.exists():
            continue
        rows = [r for r in truth if r["workload"] == wl and r.get("min_budget") and r.get("fails_at")]
        confs = [r["conf"] for r in rows]
        sim = SimulatorFromTrace(_Baseline(base))
        before = sim.estimates(confs)
        optimistic = sim.floors(confs)
        # the tune's recorded capped runs, in the order it made them
        trials = {}
        for line in (a.recordings / wl / "trials.jsonl").read_text().splitlines():
            try:
                t = json.loads(line)
            except ValueError:
                continue
            res = t.get("result") or {}
            if res.get("snapshot") and res.get("budget"):
                trials[Path(res["snapshot"]).name] = res
        taught = []
        for snap in sorted(rec.glob("capped-*.pickle")):
            res = trials.get(snap.name)
            if res is None:
                continue
            tr = TrialResult(("wl",), res.get("conf") or "", res["budget"], res.get("outcome") or "oom", 0, 1.0,
                             snapshot=str(snap), num_ooms=res.get("num_ooms") or 0)
            if sim.calibrate(tr):
                taught.append(f"{tr.conf or 'default'}@{tr.budget // MiB}")
        calibrated = sim.estimates(confs) if taught else {c: None for c in confs}
        for r in rows:
            c, lo, hi = r["conf"], r["fails_at"], r["min_budget"]
            b, o, k = before.get(c), optimistic.get(c), calibrated.get(c)
            flag = ""
            if hi < lo:
                flag = " non-monotonic"  # a pass below a failure: the program's choices under a cap vary
            elif hi - lo > max(2 * MiB, hi // 100):
                flag = " too wide"  # the truth run out of time before 1 %: not counted
            if not flag.strip() == "too wide":
                for name, v in (("before", b), ("optimistic", o), ("calibrated", k)):
                    if v is not None:
                        stats[name].append((abs(v / hi - 1), _inside(v, lo, hi) or abs(v / hi - 1) <= 0.03))
            lines.append(f"| {wl} | {c or '(default)'} | ({lo // MiB}, {hi // MiB}]{flag} | {b and b // MiB} | {_err(b, hi)} | "
                         f"{o and o // MiB} | {_err(o, hi)} | {'-' if k is None else k // MiB} | {_err(k, hi)} | "
                         f"{', '.join(taught) or '-'} |")
    lines.append("")
    for name, v in stats.items():
        if v:
            within = sum(1 for _, ok in v if ok)
            worst = max(e for e, _ in v)
            lines.append(f"- {name}: within 3 % of the real min_budget (or inside its bracket) in **{within}/{len(v)}**, "
                         f"largest error {100 * worst:.1f} % (rows whose truth is wider than 1 % not counted)")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runlog import log_results

    log_results([line for line in lines if line.startswith("- ")], folder=a.out.parent if a.out else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
