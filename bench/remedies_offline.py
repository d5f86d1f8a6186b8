"""#29 on the CPU: every program-level remedy simulated on the shared H200 recordings, beside the truth.

For each recording (RVC without `empty_cache()`, under three settings; the Llama `generate` run): the
recording's own simulated min budget, then each remedy's (release points every 1 / 2 / 4 repetitions,
the Janitor's two policies, the workspace caps that apply) with its saving, peak reserved, utilization,
clean-ups and driver-call bound. The truth column: the real peak reserved of the same RVC program that
called `empty_cache()` after every chunk (`rvc_ec1`, torch's own memory_stats), for the remedy that does
exactly that. Seconds: the CPU time of all the remedies of one recording.

    python bench/remedies_offline.py [--traces /work/shared/traces] [--out bench/results]

Writes `remedies_offline.md` in --out and appends one line per recording to the results log.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "bench")]
MiB = 1 << 20
CASES = (("rvc_ec0", "default"), ("rvc_ec0", "expandable"), ("rvc_ec0", "roundup4"), ("llm", "default"))


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{round(n / MiB):d}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=Path("/work/shared/traces"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    from runlog import log_result

    from alloctune.analysis.core import analyse
    from alloctune.remedy.model import activity, min_budget, recorded_conf
    from alloctune.remedy.registry import best_release, simulated_remedies
    from alloctune.trace import load_trace

    lines = ["# #29 on the CPU: program-level remedies simulated on the shared H200 recordings", "",
             "`python bench/remedies_offline.py` (MiB; util = peak allocated / peak reserved, uncapped replay)", ""]
    for folder, name in CASES:
        path = args.traces / folder / f"{name}.pickle.xz"
        if not path.exists():
            continue
        trace = load_trace(path)
        t0 = time.perf_counter()
        an = analyse(trace)
        conf = recorded_conf(trace)
        base = min_budget(trace, conf, trace)
        rems = simulated_remedies(an, base, conf)
        secs = time.perf_counter() - t0
        peak, alloc, _, _ = activity(trace, conf, trace)
        truth = None
        real = args.traces / "rvc_ec1" / f"{name}.json"
        if folder == "rvc_ec0" and real.exists():
            truth = json.loads(real.read_text())["stats"]["reserved_bytes.all.peak"]
        lines += [f"## {folder}/{name} ({an.repeats.count} repetitions, setting `{conf or 'default'}`; "
                  f"{secs:.1f} s)", "",
                  "| remedy | min budget | saving | peak reserved | util | clean-ups | driver calls (ms) | method | "
                  "real peak of the program doing it |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
                  f"| as recorded | {_mib(base)} | - | {_mib(peak)} | {alloc / peak:.3f} | 0 | - | simulated | - |"]
        for r in rems:
            util = "-" if r.utilization is None else f"{r.utilization:.3f}"
            real_col = (f"{_mib(truth)} ({(r.peak_reserved - truth) / truth:+.2%})"
                        if truth is not None and r.name == "empty_cache_each_repetition" else "-")
            bound = f" (bound {_mib(r.bound)})" if r.bound is not None else ""
            lines.append(f"| {r.name} | {_mib(r.min_budget)}{bound} | {_mib(r.saving)} | {_mib(r.peak_reserved)} | "
                         f"{util} | {r.cleanups if r.cleanups is not None else '-'} | {r.extra_driver_calls} "
                         f"({r.extra_seconds * 1e3:.0f}) | {r.method} | {real_col} |")
        best = best_release(rems)
        lines += ["", f"best release policy: {best.name if best else 'none saves memory'}", ""]
        every = next((r for r in rems if r.name == "empty_cache_each_repetition"), None)
        msg = f"{folder}/{name}: best release {best.name if best else 'none'}"
        if best is not None:
            msg += f" saves {_mib(best.saving)} MiB of {_mib(base)}"
        if truth is not None and every is not None:
            msg += f"; empty_cache each repetition: peak {_mib(every.peak_reserved)} vs real {_mib(truth)} MiB"
        log_result(msg + f" ({secs:.1f} s)", folder=args.out)
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "remedies_offline.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
