"""The guard against the real CUDA caching allocator (skipped without a GPU).

Each test caps the process with `set_per_process_memory_fraction` and restores it after.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from alloctune.guard import Chunker, Janitor, is_oom, oom_retry, stats  # noqa: E402
from alloctune.units import MiB  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture
def budget():
    """Cap the caching allocator at `n` bytes above what is allocated now; undo afterwards."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory

    def cap(n: int) -> int:
        # Release what is cached first: a cap only limits new segments, so memory the test
        # already cached before capping would otherwise be reused past the cap (seen on the
        # H200: the 4M-sample conv then did not OOM under a 400 MiB cap).
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        limit = torch.cuda.memory_allocated() + n
        torch.cuda.set_per_process_memory_fraction(limit / total)
        return limit

    stats.reset()
    yield cap
    torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.empty_cache()
    stats.reset()


def test_a_real_cuda_oom_is_recognised(budget):
    budget(256 * MiB)
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
    assert is_oom(info.value)


def test_retry_frees_the_failed_attempts_memory_before_retrying(budget):
    budget(512 * MiB)
    base = torch.cuda.memory_allocated()
    base_reserved = torch.cuda.memory_reserved()
    seen = []
    calls = {"n": 0}

    def step():
        calls["n"] += 1
        a = torch.empty(300 * MiB, dtype=torch.uint8, device="cuda")  # noqa: F841 - held by the frame
        if calls["n"] == 1:
            torch.empty(300 * MiB, dtype=torch.uint8, device="cuda")  # 600 MiB > 512 MiB: OOM
        return calls["n"]

    def on_oom(exc, attempt):
        seen.append((torch.cuda.memory_allocated() - base, torch.cuda.memory_reserved()))

    assert oom_retry(retries=1, on_oom=on_oom)(step)() == 2
    # by the time the hook runs (just before the retry) the 300 MiB of the failed attempt are
    # freed and returned to the driver
    assert seen[0][0] == 0
    assert seen[0][1] - base_reserved < 300 * MiB
    assert stats.snapshot().retries == 1


@pytest.fixture
def no_tf32():
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = old


def test_chunked_completes_where_the_whole_input_ooms(budget, no_tf32):
    conv = torch.nn.Sequential(torch.nn.Conv1d(1, 64, 9, padding=4), torch.nn.Tanh(),
                               torch.nn.Conv1d(64, 1, 9, padding=4)).cuda().eval()
    x = torch.randn(1, 1, 4_000_000, device="cuda")
    with torch.inference_mode():
        ref = conv(x).cpu()  # 2 x 1 GiB of activations without a cap
        budget(400 * MiB)
        with pytest.raises(torch.OutOfMemoryError):
            conv(x)
        y, report = Chunker(overlap=16, min_chunk=10_000).run_with_report(conv, x)
    # 4M, 2M and 1M samples need 2, 1 and 0.5 GiB > 400 MiB; 500k samples (256 MiB) fit. After
    # four good pieces (grow_after) the chunker tries 1M once more, which fails again: one grow-back
    # and a fourth halving (seen on the H200).
    assert report.final_chunk == 500_000
    assert report.halvings == 3 + report.grow_backs and report.grow_backs == 1
    torch.testing.assert_close(y.cpu(), ref, rtol=1e-5, atol=1e-5)


def test_janitor_on_real_memory_stats():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    t = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
    del t  # 512 MiB now idle in the cache
    j = Janitor(max_cached="256MiB")
    step = j.step()
    assert step.cleaned and step.reason == "max_cached"
    assert step.released >= 512 * MiB
    assert j.step().cleaned is False
