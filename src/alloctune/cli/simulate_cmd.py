"""`alloctune simulate TRACE`: replay a recorded allocator history under other settings.

Parses, calls `alloctune.sim.simulate.simulate`, renders through `cli/simulate_view.py`; with
`--snapshot-out` it also writes the one simulated run (`sim.export`).

Exit status: 0 when every setting completes (and matches the recording with `--compare`),
1 for a predicted OOM or a fidelity difference, 2 for bad input.
"""

from __future__ import annotations

import typer

from alloctune.cli import options


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate(
        trace_file: options.SimulateTrace,
        conf: options.SimulateConf = None,
        budget: options.SimulateBudget = None,
        card: options.SimulateCard = None,
        total_memory: options.SimulateTotalMemory = None,
        device: options.RecordedDevice = None,
        torch_version: options.SimulateTorch = "2.11",
        find_min: options.SimulateMinBudget = False,
        compare_file: options.SimulateCompare = None,
        addresses: options.SimulateAddresses = "trace",
        json_out: options.Json = False,
        snapshot_out: options.SimulateSnapshotOut = None,
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
            result = run(
                trace_file,
                confs,
                budget=budget,
                total_memory=total,
                device=device,
                torch=torch_version,
                find_min=find_min,
                compare=compare_file,
                addresses=addresses,
                progress=progress,
            )
        render_simulation(result, json_out=json_out)
        if snapshot_out is not None:  # a second answer the user asked for: the one run as a torch snapshot
            from alloctune.sim.export import export_simulated_run

            render_export(
                export_simulated_run(
                    trace_file,
                    confs[0],
                    snapshot_out,
                    budget=budget,
                    total_memory=total,
                    device=device,
                    torch=torch_version,
                    addresses=addresses,
                )
            )
        if result.failed:
            raise typer.Exit(1)
