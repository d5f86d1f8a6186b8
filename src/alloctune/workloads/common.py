"""What every reference workload shares: options, model construction, timing, the summary.

A workload module supplies three things — ``add_arguments(parser)``, ``build(ctx, args)``
(models on the device) and ``items(ctx, args, state)`` (a generator yielding one dict per
finished item) — and calls :func:`main`. Keeping the loop here means every workload prints
the same throughput line and the same one-line JSON summary last, which is what
``alloctune run`` / the benches parse, and reports an out-of-memory the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

SUMMARY_SCHEMA = 1


@dataclass(frozen=True)
class RunContext:
    """Resolved common options: where and in what precision a workload runs."""

    name: str
    device: torch.device
    dtype: torch.dtype
    tiny: bool
    seed: int
    count: int
    rng: np.random.Generator = field(compare=False, repr=False)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def half(self) -> bool:
        return self.dtype == torch.float16


@dataclass(frozen=True)
class Summary:
    """The last line a workload prints: what ran, how fast, and how much memory it held."""

    workload: str
    outcome: str  # "ok" or "oom"
    items: int
    wall_s: float
    items_wall_s: float
    items_per_s: float
    device: str
    dtype: str
    tiny: bool
    seed: int
    totals: dict[str, float]
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    utilization: float | None = None
    num_alloc_retries: int | None = None
    num_ooms: int | None = None
    alloc_conf: str | None = None
    torch: str = torch.__version__
    error: str | None = None
    schema: int = SUMMARY_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        return cls(**data)


def base_parser(name: str, description: str | None, default_count: int, tiny_count: int) -> argparse.ArgumentParser:
    """The options every workload takes; a workload adds its own to the returned parser."""
    parser = argparse.ArgumentParser(prog=f"python -m alloctune.workloads.{name}", description=description)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--tiny", action="store_true", help="shrink models and inputs to run on a CPU in seconds")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and input shapes (default 0)")
    parser.add_argument(
        "--count", type=int, default=None, help=f"number of items (default {default_count}, {tiny_count} with --tiny)"
    )
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--half", action="store_true", help="fp16 (default on CUDA)")
    precision.add_argument("--fp32", action="store_true", help="fp32 (default on CPU)")
    parser.add_argument("--quiet", action="store_true", help="no per-item lines, only the summary")
    parser.set_defaults(_default_count=default_count, _tiny_count=tiny_count)
    return parser


def resolve(name: str, args: argparse.Namespace) -> RunContext:
    """Turn parsed options into a context; exits 2 with one line when the device is unusable."""
    try:
        device = torch.device(args.device)
    except RuntimeError:
        _usage_exit(name, f"unknown device {args.device!r}; use cuda, cuda:N or cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            _usage_exit(name, "CUDA is not available here; pass --device cpu (with --tiny for a quick run)")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    elif device.type != "cpu":
        _usage_exit(name, f"unsupported device {args.device!r}; use cuda, cuda:N or cpu")
    if args.half:
        dtype = torch.float16
    elif args.fp32:
        dtype = torch.float32
    else:
        dtype = torch.float16 if device.type == "cuda" else torch.float32
    count = args.count if args.count is not None else (args._tiny_count if args.tiny else args._default_count)
    if count < 1:
        _usage_exit(name, f"--count must be at least 1, got {count}")
    torch.manual_seed(args.seed)
    return RunContext(
        name=name,
        device=device,
        dtype=dtype,
        tiny=bool(args.tiny),
        seed=int(args.seed),
        count=int(count),
        rng=np.random.default_rng(args.seed),
    )


def _usage_exit(name: str, message: str) -> None:
    print(f"{name}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


@contextlib.contextmanager
def building(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Construct modules directly on `device` in `dtype`.

    Building on the CPU in fp32 and then moving would make a transient fp32 copy of every
    weight on the GPU and cost seconds of CPU init; real programs load each tensor once in
    its final dtype, so the allocator should see exactly one allocation per parameter.
    """
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def materialize(
    factory: Callable[[], torch.nn.Module],
    device: torch.device,
    dtype: torch.dtype,
    *,
    stage_dtype: torch.dtype | None = None,
) -> torch.nn.Module:
    """Build `factory()` on the meta device, give it memory on `device`, fill it randomly.

    With `stage_dtype` the weights are first allocated in that dtype and then cast, the way a
    program that does ``model.to("cuda").half()`` fills the cache (a full fp32 copy whose
    blocks are freed parameter by parameter as the fp16 ones arrive); without it each weight
    is allocated once, directly in `dtype`. Either way nothing is initialised on the CPU.
    """
    with torch.device("meta"):
        module = factory()
    if stage_dtype is not None and stage_dtype != dtype:
        module = module.to(stage_dtype).to_empty(device=device).to(dtype)
    else:
        module = module.to(dtype).to_empty(device=device)
    init_random_(module)
    return module


_NORMS = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.modules.batchnorm._NormBase)


@torch.no_grad()
def init_random_(module: torch.nn.Module) -> torch.nn.Module:
    """Cheap random values with sane scales, on whatever device the tensors live.

    Only shapes matter to the allocator, but values must stay finite in fp16 (a NaN pitch or
    token would change what a workload does): matrices get N(0, 1/fan_in), norm scales and
    weight-norm magnitudes 1, biases 0, batch-norm statistics (0, 1).
    """
    for mod in module.modules():
        for name, p in mod.named_parameters(recurse=False):
            if name in ("weight_g", "original0") or (name in ("weight", "gamma") and p.ndim == 1):
                p.fill_(1.0)
            elif p.ndim >= 2:
                p.normal_(0.0, p[0].numel() ** -0.5)
            else:
                p.zero_()
        for name, b in mod.named_buffers(recurse=False):
            if name == "running_var":
                b.fill_(1.0)
            elif isinstance(mod, _NORMS):
                b.zero_()
    return module


def count_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def log_uniform_int(rng: np.random.Generator, low: float, high: float) -> int:
    """An integer drawn log-uniformly in [low, high] (request sizes spread over decades)."""
    return int(round(float(np.exp(rng.uniform(np.log(low), np.log(high))))))


def sync(ctx: RunContext) -> None:
    if ctx.is_cuda:
        torch.cuda.synchronize(ctx.device)


def _memory_fields(ctx: RunContext) -> dict[str, Any]:
    if not ctx.is_cuda:
        return {}
    stats = torch.cuda.memory_stats(ctx.device)
    peak_alloc = int(stats.get("allocated_bytes.all.peak", 0))
    peak_res = int(stats.get("reserved_bytes.all.peak", 0))
    return {
        "peak_allocated": peak_alloc,
        "peak_reserved": peak_res,
        "utilization": round(peak_alloc / peak_res, 6) if peak_res else None,
        "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "num_ooms": int(stats.get("num_ooms", 0)),
        "alloc_conf": os.environ.get("PYTORCH_ALLOC_CONF", os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")),
    }


Builder = Callable[[RunContext, argparse.Namespace], Any]
ItemLoop = Callable[[RunContext, argparse.Namespace, Any], Iterator[dict[str, Any]]]


def run(
    name: str,
    ctx: RunContext,
    args: argparse.Namespace,
    build: Builder,
    items: ItemLoop,
    summed: tuple[str, ...] = (),
) -> Summary:
    """Build, run every item, and return the summary (an OOM ends the run with outcome ``oom``).

    `summed` names the per-item numbers whose totals go into the summary (audio seconds,
    tokens, ...): they give the second throughput figure next to items/s.
    """
    quiet = bool(getattr(args, "quiet", False))
    totals: dict[str, float] = {}
    done = 0
    outcome, error = "ok", None
    t0 = time.perf_counter()
    t_items = t0
    try:
        state = build(ctx, args)
        sync(ctx)
        t_items = time.perf_counter()
        for info in items(ctx, args, state):
            done += 1
            for key in summed:
                totals[key] = totals.get(key, 0) + info.get(key, 0)
            if not quiet:
                shown = " ".join(f"{k}={_short(v)}" for k, v in info.items())
                print(f"[{name}] item {done}/{ctx.count} {shown}", flush=True)
    except torch.OutOfMemoryError as exc:
        outcome, error = "oom", " ".join(str(exc).split())
    if outcome == "ok":
        sync(ctx)
    t_end = time.perf_counter()
    items_wall = t_end - t_items
    return Summary(
        workload=name,
        outcome=outcome,
        items=done,
        wall_s=round(t_end - t0, 4),
        items_wall_s=round(items_wall, 4),
        items_per_s=round(done / items_wall, 4) if items_wall > 0 else 0.0,
        device=str(ctx.device),
        dtype=str(ctx.dtype).removeprefix("torch."),
        tiny=ctx.tiny,
        seed=ctx.seed,
        totals={k: round(v, 4) if isinstance(v, float) else v for k, v in totals.items()},
        error=error,
        **_memory_fields(ctx),
    )


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def main(
    name: str,
    description: str | None,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    build: Builder,
    items: ItemLoop,
    *,
    default_count: int,
    tiny_count: int,
    summed: tuple[str, ...] = (),
    argv: list[str] | None = None,
) -> Summary:
    """Command-line entry shared by the workloads: prints throughput, then the JSON summary.

    Exits 1 after printing the summary when the run hit an out-of-memory error, so a
    runner can tell an OOM from success by the exit code and still read how far it got.
    """
    parser = base_parser(name, description, default_count, tiny_count)
    add_arguments(parser)
    args = parser.parse_args(argv)
    ctx = resolve(name, args)
    summary = run(name, ctx, args, build, items, summed)
    if summary.outcome == "oom":
        print(f"[{name}] out of memory after {summary.items} item(s): {summary.error}", file=sys.stderr)
    rate = f"{summary.items_per_s:.3f} items/s"
    extra = ", ".join(f"{summary.totals[k] / summary.items_wall_s:.1f} {k}/s" for k in summary.totals if summary.items_wall_s)
    print(f"[{name}] throughput: {rate}" + (f" ({extra})" if extra else ""), flush=True)
    print(json.dumps(summary.to_dict(), separators=(",", ":")), flush=True)
    if summary.outcome != "ok":
        raise SystemExit(1)
    return summary
