"""The Python API: the same core functions the `alloctune` commands call, in one place.

    from alloctune import api

    sim = api.simulate("run.pickle.xz", ["", "expandable_segments:True"], budget="6GiB")
    sim.failed, [r.peak_reserved for r in sim.rows], sim.to_dict()
    d = api.diagnose(log_text_or_exception)          # the last OOM's Diagnosis
    check = api.check_setting("expandable_segments:True", "2.11", platform="windows")

Why a module and not functions on `alloctune` itself: `alloctune.tune`, `alloctune.diagnose`,
`alloctune.plan` (and `alloctune.run`) are modules, and importing any of their submodules
rebinds that name on the package, so `alloctune.tune(...)` could mean a function or a module
depending on what happened to be imported first. Here every name is a function.
`tune`, `record` and `plan` are provided by their own packages and imported by name on the
first call; if one is missing from this build, calling it raises `ApiUnavailable` saying which.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any, Callable

from alloctune.config.effective import check_setting
from alloctune.errors import AlloctuneError
from alloctune.sim.simulate import simulate
from alloctune.trace.service import convert_trace, trace_info

if TYPE_CHECKING:  # the result types, named without importing their packages at run time
    from alloctune.diagnose.diagnosis import Diagnosis
    from alloctune.diagnose.snapshot_model import SnapshotDiagnosis
    from alloctune.explain.model import Comparison, Explanation, RankImbalance
    from alloctune.plan.result import PlanResult
    from alloctune.run.record import Recording
    from alloctune.tune.session import TuneOutcome

__all__ = [
    "ApiUnavailable",
    "check_setting",
    "convert_trace",
    "diagnose",
    "diagnose_all",
    "diagnose_snapshot",
    "explain",
    "installed_versions",
    "plan",
    "record",
    "simulate",
    "trace_info",
    "tune",
]

# name -> (module, function) of the entry points other packages provide
PROVIDERS: dict[str, tuple[str, str]] = {
    "tune": ("alloctune.tune", "tune"),
    "record": ("alloctune.run.record", "record"),
    "plan": ("alloctune.plan", "plan"),
}


class ApiUnavailable(AlloctuneError):
    """An API entry point whose implementation is not part of this build."""

    exit_code = 2


def _provided(name: str) -> Callable[..., Any]:
    module, attr = PROVIDERS[name]
    if importlib.util.find_spec(module) is None:
        raise ApiUnavailable(f"alloctune.api.{name} is not available: module {module} is not in this build")
    func = getattr(importlib.import_module(module), attr, None)  # real import errors propagate as they are
    if not callable(func):
        raise ApiUnavailable(f"alloctune.api.{name} is not available: {module} has no function {attr}()")
    entry: Callable[..., Any] = func
    return entry


def diagnose(text_or_exception: object, platform: str | None = None) -> Diagnosis:
    """The `Diagnosis` of the last OOM message in a text, a log, or a caught exception."""
    from alloctune.diagnose import diagnose as _diagnose

    return _diagnose(text_or_exception, platform)


def diagnose_all(text_or_exception: object, platform: str | None = None) -> list[Diagnosis]:
    """One `Diagnosis` per distinct OOM message, in order."""
    from alloctune.diagnose import diagnose_all as _diagnose_all

    return _diagnose_all(text_or_exception, platform)


def diagnose_snapshot(
    snapshot: Any, *, budget: int | str | None = None, device: int = 0, oom: int = -1, what_if: bool = True
) -> SnapshotDiagnosis:
    """The `SnapshotDiagnosis` of the OOM recorded in a snapshot file (`alloctune diagnose --snapshot`)."""
    from alloctune.diagnose.service import explain_snapshot

    return explain_snapshot(snapshot, budget=budget, device=device, oom=oom, what_if=what_if)


def tune(*args: Any, **kwargs: Any) -> TuneOutcome:
    """Sweep allocator settings for a workload (`alloctune tune`); see `alloctune.tune.tune`."""
    out: TuneOutcome = _provided("tune")(*args, **kwargs)
    return out


def record(*args: Any, **kwargs: Any) -> Recording:
    """Record a workload's allocator history (`alloctune record`); see `alloctune.run.record.record`."""
    out: Recording = _provided("record")(*args, **kwargs)
    return out


def plan(*args: Any, **kwargs: Any) -> PlanResult:
    """Answer sizing questions from recordings at several input sizes; see `alloctune.plan.plan`."""
    out: PlanResult = _provided("plan")(*args, **kwargs)
    return out


def installed_versions() -> dict[str, Any]:
    """`{"schema", "alloctune", "python", "platform", "torch"}` for bug reports and `version --json`.

    torch's version is read from the package metadata, never by importing torch (the core must not
    import it, and importing it takes seconds); `torch` is None when it is not installed.
    """
    import platform
    from importlib import metadata

    from alloctune import __version__
    from alloctune.schema import schema_id

    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = None
    return {
        "schema": schema_id("version"),
        "alloctune": __version__,
        "python": platform.python_version(),
        "platform": platform.system().lower(),
        "torch": torch,
    }


def explain(recording: Any, *, against: Any = None, **kwargs: Any) -> Explanation | Comparison | RankImbalance:
    """Where the memory goes at the peak / OOM / `at` of a recording (`alloctune explain`): an
    `Explanation` (`.to_dict()`: schema `alloctune.explain/2`); with `against`, a `Comparison`
    splitting the gap in peak reserved exactly by category and site; a list of recordings (the ranks
    of one job, `NAME.rankN.pickle`): a `RankImbalance`. See `alloctune.explain.api`."""
    from alloctune.explain import api as _explain_api

    if isinstance(recording, (list, tuple)):  # the ranks of one job
        if len(recording) == 1:
            recording = recording[0]
        else:
            keep = {k: v for k, v in kwargs.items() if k in ("group", "top", "device")}
            return _explain_api.explain_ranks(recording, **keep)
    if against is not None:
        keep = {k: v for k, v in kwargs.items() if k in ("group", "top", "device")}
        return _explain_api.explain_against(recording, against, **keep)
    return _explain_api.explain(recording, **kwargs)
