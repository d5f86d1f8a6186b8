"""The cost of Python stacks: loading a ~200 MB snapshot whose allocations carry 30-frame stacks,
against the same snapshot without frames, and explain on it (goal: < 30 s including the load).

The snapshot is the synthetic training loop of tests/explain_programs.py with every `alloc`
event given its own copy of a 30-frame stack (as torch writes them: one dict per frame per
event), written as a plain pickle. The cache is off so every load reads the file.

    PYTHONPATH=src python bench/explain_stacks_load.py [--steps 9000]
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

from runlog import append_section

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
DEPTH = 30


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=9000)
    args = ap.parse_args()
    os.environ["ALLOCTUNE_CACHE"] = "0"
    from explain_programs import SITE, training_loop

    from alloctune.explain import explain
    from alloctune.trace import load_trace

    snap, _ = training_loop(steps=args.steps, keep_logits=True, logits=8192)
    filler = [{"filename": SITE + "torch/nn/modules/module.py", "line": 1750 + i, "name": "_call_impl"}
              for i in range(DEPTH)]
    bare = {k: v for k, v in snap.items()}
    bare["device_traces"] = [[{k: v for k, v in e.items() if k != "frames"} for e in snap["device_traces"][0]]]
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc" and e["frames"]:
            deep = (e["frames"] + filler)[:DEPTH]
            e["frames"] = [dict(f) for f in deep]  # one dict per frame per event, as torch writes them
    rows = []
    with tempfile.TemporaryDirectory() as d:
        p_st, p_bare = Path(d) / "stacks.pickle", Path(d) / "bare.pickle"
        p_st.write_bytes(pickle.dumps(snap, protocol=4))
        p_bare.write_bytes(pickle.dumps(bare, protocol=4))
        del snap, bare
        for label, p in (("without frames", p_bare), ("with 30-frame stacks", p_st)):
            t = time.perf_counter()
            tr = load_trace(p)
            load_s = time.perf_counter() - t
            t = time.perf_counter()
            ex = explain(tr, what_if=False)
            ex_s = time.perf_counter() - t
            rows.append((label, f"{p.stat().st_size / 1e6:.0f} MB", f"{len(tr.requests)}", f"{load_s:.1f} s",
                         f"{ex_s:.1f} s", f"{load_s + ex_s:.1f} s", f"{len(ex.sites)} sites"))
            del tr, ex
    head = ("snapshot", "file", "requests", "load", "explain", "total", "sites")
    table = "| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n" + "\n".join(
        "| " + " | ".join(r) + " |" for r in rows)
    print(table)
    append_section(HERE / "results" / "explain_stacks_load.md",
                   "explain on a snapshot with Python stacks: load and explain time",
                   f"`PYTHONPATH=src python bench/explain_stacks_load.py --steps {args.steps}` (2-core machine, shared)",
                   table)


if __name__ == "__main__":
    main()
