"""`Janitor`: decide between requests whether emptying the CUDA cache is worth it.

Calling `torch.cuda.empty_cache()` after every request (as RVC and many web UIs do) keeps
reserved memory low but makes every request `cudaMalloc` its blocks again (slow, and it
synchronises the device). Never calling it lets a long-running service's cache fill with
blocks of sizes that no longer fit the current requests: reserved memory grows far above
what is allocated, and the next large request OOMs. The Janitor empties the cache only when
the cache is in a state where it pays.

Between requests almost everything reserved is idle (the request's tensors are gone), so
"idle cache above X" fires after nearly every request and says nothing. What matters is
whether the cache holds more than the requests need.

* ``before(size)`` / ``request(size)``, when the service knows each request's size: empty the
  cache only before a request larger than any since the last clean-up (blocks cached for the
  largest request serve the smaller ones). On the H200 (200 RVC decoder requests, random
  lengths) this made 6 clean-ups instead of 200, with a lower peak than cleaning every time.
* ``headroom`` (default 1.1): the Janitor remembers the largest reserved memory at the end
  of a request that *began* from an emptied cache -- what the biggest request seen so far
  needs from scratch, its own fragmentation included (``need``). When reserved memory after
  a request exceeds ``headroom`` x ``need``, the cache has grown with blocks no request
  needs: empty it. Until a clean start has been seen (a Janitor made after a warm-up) it
  empties the cache once to measure one (reason ``calibrate``).

Fixed triggers, for services that know their numbers:

* ``max_cached``: reserved − allocated (bytes held by the cache but not by tensors) above a
  byte threshold;
* ``max_cached_ratio``: that same idle cache above a fraction of the peak allocated bytes
  (``allocated_bytes.all.peak``);
* ``max_reserved_ratio``: reserved above a multiple of the peak allocated bytes;
* ``max_inactive_ratio``: ``inactive_split_bytes`` / reserved above a ratio: free pieces of
  partly used segments, the fragmentation that makes large allocations fail;
* ``every_n`` requests or ``every_s`` seconds since the last clean-up, as a backstop.

Statistics come from an injectable function returning `torch.cuda.memory_stats()`-style
keys, so the policy is tested without a GPU (and against the allocator simulator). Bytes
released are measured as the drop in ``reserved_bytes.all.current`` across the clean-up.

    janitor = Janitor()                    # or Janitor(headroom=1.25, every_n=500)
    for request in queue:
        with janitor.request(len(request.audio)):   # or `with janitor:` without sizes
            handle(request)
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from alloctune.guard.counters import stats as guard_stats
from alloctune.guard.record import GuardRecord
from alloctune.units import format_size, parse_size

__all__ = ["Janitor", "JanitorStep", "JanitorTotals"]

log = logging.getLogger("alloctune.guard")
DEFAULT_HEADROOM = 1.1
ADVISE_RATIO = 1.25  # clean-start reserved / peak allocated above which the Janitor suggests expandable segments

RESERVED = "reserved_bytes.all.current"
ALLOCATED = "allocated_bytes.all.current"
ALLOCATED_PEAK = "allocated_bytes.all.peak"
INACTIVE_SPLIT = "inactive_split_bytes.all.current"

StatsFn = Callable[[], Mapping[str, Any]]


@dataclass(frozen=True)
class JanitorStep(GuardRecord):
    """One decision: whether the cache was emptied, why, and the memory before/after (bytes)."""

    request: int
    cleaned: bool
    reason: str | None
    reserved_before: int
    allocated: int
    inactive_split: int
    reserved_after: int
    released: int


@dataclass(frozen=True)
class JanitorTotals(GuardRecord):
    """Counters of one Janitor since it was made.

    `need`: the learned clean-start footprint (bytes); `clean_start_ratio`: that footprint ÷ peak
    allocated -- the fragmentation inside a request, which no clean-up between requests removes.
    """

    requests: int
    cleanups: int
    bytes_released: int
    reasons: dict[str, int]
    need: int | None = None
    clean_start_ratio: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JanitorTotals":
        need, ratio = data.get("need"), data.get("clean_start_ratio")
        return cls(
            int(data["requests"]),
            int(data["cleanups"]),
            int(data["bytes_released"]),
            dict(data["reasons"]),
            None if need is None else int(need),
            None if ratio is None else float(ratio),
        )


def _default_stats() -> Mapping[str, Any]:
    try:
        import torch
    except ImportError:  # nothing to clean without torch
        return {}

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    return torch.cuda.memory_stats()


def _default_empty_cache() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _expandable_segments_on() -> bool:
    """Whether this process asked for expandable segments (either variable name, any case)."""
    for var in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        text = os.environ.get(var, "").replace(" ", "").lower()
        if "expandable_segments:true" in text:
            return True
    return False


def _releasable(s: Mapping[str, Any]) -> int:
    """Bytes `empty_cache()` could return: idle bytes minus the free pieces of segments that still
    hold a tensor (``inactive_split_bytes``), which stay. 0 right after an `empty_cache()`."""
    reserved, allocated = int(s.get(RESERVED, 0)), int(s.get(ALLOCATED, 0))
    return reserved - allocated - int(s.get(INACTIVE_SPLIT, 0))


def _ratio(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if not 0 <= float(value):
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return float(value)


class Janitor:
    """Clean-up policy for long-running services; call `step()` (or use `with`) between requests.

    With no trigger given it uses ``headroom=1.1`` (see the module docstring).
    """

    def __init__(
        self,
        *,
        headroom: float | None = None,
        max_cached: int | str | None = None,
        max_cached_ratio: float | None = None,
        max_reserved_ratio: float | None = None,
        max_inactive_ratio: float | None = None,
        every_n: int | None = None,
        every_s: float | None = None,
        min_release: int | str = 0,
        collect: bool = False,
        stats_fn: StatsFn | None = None,
        empty_cache: Callable[[], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if all(
            v is None for v in (headroom, max_cached, max_cached_ratio, max_reserved_ratio, max_inactive_ratio, every_n, every_s)
        ):
            headroom = DEFAULT_HEADROOM
        if headroom is not None and not float(headroom) >= 1.0:
            raise ValueError(f"headroom must be >= 1 (a multiple of the learned need), got {headroom!r}")
        self.headroom = None if headroom is None else float(headroom)
        self.max_cached = None if max_cached is None else parse_size(max_cached)
        self.max_cached_ratio = _ratio("max_cached_ratio", max_cached_ratio)
        self.max_reserved_ratio = _ratio("max_reserved_ratio", max_reserved_ratio)
        self.max_inactive_ratio = _ratio("max_inactive_ratio", max_inactive_ratio)
        if every_n is not None and (isinstance(every_n, bool) or not isinstance(every_n, int) or every_n < 1):
            raise ValueError(f"every_n must be an int >= 1, got {every_n!r}")
        if every_s is not None and not every_s > 0:
            raise ValueError(f"every_s must be > 0, got {every_s!r}")
        self.every_n = every_n
        self.every_s = every_s
        self.min_release = parse_size(min_release)
        self.collect = collect
        self._stats_fn = stats_fn or _default_stats
        self._empty_cache = empty_cache or _default_empty_cache
        self._clock = clock
        self._lock = threading.Lock()
        self._requests = 0
        self._since_clean = 0
        self._last_clean = clock()
        self._cleanups = 0
        self._released = 0
        self._reasons: dict[str, int] = {}
        self.last_step: JanitorStep | None = None
        # Learned need: the largest reserved at the end of a request that began from a clean cache.
        # A Janitor made before CUDA is initialised (or with nothing idle) sees a clean start.
        self._need: int | None = None
        self._clean_start_ratio: float | None = None
        self._advised = False
        self._clean_start = _releasable(self._stats_fn()) <= 0
        self._largest_served: float | None = None  # largest `before(size)` since the last clean-up

    # -- policy ---------------------------------------------------------------------------------

    def reason(self, s: Mapping[str, Any], since: int | None = None, elapsed: float | None = None) -> str | None:
        """Which trigger fires for memory stats `s` (None: leave the cache alone)."""
        reserved = int(s.get(RESERVED, 0))
        allocated = int(s.get(ALLOCATED, 0))
        cached = max(0, reserved - allocated)
        if reserved <= 0:
            return None  # nothing to release
        if self.headroom is not None:
            if self._need is None:
                return "calibrate"
            if reserved > self.headroom * self._need:
                return "headroom"
        if self.max_cached is not None and cached > self.max_cached:
            return "max_cached"
        peak = int(s.get(ALLOCATED_PEAK, allocated))
        if self.max_cached_ratio is not None and peak > 0 and cached > self.max_cached_ratio * peak:
            return "max_cached_ratio"
        if self.max_reserved_ratio is not None and peak > 0 and reserved > self.max_reserved_ratio * peak:
            return "max_reserved_ratio"
        if self.max_inactive_ratio is not None and int(s.get(INACTIVE_SPLIT, 0)) > self.max_inactive_ratio * reserved:
            return "max_inactive_ratio"
        since = self._since_clean if since is None else since
        if self.every_n is not None and since >= self.every_n:
            return "every_n"
        elapsed = (self._clock() - self._last_clean) if elapsed is None else elapsed
        if self.every_s is not None and elapsed >= self.every_s:
            return "every_s"
        return None

    def step(self) -> JanitorStep:
        """Count one finished request and empty the cache if a trigger fires."""
        with self._lock:
            self._requests += 1
            self._since_clean += 1
            s = self._stats_fn()
            reserved = int(s.get(RESERVED, 0))
            allocated = int(s.get(ALLOCATED, 0))
            inactive = int(s.get(INACTIVE_SPLIT, 0))
            if self._clean_start and reserved > (self._need or 0):
                # reserved only grows inside a request (short of an OOM retry), so this is its peak
                self._need = reserved
                self._learned_need(s)
            why = self.reason(s)
            if why is not None and reserved - allocated < self.min_release and why not in ("every_n", "every_s"):
                why = None  # not enough idle memory to be worth a device sync
            after, released = reserved, 0
            if why is not None:
                after, released = self._clean_locked(why, reserved, f"after request {self._requests}")
            else:
                self._clean_start = False
            step = JanitorStep(self._requests, why is not None, why, reserved, allocated, inactive, after, released)
            self.last_step = step
            return step

    def _learned_need(self, s: Mapping[str, Any]) -> None:
        """A new need: how much of it is fragmentation inside the request? Say once if it is a lot."""
        peak = int(s.get(ALLOCATED_PEAK, 0))
        if peak <= 0 or self._need is None:
            return
        ratio = self._need / peak  # peak is the run's: the request's own ratio is at least this
        self._clean_start_ratio = ratio
        if ratio > ADVISE_RATIO and not self._advised and not _expandable_segments_on():
            self._advised = True
            log.warning(
                "janitor: even from an emptied cache a request reserves %.2f x its peak allocated memory (%s for %s); "
                "that is fragmentation inside the request, which no clean-up between requests removes. "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True usually does; measure it with `alloctune tune`.",
                ratio,
                format_size(self._need),
                format_size(peak),
            )

    def before(self, size: float) -> JanitorStep | None:
        """Call before a request of `size` (frames, tokens x batch: any number that grows with the
        request's memory). Empties the cache when the request is larger than every request served
        since the last clean-up and the cache holds idle blocks.

        Why: blocks cached for a large request serve smaller ones (they are split), but a larger
        request would grow the cache on top of a layout it cannot use. Emptying first lets it build
        the layout once, for the new largest size; with requests in random order that happens about
        ln(n) times in n requests, and peak reserved stays at what the largest request needs alone.
        Returns the step when it cleaned, else None.
        """
        with self._lock:
            largest = self._largest_served
            if largest is not None and size <= largest:
                return None
            self._largest_served = size
            s = self._stats_fn()
            reserved = int(s.get(RESERVED, 0))
            allocated = int(s.get(ALLOCATED, 0))
            idle = _releasable(s)
            if idle <= 0 or idle < self.min_release:
                return None
            why = "larger_request"
            after, released = self._clean_locked(why, reserved, f"before request {self._requests + 1} (size {size:g})")
            self._largest_served = size  # the clean-up reset it; this request sets the new layout
            inactive = int(s.get(INACTIVE_SPLIT, 0))
            step = JanitorStep(self._requests + 1, True, why, reserved, allocated, inactive, after, released)
            self.last_step = step
            return step

    @contextlib.contextmanager
    def request(self, size: float | None = None) -> Iterator["Janitor"]:
        """`with janitor.request(size):` -- `before(size)` (when a size is given), then `step()`,
        after a failed request too."""
        if size is not None:
            self.before(size)
        try:
            yield self
        finally:
            self.step()

    def _clean_locked(self, why: str, reserved: int, when: str) -> tuple[int, int]:
        """Empty the cache and count it (lock held); returns (reserved after, bytes released)."""
        if self.collect:
            gc.collect()
        self._empty_cache()
        after = int(self._stats_fn().get(RESERVED, 0))
        released = max(0, reserved - after)
        self._cleanups += 1
        self._released += released
        self._reasons[why] = self._reasons.get(why, 0) + 1
        self._since_clean = 0
        self._last_clean = self._clock()
        self._clean_start = True
        self._largest_served = None
        guard_stats.add(cleanups=1, janitor_cleanups=1, bytes_released=released)
        log.info(
            "janitor: empty_cache %s (%s): reserved %s -> %s, released %s",
            when,
            why,
            format_size(reserved),
            format_size(after),
            format_size(released),
        )
        return after, released

    # -- conveniences ---------------------------------------------------------------------------

    @property
    def totals(self) -> JanitorTotals:
        with self._lock:
            return JanitorTotals(
                self._requests, self._cleanups, self._released, dict(self._reasons), self._need, self._clean_start_ratio
            )

    @property
    def need(self) -> int | None:
        """Learned clean-start footprint in bytes (None until a request began from a clean cache)."""
        return self._need

    @property
    def cleanups(self) -> int:
        return self._cleanups

    @property
    def bytes_released(self) -> int:
        return self._released

    @property
    def requests(self) -> int:
        return self._requests

    def __enter__(self) -> "Janitor":
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: Any) -> bool:
        self.step()  # after a failed request too: its tensors are gone and may have left holes
        return False

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Use as a decorator on a request handler: `step()` after every call."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper

    def __repr__(self) -> str:
        t = self.totals
        need = "unknown" if t.need is None else format_size(t.need)
        return f"Janitor(requests={t.requests}, cleanups={t.cleanups}, released={format_size(t.bytes_released)}, need={need})"
