"""Fallible requests: which allocations a program gives up on under memory pressure, and
what it asks for instead.

Why: cuDNN asks for a convolution workspace and, when that allocation fails, tries its
other algorithms (each with its own workspace, many equally large, the last usually with
none) and goes on; the allocator records each failure as an `oom` and the run completes.
Replaying the uncapped recording treats that workspace as a fixed need, so the simulated
smallest budget of a convolution workload comes out too high (HuBERT: +12 % / +32 %).

Two sources of evidence, used together:

* **Frames** (a recording made with C++ stacks): an allocation whose stack passes through
  cuDNN / MIOpen is a workspace, hence fallible. This says *which* requests may fail, not
  what replaces them; without a calibration the replacement is the algorithm without a
  workspace (modelled as `NO_WORKSPACE`, see below), which cuDNN always has.
* **Calibration** (the same program recorded under a cap): aligning the capped stream with
  the uncapped one turns each failed request into the requests that replaced it, giving a
  ladder per requested size: the smaller sizes it tried, in order, then what it settled on.

A cap presses only the requests at the peak, so a calibration shows a few calls of a convolution
fall back; `generalise` carries their ladders to the other calls of the same Python call site
(scaled to each request), and says so in the model's dict and the note. Requests covered by none
of this are assumed fixed, and every output that rests on such a trace says so (`untagged_note`).
Pure Python: no torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from alloctune.schema import schema_id
from alloctune.trace.model import ALLOC, EMPTY_CACHE, FAILED_ALLOC, FREE, RequestStream, Trace
from alloctune.units import MiB, format_size

SCHEMA = schema_id("fallible")
# "Ran without a workspace": the replay stores one block per request, so the no-memory choice
# is modelled as a 1-byte request (one 512-byte block in the small pool, which nearly always
# has a free block in an existing 2 MiB segment): an error of at most one small segment.
NO_WORKSPACE = 1
# C++ frames of the workspace allocations that fall back when they fail: cuDNN's plan loop
# (frontend / v8: run_conv_plan inside try_configs / try_plans), the v7 `Workspace` struct,
# MIOpen's. Not `cudnn_convolution` alone: the convolution's output is allocated there too,
# and it is not fallible; nor cuBLAS(Lt) workspaces, allocated once and never retried.
FALLIBLE_FRAME = re.compile(r"run_conv_plan|try_configs|try_plans|native::Workspace::Workspace|miopen.*workspace", re.I)
# Matching allocations after a failure that show the program went on (see learn_from_calibration).
CONFIRM = 4
# A scratch request this large that no evidence covers is named in the untagged note.
SCRATCH_MIN = 1 * MiB


@dataclass(frozen=True)
class FallbackModel:
    """What the program asks for when a request of a given size fails.

    `ladders[size]`: the sizes tried after a failed request of `size` bytes, in order (the
    last one is what the program settled on). `tagged_sizes`: sizes whose stack says
    "workspace" although no calibration showed what replaces them.
    """

    ladders: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    tagged_sizes: frozenset[int] = frozenset()
    tagged_requests: frozenset[int] = frozenset()  # request indices (valid for the trace the frames came from)
    method: str = "none"  # none | frames | calibration | frames+calibration
    calibration_cap: int | None = None
    aligned_requests: int = 0  # capped requests explained by the alignment
    unaligned_requests: int = 0  # capped requests after the alignment lost track (not learned from)
    conflicts: int = 0  # sizes seen with two different replacements (the first is kept)
    # Requests of a size that had failed before, asked for smaller at once (the library cached
    # its fallback). The replay retries the full size first: it may hold more memory than the
    # program did there, and releases the cache on a failure the program did not have.
    cached_replacements: int = 0
    # Uncapped request index -> the ladder learned there (a calibration; empty otherwise): where
    # in the program each fallback happened, for traces whose byte sizes differ (plan.fallible).
    sites: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    # `generalise`: request index -> a learned ladder scaled to that request (one of the same kind as a
    # request seen to fall back), valid for the trace of `general_requests` requests it was made for.
    general: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    general_kinds: int = 0  # kinds (call sites, or the workspace shape alone) a ladder was carried over to
    general_by: str = ""  # what made two requests the same kind ("Python stack + workspace shape" | ...)
    general_requests: int = 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "method": self.method,
            "ladders": {str(k): list(v) for k, v in sorted(self.ladders.items())},
            "tagged_sizes": sorted(self.tagged_sizes),
            "tagged_requests": len(self.tagged_requests),
            "calibration_cap": self.calibration_cap,
            "aligned_requests": self.aligned_requests,
            "unaligned_requests": self.unaligned_requests,
            "conflicts": self.conflicts,
            "cached_replacements": self.cached_replacements,
        }
        if self.general:  # only after `generalise`: without it the dict is what it always was
            out["generalised"] = {
                "requests": len(self.general),
                "kinds": self.general_kinds,
                "by": self.general_by,
                "note": generalised_note(len(self.general), self.general_kinds, self.general_by),
            }
        return out


# ---- evidence 1: frames ------------------------------------------------------------------------
def has_cpp_frames(trace: Trace) -> bool:
    """Whether the recording kept C++ frames on its allocations (`stacks="all"`).

    Python frames alone cannot tell a workspace from the convolution's output (both are
    allocated under the same `forward`), so they are no evidence either way.
    """
    for i, op in enumerate(trace.requests.ops):
        if op == ALLOC:
            ev = _event(trace, i)
            if ev is None:
                return False
            return any("::" in str(f.get("name", "")) for f in ev.get("frames") or () if isinstance(f, Mapping))
    return False


def tag_by_frames(trace: Trace) -> set[int]:
    """Request indices of ALLOCs whose stack passes through cuDNN / MIOpen (workspaces)."""
    out = set()
    req = trace.requests
    for i, op in enumerate(req.ops):
        if op != ALLOC:
            continue
        ev = _event(trace, i)
        for fr in (ev or {}).get("frames") or ():
            name = fr.get("name", "") if isinstance(fr, Mapping) else str(fr)
            if FALLIBLE_FRAME.search(name or ""):
                out.add(i)
                break
    return out


def _event(trace: Trace, i: int) -> Mapping[str, Any] | None:
    k = trace.requests.event_index[i] if i < len(trace.requests.event_index) else -1
    return trace.events[k] if 0 <= k < len(trace.events) else None


# ---- evidence 2: a calibration run under a cap ---------------------------------------------------
def _rounds_to(size: int, failed: int) -> bool:
    """Whether a recorded `oom` of `failed` bytes (rounded) is the request of `size` bytes."""
    return size <= failed <= size + max(512, size // 4)


def learn_from_calibration(uncapped: Trace, capped: Trace, *, cap: int | None = None, window: int = 64) -> FallbackModel:
    """Align a capped recording with the uncapped one: every failed request → what replaced it.

    Both recordings are of the same program, so their streams are identical until the first
    failure; after a failed request the capped run asks for smaller sizes (or nothing) and
    then goes on as before. The walk (`_Walk`) matches ALLOCs by size and FREEs through the
    mapping of allocation ids; it skips empty_cache() differences (a capped run releases at
    other moments) and re-synchronises within `window` requests; past a point it cannot
    explain, it stops learning and counts what is left (`unaligned_requests`).
    """
    walk = _Walk(uncapped.requests, capped.requests, window)
    walk.run()
    if cap is None:
        cap = capped.meta.get("cap") if capped.meta else None
    return FallbackModel(
        ladders=walk.ladders,
        method="calibration",
        calibration_cap=int(cap) if cap else None,
        aligned_requests=walk.ic,
        unaligned_requests=len(capped.requests) - walk.ic,
        conflicts=walk.conflicts,
        cached_replacements=walk.sticky,
        sites=walk.sites,
    )


class _Walk:
    """The alignment of `learn_from_calibration`, one named step per kind of request pair.

    A failure counts as survivable only once the program is seen going on in step with the
    uncapped run (CONFIRM matching allocations later); a fatal OOM is followed by clean-up.
    `sites`: uncapped request index -> the ladder learned there (where it failed, or where a
    cached fallback was asked for at once), so a size-parametric trace can place it by position.
    """

    def __init__(self, u: RequestStream, c: RequestStream, window: int) -> None:
        self.u, self.c, self.window = u, c, window
        self.iu = self.ic = 0
        self.rid_map: dict[int, int] = {}  # capped rid -> uncapped rid
        self.dropped: set[int] = set()  # uncapped rids the capped run never allocated (replaced by nothing)
        self.ladders: dict[int, tuple[int, ...]] = {}
        self.sites: dict[int, tuple[int, ...]] = {}
        self.conflicts = self.sticky = 0
        self.pending: tuple[int, tuple[int, ...], int, int] | None = None  # size, ladder, seen, uncapped index
        # the capped run's last allocation: failures after it are the run's death (a fatal OOM)
        self.last_alloc = next((k for k in range(len(c) - 1, -1, -1) if c.ops[k] == ALLOC), -1)

    def run(self) -> None:
        u, c = self.u, self.c
        while self.iu < len(u) and self.ic < len(c):
            uo, co = u.ops[self.iu], c.ops[self.ic]
            if uo == EMPTY_CACHE or (uo == FREE and u.rids[self.iu] in self.dropped):
                self.iu += 1
            elif co == EMPTY_CACHE:
                self.ic += 1
            elif co == FAILED_ALLOC:
                if not self._failure(uo):
                    return  # a failure we cannot attribute: stop learning here
            elif uo == co == ALLOC and u.sizes[self.iu] == c.sizes[self.ic]:
                self._same_alloc()
            elif uo == co == ALLOC and c.sizes[self.ic] < u.sizes[self.iu] and self._failed_before(u.sizes[self.iu]):
                self._cached_fallback()
            elif uo == co == ALLOC and c.sizes[self.ic] < u.sizes[self.iu] and self._back_in_step():
                self._chosen_smaller()
            elif uo == co == FREE and self.rid_map.get(c.rids[self.ic]) == u.rids[self.iu]:
                self.iu += 1
                self.ic += 1
            else:  # out of step: find the capped request again a little further on in the uncapped stream
                j = _resync(u, c, self.iu, self.ic, self.rid_map, self.window)
                if j is None:
                    return
                self.iu = j

    def _failure(self, uo: int) -> bool:
        """A run of failed requests in the capped stream: what the uncapped request became."""
        u, c = self.u, self.c
        tries = []
        while self.ic < len(c) and c.ops[self.ic] == FAILED_ALLOC:
            tries.append(c.sizes[self.ic])
            self.ic += 1
        if uo == FAILED_ALLOC:  # the uncapped run failed too (a program probing memory)
            while self.iu < len(u) and u.ops[self.iu] == FAILED_ALLOC:
                self.iu += 1
            return True
        if uo != ALLOC or not _rounds_to(u.sizes[self.iu], tries[0]):
            self.ic -= len(tries)
            return False
        size = u.sizes[self.iu]
        nxt_u = _next_alloc(u, self.iu + 1)
        if self._died_on_next(tries, size, nxt_u):
            # the program gave the workspace up (settled on none) and went on to its next request, which
            # killed the run: the ladder is survivable evidence; the fatal failure is left for the loop
            self.ic -= 1
            self._commit()
            self.pending = (size, _ladder(size, tries[1:-1], NO_WORKSPACE), 0, self.iu)
            self.dropped.add(u.rids[self.iu])
            self._commit()
            self.iu += 1
            return True
        ic = self.ic
        replaced = ic < len(c) and c.ops[ic] == ALLOC and c.sizes[ic] < size
        if replaced and (nxt_u is None or u.sizes[nxt_u] != c.sizes[ic]):
            settled = c.sizes[ic]
            self.rid_map[c.rids[ic]] = u.rids[self.iu]
            self.ic += 1
        else:
            settled = NO_WORKSPACE
            self.dropped.add(u.rids[self.iu])
        self._commit()  # the program went on to its next (attributable) request
        self.pending = (size, _ladder(size, tries[1:], settled), 0, self.iu)
        self.iu += 1
        return True

    def _died_on_next(self, tries: Sequence[int], size: int, nxt_u: int | None) -> bool:
        """Whether a run of failures ends with the capped run's fatal OOM on the uncapped stream's NEXT
        request: the last try is not this request's size but that next allocation's, and the capped run
        allocated nothing after it (it died there). Then the tries before it are this request's ladder."""
        return (
            len(tries) >= 2
            and self.ic > self.last_alloc
            and nxt_u is not None
            and not _rounds_to(size, tries[-1])
            and _rounds_to(self.u.sizes[nxt_u], tries[-1])
        )

    def _same_alloc(self) -> None:
        self.rid_map[self.c.rids[self.ic]] = self.u.rids[self.iu]
        self.iu += 1
        self.ic += 1
        if self.pending is not None:
            size, ladder, seen, at = self.pending
            self.pending = (size, ladder, seen + 1, at)
            if seen + 1 >= CONFIRM:  # the program went on as before: the failure was survivable
                self._commit()

    def _failed_before(self, size: int) -> bool:
        return size in self.ladders or (self.pending is not None and self.pending[0] == size)

    def _cached_fallback(self) -> None:
        """A size that failed before is now asked for smaller at once: the library cached the
        algorithm it fell back to (cuDNN's plan cache), so no failure is recorded. The program
        went on, so a pending failure was survivable."""
        self._commit()
        self.sites.setdefault(self.iu, (self.c.sizes[self.ic],))
        self.rid_map[self.c.rids[self.ic]] = self.u.rids[self.iu]
        self.sticky += 1
        self.iu += 1
        self.ic += 1

    def _back_in_step(self) -> bool:
        """Whether the two streams agree again right after this pair of allocations: the next request is
        the same allocation, or each stream frees what it just allocated."""
        u, c, iu, ic = self.u, self.c, self.iu + 1, self.ic + 1
        if iu >= len(u) or ic >= len(c) or u.ops[iu] != c.ops[ic]:
            return False
        if u.ops[iu] == ALLOC:
            return bool(u.sizes[iu] == c.sizes[ic])
        return u.ops[iu] == FREE and u.rids[iu] == u.rids[self.iu] and c.rids[ic] == c.rids[self.ic]

    def _chosen_smaller(self) -> None:
        """A request made smaller with no failure before it, the streams in step again after it: the
        library chose a smaller workspace from the free memory it saw under the cap (cuDNN's
        heuristics query it), which is the same evidence as a fallback ladder that settled there."""
        self._commit()
        self.pending = (self.u.sizes[self.iu], (self.c.sizes[self.ic],), 0, self.iu)
        self.rid_map[self.c.rids[self.ic]] = self.u.rids[self.iu]
        self.iu += 1
        self.ic += 1

    def _commit(self) -> None:
        """Keep a confirmed ladder (the first one seen for its size; a different one is a conflict)."""
        if self.pending is None:
            return
        size, ladder, _, at = self.pending
        self.pending = None
        self.sites[at] = ladder
        if size in self.ladders:
            self.conflicts += int(self.ladders[size] != ladder)
        else:
            self.ladders[size] = ladder


def _next_alloc(rs: RequestStream, start: int) -> int | None:
    for k in range(start, min(len(rs), start + 8)):
        if rs.ops[k] == ALLOC:
            return k
    return None


def _ladder(size: int, tries: Sequence[int], settled: int) -> tuple[int, ...]:
    """Every size tried after the first failure, in order, then the settled one.

    Kept whole, repeats and larger sizes included: in the same allocator state they fail as
    well and change no memory, but each is an OOM and a retry the allocator counts, so the
    replay reproduces `num_ooms` / `num_alloc_retries` too (rvc_ec1 capped: 1881 OOMs).
    """
    return (*tries, settled)


def _resync(u: RequestStream, c: RequestStream, iu: int, ic: int, rid_map: dict[int, int], window: int) -> int | None:
    """The uncapped index, within `window`, where the capped request `ic` is found again."""
    op, size = c.ops[ic], c.sizes[ic]
    for j in range(iu + 1, min(len(u), iu + window)):
        if u.ops[j] != op:
            continue
        if op == ALLOC and u.sizes[j] == size:
            return j
        if op == FREE and rid_map.get(c.rids[ic]) == u.rids[j]:
            return j
    return None


# ---- putting the evidence on a trace ------------------------------------------------------------
def model_from_frames(trace: Trace) -> FallbackModel:
    """The fallible requests a recording with C++ frames shows (replacement: no workspace)."""
    if not has_cpp_frames(trace):
        return FallbackModel()
    tagged = tag_by_frames(trace)
    sizes = frozenset(trace.requests.sizes[i] for i in tagged)
    return FallbackModel(tagged_sizes=sizes, tagged_requests=frozenset(tagged), method="frames")


def _longer_ladders(a: Mapping[int, tuple[int, ...]], b: Mapping[int, tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
    """Both models' ladders; where both have one for a size and one goes on from the other (a run under a
    lower cap saw more of the same tries), the longer, whichever model it came from; else `a`'s."""

    def blocks(ladder: tuple[int, ...]) -> list[int]:  # what the allocator makes of each try (512-byte rounding)
        return [-(-n // 512) * 512 for n in ladder]

    out = {**b, **a}
    for size in a.keys() & b.keys():
        la, lb = a[size], b[size]
        if len(lb) > len(la) and blocks(lb[: len(la)]) == blocks(la):
            out[size] = lb
    return out


def combine(a: FallbackModel, b: FallbackModel) -> FallbackModel:
    """Both kinds of evidence: calibrated ladders win, frames add the sizes not calibrated; of two
    calibrations' ladders for one size, the one that saw more tries (`_longer_ladders`), so the order
    the calibrations come in does not change the answer."""
    methods = sorted({m for m in (a.method, b.method) if m != "none"})
    return FallbackModel(
        ladders=_longer_ladders(a.ladders, b.ladders),
        tagged_sizes=a.tagged_sizes | b.tagged_sizes,
        tagged_requests=a.tagged_requests | b.tagged_requests,
        method="+".join(methods) if methods else "none",
        calibration_cap=a.calibration_cap or b.calibration_cap,
        aligned_requests=a.aligned_requests + b.aligned_requests,
        unaligned_requests=a.unaligned_requests + b.unaligned_requests,
        conflicts=a.conflicts + b.conflicts,
        cached_replacements=a.cached_replacements + b.cached_replacements,
        sites={**b.sites, **a.sites},
        general={**b.general, **a.general},
        general_kinds=max(a.general_kinds, b.general_kinds),
        general_by=a.general_by or b.general_by,
        general_requests=a.general_requests or b.general_requests,
    )


def generalise(model: FallbackModel, trace: Trace, *, deepest: bool = False) -> FallbackModel:
    """`model` with its learned ladders carried over to every request of `trace` of the same kind.

    Why: a calibration's cap presses only the requests at the program's peak. HuBERT without
    autograd under a cap failed 59 requests, all of them the first feature-extractor convolution's
    workspace of the three longest clips; the same convolution on the other clips (a workspace of
    another byte size for every clip length) never failed there, so a ladder keyed by size leaves
    them fixed. cuDNN chooses a convolution's algorithms the same way at every call of it, so having
    seen one call give its workspace up, the other calls can too.

    The same kind: a workspace-shaped request (`scratch_requests`: allocated, then freed by the very
    next request) from the same call site (the same Python stack) as a scratch request a ladder was
    learned for. A recording without Python stacks is left as it is: the shape alone would make
    every scratch request of the program one kind (RVC: 1776 requests, the optimistic end). Such a
    request gets a learned ladder of its call site scaled to its size: every try, and the settled
    size, the same fraction of the request; a try below `SCRATCH_MIN` (no workspace, a few KiB) is
    kept as is. Where a call site has several ladders, the one that settled on the largest fraction
    (no workspace only where every one settled there; as `plan.fallible._same_kind`): the cap that
    pressed the least is the one the others' calls are known to survive with.

    `deepest`: the opposite end, kept to measure how far the evidence goes: the ladder that went
    furthest down is taken for every call of the site, and the seen ladders that stopped earlier
    are extended with its further tries (`_beyond`): every call can go as far down as any did. On
    HuBERT without autograd that is the optimistic end (-5.2 % against the real min budget: the real
    program fails at 709.2 MB where this replay completes at 675.3 MB): over-promising, so off by default.
    Requests tagged by frames keep their evidence; the result is for `trace` only (`with_fallbacks`
    ignores it on any other trace).
    """
    req = trace.requests
    scratch = scratch_requests(trace)
    table = req.stack_table
    stacks = req.stack_ids if req.stack_ids is not None and table is not None and not table.dropped else None
    if not model.ladders or not scratch or stacks is None:
        return model
    templates: dict[int, tuple[float, int, tuple[int, ...]]] = {}  # call site -> (settled fraction, size, ladder)
    for i in scratch:
        ladder = model.ladders.get(req.sizes[i])
        if not ladder or stacks[i] < 0:
            continue
        seen = (_settled_fraction(ladder, req.sizes[i]), req.sizes[i], ladder)
        old = templates.get(stacks[i])
        if old is None or (seen[0] < old[0] if deepest else seen[0] > old[0]):
            templates[stacks[i]] = seen
    general: dict[int, tuple[int, ...]] = {}
    for i in scratch:
        size, site = req.sizes[i], stacks[i]
        if site not in templates or i in model.tagged_requests:
            continue
        _, at, template = templates[site]
        scaled = tuple(t if t < SCRATCH_MIN else max(NO_WORKSPACE, math.ceil(t * size / at)) for t in template)
        own = model.ladders.get(size)
        ladder = scaled if own is None else own + _beyond(own, scaled) if deepest else own
        if ladder != own and ladder[-1] < size:
            general[i] = ladder
    if not general:
        return model
    by = "the same Python stack and workspace shape" + (", every call down to the deepest ladder" if deepest else "")
    kinds = len({stacks[i] for i in general})
    return replace(model, general=general, general_kinds=kinds, general_by=by, general_requests=len(req))


def _beyond(own: tuple[int, ...], scaled: tuple[int, ...]) -> tuple[int, ...]:
    """The tries of the deepest ladder (scaled to `size`) after the point where `own` settled: the
    first try at or below `own`'s settled size is the one `own` stopped at; what follows it is what
    the program asks for next when that one fails too ((): `own` went as far down already)."""
    stop = next((j for j, t in enumerate(scaled) if t <= own[-1]), None)
    if stop is None or scaled[-1] >= own[-1]:
        return ()
    return scaled[stop + 1 :] if stop + 1 < len(scaled) else scaled[-1:]


def _settled_fraction(ladder: Sequence[int], size: int) -> float:
    """What a ladder settled on, as a fraction of its request (0: no workspace, or a few KiB)."""
    return 0.0 if ladder[-1] < SCRATCH_MIN else ladder[-1] / size


def generalised_note(requests: int, kinds: int, by: str) -> str:
    """The sentence every output that used `generalise` carries."""
    return (
        f"learned fallbacks carried over to {requests} workspace-shaped request(s) of {kinds} call site(s) "
        f"({by}), scaled to each request's size: not seen falling back there"
    )


def with_fallbacks(trace: Trace, model: FallbackModel) -> Trace:
    """A copy of `trace` whose fallible requests carry their fallback sizes (`RequestStream.fallbacks`).

    The model is recorded in `trace.meta["fallible"]` so every later output can say what
    the prediction rests on.
    """
    req = trace.requests
    general = model.general if model.general_requests == len(req) else {}
    fallbacks: dict[int, tuple[int, ...]] = {}
    for i, op in enumerate(req.ops):
        if op != ALLOC:
            continue
        size = req.sizes[i]
        ladder = general.get(i) or model.ladders.get(size)  # a generalised ladder extends a learned one
        if ladder is None and i in model.tagged_requests and size > NO_WORKSPACE:
            ladder = (NO_WORKSPACE,)
        if ladder:
            fallbacks[i] = ladder
    stream = replace(req, fallbacks=fallbacks)
    meta = {**(trace.meta or {}), "fallible": {**model.to_dict(), "requests": len(fallbacks)}}
    return replace(trace, requests=stream, meta=meta)


def scratch_requests(trace: Trace, min_size: int = SCRATCH_MIN) -> list[int]:
    """ALLOCs of at least `min_size` freed by the very next request: the shape of a workspace.

    A cuDNN workspace is allocated, used by one kernel and freed before anything else is
    allocated. On the HuBERT recording with C++ stacks the requests of 1 MiB or more that the
    frames tag as workspaces are exactly these; transformer decoding has none. So these are
    the requests a program might give up under a cap; every other request is its data.
    """
    r = trace.requests
    ops, sizes, rids = r.ops, r.sizes, r.rids
    return [
        i
        for i in range(len(ops) - 1)
        if ops[i] == ALLOC and sizes[i] >= min_size and ops[i + 1] == FREE and rids[i + 1] == rids[i]
    ]


def optimistic(trace: Trace) -> Trace:
    """`trace` with every uncovered scratch request fallible down to no workspace.

    Why: when nothing says whether a workspace-shaped request can fail, the replay as
    recorded is the pessimistic end (every such request a fixed need) and this is the
    optimistic one (the program gives each of them up). The real smallest budget of the
    program lies between the two, so the tuner can bracket it on the GPU instead of
    creeping down from the pessimistic estimate. Requests already covered by a learned
    ladder or by frames keep their model.
    """
    fallbacks = dict(trace.requests.fallbacks)
    sizes = trace.requests.sizes
    for i in scratch_requests(trace):
        if i not in fallbacks and sizes[i] > NO_WORKSPACE:
            fallbacks[i] = (NO_WORKSPACE,)
    if len(fallbacks) == len(trace.requests.fallbacks):
        return trace
    return replace(trace, requests=replace(trace.requests, fallbacks=fallbacks))


def untagged_note(trace: Trace) -> str | None:
    """One sentence when predictions rest on possible workspaces no evidence covers, else None."""
    info = (trace.meta or {}).get("fallible") or {}
    method = info.get("method", "none")
    if "frames" in str(method):
        return None  # every allocation's C++ stack was seen: the untagged ones are not workspaces
    covered = {int(k) for k in (info.get("ladders") or {})}
    sizes = trace.requests.sizes
    general = trace.requests.fallbacks if info.get("generalised") else {}  # `generalise` covered these by index
    open_ = sum(1 for i in scratch_requests(trace) if sizes[i] not in covered and i not in general)
    if not open_:
        return None
    how = (
        f"fallbacks learned for {len(covered)} size(s) from a run capped at "
        f"{format_size(int(info['calibration_cap'])) if info.get('calibration_cap') else 'an unknown cap'}"
        if method == "calibration"
        else "no C++ stack frames, no calibration run"
    )
    if info.get("generalised"):
        how += f", carried over to {info['generalised']['requests']} request(s) of the same call site"
    return (
        f"{open_} request(s) of {SCRATCH_MIN // MiB} MiB or more are freed right after allocation, like a cuDNN "
        f"workspace the program may give up under a cap, and nothing says whether it can ({how}): simulated as "
        "fixed, so min budgets may be high"
    )


def fallible_summary(trace: Trace) -> dict[str, Any]:
    """Counts for tables and JSON: fallible requests, learned sizes, the note."""
    info = (trace.meta or {}).get("fallible") or {}
    return {
        "method": info.get("method", "none"),
        "fallible_requests": len(trace.requests.fallbacks),
        "learned_sizes": len(info.get("ladders") or {}),
        **({"generalised": info["generalised"]} if info.get("generalised") else {}),
        "note": untagged_note(trace),
    }
