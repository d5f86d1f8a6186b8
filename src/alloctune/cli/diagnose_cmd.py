"""`alloctune diagnose [FILE|-]` / `--snapshot FILE`: explain OOMs (one in full, many in groups) and print fixes."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from alloctune.cli.common import console, print_json

_VERDICT_STYLE = {
    "fragmentation": "bold yellow",
    "borderline": "bold yellow",
    "cap": "bold magenta",
    "contention": "bold cyan",
    "shortage": "bold red",
    "unknown": "bold white",
}


def render_diagnosis(d, index: int, count: int) -> None:
    """Rich view of one diagnosis: verdict, evidence, ranked fixes with their shell forms.

    Prose wraps (indented); the lines to copy into a shell are printed unbroken."""
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.text import Text

    from alloctune.cli.render import kv_table

    r = d.report
    where = [f"{r.vendor.upper()} {r.backend}", f"format {r.format}" + (f" (torch {r.torch_hint})" if r.torch_hint else ""),
             f"platform {d.platform}" if d.platform else "", f"seen {d.occurrences}x" if d.occurrences > 1 else "",
             "truncated" if r.truncated else ""]
    head = Text.assemble((d.verdict.upper(), _VERDICT_STYLE.get(d.verdict, "bold")),
                         f" (+ {', '.join(d.contributing)})" if d.contributing else "", f": {d.reason}\n",
                         (", ".join(x for x in where if x), "dim"))
    console.print(Panel(head, title=f"OOM {index}/{count}" if count > 1 else "OOM", title_align="left"))
    if d.evidence:
        console.print(kv_table(((str(i), line) for i, line in enumerate(d.evidence, 1)), title="Evidence"))
    if d.working_fixes:
        console.print("[bold]Fixes[/bold] (best first)")
    for rank, f in enumerate(d.working_fixes, 1):
        requires = f" [dim](requires {escape(f.requires)})[/dim]" if f.requires else ""
        console.print(f"[bold]{rank}. {escape(f.title)}[/bold]" + requires)
        console.print(Padding(Text(f.why), (0, 0, 0, 3)))
        forms = [*f.shell_forms().items(), *([("python", f.code)] if f.code else [])]
        for shell, text in forms:
            console.print(f"   [dim]{shell}:[/dim]")
            for line in text.splitlines():
                console.print(f"     {line}", markup=False, soft_wrap=True)
        if f.command:
            console.print("   check: " + f.command, markup=False, soft_wrap=True)
    if d.blocked_fixes:
        console.print("[bold]Will not work here[/bold]")
        for f in d.blocked_fixes:
            console.print(Padding(Text(f"- {f.title}: {f.why}"), (0, 0, 0, 2)))
    console.print()


# Groups a terminal shows (the largest): a multi-rank log can hold a thousand, which nobody reads
# there (and rendering them took longer than reading the log); --json and --all give every group.
SHOWN = 40


def render_summary(summary, every: bool = False) -> None:
    """Many OOMs: one row per group (verdict, device/rank, request sizes), then each fix once with
    its shell lines. Bounded by the groups, however many messages the log held; the `SHOWN`
    largest groups unless `every`, the others counted in one line."""
    from rich.padding import Padding
    from rich.text import Text

    from alloctune.cli.render import Col, table
    from alloctune.diagnose.groups import FULL
    from alloctune.units import format_size

    groups = summary.groups
    shown = groups if every else groups[:SHOWN]
    rows = []
    for i, g in enumerate(shown, 1):
        w = g.worst
        worst = f"line {g.worst_line}: {format_size(w.report.requested or 0)} requested" if w else ""
        if w is not None and w.shortfall:
            worst += f", {format_size(w.shortfall)} short"
        fix, _, covers = g.fix
        where = " ".join(x for x in (f"GPU {g.device}" if g.device is not None else "",
                                     f"rank {g.rank}" if g.rank is not None else "") if x) or "-"
        rows.append((str(i), Text(g.verdict.upper(), style=_VERDICT_STYLE.get(g.verdict, "bold")), where,
                     g.requests_text, f"{g.count:,}", f"{g.first_line:,}-{g.last_line:,}", worst,
                     (fix.title + ("" if covers == g.count else f" ({covers:,} of {g.count:,})")) if fix else "-"))
    console.print(f"[bold]{summary.messages:,} out-of-memory messages[/bold] in {len(groups)} group(s) "
                  "(verdict, device/rank, request size); every message: --all")
    console.print(table(Col("#", justify="right", nowrap=True), "verdict", "where", Col("requests", nowrap=True),
                        Col("count", justify="right", nowrap=True), Col("lines", nowrap=True), "worst case",
                        "fix", rows=rows))
    if len(shown) < len(groups):
        rest = groups[len(shown):]
        console.print(f"{len(rest):,} smaller group(s) with {sum(g.count for g in rest):,} message(s) not shown: "
                      "--json or --all lists every group")
    seen: dict[tuple, list[int]] = {}
    fixes = {}
    for i, g in enumerate(groups[:FULL], 1):  # the largest groups' fixes, each once, with their shell lines
        fix, line, _ = g.fix
        if fix is not None:
            key = (fix.id, fix.title, fix.conf, fix.code, fix.command)
            seen.setdefault(key, []).append(i)
            fixes.setdefault(key, (fix, line))
    for key, members in seen.items():
        fix, line = fixes[key]
        console.print(f"[bold]{escape(fix.title)}[/bold] [dim](group {', '.join(map(str, members))}; "
                      f"from the message at line {line})[/dim]")
        console.print(Padding(Text(fix.why), (0, 0, 0, 3)))
        for shell, text in [*fix.shell_forms().items(), *([("python", fix.code)] if fix.code else [])]:
            console.print(f"   [dim]{shell}:[/dim]")
            for ln in text.splitlines():
                console.print(f"     {ln}", markup=False, soft_wrap=True)
        if fix.command:
            console.print("   check: " + fix.command, markup=False, soft_wrap=True)
    console.print()


def _message_line(found, d) -> str:
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


def register(app: typer.Typer) -> None:
    @app.command("diagnose")
    def diagnose(
        source: Optional[str] = typer.Argument(
            None, metavar="[FILE|-]",
            help="Log (plain or gz/xz/bz2), snapshot pickle, recording or compact trace; '-' or nothing reads stdin."),
        json_out: bool = typer.Option(False, "--json", help="Print the diagnoses as JSON."),
        show_all: bool = typer.Option(
            False, "--all", help="Every message, not only the groups (with --json: one JSON line each, then the summary)."),
        platform: Optional[str] = typer.Option(
            None, "--platform", metavar="OS", help="linux | windows | wsl | macos (default: guessed from paths in the text)."
        ),
        snapshot: Optional[Path] = typer.Option(
            None, "--snapshot", metavar="FILE",
            help="Explain an OOM from a memory snapshot written at it (alloctune run --on-oom snapshot).",
        ),
        budget: Optional[str] = typer.Option(
            None, "--budget", metavar="SIZE", help="With a snapshot: the per-process cap the run had, e.g. 6GiB."),
        device: Optional[int] = typer.Option(
            None, "--device", metavar="N", help="With a snapshot: the device whose history to read (default 0)."),
        oom: Optional[int] = typer.Option(
            None, "--oom", metavar="N", help="With a snapshot: which recorded OOM (0 = first, -1 = last, the default)."),
        no_what_if: bool = typer.Option(
            False, "--no-what-if", help="With a snapshot: skip replaying other settings in the simulator."),
    ) -> None:
        """Explain out-of-memory errors from a log, a memory snapshot or a trace, and print the fixes.

        Finds CUDA/HIP/XPU/MPS/NPU out-of-memory messages anywhere in a log, with fixes for bash,
        PowerShell, cmd and Python; many messages are summarised in groups. A snapshot (given as
        FILE or with --snapshot) is explained from its memory map."""
        import json
        import sys

        from alloctune.cli.render import err_console
        from alloctune.diagnose.service import diagnose_input
        from alloctune.progress import progress_on_stderr

        on_message = None
        if show_all and json_out:
            from alloctune.diagnose.groups import message_record

            def on_message(found, d) -> None:
                sys.stdout.write(json.dumps(message_record(found, d)) + "\n")
        elif show_all:
            def on_message(found, d) -> None:
                sys.stdout.write(_message_line(found, d) + "\n")

        with progress_on_stderr(quiet=json_out, console=err_console, after=2.0) as progress:
            kind, result = diagnose_input(source, snapshot=snapshot, platform=platform, budget=budget, device=device,
                                          oom=oom, what_if=not no_what_if, progress=progress, on_message=on_message)
        if json_out:
            from alloctune.diagnose.service import diagnosis_json

            if show_all and kind == "log":  # JSON lines: the summary is the last one
                sys.stdout.write(json.dumps(diagnosis_json(kind, result)) + "\n")
            else:
                print_json(diagnosis_json(kind, result))
        elif kind == "snapshot":
            from alloctune.cli.views import snapshot_view

            console.print(*snapshot_view(result))
        elif result.single is not None:
            render_diagnosis(result.single, 1, 1)
        else:
            render_summary(result, every=show_all)

    @app.command("diagnose-snapshot", hidden=True, add_help_option=False,
                 context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    def diagnose_snapshot_retired(ctx: typer.Context) -> None:
        """Retired: use `alloctune diagnose --snapshot FILE`."""
        from alloctune.errors import InputError

        raise InputError("'diagnose-snapshot' is retired: use 'alloctune diagnose --snapshot FILE' (same options)")
