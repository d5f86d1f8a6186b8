"""Runtime guard for inference services: survive OOMs instead of crashing on them.

* `oom_retry` — retry a step after an OOM, once the failed attempt's tensors and the cache
  are released (`@oom_retry`, `@oom_retry(retries=1)`, `for a in oom_retry.attempts(): with a:`).
* `chunked` — run a function over pieces of a long input; halve only a piece that OOMs,
  remember what worked per input shape, grow back after successes.
* `Janitor` — empty the CUDA cache between requests only when fragmentation makes it pay.
* `stats` — process-wide counters; every retry, halving and clean-up is also logged on the
  `alloctune.guard` logger.

Importing this package never imports torch (and works without it); torch is imported when a
guarded call needs it.
"""

from __future__ import annotations

from alloctune.guard.chunked import Chunker, ChunkMemo, ChunkRun, chunked
from alloctune.guard.counters import GuardStats, GuardStatsSnapshot, stats
from alloctune.guard.janitor import Janitor, JanitorStep, JanitorTotals
from alloctune.guard.oom import is_oom, oom_kind, strip_traceback
from alloctune.guard.release import release_cached
from alloctune.guard.retry import Attempt, oom_retry

__all__ = [
    "Attempt",
    "ChunkMemo",
    "ChunkRun",
    "Chunker",
    "GuardStats",
    "GuardStatsSnapshot",
    "Janitor",
    "JanitorStep",
    "JanitorTotals",
    "chunked",
    "is_oom",
    "oom_kind",
    "oom_retry",
    "release_cached",
    "stats",
    "strip_traceback",
]
