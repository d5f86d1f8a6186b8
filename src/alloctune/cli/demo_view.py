"""How `alloctune demo` looks: the simulated demo's table and notes, and the shipped-trace list.

Kept apart from `demo_cmd` so the command stays parse -> call -> render, and the wording of
the demo can change without touching its options."""

from __future__ import annotations

from typing import Any

from alloctune.cli.common import console
from alloctune.demo.core import demo_budget_arg


def render_demo(result: Any) -> None:
    """The demo's table, notes and recommendation (what `run_demo` found; nothing computed here)."""
    from rich.text import Text

    from alloctune.cli.render import Col, FitTable
    from alloctune.units import GiB, format_percent, format_size

    name = result.name or result.trace
    about = short_workload(result.workload)
    console.print("[bold]alloctune demo[/bold] — simulating a real allocator trace on the CPU")
    console.print(
        f"trace: {name} ("
        + (f"{about}; " if about and about != name else "")
        + f"{result.requests:,} allocator requests"
        + (f", recorded with torch {result.recorded_with}" if result.recorded_with else "")
        + ")\n",
        markup=False,
        highlight=False,
    )
    cols = [
        Col("setting"),
        Col("peak\nreserved", justify="right", nowrap=True),
        Col("util.", justify="right", nowrap=True),
        Col("min budget\n(vs default)", justify="right", nowrap=True),
        Col("fits\ncard", justify="right", nowrap=True),
    ]
    if result.budget is not None:
        cols.append(Col(f"fits {format_size(result.budget)}", justify="center", nowrap=True))
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
            format_percent(row.utilization),
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
        from alloctune.config.shells import env_assignments, render_all

        for shell, text in render_all(env_assignments(best.conf)).items():
            console.print(f"  [cyan]{shell}[/cyan]")
            for line in text.splitlines():  # code to paste: never wrapped here (the terminal may wrap it)
                console.print(f"    {line}", highlight=False, markup=False, soft_wrap=True)
    console.print("\nOn your own GPU, this measures it for your workload:")
    _command(f"alloctune tune --budget {demo_budget_arg(result.budget)} -- python your_script.py")
    console.print("and on any CPU, a recording of it predicts it (this table, for your program):")
    _command("alloctune record --out your_script.pickle.xz -- python your_script.py")
    _command("alloctune demo --trace your_script.pickle.xz")


def _command(line: str) -> None:
    """A command to copy: on its own line, never wrapped here (a terminal may wrap it; a paste gives it back whole)."""
    from rich.text import Text

    console.print(Text(f"  {line}", style="bold"), soft_wrap=True)


def short_workload(text: str) -> str:
    """'rvc (alloctune.workloads.rvc, 6 items)' -> 'rvc, 6 items'."""
    name, _, rest = text.partition(" (")
    items = rest.rstrip(")").split(", ")[-1] if rest else ""
    return f"{name}, {items}" if items.endswith("items") else name


def render_trace_list(rows: list[dict[str, str]]) -> None:
    """The shipped traces, one line each (`--json` has the full provenance)."""
    from alloctune.cli.render import FitTable

    torches = ", ".join(sorted({r["torch"].split("+")[0] for r in rows if r["torch"]}))
    table = FitTable(
        "name", "workload", "recorded under", title=f"shipped H200 traces (torch {torches}); use one with --trace NAME"
    )
    for r in rows:
        table.add_row(r["name"], short_workload(r["workload"]), r["setting"])
    console.print(table)
