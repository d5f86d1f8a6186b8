"""The remedies beside the settings: what `tune` offers besides an allocator string.

* From the baseline's recording, simulated under the best setting (or, when none fits, the closest):
  every remedy the registry answers (`remedy.registry`: release points, the Janitor's policies -- the
  best one named with the `guard.Janitor(...)` arguments that reproduce it -- the workspace caps that
  apply, the training remedies). No run.
* The measured ones from their confirming runs (`remedy.measured`: autograd off, the cuDNN switch,
  checkpointing), which take the place of their simulated or unconfirmed rows.
* One utilization table: each setting (min budget measured where the GPU proved it, else simulated;
  peaks of the uncapped replay, so rows compare) and each remedy, with what holds the best row below
  0.97 when no row reaches it.

The remedies never decide the setting: they are reported beside it (and, where nothing fits, they are
what can help, so the shortfall's next steps name the ones that would fit).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from alloctune.explain.utilization import UtilizationRow, UtilizationTable, remedy_rows, table
from alloctune.remedy.model import MEASURED, UNCONFIRMED, Remedy, activity, min_budget
from alloctune.run.trial import TrialResult
from alloctune.units import format_size

if TYPE_CHECKING:
    from alloctune.tune.objective import CandidateSummary


@dataclass(frozen=True)
class RemedyReport:
    remedies: tuple[Remedy, ...]
    utilization: UtilizationTable | None
    best_release: Remedy | None  # the release policy to use, if one saves memory
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "remedies": [r.to_dict() for r in self.remedies],
            "utilization": self.utilization.to_dict() if self.utilization is not None else None,
            "best_release": self.best_release.name if self.best_release is not None else None,
        }


def _trace(sim: Any, baseline: TrialResult) -> Any:
    """The baseline's recording as the simulator holds it now (with the fallbacks it learned from
    frames or capped runs: the min budgets are those the settings were judged by), else loaded."""
    held = getattr(sim, "trace", None) or getattr(sim, "raw", None)
    if held is not None:
        return held
    if not baseline.snapshot or not Path(baseline.snapshot).is_file():
        return None
    from alloctune.trace import load_trace

    return load_trace(baseline.snapshot)


def setting_rows(trace: Any, summaries: Sequence["CandidateSummary"]) -> list[UtilizationRow]:
    """One row per candidate that has a min budget (measured or simulated): peaks of the uncapped replay."""
    rows = []
    for sm in summaries:
        mb = sm.min_budget if sm.min_budget is not None else sm.sim_min_budget
        if mb is None and sm.feasible is None:
            continue
        conf = sm.candidate.conf
        try:
            peak, alloc, _, _ = activity(trace, conf, trace)
        except Exception:  # noqa: BLE001 - a setting the simulator does not model: the row without peaks
            peak = alloc = None
        rows.append(
            UtilizationRow(
                "setting", sm.candidate.label, conf, mb, peak, alloc, "measured" if sm.min_budget is not None else "simulated"
            )
        )
    return rows


@dataclass(frozen=True)
class Simulated:
    """The remedies one recording answers under one setting (what `tune_remedies` starts from)."""

    conf: str
    trace: Any  # the recording (None: none to simulate)
    remedies: tuple[Remedy, ...]
    notes: tuple[str, ...]


def simulate(sim: Any, baseline: TrialResult, conf: str, command: str) -> Simulated:
    """The simulated remedies under `conf`. A remedy's saving is against the same simulation of the
    recording as it ran under `conf` (like with like: a measured min budget carries the simulator's
    error). CPU only, safe in a thread beside the GPU runs (it reads the recording, writes nothing shared)."""
    from alloctune.analysis.core import analyse
    from alloctune.remedy.registry import simulated_remedies

    trace = None
    try:
        trace = _trace(sim, baseline)
        if trace is None:
            return Simulated(conf, None, (), ())
        rems = simulated_remedies(analyse(trace), min_budget(trace, conf, trace), conf, command=command)
        return Simulated(conf, trace, tuple(rems), ())
    except Exception as exc:  # noqa: BLE001 - the settings stand without the remedies
        return Simulated(conf, trace, (), (f"remedies not simulated ({type(exc).__name__}: {exc})",))


def tune_remedies(
    sim: Any,
    baseline: TrialResult,
    conf: str,
    summaries: Sequence["CandidateSummary"],
    no_grad: Remedy | None,
    command: str,
    early: Simulated | None = None,
    measured: Sequence[Remedy] = (),
) -> RemedyReport:
    """The simulated remedies under `conf` (the best or closest setting; `early`: simulated while the GPU
    ran, used when it was for the same setting), the measured no-grad one, the other measured ones
    (`measured`: the cuDNN switch, which takes the place of the listed, unconfirmed cuDNN candidates),
    and the utilization table."""
    from alloctune.remedy.registry import best_release

    done = early if early is not None and early.conf == conf else simulate(sim, baseline, conf, command)
    trace, remedies, notes = done.trace, list(done.remedies), list(done.notes)
    if any(m.name.startswith("cudnn_benchmark") for m in measured):
        remedies = [r for r in remedies if not (r.name.startswith("cudnn_benchmark") and r.method == UNCONFIRMED)]
    if any(m.name == "checkpointing" and m.min_budget is not None for m in measured):  # the run has the last word
        remedies = [r for r in remedies if r.name != "checkpointing"]
    remedies += list(measured)
    for m in measured:
        notes.append(f"{m.what}: {m.notes[0]}" if m.notes else m.what)
    if no_grad is not None:
        remedies.append(no_grad)
    best = best_release(remedies)
    if best is not None:
        notes.append(
            f"best release policy under {conf or 'the default'}: {best.what}, min budget "
            f"{format_size(best.min_budget or 0)} (saves {format_size(best.saving or 0)}, {best.cleanups} "
            f"clean-up(s), simulated): {best.how_to}"
        )
    util = None
    if trace is not None:
        util = table(setting_rows(trace, summaries) + remedy_rows(remedies), trace)
    return RemedyReport(tuple(remedies), util, best, tuple(notes))


def fitting(report: RemedyReport, budget: int) -> list[Remedy]:
    """The remedies that would fit the budget (a shortage's way out), measured ones first."""
    ok = [r for r in report.remedies if r.min_budget is not None and r.min_budget <= budget]
    return sorted(ok, key=lambda r: (r.method != MEASURED, r.min_budget))


def shortfall_with_remedies(shortfall: Any, report: RemedyReport) -> Any:
    """A shortfall whose next steps start with the remedies that fit (each with how to get it), the best
    one's line first, and name what the program keeps growing where freeing it does not fit alone."""
    found = fitting(report, shortfall.budget)
    leaks = [r for r in report.remedies if r.name == "free_growing" and r not in found]
    if not found and not leaks:
        return shortfall
    lines = tuple(f"{r.what} fits ({r.method}: min budget {format_size(r.min_budget or 0)}): {r.how_to}" for r in found)
    lines += tuple(
        f"the program keeps memory it does not need: {r.what}; freed, its min budget is "
        f"{format_size(r.min_budget) if r.min_budget else 'unknown'} ({r.method}): {r.how_to}"
        for r in leaks
    )
    return replace(shortfall, next_steps=lines + tuple(shortfall.next_steps))
