"""Replay speed of the allocator simulator on llm/default (~650k requests).

Loads the trace once (time reported separately), then replays it under each of the six
uncapped settings of the shared traces and reports requests/s (wall and CPU time: the
machine may be shared). Targets: >= 300k requests/s per setting, the whole six-setting
comparison (load included) under 20 s.

    python bench/sim_speed.py [--trace PATH] [--no-append]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from alloctune.config import AllocatorConfig  # noqa: E402
from alloctune.sim.replay import replay  # noqa: E402
from alloctune.trace import load_trace  # noqa: E402
from alloctune.units import format_size  # noqa: E402

SETTINGS = [
    "",
    "max_split_size_mb:128",
    "max_split_size_mb:512",
    "expandable_segments:True",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=str(ROOT.parent / "shared" / "traces" / "llm" / "default.pickle.xz"))
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    t_start = time.perf_counter()
    trace = load_trace(args.trace)
    load_s = time.perf_counter() - t_start
    n = len(trace.requests)
    print(f"loaded {args.trace}: {n} requests in {load_s:.2f} s")
    rows = []
    for text in SETTINGS:
        config = AllocatorConfig.parse(text)
        w0, c0 = time.perf_counter(), time.process_time()
        result = replay(trace, config)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        rows.append((text or "(unset)", wall, cpu, n / wall, n / cpu, result.peak_reserved))
        print(f"{text or '(unset)':52s} {wall:5.2f} s wall {n / wall / 1e3:6.0f}k req/s "
              f"(cpu {n / cpu / 1e3:6.0f}k req/s)  peak reserved {format_size(result.peak_reserved)}", flush=True)
    total = time.perf_counter() - t_start
    slowest = min(r[3] for r in rows)
    print(f"six settings incl. load: {total:.1f} s; slowest setting {slowest / 1e3:.0f}k req/s (wall)")
    if not args.no_append:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        lines = [
            "",
            f"## Simulator speed — {stamp}",
            "",
            f"`python bench/sim_speed.py` on llm/default ({n} requests), CPU, shared 2-core machine. "
            f"Load {load_s:.2f} s.",
            "",
            "| setting | replay s (wall) | requests/s (wall) | requests/s (cpu) | peak reserved |",
            "|---|---|---|---|---|",
        ]
        for name, wall, cpu, rw, rc, peak in rows:
            lines.append(f"| `{name}` | {wall:.2f} | {rw / 1e3:.0f}k | {rc / 1e3:.0f}k | {format_size(peak)} |")
        lines += ["", f"Six-setting comparison including load: **{total:.1f} s**.", ""]
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
