"""Fixes: each one a concrete action whose value is derived from the message's numbers.

A fix carries either an allocator string (`conf`, rendered for bash/PowerShell/cmd/Python through
`alloctune.config.shells`), a Python snippet, or a shell command. Knobs that cannot work on the reported
platform/backend are kept too, with `works=False` and the reason, so a user who read "set
expandable_segments" on a forum learns why it does nothing for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from alloctune.config import shells
from alloctune.diagnose import knobs
from alloctune.diagnose.report import OOMReport
from alloctune.units import MiB, format_size


@dataclass(frozen=True)
class Fix:
    """One recommendation. `env` holds the variables to set (already chosen for the vendor and
    torch version); `shell_forms()` renders them."""

    id: str
    title: str
    why: str
    conf: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    code: str | None = None
    command: str | None = None
    works: bool = True
    requires: str | None = None  # an upgrade the fix depends on
    extra: tuple[tuple[str, Any], ...] = field(default=())

    def shell_forms(self) -> dict[str, str]:
        return dict(_forms(self.env)) if self.env else {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "why": self.why,
            "works": self.works,
            "requires": self.requires,
            "conf": self.conf,
            "env": dict(self.env),
            "shell": self.shell_forms(),
            "code": self.code,
            "command": self.command,
            **dict(self.extra),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Fix:
        known = {"id", "title", "why", "works", "requires", "conf", "env", "code", "command", "shell"}
        return cls(
            id=d["id"],
            title=d["title"],
            why=d["why"],
            conf=d.get("conf"),
            env=tuple((d.get("env") or {}).items()),
            code=d.get("code"),
            command=d.get("command"),
            works=bool(d.get("works", True)),
            requires=d.get("requires"),
            extra=tuple((k, v) for k, v in d.items() if k not in known),
        )


@lru_cache(maxsize=256)  # the same few settings for every group of a long log
def _forms(env: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    return tuple(shells.render_all(dict(env)).items())


def _env(report: OOMReport, conf: str) -> tuple[tuple[str, str], ...]:
    vendor = report.vendor if report.vendor in ("cuda", "hip", "npu") else "cuda"
    return _env_for(conf, knobs.torch_for_env(report), vendor)


@lru_cache(maxsize=256)  # a few (setting, version, vendor) triples, asked for every message of a log
def _env_for(conf: str, torch: str | None, vendor: str) -> tuple[tuple[str, str], ...]:
    return tuple(shells.env_assignments(conf, torch, vendor=vendor).items())


def _fs(n: int) -> str:
    return format_size(n)


# ---- allocator knobs -----------------------------------------------------------------------


def expandable_segments(r: OOMReport, platform: str | None, reachable: int | None, enough: bool | None = None) -> Fix:
    """`reachable` = cached-but-unallocated + device free: what one growing segment could use;
    `enough` is the verdict's (rounding-aware) judgement that it covers the request."""
    works, why_not, requires = knobs.expandable_segments_support(r, platform)
    conf = "expandable_segments:True"
    if not works:
        return Fix("expandable_segments", "Enable expandable segments", why_not or "", conf=conf, works=False, requires=requires)
    X, U = r.requested or 0, r.reserved_unallocated or 0
    if enough is None:
        enough = reachable is not None and reachable >= X
    if enough:
        why = (
            f"{_fs(U)} is cached but unallocated, split inside segments that still hold live tensors; "
            f"with expandable segments PyTorch grows one segment per stream page by page and unmaps free pages "
            f"on OOM, so those bytes plus the device's free memory ({_fs(reachable)} together) can serve "
            f"the {_fs(X)} request."
        )
    else:
        why = (
            f"Stops new fragmentation (one growing segment instead of many fixed ones), but even all "
            f"{_fs(reachable or 0)} the process could reach is short of the {_fs(X)} request: combine it with "
            f"a smaller workload."
        )
    return Fix("expandable_segments", "Enable expandable segments", why, conf=conf, env=_env(r, conf), requires=requires)


def max_split_size(r: OOMReport, platform: str | None) -> Fix:
    works, why_not, requires = knobs.max_split_available(r, platform)
    X = r.requested or 0
    minimum = knobs.max_split_minimum_mb(r)
    value = X // MiB
    title = "Keep large cached blocks whole (max_split_size_mb)"
    if not works:
        return Fix("max_split_size_mb", title, why_not or "", works=False, requires=requires)
    if X <= 2 * MiB:
        return Fix(
            "max_split_size_mb",
            title,
            f"Will not help: the request ({_fs(X)}) is served by the small pool (<= 1 MiB, 2 MiB segments); "
            f"max_split_size_mb only changes how large-pool blocks are split.",
            works=False,
        )
    if value < minimum:
        return Fix(
            "max_split_size_mb",
            title,
            f"Will not help: it only protects blocks of at least {minimum} MiB (the smallest accepted "
            f"value), and the failing request is {_fs(X)}.",
            works=False,
        )
    conf = f"max_split_size_mb:{value}"
    why = (
        f"Blocks of {value} MiB or more (the request is {_fs(X)}) are then never split by smaller tensors, so a "
        f"freed block that fits the request stays whole, and on OOM such idle blocks are released first. "
        f"It cannot undo the {_fs(r.reserved_unallocated or 0)} already split; requests under {value} MiB no "
        f"longer use those blocks, so reserved memory may grow."
    )
    return Fix("max_split_size_mb", title, why, conf=conf, env=_env(r, conf), requires=requires)


def gc_threshold(r: OOMReport) -> Fix:
    """Never a fix for the OOM itself: it is listed so users learn why."""
    title = "garbage_collection_threshold"
    if r.cap is None or r.cap >= (r.total or 1 << 62):
        why = (
            "Does nothing here: it only runs when a per-process memory fraction is set "
            "(torch.cuda.set_per_process_memory_fraction, or per_process_memory_fraction on torch >= 2.10), "
            "and none was."
        )
    else:
        why = (
            f"Will not prevent this OOM: before raising, the allocator already released every idle cached "
            f"segment; the garbage collector frees the same kind of memory, only earlier (fewer full flushes "
            f"under the {_fs(r.cap)} limit)."
        )
    return Fix("garbage_collection_threshold", title, why, works=False)


def empty_cache_note(r: OOMReport) -> Fix:
    return Fix(
        "empty_cache",
        "torch.cuda.empty_cache()",
        "Will not help: PyTorch already returned every idle cached segment to the device before raising; "
        f"the {_fs(r.reserved_unallocated or 0)} still reserved sits in segments that hold live tensors.",
        works=False,
    )


# ---- workload-side and environment fixes ---------------------------------------------------


def _split_pieces(r: OOMReport, shortfall: int, base: int) -> int | None:
    """Into how many pieces the one request must be split (it alone is bigger than all the process
    can get), or None when the batch is what to reduce; `reduce_work` and its probe both read it."""
    X = r.requested or 0
    return math.ceil(X / max(X - shortfall, 1)) if X > base and X > 0 else None


def _reduce_percent(shortfall: int, base: int) -> int:
    return min(math.ceil(100 * shortfall / base) if base else 100, 100)


def reduce_work(r: OOMReport, shortfall: int, base: int) -> Fix:
    """Shrink the batch/chunk so the peak drops by `shortfall` (assumes memory grows with batch)."""
    X = r.requested or 0
    pieces = _split_pieces(r, shortfall, base)
    if pieces is not None:
        # a single allocation bigger than all the process can get: split that one operation
        avail = max(X - shortfall, 1)
        why = (
            f"A single {_fs(X)} allocation cannot fit in the {_fs(avail)} available; compute it in at least "
            f"{pieces} chunks (each <= {_fs(avail)}), or reduce the tensor's size."
        )
        return Fix(
            "split_operation",
            f"Split the operation into >= {pieces} chunks",
            why,
            extra=(("shortfall", shortfall), ("chunks", pieces)),
        )
    pct = _reduce_percent(shortfall, base)
    why = (
        f"The peak must drop by at least {_fs(shortfall)}, i.e. {pct}% of the {_fs(base)} this process "
        f"needed at the failure (live tensors + the request). If memory grows with the batch, use a batch or "
        f"chunk at most {100 - pct}% of the current one (activation checkpointing, lower precision or "
        f"offloading are alternatives)."
    )
    return Fix(
        "reduce_batch", f"Reduce the batch/chunk by >= {pct}%", why, extra=(("shortfall", shortfall), ("reduce_percent", pct))
    )


def split_below_allocation_limit(r: OOMReport) -> Fix:
    """XPU: one allocation above the driver's per-allocation limit fails however much is free."""
    X = r.requested or 0
    limit = 4 * 1024**3  # Intel Arc / Level Zero maxMemAllocSize is just under 4 GiB by default
    pieces = X // limit + 1
    why = (
        f"A single {_fs(X)} tensor was refused although the device was not full. Intel GPU drivers limit one "
        f"allocation to just under 4 GiB by default, so build it from at least {pieces} pieces (or process it "
        f"in {pieces}+ chunks)."
    )
    return Fix(
        "split_operation",
        f"Keep single tensors below the per-allocation limit ({pieces}+ pieces)",
        why,
        extra=(("chunks", pieces),),
    )


def free_processes(r: OOMReport, shortfall: int, exclude: int | None = None) -> Fix:
    procs = sorted((p for p in r.other_processes if p[0] != exclude), key=lambda p: -p[1])
    chosen, got = [], 0
    for pid, size in procs:
        if got >= shortfall:
            break
        chosen.append((pid, size))
        got += size
    listing = ", ".join(f"PID {pid} ({_fs(size)})" for pid, size in chosen)
    total = sum(size for _, size in procs)
    why = (
        f"Other processes hold {_fs(total)} of this GPU; stopping {listing} frees "
        f"{_fs(got)} >= the {_fs(shortfall)} missing. Or run this job on another GPU (CUDA_VISIBLE_DEVICES)."
    )
    return Fix(
        "free_other_processes",
        "Stop or move the other processes on this GPU",
        why,
        command="nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv",
        extra=(("pids", [pid for pid, _ in chosen]),),
    )


def check_unlisted_users(r: OOMReport, outside: int, shortfall: int) -> Fix:
    why = (
        f"{_fs(outside)} of the device is used outside this process's PyTorch allocator (other processes, "
        f"the display, or this process's CUDA context and libraries); the message does not say which. "
        f"If other processes show up, freeing {_fs(shortfall)} of theirs is enough."
    )
    return Fix(
        "check_other_processes",
        "Check what else uses the GPU",
        why,
        command="nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv",
    )


def raise_fraction(r: OOMReport, need: int) -> Fix:
    T = r.total or 0
    frac = math.ceil(100 * need / T) / 100 if T else None
    if frac is None or frac > 1:
        return Fix(
            "raise_memory_fraction",
            "Raise the per-process memory limit",
            f"Even the whole device ({_fs(T)}) is smaller than the {_fs(need)} needed: raising the limit cannot help.",
            works=False,
        )
    code = f"torch.cuda.set_per_process_memory_fraction({frac:.2f})  # was {(r.cap or 0) / T:.4f} ({_fs(r.cap or 0)})"
    why = (
        f"The limit is {_fs(r.cap or 0)} but reserved + request = {_fs(need)}; a fraction of {frac:.2f} of "
        f"{_fs(T)} ({_fs(int(frac * T))}) covers it, and the device had {_fs(r.free or 0)} free. With torch "
        f">= 2.10 the same limit can come from per_process_memory_fraction:{frac:.2f} in the allocator "
        f"variable if that is where it was set."
    )
    return Fix(
        "raise_memory_fraction",
        f"Raise the per-process memory fraction to {frac:.2f}",
        why,
        code=code,
        extra=(("fraction", frac),),
    )


def mps_watermark(r: OOMReport, need: int, slack: int = 0) -> Fix:
    """The smallest ratio (2 decimals) that covers `need` + `slack` (the rounding of the printed
    figures) -- and always above the assumed default: advising the default itself changes nothing."""
    # PyTorch's default high watermark ratio is 1.7 of the device's recommended working set.
    default_ratio = 1.7
    cap = r.cap or 1
    ratio = max(math.ceil(100 * default_ratio * (need + slack) / cap) / 100, round(default_ratio + 0.01, 2))
    why = (
        f"'max allowed' ({_fs(cap)}) is the MPS high watermark; the process needed {_fs(need)} "
        f"(allocated + other allocations + request; the printed figures are rounded, so up to {_fs(need + slack)}). "
        f"Assuming the default ratio {default_ratio} was in effect, a ratio of {ratio:.2f} raises the limit to "
        f"cover it; 0.0 removes the limit but can make macOS swap or freeze."
    )
    env = (("PYTORCH_MPS_HIGH_WATERMARK_RATIO", f"{ratio:.2f}"),)
    return Fix(
        "mps_high_watermark", f"Raise PYTORCH_MPS_HIGH_WATERMARK_RATIO to {ratio:.2f}", why, env=env, extra=(("ratio", ratio),)
    )


def native_backend(r: OOMReport) -> Fix:
    why = (
        "This process runs PyTorch's cudaMallocAsync backend, which ignores expandable_segments, "
        "max_split_size_mb and garbage_collection_threshold and prints no reserved/unallocated figures. "
        "Switch to the native caching allocator to use those knobs and get a diagnosable message "
        "(ComfyUI selects cudaMallocAsync itself: start it with --disable-cuda-malloc)."
    )
    conf = "backend:native"
    return Fix("native_backend", "Use the native caching allocator", why, conf=conf, env=_env(r, conf))


def capture_full_message(r: OOMReport, missing: str) -> Fix:
    """What to run when the pasted text lacks figures: the agent keeps the exception's whole text."""
    code = (
        "alloctune run --json -- python main.py ...   > trial.json   # your usual command after --\n"
        "alloctune diagnose trial.json                             # reads the full message it kept"
    )
    why = (
        f"The pasted text has no {missing}. Paste the whole message (the lines after the first one; ComfyUI's "
        "console and comfyui.log keep them), or run the workload once through alloctune, which keeps the "
        "exception's full text, and diagnose that."
    )
    return Fix("capture_full_message", "Get the full out-of-memory message", why, code=code)


def record_snapshot(r: OOMReport) -> Fix:
    dev = r.device or 0
    code = (
        "import torch\n"
        "torch.cuda.memory._record_memory_history(max_entries=100000)\n"
        "try:\n"
        "    run()  # your workload\n"
        "except torch.OutOfMemoryError:\n"
        f"    torch.cuda.memory._dump_snapshot('oom_snapshot_gpu{dev}.pickle')\n"
        "    raise"
    )
    why = (
        "The message alone cannot show which tensors filled the memory; a memory snapshot can "
        "(open it at https://pytorch.org/memory_viz or feed it to alloctune's simulator)."
    )
    return Fix("record_snapshot", "Record a memory snapshot at the OOM", why, code=code)


# ---- probes: what a message's first working fix is, before building it ----------------------
# A long log's groups need, per message, only the id of its first working fix and how much it asks
# for (`groups._demand`); the fix itself (its text: most of the cost of judging a message) is built
# only for the few a group keeps. A probe answers (works, id, demand) from the builder's own
# arguments, for the fixes that are most often first; tests/test_diagnose_fastpath.py holds every
# probe to the fix it stands for.


def _probe_reduce_work(r: OOMReport, shortfall: int, base: int) -> tuple[bool, str, float]:
    pieces = _split_pieces(r, shortfall, base)
    if pieces is not None:
        return True, "split_operation", float(pieces)
    return True, "reduce_batch", float(_reduce_percent(shortfall, base))


def _probe_expandable(
    r: OOMReport, platform: str | None, reachable: int | None, enough: bool | None = None
) -> tuple[bool, str, float]:
    return knobs.expandable_segments_support(r, platform)[0], "expandable_segments", 0.0


def _always(fix_id: str) -> Any:
    def probe(*args: Any, **kw: Any) -> tuple[bool, str, float]:
        return True, fix_id, 0.0

    return probe


def _never(*args: Any, **kw: Any) -> tuple[bool, str, float]:
    return False, "", 0.0


PROBES = {
    reduce_work: _probe_reduce_work,
    expandable_segments: _probe_expandable,
    record_snapshot: _always("record_snapshot"),
    check_unlisted_users: _always("check_other_processes"),
    free_processes: _always("free_other_processes"),
    native_backend: _always("native_backend"),
    capture_full_message: _always("capture_full_message"),
    gc_threshold: _never,
    empty_cache_note: _never,
}
