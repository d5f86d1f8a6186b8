"""Overhead of `oom_retry` on a real step (>= 5 ms) when no OOM happens.

Two measurements:
* step: median wall time of a >= 5 ms step called plainly vs through `@oom_retry` and through
  the `oom_retry.attempts()` loop, calls interleaved in rotating order so drift in clock speed
  or neighbours' load hits all variants alike; also the median of per-round paired ratios;
* no-op: per-call cost of the wrapper itself (median over batches of calls of an empty
  function), which the step medians cannot resolve below their noise.

Target: wrapper cost < 1 % of the step. Prints a table and appends
one line per variant to the results log, bench/results/LOG.md (unless --no-append).

    python bench/guard_overhead.py                 # CPU, or CUDA when available
    python bench/guard_overhead.py --device cuda --rounds 400
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

import suite  # noqa: F401 - puts src/ on the path
from runlog import log_result

# isort: split
from alloctune.guard import oom_retry


def make_step(device: str, target_ms: float):
    """A matmul step taking at least `target_ms` on `device` (synchronised on CUDA).

    Sized by repeating a fixed matmul: time scales linearly with the repeat count, so the
    size can be corrected after a measurement (see `main`).
    """
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    n = 512 if device == "cpu" else 2048
    a = torch.randn(n, n, device=device) / n**0.5
    b = torch.randn(n, n, device=device) / n**0.5

    def build(reps: int):
        def step():
            c = a
            for _ in range(reps):
                c = torch.mm(c, b)
            sync()
            return c

        return step

    reps = 1
    while True:
        step = build(reps)
        for _ in range(3):
            step()
        t = statistics.median(_time(step) for _ in range(9)) * 1e3
        if t >= target_ms or reps >= 1 << 16:
            return step, n, reps, build
        reps = max(reps + 1, int(reps * target_ms / max(t, 1e-3) * 1.2))


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure_steps(step, rounds: int) -> dict[str, float]:
    guarded = oom_retry(step)

    def looped():
        for attempt in oom_retry.attempts():
            with attempt:
                out = step()
        return out

    variants = {"plain": step, "decorator": guarded, "attempts loop": looped}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(5):
        for fn in variants.values():
            fn()
    names = list(variants)
    for i in range(rounds):
        order = names[i % 3:] + names[: i % 3]  # rotate: no variant always runs first
        for name in order:
            times[name].append(_time(variants[name]))
    out = {k: statistics.median(v) for k, v in times.items()}
    # paired: each round's variant vs the same round's plain call (slow drift cancels)
    for k in ("decorator", "attempts loop"):
        out[k + " paired"] = statistics.median(t / p - 1 for t, p in zip(times[k], times["plain"]))
    return out


def measure_noop(batches: int = 30, calls: int = 20000) -> dict[str, float]:
    def noop():
        return None

    guarded = oom_retry(noop)

    def looped():
        for attempt in oom_retry.attempts():
            with attempt:
                noop()

    out = {}
    for name, fn in (("plain", noop), ("decorator", guarded), ("attempts loop", looped)):
        per_call = []
        for _ in range(batches):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            per_call.append((time.perf_counter() - t0) / calls)
        out[name] = statistics.median(per_call)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--target-ms", type=float, default=8.0, help="calibrated step length (>= 5 ms is checked)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 = steadier timings)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--results", type=Path, default=None,
                    help="a results file in the folder to log into (default: bench/results/LOG.md)")
    ap.add_argument("--no-append", action="store_true", help="do not log the results (bench/results/LOG.md, or beside --results)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    step, n, reps, build = make_step(args.device, args.target_ms)
    steps = measure_steps(step, args.rounds)
    for _ in range(3):  # a shared machine can speed up after calibration: keep the step >= 5 ms
        if steps["plain"] * 1e3 >= 5.0:
            break
        reps = int(reps * args.target_ms / (steps["plain"] * 1e3) * 1.2) + 1
        step = build(reps)
        steps = measure_steps(step, args.rounds)
    noop = measure_noop()
    base = steps["plain"]
    rows = []
    for name in ("decorator", "attempts loop"):
        wrapper_s = noop[name] - noop["plain"]
        rows.append({
            "variant": name,
            "step_median_ms": steps[name] * 1e3,
            "step_overhead_pct": 100 * (steps[name] - base) / base,
            "step_paired_pct": 100 * steps[name + " paired"],
            "wrapper_us": wrapper_s * 1e6,
            "wrapper_pct_of_step": 100 * wrapper_s / base,
        })
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    result = {
        "device": args.device, "device_name": device_name, "torch": torch.__version__,
        "step": f"{reps} x mm {n}x{n} fp32", "plain_median_ms": base * 1e3, "rounds": args.rounds,
        "rows": rows, "pass": base * 1e3 >= 5.0 and all(r["wrapper_pct_of_step"] < 1.0 for r in rows),
    }

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"oom_retry overhead on {args.device} ({result['step']}, plain median {base * 1e3:.2f} ms, "
                        f"{args.rounds} rounds)")
    for col in ("variant", "step median ms", "Δ medians", "Δ paired median", "wrapper µs/call", "wrapper % of step"):
        table.add_column(col, justify="right")
    table.add_row("plain", f"{base * 1e3:.3f}", "—", "—", "—", "—")
    for r in rows:
        table.add_row(r["variant"], f"{r['step_median_ms']:.3f}", f"{r['step_overhead_pct']:+.2f} %",
                      f"{r['step_paired_pct']:+.2f} %", f"{r['wrapper_us']:.2f}", f"{r['wrapper_pct_of_step']:.4f} %")
    Console().print(table)
    print(f"target wrapper < 1 % of the step: {'PASS' if result['pass'] else 'FAIL'}")

    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if not args.no_append:
        folder = Path(args.results).parent if args.results is not None else None
        for r in rows:
            log_result(f"{r['variant']} on {device_name} ({result['step']}, plain median {base * 1e3:.3f} ms): wrapper "
                       f"{r['wrapper_us']:.2f} us/call = {r['wrapper_pct_of_step']:.4f} % of the step; target < 1 %: "
                       f"{'met' if result['pass'] else 'NOT met'}", folder=folder)


if __name__ == "__main__":
    main()
