"""Replay speed of the allocator simulator: the Python model (before) against the native core
(after), in the same run on the same machine.

Three measurements (issue #17), each through both cores, with identical results checked:
  1. replay rate per setting class on the largest shared trace (llm/default, ~644k requests);
  2. the six-setting `simulate --min-budget` comparison on the largest shared and shipped traces, and the
     same six through `sim.sweep` one at a time and side by side (native only: threads);
  3. a 20-setting sweep of a 1 M-request stream, including loading it (compact format).
Rates are requests/s of CPU time (the machine is shared: wall time is printed beside it).
Targets: >= 5 M requests/s in every class; the 20-setting sweep under 8 s including load.

    python bench/sim_speed.py [--quick] [--out bench/results/sim_speed.md]

`--quick` skips the Python side of (2) and (3) (minutes on a 2-core machine).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from runlog import log_result
from suite import ROOT, SHARED, SHIPPED

# isort: split
from alloctune.sim import native  # after suite, which puts src/ on the path
from alloctune.sim.budget import min_budget
import alloctune.sim.sweep as sweep_mod
from alloctune.sim.sweep import sweep_threads
from alloctune.sim.sweep import sweep as sim_sweep
from alloctune.sim.replay import replay
from alloctune.trace import load_trace
from alloctune.trace.compact import save_compact
from alloctune.trace.model import RequestStream, Trace

GiB = 1 << 30

CLASSES = [  # (class, setting, budget as a fraction of the default uncapped peak reserved)
    ("default", "", None),
    ("max_split_size_mb", "max_split_size_mb:128", None),
    ("roundup (power of 2)", "roundup_power2_divisions:4", None),
    ("roundup (intervals)", "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", None),
    ("expandable segments", "expandable_segments:True", None),
    ("budget (retry / release)", "", 0.97),
    ("GC + max_split + budget", "garbage_collection_threshold:0.6,max_split_size_mb:256", 1.15),
    ("budget, expandable", "expandable_segments:True", 0.97),
]
SIX = ["", "max_split_size_mb:128", "max_split_size_mb:512", "expandable_segments:True",
       "roundup_power2_divisions:4", "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"]
TWENTY = SIX + [
    "max_split_size_mb:64", "max_split_size_mb:96", "max_split_size_mb:192", "max_split_size_mb:256",
    "max_split_size_mb:384", "max_split_size_mb:1024", "roundup_power2_divisions:2",
    "roundup_power2_divisions:8", "roundup_power2_divisions:16",
    "max_split_size_mb:256,roundup_power2_divisions:4", "expandable_segments:True,roundup_power2_divisions:4",
    "max_split_size_mb:128,max_non_split_rounding_mb:256",
    "garbage_collection_threshold:0.6,max_split_size_mb:256", "garbage_collection_threshold:0.8,max_split_size_mb:128",
]


@contextmanager
def core(name: str) -> Iterator[None]:
    old = os.environ.get("ALLOCTUNE_SIM")
    os.environ["ALLOCTUNE_SIM"] = name
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ALLOCTUNE_SIM", None)
        else:
            os.environ["ALLOCTUNE_SIM"] = old


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def million_stream(base: Trace, n: int = 1_000_000) -> Trace:
    """`base`'s request stream repeated (ids shifted) to n requests: a longer run of the same program."""
    rs = RequestStream()
    src = base.requests
    shift = max(src.rids) + 1
    k = 0
    while len(rs) < n:
        off = k * shift
        for op, size, rid, stream in src:
            if len(rs) >= n:
                break
            rs.append(op, size, rid + off if rid >= 0 else rid, stream, len(rs))  # event indices never go back
        k += 1
    return Trace(f"{base.source} x{k} ({n} requests)", base.device, rs, [], dict(base.allocator_settings),
                 total_memory=base.total_memory)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="skip the Python side of the min-budget and sweep parts")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sim_speed.md"))
    args = ap.parse_args()
    if not native.available():
        print("native core not built: run `python setup.py build_ext --inplace` (or pip install -e .)")
        return 1
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    say(f"## Simulator speed: Python model (before) vs native core (after) — {stamp}")
    say()
    say(f"`python bench/sim_speed.py{' --quick' if args.quick else ''}` on {platform.machine()} "
        f"({os.cpu_count()} cores, shared), Python {platform.python_version()}. Rates are requests per CPU second; "
        "wall seconds in brackets. Every native result is checked equal to the Python one (`to_dict()`).")
    say()

    # 1. replay rate per setting class ---------------------------------------------------------------
    big_shared = SHARED / "llm" / "default.pickle.xz"
    trace = load_trace(big_shared if big_shared.exists() else SHIPPED / "llm_h200.atrace")
    n = len(trace.requests)
    with core("native"):
        peak = replay(trace, "", record_events=False).peak_reserved
    say(f"### 1. Replay rate per setting class — {Path(trace.source).name}, {n} requests")
    say()
    say("| class | setting | budget | requests replayed | Python req/s | native req/s | speed-up | identical |")
    say("|---|---|---|---|---|---|---|---|")
    slowest = float("inf")
    for name, conf, frac in CLASSES:
        budget = int(peak * frac) if frac else None
        with core("python"):
            rp, wp, cp = timed(lambda: replay(trace, conf, budget=budget))
        with core("native"):
            replay(trace, conf, budget=budget)  # warm: column conversion is cached per stream
            rn, wn, cn = timed(lambda: replay(trace, conf, budget=budget))
        same = rp.to_dict() == rn.to_dict()
        slowest = min(slowest, rn.requests_done / cn if cn else float("inf"))
        bud = f"{budget / GiB:.2f} GiB" if budget else "-"
        done = rn.requests_done  # a budget can end the replay early: rate over the requests replayed
        say(f"| {name} | `{conf or '(unset)'}` | {bud} | {done} | {done / cp / 1e6:.2f} M ({wp:.2f} s) | "
            f"{done / cn / 1e6:.1f} M ({wn:.3f} s) | {cp / cn:.0f}x | {'yes' if same else '**NO**'} |")
    say()
    say(f"Slowest native class: **{slowest / 1e6:.1f} M requests/s** (target >= 5 M).")
    say()

    # 2. six-setting min-budget ----------------------------------------------------------------------
    say("### 2. Six-setting `--min-budget` (uncapped replay + bisection per setting)")
    say()
    say("Both columns use today's `min_budget` (the uncapped replay is reused, the probe the trace proves "
        "is skipped); before it, each setting cost one or two replays more.")
    say()
    threads = sweep_threads(len(SIX), "recorded")
    say(f"The last two: the same six through `sim.sweep` (no timeline, no events kept), one setting at a time and "
        f"side by side ({threads} threads here).")
    say()
    say("| trace | requests | Python s | native s | `sim.sweep`, 1 thread s | `sim.sweep`, threads s | budgets identical |")
    say("|---|---|---|---|---|---|---|")
    for path in (big_shared, SHIPPED / "llm_h200.atrace"):
        if not path.exists():
            continue
        t = load_trace(path)

        def six() -> list[Any]:
            out = []
            for conf in SIX:
                r = replay(t, conf, timeline_points=200)
                out.append(min_budget(t, conf, uncapped=r).budget)
            return out

        with core("native"):
            bn, wn, cn = timed(six)
            bs, ws, cs = timed(lambda: [row.min_budget for row in sim_sweep(t, SIX).rows])
            threads_at, sweep_mod.SWEEP_THREADS = sweep_mod.SWEEP_THREADS, 1
            b1, w1, c1 = timed(lambda: [row.min_budget for row in sim_sweep(t, SIX).rows])
            sweep_mod.SWEEP_THREADS = threads_at
        python, bp = "(skipped)", bn
        if not args.quick:
            with core("python"):
                bp, wp, cp = timed(six)
            python = f"{wp:.1f} ({cp:.1f} cpu)"
        say(f"| {path.parent.name}/{path.name} | {len(t.requests)} | {python} | {wn:.2f} ({cn:.2f} cpu) | "
            f"{w1:.2f} ({c1:.2f} cpu) | {ws:.2f} ({cs:.2f} cpu) | {'yes' if bp == bn == bs == b1 else '**NO**'} |")
    say()

    # 3. 20-setting sweep of 1 M requests ---------------------------------------------------------
    base = load_trace(SHIPPED / "llm_h200.atrace")
    big = million_stream(base)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "million.atrace"
        save_compact(big, path)

        def sweep() -> list[int]:
            t = load_trace(path)
            return [replay(t, conf, record_events=False).peak_reserved for conf in TWENTY]

        with core("native"):
            pn, wn, cn = timed(sweep)
        if args.quick:
            wp = cp = float("nan")
            same = "-"
        else:
            with core("python"):
                pp, wp, cp = timed(sweep)
            same = "yes" if pp == pn else "**NO**"
    say(f"### 3. 20-setting sweep of a {len(big.requests)}-request stream (llm_h200 repeated), load included")
    say()
    say("| core | wall s | cpu s | peaks identical |")
    say("|---|---|---|---|")
    say(f"| Python model | {wp:.1f} | {cp:.1f} | |")
    say(f"| native | **{wn:.2f}** | {cn:.2f} | {same} |")
    say()
    say("Target: under 8 s including load.")
    say()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    log_result(f"slowest native replay class {slowest / 1e6:.1f} M requests/s; 20-setting sweep native "
               f"{wn:.2f} s wall, Python {wp:.1f} s, peaks identical: {same}", folder=out.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
