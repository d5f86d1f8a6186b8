"""Reports: tables, PNG figures and one self-contained HTML page, from plain data.

`build_report(paths)` reads tune stores, simulation results and snapshots into `ReportData`;
`write_report(data, out_dir)` draws the figures and writes `report.html`, the PNGs and
`report.json`. Pure core: no torch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alloctune.errors import InputError
from alloctune.report.model import ReportData, SettingRow, build_report, min_budgets

__all__ = ["ReportData", "SettingRow", "WrittenReport", "build_report", "render_figures", "write_report"]


@dataclass(frozen=True)
class WrittenReport:
    html: str
    json: str
    figures: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"html": self.html, "json": self.json, "figures": list(self.figures)}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def render_figures(data: ReportData) -> dict[str, tuple[bytes, str]]:
    """Figure name -> (PNG bytes, caption), in the order the page shows them."""
    import importlib.util

    from alloctune.report import figures as fg

    if importlib.util.find_spec("matplotlib") is None:
        from alloctune.errors import EnvironmentProblem

        raise EnvironmentProblem("figures need matplotlib: pip install 'alloctune[plot]'")

    out: dict[str, tuple[bytes, str]] = {}
    budgets = min_budgets(data.rows)
    if budgets:
        out["min_budget"] = (fg.min_budget_figure(budgets), "min_budget per setting; (≤) = smallest ok trial, an upper bound")
    if any(r.peak_reserved for r in data.rows):
        out["peaks"] = (fg.peaks_figure(data.rows), "Peak reserved (wide bar) vs peak allocated (narrow bar)")
    if data.series:
        shown = "" if len(data.series) <= fg.MAX_PANELS else f" (first {fg.MAX_PANELS} of {len(data.series)} runs)"
        out["timeline"] = (
            fg.timeline_figure(data.series),
            "Reserved (orange) vs allocated (blue) over the recorded history; the shaded gap is cached but unused "
            f"memory{shown}",
        )
    for m in data.maps:
        out[f"segments_{_slug(m.label)}"] = (fg.segment_map_figure(m), f"Segment map of {m.label} {m.caption}")
    return out


def write_report(data: ReportData, out_dir: str | Path) -> WrittenReport:
    """Write `report.html` (self-contained), one PNG per figure and `report.json` into `out_dir`."""
    from alloctune.report.html import render_html

    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create output directory {out}: {exc.strerror}") from None
    figs = render_figures(data)
    paths = []
    for name, (png, _) in figs.items():
        p = out / f"{name}.png"
        p.write_bytes(png)
        paths.append(str(p))
    html_path = out / "report.html"
    html_path.write_text(render_html(data, figs, min_budgets(data.rows)), encoding="utf-8")
    json_path = out / "report.json"
    json_path.write_text(json.dumps(data.to_dict(), indent=1) + "\n")
    return WrittenReport(str(html_path), str(json_path), tuple(paths))
