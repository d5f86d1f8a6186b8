"""Fresh allocator histories for the simulator's fidelity check, recorded on the GPU (job `simulate`).

    python3 bench/gpu_trace.py synth --out DIR/synth [--steps 20000] [--seed 1]

A seeded random workload (tensor sizes drawn from a fixed palette of "shapes", so that blocks are reused and
equal-size ties are frequent, plus odd sizes; ~10 % of the tensors on a side stream; an occasional
`empty_cache()`, marked; OOMs caught and skipped) runs once per allocator setting (SYNTH), each in a fresh
process, with memory history on; capped runs use a cap below the default run's peak reserved, like the shared
traces. Writes NAME.pickle.xz and NAME.json (conf, cap, total_memory, torch, outcome, stats) per run in the
layout of ../shared/traces, so that `bench/fidelity.py --traces DIR --workloads synth` checks them. The
loader's own GPU checks (histories whose truth is known) are tests/test_trace_gpu.py.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import pickle
import random
import subprocess
import sys
import time
from pathlib import Path

# synth: name -> (allocator string, cap as a fraction of the default run's peak reserved, or None)
SYNTH = {
    "default": ("", None),
    "max_split_64": ("max_split_size_mb:64", None),
    "expandable": ("expandable_segments:True", None),
    "roundup4": ("roundup_power2_divisions:4", None),
    "default_cap90": ("", 0.90),
    "expandable_cap90": ("expandable_segments:True", 0.90),
    "gc06_split64_cap100": ("garbage_collection_threshold:0.6,max_split_size_mb:64", 1.00),
}
STAT_KEYS = [
    f"{s}.all.{k}"
    for s in ("reserved_bytes", "allocated_bytes", "requested_bytes", "active_bytes", "inactive_split_bytes", "segment")
    for k in ("current", "peak", "allocated", "freed")
] + ["num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free", "num_sync_all_streams"]


def synth_child(args: argparse.Namespace) -> None:
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    if args.cap:
        torch.cuda.set_per_process_memory_fraction(args.cap / total)
    torch.cuda.memory._record_memory_history(max_entries=5_000_000, context=None, stacks="python")
    rng = random.Random(args.seed)
    palette = (
        [rng.randint(1, 1 << 20) for _ in range(12)]
        + [rng.randint(1 << 20, 10 << 20) for _ in range(10)]
        + [rng.randint(10 << 20, 300 << 20) for _ in range(8)]
    )
    side = torch.cuda.Stream()
    marks: list[list[int]] = []  # each empty_cache() call's interval, as alloctune's agent writes them
    live: list = []
    live_bytes = 0
    ooms = 0
    limit = 6 << 30  # keep the live set moderate so runs stay fast
    t0 = time.time()
    for _ in range(args.steps):
        r = rng.random()
        if r < 0.003:
            marks.append([time.time_ns() // 1000])  # the snapshot's time_us clock
            torch.cuda.empty_cache()
            marks[-1].append(time.time_ns() // 1000)
            continue
        if (r < 0.55 and live_bytes < limit) or not live:
            size = rng.choice(palette) if rng.random() < 0.85 else rng.randint(1, 200 << 20)
            stream = side if rng.random() < 0.1 else torch.cuda.current_stream()
            try:
                with torch.cuda.stream(stream):
                    t = torch.empty(size, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError:
                ooms += 1
                continue
            live.append(t)
            live_bytes += size
        else:
            t = live.pop(rng.randrange(len(live)))
            live_bytes -= t.numel()
            del t
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    out = Path(args.out)
    snap = torch.cuda.memory._snapshot()
    snap["alloctune_empty_cache_calls"] = marks  # as the agent marks them: a call releasing nothing leaves no event
    (out / f"{args.name}.pickle.xz").write_bytes(lzma.compress(pickle.dumps(snap), preset=6))
    meta = {
        "workload": "synth",
        "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "cap": args.cap,
        "total_memory": total,
        "torch": torch.__version__,
        "outcome": "ok",
        "ooms_caught": ooms,
        "empty_cache_calls": len(marks),
        "steps": args.steps,
        "seed": args.seed,
        "wall_s": time.time() - t0,
        "stats": {k: stats.get(k, 0) for k in STAT_KEYS},
    }
    (out / f"{args.name}.json").write_text(json.dumps(meta, indent=1))


def synth(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    peak = None
    for name, (conf, frac) in SYNTH.items():
        cap = 0
        if frac is not None:
            if peak is None:
                raise SystemExit("the default run must come first")
            cap = int(peak * frac)
        env = {**{k: v for k, v in os.environ.items() if k != "PYTORCH_ALLOC_CONF"}, "PYTORCH_CUDA_ALLOC_CONF": conf}
        cmd = [sys.executable, __file__, "synth", "--child", "--name", name, "--out", str(out), "--steps", str(args.steps),
               "--seed", str(args.seed), "--cap", str(cap)]
        t0 = time.time()
        subprocess.run(cmd, env=env, check=True)
        meta = json.loads((out / f"{name}.json").read_text())
        if name == "default":
            peak = meta["stats"]["reserved_bytes.all.peak"]
        print(f"recorded {name:22s} conf={conf!r:58s} cap={cap:>12d} peak_reserved="
              f"{meta['stats']['reserved_bytes.all.peak']:>12d} ooms={meta['ooms_caught']:4d} {time.time() - t0:5.1f}s",
              flush=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["synth"]:
        ap = argparse.ArgumentParser(prog="gpu_trace.py synth", description="fresh traces for bench/fidelity.py")
        ap.add_argument("--out", required=True)
        ap.add_argument("--steps", type=int, default=20000)
        ap.add_argument("--seed", type=int, default=1)
        ap.add_argument("--child", action="store_true")
        ap.add_argument("--name", default="default")
        ap.add_argument("--cap", type=int, default=0)
        args = ap.parse_args(argv[1:])
        synth_child(args) if args.child else synth(args)
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
