"""Tables of report data: one list of formatted cells, rendered by rich (terminal) or HTML.

Formatting lives here once so the terminal and the HTML page show the same numbers.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from alloctune.config.standard import setting_label
from alloctune.diagnose.snapshot_model import SnapshotDiagnosis
from alloctune.report.model import SettingRow
from alloctune.units import format_percent, format_size

SETTINGS_HEADER = (
    "setting",
    "config",
    "kind",
    "outcome",
    "budget",
    "peak reserved",
    "peak allocated",
    "utilization",
    "retries",
    "OOMs",
    "min_budget",
)


def _size(v: int | None) -> str:
    return "" if v is None else format_size(v)


def settings_cells(rows: Sequence[SettingRow], budgets: Mapping[str, tuple[int, str]] | None = None) -> list[list[str]]:
    """One list of strings per row, in `SETTINGS_HEADER` order."""
    budgets = budgets or {}
    out = []
    for r in rows:
        mb = budgets.get(r.label)
        mb_text = (
            _size(r.min_budget)
            if r.min_budget is not None
            else ("" if mb is None else _size(mb[0]) + ("" if mb[1] == "bisection" else " (≤)"))
        )
        out.append(
            [
                r.label,
                setting_label(r.config),
                r.kind,
                r.outcome,
                _size(r.budget),
                _size(r.peak_reserved),
                _size(r.peak_allocated),
                "" if r.utilization is None else format_percent(r.utilization),
                "" if r.num_alloc_retries is None else str(r.num_alloc_retries),
                "" if r.num_ooms is None else str(r.num_ooms),
                mb_text,
            ]
        )
    return out


def diagnosis_cells(d: SnapshotDiagnosis) -> list[tuple[str, str]]:
    """Key/value lines of a snapshot diagnosis."""
    cells = [
        ("verdict", d.verdict),
        ("summary", d.summary),
        ("state from", d.state_source),
        ("failed request", f"{format_size(d.request)} (new segment {format_size(d.alloc_size)}, {d.pool} pool)"),
        ("reserved / allocated", f"{format_size(d.reserved)} / {format_size(d.allocated)}"),
        ("reserved but free", format_size(d.reserved_free)),
        ("largest usable free block", format_size(d.largest_free)),
        ("pinned segments", f"{d.pinned_count} ({format_size(d.pinned_free)} free in them)"),
        ("budget", "unknown" if d.budget is None else f"{format_size(d.budget)} ({d.budget_source})"),
    ]
    if d.budget is not None:
        headroom = max(d.budget - d.reserved, 0)
        cells.append(
            (
                "headroom under budget",
                f"{format_size(headroom)} {'<' if headroom < d.alloc_size else '>='} new segment {format_size(d.alloc_size)}",
            )
        )
    if d.reproduced is False:
        cells.append(("what-ifs", "none shown: the recorded setting, replayed under this budget, does not reproduce the OOM"))
    for w in d.what_if if d.reproduced is not False else ():
        state = "not simulated" if w.avoids_oom is None else ("serves the failed request" if w.avoids_oom else "fails")
        peak = f", peak reserved {format_size(w.peak_reserved)}" if w.peak_reserved else ""
        need = f", needs {format_size(w.min_budget)} to get this far" if w.min_budget else ""
        cells.append((f"what if {w.config or '(default)'}", f"{state}{peak}{need}{'; ' + w.note if w.note else ''}"))
    if d.needs is not None and d.budget is not None:
        cells.append(
            (
                "needs",
                f"{format_size(d.needs)} ({format_size(max(d.needs - d.budget, 0))} more than the budget)"
                + (f" under {d.needs_setting or '(default)'}" if d.needs_setting is not None else ""),
            )
        )
    if d.undecided:
        cells.append(("undecided", d.undecided))
    if d.recommendation is not None:
        cells.append(("recommendation", d.recommendation))
    if d.confirm:
        cells.append(("confirm on the GPU", d.confirm))
    cells.extend(("next", e.removeprefix("next: ")) for e in d.evidence if e.startswith("next: "))
    return cells


def pinned_cells(d: SnapshotDiagnosis) -> list[tuple[str, ...]]:
    """The segments pinned by live blocks: address, size, live, free, largest free, live blocks."""
    return [
        (
            f"{p.addr:#x}",
            format_size(p.size),
            format_size(p.allocated),
            format_size(p.free),
            format_size(p.largest_free),
            str(p.live_blocks),
        )
        for p in d.pinned
    ]
