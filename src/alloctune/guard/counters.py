"""Process-wide counters of what the guard did, for dashboards and tests.

One shared, thread-safe `GuardStats` instance (`alloctune.guard.stats`) is updated by
`oom_retry`, `chunked` and `Janitor`. `snapshot()` returns a frozen copy that serialises to
JSON; `reset()` starts a new measurement window.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields
from typing import Any

from alloctune.guard.record import GuardRecord

__all__ = ["GuardStats", "GuardStatsSnapshot", "stats"]


@dataclass(frozen=True)
class GuardStatsSnapshot(GuardRecord):
    """Counters at one moment.

    `ooms` counts every OOM the guard caught; each ends as a `retry` (oom_retry), a `halving`
    (chunked) or a `give_up` (limit reached, original error re-raised). `cleanups` counts every
    `empty_cache()` the guard issued (after an OOM or by the Janitor), `janitor_cleanups` the
    Janitor's share; `bytes_released` is the summed drop in reserved bytes they caused.
    """

    ooms: int = 0
    retries: int = 0
    halvings: int = 0
    give_ups: int = 0
    cleanups: int = 0
    janitor_cleanups: int = 0
    bytes_released: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GuardStatsSnapshot":
        names = {f.name for f in fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in names})


class GuardStats:
    """Thread-safe counters (services call the guard from several worker threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = {f.name: 0 for f in fields(GuardStatsSnapshot)}

    def add(self, **increments: int) -> None:
        with self._lock:
            for name, inc in increments.items():
                if name not in self._values:
                    raise KeyError(f"unknown guard counter {name!r}")
                self._values[name] += int(inc)

    def snapshot(self) -> GuardStatsSnapshot:
        with self._lock:
            return GuardStatsSnapshot(**self._values)

    def reset(self) -> None:
        with self._lock:
            for name in self._values:
                self._values[name] = 0

    def __getattr__(self, name: str) -> int:
        values = self.__dict__.get("_values")
        if values is not None and name in values:
            return values[name]
        raise AttributeError(name)

    def to_dict(self) -> dict[str, Any]:
        return self.snapshot().to_dict()

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v}" for k, v in self.snapshot().to_dict().items() if k != "schema")
        return f"GuardStats({body})"


stats = GuardStats()
