"""How candidates are compared: completes under the budget, then lowest `min_budget`, with
throughput within 3 % of the best.

Why this order: the user's budget is their card, so a setting that does not complete there
is out. Among those that do, a lower `min_budget` is headroom — the same workload with
longer inputs or a neighbour on the GPU still fits. Throughput is a guard rather than a
goal: a setting that buys memory by running much slower (garbage collection or retry
storms) is not recommended when another one is within 3 % of the fastest; throughput is
only used when the workload reports it (wall time includes start-up noise).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from alloctune.tune.candidates import DEFAULT, Candidate
from alloctune.units import format_size

THROUGHPUT_TOLERANCE = 0.03


@dataclass(frozen=True)
class CandidateSummary:
    """What the sweep learned about one candidate."""

    candidate: Candidate
    feasible: bool | None  # completes at the user's budget; None = not tested (see note)
    outcome: str | None = None  # outcome at the user's budget
    min_budget: int | None = None  # smallest completing budget found (bytes)
    infeasible_below: int | None = None  # largest budget seen (or assumed) to fail
    throughput: float | None = None  # as printed by the workload, at the user's budget
    wall_s: float | None = None
    peak_reserved: int | None = None  # at the user's budget
    peak_allocated: int | None = None
    sim_min_budget: int | None = None  # the simulator's latest estimate (with the fallbacks a capped run showed)
    # the recording replayed as it was made: every request at the size the uncapped run asked for, none given up
    sim_as_recorded: int | None = None
    sim_optimistic: int | None = None  # the same if every workspace-shaped request could be given up (None: no difference)
    trials: int = 0
    note: str | None = None
    # min_budget proven on the GPU: a tested pass and a tested failure within the tolerance (confirm: 2 %)
    verified: bool | None = None
    sim_agrees: bool | None = None  # the simulated min_budget lies inside the measured bracket
    throughput_noise: float | None = None  # sample standard deviation of exclusive runs (None: one sample)
    throughput_samples: int = 0
    measurably_slower: bool | None = None  # slower than the default beyond tolerance and noise (noise rule)

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["candidate"] = self.candidate.to_dict()
        out["conf"] = self.candidate.conf
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CandidateSummary":
        kw = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        kw["candidate"] = Candidate.from_dict(data["candidate"])
        return cls(**kw)


@dataclass(frozen=True)
class Ranking:
    """The winner (or None) and, for every other candidate, why it lost."""

    best: CandidateSummary | None
    order: tuple[CandidateSummary, ...]
    reasons: dict[str, str] = field(default_factory=dict)  # conf -> why it lost

    def to_dict(self) -> dict[str, Any]:
        return {
            "best": self.best.to_dict() if self.best else None,
            "order": [s.candidate.conf for s in self.order],
            "reasons": dict(self.reasons),
        }


def rank(
    summaries: Sequence[CandidateSummary],
    budget: int,
    *,
    throughput_tolerance: float = THROUGHPUT_TOLERANCE,
    noise_rule: bool = False,
) -> Ranking:
    """Order candidates by the objective and explain every loss (pure; unit-tested).

    `noise_rule`: a candidate is too slow only when it was measured slower beyond the noise
    (`measurably_slower`, see `tune.throughput`); single samples never decide.
    """
    # Under the noise rule the default also competes when it completes at the budget without a
    # measured min_budget: it is what remains when every lower-memory setting is measurably slower.
    eligible = [s for s in summaries if s.feasible and (s.min_budget is not None or (noise_rule and s.candidate.knob == DEFAULT))]
    rates = [s.throughput for s in eligible if s.throughput is not None]
    best_rate = max(rates) if rates else None

    def too_slow(s: CandidateSummary) -> bool:
        if noise_rule:
            return bool(s.measurably_slower)
        return best_rate is not None and s.throughput is not None and s.throughput < (1 - throughput_tolerance) * best_rate

    fast = [s for s in eligible if not too_slow(s)]
    fast.sort(
        key=lambda s: (
            s.min_budget if s.min_budget is not None else budget,
            s.min_budget is None,
            -(s.throughput or 0.0),
            s.candidate.knob != DEFAULT,
            s.candidate.conf,
        )
    )
    best = fast[0] if fast else None
    reasons: dict[str, str] = {}
    for s in summaries:
        if s is best:
            continue
        reasons[s.candidate.conf] = _why_lost(s, best, best_rate, budget, throughput_tolerance, noise_rule)
    slow = sorted((s for s in eligible if too_slow(s)), key=lambda s: s.min_budget or budget)
    rest = [s for s in summaries if s not in eligible]
    return Ranking(best, tuple(fast + slow + rest), reasons)


def _why_lost(
    s: CandidateSummary,
    best: CandidateSummary | None,
    best_rate: float | None,
    budget: int,
    tol: float,
    noise_rule: bool = False,
) -> str:
    if s.feasible is None:
        return s.note or "not tested"
    if not s.feasible:
        what = s.outcome or "failed"
        return f"does not complete at the budget {format_size(budget)} ({what})"
    if s.min_budget is None:
        return s.note or "min_budget not measured"
    if noise_rule and s.measurably_slower:
        return s.note or "measurably slower than the default"
    if not noise_rule and best_rate is not None and s.throughput is not None and s.throughput < (1 - tol) * best_rate:
        slower = 100.0 * (1 - s.throughput / best_rate)
        return f"throughput {s.throughput:g} is {slower:.1f} % below the best ({best_rate:g}); more than {tol:.0%}"
    if best is None:
        return "no winner"
    if best.min_budget is None:
        return f"{best.candidate.label} was chosen: this one is measurably slower"
    if s.min_budget > best.min_budget:
        return (
            f"needs min_budget {format_size(s.min_budget)}, "
            f"{format_size(s.min_budget - best.min_budget)} more than {best.candidate.label}"
        )
    return f"same min_budget as {best.candidate.label} but lower throughput or a larger change"
