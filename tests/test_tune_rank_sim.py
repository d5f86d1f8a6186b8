"""A multi-process job is simulated rank by rank: each setting's answer is its neediest rank's."""

from __future__ import annotations

from alloctune.run.trial import TrialResult
from alloctune.tune.rank_sim import RankedSimulator, rank_snapshots, simulator_for

MiB = 1 << 20
# measured on the H200 (bench/gpu-results/batch13): rank 1 held more under the default, rank 0 with expandable
NEEDS = {"r0.pickle": {"": 2638 * MiB, "expandable_segments:True": 2236 * MiB},
         "r1.pickle": {"": 2700 * MiB, "expandable_segments:True": 1340 * MiB}}


class PerRank:
    def __init__(self, trial):
        self.snapshot = trial.snapshot
        self.calibrated_with = None
        self.note = "untagged" if trial.snapshot == "r1.pickle" else None

    def estimates(self, confs):
        return {c: NEEDS[self.snapshot].get(c) for c in confs}

    def floors(self, confs):
        return {c: v and v - 10 * MiB for c, v in self.estimates(confs).items()}

    def calibrate(self, trial):
        self.calibrated_with = trial.snapshot
        return "learned" if trial.snapshot == "c0.pickle" else None


def trial(snap, ranks=()):
    return TrialResult(("torchrun",), "", None, "ok", 0, 1.0, snapshot=snap, ranks=tuple(ranks))


def test_each_setting_takes_its_neediest_rank():
    base = trial("r1.pickle", [{"rank": 0, "snapshot": "r0.pickle"}, {"rank": 1, "snapshot": "r1.pickle"}])
    sim = simulator_for(base, PerRank)
    assert isinstance(sim, RankedSimulator)
    confs = ["", "expandable_segments:True"]
    # the neediest rank of the default run (rank 1) alone would say 1340 MiB for expandable
    assert sim.estimates(confs) == {"": 2700 * MiB, "expandable_segments:True": 2236 * MiB}
    assert sim.floors(confs)["expandable_segments:True"] == 2226 * MiB
    assert sim.note == "rank 1: untagged"


def test_a_capped_trial_calibrates_each_rank_with_its_own_recording():
    base = trial("r1.pickle", [{"rank": 0, "snapshot": "r0.pickle"}, {"rank": 1, "snapshot": "r1.pickle"}])
    sim = simulator_for(base, PerRank)
    said = sim.calibrate(trial("c1.pickle", [{"rank": 0, "snapshot": "c0.pickle"}, {"rank": 1, "snapshot": "c1.pickle"}]))
    assert said == "rank 0: learned"
    assert [s.calibrated_with for s in sim.ranks.values()] == ["c0.pickle", "c1.pickle"]


def test_a_single_process_gets_the_plain_simulator():
    assert isinstance(simulator_for(trial("one.pickle"), PerRank), PerRank)
    assert rank_snapshots(trial("x", [{"rank": 0, "snapshot": "r0.pickle"}])) == {}  # one rank: nothing to combine
