"""The sweep service: one row per setting, the same numbers the simulator gives one by one."""

from alloctune.config import AllocatorConfig
from alloctune.sim import min_budget, replay
from alloctune.config.standard import STANDARD_CONFS
from alloctune.sim.sweep import sweep
from alloctune.trace.model import ALLOC, FREE, RequestStream, Trace

MiB = 1 << 20


def _trace():
    rs = RequestStream()
    sizes = [300, 50, 700, 120, 900, 64, 400]
    for k, mb in enumerate(sizes):
        rs.append(ALLOC, mb * MiB + 123, k, 0, len(rs))
        if k % 2:
            rs.append(FREE, mb * MiB + 123, k - 1, 0, len(rs))
    return Trace("synthetic", 0, rs, [], {}, total_memory=8 << 30)


def test_rows_match_replay_and_min_budget_one_by_one():
    t = _trace()
    budget = 2 << 30
    result = sweep(t, STANDARD_CONFS, budget=budget)
    assert [r.conf for r in result.rows] == [AllocatorConfig.parse(c).format() for c in STANDARD_CONFS]
    for conf, row in zip(STANDARD_CONFS, result.rows):
        config = AllocatorConfig.parse(conf)
        free = replay(t, config, record_events=False, timeline_points=1)
        capped = replay(t, config, budget=budget, record_events=False, timeline_points=1)
        assert (row.peak_reserved, row.peak_allocated, row.retries) == (
            free.peak_reserved, free.peak_allocated, free.num_alloc_retries)
        assert row.min_budget == min_budget(t, config).budget
        assert row.at_budget == capped.completed and row.peak_reserved_at_budget == capped.peak_reserved
    data = result.to_dict()
    assert data["schema"] == "alloctune.sweep/1" and len(data["rows"]) == len(STANDARD_CONFS)
    assert data["untagged_note"] is None  # nothing here is freed right after allocation: no possible workspace


def test_find_min_off_and_no_budget_cost_one_replay_per_setting():
    result = sweep(_trace(), ("", "expandable_segments:True"), find_min=False)
    assert all(r.replays == 1 and r.min_budget is None and r.at_budget is None for r in result.rows)


def test_a_what_if_pays_one_capped_replay_per_setting():
    t = _trace()
    budget = 2 << 30
    rows = sweep(t, ("", "expandable_segments:True"), budget=budget, find_min=False, uncapped=False).rows
    assert all(r.replays == 1 and r.peak_reserved is None for r in rows)
    full = sweep(t, ("", "expandable_segments:True"), budget=budget, find_min=False).rows
    assert [r.at_budget for r in rows] == [r.at_budget for r in full]
    assert [r.peak_reserved_at_budget for r in rows] == [r.peak_reserved_at_budget for r in full]


def test_settings_replayed_side_by_side_give_the_rows_of_one_after_another(traces_dir, monkeypatch):
    """Where the native core is built, a sweep's settings replay in threads: the rows (every field) are
    the ones one at a time gives, in the order asked, and the progress still counts up in that order."""
    import threading

    import alloctune.sim.sweep as sw
    from alloctune.sim import native
    from alloctune.trace import load_trace

    if not native.available():
        import pytest

        pytest.skip("the native simulator core is not built: a sweep runs one setting at a time")
    trace = load_trace(traces_dir / "rvc_ec0" / "default.pickle.xz")
    confs = list(STANDARD_CONFS)
    names: set[str] = set()
    real = sw.simulate_setting

    def named(*args, **kwargs):
        names.add(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(sw, "simulate_setting", named)
    monkeypatch.setattr(sw.os, "cpu_count", lambda: 4)
    steps: list[tuple[str, int]] = []
    side = sweep(trace, confs, budget=2 << 30, progress=lambda step, done=0, total=None: steps.append((step, done)))
    assert names and all(n.startswith("alloctune-sweep") for n in names)
    assert [d for _, d in steps] == list(range(len(confs) + 1))
    monkeypatch.setattr(sw, "SWEEP_THREADS", 1)
    names.clear()
    one = sweep(trace, confs, budget=2 << 30)
    assert names == {"MainThread"}
    assert [r.to_dict() for r in side.rows] == [r.to_dict() for r in one.rows]
    assert sw.sweep_threads(len(confs), object()) == 1  # an address model object is shared by the replays: no threads


def test_simulate_gives_the_same_rows_with_its_settings_side_by_side(traces_dir, monkeypatch):
    """`alloctune simulate --min-budget` replays its settings through the same side-by-side helper."""
    import alloctune.sim.sweep as sw
    from alloctune.sim.simulate import simulate

    trace = traces_dir / "rvc_ec0" / "default.pickle.xz"
    confs = ["", "expandable_segments:True", "max_split_size_mb:128"]
    monkeypatch.setattr(sw.os, "cpu_count", lambda: 4)
    side = simulate(trace, confs, find_min=True).to_dict()
    monkeypatch.setattr(sw, "SWEEP_THREADS", 1)
    one = simulate(trace, confs, find_min=True).to_dict()
    assert side == one and [r["min_budget"] for r in side["rows"]] == [r["min_budget"] for r in one["rows"]]
