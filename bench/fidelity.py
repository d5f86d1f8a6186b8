"""Fidelity of the allocator simulator on the real H200 traces (../shared/traces).

For every (workload, run): uncapped runs replay `default`'s request stream under the run's
recorded setting; capped runs replay their own stream under their setting and cap. Each is
replayed with the recorded segment addresses (`recorded`), with the replayed trace's
(`hinted`) and with the driver model's predicted ones (`model`); `self` replays the run's own
stream with its own addresses -- the simulator alone, apart from whether the program made the
same requests under another setting (`same stream`). All are compared strictly with the recording: segment_alloc/free/map/unmap
sequence (action + size, in order), reserved/allocated/segment peaks, num_alloc_retries,
num_ooms, and which requests failed.

    python bench/fidelity.py [--workloads rvc_ec0,rvc_ec1,llm] [--traces DIR] [--runs a,b] [--no-append]

Prints one row per (workload, run) and appends a dated section to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from alloctune.sim.compare import compare  # noqa: E402
from alloctune.sim.replay import replay  # noqa: E402
from alloctune.sim.settings import SimSettings  # noqa: E402
from alloctune.trace import load_trace  # noqa: E402
from alloctune.units import format_size  # noqa: E402

RUNS = [
    "default", "max_split_128", "max_split_512", "expandable", "roundup4", "roundup_intervals",
    "default_cap95", "default_cap85", "expandable_cap95", "expandable_cap85", "gc07_split256_cap115a",
]


def check(traces: Path, workload: str, run: str, default) -> dict:
    ref = load_trace(traces / workload / f"{run}.pickle.xz")
    cap = ref.meta.get("cap") or None
    stream = ref if cap else default
    settings = SimSettings.from_allocator_settings(ref.allocator_settings)
    row = {"workload": workload, "run": run, "stream": "own" if cap else "default", "cap": cap,
           "same_stream": (ref.requests.ops, ref.requests.sizes) == (stream.requests.ops, stream.requests.sizes)}
    # self: the run's own stream and addresses -- the simulator alone, whatever the program did differently
    if stream is ref:
        row["self"] = None  # same as `recorded` below
    else:
        row["self"] = compare(replay(ref, settings, budget=cap, addresses="recorded", reference=ref), ref)
    # recorded: the run's own addresses; hinted: the addresses of the trace being replayed
    # (default's, for uncapped runs: all a user with one recording has); model: none
    for mode, reference in (("recorded", ref), ("hinted", stream), ("model", None)):
        t0 = time.perf_counter()
        result = replay(stream, settings, budget=cap, addresses="model" if mode == "model" else "recorded",
                        reference=reference)
        fid = compare(result, ref, stream_trace=None if stream is ref else stream)
        row[mode] = fid
        row[mode + "_s"] = time.perf_counter() - t0
        row[mode + "_result"] = result
    if row["self"] is None:
        row["self"] = row["recorded"]
    return row


def verdict(fid) -> str:
    if fid.exact:
        return "exact"
    bits = []
    if not fid.events_match:
        bits.append(f"events from #{fid.first_difference}")
    bad = [k.split(".")[0] for k, (r, s) in fid.stats.items() if r != s]
    if bad:
        bits.append("stats: " + ",".join(bad))
    if not fid.failures_match:
        bits.append("failures")
    return "DIFF " + "; ".join(bits)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", default=str(ROOT.parent / "shared" / "traces"))
    ap.add_argument("--workloads", default="rvc_ec0,rvc_ec1,llm")
    ap.add_argument("--runs", default=",".join(RUNS), help="comma-separated run names (files NAME.pickle.xz)")
    ap.add_argument("--no-append", action="store_true", help="do not append to bench/RESULTS.md")
    args = ap.parse_args()
    traces = Path(args.traces)
    if not traces.is_dir():
        print(f"traces not found at {traces}", file=sys.stderr)
        return 2
    rows = []
    t_all = time.perf_counter()
    for wl in args.workloads.split(","):
        if not (traces / wl / "default.pickle.xz").is_file():
            print(f"{wl:8s} skipped: no default.pickle.xz recorded")
            continue
        default = load_trace(traces / wl / "default.pickle.xz")
        for run in args.runs.split(","):
            if not (traces / wl / f"{run}.pickle.xz").is_file():
                print(f"{wl:8s} {run:22s} skipped: not recorded")
                continue
            row = check(traces, wl, run, default)
            rows.append(row)
            rec, hin, mod = row["recorded"], row["hinted"], row["model"]
            r = row["recorded_result"]
            print(
                f"{wl:8s} {run:22s} {row['stream']:7s} events {rec.events_simulated:4d}/{rec.events_recorded:<4d} "
                f"peak_res {format_size(r.peak_reserved):>10s} retries {r.num_alloc_retries:4d} "
                f"fails {len(rec.failed_simulated):4d}/{len(rec.failed_recorded):<4d} "
                f"self: {verdict(row['self']):6s} same stream: {'yes' if row['same_stream'] else 'no '} "
                f"recorded: {verdict(rec):6s} hinted: {verdict(hin):6s} model: {verdict(mod)}",
                flush=True,
            )
    total = time.perf_counter() - t_all
    n_rec = sum(r["recorded"].exact for r in rows)
    n_self = sum(r["self"].exact for r in rows)
    n_same = sum(r["same_stream"] for r in rows)
    n_hin = sum(r["hinted"].exact for r in rows)
    n_mod = sum(r["model"].exact for r in rows)
    n_mod_events = sum(r["model"].events_match and r["model"].headline_match and r["model"].failures_match for r in rows)
    print(f"\nown stream + own addresses (the simulator alone): {n_self}/{len(rows)} exact; "
          f"request stream equal to the replayed one: {n_same}/{len(rows)}")
    print(f"exact: {n_rec}/{len(rows)} with the run's own addresses, {n_hin}/{len(rows)} with the replayed "
          f"trace's addresses, {n_mod}/{len(rows)} with predicted addresses (events + headline stats + failures: "
          f"{n_mod_events}/{len(rows)}); {total:.1f} s")
    if not args.no_append:
        append(rows, n_rec, n_hin, n_mod, n_mod_events, total, n_self, n_same)
    return 0 if n_self == len(rows) else 1


def append(rows, n_rec, n_hin, n_mod, n_mod_events, total, n_self, n_same) -> None:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "",
        f"## Simulator fidelity — {stamp}",
        "",
        f"`python bench/fidelity.py {' '.join(sys.argv[1:])}` (CPU; H200 traces, torch 2.11). Uncapped runs replay",
        "`default`'s request stream under the run's setting; capped runs their own stream under their cap.",
        "Compared strictly: segment event sequence (action+size), reserved/allocated/segment peaks,",
        "num_alloc_retries, num_ooms, num_device_alloc/free, failed requests.",
        "",
        "*self* = the run's own request stream with its own addresses (the simulator alone); *same stream* = whether",
        "the run's request stream equals the replayed one (a program may allocate differently from run to run).",
        "Address columns: *own* = the run's recorded addresses; *hinted* = the replayed trace's addresses",
        "(default's for uncapped rows: what a user with one recording has); *model* = predicted only.",
        "",
        "| workload | run | stream | segment events sim/rec | peak reserved | retries | failed sim/rec | self | same stream | own | hinted | model |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        rec, hin, mod, r = row["recorded"], row["hinted"], row["model"], row["recorded_result"]
        lines.append(
            f"| {row['workload']} | {row['run']} | {row['stream']} | {rec.events_simulated}/{rec.events_recorded} | "
            f"{format_size(r.peak_reserved)} | {r.num_alloc_retries} | {len(rec.failed_simulated)}/{len(rec.failed_recorded)} | "
            f"{verdict(row['self'])} | {'yes' if row['same_stream'] else 'no'} | {verdict(rec)} | {verdict(hin)} | {verdict(mod)} |"
        )
    lines += [
        "",
        f"Self (own stream, own addresses): **{n_self}/{len(rows)}**; same stream as replayed: {n_same}/{len(rows)}. "
        f"Exact: **{n_rec}/{len(rows)}** with own addresses, **{n_hin}/{len(rows)}** hinted, **{n_mod}/{len(rows)}** model "
        f"(events + headline stats + failures: {n_mod_events}/{len(rows)}). Wall time {total:.1f} s.",
        "",
    ]
    with open(ROOT / "bench" / "RESULTS.md", "a") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
