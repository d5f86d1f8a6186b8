"""What freeing a site's kept memory would buy, simulated: trace transformations fed to `sim.sweep`.

A what-if never replays anything itself: it rewrites the recording's request stream (a
site's blocks that outlived the repetition that made them are freed where that repetition
ends, instead of where the program freed them) and asks `sim.sweep` for the min budget of
the rewritten stream under the setting the recording ran with, beside the min budget of the
recording itself. The difference counts everything the kept blocks cost: their bytes and the
allocator overhead they cause (segments they pin, split remainders), which is why it is
usually larger than the bytes themselves.

The rewritten stream can be written as a compact trace (`write_what_if`), so each number comes
with the `alloctune simulate ... --min-budget` command that reproduces it.
"""

from __future__ import annotations

import bisect
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Sequence

from alloctune.explain.core import Analysis
from alloctune.explain.model import Explanation, WhatIfResult
from alloctune.sim.resolution import ABS_TOL, REL_TOL
from alloctune.trace.model import FREE, Annotation, RequestStream, Trace

MAX_SITE_WHAT_IFS = 5
WHAT_IF_REL_TOL = REL_TOL  # the one min-budget resolution (sim.budget): `simulate` reproduces a what-if's number
WHAT_IF_ABS_TOL = ABS_TOL


def recorded_conf(trace: Trace) -> str:
    """The allocator string the recording ran with ("" = defaults)."""
    conf = (trace.meta or {}).get("conf")
    if isinstance(conf, str):
        return conf
    text = (trace.allocator_settings or {}).get("PYTORCH_CUDA_ALLOC_CONF")
    return text if isinstance(text, str) else ""


def free_at_repeat_end(an: Analysis, sites: Iterable[int]) -> Trace:
    """The recording with every block of `sites` that outlived its repetition freed where that
    repetition ends (just before the next one's first request). Allocation order is unchanged."""
    trace, life, starts = an.trace, an.life, an.repeats.starts
    wanted = set(sites)
    req = trace.requests
    moved: dict[int, list[int]] = {}  # boundary request index -> allocation ids freed there
    moved_rids: set[int] = set()
    rid_of_k = [req.rids[a] for a in life.alloc]
    for k, s in enumerate(an.site_of):
        if s in wanted and an.kept[k]:
            j = bisect.bisect_right(starts, life.alloc[k]) - 1
            if j + 1 >= len(starts):
                continue  # made in the last repetition: it ends with the recording
            moved.setdefault(starts[j + 1], []).append(k)
            moved_rids.add(rid_of_k[k])
    out = RequestStream()
    new_index = [0] * (len(req) + 1)
    for r in range(len(req)):
        for k in moved.get(r, ()):
            out.append(FREE, life.size[k], rid_of_k[k], req.streams[life.alloc[k]], req.event_index[r])
        new_index[r] = len(out)
        if req.ops[r] == FREE and req.rids[r] in moved_rids:
            continue
        out.append(req.ops[r], req.sizes[r], req.rids[r], req.streams[r], req.event_index[r])
    return rewritten(trace, out, new_index)


def rewritten(trace: Trace, out: RequestStream, new_index: list[int]) -> Trace:
    """`trace` with its requests replaced by `out`; `new_index[r]` is where old request r went (its
    fallbacks and the segment events that happened at it follow it)."""
    req = trace.requests
    new_index[len(req)] = len(out)
    out.fallbacks = {new_index[i]: v for i, v in req.fallbacks.items()}
    if req.stack_ids is not None and out.stack_ids is None:  # each kept request keeps its call site
        ids = [-1] * len(out)
        for r in range(len(req)):
            k = new_index[r]
            if k < len(out) and out.rids[k] == req.rids[r] and out.ops[k] == req.ops[r]:
                ids[k] = req.stack_ids[r]
        out.stack_ids, out.stack_table = ids, req.stack_table
    if req.annotations and not out.annotations:  # each range keeps the requests it held
        out.annotations = [Annotation(a.name, new_index[a.start], new_index[a.end]) for a in req.annotations]
    seg = [replace(e, request_index=new_index[min(e.request_index, len(req))]) for e in trace.segment_events]
    return Trace(source=trace.source, device=trace.device, requests=out, segment_events=seg,
                 allocator_settings=dict(trace.allocator_settings), events=[], meta=dict(trace.meta or {}),
                 total_memory=trace.total_memory)


def _min_budget(trace: Trace, conf: str, reference: Trace) -> int | None:
    from alloctune.sim.sweep import sweep

    # to the one resolution (sim.resolution): `simulate --min-budget` of the written file answers the same
    return sweep(trace, [conf], find_min=True, reference=reference, rel_tol=WHAT_IF_REL_TOL,
                 abs_tol=WHAT_IF_ABS_TOL).rows[0].min_budget


def what_ifs(an: Analysis, ex: Explanation, *, source_arg: str, out_dir: str | Path | None = None,
             max_sites: int = MAX_SITE_WHAT_IFS) -> Explanation:
    """`ex` with its recording's min budget, per-site what-ifs (sites holding outlived bytes at the
    moment, most first) and one without any growing site's growth."""
    trace = an.trace
    conf = recorded_conf(trace)
    if not an.repeats.starts:
        return replace(ex, notes=ex.notes + ("no repetitions: no what-ifs (nothing outlives a repetition)",))
    base = _min_budget(trace, conf, trace)
    label_to_id = {lab: i for i, lab in enumerate(an.labels)}
    chosen = sorted((s for s in ex.sites if s.outlived_bytes > 0 and s.site in label_to_id),
                    key=lambda s: (not s.growing, -s.outlived_bytes))[:max_sites]
    results: list[WhatIfResult] = []
    rows = {s.site: s for s in ex.sites}
    conf_arg = f" -c '{conf}'" if conf else ""
    n = 0

    def run(what: str, sites: Sequence[int]) -> tuple[int | None, str]:
        nonlocal n
        n += 1
        t = free_at_repeat_end(an, sites)
        mb = _min_budget(t, conf, trace)
        name = f"what_if_{n}.atrace"
        if out_dir is not None:
            from alloctune.trace.compact import save_compact

            Path(out_dir).mkdir(parents=True, exist_ok=True)
            save_compact(t, Path(out_dir) / name)
        where = Path(out_dir) if out_dir is not None else Path("WHATIF_DIR")
        cmd = (f"alloctune explain {source_arg} --what-if-dir {where}  # writes {where / name}\n"
               f"alloctune simulate {where / name}{conf_arg} --min-budget")
        results.append(WhatIfResult(what, mb, None if mb is None or base is None else base - mb, cmd))
        return mb, cmd

    for s in chosen:
        mb, cmd = run(f"free the blocks of {s.site} that outlive their repetition at its end", [label_to_id[s.site]])
        rows[s.site] = replace(rows[s.site], min_budget_if_freed=mb, what_if_command=cmd)
    # Without the growth altogether: every growing site's kept blocks freed at their repetition's end
    # (with one growing site, its own what-if above is that number). Not "never made": the kept
    # tensor is usually needed in its step (logits for the loss); dropping it simulates another
    # program (on a real AdamW loop 10 % below the real min budget of the program without the list).
    growing = [i for i, (g, _) in an.growth.items() if g]
    if len(growing) > 1:
        run("without any growth: every growing site's kept blocks freed at each repetition's end", growing)
    return replace(ex, sites=tuple(rows[s.site] for s in ex.sites), what_if=tuple(results), min_budget=base)
