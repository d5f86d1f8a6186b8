"""`alloctune explain`: conservation on real recordings, and numbers checked against facts that
synthetic programs know by construction (tests/explain_programs.py), never against explain's own output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alloctune.analysis.core import analyse
from alloctune.explain import CATEGORIES, explain
from alloctune.explain.core import explain_trace
from alloctune.trace import load_trace
from alloctune.trace.compact import save_compact
from explain_programs import MiB, training_loop, write

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "src" / "alloctune" / "data" / "traces").glob("*.atrace"))


def _conserves(ex) -> None:
    cats = {c.name: c.bytes for c in ex.categories}
    assert list(cats) == list(CATEGORIES)
    assert all(v >= 0 for v in cats.values()), cats
    assert sum(cats.values()) == ex.moment["reserved"]
    assert cats["rounding"] == ex.moment["allocated"] - ex.moment["requested"]
    assert sum(s.bytes for s in ex.sites) == ex.moment["requested"]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_categories_sum_to_reserved_on_shipped_compact_traces(path):
    trace = load_trace(path)
    ex = explain_trace(trace)
    _conserves(ex)
    # the moment is the recorded peak (or the OOM the recording ends in)
    from alloctune.trace.model import peak_reserved

    if ex.moment["reason"] == "peak":
        assert ex.moment["reserved"] == peak_reserved(trace.segment_events)


def _shared(traces_dir, names):
    out = []
    for n in names:
        p = traces_dir / n
        if not p.exists():
            pytest.skip(f"{p} missing")
        out.append(p)
    return out


RVC = [f"rvc_ec{e}/{c}.pickle.xz" for e in (0, 1) for c in (
    "default", "default_cap85", "default_cap95", "expandable", "expandable_cap85", "expandable_cap95",
    "gc07_split256_cap115a", "max_split_128", "max_split_512", "roundup4", "roundup_intervals")]


@pytest.mark.parametrize("name", RVC)
def test_categories_sum_to_reserved_on_shared_h200_recordings(traces_dir, name):
    (path,) = _shared(traces_dir, [name])
    ex = explain_trace(load_trace(path))
    _conserves(ex)


def test_an_oom_recording_is_explained_where_the_failed_request_met_the_allocator(traces_dir):
    (path,) = _shared(traces_dir, ["llm/default_cap85.pickle.xz"])
    trace = load_trace(path)
    if trace.meta.get("outcome") != "oom":
        pytest.skip("this recording did not end in an OOM")
    ex = explain_trace(trace)
    _conserves(ex)
    assert ex.moment["reason"] == "oom"


def test_rvc_chunks_are_the_repetitions(traces_dir):
    (path,) = _shared(traces_dir, ["rvc_ec0/default.pickle.xz"])
    an = analyse(load_trace(path))
    assert an.repeats.count == 16  # 16 chunks (README of the shared traces)


# ---- a training loop with AdamW that keeps each step's logits, and its leak-free twin -----------

@pytest.fixture(scope="module")
def leak(tmp_path_factory):
    d = tmp_path_factory.mktemp("explain")
    snap, facts = training_loop(keep_logits=True)
    twin, twin_facts = training_loop(keep_logits=False)
    return write(snap, d / "leak.pickle"), facts, write(twin, d / "twin.pickle"), twin_facts, d


def test_model_gradient_and_optimizer_bytes_match_the_program(leak):
    path, facts, twin, _, _ = leak
    for p in (path, twin):
        ex = explain(p, what_if=False)
        _conserves(ex)
        assert ex.category("model_state") == facts.param_bytes
        assert ex.category("optimizer_state") == facts.optimizer_bytes
        assert ex.category("gradients") == facts.param_bytes  # the peak is in backward/step: every gradient live


def test_the_leak_line_grows_by_the_kept_tensor_per_step(leak):
    path, facts, twin, _, _ = leak
    ex = explain(path, what_if=False)
    top = max(ex.sites, key=lambda s: s.growing_bytes)
    assert top.site.startswith("/home/user/project/train.py:22")
    assert top.library_frame.startswith("torch/nn/modules/linear.py")
    assert top.growing and top.bytes_per_repeat == facts.kept_per_step
    # at the peak (inside the last step, after its forward) the list holds every step's logits
    assert top.growing_bytes == facts.kept_at_end
    assert ex.category("growing") == top.growing_bytes
    assert not any(s.growing for s in explain(twin, what_if=False).sites)


def test_freeing_the_leak_costs_what_the_leak_free_program_needs(leak):
    from alloctune.sim.sweep import sweep

    path, facts, twin, _, d = leak
    ex = explain(path, what_if_dir=d / "wi")
    site = next(s for s in ex.sites if s.growing)
    twin_min = sweep(load_trace(twin), [""], find_min=True).rows[0].min_budget
    assert site.min_budget_if_freed is not None
    assert abs(site.min_budget_if_freed - twin_min) <= 0.02 * twin_min
    assert ex.min_budget > site.min_budget_if_freed
    # the command reproduces the number
    w = next(w for w in ex.what_if if site.site in w.what)
    written = Path(w.command.splitlines()[-1].split()[2])
    assert written.is_file()
    again = sweep(load_trace(written), [""], find_min=True).rows[0].min_budget
    assert again == site.min_budget_if_freed


def test_against_splits_the_gap_exactly_and_names_the_leak(leak):
    from alloctune import api

    path, _, twin, _, _ = leak
    cmp = api.explain(path, against=twin)
    assert cmp.gap == cmp.this.reserved - cmp.other.reserved
    assert sum(cmp.categories.values()) == cmp.gap
    overhead = sum(cmp.categories[c] for c in ("cached_free", "inactive_split", "rounding"))
    assert sum(s.delta for s in cmp.sites) + sum(d for _, d in cmp.other_only) + overhead == cmp.gap
    best = max(cmp.sites, key=lambda s: s.delta)
    assert best.site.startswith("/home/user/project/train.py:22")


def test_without_stacks_categories_come_from_lifetimes(tmp_path):
    snap, facts = training_loop(keep_logits=True, stacks=False)
    ex = explain(write(snap, tmp_path / "nostack.pickle"), what_if=False)
    _conserves(ex)
    assert ex.stacks == "none"
    assert ex.category("model_state") == facts.param_bytes
    assert ex.category("optimizer_state") == facts.optimizer_bytes
    assert ex.category("gradients") == facts.param_bytes
    assert ex.category("growing") == facts.kept_at_end
    top = max(ex.sites, key=lambda s: s.growing_bytes)
    assert top.bytes_per_repeat == facts.kept_per_step


def test_grouping_by_file_merges_the_lines(leak):
    path = leak[0]
    by_line = explain(path, what_if=False)
    by_file = explain(path, what_if=False, group="file")
    assert sum(s.bytes for s in by_file.sites) == sum(s.bytes for s in by_line.sites)
    assert "/home/user/project/train.py" in {s.site for s in by_file.sites}
    assert len(by_file.sites) < len(by_line.sites)


def test_the_compact_trace_keeps_the_site_table(leak, tmp_path):
    path = leak[0]
    trace = load_trace(path)
    assert trace.requests.stack_table is not None and trace.requests.stack_table.stacks
    out = tmp_path / "leak.atrace"
    save_compact(trace, out)
    again = load_trace(out)
    assert again.requests.stack_ids == trace.requests.stack_ids
    assert again.requests.stack_table.frames == trace.requests.stack_table.frames
    a, b = explain(path, what_if=False).to_dict(), explain(out, what_if=False).to_dict()
    assert a["categories"] == b["categories"] and a["sites"] == b["sites"]


def test_at_an_event_index(leak):
    path = leak[0]
    ex = explain(path, what_if=False, at=40)
    _conserves(ex)
    assert ex.moment["reason"] == "at" and ex.moment["event"] == 40


def test_json_schema_fields(leak, capsys):
    from cli_run import run_cli

    code, out, err = run_cli(capsys, "explain", str(leak[0]), "--json", "--no-what-if")
    assert code == 0, err
    d = json.loads(out)
    assert d["schema"] == "alloctune.explain/2"
    assert set(d["moment"]) >= {"event", "time", "reserved", "allocated"}
    assert [c["name"] for c in d["categories"]] == list(CATEGORIES)
    assert all(set(c) >= {"name", "bytes", "how"} for c in d["categories"])
    assert set(d["overhead"]) == {"cached_free", "inactive_split", "rounding"}
    for s in d["sites"]:
        assert set(s) >= {"site", "library_frame", "bytes", "blocks", "growing", "growing_bytes", "bytes_per_repeat",
                          "min_budget_if_freed"}
    code, out, _ = run_cli(capsys, "explain", str(leak[0]), "--against", str(leak[2]), "--json")
    d = json.loads(out)
    assert code == 0 and "gap" in d and all("delta" in s for s in d["sites"])


# ---- the allocator's totals against what torch itself reported at the end of the real runs ----

@pytest.mark.parametrize("name", RVC + ["llm/default.pickle.xz", "llm/default_cap85.pickle.xz"])
def test_totals_at_the_end_match_torchs_own_memory_stats(traces_dir, name):
    """The sidecar's `stats` are torch.cuda.memory_stats() read by the recording process after
    its last event: reserved, allocated, requested and inactive_split_bytes must all agree."""
    (path,) = _shared(traces_dir, [name])
    trace = load_trace(path)
    stats = trace.meta["stats"]
    last = trace.requests.event_index[-1]
    ex = explain_trace(trace, at=last)
    _conserves(ex)
    assert ex.moment["reserved"] == stats["reserved_bytes.all.current"]
    assert ex.moment["allocated"] == stats["allocated_bytes.all.current"]
    assert ex.moment["requested"] == stats["requested_bytes.all.current"]
    assert ex.category("inactive_split") == stats["inactive_split_bytes.all.current"]


def test_the_totals_and_the_full_map_agree(traces_dir):
    """Two paths to the state at a moment (the native core's statistics, the Python model's map)."""
    from alloctune.analysis.repeats import live_before
    from alloctune.explain.moment import pick_moment
    from alloctune.memory_map.build import map_after_request, totals_after_request

    (path,) = _shared(traces_dir, ["rvc_ec1/default.pickle.xz"])
    trace = load_trace(path)
    mo = pick_moment(trace, live_before(trace.requests))
    tot, _ = totals_after_request(trace, mo.after, mo.reserved, mo.event)
    mm, _ = map_after_request(trace, mo.after, mo.reserved, mo.event)
    assert (tot.reserved, tot.allocated) == (mm.reserved, mm.allocated)
    assert tot.requested == sum(b.requested for s in mm.segments for b in s.blocks if b.allocated)
    assert tot.inactive_split == sum(s.free for s in mm.segments if s.live_blocks)


def test_at_a_time_in_seconds(leak):
    path = leak[0]
    ex = explain(path, what_if=False, at="0.0003s")  # the synthetic events are 3 µs apart
    _conserves(ex)
    assert ex.moment["reason"] == "at" and 95 <= ex.moment["event"] <= 100


def test_steps_of_varying_shape_are_found_from_stacks(tmp_path):
    snap, facts = training_loop(steps=10, keep_logits=True, vary=True)
    ex = explain(write(snap, tmp_path / "vary.pickle"), what_if=False)
    _conserves(ex)
    assert ex.repeats["count"] == facts.steps
    assert ex.category("model_state") == facts.param_bytes
    assert ex.category("optimizer_state") == facts.optimizer_bytes
    top = max(ex.sites, key=lambda s: s.growing_bytes)
    assert top.site.startswith("/home/user/project/train.py:22") and top.growing
    assert top.growing_bytes in facts.kept_after_step  # what the list held at the moment
    assert ex.repeats["starts"][0] == 4  # the loop's first allocation (after the 4 parameters)


def test_against_a_larger_input_without_stacks_names_the_requests_that_grew(tmp_path):
    """Two runs of one program at two input sizes, no stacks: sizes differ, so the requests are
    paired as `plan` pairs them and the gap lands on the site of the kept logits."""
    from alloctune import api

    small, fa = training_loop(keep_logits=True, stacks=False)
    big, fb = training_loop(keep_logits=True, stacks=False, logits=2 * (3 * MiB + 2048))
    cmp = api.explain(write(big, tmp_path / "big.pickle"), against=write(small, tmp_path / "small.pickle"))
    assert sum(cmp.categories.values()) == cmp.gap
    best = max(cmp.sites, key=lambda s: s.delta)
    assert f"({3 * MiB + 2048} bytes)" in best.site  # named by the smaller run's request size
    assert best.delta == fb.kept_at_end - fa.kept_at_end


def test_against_another_program_keeps_each_side_its_own_sites(tmp_path):
    from alloctune import api

    a, _ = training_loop(keep_logits=True, stacks=False)
    b, _ = training_loop(keep_logits=True, stacks=False, steps=3, params=(8 * MiB,))
    cmp = api.explain(write(b, tmp_path / "b.pickle"), against=write(a, tmp_path / "a.pickle"))
    overhead = sum(cmp.categories[c] for c in ("cached_free", "inactive_split", "rounding"))
    assert sum(s.delta for s in cmp.sites) + sum(d for _, d in cmp.other_only) + overhead == cmp.gap


def test_ranks_side_by_side_show_the_leaking_rank(tmp_path, capsys):
    """Rank 0 keeps its logits, rank 1 does not: the spread is on the leak line, by exactly what rank 0 keeps."""
    from cli_run import run_cli

    r0, f0 = training_loop(keep_logits=True)
    r1, _ = training_loop(keep_logits=False)
    p0, p1 = write(r0, tmp_path / "job.rank0.pickle"), write(r1, tmp_path / "job.rank1.pickle")
    code, out, err = run_cli(capsys, "explain", str(p1), str(p0), "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["schema"] == "alloctune.explain-ranks/1" and d["ranks"] == [0, 1]
    for e in d["explanations"]:
        assert sum(c["bytes"] for c in e["categories"]) == e["moment"]["reserved"]
    top = d["sites"][0]
    assert top["site"].startswith("/home/user/project/train.py:22")
    growing = next(c for c in d["categories"] if c["name"] == "growing")
    assert growing["bytes"] == [f0.kept_at_end, 0]
    code, _, err = run_cli(capsys, "explain", str(p0), str(p1), "--against", str(p1))
    assert code == 2 and err.count("\n") == 1


def test_without_its_run_record_the_recorded_addresses_map_the_moment(traces_dir, tmp_path):
    """A capped run whose cap is unknown (no sidecar): the simulation cannot reproduce it, so the
    state comes from the recorded addresses, and still conserves and names the OOM."""
    import shutil

    (path,) = _shared(traces_dir, ["rvc_ec1/gc07_split256_cap115a.pickle.xz"])
    bare = tmp_path / "x.pickle.xz"
    shutil.copy(path, bare)
    with_record = explain_trace(load_trace(path))
    ex = explain_trace(load_trace(bare))
    _conserves(ex)
    assert ex.map_source.startswith("recorded addresses")
    assert ex.moment["reserved"] == with_record.moment["reserved"]
    assert [c.bytes for c in ex.categories if c.name in ("cached_free", "rounding")] == \
        [c.bytes for c in with_record.categories if c.name in ("cached_free", "rounding")]
