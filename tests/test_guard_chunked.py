"""chunked: halving on OOM, memo per shape, grow-back, give-up, exact joins, freeing failed pieces."""

from __future__ import annotations

import logging
import math
import weakref
from fractions import Fraction

import pytest
import torch
from torch import nn

from alloctune.guard import ChunkMemo, Chunker, ChunkRun, chunked, stats


pytestmark = pytest.mark.usefixtures("fresh_guard_stats")


class BudgetModel:
    """Test double for a GPU model under a memory cap.

    Raises `torch.OutOfMemoryError` when a window is longer than `budget` positions (or on the
    call numbers in `fail_calls`, a transient OOM); otherwise runs `model`. Each call first
    makes a scratch tensor (an activation of the failed attempt) and keeps a weak reference.
    """

    def __init__(self, model, budget=math.inf, fail_calls=(), dim=-1):
        self.model = model
        self.budget = budget
        self.fail_calls = set(fail_calls)
        self.dim = dim
        self.windows: list[int] = []
        self.failed_refs: list[weakref.ref] = []
        self.failed_alive_at_call: list[bool] = []
        self.raised: list[BaseException] = []

    def __call__(self, x, *rest):
        self.failed_alive_at_call.append(any(r() is not None for r in self.failed_refs))
        n = x.shape[self.dim]
        self.windows.append(n)
        scratch = torch.empty(n, 8)
        if n > self.budget or len(self.windows) in self.fail_calls:
            self.failed_refs.append(weakref.ref(scratch))
            exc = torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n * 32} bytes.")
            self.raised.append(exc)
            raise exc
        return self.model(x, *rest)


def conv_model() -> nn.Module:
    """A small 1-D conv stack on mono audio; receptive field 9 samples to each side."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv1d(1, 8, 9, padding=4),
        nn.Tanh(),
        nn.Conv1d(8, 8, 5, padding=4, dilation=2),
        nn.Tanh(),
        nn.Conv1d(8, 1, 3, padding=1),
    ).eval()


def audio(n: int, batch: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    t = torch.arange(n, dtype=torch.float32) / 16000
    tone = 0.5 * torch.sin(2 * math.pi * 220 * t)
    return (tone + 0.05 * torch.randn(batch, 1, n, generator=g)).reshape(batch, 1, n)


@torch.no_grad()
def test_halves_only_the_failing_piece_and_matches_the_unchunked_output():
    model = conv_model()
    x = audio(16000)
    double = BudgetModel(model, budget=3000)
    run = Chunker(double, overlap=16, min_chunk=500)
    y = run(x)
    expected = model(x)
    assert y.shape == expected.shape == (1, 1, 16000)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)
    # whole input, 3 halvings, 4 pieces of 2000 (+16 context each side), one grow-back to 4000
    # that fails, then 2000-pieces to the end; finished pieces are never recomputed
    assert double.windows == [16000, 8016, 4016, 2016, 2032, 2032, 2032, 4032, 2032, 2032, 2032, 2016]
    rep = run.last_run
    assert (rep.start_chunk, rep.final_chunk, rep.pieces, rep.calls, rep.halvings, rep.grow_backs) == (
        16000, 2000, 8, 12, 4, 1)
    assert run.memo[((1, 1, None), "torch.float32", "cpu")] == ChunkMemo(largest_ok=2000, smallest_failed=4000)
    snap = stats.snapshot()
    assert (snap.ooms, snap.halvings, snap.give_ups) == (4, 4, 0)


@torch.no_grad()
def test_control_without_overlap_the_seams_differ():
    """Makes sure the equality above depends on the overlap (the test can fail)."""
    model = conv_model()
    x = audio(16000)
    y = Chunker(BudgetModel(model, budget=3000), overlap=0, cleanup=False)(x)
    assert (y - model(x)).abs().max().item() > 1e-3


@torch.no_grad()
def test_failed_pieces_tensors_are_freed_before_the_next_call():
    double = BudgetModel(conv_model(), budget=3000)
    Chunker(double, overlap=16, cleanup=False)(audio(16000))
    assert len(double.failed_refs) == 4
    assert double.failed_alive_at_call == [False] * len(double.windows)
    assert all(r() is None for r in double.failed_refs)


@torch.no_grad()
def test_memo_per_shape_key():
    model = conv_model()
    double = BudgetModel(model, budget=3000)
    run = Chunker(double, overlap=16, cleanup=False)
    run(audio(16000))
    double.windows.clear()

    # same shape: starts from the remembered 2000, no probing of the whole input
    y = run(audio(16000))
    assert double.windows == [2016, 2032, 2032, 2032, 4032, 2032, 2032, 2032, 2016]
    torch.testing.assert_close(y, model(audio(16000)), rtol=1e-5, atol=1e-6)

    # same key (length is not part of it), longer input: also starts from 2000
    double.windows.clear()
    run(audio(6000))
    assert double.windows[:1] == [2016]

    # another shape (batch of 2) is another key: starts from the whole input
    double.windows.clear()
    y2 = run(audio(16000, batch=2))
    assert double.windows[0] == 16000
    assert len(run.memo) == 2
    torch.testing.assert_close(y2, model(audio(16000, batch=2)), rtol=1e-5, atol=1e-6)


@torch.no_grad()
def test_grow_back_recovers_after_a_transient_oom():
    model = conv_model()
    double = BudgetModel(model, fail_calls={2})  # no hard limit: the second call OOMs once
    run = Chunker(double, overlap=16, start=4000, grow_after=2)
    y = run(audio(16000))
    assert double.windows == [4016, 4032, 2032, 2032, 4032, 4016]
    assert (run.last_run.halvings, run.last_run.grow_backs, run.last_run.final_chunk) == (1, 1, 4000)
    torch.testing.assert_close(y, model(audio(16000)), rtol=1e-5, atol=1e-6)


@torch.no_grad()
def test_repeated_grow_back_failures_back_off():
    double = BudgetModel(conv_model(), budget=3000)
    Chunker(double, overlap=16, grow_after=2, cleanup=False)(audio(32000))
    # grow-backs after 2, then 4, then 8 successes: each failure doubles the wait
    assert double.windows == (
        [32000, 16016, 8016, 4016, 2016, 2032, 4032] + [2032] * 4 + [4032] + [2032] * 8 + [4016, 2032, 2016]
    )


@torch.no_grad()
def test_gives_up_below_min_chunk_with_the_original_error(caplog):
    double = BudgetModel(conv_model(), budget=100)
    run = Chunker(double, min_chunk=1000)
    with caplog.at_level(logging.WARNING, logger="alloctune.guard"):
        with pytest.raises(torch.OutOfMemoryError) as info:
            run(audio(16000))
    assert double.windows == [16000, 8000, 4000, 2000, 1000]
    assert info.value is double.raised[-1]
    snap = stats.snapshot()
    assert (snap.ooms, snap.halvings, snap.give_ups) == (5, 4, 1)
    messages = [r.getMessage() for r in caplog.records if r.name == "alloctune.guard"]
    assert len(messages) == 5
    assert "halving to 8000" in messages[0]
    assert "giving up" in messages[-1]


def test_decorator_forms():
    @chunked
    def double_it(x):
        return 2 * x

    @chunked(dim=0, start=3)
    def rows(x):
        assert x.shape[0] <= 3
        return x + 1

    x = torch.arange(10.0)
    assert torch.equal(double_it(x), 2 * x)
    assert double_it.__name__ == "double_it"
    m = torch.arange(20.0).reshape(10, 2)
    assert torch.equal(rows(m), m + 1)
    assert rows.last_run.pieces == 4  # 3 + 3 + 3 + 1
    with pytest.raises(ValueError, match="blend"):
        chunked(blend="smear")


def test_crossfade_of_a_pointwise_function_is_exact_even_after_halving():
    x = torch.linspace(-3, 3, 1000)
    double = BudgetModel(torch.tanh, budget=300)
    y = Chunker(double, overlap=50, blend="crossfade")(x)
    assert double.windows[:3] == [1000, 550, 300]
    torch.testing.assert_close(y, torch.tanh(x), rtol=0, atol=1e-6)


def test_overlap_add_sums_the_shared_positions():
    x = torch.ones(100)
    y = Chunker(overlap=10, blend="add", start=40).run(lambda t: t.clone(), x)
    expected = torch.ones(100)
    expected[40:50] = 2
    expected[80:90] = 2
    assert torch.equal(y, expected)


@torch.no_grad()
def test_upsampling_model_with_ratio():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(1, 4, 3, padding=1), nn.Tanh(),
                          nn.ConvTranspose1d(4, 1, 4, stride=2, padding=1)).eval()
    x = audio(4000)
    double = BudgetModel(model, budget=900)
    y = Chunker(double, overlap=8, ratio=2)(x)
    assert y.shape == (1, 1, 8000)
    torch.testing.assert_close(y, model(x), rtol=1e-5, atol=1e-6)


@torch.no_grad()
def test_downsampling_model_with_fractional_ratio_and_align():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(1, 4, 4, stride=4), nn.Tanh(), nn.Conv1d(4, 2, 3, padding=1)).eval()
    x = audio(4000)
    double = BudgetModel(model, budget=1500)
    y = Chunker(double, overlap=8, ratio=Fraction(1, 4), align=4)(x)
    assert y.shape == (1, 2, 1000)
    torch.testing.assert_close(y, model(x), rtol=1e-5, atol=1e-6)
    assert all(w % 4 == 0 for w in double.windows)


def test_wrong_output_length_is_reported():
    with pytest.raises(ValueError, match="ratio"):
        Chunker().run(lambda t: t[..., ::2], torch.ones(10))


def test_several_inputs_cut_together_and_extra_arguments_passed():
    a = torch.arange(12.0)
    b = torch.arange(12.0) * 10
    seen = []

    def fn(x, y, scale, *, shift):
        seen.append(x.shape[0])
        return (x + y) * scale + shift

    out = Chunker(inputs=2, start=5).run(fn, a, b, 2.0, shift=1.0)
    assert torch.equal(out, (a + b) * 2 + 1)
    assert seen == [5, 5, 2]
    with pytest.raises(ValueError, match="same length"):
        Chunker(inputs=2).run(fn, a, b[:5], 1.0, shift=0.0)


@torch.no_grad()
def test_batch_dimension():
    torch.manual_seed(0)
    lin = nn.Linear(16, 4)
    x = torch.randn(64, 16)
    double = BudgetModel(lin, budget=10, dim=0)
    y = Chunker(double, dim=0)(x)
    torch.testing.assert_close(y, lin(x))
    assert double.windows[:4] == [64, 32, 16, 8]


def test_reports_round_trip():
    memo = ChunkMemo(2000, 4000)
    assert ChunkMemo.from_dict(memo.to_dict()) == memo
    run = ChunkRun("k", 10, 10, 5, 2, 3, 1, 0, 0)
    d = run.to_dict()
    assert d["schema"] == 1
    assert ChunkRun.from_dict(d) == run


@pytest.mark.parametrize("opts", [dict(overlap=-1), dict(min_chunk=0), dict(align=4, overlap=6),
                                  dict(ratio=Fraction(1, 3), align=2), dict(grow_after=0)])
def test_bad_options(opts):
    with pytest.raises(ValueError):
        Chunker(**opts)
