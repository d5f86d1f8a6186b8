"""The confirm flow on the CPU against the real H200 measurements: how many GPU runs would it use?

The "GPU" here is the lead's independent bisection (`/work/gpu-data/b/bisect_results.json`):
a trial under setting S at cap B passes iff B >= the measured min_budget of S. The simulator
is the real one over the real uncapped recording (`a/{workload}_default.pickle.xz`), so the
run counts include the simulator's real errors. Candidates: the settings the bisection
measured (default, expandable_segments:True, max_split_size_mb:128). No calibration run
(the recorded capped trials of a real tune are not available offline).

    python bench/tune_flow_offline.py [--data /work/gpu-data] [--workloads hubert,timm,torchvision,llama]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CONFS = {"default": "", "expandable": "expandable_segments:True", "max_split_128": "max_split_size_mb:128"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="/work/gpu-data")
    ap.add_argument("--workloads", default="hubert,timm,torchvision,llama")
    args = ap.parse_args(argv)

    from alloctune.trial import TrialResult
    from alloctune.tune.candidates import parse_knobs
    from alloctune.tune.strategy import SimulatorFromTrace, Tuner, TuneSettings

    data = Path(args.data)
    real = {r["name"]: r for r in json.loads((data / "b" / "bisect_results.json").read_text()) if "min_budget" in r}
    print(f"{'workload':<12} {'runs':>4} {'best':<26} {'measured':>9} {'real best':>10} {'gap':>6}  proven")
    for wl in args.workloads.split(","):
        snap = data / "a" / f"{wl}_default.pickle.xz"
        side = json.loads((data / "a" / f"{wl}_default.json").read_text())
        need = {conf: real[f"{wl}_{name}"]["min_budget"] for name, conf in CONFS.items() if f"{wl}_{name}" in real}
        calls = []

        def evaluator(conf, budget, *, repeat=0, record=False, ensure_cap=False):
            calls.append((conf, budget))
            ok = budget is None or budget >= need[conf]
            return TrialResult(("wl",), conf, budget, "ok" if ok else "oom", 0 if ok else 1, 1.0,
                               total_memory=side["total_memory"], torch_version="2.11.0",
                               peak_allocated=side["stats"].get("allocated_bytes.all.peak"),
                               snapshot=str(snap) if record and budget is None else None,
                               allocator_settings={"PYTORCH_CUDA_ALLOC_CONF": conf})

        settings = TuneSettings(command=("wl",), budget=None, knobs=parse_knobs(["expandable", "max_split=128"]),
                                platform="linux")
        res = Tuner(evaluator, settings, simulator_factory=SimulatorFromTrace).run()
        best = res.ranking.best
        true_best = min(need.values())
        gap = (best.min_budget / true_best - 1) if best and best.min_budget else None
        print(f"{wl:<12} {len(calls) - 1:>4} {best.candidate.label if best else '-':<26} "
              f"{(best.min_budget or 0) / 2**20:>8.0f}M {true_best / 2**20:>9.0f}M "
              f"{'-' if gap is None else f'{100 * gap:+.1f}%':>6}  {best.verified if best else '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
