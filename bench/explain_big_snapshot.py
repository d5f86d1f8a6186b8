"""explain on a ~240 MB snapshot with Python stacks, against a plain `pickle.load` of the same file (#27: < 30 s).

The file is the real H200 recording `tests/data/explain_gpu/llama_generate` (transformers Llama
`generate`, Python stacks on every allocation) repeated 4 times one after the other, each copy in its
own address range and time span, every frame list its own objects as torch writes them (so the pickle
is as large as a real one of that many events). Both are timed in fresh processes, the cache off.

    python bench/explain_big_snapshot.py [--copies 4] [--out /tmp/big_stacks.pickle]
"""

from __future__ import annotations

import argparse
import lzma
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "data" / "explain_gpu" / "llama_generate.pickle.xz"


def build(out: Path, copies: int) -> int:
    with lzma.open(SOURCE) as fh:
        snap = pickle.load(fh)  # the project's own fixture, not an untrusted file
    events = snap["device_traces"][0]
    span = max(e["time_us"] for e in events) - min(e["time_us"] for e in events) + 1
    out_events = []
    for c in range(copies):
        for e in events:
            d = dict(e, time_us=e["time_us"] + c * span, frames=[dict(f) for f in e.get("frames", [])])
            if d.get("addr"):
                d["addr"] = e["addr"] + c * (1 << 36)
            out_events.append(d)
    data = pickle.dumps({"segments": [], "device_traces": [out_events],
                         "allocator_settings": snap.get("allocator_settings", {})}, protocol=4)
    out.write_bytes(data)
    return len(out_events)


def timed(cmd: list[str]) -> float:
    env = {**os.environ, "ALLOCTUNE_CACHE": "0", "PYTHONPATH": str(ROOT / "src")}
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("/tmp/big_stacks.pickle"))
    a = ap.parse_args(argv)
    n = build(a.out, a.copies)
    mb = a.out.stat().st_size / 1e6
    plain = timed([sys.executable, "-c", f"import pickle; pickle.load(open({str(a.out)!r}, 'rb'))"])
    explain = timed([sys.executable, "-m", "alloctune", "explain", str(a.out), "--no-what-if", "--json"])
    print("| file | events | plain pickle.load | explain (load + analysis) | ratio |\n|---|---|---|---|---|")
    print(f"| {mb:.0f} MB, Python stacks | {n} | {plain:.1f} s | {explain:.1f} s | {explain / plain:.2f} |")
    sys.path.insert(0, str(ROOT / "bench"))
    from runlog import log_result

    log_result(f"explain of a {mb:.0f} MB snapshot with Python stacks ({n} events): {explain:.1f} s including the "
               f"safe load, {explain / plain:.2f}x a plain pickle.load ({plain:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
