"""Where the memory goes at one moment of a recording: categories, sites, growth.

Every live block at the moment is filed under exactly one category; its requested bytes go
there. The allocator's own overhead is read off the memory map (`moment.map_at`): rounding
is allocated minus requested, and the free bytes of reserved segments are cached (whole free
segments) or inactive split remainders (free bytes beside live blocks). So the categories sum
to reserved memory exactly, by construction, and the totals are checked against the
recording (reserved from its segment events, live requested bytes from its requests).

How a block's category is decided (each category's `how` says which rules fired):
* with stacks: module construction / `.to()` frames -> model_state; frames in `torch/optim`
  and held past the repetition -> optimizer_state; no Python frames at all (autograd's
  backward thread) and the size of a parameter -> gradients (one per parameter);
* without stacks (from lifetimes): made before the first repetition and held to the end of the
  work (its last allocation) -> model_state; parameter-sized, made in a repetition before the last
  and held to the end -> optimizer_state;
  parameter-sized, made in a repetition, not held to the end, one per parameter, when every
  repetition makes about one such block per parameter (a training step) -> gradients;
* either way: a block of a growing site that outlived the repetition that made it -> growing;
  everything else live -> activations (and temporaries).
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Sequence

from alloctune.errors import TraceError
from alloctune.explain import sites as sitemod
from alloctune.explain.model import CATEGORIES, Category, Explanation, Site
from alloctune.explain.moment import pick_moment, totals_at
from alloctune.explain.phases import PhaseBytes
from alloctune.explain.repeats import Repeats, find_repeats, from_marks, live_before
from alloctune.trace.model import ALLOC, FREE, Trace
from alloctune.units import format_size

MAX_SITES = 100_000  # distinct site labels explain will track (hostile recordings: bounded)
TOP_SITES = 20


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
    """What `explain` and its what-ifs share: the lifetimes, repetitions and site of every allocation."""

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
    phase_of: list[str] | None = None  # per allocation: its phase (`explain.phases`)
    model_of: list[str | None] | None = None  # per allocation: its model-code frame's label

    def __post_init__(self) -> None:
        if len(self.kept) != len(self.outlived):
            self.kept = list(self.outlived)


def analyse(trace: Trace, group: str = "line", repeat_marks: Sequence[int] | None = None,
            site_labels: Sequence[str] | None = None) -> Analysis:
    """Lifetimes, repetitions, sites and growth of a whole recording (independent of the moment).

    `site_labels`: one label per allocation (in order) that replaces the recording's own sites
    (`--against` names a recording's allocations by their counterparts in the other one)."""
    if group not in sitemod.GROUPS:
        raise TraceError(f"--group {group!r}: choose one of {', '.join(sitemod.GROUPS)}")
    req = trace.requests
    table = req.stack_table
    if table is not None and table.dropped:
        raise TraceError(f"{trace.source}: the recording's Python stacks are unusable ({table.dropped}); "
                         "explain needs them to name sites (re-record, or drop the frames)")
    life = lifetimes(trace)
    lb = live_before(req)
    rep = from_marks(req, repeat_marks) if repeat_marks else find_repeats(req, lb)
    infos = sitemod.site_infos(table) if table is not None else []
    stack_labels, stack_libs = sitemod.site_keys(table, infos, group)
    label_id: dict[str, int] = {}
    labels: list[str] = []
    site_of: list[int] = []
    lib_of: list[str | None] = []
    model_labels = ([sitemod.model_label(table.frames[i.model]) if 0 <= i.model != i.user else None for i in infos]
                    if table is not None else [])
    model_of = [model_labels[sid] if sid >= 0 and model_labels else None for sid in life.stack]
    from alloctune.explain.phases import FORWARD, allocation_phases

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
                raise TraceError(f"{trace.source}: more than {MAX_SITES} distinct sites; the recording is not one "
                                 "program's (explain keeps its memory bounded)")
            i = label_id[label] = len(labels)
            labels.append(label)
        site_of.append(i)
        lib_of.append(lib)
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
    kept = _without_first_time(life, rep, site_of, outlived)
    growth = _growth(life, rep, site_of, kept)
    if starts:
        # the last repetition has no successor to outlive: a block a growing site made there is kept
        # like its predecessors when blocks like it (same stack and size) were kept before and it is
        # freed with them -- never, or in the same burst of the tear-down (a list dropped at the end
        # frees its items one after the other) -- not by the step itself, as a temporary of the same
        # shape is
        grow = {s for s, (g, _) in growth.items() if g}
        frees: dict[tuple[int, int, int], list[int]] = defaultdict(list)
        for k in range(len(kept)):
            if kept[k]:
                frees[(site_of[k], life.stack[k], life.size[k])].append(life.free[k])
        for k, a in enumerate(life.alloc):
            key = (site_of[k], life.stack[k], life.size[k])
            if a < starts[-1] or site_of[k] not in grow or key not in frees:
                continue
            fs = frees[key]
            lo, hi = min(fs), max(fs)
            slack = (hi - lo) // len(fs) + 2  # the burst's own spacing, and a neighbour's free
            if life.free[k] >= life.n and hi >= life.n or lo - slack <= life.free[k] <= hi + slack:
                outlived[k] = kept[k] = True
    return Analysis(trace, life, lb, rep, site_of, labels, [None] * len(labels), lib_of,
                    "none" if table is None else "python", outlived, growth, infos, group, kept=kept,
                    phase_of=phase_of, model_of=model_of)


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
        return {s: f"{sitemod.NO_STACKS} {s} B ({format_size(s)}) requests" for s in distinct}
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


def explain_trace(trace: Trace, *, at: Any = None, group: str = "line", top: int = TOP_SITES,
                  repeat_marks: Sequence[int] | None = None, analysis: Analysis | None = None) -> Explanation:
    """Categories and sites at the moment (module doc); what-ifs are added by `explain.what_if`."""
    an = analysis or analyse(trace, group, repeat_marks)
    life, rep = an.life, an.repeats
    moment = pick_moment(trace, an.live_before, at)
    tot, map_source = totals_at(trace, moment)
    m = moment.after
    live = [k for k in range(len(life.alloc)) if life.alloc[k] <= m < life.free[k]]
    req_live = sum(life.size[k] for k in live)
    if req_live != tot.requested:
        raise TraceError(f"{trace.source}: internal check failed: {req_live} live requested bytes in the request stream, "
                         f"{tot.requested} in the allocator at request {m}")
    if tot.reserved != moment.reserved:
        raise TraceError(f"{trace.source}: internal check failed: the allocator holds {tot.reserved} reserved bytes, "
                         f"the recording {moment.reserved}")
    allocated, cached, split = tot.allocated, tot.cached_free, tot.inactive_split
    cats, hows = _categorise(an, live, m)
    by_cat: dict[str, list[int]] = {c: [0, 0] for c in CATEGORIES}
    for k in live:
        c = cats[k]
        by_cat[c][0] += life.size[k]
        by_cat[c][1] += 1
    by_cat["rounding"] = [allocated - req_live, 0]
    by_cat["cached_free"] = [cached, 0]
    by_cat["inactive_split"] = [split, 0]
    hows.setdefault("rounding", "allocated minus requested bytes of the live blocks (512-byte rounding, "
                                "power-of-two divisions, remainders too small to split)")
    hows.setdefault("cached_free", "reserved bytes neither allocated nor split remainders: whole free segments "
                                   "(empty_cache() would release them)")
    hows.setdefault("inactive_split", "free blocks split off the blocks of their segment (PyTorch's "
                                      "inactive_split_bytes): remainders that live blocks keep from going back")
    categories = tuple(Category(c, by_cat[c][0], by_cat[c][1], hows.get(c, "no block at the moment")) for c in CATEGORIES)
    total = sum(c.bytes for c in categories)
    if total != tot.reserved:
        raise TraceError(f"{trace.source}: internal check failed: categories sum to {total}, reserved is {tot.reserved}")
    site_rows = _sites(an, live, m, cats, top)
    moment_d = {"event": moment.event, "request": moment.after, "time": moment.time_us, "reason": moment.reason,
                "reserved": tot.reserved, "allocated": allocated, "requested": req_live}
    phase_rows = _phase_bytes(an, live, allocated - req_live)
    if phase_rows:
        from alloctune.explain.phases import phase_at

        moment_d["phase"] = phase_at(trace.requests, an.phase_of or [], m)
        if rep.starts:
            moment_d["step"] = max(0, bisect.bisect_right(rep.starts, m) - 1) + 1
            moment_d["steps"] = len(rep.starts)
    notes = []
    if an.stacks == "none":
        notes.append("the recording has no Python stacks: sites are allocation sizes and categories come from "
                     "lifetimes; record with stacks (_record_memory_history(stacks='python')) to see code lines")
    if not rep.starts:
        notes.append("no repetitions found: nothing can be called growing")
    return Explanation(
        source=trace.source, moment=moment_d, categories=categories,
        overhead={"cached_free": cached, "inactive_split": split, "rounding": allocated - req_live},
        sites=tuple(site_rows), sites_total=len({an.site_of[k] for k in live}), group=an.group,
        stacks=an.stacks, repeats=rep.to_dict(), map_source=map_source, notes=tuple(notes), phases=tuple(phase_rows),
    )


def _phase_bytes(an: Analysis, live: list[int], rounding: int) -> list[PhaseBytes]:
    """Live requested bytes by phase plus the allocator's rounding: rows summing to allocated bytes.
    Empty when no allocation of the recording has a phase other than `other` (nothing to tell)."""
    from alloctune.explain.phases import OTHER, PHASES

    phase_of = an.phase_of or []
    if not phase_of or all(p == OTHER for p in phase_of):
        return []
    by: Counter = Counter()
    for k in live:
        by[phase_of[k]] += an.life.size[k]
    return [PhaseBytes(p, by[p]) for p in PHASES] + [PhaseBytes("rounding", rounding)]


def block_categories(an: Analysis) -> dict[int, str]:
    """The category of every allocation of the run (for charts over time): the moment's rules,
    except that gradients are not limited to one per parameter (each step makes its own)."""
    return _categorise(an, list(range(len(an.life.alloc))), -1, one_per_param=False)[0]


def _categorise(an: Analysis, live: list[int], m: int,
                one_per_param: bool = True) -> tuple[dict[int, str], dict[str, str]]:
    life, rep = an.life, an.repeats
    n = life.n
    first = rep.starts[0] if rep.starts else n
    infos = an.flags
    has_stacks = an.stacks == "python"
    # held for good: still live when the program made its last allocation (a tear-down that frees
    # the model after the work does not make the parameters short-lived)
    last_alloc = life.alloc[-1] if life.alloc else 0
    held = [life.free[k] > last_alloc for k in range(len(life.alloc))]
    # parameters: with stacks, what module construction made; without, what set-up made and held
    params = [k for k in range(len(life.alloc)) if life.alloc[k] < first and held[k]
              and (not has_stacks or (life.stack[k] >= 0 and infos[life.stack[k]].construction))]
    param_sizes = Counter(life.size[k] for k in params)
    param_set = set(param_sizes)
    training = False
    if param_sizes and rep.count >= 2:
        per_rep = Counter(rep.index_of(life.alloc[k]) for k in range(len(life.alloc))
                          if life.alloc[k] >= first and life.size[k] in param_set and not held[k]
                          and (not has_stacks or life.stack[k] < 0))
        counts = sorted(per_rep.get(j, 0) for j in range(rep.count - 1))  # full repetitions only
        training = bool(counts) and counts[len(counts) // 2] >= len(params) // 2
    growing_sites = {s for s, (g, _) in an.growth.items() if g}
    last_rep = rep.starts[-1] if rep.starts else n
    grads_left = Counter(param_sizes) if training else Counter()
    cats: dict[int, str] = {}
    hows: dict[str, set[str]] = defaultdict(set)
    for k in sorted(live, key=lambda k: -life.alloc[k]):  # newest first: this step's gradients
        sid = life.stack[k]
        info = infos[sid] if has_stacks and sid >= 0 else None
        size = life.size[k]
        if an.kept[k] and an.site_of[k] in growing_sites:
            c, how = "growing", "its site's floor rises every repetition and this block outlived the repetition that made it"
        elif has_stacks and info is not None and info.construction:
            c, how = "model_state", "stack: module construction / .to() / parameter init"
        # state outlives the step that made it; the step's own temporaries (foreach intermediates) do not,
        # even in the last step, whose temporaries are freed only after the program's last allocation
        elif has_stacks and info is not None and info.optimizer and (an.outlived[k] or life.alloc[k] < first):
            c, how = "optimizer_state", "stack: torch/optim, held past its repetition"
        elif not has_stacks and life.alloc[k] < first and held[k]:
            c, how = "model_state", "no stacks: made before the first repetition and held to the end"
        elif (not has_stacks and training and size in param_set and held[k] and first <= life.alloc[k] < last_rep):
            c, how = "optimizer_state", ("no stacks: parameter-sized, made in a repetition before the last, "
                                         "held to the end")
        elif training and size in param_set and (grads_left[size] > 0 or not one_per_param) and (has_stacks and sid < 0 or (
                not has_stacks and (not held[k] or life.alloc[k] >= last_rep))):
            grads_left[size] -= 1
            c = "gradients"
            how = ("no Python frames (autograd's backward thread), parameter-sized, one per parameter" if has_stacks
                   else "no stacks: parameter-sized, made in each repetition, one per parameter")
        elif has_stacks and info is not None and info.optimizer:
            c, how = "activations", "stack: torch/optim temporaries of the step"
        elif has_stacks and sid < 0:
            c, how = "activations", "no Python frames (autograd's backward thread), not parameter-sized"
        else:
            c, how = "activations", ("every other live block (activations, inputs, temporaries)" if has_stacks
                                     else "no stacks: every other live block")
        cats[k] = c
        hows[c].add(how)
    return cats, {c: "; ".join(sorted(h)) for c, h in hows.items()}


def _sites(an: Analysis, live: list[int], m: int, cats: dict[int, str], top: int) -> list[Site]:
    life = an.life
    agg: dict[int, list[int]] = {}
    libs: dict[int, Counter] = defaultdict(Counter)
    models: dict[int, Counter] = defaultdict(Counter)
    per_cat: dict[int, Counter] = defaultdict(Counter)
    for k in live:
        s = an.site_of[k]
        a = agg.setdefault(s, [0, 0, 0, 0])
        a[0] += life.size[k]
        a[1] += 1
        if an.outlived[k]:
            a[2] += life.size[k]
        if an.kept[k]:
            a[3] += life.size[k]
        if an.lib_of[k]:
            libs[s][an.lib_of[k]] += life.size[k]
        if an.model_of and an.model_of[k]:
            models[s][an.model_of[k]] += life.size[k]
        per_cat[s][cats[k]] += life.size[k]
    order = sorted(agg, key=lambda s: (-agg[s][0], an.labels[s]))
    rows = []
    for s in order:
        grows, per = an.growth.get(s, (False, 0))
        b, nblocks, outl, kept = agg[s]
        lib = libs[s].most_common(1)[0][0] if libs[s] else None
        # growing bytes: what the category `growing` holds of this site (kept again and again, not a
        # first-time workspace); equal to the site's share of that category by construction
        model = models[s].most_common(1)[0][0] if models[s] else None
        rows.append(Site(an.labels[s], lib, b, nblocks, outl, grows, kept if grows else 0, per,
                         dict(per_cat[s]), model_frame=model))
    if len(rows) > top:
        keep = [r for i, r in enumerate(rows) if i < top or r.growing]
        rest = [r for i, r in enumerate(rows) if not (i < top or r.growing)]
        rows = keep
        cat_sum: Counter = Counter()
        for r in rest:
            cat_sum.update(r.categories)
        rows.append(Site(f"({len(rest)} other sites)", None, sum(r.bytes for r in rest), sum(r.blocks for r in rest),
                         sum(r.outlived_bytes for r in rest), False, sum(r.growing_bytes for r in rest), 0,
                         dict(cat_sum)))
    return rows
