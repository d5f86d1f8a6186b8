"""Views of core results that more than one command prints (built with the shared table helper)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from alloctune.cli.render import Col, CopyLine, FitTable, kv_table

if TYPE_CHECKING:
    from rich.console import Console

    from alloctune.explain.utilization import UtilizationTable


# Rows of `diagnosis_cells` that hold a command: printed as lines to copy, never wrapped in a cell.
_COPY_ROWS = ("confirm on the GPU", "next")


def snapshot_view(d: Any) -> list[Any]:
    """A `SnapshotDiagnosis`: its key/value lines, the lines to copy (the command that confirms the fix
    on the GPU, the next steps: `render.CopyLine`s), then the segments pinned by live blocks. Printed
    with `render.print_items`."""
    from rich.text import Text

    from alloctune.report.tables import diagnosis_cells, pinned_cells

    cells = diagnosis_cells(d)
    out: list[Any] = [kv_table([c for c in cells if c[0] not in _COPY_ROWS], title=f"OOM in {d.source}")]
    for key, value in cells:
        if key == "next":
            out.append(CopyLine(f"next: {value}"))
        elif key == "confirm on the GPU":  # a command alone: on a line of its own under its label
            out += [Text(f"{key}:", style="bold"), CopyLine(f"  {value}")]
    if d.pinned:
        t = FitTable(
            Col("segment"),
            *(Col(h, "right", True) for h in ("size", "live", "free", "largest\nfree")),
            Col("live\nblocks", "right"),
            title="Segments pinned by live blocks (most free first)",
        )
        for cells_of_segment in pinned_cells(d):
            t.add_row(*cells_of_segment)
        out.append(t)
    return out


def utilization_lines(t: UtilizationTable, width: int | None = None) -> list[str]:
    """A `UtilizationTable` (`explain.utilization`) as plain lines: one row per setting or remedy with its min
    budget, peaks and utilization (`units.format_percent`, as every table prints it), then what holds it back.

    Names are never cut: where a row's name does not fit beside its figures in `width` columns (None: any
    width), the name has a line of its own and the figures follow on the next."""
    from alloctune.units import format_percent, format_size

    def size(n: int | None) -> str:
        return "-" if n is None else format_size(n)

    heads = ("min budget", "peak reserved", "peak alloc", "util.")
    figures = [(size(r.min_budget), size(r.peak_reserved), size(r.peak_allocated), format_percent(r.utilization)) for r in t.rows]
    widths = [max([len(h)] + [len(f[i]) for f in figures]) for i, h in enumerate(heads)]
    method_w = max([len("method")] + [len(r.method) for r in t.rows])

    names = [f"{r.kind} {r.name}" for r in t.rows]
    name_w = max([0] + [len(n) for n in names])
    if width is not None:  # the name column gets what the figures leave (none on a very narrow terminal)
        room = width - 12 - sum(widths) - method_w  # 12: two spaces before each of the six columns
        name_w = min(name_w, room if room >= 8 else 0)

    def line(name: str, cells: tuple[str, ...], method: str) -> str:
        return f"  {name:<{name_w}}  " + "  ".join(f"{c:>{cw}}" for c, cw in zip(cells, widths)) + f"  {method}"

    out = [line("", heads, "method").rstrip()]
    for name, cells, r in zip(names, figures, t.rows):
        if len(name) > name_w:
            out.append(f"  {name}")
            name = ""
        out.append(line(name, cells, r.method))
    if t.held_back:
        out.append(f"  {t.held_back}")
    return out


def print_utilization(out: Console, t: UtilizationTable) -> None:
    """`utilization_lines` for `out`'s width: the rows unbroken (they fit, or the terminal wraps a long name
    whole), what holds utilization back as wrapped prose."""
    from rich.padding import Padding
    from rich.text import Text

    lines = utilization_lines(t, out.width)
    for line in lines[:-1] if t.held_back else lines:
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    if t.held_back:
        out.print(Padding(Text(t.held_back), (0, 0, 0, 2)))
