"""A small GPU workload whose allocations change size, so the caching allocator fragments.

It mimics a service handling requests of random size: per item two temporaries sized by
the input (activations and a half-size workspace) and an output that lives on in a bounded
queue of recent results. The outputs land in the split remainders of big cached blocks and
pin them, so with the default setting the reserved memory grows well above what is live;
`expandable_segments` (pins only pages) and `max_split_size_mb` (big blocks stay whole)
undo that.

The plan of allocations is pure Python (`plan()`), so the same request stream can be fed to
the simulator on a CPU (the `tune` job of `bench/gpu.py` does so before the GPU runs). On the GPU each
allocation is a `torch.empty(n, dtype=uint8)` that is written (`fill_`, then `--passes`
in-place adds), so the program really uses the memory and the time per item is dominated
by work that is the same under every setting (a stable throughput to compare settings).

    python bench/frag_workload.py [--items N] [--seed S] [--stats-out FILE] [--device cuda]

Prints `throughput: <items/s> items/s` and, with --stats-out, writes the final
`torch.cuda.memory_stats()` subset read in the workload itself (to compare with the agent).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import deque

MiB = 1 << 20


def plan(items: int = 40, seed: int = 0, queue: int = 6) -> list[tuple[str, int, int]]:
    """The allocation plan: ("alloc", id, bytes) / ("free", id, 0), in program order."""
    rng = random.Random(seed)
    ops: list[tuple[str, int, int]] = []
    next_id = 0

    def alloc(size: int) -> int:
        nonlocal next_id
        next_id += 1
        ops.append(("alloc", next_id, size))
        return next_id

    outputs: deque[int] = deque()
    for _ in range(items):
        mb = int(2 ** rng.uniform(6, 9.5))  # 64 MiB .. ~724 MiB, log-uniform
        act = alloc(mb * MiB + 512 * rng.randrange(1, 64))
        work = alloc(mb * MiB // 2)
        ops.append(("free", act, 0))
        out = alloc(int(mb * MiB * rng.uniform(0.08, 0.25)) // 512 * 512)
        ops.append(("free", work, 0))
        outputs.append(out)
        if len(outputs) > queue:
            ops.append(("free", outputs.popleft(), 0))
    for out in outputs:
        ops.append(("free", out, 0))
    return ops


STAT_KEYS = (
    "reserved_bytes.all.peak",
    "allocated_bytes.all.peak",
    "active_bytes.all.peak",
    "requested_bytes.all.peak",
    "inactive_split_bytes.all.peak",
    "segment.all.peak",
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--queue", type=int, default=6)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--passes", type=int, default=64, help="in-place passes over each new tensor (the compute)")
    ap.add_argument("--stats-out", default=None)
    args = ap.parse_args(argv)

    import torch

    ops = plan(args.items, args.seed, args.queue)
    live: dict[int, torch.Tensor] = {}
    dev = torch.device(args.device)
    warm = torch.ones(256, dtype=torch.uint8, device=dev)  # load the kernels before timing
    warm.add_(1)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for op, ident, size in ops:
        if op == "alloc":
            t = torch.empty(size, dtype=torch.uint8, device=dev)
            t.fill_(1)
            for _ in range(args.passes):  # work proportional to the bytes: the same under every setting
                t.add_(1)
            live[ident] = t
        else:
            del live[ident]
    if dev.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    print(f"items: {args.items}  ops: {len(ops)}  time: {elapsed:.3f} s")
    print(f"throughput: {args.items / elapsed:.2f} items/s")
    if args.stats_out and dev.type == "cuda":
        stats = torch.cuda.memory_stats()
        with open(args.stats_out, "w") as fh:
            json.dump({k: int(stats[k]) for k in STAT_KEYS if k in stats}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
