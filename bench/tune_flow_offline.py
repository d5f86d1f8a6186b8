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

`--budgets sharp` (or NAME=SIZE,...) tunes at a user budget instead of the whole card: `sharp` takes
gpu_tune_real.py's budgets where the default fails. The "wall x one run" column models the tune's wall
time in runs of the workload from the batches the flow handed its executor: the baseline alone, then
per batch the side by side runs together (as long as one run) plus each run that has the GPU alone
(`exclusive`, a throughput sample: it waits for the others and runs by itself). A run that fails is
counted as a whole run (it may end earlier, at its OOM). The layout column shows it: `[2]` two runs
side by side, `+1x` one run alone. On the H200 (bench/results/tune_sharp_gpu.md) a side by side pair
took 1.0-1.1 runs and a pair one after the other 2.3 (so the model is a lower bound by about 0.1-0.3).

    git archive 15b0ebd bench/gpu-results/batch13/tune | tar -x -C /tmp/g   # batch 13's tunes (in git history)
    mkdir -p /tmp/rec13 && tar -xzf /tmp/g/bench/gpu-results/batch13/tune/logs.tar.gz -C /tmp/rec13
    python bench/tune_flow_offline.py --truth bench/gpu-results/batch13/truth_all.jsonl --recordings /tmp/rec13 \
        --workloads hubert,llama,rvc --budgets sharp,rvc=2300MiB [--throughput measure] [--label WORD]

With `--budgets` the table is also appended to bench/results/tune_flow_offline.md.
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
    ap.add_argument("--budgets", default="", help="'sharp' (gpu_tune_real.SHARP) and/or NAME=SIZE,...; default: the whole card")
    ap.add_argument("--throughput", default="auto", choices=("auto", "measure"), help="the tune's --throughput")
    ap.add_argument("--label", default="", help="with --budgets: a word for the results section (e.g. which code ran)")
    args = ap.parse_args(argv)
    args.budget_of = _budgets(args.budgets)
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
    from alloctune.tune.executors.base import BatchRecorder
    from alloctune.tune.simulator import SimulatorFromTrace
    from alloctune.tune.strategy import Tuner, TuneSettings

    rows = [json.loads(line) for line in args.truth.read_text().splitlines() if line.strip()]
    knobs = {"expandable_segments:True": "expandable", "roundup_power2_divisions:4": "roundup"}
    print(f"{'workload':<12} {'budget':>8} {'runs':>4} {'wall x1':>7} {'layout':<12} {'best':<28} {'measured':>9} "
          f"{'truth best':>10} {'gap':>6}  proven  probes")
    md: list[str] = []
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

        settings = TuneSettings(command=("wl",), budget=args.budget_of.get(wl), knobs=parse_knobs(kn), platform="linux",
                                throughput_check=args.throughput)
        batches = BatchRecorder(evaluator)
        res = Tuner(evaluator, settings, simulator_factory=SimulatorFromTrace, executor=batches).run()
        best = res.ranking.best
        fits = [v for v in need.values() if settings.budget is None or v <= settings.budget]
        true_best = min(fits or need.values())
        gap = (best.min_budget / true_best - 1) if best and best.min_budget else None
        probes = " ".join(f"{(c or 'default')[:14]}@{b >> 20}" for c, b in calls[1:] if b is not None and b < 1 << 40)
        budget = "card" if settings.budget is None else f"{settings.budget >> 20}M"
        print(f"{wl:<12} {budget:>8} {len(calls) - 1:>4} {batches.wall():>7.2f} {batches.layout():<12} "
              f"{best.candidate.label if best else '-':<28} "
              f"{((best.min_budget or 0) if best else 0) / 2**20:>8.0f}M {true_best / 2**20:>9.0f}M "
              f"{'-' if gap is None else f'{100 * gap:+.1f}%':>6}  {best.verified if best else '-'}  {probes}")
        if args.budgets:
            tput = next((s.note for s in res.summaries if best is not None and s.candidate == best.candidate), None)
            print(f"{'':<12} throughput: {tput}")
            print(f"{'':<12} notes: " + " | ".join(n for n in res.notes if "default" in n or "throughput" in n))
            fails = "fails" if settings.budget < need[""] else "completes"
            md.append(f"| {wl} | {budget}iB (default {fails}: needs {need[''] >> 20} MiB) | {len(calls)} | "
                      f"{batches.layout()} | {batches.wall():.2f} | {best.candidate.label if best else 'none'} | "
                      f"{((best.min_budget or 0) if best else 0) >> 20} | {true_best >> 20} | "
                      f"{'-' if gap is None else f'{100 * gap:+.1f}%'} | {best.throughput_samples if best else 0} | "
                      f"{(tput or '-').replace('|', '/')} |")
        _log(f"{wl}{'' if settings.budget is None else f' at {budget}iB'} (--throughput {args.throughput}"
             f"{f', {args.label}' if args.label else ''}): "
             f"{len(calls) - 1} GPU runs, modelled wall {batches.wall():.2f}x one run ({batches.layout()}), "
             f"best {best.candidate.label if best else '-'} measured "
             f"{((best.min_budget or 0) if best else 0) / 2**20:.0f} MiB vs truth best {true_best / 2**20:.0f} MiB, "
             f"proven {best.verified if best else '-'}")
    if md:
        _section(args, md)
    return 0


def _section(args: argparse.Namespace, rows: list[str]) -> None:
    """Append the budgeted runs' table to bench/results/tune_flow_offline.md (runs in all include the recording)."""
    import datetime as dt

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runlog import command

    out = Path(__file__).resolve().parent / "results" / "tune_flow_offline.md"
    head = "" if out.exists() else (
        "# The confirm flow offline: GPU runs and modelled wall time under a user's budget\n\n"
        "The \"GPU\" is the ground truth's bisection (a run passes iff its cap >= the setting's measured min_budget), "
        "the simulator the real one over a real tune's baseline recording (bench/tune_flow_offline.py). Wall time "
        "in runs of the workload: the recording alone, then per batch the side by side runs together plus one for "
        "each run alone on the GPU (a throughput sample); `[2]` = two side by side, `+1x` = one alone.\n")
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [head, f"## {when}{f' ({args.label})' if args.label else ''}", "", f"`{command()}`", "",
             "| workload | budget | runs in all | layout after the recording | wall x one run (model) | recommended | "
             "measured MiB | truth best MiB | gap | samples alone | throughput said |",
             "|---|---|---|---|---|---|---|---|---|---|---|", *rows, ""]
    with out.open("a") as f:
        f.write("\n".join(lines) + "\n")


def _budgets(text: str) -> dict[str, int]:
    """'sharp' (gpu_tune_real.SHARP) and NAME=SIZE pairs, as bytes per workload."""
    from alloctune.units import parse_size

    out: dict[str, str] = {}
    for item in (x for x in text.split(",") if x):
        if item == "sharp":
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from gpu_tune_real import SHARP

            out.update(SHARP)
        elif "=" in item:
            name, size = item.split("=", 1)
            out[name] = size
        else:
            raise SystemExit(f"tune_flow_offline: error: --budgets {item!r}: use sharp or NAME=SIZE")
    return {k: parse_size(v) for k, v in out.items()}


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
