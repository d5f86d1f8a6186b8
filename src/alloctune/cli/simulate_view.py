"""What `alloctune simulate` prints: per-setting table, each predicted OOM, each fidelity check, or JSON.

Kept apart from `cli/simulate_cmd.py` so the command module only parses, calls
`sim.simulate.simulate` and hands the `Simulation` here. Notes (deprecated spellings) and the
`--snapshot-out` line go to stderr, so stdout holds the answer alone (pure JSON with --json).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from alloctune.config.standard import setting_label

if TYPE_CHECKING:
    from alloctune.sim.simulate import Simulation


def render_simulation(sim: Simulation, *, json_out: bool) -> None:
    """The notes on stderr, then the simulation as JSON or as tables."""
    from alloctune.cli.render import err_console

    for note in sim.notes:
        err_console.print(f"alloctune: note: {note}", markup=False, soft_wrap=True)
    if json_out:
        from alloctune.cli.common import print_json

        print_json(sim)
    else:
        render_tables(sim)


def render_export(written: dict[str, Any]) -> None:
    """Where `--snapshot-out` wrote the simulated run (`sim.export.export_simulated_run`'s answer)."""
    from alloctune.cli.render import err_console

    err_console.print(
        f"simulated run written to {written['path']} ({written['events']} events"
        + (", ends in the OOM" if written["oom"] else "")
        + "): open it at pytorch.org/memory_viz",
        markup=False,
        soft_wrap=True,
    )


def render_tables(sim: Simulation) -> None:
    """One row per setting (with the min budget when it was searched), the budget, then each
    predicted OOM with the message PyTorch would raise, then each fidelity check."""
    from alloctune.cli.render import Col, FitTable, console
    from alloctune.units import format_percent, format_size

    rows = sim.rows
    find_min = any(r.find_min for r in rows)
    cols = [
        Col("setting"),
        Col("peak\nreserved", "right", True),
        Col("peak\nallocated", "right", True),
        Col("util.", "right", True),
        Col("re-\ntries", "right", True),
        Col("OOM at"),
    ]
    if find_min:
        cols.append(Col("min budget", "right", True))
    table = FitTable(*cols, title="simulated allocator (torch caching allocator model)")
    for r in rows:
        where = "-" if r.oom is None else f"#{r.oom['request_index']}"
        if r.expected_failures:
            where += f" ({r.expected_failures} recorded failure(s) reproduced)"
        cells = [
            setting_label(r.conf),
            format_size(r.peak_reserved),
            format_size(r.peak_allocated),
            format_percent(r.utilization),
            str(r.num_alloc_retries),
            where,
        ]
        if find_min:
            cells.append(format_size(r.min_budget) if r.min_budget else "does not fit")
        table.add_row(*cells)
    console.print(table)
    if sim.budget:
        console.print(f"budget: {format_size(sim.budget)}")
    above = [r for r in rows if r.min_budget and r.min_budget > r.peak_reserved]
    if above:
        from alloctune.plan.notes import cap_above_peak_reason

        for r in above:
            console.print(
                f"note: {setting_label(r.conf)}'s min budget lies above its uncapped peak reserved: "
                f"{cap_above_peak_reason(r.conf)}",
                markup=False,
            )
    for r in rows:
        if r.oom is not None:
            o = r.oom
            console.print(
                f"{setting_label(r.conf)}: out of memory at request #{o['request_index']} of {format_size(o['size'])} "
                f"(tried to allocate {format_size(o['alloc_size'])}; {format_size(o['reserved'])} reserved, "
                f"{format_size(o['allocated'])} allocated, largest free cached block "
                f"{format_size(o['largest_free_block'])})",
                markup=False,
            )
            console.print(f"  PyTorch would raise: {o['message']}", markup=False, soft_wrap=True)
    _render_fidelity(sim)


def _render_fidelity(sim: Simulation) -> None:
    """Each setting compared with a recording: exact or the first difference, events and stats side by side."""
    from rich.markup import escape

    from alloctune.cli.render import console

    for r in sim.rows:
        fid = r.fidelity
        if fid is None:
            continue
        head = "[green]exact[/green]" if fid["exact"] else f"[red]differs[/red]: {escape(fid['verdict'])}"
        where = escape(r.addresses_from.replace("recorded:", "as recorded in ", 1))
        console.print(f"fidelity ({fid['kind']}) of {escape(setting_label(r.conf))} vs recording: {head}", soft_wrap=True)
        console.print(
            f"  segment events: {fid['events_simulated']} simulated / {fid['events_recorded']} recorded (addresses: {where})",
            soft_wrap=True,
        )
        for k, v in fid["stats"].items():
            console.print(f"  {k}: {v['simulated']} {'=' if v['recorded'] == v['simulated'] else '!='} {v['recorded']} recorded")
        if fid["context"]:
            console.print("  first difference:\n    " + fid["context"].replace("\n", "\n    "), markup=False)
