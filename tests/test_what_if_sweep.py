"""#20.2: the snapshot what-ifs go through the one sweep service, with the same answers."""

from __future__ import annotations

import alloctune.sim.sweep as sweep_mod
from alloctune.diagnose.snapshot import diagnose_snapshot

CANDIDATES = ["", "expandable_segments:True", "max_split_size_mb:512", "backend:cudaMallocAsync"]


def test_what_ifs_are_one_sweep_with_one_capped_replay_each(traces_dir, monkeypatch):
    calls = []
    real = sweep_mod.sweep

    def spy(trace, confs, **kw):
        out = real(trace, confs, **kw)
        calls.append((list(confs), kw, [r.replays for r in out.rows]))
        return out

    monkeypatch.setattr(sweep_mod, "sweep", spy)
    d = diagnose_snapshot(traces_dir / "rvc_ec1/default_cap85.pickle.xz", candidates=CANDIDATES)
    (confs, kw, replays), = calls
    # the setting the simulator cannot model is reported, not swept; nothing bisected, nothing replayed uncapped
    assert confs == ["", "expandable_segments:True", "max_split_size_mb:512"]
    assert kw["find_min"] is False and kw["uncapped"] is False and replays == [1, 1, 1]
    by = {w.config: w for w in d.what_if}
    assert [w.config for w in d.what_if] == CANDIDATES
    assert (by[""].avoids_oom, by["expandable_segments:True"].avoids_oom, by["max_split_size_mb:512"].avoids_oom) \
        == (False, True, False)
    assert by["backend:cudaMallocAsync"].avoids_oom is None
    assert by["backend:cudaMallocAsync"].note.startswith("ConfigError: backend:cudaMallocAsync is a different")
    assert by["expandable_segments:True"].peak_reserved is not None


def test_a_setting_that_fails_earlier_says_where(traces_dir):
    d = diagnose_snapshot(traces_dir / "rvc_ec1/gc07_split256_cap115a.pickle.xz",
                          candidates=["", "expandable_segments:True"])
    by = {w.config: w for w in d.what_if}
    assert d.what_if[0].config == "garbage_collection_threshold:0.7,max_split_size_mb:256"
    assert "reproduces the OOM" in d.what_if[0].note
    assert by[""].avoids_oom is False and by[""].note == "fails earlier, at request 1808"
    assert by["expandable_segments:True"].avoids_oom is True
