"""explain on every recording we have: categories must sum exactly to reserved memory at the moment.

Runs `explain` (no what-ifs) on every shipped compact trace (src/alloctune/data/traces) and every
real H200 recording under ../shared/traces, prints one row per file (moment, reserved, the largest
categories, repetitions, seconds) and whether the categories conserve, then appends the table and
the command to bench/results/explain_conservation.md.

    PYTHONPATH=src python bench/explain_conservation.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from runlog import append_section

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def main() -> int:
    from alloctune.explain import explain
    from alloctune.units import format_size

    files = sorted((REPO / "src" / "alloctune" / "data" / "traces").glob("*.atrace"))
    shared = REPO.parent / "shared" / "traces"
    files += sorted(shared.glob("*/*.pickle.xz"))
    rows = []
    bad = 0
    for f in files:
        t = time.perf_counter()
        ex = explain(f, what_if=False)
        secs = time.perf_counter() - t
        cats = {c.name: c.bytes for c in ex.categories}
        ok = sum(cats.values()) == ex.moment["reserved"] and cats["rounding"] == ex.moment["allocated"] - ex.moment["requested"]
        bad += not ok
        big = sorted(cats.items(), key=lambda kv: -kv[1])[:3]
        name = f.name if f.suffix == ".atrace" else f"{f.parent.name}/{f.name}"
        rows.append((name, ex.moment["reason"], format_size(ex.moment["reserved"]),
                     ", ".join(f"{k} {format_size(v)}" for k, v in big), str(ex.repeats["count"]),
                     "yes" if ok else "NO", ex.map_source.split(" (")[0], f"{secs:.1f}"))
        print(" | ".join(rows[-1]), flush=True)
    head = ("recording", "moment", "reserved", "largest categories", "reps", "conserves", "map", "s (with load)")
    table = "| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n" + "\n".join("| " + " | ".join(r) + " |" for r in rows)
    append_section(HERE / "results" / "explain_conservation.md",
                   "explain: categories sum to reserved memory on every recording",
                   f"`PYTHONPATH=src python bench/explain_conservation.py` ({len(rows)} recordings, {bad} not conserving)",
                   table)
    print(f"{len(rows)} recordings, {bad} not conserving")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
