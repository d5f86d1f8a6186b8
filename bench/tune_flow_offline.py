"""The confirm flow on the CPU against the real H200 measurements: how many GPU runs would it use?

The "GPU" here is the lead's independent bisection (`bench/gpu-results/batch8/b/bisect_results.json`):
a trial under setting S at cap B passes iff B >= the measured min_budget of S. The simulator
is the real one over the real uncapped recording (`a/{workload}_default.pickle.xz`), so the
run counts include the simulator's real errors. Candidates: the settings the bisection
measured (default, expandable_segments:True, max_split_size_mb:128).

Calibration: a real tune records its capped probes and learns fallbacks from the first one in
which the program adapted. Offline there is no recording at the probe's cap; with
`--stand-in`, a recorded capped run of the default setting that completed with OOMs
(`a/{workload}_default_cap_*`) is handed out for a recorded probe within 5 % of its cap
(a stand-in: same program and cap region, possibly another setting).

    python bench/tune_flow_offline.py [--data bench/gpu-results/batch8] [--workloads hubert,timm,torchvision,llama] [--stand-in]

With `--truth T --recordings R` the "GPU" is gpu_truth.py's bisection (both ends tested,
`T` = truth.jsonl) and the recording is the baseline a real tune made of the same command
(`R/{workload}/rec/baseline.pickle`, from a gpu_tune_real.py logs.tar.gz); candidates are the
standard settings the truth measured completely.

    python bench/tune_flow_offline.py --truth bench/gpu-results/batch12/truth.jsonl --recordings DIR \
        --workloads hubert,timm,torchvision,llama,rvc,diffusion
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CONFS = {"default": "", "expandable": "expandable_segments:True", "max_split_128": "max_split_size_mb:128"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="bench/gpu-results/batch8")
    ap.add_argument("--workloads", default="hubert,timm,torchvision,llama")
    ap.add_argument("--stand-in", action="store_true", help="hand out recorded capped runs as calibrations")
    ap.add_argument("--truth", type=Path, default=None, help="truth.jsonl of gpu_truth.py")
    ap.add_argument("--recordings", type=Path, default=None, help="extracted gpu_tune_real.py logs (baseline recordings)")
    args = ap.parse_args(argv)
    if args.truth is not None:
        return from_truth(args)

    from alloctune.run.trial import TrialResult
    from alloctune.tune.candidates import parse_knobs
    from alloctune.tune.simulator import SimulatorFromTrace
    from alloctune.tune.strategy import Tuner, TuneSettings

    data = Path(args.data)
    real = {r["name"]: r for r in json.loads((data / "b" / "bisect_results.json").read_text()) if "min_budget" in r}
    print(f"{'workload':<12} {'runs':>4} {'best':<26} {'measured':>9} {'real best':>10} {'gap':>6}  proven")
    for wl in args.workloads.split(","):
        snap = data / "a" / f"{wl}_default.pickle.xz"
        side = json.loads((data / "a" / f"{wl}_default.json").read_text())
        need = {conf: real[f"{wl}_{name}"]["min_budget"] for name, conf in CONFS.items() if f"{wl}_{name}" in real}
        calls = []
        stand_ins = []
        for f in sorted((data / "a").glob(f"{wl}_default_cap_*.json")) if args.stand_in else []:
            meta = json.loads(f.read_text())
            if meta.get("outcome") == "ok" and (meta.get("stats") or {}).get("num_ooms"):
                stand_ins.append((int(meta["cap"]), str(f.with_suffix("")) + ".pickle.xz", meta["stats"]["num_ooms"]))

        def evaluator(conf, budget, *, repeat=0, record=False, ensure_cap=False):
            calls.append((conf, budget))
            ok = budget is None or budget >= need[conf]
            snapshot, ooms = (str(snap), 0) if record and budget is None else (None, 0)
            if record and budget is not None and ok:
                near = [s for s in stand_ins if abs(s[0] - budget) <= 0.05 * budget]
                if near:
                    snapshot, ooms = near[0][1], near[0][2]
            return TrialResult(("wl",), conf, budget, "ok" if ok else "oom", 0 if ok else 1, 1.0,
                               total_memory=side["total_memory"], torch_version="2.11.0",
                               peak_allocated=side["stats"].get("allocated_bytes.all.peak"),
                               snapshot=snapshot, num_ooms=ooms,
                               allocator_settings={"PYTORCH_CUDA_ALLOC_CONF": conf})

        settings = TuneSettings(command=("wl",), budget=None, knobs=parse_knobs(["expandable", "max_split=128"]),
                                platform="linux")
        res = Tuner(evaluator, settings, simulator_factory=SimulatorFromTrace).run()
        best = res.ranking.best
        true_best = min(need.values())
        gap = (best.min_budget / true_best - 1) if best and best.min_budget else None
        row = (f"{wl:<12} {len(calls) - 1:>4} {best.candidate.label if best else '-':<26} "
               f"{(best.min_budget or 0) / 2**20:>8.0f}M {true_best / 2**20:>9.0f}M "
               f"{'-' if gap is None else f'{100 * gap:+.1f}%':>6}  {best.verified if best else '-'}"
               + ("  (calibrated)" if any(n.startswith("calibration") for n in res.notes) else ""))
        print(row)
        _log(f"{wl}: {len(calls) - 1} GPU runs, best {best.candidate.label if best else '-'} measured "
             f"{(best.min_budget or 0) / 2**20:.0f} MiB vs real best {true_best / 2**20:.0f} MiB, proven {best.verified if best else '-'}")
    return 0


def from_truth(args: argparse.Namespace) -> int:
    from alloctune.run.trial import TrialResult
    from alloctune.tune.candidates import parse_knobs
    from alloctune.tune.simulator import SimulatorFromTrace
    from alloctune.tune.strategy import Tuner, TuneSettings

    rows = [json.loads(line) for line in args.truth.read_text().splitlines() if line.strip()]
    knobs = {"expandable_segments:True": "expandable", "roundup_power2_divisions:4": "roundup"}
    print(f"{'workload':<12} {'runs':>4} {'best':<28} {'measured':>9} {'truth best':>10} {'gap':>6}  proven  probes")
    for wl in args.workloads.split(","):
        need = {r["conf"]: r["min_budget"] for r in rows if r["workload"] == wl and r.get("min_budget") and r.get("fails_at")
                and "garbage" not in r["conf"]}
        if "" not in need:
            print(f"{wl:<12} (no complete truth for the default)")
            continue
        splits = sorted(int(c.split(":")[1]) for c in need if c.startswith("max_split_size_mb:"))
        kn = [knobs[c] for c in need if c in knobs] + ([f"max_split={'/'.join(map(str, splits))}"] if splits else [])
        snap = args.recordings / wl / "rec" / "baseline.pickle"
        peak = _baseline_peak(args.recordings / wl / "trials.jsonl")
        calls = []

        def evaluator(conf, budget, *, repeat=0, record=False, ensure_cap=False, _need=need, _snap=snap, _peak=peak):
            calls.append((conf, budget))
            ok = budget is None or budget >= _need[conf]
            return TrialResult(("wl",), conf, budget, "ok" if ok else "oom", 0 if ok else 1, 1.0,
                               total_memory=150109880320, torch_version="2.11.0",
                               peak_reserved=_peak if budget is None else None,
                               snapshot=str(_snap) if record and budget is None else None, num_ooms=0 if ok else 1,
                               allocator_settings={"PYTORCH_CUDA_ALLOC_CONF": conf})

        settings = TuneSettings(command=("wl",), budget=None, knobs=parse_knobs(kn), platform="linux")
        res = Tuner(evaluator, settings, simulator_factory=SimulatorFromTrace).run()
        best = res.ranking.best
        true_best = min(need.values())
        gap = (best.min_budget / true_best - 1) if best and best.min_budget else None
        probes = " ".join(f"{(c or 'default')[:14]}@{b >> 20}" for c, b in calls[1:] if b is not None and b < 1 << 40)
        print(f"{wl:<12} {len(calls) - 1:>4} {best.candidate.label if best else '-':<28} "
              f"{(best.min_budget or 0) / 2**20:>8.0f}M {true_best / 2**20:>9.0f}M "
              f"{'-' if gap is None else f'{100 * gap:+.1f}%':>6}  {best.verified if best else '-'}  {probes}")
        _log(f"{wl}: {len(calls) - 1} GPU runs, best {best.candidate.label if best else '-'} measured "
             f"{(best.min_budget or 0) / 2**20:.0f} MiB vs truth best {true_best / 2**20:.0f} MiB, proven {best.verified if best else '-'}")
    return 0


def _baseline_peak(store: Path) -> int | None:
    """The real baseline's peak reserved bytes, from the tune's store beside the recording (the
    flow skips the default's run at the budget when the baseline reserved less)."""
    if not store.exists():
        return None
    for line in store.read_text().splitlines():
        d = json.loads(line)
        if d.get("kind") == "trial" and d["key"]["budget"] is None:
            return d["result"].get("peak_reserved")
    return None



def _log(result: str) -> None:
    """One line per workload in the results log (bench/results/LOG.md)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runlog import log_result

    log_result(result)


if __name__ == "__main__":
    sys.exit(main())
