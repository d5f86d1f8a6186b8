"""`explain` and `explain_against`: load, analyse, add what-ifs; plain data out."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from alloctune.analysis.core import analyse
from alloctune.explain.core import TOP_SITES, explain_trace
from alloctune.explain.model import CATEGORIES, OVERHEAD, Comparison, Explanation, RankImbalance, Site
from alloctune.progress import Progress, no_progress
from alloctune.trace.model import Trace

if TYPE_CHECKING:
    from alloctune.remedy.model import Shared


def _load(recording: str | Path | Trace, device: int | None) -> Trace:
    if isinstance(recording, Trace):
        return recording
    from alloctune.trace import load_trace

    return load_trace(recording, device)


def with_calibrations(trace: Trace, calibrations: Sequence[str | Path | Trace]) -> tuple[Trace, str | None]:
    """`trace` with the fallbacks capped runs of the same program and input teach (cuDNN giving a
    workspace up under a cap), carried to the other calls of each call site, and the sentence that
    says what they taught. Why: a convolution program's min budgets (what-ifs, remedies, the table)
    are otherwise those of the recording as it ran, which a real run under a cap undercuts."""
    if not calibrations:
        return trace, None
    from alloctune.trace.fallible import combine, generalise, learn_from_calibration, with_fallbacks

    model, caps = None, []
    for cal in calibrations:
        capped = _load(cal, None)
        m = learn_from_calibration(trace, capped)
        caps.append(m.calibration_cap)
        model = m if model is None else combine(model, m)
    if model is None or not model.ladders:
        return trace, (
            "the calibration run(s) taught no fallback: no request of this recording fell back to a "
            "smaller one there (min budgets are those of the recording as it ran)"
        )
    general = generalise(model, trace)
    carried = len(general.general) if general.general else 0
    shown = ", ".join(f"{c / 2**20:.0f} MiB" for c in caps if c) or "unknown caps"
    return with_fallbacks(trace, general), (
        f"min budgets with the fallbacks {len(calibrations)} calibration run(s) (capped at {shown}) taught: "
        f"{len(model.ladders)} request size(s)"
        + (f", carried over to {carried} more call(s) of the same call site" if carried else "")
    )


def explain(
    recording: str | Path | Trace,
    *,
    calibrations: Sequence[str | Path | Trace] = (),
    at: Any = None,
    group: str = "line",
    top: int = TOP_SITES,
    what_if: bool = True,
    what_if_dir: str | Path | None = None,
    device: int | None = None,
    repeats: Sequence[int] | None = None,
    progress: Progress = no_progress,
) -> Explanation:
    """Where the memory goes at one moment of a recording (`alloctune explain`).

    `at`: an event index or a time like "12.5s" (default: the OOM the recording ends in, else
    the peak of reserved memory); `group`: line | function | file | module; `repeats`: request
    indices where repetitions start (default: found in the recording); `what_if`: simulate the
    min budget with each kept site freed (`what_if_dir`: also write the rewritten recordings);
    `calibrations`: capped runs of the same program and input (`with_calibrations`).
    """
    progress("loading", 0, 3)
    trace, taught = with_calibrations(_load(recording, device), calibrations)
    progress("analysing", 1, 3)
    an = analyse(trace, group, repeats)
    ex = explain_trace(trace, at=at, group=group, top=top, analysis=an)
    if what_if:
        from alloctune.explain.what_if import what_ifs
        from alloctune.remedy.model import Shared, collector_paused

        # the rewritten recordings: `collector_paused` says why; what the what-ifs and the remedies have
        # in common is made once, the replays in a thread of their own (`remedy.model.Shared`)
        with collector_paused(), Shared(trace, background=True) as shared:
            progress("simulating what-ifs", 2, 3)
            ex = what_ifs(
                an,
                ex,
                source_arg=str(recording if not isinstance(recording, Trace) else trace.source),
                out_dir=what_if_dir,
                shared=shared,
            )
            ex = with_remedies(an, ex, shared, progress=progress)
    if taught:
        from dataclasses import replace

        ex = replace(ex, notes=(*ex.notes, taught))
    progress("done", 3, 3)
    return ex


def with_remedies(an: Any, ex: Explanation, shared: Shared | None = None, progress: Progress = no_progress) -> Explanation:
    """`ex` with the program-level remedies simulated on its recording (`remedy.registry`) and the utilization table:
    the recording as it ran, each remedy, each of `COMPARED_SETTINGS`, and the release policies under the
    setting that keeps the least idle (what "the best setting plus remedies" reaches). The recording's
    uncapped replay and its repetition ends are made once for all of them, and the rewrites and replays
    they share with each other and with the what-ifs once (`shared`: a `remedy.model.Shared`). `progress`
    counts the remedy groups, then the table, as steps of their own."""
    from dataclasses import replace
    from functools import partial

    from alloctune.explain import utilization as ut
    from alloctune.remedy.model import Shared, activity_of, recorded_conf, workspace_floor
    from alloctune.remedy.registry import REMEDY_GROUPS, no_grad_candidate, release_remedies, simulated_remedies
    from alloctune.remedy.release import repetition_ends

    trace = an.trace
    conf = recorded_conf(trace)
    shared = Shared(trace) if shared is None else shared
    run = shared.run(trace, conf)
    ends = repetition_ends(an) if len(an.repeats.starts) >= 2 else None
    base = ex.min_budget if ex.min_budget is not None else shared.min_budget(trace, conf)
    steps = len(REMEDY_GROUPS) + 1
    remedies = simulated_remedies(an, base, conf, base_run=run, ends=ends, shared=shared, progress=progress, steps=steps)
    progress("simulating remedies: the utilization table", steps - 1, steps)
    ng = no_grad_candidate(trace)
    if ng is not None:
        remedies.append(ng)
    peak, peak_alloc, _, _ = activity_of(run)
    rows = [ut.UtilizationRow("recording", "as it ran", conf, base, peak, peak_alloc, "simulated")]
    rows += ut.remedy_rows(remedies) + ut.combined_rows(an, rows[0], partial(release_remedies, ends=ends, shared=shared), shared)
    table = ut.table(rows, trace)
    return replace(
        ex,
        remedies=tuple(remedies),
        min_budget=base,
        utilization=table,
        min_budget_floor=workspace_floor(trace, conf, trace, base, run, shared.low_end),
    )


def aligned_labels(this: Trace, other: Trace, group: str = "line") -> list[str] | None:
    """Without stacks on both sides, sites are request sizes, which differ between two runs at
    different input sizes: name each allocation of `this` by the site of its counterpart in
    `other` instead, pairing the two request streams as `plan` does (`plan.align`), so a site's
    delta says how the same requests grew. None when the streams do not pair (other programs)."""
    from alloctune.plan.align import pair, structure
    from alloctune.trace.model import ALLOC

    oa = analyse(other, group)
    pairing = pair(structure(this.requests), structure(other.requests))
    if pairing.aligned < 0.5 * len(this.requests):
        return None
    k_of = {r: k for k, r in enumerate(oa.life.alloc)}
    labels = []
    ops, cp = this.requests.ops, pairing.counterpart
    for r, op in enumerate(ops):
        if op != ALLOC:
            continue
        j = cp[r]
        k = k_of.get(j) if j >= 0 else None
        labels.append(oa.labels[oa.site_of[k]] if k is not None else "(no counterpart in the other recording)")
    return labels


def explain_against(
    recording: str | Path | Trace,
    against: str | Path | Trace,
    *,
    group: str = "line",
    top: int = TOP_SITES,
    device: int | None = None,
) -> Comparison:
    """`explain B --against A`: B's peak reserved minus A's, split exactly by category and by site
    (site deltas of live requested bytes plus the overhead deltas make the gap)."""
    tb, ta = _load(recording, device), _load(against, device)
    a = explain(ta, group=group, top=1 << 30, what_if=False)
    labels = None
    if ta.requests.stack_table is None or tb.requests.stack_table is None:
        labels = aligned_labels(tb, ta, group)
    if labels is None:
        b = explain(tb, group=group, top=1 << 30, what_if=False)
    else:
        an = analyse(tb, group, site_labels=labels)
        b = explain_trace(tb, group=group, top=1 << 30, analysis=an)
    gap = b.reserved - a.reserved
    cat = {c: b.category(c) - a.category(c) for c in CATEGORIES}
    a_sites = {s.site: s.bytes for s in a.sites}
    rows = [Site(**{**s.__dict__, "delta": s.bytes - a_sites.get(s.site, 0)}) for s in b.sites]
    only_a = tuple(sorted(((s, -v) for s, v in a_sites.items() if s not in {r.site for r in rows}), key=lambda x: x[1]))
    total = sum(r.delta or 0 for r in rows) + sum(v for _, v in only_a) + sum(cat[c] for c in OVERHEAD)
    if total != gap or sum(cat.values()) != gap:
        from alloctune.errors import TraceError

        raise TraceError(f"internal check failed: the deltas sum to {total}, the gap is {gap}")
    rows.sort(key=lambda r: -abs(r.delta or 0))
    if len(rows) > top:
        rest = rows[top:]
        rows = rows[:top]
        rows.append(Site.others(rest, delta=sum(r.delta or 0 for r in rest)))
    b_small = Explanation(**{**b.__dict__, "sites": tuple(rows)})
    return Comparison(b_small, a, gap, cat, tuple(rows), only_a)


def rank_of(path: str | Path, default: int) -> int:
    """The rank a recording's name carries (`NAME.rank3.pickle`, as the agent writes them), else `default`."""
    import re

    m = re.search(r"\.rank(\d+)(?:\.|$)", Path(str(path)).name)
    return int(m.group(1)) if m else default


def explain_ranks(
    recordings: Sequence[str | Path | Trace], *, group: str = "line", top: int = TOP_SITES, device: int | None = None
) -> RankImbalance:
    """Each rank of one program explained at its own peak, and the imbalance by category and site."""
    from alloctune.errors import InputError

    if len(recordings) < 2:
        raise InputError("explaining ranks needs two recordings or more (one per rank)")
    ranked = sorted(
        ((rank_of(r if not isinstance(r, Trace) else r.source, i), r) for i, r in enumerate(recordings)), key=lambda x: x[0]
    )
    ranks = tuple(r for r, _ in ranked)
    if len(set(ranks)) != len(ranks):
        raise InputError(f"two recordings name the same rank ({sorted(ranks)}); give one per rank")
    exs = tuple(explain(rec, group=group, top=1 << 30, what_if=False, device=device) for _, rec in ranked)
    cats = {c: [e.category(c) for e in exs] for c in CATEGORIES}
    per_site: dict[str, list[int]] = {}
    for i, e in enumerate(exs):
        for s in e.sites:
            per_site.setdefault(s.site, [0] * len(exs))[i] += s.bytes
    order = sorted(per_site.items(), key=lambda kv: (-(max(kv[1]) - min(kv[1])), kv[0]))
    if len(order) > top:
        rest = order[top:]
        order = order[:top] + [(f"({len(rest)} other sites)", [sum(v[i] for _, v in rest) for i in range(len(exs))])]
    return RankImbalance(ranks, exs, cats, tuple(order))
