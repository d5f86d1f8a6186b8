"""`alloctune simulate TRACE`: replay a recorded allocator history under other settings.

Exit status: 0 when every setting completes (and matches the recording with `--compare`),
1 for a predicted OOM or a fidelity difference, 2 for bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate(
        trace_file: Path = typer.Argument(..., metavar="TRACE", help="Snapshot (.pickle[.gz|.xz]) or compact trace."),
        conf: Optional[List[str]] = typer.Option(
            None, "--conf", "-c", metavar="SETTING", help="Allocator setting to simulate (repeatable); default: unset."
        ),
        budget: Optional[str] = typer.Option(
            None, "--budget", "-b", metavar="SIZE",
            help="Per-process memory cap with a unit, e.g. 6GiB (as set_per_process_memory_fraction).",
        ),
        total_memory: Optional[str] = typer.Option(
            None, "--total-memory", metavar="SIZE", help="Device memory (default: the trace's device, else an H200's)."
        ),
        device: Optional[int] = typer.Option(
            None, "--device", "-d", metavar="N", help="Device index (needed if several recorded)."),
        torch_version: str = typer.Option("2.11", "--torch", metavar="VERSION", help="PyTorch release whose rules to apply."),
        find_min: bool = typer.Option(
            False, "--min-budget", help="Also find each setting's smallest budget that completes (bisection)."
        ),
        compare_file: Optional[Path] = typer.Option(
            None, "--compare", metavar="RECORDING", help="Recorded trace to check the replay against (event for event)."
        ),
        addresses: str = typer.Option(
            "trace", "--addresses", metavar="trace|compared|model",
            help="Where new segments go: trace (where TRACE's recording put them: a prediction), "
            "compared (where --compare's recording put them: a replay), model (the driver model only).",
        ),
        json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
        snapshot_out: Optional[Path] = typer.Option(
            None, "--snapshot-out", metavar="FILE",
            help="Also write the simulated run (one --conf) as a torch memory snapshot that PyTorch's "
            "memory_viz opens (.pickle, .gz, .xz).",
        ),
    ) -> None:
        """Replay a recorded allocator history under other settings, on the CPU.

        Peak reserved/allocated, utilization, retries and OOM point per setting; optional minimum
        budget and a fidelity check against a recording. Exits 1 for a predicted OOM or a
        difference from the recording, 0 otherwise."""
        from alloctune.cli.render import err_console
        from alloctune.progress import progress_on_stderr
        from alloctune.sim.simulate import simulate as run

        if snapshot_out is not None and len(conf or [""]) != 1:
            from alloctune.errors import InputError

            raise InputError("--snapshot-out writes one simulated run: give one --conf")
        with progress_on_stderr(quiet=json_out, console=err_console) as progress:
            result = run(trace_file, list(conf or [""]), budget=budget, total_memory=total_memory, device=device,
                         torch=torch_version, find_min=find_min, compare=compare_file, addresses=addresses,
                         progress=progress)

        for note in result.notes:  # deprecated spellings: stderr, so --json stays clean
            err_console.print(f"alloctune: note: {note}", markup=False, soft_wrap=True)
        if json_out:
            from alloctune.cli.common import print_json

            print_json(result)
        else:
            _render(result)
        if snapshot_out is not None:
            from alloctune.sim.export import export_simulated_run

            written = export_simulated_run(trace_file, (conf or [""])[0], snapshot_out, budget=budget,
                                           total_memory=total_memory, device=device, torch=torch_version,
                                           addresses=addresses)
            err_console.print(f"simulated run written to {written['path']} ({written['events']} events"
                              + (", ends in the OOM" if written["oom"] else "")
                              + "): open it at pytorch.org/memory_viz", markup=False, soft_wrap=True)
        if result.failed:
            raise typer.Exit(1)


def _render(sim) -> None:
    from rich.markup import escape

    from alloctune.cli.render import Col, FitTable, console
    from alloctune.units import format_size

    rows = sim.rows
    find_min = any(r.find_min for r in rows)
    cols = [Col("setting"), Col("peak\nreserved", "right", True), Col("peak\nallocated", "right", True),
            Col("util.", "right", True), Col("re-\ntries", "right", True), Col("OOM at")]
    if find_min:
        cols.append(Col("min budget", "right", True))
    table = FitTable(*cols, title="simulated allocator (torch caching allocator model)")
    for r in rows:
        where = "-" if r.oom is None else f"#{r.oom['request_index']}"
        if r.expected_failures:
            where += f" ({r.expected_failures} recorded failure(s) reproduced)"
        cells = [r.conf or "(unset)", format_size(r.peak_reserved), format_size(r.peak_allocated),
                 f"{r.utilization * 100:.1f} %", str(r.num_alloc_retries), where]
        if find_min:
            cells.append(format_size(r.min_budget) if r.min_budget else "does not fit")
        table.add_row(*cells)
    console.print(table)
    if sim.budget:
        console.print(f"budget: {format_size(sim.budget)}")
    for r in rows:
        if r.oom is not None:
            o = r.oom
            console.print(
                f"{r.conf or '(unset)'}: out of memory at request #{o['request_index']} of {format_size(o['size'])} "
                f"(tried to allocate {format_size(o['alloc_size'])}; {format_size(o['reserved'])} reserved, "
                f"{format_size(o['allocated'])} allocated, largest free cached block "
                f"{format_size(o['largest_free_block'])})", markup=False)
            console.print(f"  PyTorch would raise: {o['message']}", markup=False, soft_wrap=True)
    for r in rows:
        fid = r.fidelity
        if fid is None:
            continue
        head = "[green]exact[/green]" if fid["exact"] else f"[red]differs[/red]: {escape(fid['verdict'])}"
        where = escape(r.addresses_from.replace("recorded:", "as recorded in ", 1))
        console.print(f"fidelity ({fid['kind']}) of {escape(r.conf or '(unset)')} vs recording: {head}", soft_wrap=True)
        console.print(f"  segment events: {fid['events_simulated']} simulated / {fid['events_recorded']} recorded"
                      f" (addresses: {where})", soft_wrap=True)
        for k, v in fid["stats"].items():
            console.print(f"  {k}: {v['simulated']} {'=' if v['recorded'] == v['simulated'] else '!='} "
                          f"{v['recorded']} recorded")
        if fid["context"]:
            console.print("  first difference:\n    " + fid["context"].replace("\n", "\n    "), markup=False)
