"""What freeing a site's kept memory would buy, simulated: trace transformations fed to `sim.sweep`.

A what-if never replays anything itself: it rewrites the recording's request stream (a
site's blocks that outlived the repetition that made them are freed where that repetition
ends, instead of where the program freed them) and asks `sim.sweep` for the min budget of
the rewritten stream under the setting the recording ran with, beside the min budget of the
recording itself. The difference counts everything the kept blocks cost: their bytes and the
allocator overhead they cause (segments they pin, split remainders), which is why it is
usually larger than the bytes themselves. The rewrite and its min budget are the remedies' own
(`remedy.release.free_at_repeat_end`, `remedy.model.min_budget`): the leak remedy a training
recording gets is the same rewrite of its growing sites.

The rewritten stream can be written as a compact trace (`out_dir`: `explain --what-if-dir`), so each
number comes with the `alloctune simulate ... --min-budget` command that reproduces it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Sequence

from alloctune.analysis.core import Analysis
from alloctune.explain.model import Explanation, WhatIfResult
from alloctune.remedy.model import Shared, recorded_conf
from alloctune.remedy.release import free_at_repeat_end, freed_key

MAX_SITE_WHAT_IFS = 5


def what_ifs(
    an: Analysis,
    ex: Explanation,
    *,
    source_arg: str,
    out_dir: str | Path | None = None,
    max_sites: int = MAX_SITE_WHAT_IFS,
    shared: Shared | None = None,
) -> Explanation:
    """`ex` with its recording's min budget, per-site what-ifs (sites holding outlived bytes at the
    moment, most first) and one without any growing site's growth. `shared`: the rewrites and
    replays the recording's remedies share with them (the leak remedy is a what-if's rewrite)."""
    trace = an.trace
    conf = recorded_conf(trace)
    if not an.repeats.starts:
        return replace(ex, notes=ex.notes + ("no repetitions: no what-ifs (nothing outlives a repetition)",))
    shared = Shared(trace) if shared is None else shared
    label_to_id = {lab: i for i, lab in enumerate(an.labels)}
    chosen = sorted(
        (s for s in ex.sites if s.outlived_bytes > 0 and s.site in label_to_id), key=lambda s: (not s.growing, -s.outlived_bytes)
    )[:max_sites]
    growing = [i for i, (g, _) in an.growth.items() if g]
    # every rewrite made first, each one's replays started (in `shared`'s thread) while the next is made
    shared.prefetch(trace, conf)
    for sites in [[label_to_id[s.site]] for s in chosen] + ([growing] if len(growing) > 1 else []):
        shared.prefetch(shared.rewrite(freed_key(sites), lambda: free_at_repeat_end(an, sites)), conf)
    base = shared.min_budget(trace, conf)
    results: list[WhatIfResult] = []
    rows = {s.site: s for s in ex.sites}
    conf_arg = f" -c '{conf}'" if conf else ""
    n = 0

    def run(what: str, sites: Sequence[int]) -> tuple[int | None, str]:
        nonlocal n
        n += 1
        t = shared.rewrite(freed_key(sites), lambda: free_at_repeat_end(an, sites))
        mb = shared.min_budget(t, conf)
        name = f"what_if_{n}.atrace"
        if out_dir is not None:
            from alloctune.trace.compact import save_compact

            Path(out_dir).mkdir(parents=True, exist_ok=True)
            save_compact(t, Path(out_dir) / name)
        where = Path(out_dir) if out_dir is not None else Path("WHATIF_DIR")
        cmd = (
            f"alloctune explain {source_arg} --what-if-dir {where}  # writes {where / name}\n"
            f"alloctune simulate {where / name}{conf_arg} --min-budget"
        )
        results.append(WhatIfResult(what, mb, None if mb is None or base is None else base - mb, cmd))
        return mb, cmd

    for s in chosen:
        mb, cmd = run(f"free the blocks of {s.site} that outlive their repetition at its end", [label_to_id[s.site]])
        rows[s.site] = replace(rows[s.site], min_budget_if_freed=mb, what_if_command=cmd)
    # Without the growth altogether: every growing site's kept blocks freed at their repetition's end
    # (with one growing site, its own what-if above is that number). Not "never made": the kept
    # tensor is usually needed in its step (logits for the loss); dropping it simulates another
    # program (on a real AdamW loop 10 % below the real min budget of the program without the list).
    if len(growing) > 1:
        run("without any growth: every growing site's kept blocks freed at each repetition's end", growing)
    return replace(ex, sites=tuple(rows[s.site] for s in ex.sites), what_if=tuple(results), min_budget=base)
