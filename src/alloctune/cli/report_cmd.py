"""`alloctune report`: figures and one self-contained HTML page from results, stores and snapshots."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        inputs: List[Path] = typer.Argument(
            ..., help="Tune stores (*.jsonl), `alloctune simulate --json` results, snapshots, or directories of them."
        ),
        out: Path = typer.Option(Path("alloctune-report"), "--out", "-o", help="Directory for report.html and PNGs."),
        title: str = typer.Option("alloctune report", "--title", help="Page title."),
        device: Optional[int] = typer.Option(None, "--device", help="Device of multi-GPU snapshots."),
        what_if: bool = typer.Option(
            False, "--what-if", help="For snapshots with an OOM, replay the standard settings in the simulator."
        ),
        explain: Optional[bool] = typer.Option(
            None,
            "--explain/--no-explain",
            help="Add `alloctune explain` for each recording (default: for recordings made with Python stacks).",
        ),
        json_out: bool = typer.Option(False, "--json", help="Print the written paths and the data as JSON."),
    ) -> None:
        """Write figures and one self-contained HTML page from results, stores and snapshots.

        PNG figures: reserved vs allocated over time, peaks and min_budget per setting, the segment map at the peak or the OOM."""
        from alloctune.cli.common import console, print_json
        from alloctune.cli.render import err_console, print_items
        from alloctune.cli.views import snapshot_view
        from alloctune.progress import progress_on_stderr
        from alloctune.report import build_report, write_report
        from alloctune.report.model import min_budgets
        from alloctune.report.tables import SETTINGS_HEADER, settings_cells

        if device is not None and device < 0:
            from alloctune.errors import InputError

            raise InputError(f"--device must be 0 or more, got {device}")
        with progress_on_stderr(quiet=json_out, console=err_console) as progress:
            progress(f"reading {len(inputs)} input(s)", 0, 2)
            data = build_report(inputs, title=title, device=device, what_if=what_if, explain=explain)
            progress("writing the page and its figures", 1, 2)
            written = write_report(data, out)
            progress("done", 2, 2)
        if json_out:
            from alloctune.schema import with_schema

            print_json(with_schema("report-output", {"written": written.to_dict(), "report": data.to_dict()}))
            return
        if data.rows:
            console.print(settings_table(SETTINGS_HEADER, settings_cells(data.rows, min_budgets(data.rows))))
        for d in data.diagnoses:
            print_items(console, snapshot_view(d))
        for note in data.notes:
            console.print(f"note: {note}")
        console.print(f"wrote {written.html} ({len(written.figures)} figures, data in {written.json})")


def settings_table(header, cells):
    """The report's settings with the shared table helper (the `config` column only where it says more)."""
    from alloctune.cli.render import Col, FitTable

    keep = [i for i, h in enumerate(header) if h != "config" or any(r[1] != "(default)" and r[1] not in r[0] for r in cells)]
    numeric = {"budget", "peak reserved", "peak allocated", "utilization", "retries", "OOMs", "min_budget"}
    table = FitTable(
        *(Col(header[i], "right" if header[i] in numeric else "left", header[i] in numeric) for i in keep), title="Settings"
    )
    for r in cells:
        table.add_row(*(r[i] for i in keep))
    return table
