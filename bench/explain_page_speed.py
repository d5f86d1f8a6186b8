"""How long the explain page adds to `alloctune explain` (the pass over time, the map, the HTML).

On the same synthetic 1 M-request training loop with stacks as bench/explain_speed.py, on the
shipped llm_h200.atrace (a real recording without stacks) and on two real H200 recordings with
stacks (tests/data/explain_gpu). Timed per recording: explain without what-ifs, the page's
views (`explain_view`: one replay through the Python model plus the category rule at each
sample point) and the HTML; the page's size and sample points. Prints a table and appends it
with the exact command to bench/results/explain_page.md (indexed from bench/results/RESULTS.md).

    PYTHONPATH=src python bench/explain_page_speed.py [--requests 1000000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from runlog import append_section

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def _time(label: str, trace, rows: list) -> None:
    from alloctune.analysis.core import analyse
    from alloctune.explain import explain
    from alloctune.report.explain_html import explain_page
    from alloctune.report.explain_view import explain_view

    t = time.perf_counter()
    ex = explain(trace, what_if=False)
    explain_s = time.perf_counter() - t
    t = time.perf_counter()
    view = explain_view(trace, ex, analyse(trace, ex.group))
    view_s = time.perf_counter() - t
    t = time.perf_counter()
    html = explain_page(view)
    html_s = time.perf_counter() - t
    rows.append((label, f"{len(trace.requests)}", f"{explain_s:.2f} s", f"{view_s:.2f} s", f"{html_s:.2f} s",
                 f"{len(view.over_time.request)}", f"{len(html.encode()) / 1e3:.0f} kB"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    args = ap.parse_args()
    from explain_programs import training_loop

    from alloctune.trace import load_trace
    from alloctune.trace.compact import save_compact
    from alloctune.trace.load import trace_from_snapshot

    rows: list = []
    for name in ("train_leak", "convnext_leak"):
        _time(f"real H200 {name} (stacks)", load_trace(HERE.parent / "tests" / "data" / "explain_gpu" /
                                                    f"{name}.pickle.xz"), rows)
    _time("real llm_h200.atrace (no stacks)",
          load_trace(HERE.parent / "src" / "alloctune" / "data" / "traces" / "llm_h200.atrace"), rows)
    snap, _ = training_loop(steps=args.requests // 21 + 1, keep_logits=True, logits=8192)
    trace = trace_from_snapshot(snap, source="explain_page_speed")
    del snap
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big.atrace"
        save_compact(trace, path)
        del trace
        _time("synthetic training loop (stacks)", load_trace(path), rows)
    head = ("recording", "requests", "explain (no what-ifs)", "page views", "HTML", "points", "page size")
    table = "| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n" + "\n".join(
        "| " + " | ".join(r) + " |" for r in rows)
    print(table)
    append_section(HERE / "results" / "explain_page.md", "What the explain page adds to explain (time, size)",
                   f"`PYTHONPATH=src python bench/explain_page_speed.py --requests {args.requests}`", table)


if __name__ == "__main__":
    main()
