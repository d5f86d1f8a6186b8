"""Training in model terms: phases, the model's own code, layers, and the training remedies.

The programs are synthetic snapshots whose facts are known by construction (which phase made
each block, what a hand-written checkpointed or SGD program allocates); the same checks on real
recordings made on the GPU are in test_explain_training_real.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from alloctune.analysis.core import analyse
from alloctune.analysis.phases import BACKWARD, FORWARD, OPTIMIZER_STEP, OTHER, allocation_phases, annotation_phase
from alloctune.analysis.sites import class_of, is_model_code
from alloctune.errors import TraceError
from alloctune.explain.api import explain
from alloctune.remedy.model import min_budget
from alloctune.remedy.training import block_windows, optimizer_remedies, with_checkpointing
from alloctune.trace.compact import from_compact_dict, to_compact_dict
from alloctune.trace.load import trace_from_snapshot

sys.path.insert(0, str(Path(__file__).parent))
from explain_programs import ADAMW, ADAMW_TMP, CONSTRUCT, INPUT, LINEAR, LOSS, SITE, USER, Recorder, fr  # noqa: E402

MiB = 1 << 20
BERT = SITE + "transformers/models/bert/modeling_bert.py"


def layer_frames(line: int) -> list[dict[str, Any]]:
    """A frame inside the model library's repeated layer, under the module call and the user's line."""
    return [fr(SITE + "torch/nn/modules/linear.py", 125, "forward"), fr(SITE + "torch/nn/modules/module.py", 1750, "_call_impl"),
            fr(BERT, line, "forward"), fr(SITE + "torch/nn/modules/module.py", 1750, "_call_impl"), fr(USER, 22, "main")]


def layered_program(steps: int = 4, layers: int = 6, checkpointed: bool = False, optimizer: str = "adamw",
                    annotate: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """A training loop over `layers` identical blocks. Each block's forward saves two tensors for
    backward, makes one temporary, and outputs one tensor (the next block's input, which that block
    saves). Backward runs the blocks in reverse, each freeing what it saved. `checkpointed`: the same program written with checkpointing by hand (saved
    tensors freed at the block's end, the block's forward made again when its backward starts).
    `optimizer`: adamw (2 states + a temporary the size of all parameters) or sgd (1 state, none)."""
    rec = Recorder()
    params = [8 * MiB] * layers
    p = [rec.malloc(s, CONSTRUCT) for s in params]
    state: list[int] = []
    grads: list[int] = []
    ranges: list[dict[str, Any]] = []
    facts: dict[str, Any] = {"phase_of": []}  # the phase of each allocation, by construction

    def m(size: int, frames: list, phase: str) -> int:
        facts["phase_of"].append(phase)
        return rec.malloc(size, frames)

    facts["phase_of"] += [OTHER] * len(p)

    def block_forward(keep: bool, phase: str) -> tuple[list[int], int]:
        a = m(12 * MiB, layer_frames(300), phase)
        b = m(10 * MiB, layer_frames(301), phase)
        t = m(6 * MiB, layer_frames(302), phase)
        rec.free(t)
        out = m(4 * MiB, layer_frames(303), phase)
        if not keep:
            rec.free(a)
            rec.free(b)
            return [], out
        return [a, b], out

    for step in range(steps):
        x = m(4 * MiB, INPUT, OTHER)
        saved: list[list[int]] = []
        outs = []
        for _ in range(layers):
            s, o = block_forward(not checkpointed, FORWARD)
            saved.append(s)
            outs.append(o)
        loss = m(512, LOSS, OTHER)
        for g in grads:
            rec.free(g)
        grads = []
        # backward, last block first; a block's input (the previous block's output) is saved by the
        # block and freed while its backward runs; the last output goes with the head's backward
        rec.free(outs[-1])
        for i in reversed(range(layers)):
            if checkpointed:
                s, o = block_forward(True, BACKWARD)
                rec.free(o)
                saved[i] = s
            grads.append(m(params[i], [], BACKWARD))
            ga = m(5 * MiB, [], BACKWARD)
            rec.free(saved[i][0])
            if i > 0:
                rec.free(outs[i - 1])
            rec.free(saved[i][1])
            rec.free(ga)
        rec.free(loss)
        t0 = rec.t
        if step == 0:
            for q in params:
                state.append(m(q, ADAMW if optimizer == "adamw" else [fr(SITE + "torch/optim/sgd.py", 90, "_init_group"),
                                                                      fr(USER, 26, "main")], OPTIMIZER_STEP))
                if optimizer == "adamw":
                    state.append(m(q, [ADAMW[0] | {"line": 181}] + ADAMW[1:], OPTIMIZER_STEP))
        if optimizer == "adamw":
            rec.free(m(sum(params), ADAMW_TMP, OPTIMIZER_STEP))
        if annotate:
            ranges += [{"device": 0, "name": "Optimizer.step#AdamW.step", "stage": "START", "time_us": t0 + 1},
                       {"device": 0, "name": "Optimizer.step#AdamW.step", "stage": "END", "time_us": rec.t + 1}]
        rec.free(x)
    snap = rec.snapshot()
    if annotate:
        snap["external_annotations"] = ranges
    return snap, facts


def test_phases_come_from_the_frames_and_sum_to_allocated() -> None:
    snap, facts = layered_program()
    trace = trace_from_snapshot(snap, source="layered")
    assert allocation_phases(trace.requests) == facts["phase_of"]
    ex = explain(trace, what_if=False)
    assert sum(p.bytes for p in ex.phases) == ex.moment["allocated"]
    assert ex.moment["phase"] in (FORWARD, BACKWARD)
    assert ex.moment["steps"] == 4 and 1 <= ex.moment["step"] <= 4


def test_annotations_name_phases_and_survive_the_compact_form() -> None:
    snap, facts = layered_program(annotate=True)
    # the range makes a phase of what frames alone would not say: the loss line inside a user's range
    trace = trace_from_snapshot(snap, source="annotated")
    assert len(trace.requests.annotations) == 4
    assert all(a.name.startswith("Optimizer.step") for a in trace.requests.annotations)
    assert allocation_phases(trace.requests) == facts["phase_of"]
    back = from_compact_dict(to_compact_dict(trace))
    assert back.requests.annotations == trace.requests.annotations
    assert annotation_phase("Optimizer.zero_grad#AdamW.zero_grad") == "zero_grad"
    assert annotation_phase("my forward pass") == FORWARD and annotation_phase("data") is None


def test_a_users_range_overrides_the_frames() -> None:
    snap, facts = layered_program()
    events = snap["device_traces"][0]
    loss_times = [e["time_us"] for e in events if e["action"] == "alloc" and e["frames"] == LOSS]
    snap["external_annotations"] = [x for t in loss_times for x in (
        {"device": 0, "name": "forward", "stage": "START", "time_us": t - 1},
        {"device": 0, "name": "forward", "stage": "END", "time_us": t + 1})]
    trace = trace_from_snapshot(snap, source="ranges")
    phases = allocation_phases(trace.requests)
    expected = [FORWARD if f == OTHER and i >= 6 and phases[i] == FORWARD else f for i, f in enumerate(facts["phase_of"])]
    assert phases == expected and phases.count(FORWARD) == facts["phase_of"].count(FORWARD) + 4


@pytest.mark.parametrize("bad", [
    "not a list", [1, 2], [{"name": 3, "stage": "START", "time_us": 1}],
    [{"name": "x", "stage": "MIDDLE", "time_us": 1}], [{"name": "x" * 5000, "stage": "START", "time_us": 1}],
    [{"name": "x", "stage": "START", "time_us": "soon"}],
])
def test_hostile_annotations_are_one_line(bad: Any, tmp_path: Path) -> None:
    snap, _ = layered_program(steps=3)
    snap["external_annotations"] = bad
    with pytest.raises(TraceError):
        trace_from_snapshot(snap, source="hostile")
    import pickle

    path = tmp_path / "hostile.pickle"
    path.write_bytes(pickle.dumps(snap))
    r = subprocess.run([sys.executable, "-m", "alloctune", "explain", str(path), "--no-what-if"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().startswith("alloctune: error:") and len(r.stderr.strip().splitlines()) == 1


def test_model_code_frames_and_layers() -> None:
    snap, _ = layered_program()
    trace = trace_from_snapshot(snap, source="layers")
    ex = explain(trace, group="layer", what_if=False)
    labels = [s.site for s in ex.sites]
    assert any("modeling_bert.py:300 (forward) [layer" in s and "of 6]" in s for s in labels)
    ex_model = explain(trace, group="model", what_if=False)
    assert any(s.site == "transformers/models/bert/modeling_bert.py:300 (forward)" for s in ex_model.sites)
    line = explain(trace, what_if=False)
    rows = [s for s in line.sites if s.site.startswith(USER + ":22")]
    assert rows and rows[0].model_frame is not None and "modeling_bert.py" in rows[0].model_frame
    assert sum(s.bytes for s in ex.sites) == sum(s.bytes for s in line.sites)
    assert is_model_code(BERT) and not is_model_code(SITE + "torch/nn/modules/linear.py")
    assert not is_model_code("/usr/lib/python3.11/contextlib.py") and is_model_code(USER)


def test_class_of_reads_the_source(tmp_path: Path) -> None:
    src = tmp_path / "model.py"
    src.write_text("import torch\n\nclass Block(torch.nn.Module):\n    def forward(self, x):\n        y = x * 2\n"
                   "        return y\n\ndef helper(x):\n    return x\n")
    assert class_of(str(src), 5) == "Block"
    assert class_of(str(src), 4) == "Block"  # the def line itself
    assert class_of(str(src), 9) is None
    assert class_of(str(tmp_path / "missing.py"), 3) is None
    big = tmp_path / "big.py"
    big.write_text("class A:\n    def f(self):\n        pass\n" + "#" * (5 << 20))
    assert class_of(str(big), 2) is None  # over 4 MiB: not read
    assert class_of("/proc/self/pagemap", 2) is None  # size 0 by its stat, endless to read: bounded


def test_checkpointing_rewrite_matches_the_program_written_with_it() -> None:
    plain = trace_from_snapshot(layered_program()[0], source="plain")
    by_hand = trace_from_snapshot(layered_program(checkpointed=True)[0], source="checkpointed")
    an = analyse(plain)
    windows = block_windows(an)
    assert len(windows) == 4 * 6 and all(len(w.saved) == 2 for w in windows)
    rewritten = with_checkpointing(an, windows)
    want = min_budget(by_hand, "", by_hand)
    got = min_budget(rewritten, "", rewritten)
    assert want is not None and got is not None
    assert abs(got - want) <= 0.03 * want
    assert got < min_budget(plain, "", plain)


def test_sgd_rewrite_is_the_program_written_with_sgd() -> None:
    adam = trace_from_snapshot(layered_program()[0], source="adam")
    sgd = trace_from_snapshot(layered_program(optimizer="sgd")[0], source="sgd")
    rems = {r.name: r for r in optimizer_remedies(analyse(adam), min_budget(adam, "", adam), "")}
    assert rems["optimizer_sgd"].min_budget == min_budget(sgd, "", sgd)
    assert rems["optimizer_8bit"].min_budget is not None
    assert rems["optimizer_8bit"].min_budget < rems["optimizer_sgd"].min_budget


def test_the_page_charts_phases_over_the_run_and_they_sum_to_allocated(tmp_path: Path) -> None:
    from alloctune.report.explain_html import write_explain_html
    from alloctune.report.explain_view import explain_view

    trace = trace_from_snapshot(layered_program()[0], source="page")
    ex = explain(trace, what_if=False)
    ot = explain_view(trace, ex).over_time
    assert list(ot.phases) == [p.name for p in ex.phases]
    for i, allocated in enumerate(ot.allocated):
        assert sum(col[i] for col in ot.phases.values()) == allocated
    assert {p: col[ot.moment] for p, col in ot.phases.items()} == {p.name: p.bytes for p in ex.phases}
    import pickle

    rec = tmp_path / "layered.pickle"
    rec.write_bytes(pickle.dumps(layered_program()[0]))
    html = (tmp_path / "page.html")
    write_explain_html(rec, html, what_if=False)
    text = html.read_text()
    assert 'data-phase="backward"' in text and "by the phase that made it" in text


def test_an_inference_recording_has_no_backward_and_no_training_remedies() -> None:
    """Real H200 recordings (tests/data/explain_gpu): a timm ConvNeXt run in inference and a Llama generate()
    never call torch.autograd or an optimizer; the training loop does."""
    from alloctune.analysis.phases import trains
    from alloctune.remedy.registry import simulated_remedies
    from alloctune.trace import load_trace

    data = Path(__file__).parent / "data" / "explain_gpu"
    for name in ("convnext_clean", "llama_generate"):
        trace = load_trace(data / f"{name}.pickle.xz")
        assert not trains(trace.requests)
        assert BACKWARD not in allocation_phases(trace.requests)
        ex = explain(trace, what_if=False)
        assert ex.moment["phase"] == FORWARD
        names = {r.name for r in simulated_remedies(analyse(trace), None)}
        assert not names & {"checkpointing", "optimizer_sgd", "optimizer_8bit"}
    train = load_trace(data / "train_clean.pickle.xz")
    assert trains(train.requests)
