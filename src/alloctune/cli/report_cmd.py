"""`alloctune report` (figures + one HTML page) and `alloctune diagnose-snapshot` (flight recorder).

`diagnose-snapshot` lives here until `alloctune diagnose --snapshot FILE` calls
`alloctune.diagnose.snapshot.diagnose_snapshot` directly; both print the same thing.
"""

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
        json_out: bool = typer.Option(False, "--json", help="Print the written paths and the data as JSON."),
    ) -> None:
        """Write PNG figures (reserved vs allocated over time, peaks and min_budget per setting, the
        segment map at the peak or the OOM) and one self-contained HTML page."""
        from alloctune.cli.common import console, print_json
        from alloctune.report import build_report, write_report
        from alloctune.report.model import min_budgets
        from alloctune.report.tables import rich_diagnosis_table, rich_settings_table

        data = build_report(inputs, title=title, device=device, what_if=what_if)
        written = write_report(data, out)
        if json_out:
            print_json({"written": written.to_dict(), "report": data.to_dict()})
            return
        if data.rows:
            console.print(rich_settings_table(data.rows, min_budgets(data.rows)))
        for d in data.diagnoses:
            console.print(rich_diagnosis_table(d))
        for note in data.notes:
            console.print(f"note: {note}")
        console.print(f"wrote {written.html} ({len(written.figures)} figures, data in {written.json})")

    @app.command("diagnose-snapshot")
    def diagnose_snapshot_cmd(
        file: Path = typer.Argument(..., help="A snapshot written at or after an OOM (e.g. `alloctune run --on-oom snapshot`)."),
        budget: Optional[str] = typer.Option(None, "--budget", help="The per-process cap the run had (e.g. 6GiB)."),
        device: int = typer.Option(0, "--device", help="Device whose history to read."),
        oom: int = typer.Option(-1, "--oom", help="Which recorded OOM (0 = first, -1 = last)."),
        no_what_if: bool = typer.Option(False, "--no-what-if", help="Skip replaying other settings in the simulator."),
        json_out: bool = typer.Option(False, "--json", help="Print the diagnosis as JSON."),
    ) -> None:
        """Explain an OOM from a snapshot: largest free block vs the request, pinned segments,
        reserved-but-free memory, and which setting would have avoided it."""
        explain_snapshot(file, budget=budget, device=device, oom=oom, what_if=not no_what_if, json_out=json_out)


def explain_snapshot(
    file: Path, *, budget: Optional[str], device: int = 0, oom: int = -1, what_if: bool = True, json_out: bool = False
) -> None:
    """Shared by `alloctune diagnose --snapshot` and `alloctune diagnose-snapshot`."""
    from alloctune.cli.common import console, print_json
    from alloctune.config.standard import STANDARD_CONFS
    from alloctune.diagnose.snapshot import diagnose_snapshot
    from alloctune.units import parse_size

    cap = parse_size(budget) if budget is not None else None
    d = diagnose_snapshot(file, device=device, oom=oom, budget=cap, candidates=STANDARD_CONFS if what_if else None)
    if json_out:
        print_json(d.to_dict(with_map=False))
        return
    render_snapshot_diagnosis(d, console)


def render_snapshot_diagnosis(d, console) -> None:
    """Terminal rendering shared with `alloctune diagnose --snapshot` (the diagnose CLI may call it)."""
    from alloctune.report.tables import rich_diagnosis_table, rich_pinned_table

    console.print(rich_diagnosis_table(d))
    if d.pinned:
        console.print(rich_pinned_table(d))
