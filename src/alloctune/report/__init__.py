"""Reports: tables, figures and one self-contained HTML page, from plain data.

`build_report(paths)` reads tune stores, simulation results and snapshots into `ReportData`;
`write_report(data, out_dir)` draws the figures and writes `report.html`, the images and
`report.json`. Figures are PNG when matplotlib is installed and inline SVG otherwise, so the
report needs nothing beyond the base install. Pure core: no torch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alloctune.errors import InputError
from alloctune.report.model import ReportData, SettingRow, build_report, min_budgets

__all__ = ["ReportData", "SettingRow", "WrittenReport", "build_report", "figure_suffix", "render_figures", "write_report"]


@dataclass(frozen=True)
class WrittenReport:
    html: str
    json: str
    figures: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"html": self.html, "json": self.json, "figures": list(self.figures)}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def render_figures(data: ReportData, fmt: str = "auto") -> dict[str, tuple[bytes, str]]:
    """Figure name -> (image bytes, caption), in the order the page shows them.

    `fmt`: "png" (matplotlib, an error without it), "svg" (drawn here, no dependency) or "auto"
    (PNG when matplotlib is installed, else SVG): the report never needs matplotlib.
    """
    import importlib.util

    if fmt not in ("auto", "png", "svg"):
        raise InputError(f"figure format must be auto, png or svg, not {fmt!r}")
    have_mpl = importlib.util.find_spec("matplotlib") is not None
    if fmt == "png" and not have_mpl:
        from alloctune.errors import EnvironmentProblem

        raise EnvironmentProblem("PNG figures need matplotlib: pip install 'alloctune[plot]' (or use SVG figures)")
    if fmt == "svg" or not have_mpl:
        from alloctune.report import svg as fg

        draw = {
            "min_budget": fg.min_budget_svg,
            "peaks": fg.peaks_svg,
            "timeline": fg.timeline_svg,
            "segments": fg.segment_map_svg,
        }
    else:
        from alloctune.report import figures as fg  # type: ignore[no-redef]

        draw = {
            "min_budget": fg.min_budget_figure,
            "peaks": fg.peaks_figure,
            "timeline": fg.timeline_figure,
            "segments": fg.segment_map_figure,
        }

    out: dict[str, tuple[bytes, str]] = {}
    budgets = min_budgets(data.rows)
    if budgets:
        out["min_budget"] = (draw["min_budget"](budgets), "min_budget per setting; (≤) = smallest ok trial, an upper bound")
    if any(r.peak_reserved for r in data.rows):
        out["peaks"] = (draw["peaks"](data.rows), "Peak reserved (wide bar) vs peak allocated (narrow bar)")
    if data.series:
        shown = "" if len(data.series) <= fg.MAX_PANELS else f" (first {fg.MAX_PANELS} of {len(data.series)} runs)"
        out["timeline"] = (
            draw["timeline"](data.series),
            f"Reserved (orange) vs allocated (blue) over the recorded history; the gap is cached but unused memory{shown}",
        )
    for m in data.maps:
        out[f"segments_{_slug(m.label)}"] = (draw["segments"](m), f"Segment map of {m.label} {m.caption}")
    return out


def figure_suffix(image: bytes) -> str:
    """`png` or `svg`, from the bytes themselves."""
    return "png" if image[:8] == b"\x89PNG\r\n\x1a\n" else "svg"


def write_report(data: ReportData, out_dir: str | Path, fmt: str = "auto") -> WrittenReport:
    """Write `report.html` (self-contained), one image per figure (PNG with matplotlib, else SVG)
    and `report.json` into `out_dir`."""
    from alloctune.report.html import render_html

    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create output directory {out}: {exc.strerror}") from None
    figs = render_figures(data, fmt)
    paths = []
    for name, (image, _) in figs.items():
        p = out / f"{name}.{figure_suffix(image)}"
        p.write_bytes(image)
        paths.append(str(p))
    html_path = out / "report.html"
    html_path.write_text(render_html(data, figs, min_budgets(data.rows)), encoding="utf-8")
    json_path = out / "report.json"
    json_path.write_text(json.dumps(data.to_dict(), indent=1) + "\n")
    return WrittenReport(str(html_path), str(json_path), tuple(paths))
