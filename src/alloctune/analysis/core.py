"""The recording analysed as a whole: every allocation's lifetime, repetition, site, phase and growth.

Independent of any moment: `explain` reads it to split the memory at one moment into categories
and sites, and the remedies (`alloctune.remedy`) read it to know where repetitions end, which
blocks a site keeps, which allocations the repeated blocks of a forward pass make and what the
optimizer holds. So it sits below both, and both read one analysis of a recording.

Outlived and kept: a block outlives its repetition when it is still live once that repetition
has ended and a whole repetition's length after it was made; it is kept when the program keeps
blocks like it again and again (a first-time workspace or cache is not). A site grows when its
floor -- its live bytes at each repetition start -- rises across the run.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Sequence

from alloctune.analysis import sites as sitemod
from alloctune.analysis.phases import FORWARD, allocation_phases
from alloctune.analysis.repeats import Repeats, find_repeats, from_marks, live_before
from alloctune.errors import TraceError
from alloctune.trace.model import ALLOC, FREE, Trace
from alloctune.units import format_size

MAX_SITES = 100_000  # distinct site labels explain will track (hostile recordings: bounded)


@dataclass
class Lifetimes:
    """Per allocation id: request index of its alloc and its free (n = never freed), size, stack."""

    alloc: list[int]
    free: list[int]
    size: list[int]
    stack: list[int]
    n: int


def lifetimes(trace: Trace) -> Lifetimes:
    req = trace.requests
    n = len(req)
    ids = req.stack_ids
    a: list[int] = []
    sz: list[int] = []
    st: list[int] = []
    f: list[int] = []
    index: dict[int, int] = {}
    for r, (op, size, rid) in enumerate(zip(req.ops, req.sizes, req.rids)):
        if op == ALLOC:
            index[rid] = len(a)
            a.append(r)
            sz.append(size)
            st.append(ids[r] if ids is not None else -1)
            f.append(n)
        elif op == FREE:
            k = index.pop(rid, None)
            if k is not None:
                f[k] = r
    return Lifetimes(a, f, sz, st, n)


@dataclass
class Analysis:
    """What `explain`, its what-ifs and the remedies share: the lifetimes, repetitions and site of every allocation."""

    trace: Trace
    life: Lifetimes
    live_before: list[int]
    repeats: Repeats
    site_of: list[int]  # per allocation: site id
    labels: list[str]  # site id -> label
    library: list[str | None]  # site id -> a library frame (per stack; the site's most-bytes one is chosen later)
    lib_of: list[str | None]  # per allocation: its innermost library frame
    stacks: str
    outlived: list[bool]  # per allocation: live when the repetition after its own began
    growth: dict[int, tuple[bool, int]]  # site id -> (grows, bytes per repetition)
    flags: list[Any]  # per stack id: SiteInfo
    group: str = "line"
    # per allocation: outlived, and kept again and again (not a first-time workspace or cache); growth,
    # the growing category and the what-ifs read this (None: the same as `outlived`)
    kept: list[bool] = field(default_factory=list)
    phase_of: list[str] | None = None  # per allocation: its phase (`analysis.phases`)
    model_of: list[str | None] | None = None  # per allocation: its model-code frame's label

    def __post_init__(self) -> None:
        if len(self.kept) != len(self.outlived):
            self.kept = list(self.outlived)


def analyse(
    trace: Trace, group: str = "line", repeat_marks: Sequence[int] | None = None, site_labels: Sequence[str] | None = None
) -> Analysis:
    """Lifetimes, repetitions, sites and growth of a whole recording (independent of the moment).

    `site_labels`: one label per allocation (in order) that replaces the recording's own sites
    (`--against` names a recording's allocations by their counterparts in the other one)."""
    if group not in sitemod.GROUPS:
        raise TraceError(f"--group {group!r}: choose one of {', '.join(sitemod.GROUPS)}")
    req = trace.requests
    table = req.stack_table
    if table is not None and table.dropped:
        raise TraceError(
            f"{trace.source}: the recording's Python stacks are unusable ({table.dropped}); "
            "explain needs them to name sites (re-record, or drop the frames)"
        )
    life = lifetimes(trace)
    lb = live_before(req)
    rep = from_marks(req, repeat_marks) if repeat_marks else find_repeats(req, lb)
    infos = sitemod.site_infos(table) if table is not None else []
    stack_labels, stack_libs = sitemod.site_keys(table, infos, group)
    label_id: dict[str, int] = {}
    labels: list[str] = []
    site_of: list[int] = []
    lib_of: list[str | None] = []
    model_labels = (
        [sitemod.model_label(table.frames[i.model]) if 0 <= i.model != i.user else None for i in infos]
        if table is not None
        else []
    )
    model_of = [model_labels[sid] if sid >= 0 and model_labels else None for sid in life.stack]
    phase_of = allocation_phases(req)
    layers = _layers(life, rep, [p == FORWARD for p in phase_of]) if group == "layer" and table is not None else None
    size_label = _size_labels(life.size) if table is None else {}
    if site_labels is not None and len(site_labels) != len(life.alloc):
        raise ValueError("site_labels needs one label per allocation")
    for k, sid in enumerate(life.stack):
        if site_labels is not None:
            label = site_labels[k]
            lib = stack_libs[sid] if table is not None and sid >= 0 else None
        elif table is None:
            label = size_label[life.size[k]]
            lib = None
        elif sid < 0:
            label, lib = sitemod.NO_FRAMES, None
        else:
            label, lib = stack_labels[sid], stack_libs[sid]
            layer = layers[k] if layers is not None else None
            if layer is not None and infos[sid].model >= 0:
                label = f"{label} [layer {layer[0]} of {layer[1]}]"
        i = label_id.get(label)
        if i is None:
            if len(labels) >= MAX_SITES:
                raise TraceError(
                    f"{trace.source}: more than {MAX_SITES} distinct sites; the recording is not one "
                    "program's (explain keeps its memory bounded)"
                )
            i = label_id[label] = len(labels)
            labels.append(label)
        site_of.append(i)
        lib_of.append(lib)
    outlived = _outlived(life, rep)
    kept = _without_first_time(life, rep, site_of, outlived)
    growth = _growth(life, rep, site_of, kept)
    if rep.starts:
        _keep_in_last_repetition(life, rep.starts[-1], site_of, growth, kept, outlived)
    return Analysis(
        trace,
        life,
        lb,
        rep,
        site_of,
        labels,
        [None] * len(labels),
        lib_of,
        "none" if table is None else "python",
        outlived,
        growth,
        infos,
        group,
        kept=kept,
        phase_of=phase_of,
        model_of=model_of,
    )


def _outlived(life: Lifetimes, rep: Repeats) -> list[bool]:
    """Per allocation: whether it outlived its repetition (with fewer than two repetitions, none did)."""
    outlived = [False] * len(life.alloc)
    starts = rep.starts
    if len(starts) >= 2:
        # outlived: still live when its repetition has ended and a whole repetition's length after it
        # was made (gradients that live from backward to the next zero_grad do not; kept results do)
        for k, a in enumerate(life.alloc):
            j = bisect.bisect_right(starts, a) - 1
            if j < 0:
                continue
            end = rep.end_of(j)
            period = (end if j + 1 < len(starts) else starts[j]) - starts[j if j + 1 < len(starts) else j - 1]
            if life.free[k] > end and life.free[k] > a + period or (j + 1 == len(starts) and life.free[k] > a + period):
                outlived[k] = True
    return outlived


def _keep_in_last_repetition(
    life: Lifetimes,
    last_start: int,
    site_of: list[int],
    growth: dict[int, tuple[bool, int]],
    kept: list[bool],
    outlived: list[bool],
) -> None:
    """Mark kept (in `kept` and `outlived`) the last repetition's blocks that are kept like their predecessors.

    The last repetition has no successor to outlive: a block a growing site made there is kept
    like its predecessors when blocks like it (same stack and size) were kept before and it is
    freed with them -- never, or in the same burst of the tear-down (a list dropped at the end
    frees its items one after the other) -- not by the step itself, as a temporary of the same
    shape is."""
    grow = {s for s, (g, _) in growth.items() if g}
    frees: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for k in range(len(kept)):
        if kept[k]:
            frees[(site_of[k], life.stack[k], life.size[k])].append(life.free[k])
    for k, a in enumerate(life.alloc):
        key = (site_of[k], life.stack[k], life.size[k])
        if a < last_start or site_of[k] not in grow or key not in frees:
            continue
        fs = frees[key]
        lo, hi = min(fs), max(fs)
        slack = (hi - lo) // len(fs) + 2  # the burst's own spacing, and a neighbour's free
        if life.free[k] >= life.n and hi >= life.n or lo - slack <= life.free[k] <= hi + slack:
            outlived[k] = kept[k] = True


def _layers(life: Lifetimes, rep: Repeats, forward: Sequence[bool]) -> list[tuple[int, int] | None]:
    """Per allocation: (k, N) when it was made in a forward pass by a stack that recurs N >= 2 times
    there within its repetition (a module repeated N times, as transformer layers are) and this is
    the k-th time; else None. Identical modules run the same code, so their stacks are equal and
    only the order tells them apart."""
    starts = rep.starts
    rep_of = [bisect.bisect_right(starts, a) - 1 for a in life.alloc]
    count: Counter = Counter()
    seen: Counter = Counter()
    for k, sid in enumerate(life.stack):
        if sid >= 0 and forward[k]:
            count[(rep_of[k], sid)] += 1
    out: list[tuple[int, int] | None] = []
    for k, sid in enumerate(life.stack):
        n = count.get((rep_of[k], sid), 0) if sid >= 0 and forward[k] else 0
        if n < 2:
            out.append(None)
            continue
        seen[(rep_of[k], sid)] += 1
        out.append((seen[(rep_of[k], sid)], n))
    return out


def _without_first_time(life: Lifetimes, rep: Repeats, site_of: list[int], outlived: list[bool]) -> list[bool]:
    """Outlived blocks that a program keeps again and again: in the first repetition where a site keeps
    anything, a block counts only if blocks like it (same stack and size) are kept in later ones.

    Why: one line both leaks and initialises. The first `model(x)` allocates the cuBLAS workspace
    (32 MiB, held for the process) beside the logits a list keeps; the same frames make both. The
    workspace is made once, so it is no part of the growth, and freeing it is no remedy."""
    starts = rep.starts
    kept = list(outlived)
    if len(starts) < 2:
        return kept
    rep_of = {k: bisect.bisect_right(starts, life.alloc[k]) - 1 for k, o in enumerate(outlived) if o}
    first: dict[int, int] = {}
    for k, j in rep_of.items():
        s = site_of[k]
        if j >= 0 and (s not in first or j < first[s]):
            first[s] = j
    later = {(site_of[k], life.stack[k], life.size[k]) for k, j in rep_of.items() if j > first.get(site_of[k], j)}
    for k, j in rep_of.items():
        if j == first.get(site_of[k]) and (site_of[k], life.stack[k], life.size[k]) not in later:
            kept[k] = False
    return kept


MAX_SIZE_SITES = 10_000


def _size_labels(sizes: Sequence[int]) -> dict[int, str]:
    """Site labels of a recording without stacks: the request size, or its power-of-two class when
    there are more than `MAX_SIZE_SITES` distinct sizes (a KV cache that grows by one token a step)."""
    distinct = set(sizes)
    if len(distinct) <= MAX_SIZE_SITES:
        return {s: f"{sitemod.NO_STACKS} requests of {format_size(s)} ({s} bytes)" for s in distinct}
    out = {}
    for s in distinct:
        lo = 1 << max(0, s.bit_length() - 1)
        out[s] = f"{sitemod.NO_STACKS} requests of {format_size(lo)} to {format_size(2 * lo)}"
    return out


def _growth(life: Lifetimes, rep: Repeats, site_of: list[int], outlived: list[bool]) -> dict[int, tuple[bool, int]]:
    """Per site with blocks that outlived their repetition: whether its floor (live bytes at each
    repetition start after the first) rises across the run, and by how much per repetition.

    Sparse: each site keeps only the boundaries where its floor changes (memory in the number of
    blocks, not sites x repetitions, which a hostile recording could make enormous)."""
    starts = rep.starts
    nb = len(starts)
    if nb < 3:
        return {}
    cand = {site_of[k] for k, o in enumerate(outlived) if o}
    changes: dict[int, dict[int, int]] = {s: {} for s in cand}
    for k, s in enumerate(site_of):
        if s not in cand:
            continue
        lo = bisect.bisect_right(starts, life.alloc[k])
        hi = bisect.bisect_right(starts, life.free[k])
        if lo < hi:
            d = changes[s]
            d[lo] = d.get(lo, 0) + life.size[k]
            d[hi] = d.get(hi, 0) - life.size[k]
    m = nb - 1  # floors at boundaries 1 .. nb-1 (after the first repetition began)
    out: dict[int, tuple[bool, int]] = {}
    for s, d in changes.items():
        first = sum(v for j, v in d.items() if j <= 1)  # floor at boundary 1
        acc = first
        ups = rise = fall = 0
        for j in sorted(x for x in d if 1 < x < nb):
            v = d[j]
            if v > 0:
                ups += 1
                rise += v
            elif v < 0:
                fall -= v
            acc += v
        last = acc
        # a rising floor, not a sawtooth (a cache refilled each epoch falls back as far as it rose)
        grows = last > first and ups >= max(1, (m - 1) // 2) and fall * 10 <= rise
        out[s] = (grows, (last - first) // (m - 1) if grows else 0)
    return out
