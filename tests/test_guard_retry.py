"""oom_retry: both decorator forms, the loop form, give-up, hooks, freeing the failed attempt."""

from __future__ import annotations

import gc
import logging
import weakref

import pytest
import torch

from alloctune.guard import oom_retry, stats


pytestmark = pytest.mark.usefixtures("fresh_guard_stats")


class FlakyStep:
    """Test double: fails with an OOM the first `failures` calls, then returns 2*x.

    Every call makes a tensor first, as a real step makes activations before the allocation
    that fails, and keeps only a weak reference to it, so a test can see when it is freed.
    """

    def __init__(self, failures: int, error=None):
        self.failures = failures
        self.error = error or (lambda n: torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n} bytes."))
        self.calls = 0
        self.refs: list[weakref.ref] = []
        self.alive_at_call: list[list[bool]] = []
        self.raised: list[BaseException] = []

    def __call__(self, x):
        self.alive_at_call.append([r() is not None for r in self.refs])
        self.calls += 1
        activation = torch.ones(4096) * x  # lives only in this frame
        self.refs.append(weakref.ref(activation))
        if self.calls <= self.failures:
            exc = self.error(4096 * 4)
            self.raised.append(exc)
            raise exc
        return 2 * x


def test_bare_decorator_retries_once_and_returns():
    step = FlakyStep(failures=1)
    guarded = oom_retry(step)
    assert guarded(21) == 42
    assert step.calls == 2
    snap = stats.snapshot()
    assert (snap.ooms, snap.retries, snap.give_ups) == (1, 1, 0)


def test_decorator_with_arguments_and_give_up_with_the_original_error():
    step = FlakyStep(failures=10)
    seen = []

    @oom_retry(retries=2, on_oom=lambda exc, attempt: seen.append((attempt, exc.__traceback__ is None)))
    def infer(x):
        return step(x)

    with pytest.raises(torch.OutOfMemoryError) as info:
        infer(1)
    assert step.calls == 3
    assert info.value is step.raised[-1]  # the original exception object, not a wrapper
    assert info.value.__traceback__ is not None  # and with its traceback
    # the hook sees every OOM; retried ones without traceback, the last one intact
    assert seen == [(1, True), (2, True), (3, False)]
    snap = stats.snapshot()
    assert (snap.ooms, snap.retries, snap.give_ups) == (3, 2, 1)


def test_decorator_keeps_name_and_doc():
    @oom_retry(retries=1)
    def encode(x):
        """Encode x."""
        return x

    assert encode.__name__ == "encode"
    assert encode.__doc__ == "Encode x."
    assert encode.__wrapped__(3) == 3


def test_failed_attempts_tensors_are_freed_before_the_retry():
    step = FlakyStep(failures=2)
    assert oom_retry(retries=2, cleanup=False)(step)(1) == 2
    # at call 2 the tensor of call 1 is gone; at call 3 those of calls 1 and 2 are gone
    assert step.alive_at_call == [[], [False], [False, False]]


def test_control_a_held_exception_keeps_the_failed_tensor_alive():
    """Shows the freeing above is the guard's doing: naive retry code keeps the tensor."""
    step = FlakyStep(failures=1)
    try:
        step(1)
    except torch.OutOfMemoryError as exc:
        held = exc
    step(1)
    assert step.alive_at_call == [[], [True]]
    del held


def test_cleanup_runs_between_attempts_and_collects_cycles():
    """Default clean-up runs gc.collect(): a failed step's tensor caught in a cycle is freed too."""
    refs = []
    calls = {"n": 0}

    def step():
        calls["n"] += 1
        if calls["n"] == 1:
            t = torch.ones(1000)
            box = {"t": t}
            box["self"] = box  # reference cycle: refcounting alone never frees it
            refs.append(weakref.ref(t))
            raise torch.OutOfMemoryError("CUDA out of memory.")
        return refs[0]() is None

    gc.disable()
    try:
        assert oom_retry(step)() is True
        calls["n"] = 0
        refs.clear()
        assert oom_retry(cleanup=False)(step)() is False  # without gc the cycle is still there
    finally:
        gc.enable()
        gc.collect()


def test_custom_cleanup_is_called_once_per_retry_and_its_bytes_logged(caplog):
    released = []

    def cleanup():
        released.append(1)
        return 3 * 1024**2

    step = FlakyStep(failures=2)
    with caplog.at_level(logging.WARNING, logger="alloctune.guard"):
        assert oom_retry(retries=5, cleanup=cleanup)(step)(5) == 10
    assert len(released) == 2
    msgs = [r.getMessage() for r in caplog.records if r.name == "alloctune.guard"]
    assert len(msgs) == 2
    assert "attempt 1/6: released 3.00 MiB, retrying" in msgs[0]
    assert "attempt 2/6" in msgs[1]


def test_other_errors_are_not_retried():
    step = FlakyStep(failures=1, error=lambda n: RuntimeError("CUDA error: an illegal memory access was encountered"))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        oom_retry(step)(1)
    assert step.calls == 1
    assert stats.snapshot().ooms == 0


def test_library_allocation_failures_are_retried():
    step = FlakyStep(failures=1, error=lambda n: RuntimeError(
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))
    assert oom_retry(step)(4) == 8
    assert step.calls == 2


def test_zero_retries_means_one_call():
    step = FlakyStep(failures=1)
    with pytest.raises(torch.OutOfMemoryError):
        oom_retry(retries=0)(step)(1)
    assert step.calls == 1


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_retries_rejected_at_decoration(bad):
    with pytest.raises(ValueError, match="retries"):
        oom_retry(retries=bad)


def test_attempts_loop_retries_and_stops_after_success():
    step = FlakyStep(failures=2)
    numbers = []
    for attempt in oom_retry.attempts(retries=3, cleanup=False):
        numbers.append(attempt.number)
        with attempt:
            out = step(7)
    assert out == 14
    assert numbers == [1, 2, 3]
    assert step.alive_at_call == [[], [False], [False, False]]
    assert stats.snapshot().retries == 2


def test_attempts_loop_gives_up_with_the_original_error():
    step = FlakyStep(failures=5)
    hooks = []
    with pytest.raises(torch.OutOfMemoryError) as info:
        for attempt in oom_retry.attempts(retries=1, on_oom=lambda e, n: hooks.append(n)):
            with attempt:
                step(1)
    assert step.calls == 2
    assert info.value is step.raised[1]
    assert hooks == [1, 2]
    assert stats.snapshot().give_ups == 1


def test_attempts_loop_lets_other_errors_through_at_once():
    step = FlakyStep(failures=1, error=lambda n: KeyError("nope"))
    with pytest.raises(KeyError):
        for attempt in oom_retry.attempts(retries=3):
            with attempt:
                step(1)
    assert step.calls == 1


def test_attempts_must_be_entered():
    with pytest.raises(RuntimeError, match="with attempt"):
        for _attempt in oom_retry.attempts(retries=2):
            pass
