"""Fidelity of the allocator simulator on real recordings, as three separate figures.

For every (workload, run) of a folder of recordings (one sub-folder per workload, a `default`
run in each, `NAME.json` sidecars as in ../shared/traces):

* **replay** -- the run's own request stream, its own recorded addresses, its setting and cap:
  the simulator's rules alone;
* **prediction from one recording** -- `default`'s stream and `default`'s addresses under the
  run's setting and cap: what a user with one recording predicts (not made for `default` itself);
* **prediction with modelled addresses** -- `default`'s stream, addresses from the driver model only.

Each is compared strictly with the run's recording (`sim.compare`): segment event sequence
(action + size, in order), the `memory_stats()` figures of the run's sidecar *when it has one*
(otherwise only the reserved peak rebuilt from the recorded events and the OOM count -- the
`compared` column says which), and which requests failed. A capped run's program reacts to its
first failure (cuDNN falls back to smaller workspaces), so a prediction from another run's
stream is judged there by where it fails first; uncapped predictions by exact events. Peaks
(reserved, allocated) and, with `--min-budget`, the min budget of each uncapped setting from the
run's own stream vs from default's stream are their own columns: they hold where events do not.

    python bench/fidelity.py [--traces DIR | --shipped] [--workloads a,b] [--runs a,b] [--min-budget]
                             [--out bench/results/fidelity.md]

Writes the table to `--out` (markdown) and the rows to the same name with `.json`; exit 1 when
any *replay* is not exact (the simulator's own contract), 0 otherwise -- predictions are
measured and reported, never gated.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from alloctune.sim.addresses import COMPARED, MODEL, MODELLED, PREDICTION, REPLAY, TRACE, fidelity_kind, replay_addresses  # noqa: E402,F401
from alloctune.sim.budget import min_budget  # noqa: E402
from alloctune.sim.compare import compare  # noqa: E402
from alloctune.sim.replay import replay  # noqa: E402
from alloctune.sim.settings import SimSettings  # noqa: E402
from alloctune.trace import load_trace  # noqa: E402
from alloctune.trace.model import FAILED_ALLOC, Trace  # noqa: E402
from alloctune.units import format_size  # noqa: E402

SCHEMA = "alloctune.bench.fidelity/2"
SUFFIXES = (".pickle.xz", ".pickle.gz", ".pickle", ".atrace")
MiB = 1 << 20


def find_runs(folder: Path) -> dict[str, Path]:
    """Run name -> file for every recording in one workload folder."""
    runs: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        for suffix in SUFFIXES:
            if path.name.endswith(suffix):
                runs.setdefault(path.name[: -len(suffix)], path)
                break
    return runs


def flat_groups(folder: Path) -> dict[str, dict[str, Path]]:
    """A flat folder of `WORKLOAD_RUN.pickle.xz` recordings (as bench/gpu-results/batch8/a) as workload -> run -> file."""
    groups: dict[str, dict[str, Path]] = {}
    for name, path in find_runs(folder).items():
        wl, _, run = name.partition("_")
        if run:
            groups.setdefault(wl, {})[run] = path
    return groups


def shipped_groups() -> dict[str, dict[str, Path]]:
    """The package's shipped traces as workload -> run -> file (`default` = no suffix)."""
    from alloctune.demo.core import shipped_trace_path, shipped_traces

    groups: dict[str, dict[str, Path]] = {}
    for name in shipped_traces():
        stem = name[: -len(".atrace")]
        if stem == "rvc_h200_ec1":  # a different program (empty_cache per chunk), no siblings
            continue
        wl, _, run = stem.partition("_h200")
        groups.setdefault(wl, {})[run.lstrip("_") or "default"] = shipped_trace_path(name)
    return groups


def first_failure(trace: Trace) -> int | None:
    """Index of the first request that failed on the GPU, or None."""
    for i, op in enumerate(trace.requests.ops):
        if op == FAILED_ALLOC:
            return i
    return None


def _recorded_peaks(ref: Trace, fid) -> tuple[int | None, int | None]:
    res = fid.stats.get("reserved_bytes.all.peak", (None, None))[0]
    alloc = fid.stats.get("allocated_bytes.all.peak", (None, None))[0]
    return res, alloc


def check_one(ref: Trace, stream: Trace, source: str, cap: int | None) -> dict[str, Any]:
    """Replay `stream` under `ref`'s setting and cap with an address source; compare with `ref`."""
    settings = SimSettings.from_allocator_settings(ref.allocator_settings)
    addresses, reference = replay_addresses(source, stream, ref)
    t0 = time.perf_counter()
    result = replay(stream, settings, budget=cap, addresses=addresses, reference=reference)
    fid = compare(result, ref, stream_trace=None if stream is ref else stream, explain=False)
    rec_fail = first_failure(ref)
    sim_fail = result.oom.request_index if result.oom else (result.expected_failures[0] if result.expected_failures else None)
    kind = fidelity_kind(source, stream, ref)
    # the program's reaction to its failures is not in another run's stream: judge such a
    # prediction by where it fails first; everything else event for event
    by_failure = stream is not ref and rec_fail is not None
    ok = sim_fail == rec_fail if by_failure else fid.exact
    rec_res, rec_alloc = _recorded_peaks(ref, fid)
    return {
        "kind": kind,
        "addresses": result.addresses,
        "ok": ok,
        "judged_by": "first failure" if by_failure else "events",
        "exact": fid.exact,
        "verdict": fid.verdict,
        "events": f"{fid.events_simulated}/{fid.events_recorded}",
        "first_difference": fid.first_difference,
        "compared_stats": sorted(fid.stats),
        "first_failure": {"recorded": rec_fail, "simulated": sim_fail},
        "peak_reserved": {"recorded": rec_res, "simulated": result.peak_reserved},
        "peak_allocated": {"recorded": rec_alloc, "simulated": result.peak_allocated},
        "seconds": round(time.perf_counter() - t0, 2),
    }


def check_run(run: str, ref: Trace, default: Trace) -> dict[str, Any]:
    """The three figures for one run (prediction from one recording is skipped for `default`)."""
    cap = int(ref.meta.get("cap") or 0) or None
    same_stream = (ref.requests.ops, ref.requests.sizes) == (default.requests.ops, default.requests.sizes)
    row: dict[str, Any] = {"run": run, "cap": cap, "conf": ref.meta.get("conf", ""), "same_stream": same_stream,
                           "sidecar_stats": bool((ref.meta or {}).get("stats"))}
    row[REPLAY] = check_one(ref, ref, TRACE, cap)
    row[PREDICTION] = None if ref is default else check_one(ref, default, TRACE, cap)
    row[MODELLED] = check_one(ref, default, MODEL, cap)
    return row


def min_budget_pair(ref: Trace, default: Trace) -> dict[str, Any]:
    """Min budget of `ref`'s setting from its own stream (replay) and from default's (prediction)."""
    settings = SimSettings.from_allocator_settings(ref.allocator_settings)
    own = min_budget(ref, settings).budget
    pred = min_budget(default, settings).budget
    tol = max(16 * MiB, int(0.01 * max(own or 0, pred or 0)))
    agree = own is not None and pred is not None and abs(own - pred) <= tol
    return {"replay": own, "prediction": pred, "agree": agree, "tolerance": tol}


def measured_min_budget(ref: Trace, default: Trace, measured: dict[str, Any]) -> dict[str, Any]:
    """The simulated min budget of `ref`'s setting from default's stream (what a user predicts) beside
    the one bisected on the GPU in fresh processes (`fails_at` < min budget <= `min_budget`)."""
    settings = SimSettings.from_allocator_settings(ref.allocator_settings)
    sim = min_budget(default, settings, total_memory=ref.total_memory)
    lo, hi = int(measured["fails_at"]), int(measured["min_budget"])
    s_lo, s_hi = sim.infeasible_below, sim.budget
    overlap = s_hi is not None and s_lo < hi and s_hi > lo
    return {"measured": [lo, hi], "simulated": [s_lo, s_hi], "overlap": overlap,
            "ratio": None if s_hi is None else round(s_hi / hi, 4)}


def _cell(check: dict[str, Any] | None, capped: bool) -> str:
    if check is None:
        return "(is the recording)"
    if check["judged_by"] == "first failure":
        ff = check["first_failure"]
        return f"{'fails at' if check['ok'] else 'MISS: fails at'} #{ff['simulated']} (rec. #{ff['recorded']})"
    if check["exact"]:
        return "exact"
    if check["first_difference"] is not None:
        return f"DIFF from event #{check['first_difference']}"
    return "DIFF: " + check["verdict"]


def _peaks(check: dict[str, Any] | None) -> str:
    if check is None or check["judged_by"] == "first failure":
        return ""
    pr, pa = check["peak_reserved"], check["peak_allocated"]
    res = "=" if pr["recorded"] == pr["simulated"] else f"{format_size(pr['simulated'])} vs {format_size(pr['recorded'] or 0)}"
    if pa["recorded"] is None:
        return f"res {res}; alloc n/a"
    alc = "=" if pa["recorded"] == pa["simulated"] else f"{format_size(pa['simulated'])} vs {format_size(pa['recorded'])}"
    return f"res {res}; alloc {alc}"


def _gpu_cell(m: dict[str, Any] | None) -> str:
    if not m:
        return ""
    sim = m["simulated"][1]
    lo, hi = m["measured"]
    return (f"{format_size(sim) if sim else '-'} / ({format_size(lo)}, {format_size(hi)}] "
            f"({'overlap' if m['overlap'] else 'DIFFER'})")


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The three headline figures, counted over the rows where each applies."""
    out: dict[str, Any] = {}
    for kind in (REPLAY, PREDICTION, MODELLED):
        checks = [(r, r[kind]) for r in rows if r[kind] is not None]
        unc = [c for _, c in checks if c["judged_by"] == "events"]
        cap = [c for _, c in checks if c["judged_by"] == "first failure"]
        out[kind] = {
            "exact": sum(c["exact"] for _, c in checks), "rows": len(checks),
            "uncapped_exact": sum(c["exact"] for c in unc), "uncapped": len(unc),
            "capped_first_failure": sum(c["ok"] for c in cap),
            "capped": len(cap),
            "uncapped_peak_reserved": sum(c["peak_reserved"]["recorded"] == c["peak_reserved"]["simulated"] for c in unc),
            "uncapped_peak_allocated": sum(c["peak_allocated"]["recorded"] == c["peak_allocated"]["simulated"]
                                           for c in unc if c["peak_allocated"]["recorded"] is not None),
            "with_allocated": sum(c["peak_allocated"]["recorded"] is not None for c in unc),
        }
    mbs = [r["min_budget"] for r in rows if r.get("min_budget")]
    out["min_budget"] = {"agree": sum(m["agree"] for m in mbs), "rows": len(mbs)}
    gpu = [r["measured_min_budget"] for r in rows if r.get("measured_min_budget")]
    ratios = [m["ratio"] for m in gpu if m["ratio"] is not None]
    out["measured_min_budget"] = {"overlap": sum(m["overlap"] for m in gpu), "rows": len(gpu),
                                  "ratio_min": min(ratios, default=None), "ratio_max": max(ratios, default=None)}
    return out


def _kind_line(name: str, what: str, f: dict[str, Any]) -> str:
    alloc = (f", peak allocated in {f['uncapped_peak_allocated']}/{f['with_allocated']}" if f["with_allocated"] else "")
    capped = (f"; runs that failed under their cap fail at the recorded first request in "
              f"**{f['capped_first_failure']}/{f['capped']}**" if f["capped"] else "")
    return (f"- **{name}** ({what}): runs without a recorded failure **{f['uncapped_exact']}/{f['uncapped']} exact** "
            f"(peak reserved equal in {f['uncapped_peak_reserved']}/{f['uncapped']}{alloc}){capped}.")


def render(rows: list[dict[str, Any]], summary: dict[str, Any], header: str) -> str:
    lines = [header, ""]
    s = summary
    rp, pr, md = s[REPLAY], s[PREDICTION], s[MODELLED]
    lines += [
        f"- **replay** (own stream, own addresses): **{rp['exact']}/{rp['rows']} exact**.",
        _kind_line("prediction from one recording", "default's stream and addresses", pr),
        _kind_line("prediction with modelled addresses", "default's stream, no recorded address", md),
    ]
    if s["min_budget"]["rows"]:
        lines.append(f"- **min budget** of each uncapped setting other than default, bisected on the run's own stream "
                     f"and addresses vs on default's (within 1 % / 16 MiB): **{s['min_budget']['agree']}/"
                     f"{s['min_budget']['rows']} agree** (not measured on the GPU; `min_budget` has no modelled-address mode).")
    g = s["measured_min_budget"]
    if g["rows"]:
        lines.append(f"- **min budget against the GPU** (simulated from default's stream and addresses vs bisected on "
                     f"the GPU in fresh processes): brackets overlap in **{g['overlap']}/{g['rows']}**; simulated ÷ "
                     f"measured {g['ratio_min']:.3f}–{g['ratio_max']:.3f}.")
    lines += [
        "",
        "*exact* = same segment event sequence, same compared stats, same failed requests. *compared*: "
        "`sidecar` = the run's recorded `memory_stats()` (peaks, retries, OOMs, device allocs/frees); "
        "`events only` = no stats recorded, so only the segment events, the reserved peak rebuilt from them and the "
        "OOM count were compared. Peaks: `=` equal to the recording, else simulated vs recorded.",
        "",
        "| workload | run | cap | same stream | compared | replay | prediction (one recording) | peaks | "
        "modelled addresses | peaks | min budget own / default's stream | min budget simulated / GPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        capped = bool(r["cap"])
        mb = r.get("min_budget")
        mb_cell = "" if not mb else (
            f"{format_size(mb['replay']) if mb['replay'] else '-'} / {format_size(mb['prediction']) if mb['prediction'] else '-'}"
            f" ({'agree' if mb['agree'] else 'DIFFER'})")
        lines.append(
            f"| {r['workload']} | {r['run']} | {format_size(r['cap']) if capped else '-'} | "
            f"{'yes' if r['same_stream'] else 'no'} | {'sidecar' if r['sidecar_stats'] else 'events only'} | "
            f"{_cell(r[REPLAY], capped)} | {_cell(r[PREDICTION], capped)} | {_peaks(r[PREDICTION])} | "
            f"{_cell(r[MODELLED], capped)} | {_peaks(r[MODELLED])} | {mb_cell} | {_gpu_cell(r.get('measured_min_budget'))} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--traces", default=str(ROOT.parent / "shared" / "traces"),
                     help="folder with one sub-folder of recordings per workload")
    src.add_argument("--shipped", action="store_true", help="the traces shipped in the package")
    src.add_argument("--flat", help="a flat folder of WORKLOAD_RUN recordings (e.g. bench/gpu-results/batch8/a)")
    ap.add_argument("--workloads", default="", help="comma-separated workloads (default: every folder)")
    ap.add_argument("--runs", default="", help="comma-separated run names (default: every recording)")
    ap.add_argument("--skip", default="", help="comma-separated run names to leave out (another program input)")
    ap.add_argument("--min-budget", action="store_true", help="also bisect each uncapped setting's min budget twice")
    ap.add_argument("--measured", help="bisect_results.json of GPU min-budget bisections (name WORKLOAD_RUN)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fidelity.md"))
    args = ap.parse_args(argv)
    if args.shipped:
        groups = shipped_groups()
        label = "the package's shipped traces (`src/alloctune/data/traces`)"
    elif args.flat:
        if not Path(args.flat).is_dir():
            print(f"fidelity: error: no folder {args.flat}", file=sys.stderr)
            return 2
        groups = flat_groups(Path(args.flat))
        label = f"`{args.flat}`"
    else:
        traces = Path(args.traces)
        if not traces.is_dir():
            print(f"fidelity: error: traces not found at {traces}", file=sys.stderr)
            return 2
        groups = {d.name: find_runs(d) for d in sorted(traces.iterdir()) if d.is_dir()}
        label = f"`{traces}`"
    wanted_wl = [w for w in args.workloads.split(",") if w] or sorted(groups)
    measured: dict[str, Any] = {}
    if args.measured:
        measured = {m["name"]: m for m in json.loads(Path(args.measured).read_text())
                    if "min_budget" in m and "fails_at" in m}
    wanted_runs = [r for r in args.runs.split(",") if r]
    rows: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    for wl in wanted_wl:
        runs = groups.get(wl, {})
        if "default" not in runs:
            print(f"{wl:10s} skipped: no `default` recording", flush=True)
            continue
        default = load_trace(runs["default"])
        for run in ["default"] + sorted(r for r in runs if r != "default"):
            if (wanted_runs and run not in wanted_runs) or run in args.skip.split(","):
                continue
            ref = default if run == "default" else load_trace(runs[run])
            row = {"workload": wl, **check_run(run, ref, default)}
            if args.min_budget and not row["cap"] and ref is not default:
                row["min_budget"] = min_budget_pair(ref, default)
            if measured.get(f"{wl}_{run}") and not row["cap"]:
                row["measured_min_budget"] = measured_min_budget(ref, default, measured[f"{wl}_{run}"])
            rows.append(row)
            capped = bool(row["cap"])
            print(f"{wl:10s} {run:24s} replay: {_cell(row[REPLAY], capped):24s} "
                  f"prediction: {_cell(row[PREDICTION], capped):28s} modelled: {_cell(row[MODELLED], capped)}",
                  flush=True)
    total = time.perf_counter() - t_all
    summary = summarize(rows)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = "python bench/fidelity.py " + " ".join(argv if argv is not None else sys.argv[1:])
    header = (f"## Simulator fidelity — {stamp}\n\n`{cmd.strip()}` on {label}; CPU, {total:.1f} s. "
              "Generated by bench/fidelity.py: do not edit by hand.")
    text = render(rows, summary, header)
    print("\n" + "\n".join(line for line in text.splitlines() if line.startswith("- ")))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(
        {"schema": SCHEMA, "generated": stamp, "command": cmd.strip(), "traces": label, "seconds": round(total, 1),
         "summary": summary, "rows": rows}, indent=1, default=str))
    print(f"wrote {out} and {out.with_suffix('.json')}")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runlog import log_results

    log_results([line for line in text.splitlines() if line.startswith("- ")],
                argv=["bench/fidelity.py", *(argv if argv is not None else sys.argv[1:])], folder=out.parent)
    return 0 if summary[REPLAY]["exact"] == summary[REPLAY]["rows"] else 1


if __name__ == "__main__":
    sys.exit(main())
