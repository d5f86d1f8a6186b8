"""Utilization with the best setting plus remedies on the four reference workloads (#29.6).

For each of the project's H200 reference recordings (rvc, llm, diffusion, train; the default's
uncapped recording, `src/alloctune/data/traces/`), `alloctune explain`'s utilization table: the
recording as it ran, each release policy, `expandable_segments:True`, and the release policies under
it. Prints the best row, whether it reaches 0.97, and what holds it back where it does not (explain's
split of the idle bytes at that row's peak). The expandable rows are replays of the default's stream;
the shared recordings (`../shared/traces/<w>/expandable.json`) hold what the real expandable runs
measured, and tests/test_explain_remedies.py holds the rows to them.

    python bench/utilization_reference.py [--workloads rvc,llm,diffusion,train]

Pure CPU. Appends the table to bench/results/utilization_reference.md and one line per workload to
bench/results/LOG.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from alloctune.explain.api import explain  # noqa: E402
from runlog import append_section, command, log_result  # noqa: E402

TRACES = ROOT / "src" / "alloctune" / "data" / "traces"


def row(workload: str) -> dict:
    t0 = time.perf_counter()
    table = explain(TRACES / f"{workload}_h200.atrace", top=1).utilization
    rec = next(r for r in table.rows if r.kind == "recording")
    best = table.best
    return {"workload": workload, "recorded": rec.utilization, "best": best.name, "kind": best.kind,
            "util": best.utilization, "min_budget": best.min_budget, "reachable": table.reachable,
            "held_back": table.held_back, "rows": len(table.rows), "seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="rvc,llm,diffusion,train")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "utilization_reference.md"))
    a = ap.parse_args(argv)
    rows = [row(w) for w in a.workloads.split(",") if w]
    lines = ["| workload | as it ran | best row | its utilization | its min budget MiB | 0.97 reached | "
             "what holds it back |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        why = "-" if r["reachable"] else r["held_back"].split("; ", 1)[-1] if "; " in (r["held_back"] or "") \
            else r["held_back"]
        lines.append(f"| {r['workload']} | {r['recorded']:.3f} | {r['kind']} {r['best']} | {r['util']:.3f} | "
                     f"{r['min_budget'] / 2**20:.0f} | {'yes' if r['reachable'] else 'no'} | {why} |")
    body = "\n".join(lines)
    print(body)
    cmd = command([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    append_section(a.out, "utilization with the best setting plus remedies, reference workloads", f"`{cmd}`", body)
    for r in rows:
        log_result(f"{r['workload']}: as it ran {r['recorded']:.3f}, best {r['kind']} {r['best']} {r['util']:.3f} "
                   f"({'reaches' if r['reachable'] else 'below'} 0.97; {r['rows']} rows, {r['seconds']:.1f} s)",
                   bench="utilization_reference")


if __name__ == "__main__":
    main()
