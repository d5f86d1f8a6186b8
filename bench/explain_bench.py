"""explain on every recording, and what its page and Python stacks cost (CPU; the speed itself: explain_speed.py).

    python bench/explain_bench.py conservation          # every recording: categories sum exactly to reserved
    python bench/explain_bench.py page [--requests N]   # the explain page: its views, its HTML, its size
    python bench/explain_bench.py stacks [--steps N]    # a snapshot with 30-frame stacks: load + explain

* conservation: explain (no what-ifs) on every shipped compact trace (src/alloctune/data/traces) and every
  real H200 recording under ../shared/traces; one row per file (moment, reserved, the largest categories,
  repetitions, seconds) and whether the categories conserve; exit 1 when one does not.
* page: on the synthetic training loop with stacks of tests/explain_programs.py (N requests), the shipped
  llm_h200.atrace (a real recording without stacks) and two real H200 recordings with stacks
  (tests/data/explain_gpu): explain without what-ifs, the page's views (`explain_view`: one replay through
  the Python model plus the category rule at each sample point), the HTML; the page's size and points.
* stacks: the training loop of tests/explain_programs.py with every `alloc` event given its own copy of a
  30-frame stack (one dict per frame per event: the loader's worst case), then the same frames as torch
  2.11's snapshots hold them (one dict per frame line, shared by the events), as plain pickles, against
  the same snapshot without frames (goal: < 30 s including the load; the trace cache is off).

Each appends its table with the exact command to bench/results/explain_{conservation,page,stacks_load}.md.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

from runlog import append_section, command, md_table
from suite import ROOT, SHARED, SHIPPED

sys.path.insert(0, str(ROOT / "tests"))
RESULTS = ROOT / "bench" / "results"
DEPTH = 30


def conservation(args: argparse.Namespace) -> int:
    from alloctune.explain import explain
    from alloctune.units import format_size

    rows, bad = [], 0
    for f in sorted(SHIPPED.glob("*.atrace")) + sorted(SHARED.glob("*/*.pickle.xz")):
        ex, secs = timed(explain, f, what_if=False)
        cats = {c.name: c.bytes for c in ex.categories}
        m = ex.moment
        ok = sum(cats.values()) == m["reserved"] and cats["rounding"] == m["allocated"] - m["requested"]
        bad += not ok
        big = sorted(cats.items(), key=lambda kv: -kv[1])[:3]
        rows.append((f.name if f.suffix == ".atrace" else f"{f.parent.name}/{f.name}", m["reason"],
                     format_size(m["reserved"]), ", ".join(f"{k} {format_size(v)}" for k, v in big),
                     str(ex.repeats["count"]), "yes" if ok else "NO", ex.map_source.split(" (")[0], f"{secs:.1f}"))
        print(" | ".join(rows[-1]), flush=True)
    head = ("recording", "moment", "reserved", "largest categories", "reps", "conserves", "map", "s (with load)")
    append_section(RESULTS / "explain_conservation.md", "explain: categories sum to reserved memory on every recording",
                   f"`PYTHONPATH=src {command()}` ({len(rows)} recordings, {bad} not conserving)", md_table(head, rows))
    print(f"{len(rows)} recordings, {bad} not conserving")
    return 1 if bad else 0


def timed(fn, *args, **kw) -> tuple:
    """`fn(*args, **kw)` and the wall seconds it took."""
    t = time.perf_counter()
    return fn(*args, **kw), time.perf_counter() - t


def _page_row(label: str, trace, rows: list) -> None:
    from alloctune.analysis.core import analyse
    from alloctune.explain import explain
    from alloctune.report.explain_html import explain_page
    from alloctune.report.explain_view import explain_view

    ex, explain_s = timed(explain, trace, what_if=False)
    view, view_s = timed(lambda: explain_view(trace, ex, analyse(trace, ex.group)))
    html, html_s = timed(explain_page, view)
    rows.append((label, f"{len(trace.requests)}", f"{explain_s:.2f} s", f"{view_s:.2f} s", f"{html_s:.2f} s",
                 f"{len(view.over_time.request)}", f"{len(html.encode()) / 1e3:.0f} kB"))


def page(args: argparse.Namespace) -> int:
    from alloctune.trace import load_trace
    from alloctune.trace.compact import save_compact
    from alloctune.trace.load import trace_from_snapshot
    from explain_programs import training_loop

    rows: list = []
    for name in ("train_leak", "convnext_leak"):
        _page_row(f"real H200 {name} (stacks)", load_trace(ROOT / "tests" / "data" / "explain_gpu" / f"{name}.pickle.xz"),
                  rows)
    _page_row("real llm_h200.atrace (no stacks)", load_trace(SHIPPED / "llm_h200.atrace"), rows)
    snap, _ = training_loop(steps=args.requests // 21 + 1, keep_logits=True, logits=8192)
    trace = trace_from_snapshot(snap, source="explain_page_speed")
    del snap
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big.atrace"
        save_compact(trace, path)
        del trace
        _page_row("synthetic training loop (stacks)", load_trace(path), rows)
    table = md_table(("recording", "requests", "explain (no what-ifs)", "page views", "HTML", "points", "page size"), rows)
    print(table)
    append_section(RESULTS / "explain_page.md", "What the explain page adds to explain (time, size)",
                   f"`PYTHONPATH=src {command()}`", table)
    return 0


def stacks(args: argparse.Namespace) -> int:
    os.environ["ALLOCTUNE_CACHE"] = "0"
    from alloctune.explain import explain
    from alloctune.trace import load_trace
    from explain_programs import SITE, training_loop

    snap, _ = training_loop(steps=args.steps, keep_logits=True, logits=8192)
    filler = [{"filename": SITE + "torch/nn/modules/module.py", "line": 1750 + i, "name": "_call_impl"}
              for i in range(DEPTH)]
    bare = dict(snap, device_traces=[[{k: v for k, v in e.items() if k != "frames"} for e in snap["device_traces"][0]]])
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc" and e["frames"]:
            e["frames"] = [dict(f) for f in (e["frames"] + filler)[:DEPTH]]  # one dict per frame per event
    rows = []
    with tempfile.TemporaryDirectory() as d:
        p_st, p_bare, p_sh = Path(d) / "stacks.pickle", Path(d) / "bare.pickle", Path(d) / "shared.pickle"
        p_st.write_bytes(pickle.dumps(snap, protocol=4))
        p_bare.write_bytes(pickle.dumps(bare, protocol=4))
        one: dict = {}  # then one dict per frame line, shared by the events, as torch's snapshots hold them
        for e in snap["device_traces"][0]:
            if e.get("frames"):
                e["frames"] = [one.setdefault((f["filename"], f["line"], f["name"]), f) for f in e["frames"]]
        p_sh.write_bytes(pickle.dumps(snap, protocol=4))
        del snap, bare
        for label, p in (("without frames", p_bare), ("with 30-frame stacks", p_st),
                         ("with 30-frame stacks, frame dicts shared (torch)", p_sh)):
            tr, load_s = timed(load_trace, p)
            ex, ex_s = timed(explain, tr, what_if=False)
            rows.append((label, f"{p.stat().st_size / 1e6:.0f} MB", f"{len(tr.requests)}", f"{load_s:.1f} s",
                         f"{ex_s:.1f} s", f"{load_s + ex_s:.1f} s", f"{len(ex.sites)} sites"))
            del tr, ex
    table = md_table(("snapshot", "file", "requests", "load", "explain", "total", "sites"), rows)
    print(table)
    append_section(RESULTS / "explain_stacks_load.md", "explain on a snapshot with Python stacks: load and explain time",
                   f"`PYTHONPATH=src {command()}` (2-core machine, shared)", table)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="part", required=True)
    sub.add_parser("conservation").set_defaults(fn=conservation)
    sub.add_parser("page").set_defaults(fn=page)
    sub.choices["page"].add_argument("--requests", type=int, default=1_000_000)
    sub.add_parser("stacks").set_defaults(fn=stacks)
    sub.choices["stacks"].add_argument("--steps", type=int, default=9000)
    args = ap.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
