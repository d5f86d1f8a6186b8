"""Repetitions (training steps, loop iterations, decode steps, service calls) found in the
recording itself.

A program that repeats work allocates the same things in the same order each time, so some
allocation recurs once per repetition at a steady rhythm. Each allocation gets a key (its
stack id when the recording has stacks, else its requested size); a key is a candidate
*anchor* when it recurs at least 3 times, its occurrences span at least half the
allocations, and at least 75 % of the gaps between them (counted in allocations) are within
5 % of the median gap (25 % for a stack: a call path is specific enough to allow a loop over
inputs of changing shape, whose first line recurs once per step while the number of allocations
between changes a little), and they are spread evenly over the span (not bursts). The anchor with the fewest
occurrences is the coarsest rhythm (one step rather than one layer); among those, the one that comes first in the recording is the
step's start (the first thing the loop allocates, e.g. its input batch). Repetition k runs from the
anchor's k-th occurrence to the next (the last one to the end of the recording); what comes
before the first is set-up (building the model, loading weights).

Callers may pass the boundaries themselves (an agent that marks steps), as request indices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from alloctune.trace.model import ALLOC, FREE, RequestStream

MIN_REPEATS = 3
MIN_COVERAGE = 0.5
REGULAR_SHARE = 0.75
GAP_TOLERANCE = 0.05
LOOSE_GAP_TOLERANCE = 0.25
EVEN_SHARE = 0.75
VALLEY_TOLERANCE = 0.05


@dataclass(frozen=True)
class Repeats:
    """Repetition boundaries as request indices (repetition k = [starts[k], starts[k+1]))."""

    starts: tuple[int, ...]
    end: int  # one past the last request
    how: str  # how they were found
    anchor: str | None = None  # the recurring allocation that marks them

    @property
    def count(self) -> int:
        return len(self.starts)

    def index_of(self, request_index: int) -> int:
        """The repetition a request belongs to (-1: set-up before the first)."""
        import bisect

        return bisect.bisect_right(self.starts, request_index) - 1

    def end_of(self, k: int) -> int:
        """First request index after repetition k."""
        return self.starts[k + 1] if k + 1 < len(self.starts) else self.end

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "starts": list(self.starts), "how": self.how, "anchor": self.anchor}


NONE = Repeats((), 0, "no repeating allocation pattern found")


def find_repeats(req: RequestStream, live_bytes: Sequence[int] | None = None) -> Repeats:
    """The repetitions of a request stream (module doc). `live_bytes[i]` = live requested bytes
    before request i (computed when not given)."""
    ops, sizes = req.ops, req.sizes
    ids = req.stack_ids if req.stack_table is not None and req.stack_table.dropped is None else None
    use_stacks = ids is not None
    positions: dict[int, list[int]] = {}
    alloc_reqs: list[int] = []
    for r, op in enumerate(ops):
        if op == ALLOC:
            key = ids[r] if ids is not None else sizes[r]
            if use_stacks and key < 0:
                key = -1 - sizes[r]  # no frames (backward thread): key by size, kept apart from stack ids
            lst = positions.get(key)
            if lst is None:
                positions[key] = [len(alloc_reqs)]
            else:
                lst.append(len(alloc_reqs))
            alloc_reqs.append(r)
    n_alloc = len(alloc_reqs)
    if n_alloc < 2 * MIN_REPEATS:
        return Repeats((), len(ops), NONE.how)
    if live_bytes is None:
        live_bytes = live_before(req)
    best = None
    if use_stacks:
        # a call path is specific enough to allow a loop over inputs of changing shape: its first
        # line recurs once per step, the number of allocations between changes a little
        best = _anchor({k: v for k, v in positions.items() if k >= 0}, n_alloc, LOOSE_GAP_TOLERANCE)
    if best is None:
        best = _anchor(positions, n_alloc, GAP_TOLERANCE)
    if best is None:
        return _valleys(req, live_bytes)
    c, _, key, pos = best
    starts = tuple(alloc_reqs[p] for p in pos)
    if use_stacks and key >= 0:
        anchor = f"stack {key}"
    else:
        anchor = f"allocation of {key if not use_stacks else -1 - key} bytes"
    return Repeats(starts, len(ops), f"an allocation that recurs {c} times at a steady rhythm ({anchor})", anchor)


def _anchor(positions: dict[int, list[int]], n_alloc: int, tolerance: float) -> tuple[int, int, int, list[int]] | None:
    """The recurring key with the fewest occurrences that marks a steady rhythm (module doc):
    (count, first position, key, positions), or None."""
    best: tuple[int, int, int, list[int]] | None = None
    for key, pos in positions.items():
        c = len(pos)
        if c < MIN_REPEATS or c > n_alloc // 2:
            continue
        if (pos[-1] - pos[0]) < MIN_COVERAGE * n_alloc:
            continue
        gaps = sorted(b - a for a, b in zip(pos, pos[1:]))
        med = gaps[len(gaps) // 2]
        if med < 2:
            continue
        tol = max(1, int(med * tolerance))
        regular = sum(1 for g in gaps if abs(g - med) <= tol)
        if regular < REGULAR_SHARE * len(gaps):
            continue
        if med * (c - 1) < EVEN_SHARE * (pos[-1] - pos[0]):
            continue  # bursts (one layer's op, a few times per step), not a rhythm across the run
        if best is None or (c, pos[0]) < (best[0], best[1]):
            best = (c, pos[0], key, pos)
    return best


def _valleys(req: RequestStream, live: Sequence[int]) -> Repeats:
    """Repetitions from the live-bytes profile, when no allocation recurs at a steady rhythm (shapes
    change every step, the recording has no stacks): a repetition returns to the program's floor
    (what it holds for good: parameters, optimizer state, kept results, so the floor may rise),
    i.e. live bytes within 5 % of the rest of the run's range above the lowest level the rest of
    the run reaches. Each stretch at the floor ends a repetition; the next starts at its lowest point."""
    total = len(req)
    ops = req.ops
    # the run's work ends at its last allocation: what follows is tear-down (frees only), whose
    # empty floor says nothing about the program's floor while it worked
    n = next((r for r in range(total - 1, -1, -1) if ops[r] == ALLOC), -1) + 1
    if n < 2 * MIN_REPEATS:
        return Repeats((), total, NONE.how)
    suffix_min = [0] * (n + 1)
    m = live[n]
    for i in range(n, -1, -1):
        m = min(m, live[i])
        suffix_min[i] = m
    top = max(live[:n])
    starts: list[int] = []
    i = 0
    while i < n:
        tol = max(1, int((top - suffix_min[i]) * VALLEY_TOLERANCE))
        if live[i] <= suffix_min[i] + tol:
            j, low = i, i
            while j < n and live[j] <= suffix_min[j] + max(1, int((top - suffix_min[j]) * VALLEY_TOLERANCE)):
                if live[j] <= live[low]:
                    low = j
                j += 1
            if j < n:  # the run leaves the floor again: a repetition starts at the valley's lowest point
                k = low if i > 0 else j - 1  # (the set-up's stretch is lowest at the empty start: its end)
                while k < n and ops[k] != ALLOC:
                    k += 1
                if k < n:
                    starts.append(k)
            i = j
        else:
            i += 1
    if len(starts) < MIN_REPEATS:
        return Repeats((), total, NONE.how)
    return Repeats(
        tuple(starts),
        total,
        f"live bytes return to the program's floor {len(starts)} times (no allocation recurs at a steady rhythm)",
        "floor of live bytes",
    )


def from_marks(req: RequestStream, marks: Sequence[int]) -> Repeats:
    """Repetitions given by the caller (request indices where each starts)."""
    starts = tuple(sorted({int(m) for m in marks if 0 <= int(m) < len(req)}))
    return Repeats(starts, len(req), "marked by the caller")


def live_before(req: RequestStream) -> list[int]:
    """Live requested bytes before each request (length len(req) + 1: the last is after all)."""
    size_of: dict[int, int] = {}
    out = [0] * (len(req) + 1)
    live = 0
    for i, (op, size, rid) in enumerate(zip(req.ops, req.sizes, req.rids)):
        out[i] = live
        if op == ALLOC:
            size_of[rid] = size
            live += size
        elif op == FREE:
            live -= size_of.pop(rid, 0)
    out[len(req)] = live
    return out


def loop_tops(req: RequestStream, rep: Repeats) -> list[int] | None:
    """Where each repetition's loop body begins again, from the Python stacks: one request index per
    repetition after the first, or None where the stacks cannot tell.

    Why: a program's own `empty_cache()` (or any per-step action) sits at the end of its loop body,
    i.e. just before the body's first allocation of the next step. The anchor that marks repetitions
    is only some allocation that recurs once per step; it can fall mid-body (RVC's recurring block is
    allocated mid-chunk). The loop's own frame says where the body starts over: it is the outermost
    frame of the anchor's stack whose line moves within a repetition; the body begins again where
    that line jumps back (the first allocation of a step runs the body's earliest line)."""
    table, ids = req.stack_table, req.stack_ids
    if table is None or ids is None or table.dropped is not None or rep.count < 2 or not rep.anchor:
        return None
    if not rep.anchor.startswith("stack "):
        return None
    frames = [table.frames[f] for f in table.stacks[int(rep.anchor.split()[1])]]
    allocs = [r for r in range(rep.starts[0], rep.end) if req.ops[r] == ALLOC and ids[r] >= 0]
    for depth in range(len(frames) - 1, -1, -1):  # outermost first
        code = frames[depth][0], frames[depth][2]
        lines = _lines_in(table, ids, allocs, code)
        if lines is None:
            continue
        if len({ln for _, ln in lines}) < 2:
            continue  # this frame stays on one line for the whole loop: the loop is deeper
        return _tops(lines, rep)
    return None


def _lines_in(table: Any, ids: Sequence[int], allocs: Sequence[int], code: tuple[str, str]) -> list[tuple[int, int]] | None:
    """(request, line in the frame of `code`) for every allocation, or None where one misses that frame
    (then it is not the loop's frame: the loop's own frame is on every allocation of its body)."""
    out = []
    line_of: dict[int, int | None] = {}
    for r in allocs:
        s = ids[r]
        ln = line_of.get(s, -1)
        if ln == -1:
            ln = next((table.frames[f][1] for f in table.stacks[s] if (table.frames[f][0], table.frames[f][2]) == code), None)
            line_of[s] = ln
        if ln is None:
            return None
        out.append((r, ln))
    return out


def _tops(lines: Sequence[tuple[int, int]], rep: Repeats) -> list[int] | None:
    """The request where the loop frame's line jumps back to its lowest value last, between each pair of
    anchors: the top of the loop body. None where a window has no jump back."""
    out = []
    k = 0
    for j in range(1, rep.count):
        lo, hi = rep.starts[j - 1], rep.starts[j]
        while k < len(lines) and lines[k][0] <= lo:
            k += 1
        best = None
        prev = lines[k - 1][1] if k else None
        i = k
        while i < len(lines) and lines[i][0] <= hi:
            r, ln = lines[i]
            if prev is not None and ln < prev and (best is None or ln <= best[1]):
                best = (r, ln)
            prev = ln
            i += 1
        if best is None:
            return None
        out.append(best[0])
    return out
