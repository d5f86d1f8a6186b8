"""Accuracy of the `empty_cache()` inference on recordings whose calls are known.

Two kinds of truth:
* a recording whose sidecar has `memory_stats()` (`NAME.json`, key `stats`): every
  `empty_cache()` call and every allocator retry synchronises all streams once, so the number of
  calls is `num_sync_all_streams - num_alloc_retries` (a count, not positions);
* a recording made through alloctune's agent (`record`, `run --record`), which marks each call
  (snapshot key `alloctune_empty_cache_calls`): positions are known exactly.

For each recording the stream is rebuilt three ways -- the old rule (only the level the run
already held proves a call: `Limit()` unknown), the limit-aware rule (cap / device from the run
record), and the agent's marks when present -- and the calls found are compared with the truth.

    python bench/empty_cache_inference.py [DIR ...] [--out bench/results/empty_cache.md]
    python bench/empty_cache_inference.py record --out DIR     # on a GPU (job `empty-cache`), then scores DIR

DIR (default ../shared/traces) is searched recursively for `*.pickle[.xz|.gz]`. `record` makes recordings
whose calls are marked, each a fresh process through `runner.run_trial(record=...)` (so the agent marks the
calls): `rvc_ec1` (`alloctune.workloads.rvc --count 6`: an `empty_cache()` after every chunk, some release
nothing), and `probe` (calls that release nothing, calls followed by a *larger* segment than any held before:
the old rule booked those as the allocator's), uncapped and under a 1 GiB cap; then scores them
(`DIR/empty_cache.md`; kept as bench/results/empty_cache_gpu.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from runlog import log_results
from suite import ROOT, SHARED, child_env

# isort: split
from alloctune.trace.load import load_snapshot, pick_device, read_sidecar  # after suite, which puts src/ on the path
from alloctune.trace.stream import EMPTY_CACHE_MARKS_KEY, Limit, build_stream

SCHEMA = "alloctune.bench.empty_cache/1"
PROBE = textwrap.dedent("""
    import torch
    MiB = 1 << 20
    keep = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.empty_cache()                      # releases nothing: no event without the mark
    a = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda"); del a
    torch.cuda.empty_cache()                      # releases the 30 MiB segment's cache
    b = torch.empty(500 * MiB, dtype=torch.uint8, device="cuda")  # larger than anything held before
    del b
    for n in (40, 80, 160, 320):
        x = torch.empty(n * MiB, dtype=torch.uint8, device="cuda"); del x
        torch.cuda.empty_cache()
        y = torch.empty(2 * n * MiB, dtype=torch.uint8, device="cuda"); del y   # new, larger segment next
    torch.cuda.empty_cache(); torch.cuda.empty_cache()   # the second releases nothing
""")


def check(path: Path) -> dict[str, Any] | None:
    snap = load_snapshot(path)
    meta = read_sidecar(path)
    dev = pick_device(snap, None, str(path))
    events = snap["device_traces"][dev]
    settings = snap.get("allocator_settings") or {}
    stats = meta.get("stats") or {}
    marks = snap.get(EMPTY_CACHE_MARKS_KEY)
    known = None
    if "num_sync_all_streams" in stats and "num_alloc_retries" in stats:
        known = int(stats["num_sync_all_streams"]) - int(stats["num_alloc_retries"])
    if known is None and marks is None:
        return None
    old = build_stream(events, settings).empty_cache_bursts
    aware = build_stream(events, settings, limit=Limit.from_meta(meta)).empty_cache_bursts
    row: dict[str, Any] = {"file": str(path), "known_calls": known, "old_rule": len(old), "limit_aware": len(aware),
                           "limit": Limit.from_meta(meta).bytes}
    if marks is not None:
        marked = build_stream(events, settings, marks=marks)
        truth = {marked.requests.event_index[i] for i in marked.marked_calls}
        row.update(marked_calls=len(marks), unmatched_marks=marked.unmatched_marks,
                   unmarked_releases=len(marked.empty_cache_bursts) - len(marked.marked_calls))
        for name, limit in (("old", Limit()), ("aware", Limit.from_meta(meta))):
            inferred = build_stream(events, settings, limit=limit)
            found = {inferred.requests.event_index[i] for i in inferred.empty_cache_bursts}
            row[f"positions_right_{name}"] = len(found & truth)  # marked calls the inference placed right
            row[f"extra_{name}"] = len(found - truth)  # inferred calls the program never made
    return row


def record(out: Path) -> int:
    """The GPU recordings (agent-marked calls), then their scores."""
    from alloctune.run.runner import run_trial

    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.py").write_text(PROBE)
    runs = []
    for name, cmd, budget in (("rvc_ec1", ["-m", "alloctune.workloads.rvc", "--count", "6"], None),
                              ("probe", [str(out / "probe.py")], None), ("probe_cap", [str(out / "probe.py")], 1 << 30)):
        res = run_trial([sys.executable, *cmd], record=out / f"{name}.pickle.xz", budget=budget,
                        capture=out / f"{name}.log", cwd=str(ROOT), env=child_env())
        side = {"workload": name, "conf": "", "cap": int(budget or 0), "total_memory": res.total_memory,
                "outcome": res.outcome, "stats": dict(res.stats)}
        (out / f"{name}.json").write_text(json.dumps(side, indent=1))
        runs.append({"name": name, "outcome": res.outcome, "snapshot": res.snapshot})
    print(json.dumps(runs, indent=1))
    return main([str(out), "--out", str(out / "empty_cache.md")])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["record"]:
        ap = argparse.ArgumentParser(prog="empty_cache_inference.py record")
        ap.add_argument("--out", required=True)
        return record(Path(ap.parse_args(argv[1:]).out))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="*", default=[str(SHARED)])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "empty_cache.md"))
    args = ap.parse_args(argv)
    rows = []
    for d in args.dirs:
        for path in sorted(p for p in Path(d).rglob("*.pickle*") if p.suffix in (".pickle", ".xz", ".gz")):
            row = check(path)
            if row is not None:
                rows.append(row)
                print(f"{path.relative_to(d)}: known {row['known_calls']}, old rule {row['old_rule']}, "
                      f"limit-aware {row['limit_aware']}" + (f", marked {row['marked_calls']}" if "marked_calls" in row
                                                             else ""), flush=True)
    counted = [r for r in rows if r["known_calls"] is not None]
    right_old = sum(r["old_rule"] == r["known_calls"] for r in counted)
    right_aware = sum(r["limit_aware"] == r["known_calls"] for r in counted)
    marked = [r for r in rows if "marked_calls" in r]
    lines = [
        "## empty_cache() inference on recordings with known calls",
        "",
        f"`python bench/empty_cache_inference.py {' '.join(argv)}`. "
        "Generated by the script: do not edit by hand.",
        "",
        f"- Call counts known from `memory_stats()` (num_sync_all_streams − num_alloc_retries): the count inferred is "
        f"right in **{right_aware}/{len(counted)}** recordings with the limit-aware rule, {right_old}/{len(counted)} "
        "with the old rule (level already held only).",
    ]
    if marked:
        tot = sum(r["marked_calls"] for r in marked)
        lines.append(f"- Agent-marked recordings: {len(marked)}, {tot} marked calls; placed right by inference "
                     f"{sum(r['positions_right_aware'] for r in marked)}/{tot} (limit-aware), "
                     f"{sum(r['positions_right_old'] for r in marked)}/{tot} (old rule); calls inferred that the "
                     f"program never made: {sum(r['extra_aware'] for r in marked)} (limit-aware), "
                     f"{sum(r['extra_old'] for r in marked)} (old rule); marks that found no place: "
                     f"{sum(r['unmatched_marks'] for r in marked)}; releases no mark and no malloc explains (an "
                     f"empty_cache reached without the wrapper): {sum(r['unmarked_releases'] for r in marked)}.")
    else:
        lines.append("- No agent-marked recordings in the input (record through `alloctune record` to get them).")
    lines += ["", "| recording | known calls | old rule | limit-aware | marked (limit-aware: right, extra) |",
              "|---|---|---|---|---|"]
    for r in rows:
        mk = (f"{r['marked_calls']} ({r['positions_right_aware']} right, {r['extra_aware']} extra)"
              if "marked_calls" in r else "-")
        lines.append(f"| {r['file']} | {r['known_calls'] if r['known_calls'] is not None else '-'} | {r['old_rule']} | "
                     f"{r['limit_aware']} | {mk} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"schema": SCHEMA, "rows": rows}, indent=1))
    print("\n".join(lines[4:6]))
    log_results([line for line in lines[:6] if line.startswith("- ")], folder=out.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
