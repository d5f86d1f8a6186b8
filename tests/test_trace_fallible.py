"""Fallible requests learned from frames and from a calibration run (synthetic streams)."""

from alloctune.sim import min_budget, replay
from alloctune.trace.fallible import (
    NO_WORKSPACE,
    learn_from_calibration,
    model_from_frames,
    untagged_note,
    with_fallbacks,
)
from alloctune.trace.model import ALLOC, FAILED_ALLOC, FREE, RequestStream, Trace

MiB = 1 << 20
WS, SMALL_WS = 300 * MiB, 180 * MiB


def _stream(steps):
    rs = RequestStream()
    for k, (op, size, rid) in enumerate(steps):
        rs.append(op, size, rid, 0, k)
    return rs


def _trace(steps, events=None, cap=None):
    return Trace("synthetic", 0, _stream(steps), [], {}, events=events or [], meta={"cap": cap} if cap else {})


# Uncapped: an activation, a workspace (freed at once), the next layers, the workspace again.
TAIL_U = [(ALLOC, (10 + k) * MiB, 10 + k) for k in range(4)] + [(FREE, (10 + k) * MiB, 10 + k) for k in range(4)]
UNCAPPED = [
    (ALLOC, 400 * MiB, 0), (ALLOC, WS, 1), (FREE, WS, 1), (ALLOC, 100 * MiB, 2), (FREE, 100 * MiB, 2),
    *TAIL_U, (ALLOC, WS, 3), (FREE, WS, 3), (FREE, 400 * MiB, 0),
]
# Capped: the first workspace fails twice (two algorithms), the program settles on 180 MiB;
# the second time it asks for 180 MiB at once (the library cached its choice).
CAPPED = [
    (ALLOC, 400 * MiB, 0), (FAILED_ALLOC, WS, -1), (FAILED_ALLOC, 250 * MiB, -1), (ALLOC, SMALL_WS, 1),
    (FREE, SMALL_WS, 1), (ALLOC, 100 * MiB, 2), (FREE, 100 * MiB, 2),
    *TAIL_U, (ALLOC, SMALL_WS, 3), (FREE, SMALL_WS, 3), (FREE, 400 * MiB, 0),
]


def test_calibration_turns_each_failure_into_its_replacement_ladder():
    m = learn_from_calibration(_trace(UNCAPPED), _trace(CAPPED, cap=650 * MiB))
    assert m.ladders == {WS: (250 * MiB, SMALL_WS)}
    assert m.unaligned_requests == 0 and m.cached_replacements == 1
    assert m.calibration_cap == 650 * MiB


def test_a_failure_replaced_by_nothing_settles_on_no_workspace():
    capped = [(ALLOC, 400 * MiB, 0), (FAILED_ALLOC, WS, -1), (ALLOC, 100 * MiB, 1), (FREE, 100 * MiB, 1),
              *TAIL_U, (ALLOC, WS, 2), (FREE, WS, 2), (FREE, 400 * MiB, 0)]
    m = learn_from_calibration(_trace(UNCAPPED), _trace(capped))
    assert m.ladders == {WS: (NO_WORKSPACE,)}
    assert m.unaligned_requests == 0


def test_learned_fallbacks_lower_the_simulated_min_budget():
    plain = _trace(UNCAPPED)
    tagged = with_fallbacks(plain, learn_from_calibration(plain, _trace(CAPPED)))
    assert set(tagged.requests.fallbacks) == {1, 13}
    assert plain.requests.fallbacks == {}  # the input trace is left alone
    cap = 600 * MiB  # 400 + 180 fits, 400 + 300 does not
    assert not replay(plain, budget=cap, addresses="model").completed
    r = replay(tagged, budget=cap, addresses="model")
    assert r.completed and r.adapted
    assert min_budget(tagged).budget < min_budget(plain).budget


def test_unexplained_divergence_stops_learning_and_is_counted():
    capped = [(ALLOC, 400 * MiB, 0), (ALLOC, 7 * MiB, 1), (ALLOC, 9 * MiB, 2), (FREE, 9 * MiB, 2)]
    m = learn_from_calibration(_trace(UNCAPPED), _trace(capped))
    assert m.ladders == {} and m.unaligned_requests == 3


def _frames(name):
    return [{"name": name, "filename": "", "line": 0}, {"name": "forward", "filename": "conv.py", "line": 1}]


def test_cpp_frames_tag_cudnn_workspaces_not_conv_outputs_and_silence_the_note():
    names = {WS: "at::native::run_conv_plan(cudnnContext*, at::Tensor const&)",
             400 * MiB: "at::native::cudnn_convolution(at::Tensor const&, at::Tensor const&)"}  # an output
    ev = [{"action": "alloc", "frames": _frames(names.get(size, "at::empty(c10::IntArrayRef)"))} for _, size, _ in UNCAPPED]
    plain = _trace(UNCAPPED, events=ev)
    assert untagged_note(plain) is not None  # no evidence applied yet: the large requests are open
    m = model_from_frames(plain)
    assert m.method == "frames" and m.tagged_requests == {1, 13}
    tagged = with_fallbacks(plain, m)
    assert tagged.requests.fallbacks == {1: (NO_WORKSPACE,), 13: (NO_WORKSPACE,)}
    assert untagged_note(tagged) is None


def test_python_frames_alone_are_no_evidence():
    ev = [{"action": "alloc", "frames": [{"name": "forward", "filename": "conv.py", "line": 1}]} for _ in UNCAPPED]
    m = model_from_frames(_trace(UNCAPPED, events=ev))
    assert m.method == "none" and not m.tagged_requests


def test_a_fatal_oom_is_not_learned_as_a_fallback():
    # the capped run fails on the workspace and then only cleans up (the program died)
    capped = [(ALLOC, 400 * MiB, 0), (FAILED_ALLOC, WS, -1), (FREE, 400 * MiB, 0)]
    m = learn_from_calibration(_trace(UNCAPPED), _trace(capped))
    assert m.ladders == {}


def test_a_run_that_dies_on_the_next_request_keeps_the_ladder_it_survived():
    # the workspace fails (two algorithms), the library gives it up, the program goes on to its next
    # request (100 MiB) and THAT kills the run: the workspace's ladder is survivable evidence
    capped = [(ALLOC, 400 * MiB, 0), (FAILED_ALLOC, WS, -1), (FAILED_ALLOC, 250 * MiB, -1),
              (FAILED_ALLOC, 100 * MiB, -1), (FREE, 400 * MiB, 0)]
    m = learn_from_calibration(_trace(UNCAPPED), _trace(capped))
    assert m.ladders == {WS: (250 * MiB, NO_WORKSPACE)}
    # a last failure of the workspace's own size is its ladder's, and the death is its own: nothing learned
    capped = [(ALLOC, 400 * MiB, 0), (FAILED_ALLOC, WS, -1), (FAILED_ALLOC, WS, -1), (FREE, 400 * MiB, 0)]
    assert learn_from_calibration(_trace(UNCAPPED), _trace(capped)).ladders == {}
    # a run that goes on allocating after the failures did not die there: the 100 MiB try is a rung
    capped = [(ALLOC, 400 * MiB, 0), (FAILED_ALLOC, WS, -1), (FAILED_ALLOC, 100 * MiB, -1),
              (ALLOC, 100 * MiB, 2), (FREE, 100 * MiB, 2), *TAIL_U, (ALLOC, WS, 3), (FREE, WS, 3)]
    assert learn_from_calibration(_trace(UNCAPPED), _trace(capped)).ladders == {WS: (100 * MiB, NO_WORKSPACE)}


def test_untagged_note_names_what_calibration_did_not_cover():
    steps = UNCAPPED + [(ALLOC, 500 * MiB, 9), (FREE, 500 * MiB, 9)]
    plain = _trace(steps)
    tagged = with_fallbacks(plain, learn_from_calibration(plain, _trace(CAPPED, cap=650 * MiB)))
    note = untagged_note(tagged)
    # the 100 and 500 MiB requests are freed right after allocation (possible workspaces) and were not
    # calibrated; the workspace was; the 400 MiB activation and the 10-13 MiB tensors are data, not scratch
    assert note is not None and note.startswith("2 request(s)")
    assert "capped at 650.00 MiB" in note
    assert untagged_note(plain).startswith("4 request(s)")  # before: both workspaces too


def test_real_h200_calibration_explains_the_capped_run(traces_dir):
    # rvc_ec1 under a cap of 85 % of its peak: cuDNN fell back ~1900 times and the run completed.
    # Replaying the uncapped stream fails at that cap; with the learned fallbacks it completes.
    from alloctune.trace import load_trace

    plain = load_trace(traces_dir / "rvc_ec1" / "default.pickle.xz")
    capped = load_trace(traces_dir / "rvc_ec1" / "default_cap85.pickle.xz")
    cap = int(capped.meta["cap"])
    model = learn_from_calibration(plain, capped)
    assert model.unaligned_requests == 0 and model.ladders
    tagged = with_fallbacks(plain, model)
    assert not replay(plain, budget=cap, record_events=False, timeline_points=1).completed
    r = replay(tagged, budget=cap, record_events=False, timeline_points=1)
    assert r.completed and r.adapted


def test_the_note_speaks_for_convolutions_not_for_transformer_decoding():
    # shipped H200 recordings: RVC (HuBERT + HiFiGAN convolutions) has ~1800 requests shaped like
    # workspaces; the Llama-shaped decoder has one (a 501 MiB temporary at start-up, among 379k requests)
    from alloctune.demo.core import shipped_trace_path
    from alloctune.trace import load_trace
    from alloctune.trace.fallible import scratch_requests

    llm = load_trace(shipped_trace_path("llm_h200.atrace"))
    assert len(scratch_requests(llm)) == 1 and untagged_note(llm).startswith("1 request(s)")
    rvc = load_trace(shipped_trace_path("rvc_h200_ec1.atrace"))
    assert len(scratch_requests(rvc)) > 1000 and "freed right after allocation" in untagged_note(rvc)
