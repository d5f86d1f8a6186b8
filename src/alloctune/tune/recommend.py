"""The sweep's answer: which setting to use, the exact lines to set it, and the evidence.

Kept apart from the strategy so the CLI, `--json` and a report all say the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from alloctune.tune.candidates import DEFAULT
from alloctune.tune.strategy import TuneResult
from alloctune.units import format_mib


@dataclass(frozen=True)
class Recommendation:
    conf: str | None  # None: nothing completes at the budget; "": keep the default
    summary: str  # one sentence
    lines: dict[str, str] = field(default_factory=dict)  # shell -> text that sets it
    reasons: dict[str, str] = field(default_factory=dict)  # other conf -> why it lost

    def to_dict(self) -> dict[str, Any]:
        return {"conf": self.conf, "summary": self.summary, "lines": dict(self.lines), "reasons": dict(self.reasons)}


def recommend(result: TuneResult) -> Recommendation:
    best = result.ranking.best
    reasons = dict(result.ranking.reasons)
    budget = format_mib(result.budget)
    if best is None and result.shortfall is not None:
        sf = result.shortfall
        label = sf.conf or "the default"
        how = ("its run at the budget ran out of memory, as simulated" if sf.confirmed
               else "its run at the budget did not settle it")
        return Recommendation(
            None,
            f"no setting completes under {budget}: the closest, {label}, is simulated to need {format_mib(sf.need)}, "
            f"{format_mib(sf.missing)} ({sf.missing} bytes) more than the budget ({how}); no allocator setting "
            "closes that gap",
            reasons=reasons,
        )
    if best is None:
        return Recommendation(
            None,
            f"no tested setting completes under {budget}: the workload needs a bigger budget "
            f"(peak allocated without a budget: {format_mib(result.baseline.peak_allocated or 0)})",
            reasons=reasons,
        )
    if best.candidate.knob == DEFAULT and best.min_budget is None:
        slower = any(s.measurably_slower for s in result.summaries)
        why = ("the settings that need less memory were measurably slower (see the candidates table)" if slower
               else "no other setting was shown to need less memory")
        return Recommendation(
            "",
            f"keep the default: it completes under {budget}, and {why}; leave PYTORCH_CUDA_ALLOC_CONF unset",
            reasons=reasons,
        )
    if best.candidate.knob == DEFAULT:
        return Recommendation(
            "",
            f"keep the default: it completes under {budget} and needs the least memory of all tested settings "
            f"(min_budget {format_mib(best.min_budget or 0)}); leave PYTORCH_CUDA_ALLOC_CONF unset",
            reasons=reasons,
        )
    from alloctune.config.shells import env_assignments, render_all

    lines = render_all(env_assignments(best.candidate.conf, torch=result.baseline.torch_version))
    default = next((s for s in result.summaries if s.candidate.knob == DEFAULT), None)
    vs = ""
    if default is not None and default.feasible is False:
        vs = "; the default does not complete there"
    elif (default is not None and default.feasible is None and default.sim_min_budget is not None
          and default.sim_min_budget > result.budget):
        vs = "; the default does not complete there (simulated from its own recording)"
    elif default is not None and default.min_budget:
        vs = f" (default: {format_mib(default.min_budget)})"
    return Recommendation(
        best.candidate.conf,
        f"use {best.candidate.conf}: completes under {budget} with min_budget {format_mib(best.min_budget or 0)}{vs}",
        lines=lines,
        reasons=reasons,
    )
