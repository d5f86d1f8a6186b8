"""The sweep's answer: which setting to use, the exact lines to set it, and the evidence.

Kept apart from the strategy so the CLI, `--json` and a report all say the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from alloctune.tune.candidates import DEFAULT
from alloctune.tune.strategy import TuneResult
from alloctune.units import format_size


@dataclass(frozen=True)
class Recommendation:
    conf: str | None  # None: nothing completes at the budget; "": keep the default
    summary: str  # one sentence
    lines: dict[str, str] = field(default_factory=dict)  # shell -> text that sets it
    # the recommended setting's completing runs that survived OOMs the program caught (a library falling
    # back to smaller workspaces): {"ooms_caught", "run_budget", "fallback_free_budget"}; None: none did
    fallbacks: dict[str, Any] | None = None
    reasons: dict[str, str] = field(default_factory=dict)  # other conf -> why it lost

    def to_dict(self) -> dict[str, Any]:
        return {
            "conf": self.conf,
            "summary": self.summary,
            "lines": dict(self.lines),
            "reasons": dict(self.reasons),
            "fallbacks": dict(self.fallbacks) if self.fallbacks is not None else None,
        }


def recommend(result: TuneResult) -> Recommendation:
    best = result.ranking.best
    reasons = dict(result.ranking.reasons)
    budget = format_size(result.budget)
    if best is None and result.shortfall is not None:
        sf = result.shortfall
        label = sf.conf or "the default"
        how = (
            "its run at the budget ran out of memory, as simulated" if sf.confirmed else "its run at the budget did not settle it"
        )
        return Recommendation(
            None,
            f"no setting completes under {budget}: the closest, {label}, is simulated to need {format_size(sf.need)}, "
            f"{format_size(sf.missing)} ({sf.missing} bytes) more than the budget ({how}); no allocator setting "
            "closes that gap",
            reasons=reasons,
        )
    if best is None:
        return Recommendation(
            None,
            f"no tested setting completes under {budget}: the workload needs a bigger budget "
            f"(peak allocated without a budget: {format_size(result.baseline.peak_allocated or 0)})",
            reasons=reasons,
        )
    if best.candidate.knob == DEFAULT and best.min_budget is None:
        slower = any(s.measurably_slower for s in result.summaries)
        why = (
            "the settings that need less memory were measurably slower (see the candidates table)"
            if slower
            else "no other setting was shown to need less memory"
        )
        return Recommendation(
            "",
            f"keep the default: it completes under {budget}, and {why}; leave PYTORCH_CUDA_ALLOC_CONF unset",
            reasons=reasons,
        )
    if best.candidate.knob == DEFAULT:
        return Recommendation(
            "",
            f"keep the default: it completes under {budget} and needs the least memory of all tested settings "
            f"(min_budget {format_size(best.min_budget or 0)}); leave PYTORCH_CUDA_ALLOC_CONF unset",
            reasons=reasons,
        )
    from alloctune.config.shells import env_assignments, render_all

    lines = render_all(env_assignments(best.candidate.conf, torch=result.baseline.torch_version))
    default = next((s for s in result.summaries if s.candidate.knob == DEFAULT), None)
    vs = ""
    if default is not None and default.feasible is False:
        vs = "; the default does not complete there"
    elif (
        default is not None
        and default.feasible is None
        and default.sim_min_budget is not None
        and default.sim_min_budget > result.budget
    ):
        vs = "; the default does not complete there (simulated from its own recording)"
    elif default is not None and default.min_budget:
        vs = f" (default: {format_size(default.min_budget)})"
    return Recommendation(
        best.candidate.conf,
        f"use {best.candidate.conf}: completes under {budget} with min_budget {format_size(best.min_budget or 0)}{vs}"
        + _fallback_words(fallbacks := caught_fallbacks(result, best)),
        lines=lines,
        reasons=reasons,
        fallbacks=fallbacks,
    )


def caught_fallbacks(result: TuneResult, best: Any) -> dict[str, Any] | None:
    """The recommended setting's completing runs at or below the user's budget that survived OOMs the
    program caught itself (cuDNN answers a failed workspace with another algorithm): the most OOMs one
    such run caught, the budget of the lowest such run, and the budget where none happen.

    That budget is measured -- the lowest budget at which a run of the setting completed with no OOM
    caught -- or else simulated from the recording as it was made: every request at the size the
    uncapped run asked for, which is what cuDNN tries first under a cap, so a budget that holds them all
    needs no fallback. The simulation counts only when it lies above the run that caught them (below it,
    the replay and the run disagree and neither says where the fallbacks end: None, and the words say
    it was not measured)."""
    conf = best.candidate.conf
    runs = [
        t.result
        for t in result.trials
        if t.result.conf == conf and t.result.passed and t.result.budget is not None and t.result.budget <= result.budget
    ]
    caught = [r for r in runs if r.num_ooms]
    if not caught:
        return None
    lowest = min(int(r.budget or 0) for r in caught)
    clean = [int(r.budget or 0) for r in runs if not r.num_ooms and int(r.budget or 0) > lowest]
    recorded = best.sim_as_recorded
    free, how = (
        (min(clean), "measured") if clean else ((recorded, "simulated") if recorded and recorded > lowest else (None, None))
    )
    return {
        "ooms_caught": max(int(r.num_ooms or 0) for r in caught),
        "run_budget": lowest,
        "fallback_free_budget": free,
        "fallback_free_method": how,
    }


def _fallback_words(fb: dict[str, Any] | None) -> str:
    if fb is None:
        return ""
    if fb["fallback_free_method"] == "measured":
        free = f"; at {format_size(fb['fallback_free_budget'])} it ran with none caught (measured)"
    elif fb["fallback_free_method"] == "simulated":
        free = (
            f"; without fallbacks it needs about {format_size(fb['fallback_free_budget'])} (simulated, every "
            "request at the size the uncapped run asked for; not measured)"
        )
    else:
        free = (
            "; the budget where none happen was not measured (the recording holds only the workspaces taken "
            "uncapped): run at a larger budget with alloctune run --budget to find it"
        )
    return (
        f"; its completing run at {format_size(fb['run_budget'])} survived {fb['ooms_caught']} out-of-memory "
        "error(s) the program caught itself (a library such as cuDNN fell back to algorithms with smaller "
        f"workspaces, which can run slower){free}"
    )
