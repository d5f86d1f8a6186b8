"""#29.1: release points, simulated. `empty_cache()` where every repetition ends, applied to a recording
made without it, must give what the same program that really called it reached: the shared H200 RVC
recordings exist both ways (rvc_ec0: never empties the cache; rvc_ec1: `empty_cache()` after every chunk,
as RVC's pipeline does), and each run's real peak reserved is in its sidecar (torch's own
`memory_stats()`)."""

from __future__ import annotations

import json

import pytest

from alloctune.analysis.core import analyse
from alloctune.remedy.release import release_points, repetition_ends, with_empty_cache
from alloctune.trace import load_trace
from alloctune.trace.model import EMPTY_CACHE


@pytest.mark.parametrize("setting", ["default", "expandable", "roundup4"])
def test_empty_cache_after_every_chunk_gives_the_real_peak_of_the_program_that_does_it(traces_dir, setting):
    an = analyse(load_trace(traces_dir / "rvc_ec0" / f"{setting}.pickle.xz"))
    assert an.repeats.count == 16  # the 16 chunks the program converted
    every = release_points(an, None, every=(1,))[0]
    real = json.loads((traces_dir / "rvc_ec1" / f"{setting}.json").read_text())["stats"]["reserved_bytes.all.peak"]
    assert every.peak_reserved == real
    assert every.extra_driver_calls > 0 and every.extra_seconds > 0 and "Janitor(every_n=1)" in every.how_to
    assert every.janitor == {"args": {"every_n": 1}, "use": "janitor"}


def test_release_points_sit_where_the_live_bytes_are_lowest(traces_dir):
    an = analyse(load_trace(traces_dir / "rvc_ec0" / "default.pickle.xz"))
    ends = repetition_ends(an)
    lb, starts = an.live_before, an.repeats.starts
    assert len(ends) == len(starts) - 1
    for j, e in enumerate(ends):
        assert starts[j] < e <= starts[j + 1] and lb[e] == min(lb[starts[j] + 1 : starts[j + 1] + 1])
    t = with_empty_cache(an.trace, ends[:3])
    assert t.requests.count(EMPTY_CACHE) == an.trace.requests.count(EMPTY_CACHE) + 3
    assert len(t.requests) == len(an.trace.requests) + 3


def test_explain_json_carries_the_remedies(traces_dir):
    from alloctune import api

    d = api.explain(traces_dir / "rvc_ec0" / "default.pickle.xz").to_dict()
    names = [r["name"] for r in d["remedies"]]
    assert names[:2] == ["empty_cache_each_repetition", "empty_cache_every_2_repetitions"]
    assert {"janitor", "janitor_by_size"} <= set(names)
    r = d["remedies"][0]
    assert r["method"] == "simulated" and r["saving"] == d["min_budget"] - r["min_budget"] > 0
    assert r["what"] == "empty_cache() at the end of every repetition" and r["how_to"]
    # one utilization row for the recording and one per remedy, each ratio from its own peaks
    util = d["utilization"]
    assert [row["name"] for row in util["rows"]][:len(names) + 2] == ["as it ran", *names, "expandable_segments:True"]
    for row in util["rows"]:
        if row["peak_reserved"]:
            assert row["utilization"] == row["peak_allocated"] / row["peak_reserved"]
    assert util["reachable"] is False and "is not reached" in util["held_back"]


def _stepwise_janitor_run(trace, ends, by_size, sizes, **kwargs):
    """An independent run of the real Janitor: one pass of the Python allocator model, the Janitor
    reading its live statistics at each repetition end and emptying its cache for real."""
    from alloctune.guard.janitor import ALLOCATED, RESERVED, Janitor
    from alloctune.sim.replay import make_allocator
    from alloctune.sim.settings import SimSettings
    from alloctune.trace.model import ALLOC, FREE

    alloc = make_allocator(SimSettings(), total_memory=trace.total_memory or 150109880320)
    st = alloc.stats
    jan = Janitor(stats_fn=lambda: {RESERVED: st.reserved, ALLOCATED: st.allocated}, empty_cache=alloc.empty_cache,
                  clock=lambda: 0.0, **kwargs)
    req, live, cleaned_at, k = trace.requests, {}, [], 0
    if by_size:
        jan.before(sizes[0])
    for i in range(len(req)):
        if k < len(ends) and i == ends[k]:
            step = jan.step()
            did = step.cleaned
            if by_size:
                b = jan.before(sizes[k + 1])
                did = did or b is not None
            if did:
                cleaned_at.append(i)
            k += 1
        if req.ops[i] == ALLOC:
            live[req.rids[i]] = alloc.malloc(req.sizes[i], req.streams[i])
        elif req.ops[i] == FREE and req.rids[i] in live:
            alloc.free(live.pop(req.rids[i]))
    return cleaned_at, st.reserved_peak


@pytest.mark.parametrize("by_size", [False, True])
def test_janitor_points_are_where_the_real_janitor_cleans_in_one_live_pass(traces_dir, by_size):
    from alloctune.remedy.janitor import janitor_points, repetition_sizes
    from alloctune.remedy.model import activity

    an = analyse(load_trace(traces_dir / "rvc_ec0" / "default.pickle.xz"))
    ends = repetition_ends(an)
    points = janitor_points(an, "", {}, by_size)
    cleaned, peak = _stepwise_janitor_run(an.trace, ends, by_size, repetition_sizes(an, ends))
    assert points == cleaned and points
    assert activity(with_empty_cache(an.trace, points), "", an.trace)[0] == peak


def test_janitor_told_sizes_matches_the_program_that_empties_after_every_chunk(traces_dir):
    """RVC's chunks come in random lengths: the Janitor's size policy cleans only before a chunk larger than
    any since, yet reaches (within 1 %) the real peak of the program that empties the cache after every chunk."""
    an = analyse(load_trace(traces_dir / "rvc_ec0" / "default.pickle.xz"))
    from alloctune.remedy.janitor import janitor_remedies

    by_size = next(r for r in janitor_remedies(an, None, "") if r.name == "janitor_by_size")
    real = json.loads((traces_dir / "rvc_ec1" / "default.json").read_text())["stats"]["reserved_bytes.all.peak"]
    assert by_size.cleanups is not None and by_size.cleanups < 15
    assert abs(by_size.peak_reserved - real) <= 0.01 * real
    assert "janitor.request(size)" in by_size.how_to
    assert by_size.janitor == {"args": {}, "use": "janitor.request(size)"}


BLAS_WS = [{"filename": "aten/src/ATen/cuda/CublasHandlePool.cpp", "line": 190, "name": "at::cuda::getNewWorkspace()"},
           {"filename": "aten/src/ATen/cuda/CUDABlas.cpp", "line": 400, "name": "at::cuda::blas::gemm<float>"}]
CONV_WS = [{"filename": "aten/src/ATen/native/cudnn/Conv_v8.cpp", "line": 500, "name": "at::native::run_conv_plan"}]
GEMM = [{"filename": "/home/user/project/infer.py", "line": 10, "name": "main"},
        {"filename": "aten/src/ATen/native/Linear.cpp", "line": 90, "name": "at::native::linear"}]


def _gemm_program(workspace: int, conv_ws: int = 0):
    """Weights, a cuBLAS workspace made at the first matmul and kept, then steps of activations (C++ frames)."""
    from explain_programs import Recorder

    rec = Recorder()
    MiB = 1 << 20
    w = [rec.malloc(48 * MiB, GEMM) for _ in range(3)]
    ws = rec.malloc(workspace, BLAS_WS)
    for step in range(6):
        a = rec.malloc((10 + 3 * (step % 3)) * MiB, GEMM)
        if conv_ws:
            rec.free(rec.malloc(conv_ws, CONV_WS))
        b = rec.malloc(20 * MiB, GEMM)
        rec.free(a)
        rec.free(b)
    return rec.snapshot(), (w, ws)


def test_cublas_cap_equals_the_program_made_with_the_smaller_workspace():
    """The cuBLAS candidates are the recorded program with its workspace request shrunk: the min budget must be
    that of the same program written with the smaller workspace from the start (a fact by construction)."""
    from alloctune.remedy.model import min_budget
    from alloctune.remedy.workspaces import CUBLAS_CONFIGS, cublas_requests, workspace_remedies
    from alloctune.trace.load import trace_from_snapshot

    big = trace_from_snapshot(_gemm_program(32 << 20)[0], source="big")
    assert len(cublas_requests(big)) == 1
    rem = {r.name: r for r in workspace_remedies(big, min_budget(big, "", big), "", command="python infer.py")}
    for value, cap in CUBLAS_CONFIGS:
        r = rem[f"cublas_workspace_config{value.replace(':', '_')}"]
        small = trace_from_snapshot(_gemm_program(cap)[0], source="small")
        assert r.min_budget == min_budget(small, "", small)
        assert r.method == "simulated" and r.saving == min_budget(big, "", big) - r.min_budget
        assert r.confirm.startswith(f"CUBLAS_WORKSPACE_CONFIG={value} alloctune record") and "python infer.py" in r.confirm
    assert rem["cublas_workspace_config_4096_2_16_8"].saving > 0
    assert not any(n.startswith("cudnn") for n in rem)  # no cuDNN workspace in this program


def test_cudnn_candidates_need_a_confirming_run_and_carry_the_bound():
    from alloctune.remedy.model import UNCONFIRMED, min_budget
    from alloctune.remedy.workspaces import workspace_remedies
    from alloctune.trace.load import trace_from_snapshot

    t = trace_from_snapshot(_gemm_program(128 << 10, conv_ws=64 << 20)[0], source="conv")
    without = trace_from_snapshot(_gemm_program(128 << 10, conv_ws=1)[0], source="conv0")
    rem = {r.name: r for r in workspace_remedies(t, min_budget(t, "", t), "", command="python infer.py")}
    assert "cublas_workspace_config_16_8" not in rem  # the recorded workspace is already that small
    off = rem["cudnn_benchmark_off"]
    assert off.method == UNCONFIRMED and off.min_budget is None and off.how_to == "torch.backends.cudnn.benchmark = False"
    assert off.confirm == ("alloctune run --cudnn-benchmark off --record cudnn_benchmark_off.pickle -- python infer.py"
                           " && alloctune simulate cudnn_benchmark_off.pickle --min-budget")
    # the bound: every cuDNN workspace given up = the program that never asked for one
    assert off.bound == min_budget(without, "", without) < min_budget(t, "", t)
    assert rem["cudnn_v7_api"].confirm.startswith("TORCH_CUDNN_V8_API_DISABLED=1 alloctune record")


def test_explain_page_and_terminal_carry_the_remedies_and_the_utilization_table(traces_dir, tmp_path):
    import subprocess
    import sys

    from alloctune.report.explain_html import write_explain_html

    rec = traces_dir / "rvc_ec0" / "default.pickle.xz"
    ex = write_explain_html(rec, tmp_path / "p.html")
    page = (tmp_path / "p.html").read_text()
    assert "Remedies (program-level" in page and "Utilization (peak allocated" in page
    assert "janitor_by_size" in page and "needs a confirming run" in page and ex.utilization.held_back[:20] in page
    import alloctune

    src = str(__import__("pathlib").Path(alloctune.__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-m", "alloctune", "explain", str(rec), "--top", "3"], capture_output=True,
                         text=True, env={"PYTHONPATH": src, "COLUMNS": "200", "PATH": "/usr/bin:/bin"}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "remedies (program-level, on this recording):" in out.stdout and "remedy janitor_by_size" in out.stdout
    assert "97.0 % utilization is not reached" in out.stdout


@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "max_split_size_mb:128"])
def test_what_holds_utilization_back_is_explains_split_of_the_replay_at_its_peak(traces_dir, conf):
    """The fast split (native replay for the moment, the model up to it) against explain run on the replay
    written as a snapshot (its own moment and memory map): the same bytes, category by category."""
    from alloctune.explain.core import explain_trace
    from alloctune.explain.utilization import peak_split
    from alloctune.sim.export import simulated_snapshot
    from alloctune.trace.load import trace_from_snapshot

    t = load_trace(traces_dir / "rvc_ec0" / "default.pickle.xz")
    ps = peak_split(t, conf)
    ex = explain_trace(trace_from_snapshot(simulated_snapshot(t, conf or None), None, source="sim"), top=1)
    assert (ps["reserved"], ps["allocated"]) == (ex.reserved, ex.moment["allocated"])
    assert {k: ps[k] for k in ex.overhead} == ex.overhead


@pytest.mark.parametrize("n", [1, 2, 4])
def test_the_janitor_arguments_of_a_release_point_reproduce_it(traces_dir, n):
    """`Janitor(**remedy.janitor["args"])` run live (the Python model, the real Janitor) cleans exactly where the
    release point was simulated, and reaches its peak."""
    from alloctune.remedy.janitor import repetition_sizes

    an = analyse(load_trace(traces_dir / "rvc_ec0" / "default.pickle.xz"))
    rem = next(r for r in release_points(an, None, every=(n,)))
    ends = repetition_ends(an)
    cleaned, peak = _stepwise_janitor_run(an.trace, ends, False, repetition_sizes(an, ends), **rem.janitor["args"])
    assert cleaned == ends[n - 1::n] and peak == rem.peak_reserved


def test_explain_flags_inference_with_autograd_from_the_run_record(tmp_path):
    """A recording whose sidecar (as `alloctune record` writes it) counted module calls with autograd on and no
    backward gets the no_grad candidate, with the run that confirms it; one that trained does not."""
    from explain_programs import training_loop, write

    from alloctune import api

    snap, _ = training_loop(steps=4)
    for counts, expect in (({"module_calls_with_grad": 40, "module_calls_without_grad": 0, "backward_calls": 0}, True),
                           ({"module_calls_with_grad": 40, "module_calls_without_grad": 0, "backward_calls": 4}, False)):
        rec = write(snap, tmp_path / f"r{int(expect)}.pickle")
        rec.with_suffix(".json").write_text(json.dumps({"autograd": counts, "command": ["python", "infer.py"]}))
        d = api.explain(rec).to_dict()
        ng = [r for r in d["remedies"] if r["name"] == "no_grad"]
        assert bool(ng) is expect
        if expect:
            assert ng[0]["method"] == "needs a confirming run" and ng[0]["min_budget"] is None
            assert ng[0]["confirm"].startswith("alloctune run --no-grad --record nograd.pickle -- python infer.py")


@pytest.mark.parametrize("workload", ["llm", "rvc_ec0"])
def test_the_setting_row_is_the_real_run_with_that_setting(traces_dir, workload):
    """The table's expandable-segments row, replayed from the default's recording, carries the peaks the real
    run with expandable segments measured itself (its memory_stats); the combined rows are the release
    policies under that setting, and the verdict names the best row of all."""
    from alloctune import api

    util = api.explain(traces_dir / workload / "default.pickle.xz").utilization
    real = json.loads((traces_dir / workload / "expandable.json").read_text())["stats"]
    row = next(r for r in util.rows if r.kind == "setting")
    assert row.conf == "expandable_segments:True"
    assert (row.peak_reserved, row.peak_allocated) == (real["reserved_bytes.all.peak"],
                                                        real["allocated_bytes.all.peak"])
    combined = [r for r in util.rows if r.kind == "setting + remedy"]
    assert combined and all(r.conf == row.conf and r.name.startswith(row.conf + " + ") for r in combined)
    best = max((r for r in util.rows if r.utilization is not None), key=lambda r: r.utilization)
    assert util.reachable == (best.utilization >= 0.97)
    if not util.reachable:
        assert f"best {100 * best.utilization:.1f} %, {best.name}" in util.held_back


def test_the_cudnn_candidate_is_the_switch_the_other_way_than_the_run_record_says():
    """The agent writes cudnn.benchmark into the snapshot's run record; explain offers the other way."""
    from alloctune.remedy.workspaces import workspace_remedies
    from alloctune.trace.load import trace_from_snapshot
    from alloctune.trace.stream import RUN_RECORD_KEY

    snap = _gemm_program(128 << 10, conv_ws=64 << 20)[0]
    for was, name in ((False, "cudnn_benchmark_on"), (True, "cudnn_benchmark_off")):
        t = trace_from_snapshot({**snap, RUN_RECORD_KEY: {"cap": 0, "cudnn_benchmark": was}}, source="conv")
        assert t.meta["cudnn_benchmark"] is was
        rem = {r.name: r for r in workspace_remedies(t, None, "", command="python infer.py")}
        assert name in rem and rem[name].how_to == f"torch.backends.cudnn.benchmark = {not was}"
        assert f"--cudnn-benchmark {name.rsplit('_', 1)[1]}" in rem[name].confirm
