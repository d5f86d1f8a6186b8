"""The registry: every remedy one recording answers, and the release policy to recommend.

`explain` (the page and `--json`), `tune` (beside the settings, where the measured forms from
`remedy.measured` join them) and the report all read this one list, so a remedy has one name,
one min budget and one code line wherever it is shown.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Sequence

from alloctune.analysis.core import Analysis
from alloctune.progress import Progress, no_progress
from alloctune.remedy.janitor import janitor_plan, janitor_remedies
from alloctune.remedy.model import (
    Remedy,
    Shared,
    activity_of,
    collector_paused,
    recorded_conf,
    uncapped_run,
)
from alloctune.remedy.release import release_points, release_rewrites, repetition_ends
from alloctune.remedy.training import training_remedies
from alloctune.remedy.workspaces import workspace_remedies
from alloctune.sim.resolution import ABS_TOL
from alloctune.trace.model import Trace

if TYPE_CHECKING:
    from alloctune.sim.replay import SimResult


# The groups `simulated_remedies` works through, in order (its progress steps).
REMEDY_GROUPS = ("release policies", "workspace caps", "training remedies")


def simulated_remedies(
    an: Analysis,
    base_min_budget: int | None,
    conf: str | None = None,
    command: str = "CMD",
    base_run: SimResult | None = None,
    ends: list[int] | None = None,
    shared: Shared | None = None,
    progress: Progress = no_progress,
    steps: int = len(REMEDY_GROUPS),
) -> list[Remedy]:
    """Every remedy the recording alone can answer: release points, the Janitor's policies, the
    workspace caps that apply (the latter also without repetitions), and for a training recording
    activation checkpointing, the optimizer-state changes and the leak (`remedy.training`).
    `base_run`: the recording's `uncapped_run` under `conf` (each remedy compares with it) and `ends`:
    its `release.repetition_ends`, when the caller has them (else made here); `shared`: the work the
    recording's what-ifs and other remedies share (`remedy.model.Shared`). `progress` hears each group
    of `REMEDY_GROUPS` as it starts, counted of `steps` (a caller with steps of its own after these
    passes more)."""
    conf = recorded_conf(an.trace) if conf is None else conf
    with collector_paused():
        progress(f"simulating remedies: {REMEDY_GROUPS[0]}", 0, steps)
        if base_run is None and len(an.repeats.starts) >= 2:  # the release policies need it: made once for all
            base_run = uncapped_run(an.trace, conf, an.trace)
        base_act = None if base_run is None else activity_of(base_run)
        out = release_remedies(an, base_min_budget, conf, base_run, ends, shared)
        progress(f"simulating remedies: {REMEDY_GROUPS[1]}", 1, steps)
        out += workspace_remedies(an.trace, base_min_budget, conf, command=command, base_act=base_act)
        progress(f"simulating remedies: {REMEDY_GROUPS[2]}", 2, steps)
        return out + training_remedies(an, base_min_budget, conf, base_act, shared)


def release_remedies(
    an: Analysis,
    base_min_budget: int | None,
    conf: str,
    base_run: SimResult | None = None,
    ends: list[int] | None = None,
    shared: Shared | None = None,
) -> list[Remedy]:
    """The release policies alone: `empty_cache()` at repetition ends, then (when those apply) the
    Janitor's policies, simulated under `conf` (`base_run`, `ends`, `shared`: as `simulated_remedies`
    takes them)."""
    if len(an.repeats.starts) < 2:
        return []
    base_run = uncapped_run(an.trace, conf, an.trace) if base_run is None else base_run
    ends = repetition_ends(an) if ends is None else ends
    plan = None
    if shared is not None:  # the rewrites' replays started first, then the Janitor driven while they run
        release_rewrites(an, conf, ends, shared=shared)
        plan = janitor_plan(an, conf, ends, shared)
    out = release_points(an, base_min_budget, conf=conf, base_act=activity_of(base_run), ends=ends, shared=shared)
    if out:
        out += janitor_remedies(an, base_min_budget, conf, base_run, ends, shared, plan)
    return out


def best_release(remedies: Sequence[Remedy]) -> Remedy | None:
    """The release policy with the lowest min budget that saves memory; on a tie (within 1 MiB) the
    one with the fewest clean-ups (each one costs a device sync and re-allocation)."""
    found = [r for r in remedies if r.janitor is not None and r.min_budget is not None and (r.saving or 0) > 0]
    if not found:
        return None
    low = min(r.min_budget for r in found)  # type: ignore[type-var]
    near = [r for r in found if r.min_budget - low <= ABS_TOL]  # type: ignore[operator]
    return min(near, key=lambda r: (r.cleanups or 0, r.min_budget))


def no_grad_candidate(trace: Trace) -> Remedy | None:
    """The no-grad remedy as a candidate, when the recording's run record (the sidecar `alloctune record`
    writes) says modules were called with autograd on and nothing ran backward: what it saves needs a
    run of the program with autograd off (the agent's switch; `tune` makes that run itself)."""
    meta = trace.meta or {}
    counts = meta.get("autograd")
    if not isinstance(counts, dict) or not counts.get("module_calls_with_grad") or counts.get("backward_calls"):
        return None
    cmd = meta.get("command") or meta.get("cmd")
    command = shlex.join(str(a) for a in cmd) if isinstance(cmd, list) and cmd else "CMD"
    return Remedy.unconfirmed(
        "no_grad",
        "inference without autograd (the recording ran no backward, yet kept grad mode on)",
        "with torch.inference_mode():  # or torch.no_grad(), around the model's forward calls",
        recorded_conf(trace),
        confirm=f"alloctune run --no-grad --record nograd.pickle -- {command} && "
        "alloctune simulate nograd.pickle --min-budget  (or: alloctune tune ..., which makes this run itself)",
        notes=(f"{counts.get('module_calls_with_grad')} module call(s) with autograd on, no backward",),
    )
