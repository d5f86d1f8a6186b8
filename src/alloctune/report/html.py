"""One self-contained HTML page: PNG figures inlined as base64 data URIs, SVG figures inline, CSS
inline, no script (the explain sections highlight a clicked site with CSS alone).

The page must open from an e-mail attachment or an air-gapped machine, so nothing is fetched:
no external stylesheet, font, script or image. Every text that came from an input file is
escaped.
"""

from __future__ import annotations

import base64
import html
from datetime import datetime, timezone
from typing import Mapping, Sequence

from alloctune.report.model import ReportData
from alloctune.report.style import PAGE_CSS as _CSS  # shared with the explain page
from alloctune.report.tables import SETTINGS_HEADER, diagnosis_cells, pinned_cells, settings_cells


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _table(header: Sequence[str] | None, rows: Sequence[Sequence[str]], numeric_from: int = 99) -> str:
    """A table; `header=None` makes a key/value table without a header row."""
    num = ' class="num"'
    body = "".join(
        "<tr>" + "".join(f"<td{num if i >= numeric_from else ''}>{_e(c)}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows
    )
    if header is None:
        return f'<table class="kv"><tbody>{body}</tbody></table>'
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(image: bytes, alt: str, caption: str) -> str:
    if image[:8] == b"\x89PNG\r\n\x1a\n":
        shown = f'<img src="{data_uri(image)}" alt="{_e(alt)}">'
    else:  # SVG drawn by report/svg.py, which escapes every input text itself
        shown = image.decode("utf-8")
    return f"<figure>{shown}<figcaption>{_e(caption)}</figcaption></figure>"


def render_html(
    data: ReportData,
    figures: Mapping[str, tuple[bytes, str]],
    budgets: Mapping[str, tuple[int, str]] | None = None,
    generated: datetime | None = None,
) -> str:
    """The page. `figures` maps a figure name to (PNG or SVG bytes, caption); insertion order is kept."""
    when = (generated or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    css = _CSS
    if data.explains:  # explain sections: their highlight rules, one id prefix per section
        from alloctune.report.explain_html import EXPLAIN_CSS, highlight_css

        css += EXPLAIN_CSS + "".join(highlight_css(v, f"x{i}-") for i, v in enumerate(data.explains))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(data.title)}</title><style>{css}</style></head><body>",
        f"<h1>{_e(data.title)}</h1>",
        f'<p class="muted">Generated {when} by alloctune from {len(data.inputs)} input(s). '
        "utilization = peak allocated ÷ peak reserved; min_budget = smallest per-process cap under which the "
        "workload completes.</p>",
    ]
    if data.rows:
        parts.append("<h2>Settings</h2>")
        parts.append(_table(SETTINGS_HEADER, settings_cells(data.rows, budgets), numeric_from=4))
    for d in data.diagnoses:
        parts.append(f"<h2>OOM diagnosis: {_e(d.source)}</h2>")
        parts.append(f'<p class="verdict">{_e(d.summary)}</p>')
        parts.append(_table(None, diagnosis_cells(d)[2:]))
        if d.pinned:
            parts.append("<h3>Segments pinned by live blocks</h3>")
            parts.append(
                _table(
                    ("segment", "size", "live", "free", "largest free", "live blocks"),
                    pinned_cells(d),
                    numeric_from=1,
                )
            )
    if data.explains:
        from alloctune.report.explain_html import explain_section

        for i, v in enumerate(data.explains):
            parts.append(explain_section(v, prefix=f"x{i}-"))
    if figures:
        parts.append("<h2>Figures</h2>")
        for name, (image, caption) in figures.items():
            parts.append(_figure(image, name, caption))
    if data.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in data.notes) + "</ul>")
    parts.append("<h2>Inputs</h2><ul>" + "".join(f"<li><code>{_e(p)}</code></li>" for p in data.inputs) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
