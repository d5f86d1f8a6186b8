"""GPU evidence for alloctune.guard on an RVC-like workload.

(a) chunked: an RVC v2-48k NSF-HiFiGAN decoder on a long clip, under a per-process memory
    budget where the plain call OOMs; `chunked` (whole input first, halve the failing piece)
    completes, and its output is compared with the unchunked call made without the budget.
(b) Janitor: 200 requests of mixed length through the same decoder (fp16, half width),
    under six clean-up policies (`POLICIES`): never, after every request (what RVC does), the
    Janitor with and without request sizes, a looser headroom, and the old fixed trigger.
    Reports peak reserved, peak allocated, their ratio, its ratio to the every-request run's
    peak, cudaMalloc calls and `empty_cache()` calls. Verdicts: "literal" (the issue's target:
    peak reserved <= 1.10 x peak allocated with fewer calls than after every request) and
    "floor" (peak reserved <= 1.10 x the every-request run's, fewer calls). The allocator is
    whatever PYTORCH_CUDA_ALLOC_CONF says (the `guard` job of bench/gpu.py runs it twice).

The decoder is `alloctune.workloads.rvc_models.GeneratorNSF` (weight-normed convs, real layer sizes). Its
sine/noise source is replaced by silence: RVC's source draws random noise and accumulates phase over the
whole clip, so no chunking (RVC's own included) can reproduce it sample for sample; without it the
decoder is a pure conv stack, and exactness of the seams can be tested.

    python bench/guard_gpu.py --out /tmp/out                 # on a CUDA machine
    python bench/guard_gpu.py --dry-run --out /tmp/out       # CPU: tiny model, simulated budget
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import suite  # noqa: F401 - puts src/ on the path
from runlog import command, log_result, md_table

# isort: split
from alloctune.guard import Chunker, Janitor, is_oom, stats, strip_traceback  # after suite, which puts src/ on the path
from alloctune.units import format_size, parse_size


# ---- the decoder -------------------------------------------------------------------------------
class SilentSource(nn.Module):
    """Stands in for RVC's sine/noise source: zeros of the source's shape [B, T*hop, 1]."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, f0: torch.Tensor, upp: int) -> torch.Tensor:
        return torch.zeros(f0.shape[0], f0.shape[1] * upp, 1, device=f0.device, dtype=self.dtype)


def build_decoder(device: str, dtype: torch.dtype, tiny: bool, width: int | None):
    """Returns (fn(x, f0) -> audio [1, 1, T*hop], in_channels, hop, description)."""
    from alloctune.workloads.rvc_models import SYNTH_CONFIGS, TINY_SYNTH, GeneratorNSF

    torch.manual_seed(0)
    cfg = SYNTH_CONFIGS[("v2", "48k")]
    if tiny:
        cfg = dataclasses.replace(cfg, **TINY_SYNTH)
    if width:
        cfg = dataclasses.replace(cfg, upsample_initial_channel=width)
    dec = GeneratorNSF(cfg)
    dec.m_source = SilentSource(dtype)
    dec = dec.to(device=device, dtype=dtype).eval()
    g = torch.randn(1, cfg.gin_channels, 1, device=device, dtype=dtype)
    desc = (f"alloctune.workloads GeneratorNSF v2-48k (rates {cfg.upsample_rates}, "
            f"{cfg.upsample_initial_channel} ch, silent source)")
    return (lambda x, f0: dec(x, f0, g)), cfg.inter_channels, cfg.hop, desc


def receptive_field(fn, c_in: int, hop: int, device: str, dtype: torch.dtype, frames: int = 160) -> int:
    """Frames on either side of an input frame that change the output (measured by perturbation)."""
    x = torch.randn(1, c_in, frames, device=device, dtype=dtype)
    f0 = torch.full((1, frames), 200.0, device=device)
    mid = frames // 2
    with torch.inference_mode():
        y0 = fn(x, f0).float()
        x2 = x.clone()
        x2[..., mid] += 1.0
        y1 = fn(x2, f0).float()
    changed = ((y1 - y0).abs() > 1e-4).nonzero()
    if changed.numel() == 0:
        return 0
    idx = changed[:, -1]
    lo, hi = int(idx.min()) // hop, int(idx.max()) // hop
    return max(mid - lo, hi - mid)


# ---- helpers ---------------------------------------------------------------------------------------
class SimulatedBudget:
    """CPU dry run only: raise torch.OutOfMemoryError above `frames` input frames."""

    def __init__(self, fn, frames: int):
        self.fn, self.frames = fn, frames

    def __call__(self, x, f0):
        if x.shape[-1] > self.frames:
            raise torch.OutOfMemoryError(f"CUDA out of memory (simulated budget of {self.frames} frames)")
        return self.fn(x, f0)


def cuda_mem() -> dict[str, int]:
    if not torch.cuda.is_available():
        return {}
    s = torch.cuda.memory_stats()
    return {"peak_reserved": torch.cuda.max_memory_reserved(), "peak_allocated": torch.cuda.max_memory_allocated(),
            "num_device_alloc": int(s.get("num_device_alloc", -1)), "num_alloc_retries": int(s.get("num_alloc_retries", 0)),
            "num_ooms": int(s.get("num_ooms", 0))}


def reset_cuda() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.reset_accumulated_memory_stats()  # per-run cudaMalloc / retry counts


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# ---- (a) chunked long clip under a budget -----------------------------------------------------------
def part_a(args, device: str) -> dict[str, Any]:
    dtype = torch.float32
    torch.backends.cuda.matmul.allow_tf32 = False  # exact comparison: no TF32 anywhere
    torch.backends.cudnn.allow_tf32 = False
    fn, c_in, hop, desc = build_decoder(device, dtype, tiny=args.dry_run, width=None)
    rf = receptive_field(fn, c_in, hop, device, dtype)
    overlap = max(8, 2 * rf)
    frames = int(args.seconds * 100)
    gen = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(1, c_in, frames, generator=gen).to(device=device, dtype=dtype)
    f0 = torch.full((1, frames), 200.0, device=device)
    res: dict[str, Any] = {"decoder": desc, "seconds": args.seconds, "frames": frames, "hop": hop,
                           "receptive_field_frames": rf, "overlap_frames": overlap}

    # reference: unchunked, no budget
    reset_cuda()
    t0 = time.perf_counter()
    with torch.inference_mode():
        ref = fn(x, f0).float().cpu()
    sync()
    res["reference"] = {"seconds": time.perf_counter() - t0, "length": ref.shape[-1], **cuda_mem()}

    # the budget
    if device.startswith("cuda"):
        budget = parse_size(args.budget)
        total = torch.cuda.get_device_properties(0).total_memory
        reset_cuda()
        torch.cuda.set_per_process_memory_fraction(budget / total)
        run_fn = fn
        res["budget"] = budget
    else:
        budget = None
        run_fn = SimulatedBudget(fn, frames // 2)
        res["budget"] = f"simulated: {frames // 2} frames"

    try:
        # plain call under the budget
        reset_cuda()
        t0 = time.perf_counter()
        plain: dict[str, Any] = {}
        try:
            with torch.inference_mode():
                out = run_fn(x, f0)
            sync()
            plain["outcome"] = "ok"
            del out
        except Exception as exc:
            if not is_oom(exc):
                raise
            plain["outcome"] = "oom"
            plain["error"] = str(exc).splitlines()[0][:160]
            strip_traceback(exc)
        plain["seconds"] = time.perf_counter() - t0
        plain.update(cuda_mem())
        res["plain_under_budget"] = plain

        # chunked under the budget: first call probes from the whole clip, second uses the memo
        chunker = Chunker(dim=-1, inputs=2, overlap=overlap, ratio=hop, min_chunk=max(overlap, 50))
        for label in ("chunked_first_call", "chunked_second_call"):
            reset_cuda()
            stats.reset()
            t0 = time.perf_counter()
            with torch.inference_mode():
                y, report = chunker.run_with_report(run_fn, x, f0)
                y = y.float().cpu()
            sync()
            diff = (y - ref).abs().max().item() if y.shape == ref.shape else math.inf
            res[label] = {"seconds": time.perf_counter() - t0, "length": y.shape[-1],
                          "same_length": y.shape == ref.shape, "max_abs_diff": diff,
                          "ref_max_abs": ref.abs().max().item(), **report.to_dict(),
                          "guard_stats": stats.snapshot().to_dict(), **cuda_mem()}
            del y
    finally:
        if device.startswith("cuda"):
            torch.cuda.set_per_process_memory_fraction(1.0)
            reset_cuda()
    c = res["chunked_first_call"]
    res["pass"] = bool(res["plain_under_budget"]["outcome"] == "oom" and c["same_length"]
                       and c["max_abs_diff"] <= args.tolerance)
    return res


# ---- (b) Janitor on a mixed-length request stream ---------------------------------------------------
def request_lengths(n: int, lo_s: float, hi_s: float, seed: int, warmup_max: bool) -> list[int]:
    rng = random.Random(seed)
    frames = [int(100 * rng.uniform(lo_s, hi_s)) for _ in range(n)]
    if warmup_max:  # a service warming up with its longest allowed request first
        frames[0] = int(100 * hi_s)
    return frames


def run_stream(fn, c_in: int, frames: list[int], device: str, dtype, policy: str) -> dict[str, Any]:
    reset_cuda()
    janitor = Janitor(**POLICIES[policy]) if policy not in ("never", "every") else None
    sized = policy == "janitor-sized"
    empty_calls = 0

    def serve(n: int) -> None:
        x = torch.randn(1, c_in, n, device=device, dtype=dtype)
        f0 = torch.full((1, n), 200.0, device=device)
        with torch.inference_mode():
            y = fn(x, f0)
            out = y.float().cpu()  # RVC copies every chunk's audio to the host
        del x, f0, y, out

    t0 = time.perf_counter()
    for n in frames:
        if sized:  # the service passes each request's length: clean only before a new longest one
            with janitor.request(n):
                serve(n)
            continue
        serve(n)
        if policy == "every":
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            empty_calls += 1
        elif janitor is not None:
            janitor.step()
    sync()
    mem = cuda_mem()
    r = {"policy": policy, "options": POLICIES.get(policy, {}), "requests": len(frames), "empty_cache_calls":
         empty_calls if janitor is None else janitor.cleanups, "seconds": time.perf_counter() - t0, **mem}
    if janitor is not None:
        r["janitor"] = janitor.totals.to_dict()
    if mem.get("peak_allocated"):
        r["reserved_over_allocated"] = mem["peak_reserved"] / mem["peak_allocated"]
        r["fragmentation"] = 1 - mem["peak_allocated"] / mem["peak_reserved"]
    return r


POLICIES: dict[str, dict[str, Any]] = {
    "never": {},
    "every": {},
    "janitor": {},  # the default: learned need x 1.1 (step() after each request)
    "janitor-sized": {},  # the default + request(length): clean only before a new longest request
    "janitor-headroom-1.25": {"headroom": 1.25},
    "fixed-cached-10%": {"max_cached_ratio": 0.1, "max_inactive_ratio": 0.25},  # the old default
}

def part_b(args, device: str) -> dict[str, Any]:
    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    torch.backends.cudnn.allow_tf32 = True
    fn, c_in, hop, desc = build_decoder(device, dtype, tiny=args.dry_run, width=None if args.dry_run else 256)
    with torch.inference_mode():  # warm cuDNN / kernels once, outside the measurement
        fn(torch.randn(1, c_in, 64, device=device, dtype=dtype), torch.full((1, 64), 200.0, device=device))
    out: dict[str, Any] = {"decoder": desc, "dtype": str(dtype), "orders": {},
                           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    lo, hi = (0.2, 0.6) if args.dry_run else (2.0, 60.0)
    t_start = time.perf_counter()
    for order in ("random", "warmup-max-first"):
        frames = request_lengths(args.requests, lo, hi, seed=7, warmup_max=(order != "random"))
        runs = []
        for p in POLICIES:
            if time.perf_counter() - t_start > args.time_limit_b:
                print(f"(b) time limit reached: skipping {order}/{p}", file=sys.stderr)
                continue
            runs.append(run_stream(fn, c_in, frames, device, dtype, p))
            print(f"(b) {order}/{p}: {runs[-1]['seconds']:.1f} s", file=sys.stderr)
        if not runs:
            continue
        out["orders"][order] = {"frames_min": min(frames), "frames_max": max(frames),
                                "frames_mean": sum(frames) / len(frames), "runs": runs}
    # literal: the target (peak reserved <= 1.10 x peak allocated, fewer calls than every request);
    # floor: peak reserved <= 1.10 x the every-request run's (the lowest any between-request policy reached)
    verdicts = {}
    for order, v in out["orders"].items():
        every = next((r for r in v["runs"] if r["policy"] == "every"), None)
        for r in v["runs"]:
            if every is None or r["policy"] in ("never", "every") or "reserved_over_allocated" not in r:
                continue
            r["reserved_over_every"] = r["peak_reserved"] / every["peak_reserved"]
            fewer = r["empty_cache_calls"] < every["empty_cache_calls"]
            verdicts[f"{order}/{r['policy']}"] = {
                "literal": bool(r["reserved_over_allocated"] <= 1.10 and fewer),
                "floor": bool(r["reserved_over_every"] <= 1.10 and fewer),
            }
    out["verdicts"] = verdicts
    return out


# ---- the report ------------------------------------------------------------------------------------
def _peaks(run: dict[str, Any]) -> tuple[str, str]:
    return format_size(run.get("peak_reserved", 0)), format_size(run.get("peak_allocated", 0))


def render(result: dict[str, Any]) -> str:
    """Markdown section for bench/RESULTS.md (also printed)."""
    lines = [f"## guard_gpu — {result['when']}", "", f"`{result['command']}` on {result['device_name']} "
             f"(torch {result['torch']}).", ""]
    a = result.get("a")
    if a:
        ref, plain = a["reference"], a["plain_under_budget"]
        rows = [("unchunked, no budget (reference)", "ok", 1, "–", a["frames"], 0, *_peaks(ref), f"{ref['seconds']:.2f}"),
                ("unchunked, under budget", plain["outcome"], "–", "–", "–", "–", *_peaks(plain), f"{plain['seconds']:.2f}")]
        rows += [(k.replace("_", " "), "ok" if c["same_length"] else "LENGTH MISMATCH", c["pieces"], c["halvings"],
                  c["final_chunk"], f"{c['max_abs_diff']:.2e}", *_peaks(c), f"{c['seconds']:.2f}")
                 for k, c in ((k, a[k]) for k in ("chunked_first_call", "chunked_second_call"))]
        lines += [f"**(a) chunked long clip** — {a['decoder']}; {a['seconds']:.0f} s clip = {a['frames']} frames → "
                  f"{a['reference']['length']} samples; receptive field {a['receptive_field_frames']} frames, "
                  f"overlap {a['overlap_frames']}; budget "
                  f"{format_size(a['budget']) if isinstance(a['budget'], int) else a['budget']}; fp32, TF32 off.", "",
                  md_table(("run", "outcome", "pieces", "halvings", "final piece (frames)", "max abs diff vs unchunked",
                            "peak reserved", "peak allocated", "time (s)"), rows),
                  "", f"(a) verdict: **{'PASS' if a['pass'] else 'FAIL'}** (plain call OOMs under the budget, chunked "
                  f"output has the reference length and max abs diff ≤ {result['tolerance']:g}).", ""]
    b = result.get("b")
    if b:
        nan, ratio = float("nan"), (lambda x: "–" if x is None else f"{x:.3f}")
        rows = [(order, r["policy"], r["empty_cache_calls"], *_peaks(r), f"{r.get('reserved_over_allocated', nan):.3f}",
                 f"{r.get('reserved_over_every', 1.0 if r['policy'] == 'every' else nan):.3f}",
                 r.get("num_device_alloc", ""), f"{r['seconds']:.2f}", ratio(r.get("janitor", {}).get("clean_start_ratio")))
                for order, v in b["orders"].items() for r in v["runs"]]
        lines += [f"**(b) Janitor, {result['requests']} mixed-length requests, allocator `{b.get('alloc_conf') or 'default'}`"
                  f"** — {b['decoder']}, {b['dtype']}. ratio = peak reserved ÷ peak allocated over the whole run; vs every = "
                  "peak reserved ÷ the every-request run's; `device mallocs` = cudaMalloc calls in the run.", "",
                  md_table(("order", "policy", "empty_cache calls", "peak reserved", "peak allocated", "ratio", "vs every",
                            "device mallocs", "time (s)", "Janitor's clean-start ratio"), rows),
                  "", "(b) verdicts — literal: ratio ≤ 1.10 and fewer calls than every request; floor: peak reserved ≤ "
                  "1.10 × every-request's and fewer calls:",
                  ", ".join(f"{k}: {'PASS' if v['literal'] else 'FAIL'} / {'PASS' if v['floor'] else 'FAIL'}"
                            for k, v in b["verdicts"].items()), ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for guard_gpu.json and guard_gpu.md")
    ap.add_argument("--parts", default="ab", help="which parts to run: a, b or ab")
    ap.add_argument("--seconds", type=float, default=300.0, help="(a) clip length in seconds (100 frames/s)")
    ap.add_argument("--budget", default="4GiB", help="(a) per-process memory budget")
    ap.add_argument("--tolerance", type=float, default=1e-4, help="(a) max abs diff allowed vs unchunked")
    ap.add_argument("--requests", type=int, default=200, help="(b) requests per policy")
    ap.add_argument("--time-limit-b", type=float, default=150.0, help="(b) skip further policies after this many s")
    ap.add_argument("--dry-run", action="store_true", help="CPU: tiny model, short clip, simulated budget")
    args = ap.parse_args()
    if args.dry_run:  # a tiny clip and a few requests, unless asked otherwise
        args.seconds = 2.0 if args.seconds == 300.0 else args.seconds
        args.requests = 4 if args.requests == 200 else args.requests
    elif not torch.cuda.is_available():
        sys.exit("guard_gpu.py needs CUDA (use --dry-run on a CPU)")
    device = "cpu" if args.dry_run else "cuda"
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "schema": 1, "when": f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC", "command": command(),
        "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)",
        "torch": torch.__version__, "tolerance": args.tolerance, "requests": args.requests,
    }
    if "a" in args.parts:
        result["a"] = part_a(args, device)
    if "b" in args.parts:
        result["b"] = part_b(args, device)
    (args.out / "guard_gpu.json").write_text(json.dumps(result, indent=2, default=str))
    md = render(result)
    (args.out / "guard_gpu.md").write_text(md + "\n")
    print(md)
    if "a" in result:
        log_result(f"(a) chunked decoder, {result['a'].get('seconds')} s clip under the budget: "
                   f"{'PASS' if result['a'].get('pass') else 'FAIL'}", folder=args.out)
    if "b" in result:
        log_result(f"(b) Janitor, allocator {result['b'].get('alloc_conf') or 'default'}: verdicts (literal / floor) "
                   + ", ".join(f"{k} {v.get('literal')}/{v.get('floor')}" for k, v in result["b"].get("verdicts", {}).items()),
                   folder=args.out)


if __name__ == "__main__":
    main()
