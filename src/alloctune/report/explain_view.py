"""What the explain page draws, computed from one recording: plain data, no rendering.

`explain_view(trace, ex)` takes the `Explanation` that `alloctune explain` printed and adds
what a page shows beyond the moment: the categories and the top sites over the whole run, and
the memory map at the moment with the allocation that owns every live block.

Over time, one pass replays the recording through the simulator's Python model (the same
settings and recorded segment addresses `memory_map.build.map_after_request` uses) and, at
a few hundred sample points, reads the allocator's totals and files every live block under a
category with explain's own rule (`explain.core._categorise`, given the blocks live there):
the categories at a sample point are what `explain --at` would print there, and at the moment
they are checked to equal the explanation's. The number of sample points shrinks with the
number of allocations (the rule reads every allocation once per point), so the pass stays
within a bounded cost; memory is one entry per live block plus the sampled numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from alloctune.errors import TraceError
from alloctune.explain.model import CATEGORIES, Explanation
from alloctune.memory_map.model import MemoryMap
from alloctune.trace.model import ALLOC, EMPTY_CACHE, FAILED_ALLOC, FREE, Trace

MAX_POINTS = 240  # sample points over the run (the chart is ~1100 px wide)
MIN_POINTS = 24
COST = 12_000_000  # sample points × allocations the category rule may read in all
TOP_SITES_SHOWN = 8  # sites drawn over time
OTHER = -1  # owner of a live block whose site is not in the explanation's list


@dataclass(frozen=True)
class OverTime:
    """Sampled after requests `request[i]`, recording events `event[i]` (the x axis: what `explain --at`
    takes; the same whether or not a cached snapshot has its events loaded)."""

    request: tuple[int, ...]
    event: tuple[int, ...]
    categories: dict[str, tuple[int, ...]]  # per category, bytes at each point (they sum to reserved)
    reserved: tuple[int, ...]
    allocated: tuple[int, ...]
    sites: tuple[tuple[int, tuple[int, ...]], ...]  # (row index in ex.sites, live requested bytes at each point)
    moment: int  # index of the explained moment among the points
    recorded_reserved: tuple[int, ...]  # what the recording itself held there (a check of the replay)
    # per phase (analysis.phases.PHASES, then "rounding"), allocated bytes at each point (they sum to allocated);
    # empty when the recording names no phase
    phases: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "request": list(self.request),
            "event": list(self.event),
            "categories": {k: list(v) for k, v in self.categories.items()},
            "phases": {k: list(v) for k, v in self.phases.items()},
            "reserved": list(self.reserved),
            "allocated": list(self.allocated),
            "sites": [{"site_row": i, "bytes": list(v)} for i, v in self.sites],
            "moment": self.moment,
        }


@dataclass(frozen=True)
class ExplainView:
    """An explanation with its run over time and the memory map at its moment."""

    explanation: Explanation
    over_time: OverTime
    memory_map: MemoryMap
    map_source: str
    owners: dict[int, tuple[int, str]]  # live block address -> (row index in ex.sites or OTHER, category)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "explanation": self.explanation.to_dict(),
            "over_time": self.over_time.to_dict(),
            "map_source": self.map_source,
            "notes": list(self.notes),
        }


def _sample_points(n: int, moment: int, n_alloc: int, max_points: int) -> list[int]:
    points = max(MIN_POINTS, min(max_points, COST // max(1, n_alloc)))
    pts = {round(i * (n - 1) / max(1, points - 1)) for i in range(points)} if n else set()
    if moment >= 0:
        pts.add(moment)
    return sorted(p for p in pts if 0 <= p < n)


def explain_view(trace: Trace, ex: Explanation, an: Any = None, max_points: int = MAX_POINTS) -> ExplainView:
    """The explanation `ex` of `trace` with its run over time and the map at its moment.

    `an`: the `explain.core.Analysis` explain used (recomputed with `ex.group` when None; it is
    deterministic, so the same)."""
    from alloctune.analysis.core import analyse

    if an is None:
        an = analyse(trace, ex.group)
    after = int(ex.moment["request"])
    samples = _sample_points(len(trace.requests), after, len(an.life.alloc), max_points)
    row_of_site, top_rows = _site_rows(ex, an)
    run = _replay_samples(trace, an, samples, after, row_of_site, top_rows)
    m = len(run.reserved)
    samples = samples[:m]
    if not samples:
        raise TraceError(f"{trace.source}: nothing to draw over time (the replay stopped before the first request)")
    recorded, moment_i = _check_against(trace, ex, samples, after, run)
    mm, map_source, owners = _map_and_owners(trace, an, ex, after, run.owners, row_of_site, run.notes)
    ot = OverTime(
        tuple(samples),
        tuple(trace.requests.event_index[s] for s in samples),
        {c: tuple(v) for c, v in run.categories.items()},
        tuple(run.reserved),
        tuple(run.allocated),
        tuple((r, tuple(col[:m])) for r, col in zip(top_rows, run.sites)),
        moment_i,
        recorded,
        {p: tuple(v[:m]) for p, v in run.phases.items()} if ex.phases else {},
    )
    return ExplainView(ex, ot, mm, map_source, owners, tuple(run.notes))


def _site_rows(ex: Explanation, an: Any) -> tuple[dict[int, int], list[int]]:
    """Each stack id's row in `ex.sites` (OTHER when not listed), and the rows drawn over time."""
    label_set = set(an.labels)
    rows = {s.site: i for i, s in enumerate(ex.sites) if s.site in label_set}
    row_of_site = {sid: rows.get(label, OTHER) for sid, label in enumerate(an.labels)}
    top_rows = [i for i, s in enumerate(ex.sites) if s.site in rows and s.bytes > 0][:TOP_SITES_SHOWN]
    return row_of_site, top_rows


@dataclass
class _Sampled:
    """What the replay read at the sample points: one value per point in each column."""

    categories: dict[str, list[int]]
    reserved: list[int]
    allocated: list[int]
    sites: list[list[int]]  # per drawn site row, live requested bytes
    phases: dict[str, list[int]] = field(default_factory=dict)  # per phase, then "rounding"
    owners: dict[int, int] = field(default_factory=dict)  # simulated block address -> allocation, at the moment
    notes: list[str] = field(default_factory=list)


def _replay_samples(
    trace: Trace, an: Any, samples: list[int], after: int, row_of_site: dict[int, int], top_rows: list[int]
) -> _Sampled:
    """One pass through the Python model with the settings, budget and recorded segment addresses
    of `map_after_request`, reading the totals and filing the live blocks at each sample point."""
    from alloctune.memory_map.build import _settings_and_budget
    from alloctune.sim.driver import H200_TOTAL
    from alloctune.sim.replay import _address_model, make_allocator

    life = an.life
    req = trace.requests
    top_index = {r: j for j, r in enumerate(top_rows)}
    settings, budget = _settings_and_budget(trace)
    alloc = make_allocator(
        settings,
        budget=budget,
        total_memory=int(trace.total_memory or H200_TOTAL),
        addresses=_address_model(trace, "recorded", None),
        record_events=False,
    )
    st = alloc.stats
    ops, sizes, rids, streams, fallbacks = req.ops, req.sizes, req.rids, req.streams, req.fallbacks
    blocks: dict[int, tuple[Any, int]] = {}  # rid -> (simulated block, allocation index)
    index: dict[int, int] = {}
    live: set[int] = set()
    k_next = 0
    from alloctune.analysis.phases import PHASES

    run = _Sampled({c: [] for c in CATEGORIES}, [], [], [[] for _ in top_rows], phases={p: [] for p in (*PHASES, "rounding")})
    si = 0
    for i in range(len(req)):
        if si >= len(samples):
            break
        op = ops[i]
        if op == ALLOC:
            k = k_next
            k_next += 1
            index[rids[i]] = k
            live.add(k)
            alloc.request_index = i
            b = alloc.malloc(sizes[i], streams[i])
            for fb in fallbacks.get(i, ()) if b is None else ():
                b = alloc.malloc(fb, streams[i])
                if b is not None:
                    break
            if b is None:
                run.notes.append(f"the simulation runs out of memory at request {i}, the recording did not")
                break
            blocks[rids[i]] = (b, k)
        elif op == FREE:
            k = index.pop(rids[i], None)
            if k is not None:
                live.discard(k)
            got = blocks.pop(rids[i], None)
            if got is not None:
                alloc.free(got[0])
        elif op == EMPTY_CACHE:
            alloc.request_index = i
            alloc.empty_cache()
        elif op == FAILED_ALLOC:
            alloc.request_index = i
            b = alloc.malloc(sizes[i], streams[i])
            if b is not None:
                alloc.free(b)
        if i != samples[si]:
            continue
        si += 1
        ks = sorted(live)
        _read_point(run, an, ks, i, st, row_of_site, top_index)
        if i == after:
            run.owners = {blocks[rids[life.alloc[k]]][0].addr: k for k in ks if rids[life.alloc[k]] in blocks}
    return run


def _read_point(
    run: _Sampled, an: Any, ks: list[int], i: int, st: Any, row_of_site: dict[int, int], top_index: dict[int, int]
) -> None:
    """Append one sample point: the categories of the live allocations `ks` after request `i` by
    explain's own rule (the overhead ones from the allocator's totals `st`), the drawn sites' bytes."""
    from alloctune.explain.core import _categorise

    life = an.life
    cats, _ = _categorise(an, ks, i)  # explain's own rule, with the blocks live here
    sums = dict.fromkeys(CATEGORIES, 0)
    per_top = [0] * len(top_index)
    by_phase = dict.fromkeys(run.phases, 0)
    phase_of = an.phase_of or []
    requested = 0
    for k in ks:
        size = life.size[k]
        sums[cats[k]] += size
        if phase_of:
            by_phase[phase_of[k]] += size
        requested += size
        j = top_index.get(row_of_site[an.site_of[k]])
        if j is not None:
            per_top[j] += size
    sums["rounding"] = st.allocated - requested
    sums["inactive_split"] = st.inactive_split_bytes
    sums["cached_free"] = st.reserved - st.allocated - st.inactive_split_bytes
    for c in CATEGORIES:
        run.categories[c].append(sums[c])
    by_phase["rounding"] = st.allocated - requested
    for p, v in by_phase.items():
        run.phases[p].append(v)
    run.reserved.append(st.reserved)
    run.allocated.append(st.allocated)
    for j, v in enumerate(per_top):
        run.sites[j].append(v)


def _check_against(trace: Trace, ex: Explanation, samples: list[int], after: int, run: _Sampled) -> tuple[tuple[int, ...], int]:
    """The recording's reserved bytes at the points (a note where the replay differs) and the
    moment's index among them; at the moment the categories must be the explanation's."""
    from alloctune.explain.moment import reserved_after

    rec_all = reserved_after(trace)
    recorded = tuple(rec_all[s] for s in samples)
    off = sum(1 for a, b in zip(run.reserved, recorded) if a != b)
    if off:
        run.notes.append(
            f"at {off} of {len(run.reserved)} sample points the simulated reserved bytes differ from "
            "the recording's; the overhead categories there are the simulation's"
        )
    moment_i = samples.index(after) if after in samples else 0
    if after in samples and run.reserved[moment_i] == ex.reserved:
        got = {c: run.categories[c][moment_i] for c in CATEGORIES}
        want = {c.name: c.bytes for c in ex.categories}
        if got != want:
            raise TraceError(
                f"{trace.source}: internal check failed: the categories over time give {got} at the moment, explain {want}"
            )
        phases = {p: col[moment_i] for p, col in run.phases.items()}
        if ex.phases and phases != {p.name: p.bytes for p in ex.phases}:
            raise TraceError(
                f"{trace.source}: internal check failed: the phases over time give {phases} at the "
                f"moment, explain {[p.to_dict() for p in ex.phases]}"
            )
    return recorded, moment_i


def _map_and_owners(
    trace: Trace, an: Any, ex: Explanation, after: int, owners_sim: dict[int, int], row_of_site: dict[int, int], notes: list[str]
) -> tuple[MemoryMap, str, dict[int, tuple[int, str]]]:
    """The memory map at the moment and, for each live block in it, its (site row, category): owners
    from the simulated blocks or, when the map is the recorded one, from the recorded addresses."""
    from alloctune.explain.core import _categorise
    from alloctune.memory_map.build import map_after_request

    life = an.life
    mm, map_source = map_after_request(trace, after, ex.reserved, int(ex.moment["event"]))
    owners: dict[int, tuple[int, str]] = {}
    cats_now, _ = _categorise(an, sorted(k for k in range(len(life.alloc)) if life.alloc[k] <= after < life.free[k]), after)
    if map_source.startswith("simulated"):
        addr_owner = owners_sim
    else:  # the map comes from the recorded addresses: so do the owners
        try:
            evs = trace.events or []  # a cached snapshot's events load here, once
        except (TraceError, OSError):
            evs = []
        addr_owner = {}
        for k in cats_now:
            e = trace.requests.event_index[life.alloc[k]]
            if 0 <= e < len(evs) and isinstance(evs[e].get("addr"), int):
                addr_owner[evs[e]["addr"]] = k
    for seg in mm.segments:
        for b in seg.blocks:
            k = addr_owner.get(b.addr)
            if b.allocated and k is not None and k in cats_now and life.size[k] == b.requested:
                owners[b.addr] = (row_of_site[an.site_of[k]], cats_now[k])
    live_blocks = sum(1 for s in mm.segments for b in s.blocks if b.allocated)
    if len(owners) != live_blocks:
        notes.append(
            f"{live_blocks - len(owners)} of {live_blocks} live blocks in the map could not be matched "
            "to their allocation; they are drawn without a site"
        )
    return mm, map_source, owners


def explain_recording(
    recording: Any,
    *,
    at: Any = None,
    group: str = "line",
    top: int = 20,
    what_if: bool = True,
    what_if_dir: Any = None,
    device: int | None = None,
    repeats: Sequence[int] | None = None,
    progress: Any = None,
    calibrations: Sequence[Any] = (),
) -> ExplainView:
    """Load a recording once, explain it exactly as `alloctune explain` does, and add the page's
    views (`explain_view`)."""
    from alloctune.analysis.core import analyse
    from alloctune.explain.api import explain, with_calibrations
    from alloctune.progress import no_progress
    from alloctune.trace import load_trace

    trace = recording if isinstance(recording, Trace) else load_trace(recording, device)
    trace, taught = with_calibrations(trace, calibrations)
    ex = explain(
        trace,
        at=at,
        group=group,
        top=top,
        what_if=what_if,
        what_if_dir=what_if_dir,
        repeats=repeats,
        progress=progress or no_progress,
    )
    if taught:
        from dataclasses import replace

        ex = replace(ex, notes=(*ex.notes, taught))
    return explain_view(trace, ex, analyse(trace, group, repeats))
