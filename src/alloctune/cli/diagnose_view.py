"""What `alloctune diagnose` prints: one OOM in full, many in groups, each message with --all, or JSON.

Kept apart from `cli/diagnose_cmd.py` so the command module only parses, calls
`diagnose.service.diagnose_input` and hands the answer here. Prose wraps; the lines a user copies
into a shell are printed unbroken (`markup=False, soft_wrap=True`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from alloctune.cli.common import console, print_json

if TYPE_CHECKING:
    from alloctune.diagnose.diagnosis import Diagnosis
    from alloctune.diagnose.fixes import Fix
    from alloctune.diagnose.groups import Group, LogSummary
    from alloctune.diagnose.scan import Found

_VERDICT_STYLE = {
    "fragmentation": "bold yellow",
    "borderline": "bold yellow",
    "cap": "bold magenta",
    "contention": "bold cyan",
    "shortage": "bold red",
    "unknown": "bold white",
}

# Groups a terminal shows (the largest): a multi-rank log can hold a thousand, which nobody reads
# there (and rendering them took longer than reading the log); --json and --all give every group.
SHOWN = 40


def message_sink(show_all: bool, json_out: bool) -> Callable[[Found, Diagnosis], None] | None:
    """How `--all` writes each message as the log is read: a JSON line each with --json, else one
    plain line; None without --all (then the service reads the log in parallel)."""
    if not show_all:
        return None
    if json_out:
        from alloctune.diagnose.groups import message_record

        def json_line(found: Found, d: Diagnosis) -> None:
            sys.stdout.write(json.dumps(message_record(found, d)) + "\n")

        return json_line

    def text_line(found: Found, d: Diagnosis) -> None:
        sys.stdout.write(message_line(found, d) + "\n")

    return text_line


def render_answer(kind: str, result: Any, *, json_out: bool, show_all: bool) -> None:
    """`diagnose_input`'s answer: JSON (the last of the JSON lines after --all's per-message ones),
    a snapshot's memory map, one diagnosis in full, or the summary of many."""
    if json_out:
        from alloctune.diagnose.service import diagnosis_json

        if show_all and kind == "log":  # JSON lines: the summary is the last one
            sys.stdout.write(json.dumps(diagnosis_json(kind, result)) + "\n")
        else:
            print_json(diagnosis_json(kind, result))
    elif kind == "snapshot":
        from alloctune.cli.render import print_items
        from alloctune.cli.views import snapshot_view

        print_items(console, snapshot_view(result))
    elif result.single is not None:
        render_diagnosis(result.single, 1, 1)
    else:
        render_summary(result, every=show_all)


def render_diagnosis(d: Diagnosis, index: int, count: int) -> None:
    """One diagnosis: verdict, evidence, ranked fixes with their shell forms, the fixes that will not work."""
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.text import Text

    from alloctune.cli.render import kv_table

    r = d.report
    where = [
        f"{r.vendor.upper()} {r.backend}",
        f"format {r.format}" + (f" (torch {r.torch_hint})" if r.torch_hint else ""),
        f"platform {d.platform}" if d.platform else "",
        f"seen {d.occurrences}x" if d.occurrences > 1 else "",
        "truncated" if r.truncated else "",
    ]
    head = Text.assemble(
        (d.verdict.upper(), _VERDICT_STYLE.get(d.verdict, "bold")),
        f" (+ {', '.join(d.contributing)})" if d.contributing else "",
        f": {d.reason}\n",
        (", ".join(x for x in where if x), "dim"),
    )
    console.print(Panel(head, title=f"OOM {index}/{count}" if count > 1 else "OOM", title_align="left"))
    if d.evidence:
        console.print(kv_table(((str(i), line) for i, line in enumerate(d.evidence, 1)), title="Evidence"))
    if d.working_fixes:
        console.print("[bold]Fixes[/bold] (best first)")
    for rank, f in enumerate(d.working_fixes, 1):
        requires = f" [dim](requires {escape(f.requires)})[/dim]" if f.requires else ""
        console.print(f"[bold]{rank}. {escape(f.title)}[/bold]" + requires)
        console.print(Padding(Text(f.why), (0, 0, 0, 3)))
        _print_fix_lines(f)
    if d.blocked_fixes:
        console.print("[bold]Will not work here[/bold]")
        for f in d.blocked_fixes:
            console.print(Padding(Text(f"- {f.title}: {f.why}"), (0, 0, 0, 2)))
    console.print()


def render_summary(summary: LogSummary, every: bool = False) -> None:
    """Many OOMs: one row per group (verdict, device/rank, request sizes), then each fix once with
    its shell lines (`diagnose.groups.shared_fixes`). Bounded by the groups, however many messages
    the log held; the `SHOWN` largest groups unless `every`, the others counted in one line."""
    from rich.padding import Padding
    from rich.text import Text

    from alloctune.cli.render import Col, table
    from alloctune.diagnose.groups import shared_fixes

    groups = summary.groups
    shown = groups if every else groups[:SHOWN]
    console.print(
        f"[bold]{summary.messages:,} out-of-memory messages[/bold] in {len(groups)} group(s) "
        "(verdict, device/rank, request size); every message: --all"
    )
    console.print(
        table(
            Col("#", justify="right", nowrap=True),
            "verdict",
            "where",
            Col("requests", nowrap=True),
            Col("count", justify="right", nowrap=True),
            Col("lines", nowrap=True),
            "worst case",
            "fix",
            rows=[_group_row(i, g) for i, g in enumerate(shown, 1)],
        )
    )
    if len(shown) < len(groups):
        rest = groups[len(shown) :]
        console.print(
            f"{len(rest):,} smaller group(s) with {sum(g.count for g in rest):,} message(s) not shown: "
            "--json or --all lists every group"
        )
    for shared in shared_fixes(groups):
        fix = shared.fix
        console.print(
            f"[bold]{escape(fix.title)}[/bold] [dim](group {', '.join(map(str, shared.groups))}; "
            f"from the message at line {shared.line})[/dim]"
        )
        console.print(Padding(Text(fix.why), (0, 0, 0, 3)))
        _print_fix_lines(fix)
    console.print()


def _group_row(position: int, g: Group) -> tuple[Any, ...]:
    """The summary table's row of one group: its worst case and the fix that covers it (and how many)."""
    from rich.text import Text

    from alloctune.units import format_size

    w = g.worst
    worst = f"line {g.worst_line}: {format_size(w.report.requested or 0)} requested" if w else ""
    if w is not None and w.shortfall:
        worst += f", {format_size(w.shortfall)} short"
    fix, _, covers = g.fix
    where = (
        " ".join(
            x for x in (f"GPU {g.device}" if g.device is not None else "", f"rank {g.rank}" if g.rank is not None else "") if x
        )
        or "-"
    )
    return (
        str(position),
        Text(g.verdict.upper(), style=_VERDICT_STYLE.get(g.verdict, "bold")),
        where,
        g.requests_text,
        f"{g.count:,}",
        f"{g.first_line:,}-{g.last_line:,}",
        worst,
        (fix.title + ("" if covers == g.count else f" ({covers:,} of {g.count:,})")) if fix else "-",
    )


def _print_fix_lines(fix: Fix) -> None:
    """A fix's lines to copy: per shell (and Python), then the command that checks it worked."""
    for shell, text in [*fix.shell_forms().items(), *([("python", fix.code)] if fix.code else [])]:
        console.print(f"   [dim]{shell}:[/dim]")
        for line in text.splitlines():
            console.print(f"     {line}", markup=False, soft_wrap=True)
    if fix.command:
        console.print("   check: " + fix.command, markup=False, soft_wrap=True)


def message_line(found: Found, d: Diagnosis) -> str:
    """`--all` at a terminal: one plain line per message."""
    from alloctune.units import format_size

    r = found.report
    parts = [f"line {found.line}:", d.verdict.upper()]
    if r.device is not None:
        parts.append(f"GPU {r.device}")
    if found.rank is not None:
        parts.append(f"rank {found.rank}")
    if r.requested is not None:
        parts.append(f"request {format_size(r.requested)}")
    if d.shortfall:
        parts.append(f"short {format_size(d.shortfall)}")
    return " ".join(parts) + f" - {d.reason}"
