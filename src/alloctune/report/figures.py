"""PNG figures from plain report data (matplotlib, Agg canvas, no pyplot global state).

Each function takes plain records and returns PNG bytes, so the HTML page can inline them
and tests can check them without a display. matplotlib is imported inside the functions:
`alloctune --help` and the rest of the core never pay for it.
"""

from __future__ import annotations

import io
from typing import Any, Mapping, Sequence

from alloctune.memory_map.model import MemoryMap
from alloctune.report.model import SegmentMapView, Series, SettingRow
from alloctune.report.style import ALLOCATED, FREE, LARGEST_FREE, MAX_PANELS, MAX_SEGMENT_ROWS, RESERVED, axis_unit
from alloctune.units import format_percent, format_size


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def timeline_figure(series: Sequence[Series]) -> bytes:
    """Reserved vs allocated over the history, one panel per run, on a shared y axis.

    The gap between the two curves is memory the allocator holds but no tensor uses.
    """
    series = list(series)[:MAX_PANELS]
    if not series:
        raise ValueError("no timeline to draw")
    top = max(max(s.reserved, default=0) for s in series)
    scale, unit = axis_unit(top)
    ncols = 1 if len(series) == 1 else 2
    nrows = -(-len(series) // ncols)
    fig = _figure(11 if ncols == 2 else 9, 2.4 * nrows + 0.6)
    axes = fig.subplots(nrows, ncols, sharey=True, squeeze=False)
    for ax, s in zip(axes.flat, series):
        r = [v / scale for v in s.reserved]
        a = [v / scale for v in s.allocated]
        ax.fill_between(s.x, a, r, step="post", color=RESERVED, alpha=0.35, linewidth=0)
        ax.step(s.x, r, where="post", color=RESERVED, linewidth=1.0, label="reserved")
        ax.step(s.x, a, where="post", color=ALLOCATED, linewidth=1.0, label="allocated")
        peak_r = max(s.reserved, default=0)
        peak_a = max(s.allocated, default=0)
        util = f", utilization {format_percent(peak_a / peak_r)}" if peak_r else ""
        ax.set_title(f"{s.label}: peak {format_size(peak_r)} reserved{util}", fontsize=9)
        ax.set_xlabel("history event", fontsize=8)
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(series) :]:
        ax.set_visible(False)
    axes.flat[0].legend(loc="upper left", fontsize=8)
    return _png(fig)


def peaks_figure(rows: Sequence[SettingRow]) -> bytes:
    """Peak reserved and peak allocated per setting (horizontal bars; utilization in the label)."""
    rows = [r for r in rows if r.peak_reserved]
    if not rows:
        raise ValueError("no peaks to draw")
    scale, unit = axis_unit(max(r.peak_reserved or 0 for r in rows))
    fig = _figure(9, 0.45 * len(rows) + 1.4)
    ax = fig.subplots()
    ys = list(range(len(rows)))[::-1]
    ax.barh(ys, [(r.peak_reserved or 0) / scale for r in rows], color=RESERVED, alpha=0.6, label="peak reserved")
    ax.barh(ys, [(r.peak_allocated or 0) / scale for r in rows], height=0.4, color=ALLOCATED, label="peak allocated")
    ax.set_yticks(ys, [f"{r.label} ({format_percent(r.utilization)})" if r.utilization else r.label for r in rows], fontsize=8)
    ax.set_xlabel(unit)
    ax.set_title("Peak reserved vs allocated per setting (utilization in brackets)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, axis="x", alpha=0.3)
    return _png(fig)


def min_budget_figure(budgets: Mapping[str, tuple[int, str]]) -> bytes:
    """`min_budget` per setting: the smallest cap under which the workload completes."""
    if not budgets:
        raise ValueError("no min_budget to draw")
    items = sorted(budgets.items(), key=lambda kv: kv[1][0])
    scale, unit = axis_unit(max(v for v, _ in budgets.values()))
    fig = _figure(9, 0.45 * len(items) + 1.4)
    ax = fig.subplots()
    ys = list(range(len(items)))[::-1]
    colors = [LARGEST_FREE if i == 0 else RESERVED for i in range(len(items))]
    ax.barh(ys, [v / scale for _, (v, _) in items], color=colors)
    for y, (_, (v, how)) in zip(ys, items):
        ax.text(v / scale, y, f" {format_size(v)}" + ("" if how == "bisection" else " (≤)"), va="center", fontsize=8)
    ax.set_yticks(ys, [k for k, _ in items], fontsize=8)
    ax.set_xlabel(unit)
    ax.set_title("min_budget per setting (smaller is better)", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    return _png(fig)


def segment_map_figure(view: SegmentMapView) -> bytes:
    """One bar per segment (most free bytes first), live blocks blue, free blocks yellow.

    Free blocks at least as large as the failed request would be green; at a fragmentation OOM
    there are none, and the picture shows why: the free memory is scattered over many segments.
    """
    mm: MemoryMap = view.memory_map
    segs = sorted(mm.segments, key=lambda s: (-s.free, -s.size, s.addr))
    shown = segs[:MAX_SEGMENT_ROWS]
    fig = _figure(10, 0.22 * max(len(shown), 4) + 1.6)
    ax = fig.subplots()
    longest = max((s.size for s in shown), default=1)
    scale, unit = axis_unit(longest)
    for row, seg in enumerate(shown):
        y = len(shown) - 1 - row
        live = [((b.addr - seg.addr) / scale, b.size / scale) for b in seg.blocks if b.allocated]
        free = [b for b in seg.blocks if not b.allocated]
        big = [((b.addr - seg.addr) / scale, b.size / scale) for b in free if view.request and b.size >= view.request]
        small = [((b.addr - seg.addr) / scale, b.size / scale) for b in free if not (view.request and b.size >= view.request)]
        ax.broken_barh(live, (y - 0.4, 0.8), facecolors=ALLOCATED)
        ax.broken_barh(small, (y - 0.4, 0.8), facecolors=FREE)
        if big:
            ax.broken_barh(big, (y - 0.4, 0.8), facecolors=LARGEST_FREE)
        ax.broken_barh([(0, seg.size / scale)], (y - 0.4, 0.8), facecolors="none", edgecolors="#4a5568", linewidth=0.4)
    ax.set_yticks([])
    ax.set_ylim(-0.8, max(len(shown), 1) - 0.2)
    ax.set_xlim(0, longest / scale * 1.02)
    ax.set_xlabel(f"offset in segment ({unit})")
    more = f"; {len(segs) - len(shown)} segments with less free memory not shown" if len(segs) > len(shown) else ""
    req = f"; failed request {format_size(view.request)}" if view.request else ""
    ax.set_title(
        f"{view.label}: {len(segs)} segments, {format_size(mm.reserved)} reserved, "
        f"{format_size(mm.allocated)} allocated{req}{more}",
        fontsize=9,
    )
    from matplotlib.patches import Patch

    handles = [Patch(color=ALLOCATED, label="live block"), Patch(color=FREE, label="free block")]
    if view.request:
        handles.append(Patch(color=LARGEST_FREE, label="free block ≥ request"))
    fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncol=3, frameon=False)
    return _png(fig)
