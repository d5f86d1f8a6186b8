"""`alloctune simulate TRACE`: replay a recorded allocator history under other settings.

Parses, calls `alloctune.sim.simulate.simulate`, renders through `cli/simulate_view.py`; with
`--snapshot-out` it also writes the one simulated run (`sim.export`).

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
        trace_file: Path = typer.Argument(..., metavar="TRACE", help="Snapshot (.pickle[.gz|.xz]), compact trace, "
                                          "or a shipped trace's name (alloctune demo --list)."),
        conf: Optional[List[str]] = typer.Option(
            None, "--conf", "-c", metavar="SETTING", help="Allocator setting to simulate (repeatable); default: unset."
        ),
        budget: Optional[str] = typer.Option(
            None, "--budget", "-b", metavar="SIZE",
            help="Per-process memory cap with a unit, e.g. 6GiB = 6x2^30 bytes (6GB = 6x10^9), as torch's "
                 "per-process memory fraction sets it.",
        ),
        card: Optional[str] = typer.Option(
            None, "--card", metavar="SIZE", help="Card memory (default: the trace's device, else an H200's)."
        ),
        total_memory: Optional[str] = typer.Option(None, "--total-memory", hidden=True, help="The old name of --card."),
        device: Optional[int] = typer.Option(
            None, "--device", "-d", metavar="N", help="Device index (needed if several recorded)."),
        torch_version: str = typer.Option("2.11", "--torch", metavar="VERSION", help="PyTorch release whose rules to apply."),
        find_min: bool = typer.Option(
            False, "--min-budget",
            help="Also find each setting's smallest budget that completes (bisection to 0.2 % or 1 MiB, as every command)."
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

        Peak reserved/allocated, utilization, retries and OOM point per setting.

        Optional: the minimum budget (--min-budget) and a fidelity check against a recording (--compare).

        Exits 1 for a predicted OOM or a difference from the recording, 0 otherwise."""
        from alloctune.cli.render import err_console
        from alloctune.cli.simulate_view import render_export, render_simulation
        from alloctune.progress import progress_on_stderr
        from alloctune.sim.simulate import simulate as run
        from alloctune.units import parse_user_size

        option, text = ("--card", card) if card is not None else ("--total-memory", total_memory)  # the old name
        total = parse_user_size(text, option) if text is not None else None
        confs = list(conf or [""])
        if snapshot_out is not None and len(confs) != 1:
            from alloctune.errors import InputError

            raise InputError("--snapshot-out writes one simulated run: give one --conf")
        with progress_on_stderr(quiet=json_out, console=err_console) as progress:
            result = run(trace_file, confs, budget=budget, total_memory=total, device=device,
                         torch=torch_version, find_min=find_min, compare=compare_file, addresses=addresses,
                         progress=progress)
        render_simulation(result, json_out=json_out)
        if snapshot_out is not None:  # a second answer the user asked for: the one run as a torch snapshot
            from alloctune.sim.export import export_simulated_run

            render_export(export_simulated_run(trace_file, confs[0], snapshot_out, budget=budget,
                                               total_memory=total, device=device, torch=torch_version,
                                               addresses=addresses))
        if result.failed:
            raise typer.Exit(1)
