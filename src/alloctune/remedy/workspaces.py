"""Workspace caps: which cuBLAS / cuDNN workspaces a recording shows, and what capping them buys.

* cuBLAS (C++ frames through torch's handle pool): one workspace per handle and stream, allocated
  once, of the size `CUBLAS_WORKSPACE_CONFIG` sets (torch's default on Hopper: 32 MiB). A smaller
  config is the same program with that fixed request smaller, so it is simulated exactly: the
  tagged requests shrunk to the config's size, replayed for the min budget.
* cuDNN (C++ frames through its plan loop, a fallback model learned from a capped run, or -- with
  neither -- requests freed right after they are made, the workspace shape `trace.fallible` uses):
  `torch.backends.cudnn.benchmark = False` and the cuDNN v7 API switch change which algorithms run,
  hence every workspace's size, which no recording shows. Those candidates carry the lower bound
  the model gives (every cuDNN workspace given up) and the exact command of the run that confirms.
"""

from __future__ import annotations

import re
from itertools import compress
from typing import Mapping

from alloctune.remedy.model import BaseActivity, Remedy, Row, activity, min_budget, simulated, spliced
from alloctune.trace.fallible import NO_WORKSPACE, has_cpp_frames, scratch_requests, tag_by_frames
from alloctune.trace.model import ALLOC, FREE, Trace

# torch's cuBLAS workspace pool (CublasHandlePool.cpp) and its cuBLASLt workspace
CUBLAS_FRAME = re.compile(r"getNewWorkspace|getCUDABlasLtWorkspace|CublasHandlePool|cublasLt\w*Workspace", re.I)
KiB = 1024
# CUBLAS_WORKSPACE_CONFIG values smaller than Hopper's default (":4096:8" = 32 MiB): the pre-Hopper
# default and the smallest documented one (deterministic mode's)
CUBLAS_CONFIGS = ((":4096:2:16:8", (4096 * 2 + 16 * 8) * KiB), (":16:8", 16 * 8 * KiB))


def cublas_requests(trace: Trace) -> set[int]:
    """Request indices of ALLOCs whose C++ stack passes through torch's cuBLAS workspace pool."""
    req, events = trace.requests, trace.events
    out: set[int] = set()
    if not events:  # no recorded events (a compact trace): no frames to read
        return out
    for i, op in enumerate(req.ops):
        if op != ALLOC:
            continue
        k = req.event_index[i]
        ev = events[k] if 0 <= k < len(events) else None
        for fr in (ev or {}).get("frames") or ():
            name = fr.get("name", "") if isinstance(fr, Mapping) else str(fr)
            if CUBLAS_FRAME.search(name or ""):
                out.add(i)
                break
    return out
    pool: dict[str, bool] = {}  # frame name -> whether it is the pool's (names repeat: each is matched once)
    n_events, event_index = len(events), req.event_index
    for i in compress(range(len(req.ops)), map(ALLOC.__eq__, req.ops)):
        k = event_index[i]
        ev = events[k] if 0 <= k < n_events else None
        for fr in (ev or {}).get("frames") or ():
            name = (fr.get("name", "") if isinstance(fr, Mapping) else str(fr)) or ""
            hit = pool.get(name)
            if hit is None:
                hit = pool[name] = CUBLAS_FRAME.search(name) is not None
            if hit:
                out.add(i)
                break
    return out


# Python frames of torch's convolution modules and functions (torch/nn/modules/conv.py, functional)
CONV_FRAME = re.compile(r"^_conv_forward$|^conv(?:_transpose)?[123]d$|^convolution$")
SHAPE_EVIDENCE = "workspace-shaped requests (freed right after they are made; no C++ frames)"
PYTHON_EVIDENCE = "workspace-shaped requests made inside a convolution (Python stacks)"


def conv_scratch_requests(trace: Trace) -> set[int] | None:
    """The workspace-shaped requests whose Python stack passes through a convolution; None when the
    recording kept no Python stacks (then the shape alone is all there is)."""
    req = trace.requests
    table = req.stack_table
    if req.stack_ids is None or table is None or table.dropped:
        return None
    conv = {
        j
        for j, stack in enumerate(table.stacks)
        if any(0 <= f < len(table.frames) and CONV_FRAME.match(table.frames[f][2] or "") for f in stack)
    }
    return {i for i in scratch_requests(trace) if req.stack_ids[i] in conv}


def cudnn_requests(trace: Trace) -> tuple[set[int], str]:
    """cuDNN workspace requests and the evidence: C++ frames, a learned fallback model, Python stacks
    through a convolution (a transformer's scratch requests are then not taken for cuDNN's), or,
    with none of these, the shape."""
    if has_cpp_frames(trace):
        return tag_by_frames(trace), "C++ frames"
    if trace.requests.fallbacks:
        return set(trace.requests.fallbacks), "the fallback model learned from a capped run"
    conv = conv_scratch_requests(trace)
    if conv is not None:
        return conv, PYTHON_EVIDENCE
    return set(scratch_requests(trace)), SHAPE_EVIDENCE


def resized(trace: Trace, sizes: Mapping[int, int]) -> Trace:
    """`trace` with the ALLOC at each index of `sizes` (and its FREE) of the new size."""
    req = trace.requests
    n = len(req)
    rid_size = {req.rids[i]: s for i, s in sizes.items()}
    ops, rids, streams, evi = req.ops, req.rids, req.streams, req.event_index
    changed: dict[int, Row | None] = {
        r: (FREE, rid_size[rids[r]], rids[r], streams[r], evi[r], -1)
        for r in compress(range(n), map(rid_size.__contains__, rids))
        if r not in sizes and ops[r] == FREE
    }
    for r, size in sizes.items():
        if 0 <= r < n:
            changed[r] = (ops[r], size, rids[r], streams[r], evi[r], -1)
    return spliced(trace, {}, changed)


def workspace_remedies(
    trace: Trace, base: int | None, conf: str, command: str = "CMD", base_act: BaseActivity | None = None
) -> list[Remedy]:
    """The workspace caps that apply to the recording (none when it shows no workspace); `base_act`:
    the recording's own `activity` under `conf`, when at hand."""
    out: list[Remedy] = []
    blas = cublas_requests(trace)
    cudnn, evidence = cudnn_requests(trace)
    if not blas and not cudnn:
        return out
    base_act = base_act or activity(trace, conf, trace)
    sizes = trace.requests.sizes
    largest = max((sizes[i] for i in blas), default=0)
    for value, cap in CUBLAS_CONFIGS:
        if largest <= cap:
            continue
        t = resized(trace, {i: min(sizes[i], cap) for i in blas})
        out.append(
            simulated(
                f"cublas_workspace_config{value.replace(':', '_')}",
                f"cuBLAS workspaces capped at {cap // KiB} KiB (recorded: {len(blas)}, the largest {largest // KiB} KiB)",
                t,
                conf,
                trace,
                base,
                base_act,
                f"CUBLAS_WORKSPACE_CONFIG={value} in the program's environment "
                "(before torch starts; slower cuBLAS kernels possible)",
                confirm=f"CUBLAS_WORKSPACE_CONFIG={value} alloctune record --out cublas.pickle -- {command} && "
                "alloctune simulate cublas.pickle --min-budget",
            )
        )
    if cudnn:
        floor = min_budget(resized(trace, {i: NO_WORKSPACE for i in cudnn if sizes[i] > NO_WORKSPACE}), conf, trace)
        note = (
            f"{len(cudnn)} cuDNN workspace request(s) ({evidence}); the algorithms and their workspaces change "
            "with the switch, which no recording shows: bound = min budget with every one given up"
        )
        was = (trace.meta or {}).get("cudnn_benchmark")  # the run record's: the switch to try is the other way
        flip = was is False
        side = "on" if flip else "off"
        for name, what, how, run in (  # run: the recording command, writing NAME.pickle at @OUT@
            (
                f"cudnn_benchmark_{side}",
                f"cuDNN autotuning {side}",
                f"torch.backends.cudnn.benchmark = {flip}",
                f"alloctune run --cudnn-benchmark {side} --record @OUT@ -- {command}",
            ),
            (
                "cudnn_v7_api",
                "cuDNN's v7 API (where the installed torch still honours the switch)",
                "TORCH_CUDNN_V8_API_DISABLED=1 in the program's environment",
                f"TORCH_CUDNN_V8_API_DISABLED=1 alloctune record --out @OUT@ -- {command}",
            ),
        ):
            out.append(
                Remedy.unconfirmed(
                    name,
                    what,
                    how,
                    conf,
                    confirm=f"{run.replace('@OUT@', name + '.pickle', 1)} && alloctune simulate {name}.pickle --min-budget",
                    bound=floor,
                    notes=(note,),
                )
            )
    return out
