"""GPU evidence for #18.6: record programs whose `empty_cache()` calls are known, through the agent
(which marks each call), and score the inference against the marks.

Recordings (each a fresh process via `runner.run_trial(record=...)`, so the agent marks the calls):
* `rvc_ec1` -- `alloctune.workloads.rvc --count 6` (an `empty_cache()` after every chunk; some
  release nothing), uncapped;
* `probe` -- a small script with calls that release nothing, calls followed by a *larger* segment
  than any held before (uncapped: the program's, the old rule booked it as the allocator's), and
  calls under a cap;
then `bench/empty_cache_inference.py` over them. Needs torch + CUDA.

    python bench/gpu_empty_cache.py --out "$OUT/empty_cache"   # then tar it (see HANDOFF-truth.md)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from alloctune.run.runner import run_trial  # noqa: E402

PROBE = textwrap.dedent("""
    import torch
    MiB = 1 << 20
    keep = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.empty_cache()                      # releases nothing: no event without the mark
    a = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda"); del a
    torch.cuda.empty_cache()                      # releases the 30 MiB segment's cache
    b = torch.empty(500 * MiB, dtype=torch.uint8, device="cuda")  # larger than anything held before
    del b
    for n in (40, 80, 160, 320):
        x = torch.empty(n * MiB, dtype=torch.uint8, device="cuda"); del x
        torch.cuda.empty_cache()
        y = torch.empty(2 * n * MiB, dtype=torch.uint8, device="cuda"); del y   # new, larger segment next
    torch.cuda.empty_cache(); torch.cuda.empty_cache()   # the second releases nothing
""")


def record(out: Path, name: str, cmd: list[str], budget: int | None = None) -> dict:
    path = out / f"{name}.pickle.xz"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    res = run_trial(cmd, record=path, budget=budget, capture=out / f"{name}.log", cwd=str(ROOT), env=env)
    side = {"workload": name, "conf": "", "cap": int(budget or 0), "total_memory": res.total_memory,
            "outcome": res.outcome, "stats": dict(res.stats)}
    (out / f"{name}.json").write_text(json.dumps(side, indent=1))
    return {"name": name, "outcome": res.outcome, "snapshot": res.snapshot}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    probe = out / "probe.py"
    probe.write_text(PROBE)
    py = sys.executable
    runs = [
        record(out, "rvc_ec1", [py, "-m", "alloctune.workloads.rvc", "--count", "6"]),
        record(out, "probe", [py, str(probe)]),
        record(out, "probe_cap", [py, str(probe)], budget=1 << 30),
    ]
    print(json.dumps(runs, indent=1))
    from empty_cache_inference import main as score  # noqa: E402  (bench/ is on sys.path as the script's folder)

    return score([str(out), "--out", str(out / "empty_cache.md")])


if __name__ == "__main__":
    sys.exit(main())
