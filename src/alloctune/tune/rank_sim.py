"""Simulate a multi-process job (`torchrun --nproc-per-node N`) rank by rank.

Why: the cap applies to every rank-process alike and the trial's outcome is the worst rank's,
so a setting's smallest working budget is the largest of the ranks' own. Which rank that is
depends on the setting: on the H200, rank 1 of a 2-rank job held more under the default
(3086 vs 2898 MiB) but rank 0 needed more with `expandable_segments:True` (2200 vs
1340 MiB), and simulating only the default's neediest rank put the expandable budget at
1.31 GiB where the job needed 2.2 GiB. So each rank's recording is simulated and the
largest answer taken.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence

from alloctune.run.trial import TrialResult


def rank_snapshots(trial: TrialResult) -> dict[int, str]:
    """Rank -> recording of a multi-process trial (empty for a single process)."""
    out = {}
    for r in trial.ranks:
        if r.get("snapshot") and r.get("rank") is not None:
            out[int(r["rank"])] = str(r["snapshot"])
    return out if len(out) > 1 else {}


class RankedSimulator:
    """The `Simulator` protocol over one simulator per rank: answers are the largest over ranks."""

    def __init__(self, baseline: TrialResult, make: Callable[[TrialResult], Any]):
        self.ranks = {
            rank: make(replace(baseline, snapshot=snap, ranks=())) for rank, snap in sorted(rank_snapshots(baseline).items())
        }

    @staticmethod
    def _worst(answers: Sequence[dict[str, int | None]], confs: Sequence[str]) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for c in confs:
            vals = [a.get(c) for a in answers]
            out[c] = None if any(v is None for v in vals) else max(vals)  # type: ignore[type-var]
        return out

    @property
    def note(self) -> str | None:
        notes = {f"rank {r}: {s.note}" for r, s in self.ranks.items() if getattr(s, "note", None)}
        return "; ".join(sorted(notes)) or None

    @property
    def can_learn(self) -> bool:
        return any(getattr(s, "can_learn", False) for s in self.ranks.values())

    def estimates(self, confs: Sequence[str]) -> dict[str, int | None]:
        return self._worst([s.estimates(confs) for s in self.ranks.values()], confs)

    def floors(self, confs: Sequence[str]) -> dict[str, int | None]:
        return self._worst([s.floors(confs) for s in self.ranks.values()], confs)

    def calibrate(self, trial: TrialResult) -> str | None:
        """Each rank learns from its own recording of the capped trial."""
        snaps = rank_snapshots(trial)
        said = []
        for rank, sim in self.ranks.items():
            if rank in snaps:
                learned = sim.calibrate(replace(trial, snapshot=snaps[rank], ranks=()))
                if learned:
                    said.append(f"rank {rank}: {learned}")
        return "; ".join(said) or None


def simulator_for(baseline: TrialResult, make: Callable[[TrialResult], Any]) -> Any:
    """One simulator for the baseline's recording, or one per rank for a multi-process job."""
    return RankedSimulator(baseline, make) if rank_snapshots(baseline) else make(baseline)
