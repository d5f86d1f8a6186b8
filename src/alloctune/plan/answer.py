"""Answers from a size-parametric trace: what fits where, by exact simulation.

For each allocator setting:
- the largest input size that completes on each card (a device of that total memory) and
  under each cap (a per-process budget on the recording's device), by bisection on the
  size grid — every probe generates the stream at that size and replays it;
- the min budget and the uncapped peak reserved as a function of size (the curve);
- for one size (`size=`): peak reserved, whether each card and cap completes, the min
  budget, and the smallest card.

Bisection assumes that a larger input never needs less memory, which the allocator does not
promise (under a cap, where a size's blocks land decides what fits); so the bisection's answer
is checked by replaying sizes 2 % apart below it, and the answer is the largest size below
which every probed size completes, with the larger one that completes again reported. Sizes outside the
recorded range are extrapolated and flagged. Without a fallible-request model (a request
the program would retry smaller, e.g. a cuDNN workspace) every failure is fatal, so the
answer can only be too small: it is marked conservative.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from fractions import Fraction
from typing import Any, Callable, Sequence

from alloctune.config.standard import setting_label
from alloctune.errors import InputError
from alloctune.plan.bound import ErrorModel
from alloctune.plan.edges import SCAN_RATIO, _beyond, _bisect, _optimistic_end, _window
from alloctune.plan.notes import above_peak_note, plan_notes
from alloctune.plan.result import (
    BOUND_LIMIT,
    EXTRAPOLATION_LIMIT,
    SCHEMA,
    STOPS,
    AtSize,
    CurvePoint,
    Largest,
    PlanResult,
    SettingPlan,
    Target,
)
from alloctune.plan.traceset import Generated, TraceSet, as_size, size_text, workspaces
from alloctune.progress import Progress, no_progress
from alloctune.sim.budget import min_budget
from alloctune.sim.driver import DEFAULT_OVERHEAD, H200_TOTAL
from alloctune.sim.replay import replay
from alloctune.sim.settings import SimSettings
from alloctune.units import MiB

# The records are defined in `result.py`; importers of this module find them here too.
__all__ = [
    "BOUND_LIMIT",
    "CARD_TOL",
    "EXTRAPOLATION_LIMIT",
    "SCHEMA",
    "STOPS",
    "AtSize",
    "CurvePoint",
    "Largest",
    "PlanResult",
    "SettingPlan",
    "Target",
    "plan",
]

CARD_TOL = 16 * MiB  # smallest-card bisection stops within this


class _Prober:
    """Generates streams (cached per size) and counts replays."""

    def __init__(self, ts: TraceSet, torch: str | None, context: int, optimistic: bool = False) -> None:
        self.ts = ts
        self.optimistic = optimistic
        self.torch = torch
        self.context = context
        self.replays = 0
        self.errors: ErrorModel | None = None
        self.failed: tuple[tuple[Any, int | None, bool], ...] = ()  # real runs that died (plan's `failed`)
        self._gen: dict[Fraction, Generated] = {}
        self._done: dict[tuple[Any, ...], Any] = {}

    def gen(self, x: Fraction) -> Generated:
        g = self._gen.get(x)
        if g is None:
            if len(self._gen) > 64:  # generated streams are big; keep the recent ones
                self._gen.pop(next(iter(self._gen)))
            g = self._gen[x] = self.ts.generate(x, fallible_inexact=self.optimistic)
        return g

    def run(self, x: Fraction, settings: SimSettings, target: Target | None) -> Any:
        key = (x, settings, target)
        r = self._done.get(key)
        if r is None:
            trace = self.gen(x).trace
            kw: dict[str, Any] = {"record_events": False, "timeline_points": 1, "overhead": self.context}
            if target is None:
                r = replay(trace, settings, **kw)
            elif target.kind == "card":
                r = replay(trace, settings, total_memory=target.bytes, **kw)
            else:
                r = replay(trace, settings, budget=target.bytes, **kw)
            self.replays += 1
            self._done[key] = r
        return r

    def completes(self, x: Fraction, settings: SimSettings, target: Target) -> bool:
        """Whether size `x` completes on `target` with room for the error bound at `x`: the
        stream must fit the target less that share (a card keeps its CUDA context whole)."""
        e = self.errors.at(x) if self.errors is not None else 0.0
        if e > 0:
            if target.kind == "cap":
                target = Target("cap", int(target.bytes / (1 + e)))
            else:
                target = Target("card", self.context + int((target.bytes - self.context) / (1 + e)))
        return bool(self.run(x, settings, target).completed)


def plan(
    ts: TraceSet,
    *,
    confs: Sequence[str] = ("",),
    cards: Sequence[int] = (),
    caps: Sequence[int] = (),
    size: Any = None,
    step: Any = None,
    max_size: Any = None,
    curve: Sequence[Any] | None = None,
    torch: str | None = None,
    context: int = DEFAULT_OVERHEAD,
    bounds: bool = True,
    progress: Progress = no_progress,
    errors: ErrorModel | None = None,
    failed: Sequence[tuple[Any, int | None, bool]] = (),
) -> PlanResult:
    """Answer the capacity questions for `ts` under each setting in `confs` (allocator strings).

    `step`: the size grid (default 1 for whole-number recorded sizes, else a hundredth of the
    smallest); `max_size`: top of the search (default: open-ended, doubling from 2x the largest
    recorded size until the target fails, at most `EXTRAPOLATION_LIMIT` x; `Largest.stopped` says which).
    `curve`: sizes for the min-budget curve (default: recorded sizes and points between/above).
    `bounds`: when the recordings carry no fallbacks but have requests that look like workspaces
    (no exact law, or freed by the very next request), also search with those requests fallible
    down to nothing: the real largest size lies between the two answers.
    `failed`: real runs that died, (input size, cap bytes, expandable segments): no answer for a budget at
    or below such a cap with that setting reaches the size (`Largest.stopped` "real-run").
    """
    t0 = time.perf_counter()
    sizes = ts.sizes
    grid, top = _search_range(sizes, step, max_size)
    limit = None if max_size is not None else max(top, ((sizes[-1] * EXTRAPOLATION_LIMIT) // grid) * grid)
    settings = [(text, SimSettings.from_config(text, torch)) for text in confs]
    targets = _targets(ts, cards, caps, context)
    card_sizes = [t.bytes for t in targets if t.kind == "card"]
    probe = _Prober(ts, torch, context)
    probe.errors = errors
    probe.failed = tuple(failed)
    inexact = len(workspaces(ts, ts.variants[0]))
    decided = ts.learned is not None and ts.learned.decided_by != "none"
    upper = _Prober(ts, torch, context, optimistic=True) if bounds and inexact and not ts.fallbacks and not decided else None
    if upper is not None:
        upper.errors = errors  # the optimistic end leaves the same room
    curve_sizes = sorted({as_size(x) for x in curve} if curve is not None else _default_curve(sizes, grid))
    at = as_size(size) if size is not None else None
    steps = len(settings) * (len(targets) + len(curve_sizes) + (at is not None))
    done = itertools.count()

    def say(step: str) -> None:
        progress(step, next(done), steps)

    out = [
        _plan_setting(text, st, probe, upper, targets, grid, top, limit, sizes, curve_sizes, at, torch, say)
        for text, st in settings
    ]
    progress("done", steps, steps)
    summary = ts.summary()
    notes = plan_notes(ts, summary, inexact, upper is not None, bool(card_sizes) or at is not None, context)
    fallible = _fallible(ts, out, inexact, context)
    above = _above_peak(out)
    if above is not None:
        notes.append(above)
    if errors is not None:
        notes.append(f"error bound: {errors.evidence}; every largest size leaves room for it (--json: bound)")
    elif targets:
        notes.append(
            "no error bound checked (a saved trace set, or fewer than three recorded sizes): the answers are "
            "the simulation of the fitted laws as they are"
        )
    return PlanResult(
        workload=ts.meta.get("workload"),
        recorded_sizes=tuple(size_text(s) for s in sizes),
        step=size_text(grid),
        search=(size_text(grid), size_text(max(_searched(out) or [top]))),
        settings=tuple(out),
        conservative=not ts.fallbacks and not decided,
        notes=tuple(notes),
        context_bytes=context,
        replays=probe.replays + (upper.replays if upper else 0),
        wall_s=time.perf_counter() - t0,
        traceset=summary,
        errors=errors.to_dict() if errors is not None else None,
        fallible=fallible,
    )


def _above_peak(plans: Sequence["SettingPlan"]) -> str | None:
    """The note on min budgets above their uncapped peak reserved, naming the `--size` answer first,
    else the largest excess."""
    answers: list[tuple[str, AtSize | CurvePoint]] = [(s.conf, s.at_size) for s in plans if s.at_size is not None]
    answers += sorted(((s.conf, p) for s in plans for p in s.curve), key=lambda c: c[1].peak_reserved - (c[1].min_budget or 0))
    above: dict[tuple[str, str], tuple[str, str, int, int]] = {}
    for conf, p in answers:
        if p.min_budget is not None and p.min_budget > p.peak_reserved:
            above.setdefault((conf, p.size), (conf, p.size, p.min_budget, p.peak_reserved))
    return above_peak_note(list(above.values()))


def _fallible(ts: TraceSet, plans: Sequence["SettingPlan"], inexact: int, context: int) -> dict[str, Any]:
    """What decided the workspace requests (`decided_by`: calibration / frames / store, or none), the
    evidence, and where an answer is still a range (conservative .. optimistic) the commands that make
    it one number (`record`)."""
    from alloctune.plan.fallible import record_hint

    learned = ts.learned
    decided = learned is not None and learned.decided_by != "none"
    out: dict[str, Any] = {
        "decided_by": learned.decided_by if decided else ("recorded fallbacks" if ts.fallbacks else "none"),
        "requests": learned.requests if decided else len(ts.fallbacks),
        "workspace_shaped": inexact,
        "evidence": [e.to_dict() for e in learned.evidence] if learned is not None else [],
        "range": False,
        "record": None,
    }
    for p in plans:
        for x in p.largest:
            if x.optimistic is not None and x.optimistic != x.largest:
                out["range"] = True
                if out["record"] is None:
                    budget = x.target.bytes if x.target.kind == "cap" else x.target.bytes - context
                    out["record"] = record_hint(ts, x.optimistic, budget)
    return out


def _search_range(sizes: Sequence[Fraction], step: Any, max_size: Any) -> tuple[Fraction, Fraction]:
    """The size grid and the top of the search (a whole number of steps)."""
    grid = _option_size(step, "--step") if step is not None else _default_step(sizes)
    top = _option_size(max_size, "--max-size") if max_size is not None else sizes[-1] * 2
    if top < grid:
        raise InputError(f"--max-size {size_text(top)} is below the size step {size_text(grid)}")
    return grid, (top // grid) * grid


def _targets(ts: TraceSet, cards: Sequence[int], caps: Sequence[int], context: int) -> list[Target]:
    """The cards and caps asked about, refused when they cannot be answered."""
    targets = [Target("card", int(c)) for c in cards] + [Target("cap", int(c)) for c in caps]
    for t in targets:
        if t.bytes <= 0:
            raise InputError(f"{t.kind} size must be positive, got {t.bytes}")
    total = ts.total_memory or H200_TOTAL
    for t in targets:
        if t.kind == "cap" and t.bytes > total:
            raise InputError(
                f"cap {t.label[4:]} is larger than the recording's device ({total} bytes); use --card for other cards"
            )
    card_sizes = [t.bytes for t in targets if t.kind == "card"]
    if card_sizes and context >= min(card_sizes):
        raise InputError(f"the CUDA context ({context} bytes) does not fit the smallest card ({min(card_sizes)} bytes)")
    return targets


def _below_real_failure(
    probe: "_Prober", st: SimSettings, t: Target, grid: Fraction, sizes: Sequence[Fraction], item: Largest
) -> Largest:
    """`item`, searched again below the smallest size a real run died at under this target's budget or a
    larger one with the same setting (`plan(failed=...)`: calibrations that died), when it reached it.

    Why: the simulation can under-estimate the program (its laws blind to a rounding between the recorded
    sizes, a workspace its fallback model shrinks too far); a real failure is a fact no answer may pass."""
    usable = t.bytes if t.kind == "cap" else t.bytes - probe.context
    fails = [
        as_size(x)
        for x, cap, expandable in probe.failed
        if expandable == st.expandable_segments and cap is not None and usable <= cap
    ]
    if not fails or item.largest is None or as_size(item.largest) < min(fails):
        return item
    bound = min(fails)
    below = ((bound - grid) // grid) * grid
    if below < grid:
        return replace(item, largest=None, first_failing=size_text(bound), stopped="real-run", strict=None)
    again = _largest(probe, st, t, grid, below, sizes)
    return replace(
        again,
        first_failing=size_text(bound) if again.first_failing is None else again.first_failing,
        stopped="real-run",
        searched_to=item.searched_to,
        probes=item.probes + again.probes,
    )


def _plan_setting(
    text: str,
    st: SimSettings,
    probe: "_Prober",
    upper: "_Prober | None",
    targets: Sequence[Target],
    grid: Fraction,
    top: Fraction,
    limit: Fraction | None,
    sizes: Sequence[Fraction],
    curve_sizes: Sequence[Fraction],
    at: Fraction | None,
    torch: str | None,
    say: Callable[[str], None],
) -> SettingPlan:
    """One setting's answers: the largest size per target, the min-budget curve, the budget at one size."""
    largest = []
    for t in targets:
        say(f"{setting_label(text)}: largest size on {t.label}")
        item = _below_real_failure(probe, st, t, grid, sizes, _largest(probe, st, t, grid, top, sizes, limit=limit))
        if upper is not None:
            hi = _largest(upper, st, t, grid, top, sizes, scan=False, limit=limit)
            item = replace(item, optimistic=_optimistic_end(item, hi))
        largest.append(item)
    points = []
    for x in curve_sizes:
        say(f"{setting_label(text)}: min budget at size {size_text(x)}")
        points.append(_curve_point(probe, st, x, torch, sizes))
    at_size = None
    if at is not None:
        say(f"{setting_label(text)}: min budget and smallest card at size {size_text(at)}")
        at_size = _at_size(probe, st, at, targets, torch, sizes)
    return SettingPlan(text, tuple(largest), tuple(points), at_size)


def _option_size(value: Any, option: str) -> Fraction:
    try:
        return as_size(value)
    except InputError:
        raise InputError(f"{option} must be a positive number, got {value!r}") from None


def _default_step(sizes: Sequence[Fraction]) -> Fraction:
    if all(s.denominator == 1 for s in sizes):
        return Fraction(1)
    return sizes[0] / 100


def _default_curve(sizes: Sequence[Fraction], grid: Fraction) -> set[Fraction]:
    lo, hi = sizes[0], sizes[-1]
    pts = set(sizes)
    for k in (1, 2, 3):
        pts.add(max(grid, ((lo + (hi - lo) * k / 4) // grid) * grid))
    for f in (Fraction(3, 2), Fraction(2)):
        pts.add(max(grid, ((hi * f) // grid) * grid))
    return pts


def _searched(plans: Sequence[SettingPlan]) -> list[Fraction]:
    return [as_size(x.searched_to) for p in plans for x in p.largest if x.searched_to is not None]


def _largest(
    probe: _Prober,
    st: SimSettings,
    t: Target,
    grid: Fraction,
    top: Fraction,
    recorded: Sequence[Fraction],
    scan: bool = True,
    limit: Fraction | None = None,
) -> Largest:
    """The largest size on the grid below which every size completes.

    The top of the search first: while it completes and lies under `limit`, it doubles (an
    open-ended search: `stopped` says whether a failing size ended it or the limit did).
    Bisection next (it assumes a larger input never needs less memory), then a check of that
    assumption: sizes on a `SCAN_RATIO` geometric grid from the smallest recorded size up to the
    answer are replayed too (`scan`; the optimistic bound skips it: it is a bound, and the
    check is most of the cost); the first one that fails starts a new bisection below it. (The
    allocator is not monotone in the input: a size can fail under a cap that a larger size
    fits, when its requests land in segments differently.) Last, the `WINDOW` sizes right below
    the answer (`_window`): near the edge whole residue classes can fail (sizes 1 and 2 mod 4)
    between sizes that fit, which a 2 % grid steps over; the size below which all of them complete is
    reported as `strict`.
    """
    before = probe.replays
    open_ended, limit = limit is not None, top if limit is None else limit
    lo = grid  # the largest size known to complete on the way up (bisection's low end)
    errors = getattr(probe, "errors", None)  # a prober without a bound answers as before
    meaningless = False
    edge = errors.edge(BOUND_LIMIT) if open_ended and errors is not None else None
    if edge is not None:
        edge = max(grid, (edge // grid) * grid)  # where the bound reaches BOUND_LIMIT: no answer past it
        if edge < limit:
            limit, top, meaningless = edge, min(top, edge), True
    while probe.completes(top, st, t) and top < limit:
        lo, top = top, min(limit, top * 2)
    reached = size_text(top)
    best: Fraction | None
    if probe.completes(top, st, t):
        best, fail = top, None
        stopped = ("bound" if meaningless else "extrapolation") if open_ended else "max-size"
    elif not probe.completes(grid, st, t):
        return Largest(t, None, size_text(grid), grid < recorded[0], probe.replays - before, searched_to=reached)
    else:
        best, fail = _bisect(probe, st, t, grid, int(lo / grid), int(top / grid))
        stopped = "exceeded"
    again = None
    prev: Fraction | None = None  # the last scanned size that completed
    for x in _scan(recorded[0], best, grid) if scan else ():
        if probe.completes(x, st, t):
            prev = x
            continue
        again = best
        if prev is not None:
            best, fail = _bisect(probe, st, t, grid, int(prev / grid), int(x / grid))
        elif x > grid and probe.completes(grid, st, t):
            best, fail = _bisect(probe, st, t, grid, 1, int(x / grid))
        else:
            best, fail = None, x
        break
    strict = None
    if best is not None and scan:
        below, lowest = _window(probe, st, t, grid, best)
        if lowest is not None:
            strict = size_text(below) if below is not None else "0"
    if fail is not None:
        stopped = "exceeded"
        if again is None and scan:
            again = _beyond(probe, st, t, grid, fail, limit)
    return Largest(
        t,
        size_text(best) if best is not None else None,
        size_text(fail) if fail is not None else None,
        best is not None and not recorded[0] <= best <= recorded[-1],
        probe.replays - before,
        size_text(again) if again is not None else None,
        stopped=stopped,
        searched_to=reached,
        strict=strict,
        bound=errors.at(best) if errors is not None and best is not None else None,
    )


def _scan(start: Fraction, stop: Fraction, grid: Fraction) -> list[Fraction]:
    """Grid sizes from `start` to below `stop`, about 2 % apart."""
    out: list[Fraction] = []
    x = max(grid, (start // grid) * grid)
    while x < stop:
        out.append(x)
        nxt = ((x * SCAN_RATIO) // grid) * grid
        x = nxt if nxt > x else x + grid
    return out


def _curve_point(probe: _Prober, st: SimSettings, x: Fraction, torch: str | None, recorded: Sequence[Fraction]) -> CurvePoint:
    g = probe.gen(x)
    base = probe.run(x, st, None)
    mb = min_budget(g.trace, st, torch=torch)
    probe.replays += mb.replays
    return CurvePoint(size_text(x), base.peak_reserved, base.peak_allocated, mb.budget, not recorded[0] <= x <= recorded[-1])


def _at_size(
    probe: _Prober, st: SimSettings, x: Fraction, targets: Sequence[Target], torch: str | None, recorded: Sequence[Fraction]
) -> AtSize:
    g = probe.gen(x)
    point = _curve_point(probe, st, x, torch, recorded)
    completes = {t.label: probe.completes(x, st, t) for t in targets}
    return AtSize(
        size_text(x),
        point.peak_reserved,
        point.peak_allocated,
        point.min_budget,
        _smallest_card(probe, st, x),
        completes,
        tuple(g.notes()),
    )


def _smallest_card(probe: _Prober, st: SimSettings, x: Fraction) -> int | None:
    """Bisection on a card's total memory (context included) for the smallest that completes."""
    base = probe.run(x, st, None)
    if not base.completed:
        return None
    lo = probe.context + max(0, base.peak_requested - 1)  # below live bytes + context nothing fits
    hi = probe.context + base.peak_reserved
    while not probe.completes(x, st, Target("card", hi)):
        lo = hi
        hi *= 2
        if hi > 1 << 50:
            return None
    while hi - lo > CARD_TOL:
        mid = (lo + hi) // 2
        if probe.completes(x, st, Target("card", mid)):
            hi = mid
        else:
            lo = mid
    return int(hi)
