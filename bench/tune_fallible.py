"""Simulated vs real min_budget before and after the fallible-request model (CPU only).

Reads the lead's H200 recordings (`--data`, default bench/gpu-results/batch8; README there): the
uncapped default recording of each workload, a capped calibration recording of the same
program, and the independent GPU bisection (`b/bisect_results.json`). For every setting
it prints the real bracket (fails_at, min_budget], the simulated min_budget from the
uncapped recording alone ("before"), and after learning fallbacks from the calibration run
("after"), with the error against the real min_budget.

    python bench/tune_fallible.py [--data DIR] [--calibration cap_tight|cap_mid|cap_min] [--json OUT]

It also checks the C++-frame tagger on every `a/{workload}_default_cpp` recording: the requests
of 1 MiB or more it tags as cuDNN workspaces against those freed right after allocation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SETTINGS = {"default": "", "expandable": "expandable_segments:True", "max_split_128": "max_split_size_mb:128"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="bench/gpu-results/batch8")
    ap.add_argument("--calibration", default="cap_tight", help="which capped default run teaches the fallbacks")
    ap.add_argument("--workloads", default="hubert,timm,torchvision,llama")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from alloctune.sim.sweep import sweep
    from alloctune.trace import load_trace
    from alloctune.trace.fallible import learn_from_calibration, with_fallbacks

    data = Path(args.data)
    real = {r["name"]: r for r in json.loads((data / "b" / "bisect_results.json").read_text()) if "min_budget" in r}
    rows = []
    for wl in args.workloads.split(","):
        base_path = data / "a" / f"{wl}_default.pickle.xz"
        if not base_path.exists():
            continue
        base = load_trace(base_path)
        total = base.total_memory
        cal_path = data / "a" / f"{wl}_default_{args.calibration}.pickle.xz"
        model = None
        if cal_path.exists():
            cal = load_trace(cal_path)
            model = learn_from_calibration(base, cal)
        tagged = with_fallbacks(base, model) if model is not None and model.ladders else None
        confs = list(SETTINGS.values())
        before = sweep(base, confs, total_memory=total)
        after = sweep(tagged, confs, total_memory=total) if tagged is not None else None
        for (name, conf), b in zip(SETTINGS.items(), before.rows):
            r = real.get(f"{wl}_{name}")
            if r is None:
                continue
            a = after.rows[confs.index(conf)] if after is not None else None
            rows.append({
                "workload": wl, "setting": conf or "(default)", "real_min_budget": r["min_budget"],
                "real_fails_at": r["fails_at"], "sim_before": b.min_budget, "sim_after": a.min_budget if a else None,
                "learned_sizes": len(model.ladders) if model else 0,
                "unaligned": model.unaligned_requests if model else None,
            })
    print(f"{'workload':<12} {'setting':<26} {'real (fails_at, ok]':<24} {'before':>10} {'err':>7} {'after':>10} {'err':>7} learned")
    for r in rows:
        def err(x):
            return "-" if x is None else f"{100 * (x / r['real_min_budget'] - 1):+.1f}%"
        mib = lambda x: "-" if x is None else f"{x / 2**20:.0f}"
        print(f"{r['workload']:<12} {r['setting']:<26} ({mib(r['real_fails_at'])}, {mib(r['real_min_budget'])}] MiB".ljust(65)
              + f"{mib(r['sim_before']):>10} {err(r['sim_before']):>7} {mib(r['sim_after']):>10} {err(r['sim_after']):>7} {r['learned_sizes']}")
    frames_check(data)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runlog import log_result

    for r in rows:
        log_result(f"{r['workload']} {r['setting']}: real min budget {r['real_min_budget']} B, simulated "
                   f"{r['sim_before']} before / {r['sim_after']} after calibration ({r['learned_sizes']} sizes learned)")
    if args.json:
        Path(args.json).write_text(json.dumps({"schema": "alloctune.bench.tune_fallible/1", "rows": rows}, indent=1))
    return 0


def frames_check(data: Path) -> None:
    from alloctune.trace import load_trace
    from alloctune.trace.fallible import tag_by_frames
    from alloctune.trace.model import ALLOC, FREE

    for path in sorted((data / "a").glob("*_default_cpp.pickle.xz")):
        t = load_trace(path)
        r = t.requests
        big = {i for i, (o, z) in enumerate(zip(r.ops, r.sizes)) if o == ALLOC and z >= 1 << 20}
        tagged = tag_by_frames(t) & big
        at_once = {i for i in big if i + 1 < len(r) and r.ops[i + 1] == FREE and r.rids[i + 1] == r.rids[i]}
        print(f"frames {path.name}: {len(tagged)} request(s) >= 1 MiB tagged as workspaces, {len(at_once)} freed "
              f"right after allocation, {len(tagged & at_once)} both")


if __name__ == "__main__":
    sys.exit(main())
