"""Size and load time of the shared traces: original snapshot vs alloctune's compact format.

For each trace: the `.pickle.xz` size and `load_trace` time (decompress, restricted
unpickle, request stream), then the compact file's size and load time, and whether the
compact trace gives back the same request stream and segment events. Times are the best
of 3 runs (wall and CPU: the machine may be shared).

    python bench/trace_load.py [--no-append] [NAME ...]   # names like llm/default (default: llm/default rvc_ec1/default)
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from alloctune.trace import load_trace, save_compact  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces"


def best_of(fn, n=3):
    walls, cpus, result = [], [], None
    for _ in range(n):
        w, c = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return min(walls), min(cpus), result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", default=["llm/default", "rvc_ec1/default"])
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.names:
            src = TRACES / f"{name}.pickle.xz"
            w0, c0, trace = best_of(lambda: load_trace(src))
            out = Path(tmp) / (name.replace("/", "_") + ".trace.xz")
            save_compact(trace, out)
            w1, c1, back = best_of(lambda: load_trace(out))
            same = (back.requests.ops == trace.requests.ops and back.requests.sizes == trace.requests.sizes
                    and back.requests.rids == trace.requests.rids and back.segment_events == trace.segment_events)
            rows.append((name, len(trace.requests), src.stat().st_size, w0, c0, out.stat().st_size, w1, c1, same))
    head = "| trace | requests | snapshot .pickle.xz | load (wall / cpu) | compact | load (wall / cpu) | same stream |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for name, n, s0, w0, c0, s1, w1, c1, same in rows:
        lines.append(f"| {name} | {n} | {s0:,} B | {w0:.2f} / {c0:.2f} s | {s1:,} B ({s0 / s1:.0f}x smaller) "
                     f"| {w1:.2f} / {c1:.2f} s | {'yes' if same else 'NO'} |")
    print("\n".join(lines))
    if not args.no_append:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from runlog import log_result

        for name, n, s0, w0, c0, s1, w1, c1, same in rows:
            log_result(f"{name} ({n} requests): snapshot load {w0:.2f} s wall, compact {s0 / s1:.0f}x smaller, "
                       f"loads in {w1:.2f} s; same stream: {'yes' if same else 'NO'}")
    return 0 if all(r[-1] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
