"""The tune's simulator: predictions from the baseline's recorded trace through `alloctune.sim.sweep`.

Pure Python; the trace, fallible-request and sweep modules are imported on first use, so the
tune core imports cheaply.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any, Sequence

from alloctune.run.trial import TrialResult
from alloctune.sim.resolution import ABS_TOL as SIM_ABS_TOL
from alloctune.sim.resolution import REL_TOL as SIM_REL_TOL
from alloctune.units import format_size

if TYPE_CHECKING:
    from alloctune.sim.replay import SimResult
    from alloctune.sim.sweep import Sweep
    from alloctune.trace.model import Trace

# The simulated min_budget's resolution is the one every command uses (sim.resolution: 0.2 % or 1 MiB):
# tune's estimates, explain's remedies and `simulate --min-budget` print the same number for one
# recording. (At 1 % or 16 MiB the estimate could lie 3.5 % above a 450 MiB need, more than the
# confirm flow's opening pair spans: a timm ConvNeXt tuned on the H200 spent a fourth run widening.)


class SimulatorFromTrace:
    """`Simulator` over `alloctune.sim.sweep` for the baseline's recorded trace (pure Python).

    Fallible requests: a recording with stack frames tags cuDNN workspaces at once;
    `calibrate` learns what replaces them from a capped recorded trial.
    """

    def __init__(self, baseline: TrialResult, progress: Any = None):
        from alloctune.progress import no_progress
        from alloctune.trace import load_trace
        from alloctune.trace.fallible import model_from_frames, with_fallbacks

        self.progress = progress or no_progress
        self.progress("loading the baseline's recording")

        self.raw = load_trace(baseline.snapshot)
        self.model = model_from_frames(self.raw)
        self.trace = with_fallbacks(self.raw, self.model)
        self.total_memory = baseline.total_memory
        self.torch = _minor(baseline.torch_version)
        self.last: Sweep | None = None
        self._last_asked: tuple[Any, tuple[str, ...]] | None = None  # (trace, confs) that `last` answers

    @property
    def note(self) -> str | None:
        from alloctune.trace.fallible import untagged_note

        return untagged_note(self.trace)

    @property
    def can_learn(self) -> bool:
        """Whether a capped recording could teach anything: scratch requests no evidence covers yet
        (a transformer decoder has none, so its capped runs are not recorded)."""
        return self.note is not None

    def _sweep(self, trace: "Trace", confs: Sequence[str]) -> "Sweep":
        """`sim.sweep` of `trace` under `confs` at tune's resolution, on this card."""
        from alloctune.sim.sweep import sweep

        return sweep(
            trace,
            confs,
            torch=self.torch,
            total_memory=self.total_memory,
            progress=self.progress,
            rel_tol=SIM_REL_TOL,
            abs_tol=SIM_ABS_TOL,
        )

    def _replay(self, trace: "Trace", conf: str, budget: int) -> "SimResult":
        """One replay of `trace` under `conf` capped at `budget`, on this card (no events kept)."""
        from alloctune.config import AllocatorConfig
        from alloctune.sim.replay import replay

        return replay(
            trace,
            AllocatorConfig.parse(conf, self.torch),
            budget=budget,
            total_memory=self.total_memory,
            torch=self.torch,
            record_events=False,
            timeline_points=1,
        )

    def estimates(self, confs: Sequence[str]) -> dict[str, int | None]:
        self.last = self._sweep(self.trace, confs)
        self._last_asked = (self.trace, tuple(confs))
        return {c: row.min_budget for c, row in zip(confs, self.last.rows)}

    def floors(self, confs: Sequence[str]) -> dict[str, int | None]:
        """Each setting's simulated min_budget if the program gave up every workspace-shaped
        request nothing covers yet (`fallible.optimistic`): the low end of where its real
        min_budget can lie. Equal to `estimates` when the recording has no such request."""
        from alloctune.trace.fallible import optimistic

        low = optimistic(self.trace)
        if low is self.trace:  # nothing to give up: the estimates, without sweeping again when just asked
            asked = self._last_asked
            if self.last is not None and asked is not None and asked[0] is self.trace and asked[1] == tuple(confs):
                return {c: row.min_budget for c, row in zip(confs, self.last.rows)}
            return self.estimates(confs)
        rows = self._sweep(low, confs).rows
        return {c: row.min_budget for c, row in zip(confs, rows)}

    def min_budget(self, conf: str) -> int | None:
        return self.estimates([conf])[conf]

    @cached_property
    def gpu_span_s(self) -> float | None:
        """Seconds from the recording's first allocator event to its last: the part of the run
        that used the GPU (start-up and imports left out), the base a slowdown is measured on."""
        times = [e.get("time_us") for e in self.raw.events]
        times = [t for t in times if isinstance(t, (int, float))]
        return (max(times) - min(times)) / 1e6 if len(times) > 1 else None

    def activity(self, confs: Sequence[str], budget: int) -> dict[str, Any]:
        """Each setting's simulated allocator work at `budget` (`throughput.AllocatorActivity`):
        the only way a setting can change speed, counted instead of measured."""
        from alloctune.tune.throughput import AllocatorActivity

        out: dict[str, Any] = {}
        for conf in confs:
            res = self._replay(self.trace, conf, budget)
            st = res.stats
            out[conf] = AllocatorActivity(
                device_calls=int(st.get("num_device_alloc", 0)) + int(st.get("num_device_free", 0)),
                syncs=int(st.get("num_alloc_retries", 0)) + int(st.get("num_sync_all_streams", 0)),
                fallbacks=len(res.adapted),
                completed=res.completed,
                device_bytes=int(st.get("reserved_bytes.all.allocated", 0)) + int(st.get("reserved_bytes.all.freed", 0)),
            )
        return out

    def completes(self, conf: str, budget: int) -> bool:
        """Whether the recording, with every workspace-shaped request nothing covers given up (the
        most a program that adapts could do), replays to its end under `conf` capped at `budget`:
        when it does not, the program cannot complete there (short of a different request stream)."""
        from alloctune.trace.fallible import optimistic

        return bool(self._replay(optimistic(self.trace), conf, budget).completed)

    def calibrate(self, trial: TrialResult) -> str | None:
        """Learn fallbacks from a capped recorded trial; a sentence when it taught something."""
        if not trial.snapshot or trial.budget is None or not trial.num_ooms:
            return None
        from alloctune.trace import load_trace
        from alloctune.trace.fallible import combine, generalise, learn_from_calibration, with_fallbacks

        try:
            capped = load_trace(trial.snapshot)
            learned = learn_from_calibration(self.raw, capped, cap=trial.budget)
        except Exception:  # noqa: BLE001 - a calibration that cannot be read or aligned teaches nothing
            return None
        if not learned.ladders:
            return None
        self.model = combine(learned, self.model)
        # carried over to the other calls of the same call site (Python stacks): a cap presses only the
        # calls at the peak, and cuDNN chooses a convolution's algorithms the same way at every call
        general = generalise(self.model, self.raw)
        self.trace = with_fallbacks(self.raw, general)
        carried = len(general.general) if general.general else 0
        return (
            f"calibration: the run of {trial.conf or '(default)'} capped at {format_size(trial.budget)} showed "
            f"{len(learned.ladders)} request size(s) falling back to smaller ones"
            + (f" (carried over to {carried} more call(s) of the same call site)" if carried else "")
            + "; every candidate re-simulated with them"
        )


def _minor(version: str | None) -> str:
    """The `major.minor` whose allocator rules apply: 2.11 when the child did not say, the
    newest rules we know for a release newer than those."""
    from alloctune.config.versions import NEWEST, OLDEST, format_version, parse_torch_version
    from alloctune.errors import InputError

    try:
        return format_version(parse_torch_version(version or "2.11"))
    except InputError:
        return format_version(NEWEST if version and not version.startswith(("0", "1")) else OLDEST)
