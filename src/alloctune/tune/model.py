"""The sweep's plain data and contracts, shared by its strategies (`strategy.py`, `confirm.py`).

What a tune is asked (`TuneSettings`), what it keeps (`TrialRecord`, `TuneResult`), and the
interfaces its parts meet: the `Evaluator` that runs a trial, the `Simulator` that predicts
from the baseline's recording, and the `Sweep` the confirm flow drives (the `Tuner`). Below
both strategies, so the confirm flow needs nothing of the module that starts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from alloctune.errors import InputError, WorkloadFailed
from alloctune.run.trial import TrialRequest, TrialResult
from alloctune.schema import schema_id
from alloctune.tune.candidates import SplitGrid
from alloctune.tune.objective import CandidateSummary, Ranking
from alloctune.tune.platform import this_platform
from alloctune.units import MiB

ALIGN = 2 * MiB


class Evaluator(Protocol):
    """Runs one trial: the workload under `conf` with a per-process cap of `budget` bytes."""

    def __call__(
        self, conf: str, budget: int | None, *, repeat: int = 0, record: bool = False, ensure_cap: bool = False
    ) -> TrialResult: ...


class Simulator(Protocol):
    """Predictions from a recorded trace (the real one wraps `alloctune.sim.sweep`).

    Optional: `calibrate(trial) -> str | None` learns from a capped recorded trial how the
    program adapts (fallible requests) and says what it learned; `note` says when
    predictions rest on requests the model could not tag.
    """

    def estimates(self, confs: Sequence[str]) -> dict[str, int | None]: ...


class TrialCrashed(WorkloadFailed):
    """A trial failed for a reason other than memory: the sweep cannot say anything useful."""


@dataclass(frozen=True)
class TuneSettings:
    command: tuple[str, ...]
    budget: int | None = None  # None = the whole card
    knobs: Mapping[str, Sequence[str]] = field(default_factory=dict)
    strategy: str = "confirm"  # confirm | exhaustive (alias auto) | grid
    simulate_first: bool = False  # exhaustive only: rank by simulation, verify the top three
    repeat: int = 1
    rel_tol: float = 0.01
    abs_tol: int = 16 * MiB
    max_split_points: int = 8
    verify_top: int = 3
    sim_margin: float = 0.02  # bracket around a simulated min_budget: ± this fraction
    platform: str = field(default_factory=this_platform)  # linux | windows: where the setting will be used
    max_gpu_runs: int = 10  # confirm: GPU runs after the baseline, at most
    confirm_abs_tol: int = 4 * MiB  # confirm: a proven bracket is within confirm_rel_tol or this
    widen_start: float = 0.015  # confirm: first widening step when the GPU contradicts, fraction of the estimate
    floor_margin: float = 0.04  # confirm: the opening runs go this far under the optimistic simulated min_budget
    confirm_rel_tol: float = 0.02  # confirm: a proven bracket is within this fraction (the 2 % target)
    opening_probes: int = 2  # confirm: side by side runs from the optimistic end of a simulated range down (≤ 3 runs in all)
    throughput_tolerance: float = 0.03
    ab_pairs: int = 2  # confirm: A/B repeat pairs at most when throughput might decide
    throughput_check: str = "auto"  # confirm: auto (measure only what the simulated allocator work cannot rule out) | measure
    # confirm: the most an allocator driver call costs, 0.1 ms + 2 µs per MiB: above the largest
    # cudaMalloc / cudaFree / expandable map / unmap measured on an H200 (bench/results/driver_cost.md)
    driver_call_s: float = 0.0001
    driver_mib_s: float = 2e-6
    sync_s: float = 0.02  # confirm: the most one synchronising retry costs (a device sync, cache released)
    remedies: bool = True  # confirm: program-level remedies beside the settings (one run per remedy to confirm)

    def __post_init__(self) -> None:
        if self.strategy == "auto":
            object.__setattr__(self, "strategy", "exhaustive")
        if self.strategy not in ("confirm", "exhaustive", "grid"):
            raise InputError(f"--strategy {self.strategy!r} is not known: use confirm, exhaustive or grid")
        if self.platform not in ("linux", "windows"):
            raise InputError(f"--platform {self.platform!r} is not known: use linux or windows")
        if self.repeat < 1:
            raise InputError("--repeat must be at least 1")
        if self.throughput_check not in ("auto", "measure"):
            raise InputError(f"--throughput {self.throughput_check!r} is not known: use auto or measure")


@dataclass(frozen=True)
class TrialRecord:
    """One trial as the sweep used it: the evidence, why it ran, and whether it came from the store."""

    result: TrialResult
    purpose: str
    reused: bool = False
    # seconds from the sweep's start to when it had this result (None: from the store); with the
    # result's `wall_s` it says where a tune's time went: the runs, or the work between them
    ended_at_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"purpose": self.purpose, "reused": self.reused, "ended_at_s": self.ended_at_s, **self.result.to_dict()}


@dataclass(frozen=True)
class Shortfall:
    """No setting fits the budget: the closest one, by how much the budget falls short, and
    what can help next. Why: running every candidate on the GPU to learn what the simulation
    already said costs several runs of the user's program and ends in the same place."""

    conf: str  # the closest setting ("" = the default)
    need: int  # its simulated min_budget (for a program that adapts: the optimistic end)
    budget: int
    confirmed: bool  # its one run at the budget ran out of memory, as simulated
    recording: str | None  # the baseline's recording (what explain / plan can read)
    next_steps: tuple[str, ...] = ()

    @property
    def missing(self) -> int:
        """Bytes the budget falls short of the closest setting's simulated need."""
        return max(0, self.need - self.budget)

    def to_dict(self) -> dict[str, Any]:
        return {
            "conf": self.conf,
            "need": self.need,
            "budget": self.budget,
            "missing": self.missing,
            "confirmed": self.confirmed,
            "recording": self.recording,
            "next_steps": list(self.next_steps),
        }


@dataclass(frozen=True)
class TuneResult:
    settings: TuneSettings
    budget: int
    total_memory: int | None
    baseline: TrialResult
    grid: SplitGrid
    summaries: tuple[CandidateSummary, ...]
    ranking: Ranking
    trials: tuple[TrialRecord, ...]
    notes: tuple[str, ...] = ()
    shortfall: Shortfall | None = None  # set when no setting fits the budget
    remedies: Any = None  # `tune.remedies.RemedyReport` (confirm flow)

    @property
    def fresh_trials(self) -> int:
        return sum(1 for t in self.trials if not t.reused)

    @property
    def in_runs_s(self) -> float:
        """Seconds of the sweep with at least one of its runs going: the union of the fresh trials'
        spans (`ended_at_s - wall_s` to `ended_at_s`). The rest of `elapsed_s` is alloctune's own
        work, which a tune should keep small beside the runs it cannot avoid."""
        spans = sorted((t.ended_at_s - t.result.wall_s, t.ended_at_s) for t in self.trials if t.ended_at_s is not None)
        total, reach = 0.0, float("-inf")
        for start, end in spans:
            if end > reach:
                total += end - max(start, reach)
                reach = end
        return round(total, 3)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": schema_id("tune", 2),
            "command": list(self.settings.command),
            "strategy": self.settings.strategy,
            "platform": self.settings.platform,
            "gpu_runs_after_baseline": sum(1 for t in self.trials[1:] if not t.reused),
            "simulate_first": self.settings.simulate_first,
            "budget": self.budget,
            "total_memory": self.total_memory,
            "grid": self.grid.to_dict(),
            "candidates": [s.to_dict() for s in self.summaries],
            "ranking": self.ranking.to_dict(),
            "trials": [t.to_dict() for t in self.trials],
            "trial_count": len(self.trials),
            "fresh_trials": self.fresh_trials,
            "in_runs_s": self.in_runs_s,
            "notes": list(self.notes),
            "shortfall": self.shortfall.to_dict() if self.shortfall is not None else None,
            **(
                self.remedies.to_dict()
                if self.remedies is not None
                else {"remedies": [], "utilization": None, "best_release": None}
            ),
        }


def align_down(n: int) -> int:
    return (n // ALIGN) * ALIGN


def align_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class Sweep(Protocol):
    """What the confirm flow uses of the sweep that runs it (`strategy.Tuner`)."""

    settings: TuneSettings
    notes: list[str]
    simulator_factory: Callable[[TrialResult], Simulator] | None

    def batch(self, requests: Sequence[TrialRequest]) -> list[TrialResult]: ...

    def fresh_runs_after_baseline(self) -> int: ...
