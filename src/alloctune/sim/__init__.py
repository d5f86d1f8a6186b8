"""The exact caching-allocator simulator (pure Python, no torch).

`replay(trace, config, budget=...)` replays a recorded request stream under any allocator
setting and returns a `SimResult`; `compare(result, recorded)` says whether it reproduces a
recording event for event; `min_budget(trace, config)` finds the smallest cap under which
the trace completes.
"""

from __future__ import annotations

from alloctune.sim.allocator import CachingAllocator, OOMInfo
from alloctune.sim.budget import min_budget
from alloctune.sim.compare import Fidelity, compare
from alloctune.sim.oom import oom_message
from alloctune.sim.replay import SimResult, cap_from_budget, replay
from alloctune.sim.settings import SimSettings

__all__ = [
    "CachingAllocator",
    "Fidelity",
    "OOMInfo",
    "SimResult",
    "SimSettings",
    "cap_from_budget",
    "compare",
    "min_budget",
    "oom_message",
    "replay",
]
