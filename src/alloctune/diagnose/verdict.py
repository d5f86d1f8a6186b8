"""From an `OOMReport` to a `Diagnosis`: why the allocation failed, with the numbers that show it.

Verdicts:
* `fragmentation` - the memory exists but is pinned inside split segments: the cached but
  unallocated bytes cover the request, or (cached + device free) do and one growing segment
  (expandable segments) could join them. Before raising, PyTorch has already returned every idle
  segment, so what stays cached is split around live tensors (PR pytorch#13751).
* `cap` - a per-process limit (memory fraction, MPS watermark, XPU per-allocation limit) was hit
  while the device still had room.
* `contention` - other processes hold the memory that is missing.
* `shortage` - the work itself needs more than the device has.
* `unknown` - with the reason (figures missing, or numbers that no allocator rule explains).

Printed figures are rounded to 2 decimals of their unit; comparisons allow for that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from alloctune.diagnose import fixes as fx
from alloctune.diagnose.diagnosis import SCHEMA, VERDICTS, Builder, Diagnosis, FirstFix, Verdict
from alloctune.diagnose.fixes import Fix
from alloctune.diagnose.report import OOMReport
from alloctune.units import GiB, KiB, MiB, format_size

# The records live in `diagnosis.py`; importers of this module find them here too.
__all__ = ["SCHEMA", "UNLIMITED", "VERDICTS", "Diagnosis", "FirstFix", "Verdict", "diagnose_report", "tol", "verdict_only"]

UNLIMITED = 1 << 60  # cudaMallocAsync prints SIZE_MAX ("17179869184.00 GiB") when no fraction is set


# cudaMalloc hands out memory in 2 MiB pages: "free" within a page of the request is no room at all.
_GRANULE = 2 * MiB


def tol(n: int | None) -> int:
    """Half a unit in the last printed digit of `format_size(n)`: the rounding error of a figure."""
    if n is None or n <= KiB:
        return 0
    if n <= MiB:
        return KiB // 200
    if n <= GiB:
        return MiB // 200
    return GiB // 200


def _fs(n: int) -> str:
    return format_size(n)


def _probable_self(r: OOMReport) -> int | None:
    """Without a "this process has" line, the one listed process holding at least our reserved
    memory is most likely us; `None` if there is no such single candidate."""
    if r.process_in_use is not None or r.reserved is None or not r.other_processes:
        return None
    big = [pid for pid, size in r.other_processes if size + tol(size) >= r.reserved]
    return big[0] if len(big) == 1 else None


def diagnose_report(r: OOMReport, platform: str | None = None) -> Diagnosis:
    """The verdict for one parsed message. `platform` overrides the one guessed from the text."""
    return _judge(Builder(r, platform or r.platform))


def verdict_only(r: OOMReport, platform: str | None = None) -> Verdict:
    """`diagnose_report`'s verdict, shortfall and top fix, without its text: what a long log's
    groups need for every message (the full diagnosis is built for the few shown)."""
    return _judge(Builder(r, platform or r.platform, False))


def _judge(b: Builder) -> Any:
    r = b.r
    X = r.requested
    if r.format == "thc":
        return b.done(
            "unknown",
            "pre-1.0 'cuda runtime error (2)' carries no figures; upgrade PyTorch "
            "(any release since 1.0 prints what was requested, allocated, reserved and free)",
        )
    if r.format == "cuda-error":
        b.fix(fx.record_snapshot, r)
        return b.done(
            "unknown",
            "'CUDA error: out of memory' is raised outside the caching allocator (a kernel, "
            "cuBLAS/cuDNN workspace, NCCL or context creation) and carries no figures",
        )
    if X is None:
        return _no_request(b)
    if b.full:
        b.ev(
            f"requested: {_fs(X)}"
            + (
                " (the segment size PyTorch asked the device for)"
                if r.vendor in ("cuda", "hip") and r.backend == "native"
                else ""
            )
        )
    if X >= UNLIMITED:
        return b.done("shortage", "a request of more than 1 EiB: the tensor size is wrong (a shape bug)")

    T = r.total
    if T is not None and b.full:
        b.ev(f"device total: {_fs(T)}")
    if T is not None and X > T + tol(T) + tol(X):
        b.fix(fx.reduce_work, r, X - T, T)
        if b.full:
            b.ev(f"the single request exceeds the whole device by {_fs(X - T)}")
        return b.done("shortage", lambda: f"one allocation of {_fs(X)} is larger than the device ({_fs(T)})", X - T)

    if r.vendor == "mps":
        return _mps(b)
    if r.backend == "cudaMallocAsync":
        return _async(b)
    return _native(b)


def _no_request(b: Builder) -> Any:
    """A message without the requested size."""
    r = b.r
    if r.backend == "cudaMallocAsync":
        b.fix(fx.capture_full_message, r, "figures after 'Allocation on device'")
        b.fix(fx.native_backend, r)
        return b.done(
            "unknown",
            "the cudaMallocAsync message was cut after 'Allocation on device' (ComfyUI "
            "shows only its first line); the full message lists allocated, requested and free memory",
        )
    if r.vendor in ("cuda", "hip") and r.reserved_unallocated is not None:
        return _without_request(b)
    b.fix(fx.capture_full_message, r, "requested size")
    return b.done("unknown", "the message was cut before the requested size")


def _without_request(b: Builder) -> Any:
    """The figures of a message whose first line ("Tried to allocate X") was not pasted: the verdict
    depends on X, so say for which X each one holds. After releasing its cache the allocator asked
    the device for X and was refused, so X exceeded the device's free memory."""
    r = b.r
    U, F, A, T = r.reserved_unallocated or 0, r.free, r.allocated, r.total
    if T is not None:
        b.ev(f"device total: {_fs(T)}")
    if A is not None:
        b.ev(f"allocated by PyTorch: {_fs(A)}")
    b.ev(
        f"reserved but unallocated: {_fs(U)}"
        + (" (derived: reserved - allocated)" if "reserved_unallocated" in r.derived else "")
    )
    if F is not None:
        b.ev(f"device free: {_fs(F)}: the request was larger than this (the device refused it after the cache was released)")
        b.ev(
            f"a request up to {_fs(U + F)} (cached {_fs(U)} + free {_fs(F)}) failed from fragmentation; "
            "a larger one because the work needs more than the device has"
        )
    b.fix(fx.capture_full_message, r, "first line ('Tried to allocate ...') with the requested size")
    if U:
        b.fix(fx.expandable_segments, r, b.platform, U + (F or 0))
    return b.done(
        "unknown",
        "the first line with the requested size was not pasted; "
        + (
            f"fragmentation if the request was at most {_fs(U + F)}, shortage or contention if larger"
            if F is not None
            else "the figures alone do not decide between fragmentation and shortage"
        ),
    )


def _mps(b: Builder) -> Any:
    r = b.r
    requested, allocated, other, cap = r.requested or 0, r.allocated, r.other_allocations, r.cap
    if allocated is None or cap is None:
        return b.done("unknown", "the MPS message was cut before its figures")
    need = allocated + (other or 0) + requested
    b.ev(f"MPS allocated {_fs(allocated)} + other allocations {_fs(other or 0)} + request {_fs(requested)} = {_fs(need)}")
    b.ev(f"max allowed (high watermark): {_fs(cap)}")
    for name in ("expandable_segments", "max_split_size_mb"):
        b.fix(
            Fix,
            name,
            name,
            "MPS has no such option: it belongs to the CUDA/ROCm caching allocator (PYTORCH_CUDA_ALLOC_CONF is not read on MPS)",
            works=False,
        )
    if need + tol(need) + tol(cap) >= cap:
        short = max(0, need - cap)
        b.fix(fx.mps_watermark, r, need, tol(allocated) + tol(other) + tol(requested) + tol(cap), at=0)
        b.fix(fx.reduce_work, r, max(short, requested), allocated + requested, at=1)
        return b.done("cap", f"the MPS high-watermark limit ({_fs(cap)}) was reached; the process needed {_fs(need)}", short)
    return b.done(
        "unknown",
        "allocated + other + request stays under the MPS limit; the system itself is out of "
        "memory (unified memory is shared with macOS and other apps)",
    )


def _async(b: Builder) -> Any:
    r = b.r
    X, A, T, F, cap = r.requested or 0, r.allocated, r.total, r.free, r.cap
    b.fix(fx.native_backend, r)
    b.fix(fx.expandable_segments, r, b.platform, None)
    b.fix(fx.max_split_size, r, b.platform)
    if A is None or T is None:
        return b.done("unknown", "the cudaMallocAsync message was cut before its figures")
    b.ev(f"currently allocated (live tensors): {_fs(A)}")
    if F is not None:
        b.ev(f"free according to CUDA: {_fs(F)}")
    if cap is not None and cap < UNLIMITED:
        b.ev(f"PyTorch limit (memory fraction): {_fs(cap)}")
        if A + X > cap - tol(cap):
            b.fix(fx.raise_fraction, r, A + X, at=0)
            return b.done("cap", f"live tensors + request ({_fs(A + X)}) exceed the per-process limit {_fs(cap)}", A + X - cap)
    else:
        b.ev("PyTorch limit: none (SIZE_MAX printed)")
    if A + X > T:
        b.fix(fx.reduce_work, r, A + X - T, A + X, at=0)
        return b.done("shortage", f"live tensors + request ({_fs(A + X)}) exceed the device ({_fs(T)})", A + X - T)
    outside = T - (F or 0) - A
    b.ev(f"held outside live tensors: {_fs(outside)} (the async pool's cache, other processes, the CUDA context)")
    b.fix(fx.check_unlisted_users, r, outside, X - (F or 0), at=1)
    return b.done(
        "unknown",
        f"{_fs(outside)} of the device is neither free nor in live tensors, and the "
        "cudaMallocAsync message does not say whether its pool cache or other processes hold it",
        max(0, X - (F or 0)),
    )


def _within_cap(b: Builder, X: int, A: int, R: int, U: int, F: int | None, cap: int) -> Any:
    """The verdict of an OOM under a per-process cap, within that cap.

    What the figures decide: live tensors + request above the cap is a shortage no setting can fix;
    cached free memory covering the request is fragmentation. In between (the bytes exist within the
    cap, but only as cached pieces plus headroom) a setting may serve this request; whether the rest
    of the run then fits, no message can tell: a recording under the same cap settles it.
    """
    r, plat, full = b.r, b.platform, b.full
    need, live = R + X, A + X
    b.contributing.append("cap")
    if full:
        b.ev(
            f"reserved + request = {_fs(need)} > limit {_fs(cap)}"
            + (" (equal within the printed precision)" if need <= cap else "")
        )
    room = f" while the device still had {_fs(F)} free" if full and F is not None and F >= X else ""
    if live > cap + tol(cap) + tol(A) + tol(X):
        short = live - cap
        if full:
            b.ev(
                f"live tensors {_fs(A)} + request {_fs(X)} = {_fs(live)} > limit {_fs(cap)}: no allocator setting "
                "can serve it within the limit"
            )
        b.fix(fx.reduce_work, r, short, live)
        b.fix(fx.raise_fraction, r, need)
        b.fix(fx.gc_threshold, r)
        return b.done(
            "shortage",
            lambda: (
                f"within the per-process limit {_fs(cap)}{room}: the live tensors and the "
                f"request ({_fs(live)}) exceed it by {_fs(short)}; no allocator setting helps"
            ),
            short,
        )
    if full:
        b.ev(f"live tensors {_fs(A)} + request {_fs(X)} = {_fs(live)} <= limit {_fs(cap)}: the bytes exist within it")
        b.ev(
            "not decided by the message: whether the rest of the run fits within the limit under another setting; "
            f"run it under the same limit with `alloctune run --budget {cap}B --on-oom snapshot -- YOUR_COMMAND` "
            "and diagnose the snapshot it writes: the replays answer exactly, setting by setting"
        )
    b.fix(fx.expandable_segments, r, plat, U + max(cap - R, 0), enough=True)
    b.fix(fx.max_split_size, r, plat)
    b.fix(fx.record_snapshot, r)
    b.fix(fx.raise_fraction, r, need)
    b.fix(fx.gc_threshold, r)
    if U + tol(U) + tol(X) >= X:
        if full:
            b.ev(f"reserved but unallocated {_fs(U)} >= request {_fs(X)}: cached, but no single free block is large enough")
        return b.done(
            "fragmentation",
            lambda: (
                f"within the per-process limit {_fs(cap)}: {_fs(U)} is cached but "
                f"split into pieces smaller than the {_fs(X)} request"
            ),
            0,
        )
    return b.done(
        "fragmentation",
        lambda: (
            f"within the per-process limit {_fs(cap)}: cached pieces ({_fs(U)}) and "
            f"the headroom under the limit ({_fs(max(cap - R, 0))}) together cover the {_fs(X)} request, but "
            "neither does alone"
        ),
        0,
    )


# The native caching allocator's verdict, in steps: the figures as evidence, a cap's verdict within
# it, the cases no allocator rule explains, fragmentation, then who holds what is missing.


def _native(b: Builder) -> Any:
    r = b.r
    X = r.requested or 0
    T, F, A, R, U, cap = r.total, r.free, r.allocated, r.reserved, r.reserved_unallocated, r.cap
    if b.full:
        _native_evidence(b)
    cap_active = cap is not None and T is not None and cap < T - tol(T) and cap < UNLIMITED
    if b.full and cap is not None and cap_active:
        b.ev(f"per-process limit: {_fs(cap)} ({100 * cap / T:.3g}% of the device)")

    if U is None and r.vendor == "xpu" and T is not None and (F is None or F >= X):
        pass  # handled by the XPU branch below
    elif U is None or A is None:
        b.fix(fx.record_snapshot, r)
        return b.done("unknown", "the message was cut before the allocated/reserved figures")

    # A cap is usually set on purpose (a shared GPU, a serving engine's memory fraction), so "the cap
    # was hit" is no answer: the question is whether the work fits *within* it.
    if cap_active and R is not None and R + X > cap - tol(cap) - tol(R):
        return _within_cap(b, X, A or 0, R, U or 0, F, cap)  # type: ignore[arg-type]
    unexplained = _unexplained(b, X, F, U, T)
    if unexplained is not None:
        return unexplained

    U = U or 0
    Fv = F or 0
    margin = _margin(F, X, T)
    if F is not None and F >= X:
        # Free but within a few percent of the device: drivers keep a reserve and hand out whole pages,
        # so this is not dependable room (e.g. 41.56 MiB free refusing 32 MiB on a 4 GiB card).
        if b.full:
            b.ev(
                f"device free {_fs(F)} exceeds the {_fs(X)} request by only {_fs(F - X)}, less than {_fs(margin)} "
                "(5% of the device, at most 1 GiB): it is measured after the failure and drivers keep a reserve "
                "and hand out whole pages, so the device was effectively full and this free memory is not counted "
                "as room"
            )
        b.contributing.append("device effectively full")
        Fv = 0
    frag = _fragmented(b, X, U, F, Fv, A or 0)
    if frag is not None:
        return frag
    return _out_of_reach(b, X, U, F, Fv, A or 0, R)


def _native_evidence(b: Builder) -> None:
    """The figures of a native-allocator message, as evidence lines."""
    r = b.r
    T, F, A, R, U = r.total, r.free, r.allocated, r.reserved, r.reserved_unallocated
    if A is not None:
        b.ev(f"allocated by PyTorch: {_fs(A)}" + (f" (incl. private pools' {_fs(r.private_pools)})" if r.private_pools else ""))
    if R is not None:
        b.ev(f"reserved by PyTorch: {_fs(R)}" + (" (derived: allocated + unallocated)" if "reserved" in r.derived else ""))
    if U is not None:
        b.ev(
            f"reserved but unallocated: {_fs(U)}"
            + (" (derived: reserved - allocated)" if "reserved_unallocated" in r.derived else "")
        )
    if F is not None:
        b.ev(f"device free: {_fs(F)}")
    if r.process_in_use is not None:
        b.ev(f"this process in use (NVML, incl. CUDA context): {_fs(r.process_in_use)}")
        if R is not None and r.process_in_use + tol(r.process_in_use) < R:
            b.ev(
                f"NVML's figure for this process is below its reserved {_fs(R)}: NVML cannot see its usage "
                "(typical in containers without the host PID namespace), so it is ignored"
            )
    for pid, size in r.other_processes:
        b.ev(f"process {pid}: {_fs(size)}")
    if T is not None and A is not None and A > T + tol(A) + tol(T):
        b.ev(
            f"allocated ({_fs(A)}) exceeds the device capacity ({_fs(T)}): the driver is spilling into shared "
            "system memory (Windows' CUDA sysmem fallback)"
        )


def _margin(F: int | None, X: int, T: int | None) -> int:
    """How much free memory beyond the request counts as dependable room (pages, the driver's reserve)."""
    return max(tol(F) + tol(X) + _GRANULE, min((T or 0) // 20, GiB))


def _unexplained(b: Builder, X: int, F: int | None, U: int | None, T: int | None) -> Any:
    """The verdict when the device had room: XPU's per-allocation limit, or nothing any allocator
    rule explains; None otherwise."""
    r = b.r
    if r.vendor == "xpu" and (F is None or F >= X) and (U or 0) < X:
        if b.full:
            b.ev("the device had room (or reported none) yet refused a single allocation")
        b.fix(fx.split_below_allocation_limit, r)
        return b.done(
            "cap",
            lambda: (
                f"XPU refused a single {_fs(X)} allocation with the device "
                f"{'free' if F else 'not full'}: Intel GPU drivers cap the size of one allocation (often 4 GiB); "
                "split the tensor"
            ),
            None,
        )
    if F is not None and F >= X + _margin(F, X, T):
        if b.full:
            b.ev(
                f"device free {_fs(F)} >= request {_fs(X)}, and no per-process limit is printed: the final "
                "cudaMalloc after releasing the cache should have succeeded"
            )
        b.fix(fx.record_snapshot, r)
        b.fix(fx.empty_cache_note, r)
        return b.done(
            "unknown",
            lambda: (
                f"the device reports {_fs(F)} free, more than the {_fs(X)} requested, and "
                "no limit is printed: the failure came from outside the allocator's arithmetic (memory taken "
                "and released by another process in between, a driver limit, or a limit set without PyTorch)"
            ),
        )
    return None


def _fragmented(b: Builder, X: int, U: int, F: int | None, Fv: int, A: int) -> Any:
    """Fragmentation: the cached bytes (or cached + free) cover the request; None otherwise."""
    r, plat, full = b.r, b.platform, b.full
    if full and X <= 2 * MiB and r.vendor in ("cuda", "hip") and U:
        b.ev(
            "a request of <= 1 MiB is served by the small pool (2 MiB segments): free blocks of the large pool "
            "cannot serve it, however large"
        )
    if U + tol(U) + tol(X) >= X:
        if full:
            b.ev(
                f"reserved but unallocated {_fs(U)} >= request {_fs(X)}: the bytes are cached, but no single free "
                "block is large enough"
            )
        short = max(0, X - Fv)

        def reason() -> str:
            return f"{_fs(U)} is cached but split into pieces smaller than the {_fs(X)} request"
    elif F is not None and U + Fv + tol(U) + tol(Fv) >= X:
        if full:
            b.ev(f"unallocated {_fs(U)} + device free {_fs(Fv)} = {_fs(U + Fv)} >= request {_fs(X)}: enough bytes, in pieces")
        short = X - Fv

        def reason() -> str:
            return (
                f"cached pieces ({_fs(U)}) and device free memory ({_fs(Fv)}) together cover the {_fs(X)} "
                "request, but neither does alone"
            )
    else:
        return None
    b.fix(fx.expandable_segments, r, plat, U + Fv, enough=True)
    b.fix(fx.max_split_size, r, plat)
    b.fix(fx.reduce_work, r, short, A + X)
    b.fix(fx.empty_cache_note, r)
    b.fix(fx.gc_threshold, r)
    return b.done("fragmentation", reason, short)


def _out_of_reach(b: Builder, X: int, U: int, F: int | None, Fv: int, A: int, R: int | None) -> Any:
    """Not enough in reach of this process: other processes (contention), or the work itself (shortage)."""
    r, plat, full = b.r, b.platform, b.full
    short = X - U - Fv  # missing even if every cached byte and free byte were joined
    effectively_full = Fv != (F or 0)

    def full_text() -> str:
        if not effectively_full:
            return ""
        return f"the device was effectively full ({_fs(F or 0)} free for a {_fs(X)} request); "

    if full:
        b.ev(
            f"missing even with cached + free memory joined: {_fs(short)}"
            if not effectively_full
            else f"missing with the cached memory, not counting the device's last {_fs(F or 0)}: {_fs(short)}"
        )
    others = r.other_processes_total
    self_pid = _probable_self(r)
    if self_pid is not None:
        size = dict(r.other_processes)[self_pid]
        others -= size
        if full:
            b.ev(
                f"process {self_pid} ({_fs(size)} >= this process's reserved {_fs(R or 0)}) is probably this "
                "process: the message has no 'this process' line, which happens when NVML cannot map PIDs "
                "(Windows, containers)"
            )
    if others > 0 and others + tol(others) >= short:
        if full:
            b.ev(f"other processes hold {_fs(others)}")
        b.fix(fx.free_processes, r, short, exclude=self_pid)
        b.fix(fx.reduce_work, r, short, A + X)
        if U:
            b.fix(fx.expandable_segments, r, plat, U + Fv)
        return b.done(
            "contention", lambda: f"{full_text()}other processes hold {_fs(others)}; {_fs(short)} of it would be enough", short
        )
    held = _held_elsewhere(b, short, others, full_text)
    if held is not None:
        return held
    b.fix(fx.reduce_work, r, short, A + X, at=0)
    if U:
        b.fix(fx.expandable_segments, r, plat, U + Fv)
    if others > 0:
        b.fix(fx.free_processes, r, short, exclude=self_pid)
    b.fix(fx.empty_cache_note, r)
    T = r.total
    return b.done(
        "shortage",
        lambda: (
            f"{full_text()}the process needs {_fs(short)} more than it could reach "
            f"(live {_fs(A)} + request {_fs(X)} on a {_fs(T) if T else '?'} device)"
        ),
        short,
    )


def _held_elsewhere(b: Builder, short: int, others: int, full_text: Callable[[], str]) -> Any:
    """Contention the message shows only indirectly: memory used by nothing NVML listed, or outside
    this process's allocator (messages that predate per-process lines); None otherwise."""
    r = b.r
    T, F, R, A, X = r.total, r.free, r.reserved, r.allocated or 0, r.requested or 0
    if T is not None and F is not None and r.process_in_use is not None and R is not None and r.process_in_use >= R:
        unlisted = T - F - r.process_in_use - others
        if unlisted > 0 and b.full:
            b.ev(f"in use by nothing NVML listed (other containers, the display): {_fs(unlisted)}")
        if unlisted + others >= short and unlisted > tol(T):
            b.fix(fx.check_unlisted_users, r, unlisted + others, short)
            b.fix(fx.reduce_work, r, short, A + X)
            return b.done(
                "contention",
                lambda: f"{full_text()}{_fs(unlisted + others)} of the device is held by processes other than this one",
                short,
            )
    elif T is not None and F is not None and R is not None and not r.other_processes:
        outside = T - F - R
        if outside > 0 and b.full:
            b.ev(f"outside this process's allocator: {_fs(outside)} (CUDA context, libraries, other processes)")
        if outside >= short and outside > R:
            # Far more than any context: someone else holds it (the message predates per-process lines).
            b.fix(fx.check_unlisted_users, r, outside, short)
            b.fix(fx.reduce_work, r, short, A + X)
            return b.done(
                "contention",
                lambda: (
                    f"{full_text()}{_fs(outside)} of the device is used outside this "
                    f"process's PyTorch memory ({_fs(R)}), more than the process itself holds"
                ),
                short,
            )
        if outside >= short:
            b.contributing.append("possible contention")
            b.fix(fx.check_unlisted_users, r, outside, short)
    return None
