"""Allocator histories recorded on the GPU with known truth, for the loader and the simulator (jobs `trace`, `simulate`).

    python3 bench/gpu_trace.py record SCENARIO OUTDIR   # on the GPU, one fresh process per scenario
    python3 bench/gpu_trace.py check OUTDIR             # anywhere: load each snapshot, compare, print a table
    python3 bench/gpu_trace.py synth --out DIR/synth [--steps 20000] [--seed 1]   # on the GPU

record / check: each scenario writes OUTDIR/SCENARIO.pickle.xz (the `_dump_snapshot` content) and
OUTDIR/SCENARIO.json with what the program really did (`empty_cache_calls`, the requested sizes that
failed) and `torch.cuda.memory_stats()` counters, so `check` can test the loader's inferences
(empty_cache calls, FAILED_ALLOC sizes, free at free_completed, streams) against ground truth.

synth: fresh traces for the simulator's fidelity check (traces it was not tuned on). A seeded random
workload (tensor sizes drawn from a fixed palette of "shapes", so that blocks are reused and equal-size
ties are frequent, plus odd sizes; ~10 % of the tensors on a side stream; an occasional `empty_cache()`,
marked; OOMs caught and skipped) runs once per allocator setting (SYNTH), each in a fresh process, with
memory history on; capped runs use a cap below the default run's peak reserved, like the shared traces.
Writes NAME.pickle.xz and NAME.json (conf, cap, total_memory, torch, outcome, stats) per run in the layout
of ../shared/traces, so that `bench/fidelity.py --traces DIR --workloads synth` checks them.
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

from runlog import log_result

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


def check(out: Path) -> int:
    from alloctune.trace import EMPTY_CACHE, FAILED_ALLOC, load_trace

    rows = []
    bad = 0
    for name in SCENARIOS:
        path = out / f"{name}.pickle.xz"
        if not path.exists():
            rows.append((name, "missing", "", "", "", "", "FAIL"))
            bad += 1
            continue
        t = load_trace(path)
        truth = t.meta
        st = truth["stats"]
        inferred = t.requests.count(EMPTY_CACHE)
        calls = truth["empty_cache_calls"]
        sync_minus_retry = st["num_sync_all_streams"] - st["num_alloc_retries"]
        failed = [s for o, s in zip(t.requests.ops, t.requests.sizes) if o == FAILED_ALLOC]
        want_failed = [round_size(s) for s in truth["failed_requests"]]
        lag = sum(
            1 for i, e in enumerate(t.events[:-1])
            if e["action"] == "free_requested" and t.events[i + 1]["action"] != "free_completed"
        )
        ok = failed == want_failed and len(failed) == st["num_ooms"]
        if name == "ec_bigger":
            ok = ok and inferred == calls - 1  # documented: counted as the allocator's retry
        elif name == "gc_cap":  # documented: GC on, the cap unknown, an allocation after each call
            ok = ok and inferred == 0
        else:
            ok = ok and inferred == calls
        if name == "record_stream":
            ok = ok and lag > 0 and len(t.streams) == 2
        bad += not ok
        rows.append((name, calls, inferred, sync_minus_retry, f"{len(failed)}/{st['num_ooms']}",
                     f"{len(t.streams)} / {lag}", "ok" if ok else "FAIL"))
    head = ("scenario", "empty_cache()", "inferred", "sync-retries", "failed/ooms", "streams / lagging frees", "check")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
    print("'ok': as trace/stream.py documents (ec_bigger: a release before a segment above the peak is the "
          "allocator's; gc_cap: with GC on and the cap unknown, a release before an allocation is GC's)")
    for r in rows:
        log_result(f"{r[0]}: empty_cache() {r[1]}, inferred {r[2]}, failed/ooms {r[4]}, streams/lagging frees {r[5]}: "
                   f"{r[6]}", folder=os.environ.get("OUT") or out)
    return 1 if bad else 0


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
    if len(argv) == 3 and argv[0] == "record":
        record(argv[1], Path(argv[2]))
        return 0
    if len(argv) == 2 and argv[0] == "check":
        return check(Path(argv[1]))
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
