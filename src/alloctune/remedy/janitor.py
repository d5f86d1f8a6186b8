"""The Janitor's policies, simulated: where `guard.Janitor` would empty the cache in the
recorded program, and what that buys.

Why the real class: the policy (headroom over the learned clean-start need, or "a request larger
than any since the last clean-up") depends on the memory state its own earlier clean-ups left, so
no fixed list of points reproduces it. The real `Janitor` is driven here with statistics from the
simulated allocator instead of `torch.cuda.memory_stats()`: one replay of the recording runs to
each repetition's end (where `repetition_ends` puts a service's "between requests") and pauses
(`sim.session`); the Janitor is asked `step()` there -- and, for the size policy, `before(size)`
of the next repetition -- and each clean-up it decides is an `empty_cache()` of the paused replay
on the spot, which then runs on: a clean-up changes everything after it and nothing before, so the
replay sees every earlier decision, as the program would.

A repetition's "size" for `before(size)` is its peak live bytes above where it started: the quantity
a service's own size (audio seconds, tokens) stands in for. Decisions are made on the uncapped replay;
under a cap the allocator's own retries free cached blocks too, so the Janitor's decisions there can
differ (said in the remedy's notes).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterator

from alloctune.analysis.core import Analysis
from alloctune.remedy.model import Remedy, Shared, activity_of, simulated, uncapped_run
from alloctune.remedy.release import repetition_ends, with_empty_cache

if TYPE_CHECKING:
    from alloctune.sim.replay import SimResult
    from alloctune.sim.session import Session

POLICIES: tuple[tuple[str, dict[str, Any], bool], ...] = (
    # (name, Janitor keyword arguments, whether the service passes each request's size)
    ("janitor", {}, False),
    ("janitor_by_size", {}, True),
)


def repetition_sizes(an: Analysis, ends: list[int]) -> list[int]:
    """Each repetition's peak live bytes above its starting level (repetition k runs from ends[k-1]
    to ends[k]; the first from the first repetition's start, the last to the recording's end)."""
    lb = an.live_before
    bounds = [an.repeats.starts[0]] + ends + [len(lb) - 1]
    return [max(lb[a : b + 1]) - lb[a] for a, b in zip(bounds, bounds[1:])]


@contextlib.contextmanager
def _private_counters() -> Iterator[None]:
    """The Janitor adds its clean-ups to the process's guard counters; simulated ones must not count."""
    from alloctune.guard import janitor as jmod
    from alloctune.guard.counters import GuardStats

    real = jmod.guard_stats
    jmod.guard_stats = GuardStats()
    try:
        yield
    finally:
        jmod.guard_stats = real


class _Memory:
    """The statistics the Janitor reads, from a paused replay (its `stats_fn` and `empty_cache`):
    reserved bytes are the replay's, allocated bytes the recording's live bytes at the pause."""

    def __init__(self, run: Session) -> None:
        self.run = run
        self.reserved = self.allocated = 0
        self.cleaned = False

    def stats(self) -> dict[str, int]:
        from alloctune.guard.janitor import ALLOCATED, RESERVED

        return {RESERVED: self.reserved, ALLOCATED: self.allocated}

    def empty_cache(self) -> None:
        self.cleaned = True
        self.run.empty_cache()
        self.reserved = self.run.reserved


def janitor_points(an: Analysis, conf: str, kwargs: dict[str, Any], by_size: bool, ends: list[int] | None = None) -> list[int]:
    """Request indices (of the recording) before which `Janitor(**kwargs)` empties the cache
    (`ends`: `repetition_ends`), from one uncapped replay paused at each repetition's end."""
    from alloctune.guard.janitor import Janitor
    from alloctune.sim.replay import start

    trace, lb = an.trace, an.live_before
    ends = repetition_ends(an) if ends is None else ends
    sizes = repetition_sizes(an, ends) if by_size else []
    points: list[int] = []
    run = start(trace, conf or None, reference=trace)
    mem = _Memory(run)
    with _private_counters():
        jan = Janitor(**kwargs, stats_fn=mem.stats, empty_cache=mem.empty_cache, clock=lambda: 0.0)
        if by_size:
            jan.before(sizes[0])  # nothing reserved yet: it only learns the first size
        for k, e in enumerate(ends):
            run.run(e)
            mem.reserved, mem.allocated, mem.cleaned = run.reserved, lb[e], False
            jan.step()
            if by_size:
                if mem.cleaned:  # just emptied: nothing idle, it only learns the next size
                    mem.allocated = mem.reserved
                jan.before(sizes[k + 1])
            if mem.cleaned:
                points.append(e)
    return points


def janitor_plan(an: Analysis, conf: str, ends: list[int], shared: Shared | None = None) -> list[list[int]]:
    """`janitor_points` of each of `POLICIES` under `conf`; with `shared`, each policy's rewrite is made
    and its replays started (in `shared`'s thread) while the next policy is driven."""
    plan = []
    for _, kwargs, by_size in POLICIES:
        points = janitor_points(an, conf, kwargs, by_size, ends)
        if shared is not None and points:
            trace = an.trace
            shared.prefetch(shared.rewrite(("empty_cache", tuple(points)), lambda: with_empty_cache(trace, points)), conf)
        plan.append(points)
    return plan


def janitor_remedies(
    an: Analysis,
    base: int | None,
    conf: str,
    base_run: SimResult | None = None,
    ends: list[int] | None = None,
    shared: Shared | None = None,
    plan: list[list[int]] | None = None,
) -> list[Remedy]:
    """The Janitor's policies on the recorded program, simulated (needs two repetitions or more);
    `base_run`: the recording's `uncapped_run` under `conf`, `ends`: its `repetition_ends`, `shared`:
    the work other remedies of the recording share, `plan`: `janitor_plan`, when at hand. Policies
    that decide the same clean-ups share one simulation."""
    if len(an.repeats.starts) < 2:
        return []
    trace = an.trace
    ends = repetition_ends(an) if ends is None else ends
    base_run = uncapped_run(trace, conf, trace) if base_run is None else base_run
    base_act = activity_of(base_run)
    plan = janitor_plan(an, conf, ends, shared) if plan is None else plan
    out: list[Remedy] = []
    found: dict[tuple[int, ...], Remedy] = {}
    for (name, kwargs, by_size), points in zip(POLICIES, plan):
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        use = "with janitor.request(size):  # size: the request's length" if by_size else "with janitor:"
        what = (
            "the Janitor, told each request's size (empties the cache before a request larger than any since the last clean-up)"
            if by_size
            else "the Janitor (empties the cache when reserved grows past 1.1 x the need learned from a clean start)"
        )
        how_to = f"janitor = alloctune.guard.Janitor({args}); around each request: {use}"
        policy = {"args": dict(kwargs), "use": "janitor.request(size)" if by_size else "janitor"}
        notes = (
            "decided on the uncapped replay: under a cap the allocator's own retries also free cached "
            "blocks, so the Janitor's clean-ups there may differ",
        )
        same = found.get(tuple(points))
        if same is None:
            t = (
                trace
                if not points
                else (
                    shared.rewrite(("empty_cache", tuple(points)), lambda: with_empty_cache(trace, points))
                    if shared
                    else with_empty_cache(trace, points)
                )
            )
            same = found[tuple(points)] = simulated(
                name,
                what,
                t,
                conf,
                trace,
                base,
                base_act,
                how_to,
                uncapped=None if points else base_run,
                cleanups=len(points),
                janitor=policy,
                notes=notes,
                shared=shared,
            )
        out.append(replace(same, name=name, what=what, how_to=how_to, cleanups=len(points), janitor=policy, notes=notes))
    return out
