"""plan with fallible workspaces learned once (calibration, C++ frames, tune store): one answer.

The truth comes from the program itself: `_run` executes a convolution-like program against the
allocator model under the cap, the program reacting to each failed workspace as cuDNN does (a
smaller workspace, then none); the largest size that completes is found by running it at every
size. plan sees only uncapped recordings at three sizes and the evidence.
"""

import json

import pytest

from record_child import cli_exit
from alloctune.plan.answer import plan
from alloctune.plan import fileformat
from alloctune.plan.fallible import from_calibration, from_frames, from_store, learn
from alloctune.plan.traceset import build
from alloctune.sim.replay import make_allocator
from alloctune.sim.settings import SimSettings
from alloctune.trace.compact import save_compact
from alloctune.trace.model import ALLOC, FAILED_ALLOC, FREE, RequestStream, Trace

MiB = 1 << 20
LAYERS = 5
CAP = 900 * MiB


class _Program:
    """Records what the program asks for; under `alloc` (an allocator model) it really runs."""

    def __init__(self, alloc=None, frames=False):
        self.req, self.events, self.alloc, self.frames = RequestStream(), [], alloc, frames
        self.blocks, self.rid = {}, 0

    def ask(self, size, workspace=False):
        b = self.alloc.malloc(size, 0) if self.alloc is not None else True
        if b is None:
            self.req.append(FAILED_ALLOC, size, -1, 0, len(self.events))
            self._event(workspace)
            return None
        rid, self.rid = self.rid, self.rid + 1
        self.blocks[rid] = b
        self.req.append(ALLOC, size, rid, 0, len(self.events))
        self._event(workspace)
        return rid

    def free(self, rid):
        b = self.blocks.pop(rid)
        if self.alloc is not None:
            self.alloc.free(b)
        self.req.append(FREE, -1, rid, 0, len(self.events))
        self._event(False)

    def _event(self, workspace):
        name = "at::native::run_conv_plan" if workspace else "at::native::empty_cuda"
        self.events.append({"frames": [{"name": name}, {"name": "torch::autograd::forward"}]} if self.frames else {})


def _run(x, cap=None, smaller=True, frames=False):
    """The program at input size x: (completed, its recording). Each layer makes an output, asks
    for a workspace of 3x it (on a failure: a third of that when `smaller`, then none), frees the input."""
    alloc = make_allocator(SimSettings.from_config(""), budget=cap, record_events=False) if cap else None
    p = _Program(alloc, frames)
    if p.ask(200 * MiB) is None:
        return False, None
    act = p.ask(x * MiB)
    if act is None:
        return False, None
    for _ in range(LAYERS):
        out = p.ask(x * MiB + 4096)
        if out is None:
            return False, None
        ws = p.ask(3 * x * MiB, workspace=True)
        if ws is None and smaller:
            ws = p.ask(x * MiB, workspace=True)
        if ws is not None:
            p.free(ws)
        p.free(act)
        act = out
    p.free(act)
    trace = Trace("conv", 0, p.req, [], {}, events=p.events, meta={"cap": cap} if cap else {})
    return True, trace


def _truth(cap, smaller=True):
    """The largest whole size that completes for real (every size up to the first failure tried)."""
    x = 1
    while _run(x + 1, cap, smaller)[0]:
        x += 1
    return x


def _recordings(sizes=(40, 80, 120), frames=False, smaller=True):
    return [(s, _run(s, smaller=smaller, frames=frames)[1]) for s in sizes]


def _sharp(answer, real):
    """#28's bar: never above the real largest size, within 2 % of it. (Not always equal: running
    without a workspace is replayed as a 1-byte request, trace.fallible.NO_WORKSPACE, one small
    segment the program does not take.)"""
    return real * 0.98 <= int(answer) <= real


def _largest(ts):
    res = plan(ts, caps=[CAP], curve=[])
    return res, res.settings[0].largest[0]


@pytest.fixture(scope="module")
def truth():
    return _truth(CAP)


def _saved_recordings(folder):
    """The recordings saved as compact traces in `folder`, as plan's FILE:SIZE inputs."""
    specs = []
    for s, t in _recordings():
        p = folder / f"conv{s}.atrace"
        save_compact(t, p)
        specs.append(f"{p}:{s}")
    return specs

def test_without_evidence_the_answer_is_a_range_and_says_what_to_record(truth):
    res, x = _largest(build(_recordings()))
    assert x.optimistic is not None and int(x.largest) < truth and abs(int(x.optimistic) - truth) <= 0.02 * truth
    assert res.fallible["decided_by"] == "none" and res.fallible["range"]
    hint = res.fallible["record"]
    from alloctune.units import format_size_arg, parse_user_size

    assert f"--budget {format_size_arg(CAP)} " in hint and parse_user_size(format_size_arg(CAP)) == CAP  # exact, readable
    assert f"--calibration calibration-{x.optimistic}.pickle.xz:{x.optimistic}" in hint


def test_a_calibration_makes_it_one_number_the_real_one(truth):
    recs = _recordings()
    ts = build(recs)
    ok, capped = _run(110, CAP)  # a capped run at a size between the recordings: its workspaces fell back
    assert ok and FAILED_ALLOC in capped.requests.ops
    learned = from_calibration(ts, capped, 110)
    assert learned.requests == LAYERS and learned.evidence[0].placed == LAYERS
    from dataclasses import replace

    res, x = _largest(replace(ts, learned=learned))
    assert x.optimistic is None and x.first_failing is not None
    assert _sharp(x.largest, truth)  # one number: the program's own largest size, never above it
    assert res.fallible["decided_by"] == "calibration" and not res.fallible["range"] and not res.conservative
    assert any(n.startswith("one answer: 5 workspace request(s)") for n in res.notes)


def test_a_calibration_at_a_recorded_size_uses_that_recording_and_survives_save(tmp_path, truth):
    recs = _recordings()
    ts = build(recs)
    capped = _run(120, 1000 * MiB)[1]
    learned = learn(ts, recs, [(120, capped, "cal.atrace")])
    assert learned.decided_by == "calibration" and learned.requests == LAYERS
    from dataclasses import replace

    path = tmp_path / "conv.atraceset"
    fileformat.save(replace(ts, learned=learned), path)
    back = fileformat.load(path)
    assert back.learned is not None and back.learned.sites == learned.sites
    assert _sharp(_largest(back)[1].largest, truth)


def test_frames_decide_where_the_program_settles_on_no_workspace():
    recs = _recordings(frames=True, smaller=False)
    ts = build(recs)
    learned = learn(ts, recs)  # the recordings' own C++ frames
    assert learned.decided_by == "frames" and learned.requests == LAYERS
    assert from_frames(ts, _recordings(smaller=False)[0][1], 40) is None  # no C++ frames, no evidence
    from dataclasses import replace

    res, x = _largest(replace(ts, learned=learned))
    assert x.optimistic is None and _sharp(x.largest, _truth(CAP, smaller=False))
    assert res.fallible["decided_by"] == "frames" and not res.fallible["range"]


def test_a_tune_store_of_the_program_is_a_calibration(tmp_path, truth):
    ts = build(_recordings())
    base, capped = tmp_path / "base.atrace", tmp_path / "capped.atrace"
    save_compact(_run(100)[1], base)
    run = _run(100, 700 * MiB)[1]
    save_compact(run, capped)
    store = tmp_path / "store.jsonl"
    lines = [{"schema": 1, "kind": "header", "command": ["conv"]},
             {"schema": 1, "kind": "trial", "key": {},
              "result": {"budget": None, "snapshot": str(base), "outcome": "ok"}},
             {"schema": 1, "kind": "trial", "key": {}, "result": {"budget": 700 * MiB, "snapshot": str(capped),
                                                                  "outcome": "ok", "num_ooms": 3}}]
    store.write_text("\n".join(json.dumps(x) for x in lines) + "\n{torn")
    learned = from_store(ts, store)
    assert learned.decided_by == "store" and learned.requests == LAYERS
    from dataclasses import replace

    assert _sharp(_largest(replace(ts, learned=learned))[1].largest, truth)


def test_cli_calibration_json_and_text(tmp_path, capfd, truth):
    specs = _saved_recordings(tmp_path)
    cal = tmp_path / "cal.atrace"
    save_compact(_run(110, CAP)[1], cal)
    assert cli_exit(["plan", *specs, "--cap", f"{CAP}B", "--calibration", f"{cal}:110", "--curve", "40", "--json"]) == 0
    d = json.loads(capfd.readouterr().out)
    x = d["settings"][0]["largest"][0]
    assert d["fallible"]["decided_by"] == "calibration" and _sharp(x["largest"], truth) and x["optimistic"] is None
    assert cli_exit(["plan", *specs, "--cap", f"{CAP}B", "--curve", "40"]) == 0
    out = capfd.readouterr().out
    assert "to make each A .. B one number" in out and "--calibration calibration-" in out
    plain = tmp_path / "plain.atrace"
    save_compact(_run(110)[1], plain)
    assert cli_exit(["plan", *specs, "--cap", f"{CAP}B", "--calibration", f"{plain}:110"]) == 2
    err = capfd.readouterr().err
    assert "alloctune: error: --calibration" in err and "Traceback" not in err


def test_cli_calibrated_text_says_which_evidence_decided(tmp_path, capfd):
    specs = _saved_recordings(tmp_path)
    cal = tmp_path / "cal.atrace"
    save_compact(_run(110, CAP)[1], cal)
    assert cli_exit(["plan", *specs, "--cap", f"{CAP}B", "--calibration", f"{cal}:110", "--curve", "40"]) == 0
    out = " ".join(capfd.readouterr().out.split())
    assert "one number per answer: 5 workspace request(s) decided by calibration" in out and " .. " not in out.split(
        "min budget")[0]


def test_a_record_directory_with_a_capped_run_decides_by_itself(tmp_path, capfd, truth):
    for s, t in _recordings():
        save_compact(t, tmp_path / f"conv-{s}.atrace")
        (tmp_path / f"conv-{s}.json").write_text(json.dumps({"size": str(s)}))
    save_compact(_run(110, CAP)[1], tmp_path / "conv-cal.atrace")
    (tmp_path / "conv-cal.json").write_text(json.dumps({"size": "110", "cap": CAP, "outcome": "ok"}))
    assert cli_exit(["plan", str(tmp_path), "--cap", f"{CAP}B", "--curve", "40", "--json"]) == 0
    d = json.loads(capfd.readouterr().out)
    assert d["recorded_sizes"] == ["40", "80", "120"]  # the capped run is evidence, not a size point
    assert d["fallible"]["decided_by"] == "calibration" and _sharp(d["settings"][0]["largest"][0]["largest"], truth)


def test_bad_evidence_is_one_line(tmp_path, capfd):
    specs = _saved_recordings(tmp_path)
    cal = tmp_path / "cal.atrace"
    save_compact(_run(110, CAP)[1], cal)
    cases = [["--store", str(tmp_path / "none.jsonl")], ["--calibration", str(tmp_path / "none.atrace")],
             ["--calibration", str(cal)]]  # no size given and no sidecar to say it
    (tmp_path / "empty.jsonl").write_text('{"schema": 1, "kind": "header"}\n')
    cases.append(["--store", str(tmp_path / "empty.jsonl")])
    for extra in cases:
        assert cli_exit(["plan", *specs, "--cap", f"{CAP}B", "--curve", "40", *extra]) == 2, extra
        err = capfd.readouterr().err
        assert err.startswith("alloctune: error:") and "Traceback" not in err and err.count("\n") <= 2, err


def test_python_api_takes_the_evidence(tmp_path, truth):
    from alloctune.plan import plan as api_plan

    specs = _saved_recordings(tmp_path)
    cal = tmp_path / "cal.atrace"
    save_compact(_run(110, CAP)[1], cal)
    res = api_plan(specs, calibrations=[f"{cal}:110"], caps=[CAP], curve=[])
    assert res.fallible["decided_by"] == "calibration" and _sharp(res.settings[0].largest[0].largest, truth)


def test_a_damaged_learned_entry_in_a_saved_set_is_refused(tmp_path):
    import gzip

    from alloctune.errors import TraceError

    recs = _recordings()
    ts = build(recs)
    from dataclasses import replace

    path = tmp_path / "conv.atraceset"
    fileformat.save(replace(ts, learned=learn(ts, recs, [(120, _run(120, 1000 * MiB)[1], "cal")])), path)
    d = json.loads(gzip.decompress(path.read_bytes()))
    for bad in ({"sites": [{"0": -5}]}, {"sites": [{"99999": 1}]}, {"sites": [{"3": "7/2"}]},
                {"evidence": [{"kind": "x", "source": "s", "size": None, "cap": None, "learned": 1, "placed": 1,
                               "same_kind": 0}]}):
        blob = json.dumps({**d, "learned": {**d["learned"], **bad}}).encode()
        (tmp_path / "bad.atraceset").write_bytes(gzip.compress(blob))
        with pytest.raises(TraceError):
            fileformat.load(tmp_path / "bad.atraceset")


def test_the_record_hint_runs_as_printed():
    """#39: a sidecar's command recorded without its interpreter gets `python` in the hint, and the budget
    is spelled so it reads back exactly (`3GiB`, not `3221225472B`)."""
    from types import SimpleNamespace

    from alloctune.plan.fallible import record_hint

    ts = SimpleNamespace(meta={"commands": {"14": ["bench/real_workloads.py", "hubert", "--seconds", "14"]}})
    hint = record_hint(ts, "28", 3 << 30)  # type: ignore[arg-type]
    assert hint.startswith("alloctune run --budget 3GiB --record calibration-28.pickle.xz -- "
                           "python bench/real_workloads.py hubert --seconds 28, then plan again")
