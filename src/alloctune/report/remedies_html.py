"""The remedies and the utilization table as HTML (#29.5, #29.6): the part of the explain page (and of
any page that holds an `Explanation`) that says which program-level remedy buys what."""

from __future__ import annotations

import html
from typing import Any

from alloctune.units import format_percent, format_size


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _fmt(n: int | None) -> str:
    return "-" if n is None else format_size(n) if n >= 0 else "-" + format_size(-n)


def _tbl(header: tuple[str, ...], rows: list[tuple[str, ...]], numeric: tuple[int, ...]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=num' if i in numeric else ''}>{c}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows
    )
    return f'<table class="xp-tbl"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def remedies_section(remedies: Any, utilization: Any) -> str:
    """Each remedy (what it buys, how to get it, how it was found) and one utilization row per setting
    and remedy; empty when there is neither."""
    parts: list[str] = []
    if remedies:
        parts.append("<h3>Remedies (program-level, simulated on this recording unless said)</h3>")
        rows = []
        for r in remedies:
            mb = _fmt(r.min_budget) if r.min_budget is not None else (f"at best {_fmt(r.bound)}" if r.bound is not None else "-")
            how = f"<code>{_e(r.how_to)}</code>"
            if r.confirm and r.min_budget is None:
                how += f'<br><span class="muted">confirm: <code>{_e(r.confirm)}</code></span>'
            rows.append((_e(r.name), _e(r.what), mb, _fmt(r.saving), _e(r.method), how))
        parts.append(_tbl(("remedy", "what", "min budget", "saves", "method", "how"), rows, (2, 3)))
    if utilization is not None and utilization.rows:
        parts.append("<h3>Utilization (peak allocated ÷ peak reserved, uncapped) and min budget</h3>")
        rows = [
            (
                _e(r.kind),
                _e(r.name),
                _fmt(r.min_budget),
                _fmt(r.peak_reserved),
                _fmt(r.peak_allocated),
                format_percent(r.utilization),
                _e(r.method),
            )
            for r in utilization.rows
        ]
        parts.append(
            _tbl(("", "name", "min budget", "peak reserved", "peak allocated", "utilization", "method"), rows, (2, 3, 4, 5))
        )
        if utilization.held_back:
            parts.append(f'<p class="muted">{_e(utilization.held_back)}</p>')
    return "\n".join(parts)
