"""Views of core results that more than one command prints (built with the shared table helper)."""

from __future__ import annotations

from typing import Any

from alloctune.cli.render import Col, FitTable, kv_table


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
