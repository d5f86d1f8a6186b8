"""Check a size-parametric trace on a recording it did not see.

The recordings minus one build a trace set; the stream it generates at the held-back size
is replayed under the setting that recording ran with and set against the recording: its
real peak reserved (the sidecar's `memory_stats`, when present) and the simulator's replay
of its own stream. A fit that only reproduces the points it was fitted to proves nothing;
this is the test that can fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from alloctune.errors import InputError
from alloctune.plan.traceset import as_size, build, size_text
from alloctune.sim.replay import replay
from alloctune.sim.settings import SimSettings
from alloctune.trace.model import Trace

SCHEMA = "alloctune.plan_holdout/1"


@dataclass(frozen=True)
class Holdout:
    size: str
    fitted_on: tuple[str, ...]
    same_structure: bool  # the generated stream has the recording's exact request structure
    sizes_exact: float | None  # fraction of alloc sizes generated exactly (same structure only)
    peak_generated: int  # simulated peak reserved of the generated stream
    peak_replayed: int  # simulated peak reserved of the recording's own stream
    peak_real: int | None  # the recording's peak reserved on the GPU
    extrapolated: bool

    @property
    def error_vs_real(self) -> float | None:
        return None if not self.peak_real else self.peak_generated / self.peak_real - 1

    @property
    def error_vs_replay(self) -> float:
        return self.peak_generated / self.peak_replayed - 1 if self.peak_replayed else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            **self.__dict__,
            "fitted_on": list(self.fitted_on),
            "error_vs_real": self.error_vs_real,
            "error_vs_replay": self.error_vs_replay,
        }


def holdout(recordings: Sequence[tuple[Any, Trace]], held: Any, torch: str | None = None) -> Holdout:
    """Fit on every recording but the one at size `held`, and check the stream generated there."""
    recs = [(as_size(x), t) for x, t in recordings]
    h = as_size(held)
    target = [t for x, t in recs if x == h]
    if not target:
        raise InputError(f"no recording at size {held} to hold back (have {[size_text(x) for x, _ in recs]})")
    rest = sorted(((x, t) for x, t in recs if x != h), key=lambda r: r[0])
    ts = build(rest)
    gen = ts.generate(h)
    rec = target[0]
    settings = SimSettings.from_allocator_settings(rec.allocator_settings, torch)
    a = replay(gen.trace, settings, addresses="model", record_events=False, timeline_points=1)
    b = replay(rec, settings, addresses="model", record_events=False, timeline_points=1)
    gr, rr = gen.trace.requests, rec.requests
    same = gr.ops == rr.ops and gr.streams == rr.streams
    exact = None
    if same:
        idx = [i for i, op in enumerate(rr.ops) if op in (0, 3)]
        exact = sum(1 for i in idx if gr.sizes[i] == rr.sizes[i]) / len(idx) if idx else 1.0
    stats = rec.meta.get("stats") if isinstance(rec.meta, dict) else None
    real = stats.get("reserved_bytes.all.peak") if isinstance(stats, dict) else None
    return Holdout(
        size_text(h),
        tuple(size_text(x) for x, _ in rest),
        same,
        exact,
        a.peak_reserved,
        b.peak_reserved,
        int(real) if isinstance(real, int) else None,
        gen.extrapolated,
    )
