"""`alloctune.integrations.find_batch_size`: the largest batch size, from recorded steps and the simulator.

Without a GPU the device is a fake (`SyntheticGPU`) that runs the user's step for real and hands
out the recording of a synthetic training step whose request sizes grow linearly in the batch
size. Its memory is plain arithmetic: every block is a multiple of 2 MiB of at least 10 MiB (a
segment of its own size) and every reuse is of a block of the same size, so the step needs
exactly its peak live bytes, `PEAK(b)`. The answers are checked against that arithmetic, never
against the tool's own output; so are the steps the finder adds where its first answer lies
more than twice the largest recording (at half that answer, rounded up to `multiple_of`). A
second program takes another path from `BRANCH` samples on, with a buffer quadratic in the batch
size that no recording at 8, 16, 32 shows. The last test runs a real MLP step on a GPU.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from alloctune.errors import InputError
from alloctune.integrations import BatchSizeResult, NoBatchSizeFits, batch_size, find_batch_size, fits_batch_size
from alloctune.integrations.batch_size import Recording, step_recording
from alloctune.trace.model import ALLOC, FREE, RequestStream, Trace
from alloctune.trace.stream import RUN_RECORD_KEY

torch = pytest.importorskip("torch")

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TOTAL = 80 * GiB  # the synthetic recordings' device
AVAILABLE = 12 * GiB  # what the fake device says the process could hold
WEIGHTS = 64 * MiB
WEIGHT_GRADS = 64 * MiB


def peak(b: int) -> int:
    """The synthetic step's peak live bytes: weights, its fixed weight gradient, 100 MiB per sample."""
    return WEIGHTS + WEIGHT_GRADS + 100 * MiB * b


def truth(budget: int, multiple_of: int = 1, max_size: int | None = None) -> int:
    """The largest multiple of `multiple_of` whose peak fits `budget`, by the arithmetic alone."""
    b = (budget - WEIGHTS - WEIGHT_GRADS) // (100 * MiB)
    b = (b // multiple_of) * multiple_of
    return b if max_size is None else min(b, (max_size // multiple_of) * multiple_of)


def half_up(answer: int, multiple_of: int = 1) -> int:
    """Where the finder records next for an answer more than twice its largest recording."""
    return -(-answer // (2 * multiple_of)) * multiple_of


def added_for(want: int, multiple_of: int = 1, top: int = 32) -> tuple[int, ...]:
    """The steps the finder adds for the linear step: one at half an answer more than twice `top`."""
    return (half_up(want, multiple_of),) if want > 2 * top else ()


class _Program:
    def __init__(self) -> None:
        self.req = RequestStream()
        self.rid = 0

    def alloc(self, size: int) -> int:
        self.req.append(ALLOC, size, self.rid, 0, len(self.req))
        self.rid += 1
        return self.rid - 1

    def free(self, rid: int) -> None:
        self.req.append(FREE, -1, rid, 0, len(self.req))


def linear_step(b: int) -> Trace:
    """Weights, then two training steps at batch size b: input, hidden, output and their gradients
    (12 + 32 + 12 + 12 + 32 MiB per sample) and the weights' gradient, all freed at the step's end.
    The second step reuses the first one's blocks, each of its own size: the peak is `peak(b)`."""
    p = _Program()
    p.alloc(WEIGHTS)
    for _ in range(2):
        live = [p.alloc(mib * MiB * b) for mib in (12, 32, 12, 12, 32)] + [p.alloc(WEIGHT_GRADS)]
        for rid in reversed(live):
            p.free(rid)
    return Trace(f"linear@{b}", 0, p.req, [], {}, meta={"torch": "2.11.0"}, total_memory=TOTAL)


def oom() -> BaseException:
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 80 GiB")


class SyntheticGPU:
    """`StepDevice` without a GPU: `step_fn` runs for real, a recording is `program(b)`; under a cap, a
    batch size above `limit` runs out of memory (the GPU's own answer, for `verify`)."""

    def __init__(self, program: Any = linear_step, limit: int | None = None) -> None:
        self.program = program
        self.limit = limit
        self.calls: list[tuple[str, int, int | None]] = []
        self.released = 0

    def run(self, step_fn: Any, batch_size: int, budget: int | None = None) -> None:
        self.calls.append(("run", batch_size, budget))
        step_fn(batch_size)
        if budget is not None and self.limit is not None and batch_size > self.limit:
            raise oom()

    def record(self, step_fn: Any, batch_size: int) -> Recording:
        self.calls.append(("record", batch_size, None))
        step_fn(batch_size)
        made = self.program(batch_size)
        return made if isinstance(made, Recording) else Recording(made)

    def available(self) -> int:
        return AVAILABLE

    def release(self) -> None:
        self.released += 1


def step(b: int) -> None:
    """The user's step: the fake's recording stands for what it did on the GPU."""


# ---- the answer ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("budget", "multiple_of"), [
    ("6GiB", 1), ("6GiB", 8), (1000 * MiB + 7, 1), ("20GiB", 1), ("20GiB", 64), ("2.5GiB", 3),
])
def test_the_answer_is_the_largest_batch_whose_peak_fits_the_budget(budget, multiple_of):
    gpu = SyntheticGPU()
    found = find_batch_size(step, budget, multiple_of=multiple_of, device=gpu)
    limit = budget if isinstance(budget, int) else {"6GiB": 6 * GiB, "20GiB": 20 * GiB, "2.5GiB": 5 * GiB // 2}[budget]
    want = truth(limit, multiple_of)
    assert peak(want) <= limit < peak(want + multiple_of)  # the arithmetic itself, once
    assert found.largest == want == found.predicted
    assert found.budget == limit
    assert found.first_failing == want + multiple_of
    assert found.stopped == "exceeded"
    added = added_for(want, multiple_of)  # 20GiB: 203 from 8..32 is recorded toward at 102 (at 128 for 64)
    assert found.added == added and found.recorded == (8, 16, 32, *added) and found.recording_oom is None
    assert found.resident == 0 and found.runs == () and not found.verified
    assert gpu.calls == [("run", 8, None), ("record", 8, None), ("record", 16, None), ("record", 32, None),
                         *[("record", b, None) for b in added]]


def test_without_a_budget_the_process_s_available_memory_is_the_budget():
    found = find_batch_size(step, device=SyntheticGPU())
    assert found.budget == AVAILABLE
    assert found.largest == truth(AVAILABLE)


def test_sizes_are_recorded_in_ascending_order_once_each():
    gpu = SyntheticGPU()
    found = find_batch_size(step, "6GiB", sizes=(24, 4, 12, 4), device=gpu)
    added = added_for(truth(6 * GiB), top=24)
    assert added == (30,) and found.added == added  # 60 is more than twice 24
    assert found.recorded == (4, 12, 24, 30)
    assert [c for c in gpu.calls if c[0] == "record"] == [("record", 4, None), ("record", 12, None),
                                                          ("record", 24, None), ("record", 30, None)]
    assert found.largest == truth(6 * GiB)


def test_max_size_ends_the_search_and_says_so():
    found = find_batch_size(step, "20GiB", max_size=40, multiple_of=8, device=SyntheticGPU())
    assert found.largest == 40 < truth(20 * GiB)
    assert found.stopped == "max-size" and found.first_failing is None
    assert any(n.startswith("at least 40:") for n in found.notes)


def test_an_answer_far_beyond_the_recordings_is_recorded_toward_until_it_is_within_twice_the_largest():
    gpu = SyntheticGPU()
    found = find_batch_size(step, "79GiB", sizes=(2, 4, 8), device=gpu)
    want = truth(79 * GiB)
    # from 2..8 the search stops at 16x 8 = 128 (a lower bound): recorded at 64; from there the answer, 807
    assert want == 807 > 16 * 8
    assert found.added == (64, half_up(want)) == (64, 404)
    assert found.largest == want and found.stopped == "exceeded" and found.recorded == (2, 4, 8, 64, 404)
    assert any(n.startswith("recorded 64, 404 as well, near the answers") for n in found.notes)


def constant_step(b: int) -> Trace:
    """A step whose memory does not grow with the batch size: every size fits, the answer never settles."""
    p = _Program()
    p.alloc(WEIGHTS)
    p.free(p.alloc(WEIGHT_GRADS))
    return Trace(f"constant@{b}", 0, p.req, [], {}, meta={"torch": "2.11.0"}, total_memory=TOTAL)


def test_the_added_recordings_are_bounded_and_the_notes_say_the_answer_is_a_lower_bound():
    gpu = SyntheticGPU(program=constant_step)
    found = find_batch_size(step, "6GiB", device=gpu)
    # each answer is 16x the largest recording (the open-ended search's limit), each step added at half of it
    assert found.added == (256, 2048, 16384, 131072) and len(found.added) == batch_size.MAX_ADDED
    assert [c[1] for c in gpu.calls if c[0] == "record"] == [8, 16, 32, *found.added]
    assert found.largest == 16 * 131072 and found.stopped == "extrapolation"
    assert any(n.startswith("at least 2097152:") and "record larger sizes to search further" in n for n in found.notes)
    assert any(n.startswith("2097152 is still more than 2x the largest recorded size (131072) after 4 more "
                            "recordings, the most the finder makes") for n in found.notes)


def test_the_result_is_plain_data():
    found = find_batch_size(step, "6GiB", device=SyntheticGPU())
    d = json.loads(json.dumps(found.to_dict()))
    assert d["schema"] == "alloctune.batch_size/1"
    assert d["largest"] == found.largest and d["recorded"] == [8, 16, 32] and d["budget"] == 6 * GiB
    assert d["added"] == [] and d["recording_oom"] is None
    assert isinstance(found, BatchSizeResult) and all(isinstance(n, str) for n in found.notes)


# ---- verify ----------------------------------------------------------------------------------------
def test_verify_steps_down_when_the_gpu_runs_out_of_memory_at_the_answer():
    want = truth(6 * GiB)
    gpu = SyntheticGPU(limit=want - 2)  # the GPU holds less than the simulation said
    found = find_batch_size(step, "6GiB", verify=True, device=gpu)
    step_down = int(want * 0.98)  # plan.confirm: down by the error bound, at least 2 %
    assert found.predicted == want and found.largest == step_down == want - 2
    assert [(r.size, r.outcome, r.budget) for r in found.runs] == [(str(want), "oom", 6 * GiB),
                                                                   (str(step_down), "ok", 6 * GiB)]
    assert found.verified
    assert ("run", want, 6 * GiB) in gpu.calls and ("run", step_down, 6 * GiB) in gpu.calls
    assert gpu.released == 4  # after the warm-up, the recordings and each verify step (the failed one too)


def test_verify_confirms_the_answer_and_tries_one_step_above_an_extrapolated_one():
    want = truth(6 * GiB)
    assert want > 32  # outside the recorded sizes
    found = find_batch_size(step, "6GiB", verify=True, device=SyntheticGPU(limit=want))
    assert found.largest == want and found.verified
    assert [(r.size, r.outcome) for r in found.runs] == [(str(want), "ok"), (str(int(want * 1.02)), "oom")]


def test_verify_that_finds_no_size_is_a_clear_error():
    with pytest.raises(NoBatchSizeFits, match=r"^verify: batch size \d+: oom; batch size \d+: oom; batch size \d+: oom"):
        find_batch_size(step, "6GiB", verify=True, device=SyntheticGPU(limit=8))


def test_verify_under_another_allocator_setting_is_refused_before_any_step(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    gpu = SyntheticGPU()
    with pytest.raises(InputError, match="verify runs the step in this process, whose allocator setting is ''"):
        find_batch_size(step, "6GiB", conf="expandable_segments:True", verify=True, device=gpu)
    assert gpu.calls == []


def test_an_allocator_setting_that_does_not_read_is_refused_before_any_step():
    gpu = SyntheticGPU()
    with pytest.raises(InputError, match="max_split_size_mb"):
        find_batch_size(step, "6GiB", conf="max_split_size_mb:lots", device=gpu)
    assert gpu.calls == []


# ---- out of memory while recording -----------------------------------------------------------------
def failing_from(first: int) -> Any:
    def step_fn(b: int) -> None:
        if b >= first:
            raise oom()
    return step_fn


def test_out_of_memory_at_the_smallest_size_is_a_clear_error():
    gpu = SyntheticGPU()
    with pytest.raises(NoBatchSizeFits) as caught:
        find_batch_size(failing_from(1), "6GiB", device=gpu)
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("step_fn ran out of memory at batch size 8 during the warm-up step before recording")
    assert "sizes=(1, 2, 4)" in text and "OutOfMemoryError: CUDA out of memory" in text
    assert isinstance(caught.value.__cause__, torch.OutOfMemoryError)
    assert gpu.released == 1 and [c[0] for c in gpu.calls] == ["run"]


def test_out_of_memory_at_the_second_size_is_a_clear_error():
    with pytest.raises(NoBatchSizeFits, match=r"^step_fn ran out of memory at batch size 16 during recording "
                                              r"\(recorded: 8\)"):
        find_batch_size(failing_from(16), "6GiB", device=SyntheticGPU())


def test_out_of_memory_at_the_largest_size_keeps_the_answer_below_it():
    found = find_batch_size(failing_from(32), "20GiB", device=SyntheticGPU())
    assert found.recorded == (8, 16)
    assert found.largest == 31 < truth(20 * GiB)
    assert any(n == "batch size 32 ran out of memory while recording: the answer stays below it" for n in found.notes)


def test_out_of_memory_at_an_added_size_keeps_the_answer_below_it():
    gpu = SyntheticGPU()
    found = find_batch_size(failing_from(100), "20GiB", device=gpu)
    # 203 from 8..32: recording at 102 runs out of memory, so the search ends at 101; 101 is recorded
    # toward at 51, and the answer stays 101
    assert [c[1] for c in gpu.calls if c[0] == "record"] == [8, 16, 32, half_up(truth(20 * GiB)), 51]
    assert found.recording_oom == 102 and found.added == (51,) and found.recorded == (8, 16, 32, 51)
    assert found.largest == 101 and found.stopped == "max-size"
    assert "batch size 102 ran out of memory while recording: the answer stays below it" in found.notes


def test_other_errors_of_the_step_propagate_unchanged():
    def broken(b: int) -> None:
        raise ValueError("shape mismatch")

    with pytest.raises(ValueError, match="shape mismatch"):
        find_batch_size(broken, "6GiB", device=SyntheticGPU())


def test_a_budget_nothing_fits_is_a_clear_error():
    with pytest.raises(NoBatchSizeFits, match=r"^no batch size fits 200\.00 MiB: the simulated step fails already at "
                                              r"batch size 1"):
        find_batch_size(step, "200MiB", device=SyntheticGPU())


# ---- bad input ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("budget", ["lots", "6", 0, -5, True, "-1GiB", "nanGiB", 6.5])
def test_a_bad_budget_is_an_input_error_of_one_line_before_any_gpu_work(budget):
    gpu = SyntheticGPU()
    with pytest.raises(InputError) as caught:
        find_batch_size(step, budget, device=gpu)
    assert "\n" not in str(caught.value) and "budget" in str(caught.value)
    assert gpu.calls == []


def test_a_budget_larger_than_the_gpu_is_an_input_error():
    with pytest.raises(InputError, match=r"^budget 100\.00 GiB is more than this GPU's memory \(80\.00 GiB\)$"):
        find_batch_size(step, "100GiB", device=SyntheticGPU())


@pytest.mark.parametrize(("options", "words"), [
    ({"sizes": (8,)}, "sizes must be two or more"),
    ({"sizes": (8, 8)}, "sizes must be two or more"),
    ({"sizes": (0, 8)}, "sizes must be two or more"),
    ({"sizes": "8,16"}, "sizes must be two or more"),
    ({"multiple_of": 0}, "multiple_of must be"),
    ({"multiple_of": 2.5}, "multiple_of must be"),
    ({"max_size": 16}, r"max_size 16 is below the largest size to record \(32\): record smaller sizes"),
    ({"max_size": 4, "multiple_of": 8, "sizes": (1, 2)}, "max_size must be a whole number of at least multiple_of"),
])
def test_bad_options_are_input_errors(options, words):
    gpu = SyntheticGPU()
    with pytest.raises(InputError, match=words):
        find_batch_size(step, "6GiB", device=gpu, **options)
    assert gpu.calls == []


def test_a_step_that_is_not_a_function_is_an_input_error():
    with pytest.raises(InputError, match="step_fn must be a function of the batch size, got int"):
        find_batch_size(3, "6GiB", device=SyntheticGPU())  # type: ignore[arg-type]


# ---- the decorator -----------------------------------------------------------------------------------
def test_the_decorator_finds_the_size_with_the_step_and_trains_at_it():
    probed: list[tuple[int, str]] = []

    def one_step(batch_size: int, tag: str) -> None:
        probed.append((batch_size, tag))

    @fits_batch_size(one_step, "6GiB", device=SyntheticGPU())
    def train(batch_size: int, tag: str) -> tuple[int, str]:
        """Train."""
        return batch_size, tag

    assert train("run-1") == (truth(6 * GiB), "run-1")
    assert probed == [(8, "run-1"), (8, "run-1"), (16, "run-1"), (32, "run-1")]
    assert train.found is not None and train.found.largest == truth(6 * GiB)
    assert train.__name__ == "train" and train.__doc__ == "Train."


def test_the_decorator_refuses_bad_options_at_once():
    with pytest.raises(InputError, match="budget"):
        fits_batch_size(step, "a lot")


# ---- a term the first recordings cannot see -------------------------------------------------------------
BRANCH = 48  # from this batch size on, the step takes another path with a buffer of b * b * 64 KiB


def branch_peak(b: int) -> int:
    return peak(b) + (b * b * 64 * KiB if b >= BRANCH else 0)


def branch_truth(budget: int) -> int:
    """The largest multiple of 8 whose `branch_peak` fits `budget` (the buffer is 2 MiB-whole at multiples of 8)."""
    b = 8
    while branch_peak(b + 8) <= budget:
        b += 8
    return b


def branch_step(b: int) -> Trace:
    """`linear_step`, with the buffer allocated after the hidden activation from `BRANCH` on."""
    p = _Program()
    p.alloc(WEIGHTS)
    for _ in range(2):
        live = [p.alloc(12 * MiB * b), p.alloc(32 * MiB * b)] + ([p.alloc(b * b * 64 * KiB)] if b >= BRANCH else [])
        live += [p.alloc(mib * MiB * b) for mib in (12, 12, 32)] + [p.alloc(WEIGHT_GRADS)]
        for rid in reversed(live):
            p.free(rid)
    return Trace(f"branch@{b}", 0, p.req, [], {}, meta={"torch": "2.11.0"}, total_memory=TOTAL)


def test_without_added_recordings_the_answer_from_small_sizes_over_promises(monkeypatch):
    monkeypatch.setattr(batch_size, "MAX_ADDED", 0)
    found = find_batch_size(step, 20 * GiB, multiple_of=8, max_size=1 << 17, device=SyntheticGPU(program=branch_step))
    assert found.largest == truth(20 * GiB, 8) == 200 > branch_truth(20 * GiB) == 176
    assert found.added == () and any("still more than 2x" in n for n in found.notes)


@pytest.mark.parametrize(("gib", "max_size"), [(20, 1 << 17), (38, 1 << 17), (56, 1 << 17), (20, None)])
def test_added_recordings_near_the_answer_find_the_term_the_small_sizes_miss(gib, max_size):
    gpu = SyntheticGPU(program=branch_step)
    found = find_batch_size(step, gib * GiB, multiple_of=8, max_size=max_size, device=gpu)
    want = branch_truth(gib * GiB)
    assert want - 8 <= found.largest <= want
    assert found.added[0] == half_up(truth(gib * GiB, 8), 8)  # half the first answer, the linear part's
    assert all(b > 32 and b % 8 == 0 for b in found.added) and len(found.added) <= batch_size.MAX_ADDED
    assert 2 * max(found.recorded) >= found.largest and max(found.recorded) >= BRANCH


def test_a_branch_between_half_the_answer_and_the_answer_is_left_to_verify():
    budget = 8 * GiB
    first = truth(budget, 8)
    assert half_up(first, 8) < BRANCH <= first  # the recording at half the answer takes the old path
    found = find_batch_size(step, budget, multiple_of=8, device=SyntheticGPU(program=branch_step))
    assert found.added == (40,) and found.largest == first == 80 > branch_truth(budget) == 72
    gpu = SyntheticGPU(program=branch_step, limit=branch_truth(budget))
    checked = find_batch_size(step, budget, multiple_of=8, verify=True, device=gpu)
    assert checked.largest == 72 and checked.verified
    assert [(r.size, r.outcome) for r in checked.runs] == [("80", "oom"), ("72", "ok")]


# ---- memory held before the step -----------------------------------------------------------------------
BASE = 0x7F00_0000_0000
MODEL = 64 * MiB
GRADS = 640 * MiB


def before_step(hole: int = 0) -> dict[str, Any]:
    """The snapshot as recording begins: the model's weights (a segment of their own, with `hole` bytes
    of it free) and last step's gradients, both live."""
    weights = {"device": 0, "address": BASE, "total_size": MODEL + hole, "stream": 0, "segment_type": "large",
               "is_expandable": False,
               "blocks": [{"address": BASE, "size": MODEL, "requested_size": MODEL, "state": "active_allocated"}]
               + ([{"address": BASE + MODEL, "size": hole, "requested_size": 0, "state": "inactive"}] if hole else [])}
    grads = {"device": 0, "address": BASE + GiB, "total_size": GRADS, "stream": 0, "segment_type": "large",
             "is_expandable": False,
             "blocks": [{"address": BASE + GiB, "size": GRADS, "requested_size": GRADS,
                         "state": "active_allocated"}]}
    return {"segments": [weights, grads], "device_traces": [[]], "allocator_settings": {}}


def after_step(b: int) -> dict[str, Any]:
    """The step's history: last step's gradients freed (`zero_grad(set_to_none=True)` first), two
    activations of 64 MiB per sample, freed, and new gradients kept."""
    events: list[dict[str, Any]] = []

    def ev(action: str, addr: int, size: int) -> None:
        events.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 1000 + len(events)})

    for action in ("free_requested", "free_completed"):
        ev(action, BASE + GiB, GRADS)
    acts = [BASE + (4 + 2 * k) * GiB * 16 for k in range(2)]
    for addr in acts:
        ev("alloc", addr, 64 * MiB * b)
    for addr in acts:
        for action in ("free_requested", "free_completed"):
            ev(action, addr, 64 * MiB * b)
    ev("alloc", BASE + 2 * GiB, GRADS)
    record = {"total_memory": TOTAL, "torch": "2.11.0+cu130", "conf": "", "device": 0, "cmd": ["train.py"], "cap": 0}
    return {"segments": [], "device_traces": [events], "allocator_settings": {}, RUN_RECORD_KEY: record}


def test_memory_held_before_the_step_is_replayed_and_what_the_step_frees_is_reused():
    rec = step_recording(before_step(), after_step(8), source="step@8")
    assert rec.resident == MODEL + GRADS and rec.padding == 0
    req = rec.trace.requests
    assert (req.ops[:3], req.sizes[:3]) == ([ALLOC, ALLOC, FREE], [MODEL, GRADS, GRADS])  # then the step's own
    gpu = SyntheticGPU(program=lambda b: step_recording(before_step(), after_step(b), source=f"step@{b}"))
    budget = 1650 * MiB
    found = find_batch_size(step, budget, device=gpu)
    # at the second activation: the weights and two activations live; the old gradients freed and released
    assert found.largest == (budget - MODEL) // (128 * MiB) == 12
    assert found.resident == MODEL + GRADS
    assert any("each step began with 704.00 MiB reserved" in n for n in found.notes)


def test_free_space_the_gpu_left_in_held_segments_is_rebuilt_where_it_was():
    """The weights' segment had a 16 MiB free block after the weights: the simulated step starts with
    that segment reserved whole and the free block in it (a step request up to 16 MiB could use it, as
    on the GPU); the 64 MiB-a-sample activations cannot, so 11 samples fit beside the whole segment."""
    from alloctune.sim.replay import replay
    from alloctune.trace.model import Trace as T

    hole = 16 * MiB
    rec = step_recording(before_step(hole), after_step(8), source="step@8")
    assert rec.resident == MODEL + hole + GRADS and rec.padding == 0
    req = rec.trace.requests
    # the segment reserved whole and freed, cut into the weights and the free block, the gradients; the
    # free block freed again once every segment is cut
    assert list(zip(req.ops[:6], req.sizes[:6])) == [(ALLOC, MODEL + hole), (FREE, MODEL + hole), (ALLOC, MODEL),
                                                     (ALLOC, hole), (ALLOC, GRADS), (FREE, hole)]
    prefix = RequestStream()
    prefix.extend_from(req, 0, 6)
    state = replay(T("<prefix>", 0, prefix, [], {}, total_memory=TOTAL), None, addresses="model")
    assert state.peak_reserved == rec.resident and state.stats["allocated_bytes.all.current"] == MODEL + GRADS
    gpu = SyntheticGPU(program=lambda b: step_recording(before_step(hole), after_step(b), source=f"step@{b}"))
    budget = 1610 * MiB  # 12 samples fit beside the weights alone, 11 beside the weights' whole segment
    found = find_batch_size(step, budget, device=gpu)
    assert found.largest == (budget - MODEL - hole) // (128 * MiB) == 11
    assert not any("held aside as padding" in n for n in found.notes)


@pytest.mark.parametrize("name", ["convnext", "hubert", "seg", "trainkeep"])
def test_real_segment_layouts_are_rebuilt_block_for_block(name):
    """The segments of real snapshots (H200, default setting: tests/data/cap_oom) as the memory held
    before a step: the simulated allocator after the rebuilt prefix holds segments of the same sizes,
    and in each the same sequence of block sizes, allocated or free, as the GPU had."""
    from pathlib import Path

    from alloctune.sim.replay import state_at
    from alloctune.trace.load import load_snapshot

    snap = load_snapshot(Path(__file__).parent / "data" / "cap_oom" / f"{name}.pickle.xz")
    segments = [s for s in snap["segments"] if s.get("device", 0) == 0]
    rec = step_recording({"segments": segments}, {**after_step(1), "device_traces": [[]]}, source=name)
    assert rec.padding == 0
    sim = state_at(rec.trace, None, len(rec.trace.requests), addresses="model").segment_table()

    def shape(seg: dict[str, Any]) -> tuple[str, list[tuple[int, bool]]]:
        blocks = [(int(b["size"]), str(b["state"]).startswith("active")) for b in sorted(
            seg["blocks"], key=lambda b: int(b["address"]))]
        return seg.get("segment_type", "large"), blocks

    assert sorted(map(shape, sim)) == sorted(map(shape, segments))


def test_under_expandable_segments_the_free_space_is_padded_instead():
    """Expandable segments map pages rather than cut blocks: the held blocks are allocated afresh and the
    reserved bytes the simulator packs them short of are held aside as padding."""
    hole = 36 * MiB
    after = after_step(8)
    after["allocator_settings"] = {"expandable_segments": True}
    rec = step_recording(before_step(hole), after, source="step@8")
    req = rec.trace.requests
    assert rec.resident == MODEL + hole + GRADS and rec.padding > 0
    assert req.sizes[0] == -(-rec.padding // (2 * MiB)) * 2 * MiB  # a segment of the padding's size first
    assert MODEL + hole not in req.sizes and req.sizes[1:3] == [MODEL, GRADS]


# ---- a real GPU ----------------------------------------------------------------------------------------
def _fits_and_not_above(train_step: Any, optimizer: Any, budget: int, multiple_of: int) -> tuple[bool, bool, Any]:
    """find_batch_size's answer, then the same step really run under the budget at that size and one
    multiple above it, each after the cache is emptied (the finder's own recordings are not the check)."""
    import gc

    found = find_batch_size(train_step, budget, max_size=1 << 17, multiple_of=multiple_of)
    assert found.stopped == "exceeded" and found.resident > 0
    assert 2 * max(found.recorded) >= found.largest  # the answer rests on a recording at least half its size

    def completes(batch_size: int) -> bool:
        optimizer.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()
        try:
            train_step(batch_size)
            torch.cuda.synchronize()
        except torch.OutOfMemoryError:
            return False
        return True

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(budget / total)
    try:
        fits, above = completes(found.largest), completes(found.largest + multiple_of)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        optimizer.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()
    return fits, above, found


@pytest.mark.gpu
def test_an_mlp_training_step_fits_at_the_answer_and_not_one_step_above():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
    optimizer = torch.optim.AdamW(model.parameters())

    def train_step(batch_size: int) -> None:
        x = torch.randn(batch_size, 512, device="cuda")
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    fits, above, found = _fits_and_not_above(train_step, optimizer, 1 * GiB, 64)
    assert (fits, above) == (True, False), found


@pytest.mark.gpu
def test_a_transformer_encoder_training_step_fits_at_the_answer_and_not_one_step_above():
    """A torch.nn.TransformerEncoder (4 layers, d_model 512, sequences of 256) trained with AdamW under
    bf16 autocast: attention and autocast's casts make the step's memory other than linear in the batch."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, 4), torch.nn.Linear(512, 10)).cuda()
    optimizer = torch.optim.AdamW(model.parameters())

    def train_step(batch_size: int) -> None:
        x = torch.randn(batch_size, 256, 512, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    fits, above, found = _fits_and_not_above(train_step, optimizer, 2 * GiB, 2)
    assert (fits, above) == (True, False), found
