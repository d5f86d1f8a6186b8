"""`oom_retry`: run a step again after an out-of-memory error, once the cache is released.

A caching-allocator OOM is often transient in a service: the failed step's own activations,
a previous request's cached blocks or a fragmented cache block the allocation, and the same
step succeeds once those are freed. The retry therefore (1) leaves the `except` block and
clears the traceback, whose frames hold every tensor of the failed attempt, (2) runs
`gc.collect()` and `torch.cuda.empty_cache()`, (3) calls the step again. After `retries`
retries the original error propagates unchanged, traceback included.

Two forms::

    @oom_retry                      # or @oom_retry(retries=1, on_oom=hook)
    def infer(batch): ...

    for attempt in oom_retry.attempts(retries=2):
        with attempt:
            out = model(x)

In the loop form, names bound inside the ``with`` block live in *your* frame and are not
freed by the cleanup; tensors created inside functions called there are. Put the work in
a function (or ``del`` partial results) when the block itself holds large tensors.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from alloctune.guard.counters import stats
from alloctune.guard.oom import is_oom, oom_kind, strip_traceback
from alloctune.guard.release import release_cached
from alloctune.units import format_size

__all__ = ["oom_retry", "Attempt", "OnOOM"]

log = logging.getLogger("alloctune.guard")

F = TypeVar("F", bound=Callable[..., Any])
OnOOM = Callable[[BaseException, int], Any]
Cleanup = Callable[[], int]


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


@dataclass(frozen=True)
class _Policy:
    retries: int
    on_oom: OnOOM | None
    cleanup: Cleanup | None
    name: str

    @staticmethod
    def make(retries: int, on_oom: OnOOM | None, cleanup: bool | Cleanup, name: str) -> "_Policy":
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        if cleanup is True:
            fn: Cleanup | None = release_cached
        elif cleanup is False or cleanup is None:
            fn = None
        elif callable(cleanup):
            fn = cleanup
        else:
            raise TypeError(f"cleanup must be a bool or a callable returning bytes released, got {cleanup!r}")
        return _Policy(retries, on_oom, fn, name)

    @property
    def total(self) -> int:
        return self.retries + 1

    def recover(self, exc: BaseException, attempt: int) -> None:
        """Called outside any `except` block with a traceback-free `exc`: clean up, log, hook."""
        released = int(self.cleanup() or 0) if self.cleanup is not None else 0
        stats.add(ooms=1, retries=1)
        log.warning(
            "OOM (%s) in %s, attempt %d/%d: released %s, retrying: %s",
            oom_kind(exc),
            self.name,
            attempt,
            self.total,
            format_size(released),
            _first_line(exc),
        )
        if self.on_oom is not None:
            self.on_oom(exc, attempt)

    def give_up(self, exc: BaseException, attempt: int) -> None:
        stats.add(ooms=1, give_ups=1)
        log.error("OOM (%s) in %s, attempt %d/%d: giving up: %s", oom_kind(exc), self.name, attempt, self.total, _first_line(exc))
        if self.on_oom is not None:
            self.on_oom(exc, attempt)


def _wrap(fn: F, policy: _Policy) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        attempt = 1
        while True:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if not is_oom(exc):
                    raise
                if attempt > policy.retries:
                    policy.give_up(exc, attempt)
                    raise
                strip_traceback(exc)
                failed = exc
            # Out of the except block: the failed attempt's frames are gone.
            policy.recover(failed, attempt)
            del failed
            attempt += 1

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


class Attempt:
    """One try of a block; use as a context manager inside `oom_retry.attempts(...)`."""

    def __init__(self, number: int, last: bool, policy: _Policy) -> None:
        self.number = number
        self.last = last
        self._policy = policy
        self.state = "pending"  # -> "ok" | "oom" | "error"
        self.error: BaseException | None = None

    def __enter__(self) -> "Attempt":
        if self.state != "pending":
            raise RuntimeError("an Attempt can be entered only once")
        self.state = "running"
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: Any) -> bool:
        if exc is None:
            self.state = "ok"
            return False
        if isinstance(exc, Exception) and is_oom(exc):
            if self.last:
                self.state = "error"
                self._policy.give_up(exc, self.number)
                return False
            strip_traceback(exc)
            self.state = "oom"
            self.error = exc
            return True  # swallowed; the iterator cleans up and hands out the next attempt
        self.state = "error"
        return False

    def __repr__(self) -> str:
        return f"Attempt({self.number}, state={self.state!r})"


def attempts(
    retries: int = 2,
    *,
    on_oom: OnOOM | None = None,
    cleanup: bool | Cleanup = True,
    name: str = "block",
) -> Iterator[Attempt]:
    """Yield up to `retries + 1` attempts; stop after the first one whose block succeeds.

    The last attempt lets its OOM propagate. Clean-up runs between attempts, in the
    iterator, i.e. after the failed ``with`` block has been left.
    """
    policy = _Policy.make(retries, on_oom, cleanup, name)
    for number in range(1, policy.total + 1):
        attempt = Attempt(number, number == policy.total, policy)
        yield attempt
        if attempt.state == "ok":
            return
        if attempt.state in ("pending", "running"):
            raise RuntimeError("each attempt from oom_retry.attempts() must be used as `with attempt:`")
        failed, attempt.error = attempt.error, None
        assert failed is not None
        policy.recover(failed, number)
        del failed


@overload
def oom_retry(fn: F, /) -> F: ...
@overload
def oom_retry(
    *, retries: int = 2, on_oom: OnOOM | None = None, cleanup: bool | Cleanup = True, name: str | None = None
) -> Callable[[F], F]: ...


def oom_retry(
    fn: F | None = None,
    /,
    *,
    retries: int = 2,
    on_oom: OnOOM | None = None,
    cleanup: bool | Cleanup = True,
    name: str | None = None,
) -> Any:
    """Retry `fn` after a GPU out-of-memory error (see the module docstring).

    retries: how many times to call again after the first OOM (total calls = retries + 1).
    on_oom: `hook(exc, attempt)` called on every OOM, after clean-up (on the last one just before
        the error propagates); `exc` has no traceback except on the last attempt.
    cleanup: True = `gc.collect()` + `torch.cuda.empty_cache()`; False = none; or your own
        callable returning the bytes it released.
    """
    if fn is not None:
        if not callable(fn):
            raise TypeError("oom_retry takes a function, or keyword arguments only: @oom_retry(retries=1)")
        return _wrap(fn, _Policy.make(retries, on_oom, cleanup, name or _name(fn)))

    _Policy.make(retries, on_oom, cleanup, "")  # reject bad arguments where they are written

    def decorate(f: F) -> F:
        return _wrap(f, _Policy.make(retries, on_oom, cleanup, name or _name(f)))

    return decorate


oom_retry.attempts = attempts  # type: ignore[attr-defined]
