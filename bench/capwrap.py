"""Run a Python workload in this process under a memory cap, optionally recording its history.

The recipe of `../shared/traces` (README there), for any workload: set the per-process memory
fraction first, start `_record_memory_history`, run the program (a module with `-m` or a
script), catch the OOM, dump the snapshot and a sidecar `PREFIX.json` with the outcome and the
final `memory_stats()`. Used by `bench/gpu_recordings.py` for recordings and bisections.

    python bench/capwrap.py --out /tmp/x/hubert_default --record -- bench/real_workloads.py hubert
    python bench/capwrap.py --out /tmp/x/rvc_cap --cap 3500000000 -- -m alloctune.workloads.rvc --count 3
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import pickle
import runpy
import sys
import time

STATS = ("reserved_bytes.all.peak", "reserved_bytes.all.current", "allocated_bytes.all.peak",
         "requested_bytes.all.peak", "active_bytes.all.peak", "inactive_split_bytes.all.peak",
         "segment.all.peak", "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="path prefix for PREFIX.json (+ PREFIX.pickle.xz with --record)")
    ap.add_argument("--cap", type=int, default=0, help="per-process cap in bytes (0 = none)")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--stacks", default="python", choices=("python", "all", "none"))
    ap.add_argument("--size", default=None, help="input size, stored in the sidecar")
    ap.add_argument("target", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    target = a.target[1:] if a.target and a.target[0] == "--" else a.target
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    if a.cap:
        torch.cuda.set_per_process_memory_fraction(a.cap / total)
    if a.record:
        if a.stacks == "none":  # sizes and addresses only: the smallest file (capacity planning needs no frames)
            torch.cuda.memory._record_memory_history(max_entries=5_000_000, context=None, stacks="python")
        else:
            torch.cuda.memory._record_memory_history(max_entries=5_000_000,
                                                     context="alloc" if a.stacks == "python" else "all",
                                                     stacks=a.stacks)
    outcome, msg = "ok", None
    t0 = time.perf_counter()
    sys.argv = target[1:] if target[0] == "-m" else target
    try:
        if target[0] == "-m":
            sys.argv = [target[1]] + target[2:]
            runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target[0], run_name="__main__")
    except torch.OutOfMemoryError as exc:
        outcome, msg = "oom", str(exc)
    except SystemExit as exc:
        if exc.code not in (0, None):
            outcome = "oom" if torch.cuda.memory_stats().get("num_ooms", 0) else f"exit-{exc.code}"
    wall = time.perf_counter() - t0
    stats = {k: v for k, v in torch.cuda.memory_stats().items() if k in STATS}
    if a.record:
        snap = torch.cuda.memory._snapshot()
        with lzma.open(a.out + ".pickle.xz", "wb", preset=6) as f:
            pickle.dump(snap, f)
    side = {"workload": " ".join(target), "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "cap": a.cap,
            "total_memory": total, "torch": torch.__version__, "outcome": outcome, "oom_message": msg,
            "wall_s": round(wall, 3), "stats": stats, "size": a.size}
    with open(a.out + ".json", "w") as f:
        json.dump(side, f)
    print(f"capwrap: {outcome} peak_reserved={stats.get('reserved_bytes.all.peak')} wall={wall:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
