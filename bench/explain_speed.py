"""How fast `explain` is on a 1 M-request compact trace with stacks (goal: < 10 s on a 2-core machine).

The trace is a synthetic training loop (very regular, so its xz file is tiny; tests/explain_programs.py)
run for enough steps to make >= 1 M requests, written as a compact trace with its stack table. Timed:
the load, explain without what-ifs, and explain with them (its what-ifs and remedies: each a rewrite
of the recording and its min-budget bisection; the replays run in a second thread, so the machine's
core count is in the table); and, for real data, the shipped llm_h200.atrace (a real recording
without stacks). Prints a table and appends it with the exact command to
bench/results/explain_speed.md (indexed from bench/results/RESULTS.md).

    PYTHONPATH=src python bench/explain_speed.py [--requests 1000000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from runlog import append_section

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    args = ap.parse_args()
    from alloctune.explain import explain
    from alloctune.trace import load_trace
    from alloctune.trace.compact import save_compact
    from alloctune.trace.load import trace_from_snapshot
    from explain_programs import training_loop

    per_step = 21  # requests per step of training_loop (used only to size the run)
    steps = args.requests // per_step + 1
    t0 = time.perf_counter()
    snap, _ = training_loop(steps=steps, keep_logits=True, logits=8192)  # 8 KiB kept per step: fits the device
    trace = trace_from_snapshot(snap, source="explain_speed")
    n = len(trace.requests)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big.atrace"
        size = save_compact(trace, path)
        import copy

        bare = copy.copy(trace)
        bare.requests = copy.copy(trace.requests)
        bare.requests.stack_ids, bare.requests.stack_table = None, None
        size_bare = save_compact(bare, Path(d) / "bare.atrace")
        vsnap, _ = training_loop(steps=5000, keep_logits=True, logits=8192, vary=True)
        vtrace = trace_from_snapshot(vsnap, source="vary")
        vsize = save_compact(vtrace, Path(d) / "vary.atrace")
        vbare = copy.copy(vtrace)
        vbare.requests = copy.copy(vtrace.requests)
        vbare.requests.stack_ids, vbare.requests.stack_table = None, None
        vsize_bare = save_compact(vbare, Path(d) / "vary_bare.atrace")
        del vsnap, vtrace, vbare, bare
        build = time.perf_counter() - t0
        del snap, trace
        t = time.perf_counter()
        tr = load_trace(path)
        load_s = time.perf_counter() - t
        t = time.perf_counter()
        ex = explain(tr, what_if=False)
        explain_s = time.perf_counter() - t
        t = time.perf_counter()
        exw = explain(tr, what_if=True)
        whatif_s = time.perf_counter() - t
    real = HERE.parent / "src" / "alloctune" / "data" / "traces" / "llm_h200.atrace"
    t = time.perf_counter()
    rt = load_trace(real)
    real_load = time.perf_counter() - t
    t = time.perf_counter()
    explain(rt, what_if=False)
    real_explain = time.perf_counter() - t
    rows = [
        ("requests", f"{n}"),
        ("compact file (xz), with / without the stack table", f"{size / 1e3:.1f} kB / {size_bare / 1e3:.1f} kB"),
        ("varying shapes, 5000 steps: with / without the stack table",
         f"{vsize / 1e3:.1f} kB / {vsize_bare / 1e3:.1f} kB"),
        ("load", f"{load_s:.2f} s"),
        ("explain (no what-ifs)", f"{explain_s:.2f} s"),
        ("load + explain", f"{load_s + explain_s:.2f} s"),
        ("explain with what-ifs", f"{whatif_s:.2f} s ({len(exw.what_if)} what-ifs, {len(exw.remedies)} remedies)"),
        ("cores", f"{os.cpu_count()}"),
        ("repetitions found", f"{ex.repeats['count']}"),
        (f"real: {real.name} ({len(rt.requests)} requests, no stacks) load", f"{real_load:.2f} s"),
        (f"real: {real.name} explain (no what-ifs)", f"{real_explain:.2f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    table = "\n".join(f"| {k:<{width}} | {v} |" for k, v in rows)
    print(table)
    print(f"(building the synthetic trace took {build:.1f} s, not counted)")
    append_section(HERE / "results" / "explain_speed.md", "explain speed on a 1 M-request compact trace with stacks",
                   f"`PYTHONPATH=src python bench/explain_speed.py --requests {args.requests}`",
                   f"| what | value |\n|---|---|\n{table}")


if __name__ == "__main__":
    main()
