"""The loader on allocator histories recorded on the GPU whose truth is known (skipped without a device).

Six small programs, each in a fresh process (the allocator reads its setting once), record their memory
history and write down what they really did: their `empty_cache()` calls, the requested sizes that failed,
and `torch.cuda.memory_stats()`. The loader's inferences (empty_cache calls, FAILED_ALLOC sizes, frees that
complete late on a side stream, the streams) are checked against that truth, as trace/stream.py documents
them. Run as a script, this file is the recording program: `python tests/test_trace_gpu.py SCENARIO OUTDIR`.
"""

from __future__ import annotations

import json
import lzma
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
MiB = 1024 * 1024

# scenario -> allocator string (set before torch initialises CUDA)
SCENARIOS = {
    "ec_levels": "",  # empty_cache() then a new segment the run already held -> must count as empty_cache
    "ec_bigger": "",  # empty_cache() then a segment above the peak -> the documented ambiguous case
    "record_stream": "",  # side stream + record_stream: free_completed lags free_requested
    "cap_oom": "",  # memory cap, failing requests of odd sizes, retries, empty_cache between
    "gc_cap": "garbage_collection_threshold:0.6,max_split_size_mb:64",  # GC + oversize release under a cap
    "expandable": "expandable_segments:True",  # segment_unmap bursts
}


def record(name: str, out: Path) -> None:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = SCENARIOS[name]
    import torch

    torch.cuda.memory._record_memory_history(max_entries=1_000_000, context=None, stacks="python")
    truth: dict = {"scenario": name, "conf": SCENARIOS[name], "empty_cache_calls": 0, "failed_requests": []}

    def empty_cache() -> None:
        truth["empty_cache_calls"] += 1
        torch.cuda.empty_cache()

    def empty_cache_then_free() -> None:
        """empty_cache() whose next step is a free: unambiguous by the next-event rule alone."""
        anchor = torch.empty(4096, dtype=torch.uint8, device="cuda")
        empty_cache()
        del anchor

    def try_alloc(nbytes: int):
        try:
            return torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            truth["failed_requests"].append(nbytes)
            return None

    dev = torch.device("cuda")
    if name == "ec_levels":
        a, b, c = (torch.empty(100 * MiB, dtype=torch.uint8, device=dev) for _ in range(3))
        del c
        empty_cache()  # releases c's segment; the program's next step is a free
        del a, b
        empty_cache()  # releases two segments; next: a 100 MiB segment (200 + 100 <= 300 held before)
        d = torch.empty(100 * MiB, dtype=torch.uint8, device=dev)
        del d
    elif name == "ec_bigger":
        a = torch.empty(100 * MiB, dtype=torch.uint8, device=dev)
        del a
        empty_cache()  # next: a 500 MiB segment above the peak: indistinguishable from a retry
        b = torch.empty(500 * MiB, dtype=torch.uint8, device=dev)
        del b
    elif name == "record_stream":
        side = torch.cuda.Stream()
        xs = []
        for i in range(20):
            x = torch.ones(3 * MiB + 1000 * i, dtype=torch.uint8, device=dev)
            with torch.cuda.stream(side):
                torch.cuda._sleep(5_000_000)  # keep the side stream busy so x's event is still pending
                y = torch.empty(2 * MiB + 512 * i, dtype=torch.uint8, device=dev)  # allocated on the side stream
                y.copy_(x[: y.numel()])
                x.record_stream(side)
            del x  # free_requested now, free_completed once the side stream passes the event
            xs.append(y)
            if i % 5 == 4:
                torch.cuda.synchronize()
                del xs[:]
                empty_cache_then_free()
    elif name in ("cap_oom", "gc_cap"):
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction((1024 if name == "cap_oom" else 768) * MiB / total)
        keep = []
        sizes = [97 * MiB + 123, 5 * MiB + 7, 300 * MiB + 1, 33 * MiB + 511, 150 * MiB + 99, 700 * MiB + 5]
        for rnd in range(4):
            for s in sizes:
                t = try_alloc(s + rnd * 4096)
                if t is not None:
                    keep.append(t)
                if len(keep) > 4:
                    del keep[0:2]
            del keep[:]
            if rnd % 2 == 1:
                empty_cache_then_free()
    elif name == "expandable":
        for rnd in range(5):
            ts = [torch.empty((rnd + 1) * 7 * MiB + k * 1000, dtype=torch.uint8, device=dev) for k in range(6)]
            small = [torch.empty(1000 + k, dtype=torch.uint8, device=dev) for k in range(10)]
            del ts, small
            empty_cache_then_free()
    else:
        raise SystemExit(f"unknown scenario {name}")

    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    truth["stats"] = {k: v for k, v in stats.items() if k.startswith("num_") or k.startswith("reserved_bytes.all")}
    truth["total_memory"] = torch.cuda.get_device_properties(0).total_memory
    truth["torch"] = torch.__version__
    snap = torch.cuda.memory._snapshot()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.pickle.xz").write_bytes(lzma.compress(pickle.dumps(snap)))
    (out / f"{name}.json").write_text(json.dumps(truth, indent=1))



def round_size(n: int) -> int:
    """PyTorch's default round_size (no roundup_power2_divisions): 512 B steps."""
    return 512 if n < 512 else -(-n // 512) * 512


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_loader_infers_what_the_program_did(tmp_path, name):
    from alloctune.trace import EMPTY_CACHE, FAILED_ALLOC, load_trace

    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    proc = subprocess.run([sys.executable, __file__, name, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    t = load_trace(tmp_path / f"{name}.pickle.xz")
    truth = json.loads((tmp_path / f"{name}.json").read_text())
    stats = truth["stats"]
    failed = [s for o, s in zip(t.requests.ops, t.requests.sizes) if o == FAILED_ALLOC]
    assert failed == [round_size(s) for s in truth["failed_requests"]]
    assert len(failed) == stats["num_ooms"]
    inferred, calls = t.requests.count(EMPTY_CACHE), truth["empty_cache_calls"]
    if name == "ec_bigger":
        assert inferred == calls - 1  # documented: a release before a segment above the peak reads as the retry's
    elif name == "gc_cap":
        assert inferred == 0  # documented: with GC on and the cap unknown, a release before an allocation is GC's
    else:
        assert inferred == calls
    if name == "record_stream":
        lagging = sum(1 for i, e in enumerate(t.events[:-1])
                      if e["action"] == "free_requested" and t.events[i + 1]["action"] != "free_completed")
        assert lagging > 0 and len(t.streams) == 2


if __name__ == "__main__":
    record(sys.argv[1], Path(sys.argv[2]))
