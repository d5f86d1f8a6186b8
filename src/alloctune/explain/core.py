"""Where the memory goes at one moment of a recording: categories, sites, growth.

Every live block at the moment is filed under exactly one category; its requested bytes go
there. The allocator's own overhead is read off the memory map (`moment.map_at`): rounding
is allocated minus requested, and the free bytes of reserved segments are cached (whole free
segments) or inactive split remainders (free bytes beside live blocks). So the categories sum
to reserved memory exactly, by construction, and the totals are checked against the
recording (reserved from its segment events, live requested bytes from its requests). What
it reads of the whole recording (lifetimes, repetitions, sites, phases, growth) is one
`analysis.core.Analysis`, the one the remedies read too.

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
from typing import Any, Sequence

from alloctune.analysis.core import Analysis, analyse
from alloctune.analysis.phases import OTHER, PHASES, PhaseBytes, phase_at
from alloctune.errors import TraceError
from alloctune.explain.model import CATEGORIES, Category, Explanation, Site
from alloctune.explain.moment import pick_moment, totals_at
from alloctune.trace.model import Trace

TOP_SITES = 20


def explain_trace(
    trace: Trace,
    *,
    at: Any = None,
    group: str = "line",
    top: int = TOP_SITES,
    repeat_marks: Sequence[int] | None = None,
    analysis: Analysis | None = None,
) -> Explanation:
    """Categories and sites at the moment (module doc); what-ifs are added by `explain.what_if`."""
    an = analysis or analyse(trace, group, repeat_marks)
    life, rep = an.life, an.repeats
    moment = pick_moment(trace, an.live_before, at)
    tot, map_source = totals_at(trace, moment)
    m = moment.after
    live = [k for k in range(len(life.alloc)) if life.alloc[k] <= m < life.free[k]]
    req_live = sum(life.size[k] for k in live)
    if req_live != tot.requested:
        raise TraceError(
            f"{trace.source}: internal check failed: {req_live} live requested bytes in the request stream, "
            f"{tot.requested} in the allocator at request {m}"
        )
    if tot.reserved != moment.reserved:
        raise TraceError(
            f"{trace.source}: internal check failed: the allocator holds {tot.reserved} reserved bytes, "
            f"the recording {moment.reserved}"
        )
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
    hows.setdefault(
        "rounding",
        "allocated minus requested bytes of the live blocks (512-byte rounding, "
        "power-of-two divisions, remainders too small to split)",
    )
    hows.setdefault(
        "cached_free",
        "reserved bytes neither allocated nor split remainders: whole free segments (empty_cache() would release them)",
    )
    hows.setdefault(
        "inactive_split",
        "free blocks split off the blocks of their segment (PyTorch's "
        "inactive_split_bytes): remainders that live blocks keep from going back",
    )
    categories = tuple(Category(c, by_cat[c][0], by_cat[c][1], hows.get(c, "no block at the moment")) for c in CATEGORIES)
    total = sum(c.bytes for c in categories)
    if total != tot.reserved:
        raise TraceError(f"{trace.source}: internal check failed: categories sum to {total}, reserved is {tot.reserved}")
    site_rows = _sites(an, live, m, cats, top)
    moment_d = {
        "event": moment.event,
        "request": moment.after,
        "time": moment.time_us,
        "reason": moment.reason,
        "reserved": tot.reserved,
        "allocated": allocated,
        "requested": req_live,
    }
    phase_rows = _phase_bytes(an, live, allocated - req_live)
    if phase_rows:
        moment_d["phase"] = phase_at(trace.requests, an.phase_of or [], m)
        if rep.starts:
            moment_d["step"] = max(0, bisect.bisect_right(rep.starts, m) - 1) + 1
            moment_d["steps"] = len(rep.starts)
    notes = []
    if an.stacks == "none":
        notes.append(
            "the recording has no Python stacks: sites are allocation sizes and categories come from "
            "lifetimes; record with stacks (_record_memory_history(stacks='python')) to see code lines"
        )
    if not rep.starts:
        notes.append("no repetitions found: nothing can be called growing")
    return Explanation(
        source=trace.source,
        moment=moment_d,
        categories=categories,
        overhead={"cached_free": cached, "inactive_split": split, "rounding": allocated - req_live},
        sites=tuple(site_rows),
        sites_total=len({an.site_of[k] for k in live}),
        group=an.group,
        stacks=an.stacks,
        repeats=rep.to_dict(),
        map_source=map_source,
        notes=tuple(notes),
        phases=tuple(phase_rows),
    )


def _phase_bytes(an: Analysis, live: list[int], rounding: int) -> list[PhaseBytes]:
    """Live requested bytes by phase plus the allocator's rounding: rows summing to allocated bytes.
    Empty when no allocation of the recording has a phase other than `other` (nothing to tell)."""
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


def _categorise(an: Analysis, live: list[int], m: int, one_per_param: bool = True) -> tuple[dict[int, str], dict[str, str]]:
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
    params = [
        k
        for k in range(len(life.alloc))
        if life.alloc[k] < first and held[k] and (not has_stacks or (life.stack[k] >= 0 and infos[life.stack[k]].construction))
    ]
    param_sizes = Counter(life.size[k] for k in params)
    param_set = set(param_sizes)
    training = False
    if param_sizes and rep.count >= 2:
        starts, made_at, sizes, stack_of = rep.starts, life.alloc, life.size, life.stack
        per_rep = Counter(
            bisect.bisect_right(starts, made_at[k]) - 1
            for k in range(len(made_at))  # `rep.index_of`
            if made_at[k] >= first and sizes[k] in param_set and not held[k] and (not has_stacks or stack_of[k] < 0)
        )
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
        elif not has_stacks and training and size in param_set and held[k] and first <= life.alloc[k] < last_rep:
            c, how = "optimizer_state", ("no stacks: parameter-sized, made in a repetition before the last, held to the end")
        elif (
            training
            and size in param_set
            and (grads_left[size] > 0 or not one_per_param)
            and (has_stacks and sid < 0 or (not has_stacks and (not held[k] or life.alloc[k] >= last_rep)))
        ):
            grads_left[size] -= 1
            c = "gradients"
            how = (
                "no Python frames (autograd's backward thread), parameter-sized, one per parameter"
                if has_stacks
                else "no stacks: parameter-sized, made in each repetition, one per parameter"
            )
        elif has_stacks and info is not None and info.optimizer:
            c, how = "activations", "stack: torch/optim temporaries of the step"
        elif has_stacks and sid < 0:
            c, how = "activations", "no Python frames (autograd's backward thread), not parameter-sized"
        else:
            c, how = (
                "activations",
                (
                    "every other live block (activations, inputs, temporaries)"
                    if has_stacks
                    else "no stacks: every other live block"
                ),
            )
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
        rows.append(
            Site(an.labels[s], lib, b, nblocks, outl, grows, kept if grows else 0, per, dict(per_cat[s]), model_frame=model)
        )
    if len(rows) > top:
        keep = [r for i, r in enumerate(rows) if i < top or r.growing]
        rest = [r for i, r in enumerate(rows) if not (i < top or r.growing)]
        rows = keep
        rows.append(Site.others(rest))
    return rows
