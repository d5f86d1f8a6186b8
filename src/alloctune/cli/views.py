"""Views of core results that more than one command prints (built with the shared table helper)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from alloctune.cli.render import Col, FitTable, kv_table

if TYPE_CHECKING:
    from alloctune.explain.utilization import UtilizationTable


def snapshot_view(d: Any) -> list[Any]:
    """A `SnapshotDiagnosis`: its key/value lines, then the segments pinned by live blocks."""
    from alloctune.report.tables import diagnosis_cells
    from alloctune.units import format_mib

    out: list[Any] = [kv_table(diagnosis_cells(d), title=f"OOM in {d.source}")]
    if d.pinned:
        t = FitTable(Col("segment"), *(Col(h, "right", True) for h in ("size", "live", "free", "largest\nfree")),
                     Col("live\nblocks", "right"), title="Segments pinned by live blocks (most free first)")
        for p in d.pinned:
            t.add_row(f"{p.addr:#x}", format_mib(p.size), format_mib(p.allocated), format_mib(p.free),
                      format_mib(p.largest_free), str(p.live_blocks))
        out.append(t)
    return out


def utilization_lines(t: UtilizationTable) -> list[str]:
    """A `UtilizationTable` (`explain.utilization`) as plain lines: one row per setting or remedy with its min
    budget, peaks and utilization (`units.format_percent`, as every table prints it), then what holds it back."""
    from alloctune.units import format_percent, format_size

    def size(n: int | None) -> str:
        return "-" if n is None else format_size(n)

    w = min(72, max([40] + [len(r.kind) + 1 + len(r.name) for r in t.rows]))
    out = [f"  {'':<{w}} {'min budget':>12} {'peak reserved':>14} {'peak alloc':>12} {'util.':>7}  method"]
    for r in t.rows:
        out.append(f"  {r.kind + ' ' + r.name:<{w}.{w}} {size(r.min_budget):>12} {size(r.peak_reserved):>14} "
                   f"{size(r.peak_allocated):>12} {format_percent(r.utilization):>7}  {r.method}")
    if t.held_back:
        out.append(f"  {t.held_back}")
    return out
