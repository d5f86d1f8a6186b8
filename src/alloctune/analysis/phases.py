"""Phases of a training step: forward, backward, optimizer step, zero_grad, other.

Every allocation gets one phase, so bytes by phase conserve like categories and sites do.
The phase comes, in this order, from
1. the recording's annotations (`RequestStream.annotations`): torch's own `Optimizer.step#...`
   and `Optimizer.zero_grad#...` ranges, and a user's `record_function` range whose name says a
   phase ("forward", "backward", "optimizer"/"step", "zero_grad"); the innermost range wins;
2. the allocation's Python stack: no frames at all in a recording that kept stacks and trains is
   autograd's backward thread (in one that does not train, such a block is `other`);
   `torch/autograd` frames (the main thread's part of `loss.backward()`) and
   activation checkpointing's recomputation are backward; frames in `torch/optim` are the
   optimizer step (its `zero_grad` function: zero_grad); a module's `__call__` is forward;
3. otherwise `other` (data loading, the loss outside a module, set-up).
A recording without stacks or annotations has every allocation in `other`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from alloctune.trace.model import ALLOC, Annotation, RequestStream, StackTable

FORWARD, BACKWARD, OPTIMIZER_STEP, ZERO_GRAD, OTHER = "forward", "backward", "optimizer_step", "zero_grad", "other"
PHASES = (FORWARD, BACKWARD, OPTIMIZER_STEP, ZERO_GRAD, OTHER)


@dataclass(frozen=True)
class PhaseBytes:
    """Live bytes at a moment made in one phase (`name` one of PHASES, or `rounding`: the allocator's
    rounding of all live blocks, which belongs to no phase; the rows sum to allocated bytes)."""

    name: str
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.bytes}


def annotation_phase(name: str) -> str | None:
    """The phase a range's name says, or None (a range of the user's that names no phase)."""
    low = name.lower()
    if low.startswith("optimizer.zero_grad") or "zero_grad" in low:
        return ZERO_GRAD
    if low.startswith("optimizer.step") or "optimizer" in low:
        return OPTIMIZER_STEP
    if "backward" in low:
        return BACKWARD
    if "forward" in low:
        return FORWARD
    return None


def _frame_phase(filename: str, func: str) -> str | None:
    f = filename.replace("\\", "/")
    if "torch/optim/" in f:
        return ZERO_GRAD if func == "zero_grad" else OPTIMIZER_STEP
    if "torch/autograd/" in f or (f.endswith("torch/_tensor.py") and func == "backward"):
        return BACKWARD
    if f.endswith("torch/utils/checkpoint.py") and ("unpack" in func or "recompute" in func or func == "backward"):
        return BACKWARD
    return None


def stack_phases(table: StackTable) -> list[str]:
    """The phase each stack of the table says (`OTHER` when its frames say none)."""
    frames = table.frames
    out = []
    for st in table.stacks:
        phase = None
        for fid in reversed(st):  # outermost first: backward() called from a forward hook is still backward
            p = _frame_phase(frames[fid][0], frames[fid][2])
            if p is not None:
                phase = p
                break
        if phase is None:
            forward = any(
                frames[fid][0].replace("\\", "/").endswith("torch/nn/modules/module.py")
                and frames[fid][2] in ("_call_impl", "_wrapped_call_impl")
                for fid in st
            )
            phase = FORWARD if forward else OTHER
        out.append(phase)
    return out


def _annotation_index(annotations: Sequence[Annotation], n: int) -> list[str | None]:
    """Per request: the phase of the innermost (latest started, still open) phase-naming range around
    it, None where there is none. One sweep: O(requests + ranges), whatever the ranges' nesting."""
    ranges = sorted(
        ((a.start, a.end, p) for a in annotations if (p := annotation_phase(a.name)) is not None), key=lambda x: (x[0], -x[1])
    )
    out: list[str | None] = [None] * n
    open_ranges: list[tuple[int, int, str]] = []
    k = 0
    for r in range(n):
        while k < len(ranges) and ranges[k][0] <= r:
            open_ranges.append(ranges[k])
            k += 1
        while open_ranges and open_ranges[-1][1] <= r:
            open_ranges.pop()
        if open_ranges:
            out[r] = open_ranges[-1][2]
    return out


def trains(req: RequestStream, per_stack: Sequence[str] | None = None) -> bool:
    """Whether a recording trains: the main thread called into `torch.autograd` (loss.backward()
    allocates its first gradient there) or into an optimizer, by its frames or its annotations.
    `per_stack`: `stack_phases` of its table, when the caller has them."""
    if any(annotation_phase(a.name) in (BACKWARD, OPTIMIZER_STEP) for a in req.annotations):
        return True
    table = req.stack_table
    if table is None or table.dropped:
        return False
    if per_stack is None:
        per_stack = stack_phases(table)
    return any(p in (BACKWARD, OPTIMIZER_STEP, ZERO_GRAD) for p in per_stack)


def allocation_phases(req: RequestStream) -> list[str]:
    """The phase of every ALLOC request, in allocation order (module doc)."""
    n = len(req)
    by_range = _annotation_index(req.annotations, n) if req.annotations else None
    table, ids = req.stack_table, req.stack_ids
    per_stack = stack_phases(table) if table is not None and not table.dropped else None
    frameless = BACKWARD if per_stack is not None and trains(req, per_stack) else OTHER
    out = []
    for r, op in enumerate(req.ops):
        if op != ALLOC:
            continue
        p = by_range[r] if by_range is not None else None
        if p is None and per_stack is not None and ids is not None:
            sid = ids[r]
            p = frameless if sid < 0 else per_stack[sid]
        out.append(p or OTHER)
    return out


def phase_at(req: RequestStream, phases: Sequence[str], request: int) -> str:
    """The phase the program is in after request `request`: that of the innermost phase-naming range
    around it, else that of the last allocation made at or before it."""
    if req.annotations:
        p = _annotation_index(req.annotations, request + 1)[request] if request >= 0 else None
        if p is not None:
            return p
    allocs = 0
    last = -1
    for r in range(min(request, len(req) - 1) + 1):
        if req.ops[r] == ALLOC:
            last = allocs
            allocs += 1
    return phases[last] if 0 <= last < len(phases) else OTHER
