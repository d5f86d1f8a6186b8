"""Synthetic programs with known size laws, for the capacity-planning tests.

Each returns the `Trace` a recording at input size x would give: the requests of a small
transformer-like forward pass whose byte counts follow a law the test knows exactly.
"""

from __future__ import annotations

from alloctune.trace.model import ALLOC, EMPTY_CACHE, FREE, RequestStream, Trace

MiB = 1 << 20
HIDDEN = 1024
HEADS = 8


class _Rec:
    def __init__(self) -> None:
        self.req = RequestStream()
        self.next_rid = 0

    def alloc(self, size: int, stream: int = 0) -> int:
        rid = self.next_rid
        self.next_rid += 1
        self.req.append(ALLOC, size, rid, stream, len(self.req))
        return rid

    def free(self, rid: int, stream: int = 0) -> None:
        self.req.append(FREE, -1, rid, stream, len(self.req))

    def empty_cache(self) -> None:
        self.req.append(EMPTY_CACHE, -1, -1, 0, len(self.req))


def program(x: int, *, law: str = "mixed", layers: int = 6, branch_at: int | None = None, items: int = 2) -> Trace:
    """A forward pass over `items` inputs of size x.

    law: "linear" (activations only), "quadratic" (attention scores only), "mixed" (both), "cubic"
    (activations and a cubic term).
    branch_at: from this size on every layer also takes a 32 MiB workspace (a kernel chosen by shape).
    """
    r = _Rec()
    weights = [r.alloc(3 * HIDDEN * HIDDEN * 2 + 512 * k) for k in range(layers)]
    for _ in range(items):
        act = r.alloc(2 * HIDDEN * x + 4096)
        for _layer in range(layers):
            tmp = []
            if law in ("linear", "mixed", "cubic"):
                tmp.append(r.alloc(2 * 4 * HIDDEN * x))  # feed-forward up-projection
            if law in ("quadratic", "mixed"):
                tmp.append(r.alloc(2 * HEADS * x * x))  # attention scores
                tmp.append(r.alloc(HEADS * x * x + 12 * x))  # softmax mask / lse (mixed terms)
            if law == "cubic":  # a term no quadratic extrapolates (fitted on three sizes, it is off at a fourth)
                tmp.append(r.alloc(x * x * x // 8))
            if branch_at is not None and x >= branch_at:
                ws = r.alloc(32 * MiB)
                r.free(ws)
            out = r.alloc(2 * HIDDEN * x + 4096)
            for t in tmp:
                r.free(t)
            r.free(act)
            act = out
        r.free(act)
        r.empty_cache()
    for w in weights:
        r.free(w)
    return Trace(source=f"synthetic-{law}@{x}", device=0, requests=r.req, segment_events=[],
                 allocator_settings={}, total_memory=150_109_880_320)


def snapshot(trace: Trace) -> dict:
    """A `_dump_snapshot`-shaped dict of the trace's allocs and frees (no segment events, no empty_cache)."""
    events = []
    addr = {}
    for op, size, rid, stream in trace.requests:
        if op == ALLOC:
            addr[rid] = 0x7F0000000000 + (rid << 32)
            events.append({"action": "alloc", "addr": addr[rid], "size": size, "stream": stream, "time_us": 0})
        elif op == FREE:
            a = addr.pop(rid)
            for action in ("free_requested", "free_completed"):
                events.append({"action": action, "addr": a, "size": 0, "stream": stream, "time_us": 0})
    return {"segments": [], "device_traces": [events], "allocator_settings": {}}
