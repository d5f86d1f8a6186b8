"""`alloctune simulate TRACE`: replay a recorded allocator history under other settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate(
        trace_file: Path = typer.Argument(..., metavar="TRACE", help="Snapshot (.pickle[.gz|.xz]) or compact trace."),
        conf: Optional[List[str]] = typer.Option(
            None, "--conf", "-c", help="Allocator setting to simulate (repeatable); default: unset."
        ),
        budget: Optional[str] = typer.Option(
            None, "--budget", "-b", help="Per-process memory cap, e.g. 6GiB (as set_per_process_memory_fraction)."
        ),
        total_memory: Optional[str] = typer.Option(
            None, "--total-memory", help="Device memory (default: the trace's device, else an H200's)."
        ),
        device: Optional[int] = typer.Option(None, "--device", "-d", help="Device index (needed if several recorded)."),
        torch_version: str = typer.Option("2.11", "--torch", help="PyTorch release whose rules to apply."),
        find_min: bool = typer.Option(
            False, "--min-budget", help="Also find each setting's smallest budget that completes (bisection)."
        ),
        compare_file: Optional[Path] = typer.Option(
            None, "--compare", help="Recorded trace to check the replay against (event for event)."
        ),
        addresses: str = typer.Option(
            "auto",
            "--addresses",
            help="Segment addresses: recorded (where --compare's or TRACE's recording put them), "
            "model (predicted only); auto = recorded.",
        ),
        json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    ) -> None:
        """Peak reserved/allocated, utilization, retries and OOM point per setting; optional
        minimum budget and a fidelity check against a recording."""
        from alloctune.errors import InputError

        if addresses not in ("auto", "model", "recorded"):
            raise InputError(f"--addresses must be auto, model or recorded, not {addresses!r}")
        rows = run_simulate(
            trace_file,
            confs=list(conf or [""]),
            budget=budget,
            total_memory=total_memory,
            device=device,
            torch=torch_version,
            find_min=find_min,
            compare_file=compare_file,
            addresses=addresses,
        )
        if json_out:
            from alloctune.cli.common import print_json

            print_json({"schema": "alloctune.simulate/1", "trace": str(trace_file), "rows": rows})
            return
        _render(rows, find_min)


def run_simulate(
    trace_file: Path,
    *,
    confs: list[str],
    budget: str | None,
    total_memory: str | None,
    device: int | None,
    torch: str,
    find_min: bool,
    compare_file: Path | None,
    addresses: str,
) -> list[dict[str, Any]]:
    """The command's work, as plain rows (also used by tests)."""
    from alloctune.config import AllocatorConfig
    from alloctune.sim.budget import min_budget
    from alloctune.sim.compare import compare
    from alloctune.sim.oom import oom_message
    from alloctune.sim.replay import replay
    from alloctune.sim.settings import SimSettings
    from alloctune.trace.load import load_trace
    from alloctune.units import parse_size

    trace = load_trace(trace_file, device)
    recorded = load_trace(compare_file, device) if compare_file is not None else None
    cap = parse_size(budget) if budget is not None else None
    if cap is None and recorded is not None and (recorded.meta or {}).get("cap"):
        cap = int(recorded.meta["cap"])  # check a capped recording under its own cap
    total = parse_size(total_memory) if total_memory is not None else None
    rows = []
    for text in confs:
        config = AllocatorConfig.parse(text, torch)
        settings = SimSettings.from_config(config, torch)
        # auto: where the recording (the --compare one, else TRACE) placed its k-th segment
        mode = "recorded" if addresses == "auto" else addresses
        ref = recorded if recorded is not None else trace
        result = replay(
            trace, settings, budget=cap, total_memory=total, torch=torch, addresses=mode, reference=ref,
            record_events=recorded is not None, timeline_points=200,
        )
        row: dict[str, Any] = {
            "conf": text,
            "budget": cap,
            "peak_reserved": result.peak_reserved,
            "peak_allocated": result.peak_allocated,
            "utilization": round(result.utilization, 4),
            "num_alloc_retries": result.num_alloc_retries,
            "num_ooms": result.stats["num_ooms"],
            "completed": result.completed,
            "oom": (
                {**result.oom.to_dict(), "message": oom_message(result.oom, total_memory=result.total_memory,
                                                                torch=torch)}
                if result.oom else None
            ),
            "expected_failures": len(result.expected_failures),
            "addresses": mode,
        }
        if find_min:
            mb = min_budget(trace, settings, torch=torch, total_memory=total)
            row["min_budget"] = mb.budget
            row["min_budget_replays"] = mb.replays
        if recorded is not None:
            fid = compare(result, recorded, stream_trace=None if recorded is trace else trace)
            row["fidelity"] = fid.to_dict()
        rows.append(row)
    return rows


def _render(rows: list[dict[str, Any]], find_min: bool) -> None:
    from rich.table import Table

    from alloctune.cli.common import console
    from alloctune.units import format_size

    table = Table(title="simulated allocator (torch caching allocator model)", box=None, pad_edge=False, header_style="bold underline")
    # wide enough for the usual settings (expandable_segments:True) to stay on one line at 80 columns
    longest = max((len(r["conf"] or "(unset)") for r in rows), default=20)
    table.add_column("setting", overflow="fold", min_width=min(max(20, longest), 24))
    table.add_column("peak\nreserved", justify="right", no_wrap=True, min_width=8)
    table.add_column("peak\nallocated", justify="right", no_wrap=True, min_width=9)
    table.add_column("util.", justify="right", no_wrap=True, min_width=6)
    table.add_column("re-\ntries", justify="right", no_wrap=True, min_width=4)
    table.add_column("OOM at", no_wrap=True)
    if find_min:
        table.add_column("min budget", justify="right", no_wrap=True, min_width=9)
    for r in rows:
        oom = r["oom"]
        where = "-" if oom is None else f"#{oom['request_index']}"
        if r["expected_failures"]:
            where += f" [{r['expected_failures']} recorded failure(s) reproduced]"
        cells = [
            r["conf"] or "(unset)",
            format_size(r["peak_reserved"]),
            format_size(r["peak_allocated"]),
            f"{r['utilization'] * 100:.1f} %",
            str(r["num_alloc_retries"]),
            where,
        ]
        if find_min:
            cells.append(format_size(r["min_budget"]) if r.get("min_budget") else "does not fit")
        table.add_row(*cells)
    console.print(table)
    if rows and rows[0].get("budget"):
        console.print(f"budget: {format_size(rows[0]['budget'])}")
    for r in rows:
        oom = r["oom"]
        if oom is not None:
            console.print(
                f"{r['conf'] or '(unset)'}: out of memory at request #{oom['request_index']} of "
                f"{format_size(oom['size'])} (tried to allocate {format_size(oom['alloc_size'])}; "
                f"{format_size(oom['reserved'])} reserved, {format_size(oom['allocated'])} allocated, "
                f"largest free cached block {format_size(oom['largest_free_block'])})"
            )
            console.print(f"  PyTorch would raise: {oom['message']}", markup=False)
    for r in rows:
        fid = r.get("fidelity")
        if fid is None:
            continue
        head = "[green]exact[/green]" if fid["exact"] else f"[red]differs[/red]: {fid['verdict']}"
        console.print(f"fidelity of {r['conf'] or '(unset)'} vs recording: {head}")
        console.print(
            f"  segment events: {fid['events_simulated']} simulated / {fid['events_recorded']} recorded"
            f" ({r['addresses']} addresses)"
        )
        for k, v in fid["stats"].items():
            mark = "=" if v["recorded"] == v["simulated"] else "!="
            console.print(f"  {k}: {v['simulated']} {mark} {v['recorded']} recorded")
        if fid["context"]:
            console.print("  first difference:\n    " + fid["context"].replace("\n", "\n    "), markup=False)
