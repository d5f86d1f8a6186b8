"""A multi-process workload for `torchrun`: every rank runs the fragmenting plan, rank 0 holds more.

Uneven memory across ranks is the point (rank 0 often holds more: logging, gathered outputs;
here a buffer of `--rank0-extra-mib` and its own random plan), so per-rank reports have
something to show. Every rank's plan has the same number of steps (same `--items`), so the
collectives match. Ranks sync through a process group after each
item: `gloo` on CPU tensors lets two ranks share one GPU (NCCL refuses two ranks on one
device); `nccl` all-reduces a CUDA tensor (one GPU per rank, `--backend nccl`).

    torchrun --nproc-per-node 2 bench/scale_ranks_workload.py [--items N] [--backend gloo|nccl]

Prints `throughput: <steps/s> steps/s` on rank 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import frag_workload  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=24)
    ap.add_argument("--rank0-extra-mib", type=int, default=768, help="a buffer only rank 0 holds (uneven memory)")
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: check the rank logic without a GPU")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = args.device == "cuda"
    device = local % max(1, torch.cuda.device_count()) if cuda else 0
    where = f"cuda:{device}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend)
    plan = frag_workload.plan(args.items, seed=rank)
    extra = torch.empty(args.rank0_extra_mib << 20, dtype=torch.uint8, device=where) if rank == 0 else None
    live: dict[int, torch.Tensor] = {}
    token = torch.ones(1, device=where if args.backend == "nccl" else "cpu")
    t0 = time.monotonic()
    done = 0
    for i, (op, ident, size) in enumerate(plan):
        if op == "alloc":
            live[ident] = torch.empty(size, dtype=torch.uint8, device=where).fill_(1)
        else:
            del live[ident]
        if i % 5 == 4:  # about one item: sync the ranks as a training step would (same count on every rank)
            dist.all_reduce(token)
            done += 1
    if cuda:
        torch.cuda.synchronize(device)
    dist.barrier()
    del extra
    if rank == 0:
        print(f"throughput: {done / (time.monotonic() - t0):.3f} steps/s", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
