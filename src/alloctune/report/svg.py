"""The report's figures as inline SVG, drawn without matplotlib.

`report` is core: it must produce a complete page on a machine with only the base install.
These are the same four pictures as `figures.py` (same data, same colours), drawn as plain SVG
text: less typography, nothing missing. Every text that came from an input is escaped.
"""

from __future__ import annotations

import html
from typing import Mapping, Sequence

from alloctune.report.model import SegmentMapView, Series, SettingRow
from alloctune.report.style import ALLOCATED, FREE, LARGEST_FREE, MAX_PANELS, MAX_SEGMENT_ROWS, RESERVED, axis_unit
from alloctune.units import format_percent, format_size

WIDTH = 900
LEFT = 230  # room for labels of bar charts


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _svg(height: int, body: list[str], title: str) -> bytes:
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11" role="img">'
        f"<title>{_e(title)}</title>"
    )
    return (head + "".join(body) + "</svg>").encode("utf-8")


def _text(x: float, y: float, s: str, anchor: str = "start", size: int = 11, weight: str = "normal") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" font-weight="{weight}">{_e(s)}</text>'


def _rect(x: float, y: float, w: float, h: float, fill: str, extra: str = "") -> str:
    return f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.2f}" height="{h:.1f}" fill="{fill}"{extra}/>'


def timeline_svg(series: Sequence[Series]) -> bytes:
    """Reserved vs allocated over the history, one panel per run, shared y scale."""
    series = list(series)[:MAX_PANELS]
    if not series:
        raise ValueError("no timeline to draw")
    top = max(max(s.reserved, default=0) for s in series) or 1
    scale, unit = axis_unit(top)
    ph, gap, x0, x1 = 120, 36, 60, WIDTH - 20
    body: list[str] = []
    for k, s in enumerate(series):
        y0 = 20 + k * (ph + gap)
        xs = s.x or (0,)
        lo, hi = xs[0], max(xs[-1], xs[0] + 1)

        def pts(col: Sequence[int]) -> str:
            return " ".join(f"{x0 + (x - lo) / (hi - lo) * (x1 - x0):.1f},{y0 + ph - v / top * ph:.1f}" for x, v in zip(xs, col))

        peak_r, peak_a = max(s.reserved, default=0), max(s.allocated, default=0)
        util = f", utilization {format_percent(peak_a / peak_r)}" if peak_r else ""
        body.append(_text(x0, y0 - 6, f"{s.label}: peak {format_size(peak_r)} reserved{util}", weight="bold"))
        body.append(_rect(x0, y0, x1 - x0, ph, "none", ' stroke="#a0aec0"'))
        body.append(f'<polyline points="{pts(s.reserved)}" fill="none" stroke="{RESERVED}" stroke-width="1.2"/>')
        body.append(f'<polyline points="{pts(s.allocated)}" fill="none" stroke="{ALLOCATED}" stroke-width="1.2"/>')
        body.append(_text(x0 - 4, y0 + 8, f"{top / scale:.1f} {unit}", anchor="end", size=9))
        body.append(_text(x0 - 4, y0 + ph, "0", anchor="end", size=9))
        body.append(_text(x1, y0 + ph + 12, f"history event {hi}", anchor="end", size=9))
    h = 20 + len(series) * (ph + gap)
    body.append(_text(x0, h - 4, "orange: reserved, blue: allocated", size=10))
    return _svg(h + 6, body, "Reserved vs allocated over the recorded history")


def _bars(items: Sequence[tuple[str, int, int | None, str]], title: str) -> bytes:
    """Horizontal bars: (label, wide value, narrow value or None, note after the bar)."""
    top = max(v for _, v, _, _ in items) or 1
    scale, unit = axis_unit(top)
    x0, x1, rh = LEFT, WIDTH - 120, 22
    body = [_text(10, 16, title, weight="bold", size=12)]
    for k, (label, wide, narrow, note) in enumerate(items):
        y = 28 + k * rh
        body.append(_text(x0 - 6, y + 14, label, anchor="end"))
        body.append(_rect(x0, y + 2, wide / top * (x1 - x0), rh - 6, RESERVED, ' fill-opacity="0.6"'))
        if narrow is not None:
            body.append(_rect(x0, y + 7, narrow / top * (x1 - x0), rh - 16, ALLOCATED))
        body.append(_text(x0 + wide / top * (x1 - x0) + 4, y + 14, note, size=10))
    h = 28 + len(items) * rh + 20
    body.append(_text(x0, h - 4, f"scale: 0 – {top / scale:.2f} {unit}", size=9))
    return _svg(h, body, title)


def peaks_svg(rows: Sequence[SettingRow]) -> bytes:
    """Peak reserved (wide bar) vs peak allocated (narrow bar) per setting."""
    rows = [r for r in rows if r.peak_reserved]
    if not rows:
        raise ValueError("no peaks to draw")
    items = [
        (
            f"{r.label} ({format_percent(r.utilization)})" if r.utilization else r.label,
            r.peak_reserved or 0,
            r.peak_allocated,
            format_size(r.peak_reserved or 0),
        )
        for r in rows
    ]
    return _bars(items, "Peak reserved vs allocated per setting (utilization in brackets)")


def min_budget_svg(budgets: Mapping[str, tuple[int, str]]) -> bytes:
    """`min_budget` per setting, smallest first; (≤) marks an upper bound (smallest ok trial)."""
    if not budgets:
        raise ValueError("no min_budget to draw")
    items = [
        (k, v, None, format_size(v) + ("" if how == "bisection" else " (≤)"))
        for k, (v, how) in sorted(budgets.items(), key=lambda kv: kv[1][0])
    ]
    return _bars(items, "min_budget per setting (smaller is better)")


def segment_map_svg(view: SegmentMapView) -> bytes:
    """One bar per segment (most free bytes first): live blocks blue, free yellow, free ≥ request green."""
    mm = view.memory_map
    segs = sorted(mm.segments, key=lambda s: (-s.free, -s.size, s.addr))
    shown = segs[:MAX_SEGMENT_ROWS]
    longest = max((s.size for s in shown), default=1)
    scale, unit = axis_unit(longest)
    x0, x1, rh = 20, WIDTH - 20, 12
    more = f"; {len(segs) - len(shown)} segments with less free memory not shown" if len(segs) > len(shown) else ""
    req = f"; failed request {format_size(view.request)}" if view.request else ""
    body = [
        _text(
            x0,
            16,
            f"{view.label}: {len(segs)} segments, {format_size(mm.reserved)} reserved, "
            f"{format_size(mm.allocated)} allocated{req}{more}",
            weight="bold",
        )
    ]
    for k, seg in enumerate(shown):
        y = 26 + k * rh
        for b in seg.blocks:
            color = ALLOCATED if b.allocated else (LARGEST_FREE if view.request and b.size >= view.request else FREE)
            body.append(_rect(x0 + (b.addr - seg.addr) / longest * (x1 - x0), y, b.size / longest * (x1 - x0), rh - 2, color))
        body.append(_rect(x0, y, seg.size / longest * (x1 - x0), rh - 2, "none", ' stroke="#4a5568" stroke-width="0.4"'))
    h = 26 + len(shown) * rh + 22
    body.append(
        _text(
            x0,
            h - 6,
            f"offset in segment, 0 – {longest / scale:.2f} {unit}; blue: live block, yellow: "
            "free block" + (", green: free block ≥ request" if view.request else ""),
            size=10,
        )
    )
    return _svg(h, body, f"Segment map of {view.label}")
