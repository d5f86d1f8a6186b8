"""`alloctune demo`: the product in one command, with or without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

import typer

from alloctune.cli.common import console, print_json

# A 6 GiB card leaves roughly this much to PyTorch once the CUDA context is loaded.
GPU_DEMO_BUDGET = "5.5GiB"
GPU_DEMO_FILES = 4  # audio files per trial: enough lengths to fragment, short enough for a demo


def _cuda_available() -> bool:
    """True only when torch is installed and sees a CUDA device (checked in a child so the
    demo process itself never imports torch)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return False
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
            capture_output=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):  # a hung driver is no GPU for the demo
        return False
    return probe.returncode == 0


def _render(result) -> None:
    from rich.text import Text

    from alloctune.cli.render import Col, FitTable
    from alloctune.units import GiB, format_mib

    console.print(
        f"[bold]alloctune demo[/bold] — simulating a real allocator trace on the CPU\n"
        f"trace: {result.workload} ({result.requests:,} allocator requests"
        + (f", recorded with torch {result.recorded_with}" if result.recorded_with else "")
        + ")\n"
    )
    cols = [
        Col("setting"),
        Col("peak\nreserved", justify="right", nowrap=True),
        Col("util.", justify="right", nowrap=True),
        Col("min budget\n(vs default)", justify="right", nowrap=True),
        Col("fits\ncard", justify="right", nowrap=True),
    ]
    if result.budget is not None:
        cols.append(Col(f"fits {format_mib(result.budget)}", justify="center", nowrap=True))
    table = FitTable(*cols, title="Each setting, replayed through the exact allocator model")
    default_mb = result.rows[0].min_budget

    def add(row, style: str = "") -> None:
        rel = ""
        if row.no_effect:
            rel = " (no effect)"
        elif default_mb and row.min_budget:
            rel = f" ({row.min_budget / default_mb - 1:+.0%})" if row.min_budget != default_mb else "       "
        cells = [
            Text(row.label, style=style),
            f"{row.peak_reserved / GiB:.2f} GiB",
            f"{row.utilization:.0%}",
            f"{row.min_budget / GiB:.2f} GiB{rel}" if row.min_budget else "never",
            f"{row.smallest_card_gib} GiB" if row.smallest_card_gib else "> 24 GiB",
        ]
        if result.budget is not None:
            cells.append("yes" if row.fits_budget else Text("no", style="red"))
        table.add_row(*cells)

    for row in result.rows:
        add(row, "bold green" if row is result.recommended else "")
    table.add_row(Text("─" * 8, style="dim"), *([""] * (len(cols) - 1)))  # the line above the folklore rows
    for row in result.folklore:
        add(row, "dim")
    console.print(table)
    console.print("[dim]Rows below the line are folklore values copied from forums.[/dim]\n")
    for note in result.notes:
        console.print(f"• {note}")
    best = result.recommended
    console.print(f"\n[bold]Recommendation:[/bold] {best.label}")
    if best.conf:
        from alloctune.shells import env_assignments, render_all

        for shell, text in render_all(env_assignments(best.conf)).items():
            console.print(f"  [cyan]{shell}[/cyan]")
            for line in text.splitlines():
                console.print(f"    {line}", highlight=False, markup=False)
    console.print(
        "\nOn your own GPU: [bold]alloctune tune --budget 5.5GiB -- python your_script.py[/bold] "
        "measures this for your workload; [bold]alloctune record[/bold] + [bold]alloctune simulate[/bold] "
        "predicts it on any CPU."
    )


def _short_workload(text: str) -> str:
    """'rvc (alloctune.workloads.rvc, 6 items)' -> 'rvc, 6 items'."""
    name, _, rest = text.partition(" (")
    items = rest.rstrip(")").split(", ")[-1] if rest else ""
    return f"{name}, {items}" if items.endswith("items") else name


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        trace: Optional[str] = typer.Option(None, "--trace", help="Trace file, or the name of a shipped trace (see --list); default: the shipped RVC trace."),
        budget: Optional[str] = typer.Option(None, "--budget", help="Also say whether each setting fits this per-process budget, e.g. 1.6GiB."),
        gpu: Optional[bool] = typer.Option(
            None, "--gpu/--no-gpu", help="Tune the RVC workload on the GPU (default: when one is present)."
        ),
        json_out: bool = typer.Option(False, "--json", help="Print machine-readable output."),
        list_traces: bool = typer.Option(False, "--list", help="List the shipped traces and exit."),
    ) -> None:
        """Show alloctune at work: tune RVC on a GPU, or simulate a real RVC trace without one."""
        from alloctune.units import parse_size

        if list_traces:
            from alloctune.cli.render import FitTable
            from alloctune.demo import shipped_trace_info

            rows = shipped_trace_info()
            if json_out:
                print_json(rows)
                return
            torches = ", ".join(sorted({r["torch"].split("+")[0] for r in rows if r["torch"]}))
            table = FitTable("name", "workload", "recorded under",
                             title=f"shipped H200 traces (torch {torches}); use one with --trace NAME")
            for r in rows:  # --json has the full provenance
                table.add_row(r["name"], _short_workload(r["workload"]), r["setting"])
            console.print(table)
            return

        # --gpu is a wish, not a fact: "GPU found" only once a child's torch has seen CUDA (#18.13)
        use_gpu = _cuda_available() if (gpu or (gpu is None and trace is None)) else False
        if gpu and not use_gpu:
            typer.echo("no CUDA GPU: showing the simulated demo", err=True)
        if use_gpu:
            cmd = [
                # the default confirm flow: the simulator ranks every candidate from the baseline's trace
                # and the GPU confirms the best one (three runs after the baseline when they agree)
                sys.executable, "-m", "alloctune", "tune", "--budget", GPU_DEMO_BUDGET,
                *(["--json"] if json_out else []),
                "--", sys.executable, "-m", "alloctune.workloads.rvc", "--device", "cuda", "--count", str(GPU_DEMO_FILES),
            ]
            if not json_out:
                console.print(f"GPU found: tuning the RVC workload under {GPU_DEMO_BUDGET} (a 6 GiB card)\n$ {' '.join(cmd[2:])}")
            raise typer.Exit(subprocess.call(cmd, env=os.environ.copy()))

        from alloctune.demo import run_demo

        result = run_demo(trace, budget=parse_size(budget) if budget else None)
        if json_out:
            print_json(result.to_dict())
        else:
            _render(result)
