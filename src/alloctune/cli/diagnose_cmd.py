"""`alloctune diagnose [FILE|-]`: explain the OOM messages in a log and print fixes for four shells."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from alloctune.cli.common import console, print_json
from alloctune.errors import InputError

_VERDICT_STYLE = {
    "fragmentation": "bold yellow",
    "cap": "bold magenta",
    "contention": "bold cyan",
    "shortage": "bold red",
    "unknown": "bold white",
}


def read_input(source: Optional[str]) -> str:
    """The text to diagnose: a file, or stdin for `-` / no argument (UTF-8 or UTF-16; bad bytes replaced)."""
    if source is None or source == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise InputError("no input: give a file with the OOM message, or pipe the log into 'alloctune diagnose -'")
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    else:
        path = Path(source)
        if not path.exists():
            raise InputError(f"file not found: {source}")
        if path.is_dir():
            raise InputError(f"{source} is a directory: give the log file")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read {source}: {exc.strerror}") from None
    from alloctune.diagnose.text import decode_log

    return decode_log(data)  # UTF-16 logs from Windows PowerShell too


def render_diagnosis(d, index: int, count: int) -> None:
    """Rich view of one diagnosis: verdict, evidence, ranked fixes with their shell forms."""
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    r = d.report
    title = f"OOM {index}/{count}" if count > 1 else "OOM"
    where = ", ".join(
        x
        for x in (
            f"{r.vendor.upper()} {r.backend}",
            f"format {r.format}" + (f" (torch {r.torch_hint})" if r.torch_hint else ""),
            f"platform {d.platform}" if d.platform else None,
            f"seen {d.occurrences}x" if d.occurrences > 1 else None,
            "truncated" if r.truncated else None,
        )
        if x
    )
    head = Text()
    head.append(d.verdict.upper(), style=_VERDICT_STYLE.get(d.verdict, "bold"))
    if d.contributing:
        head.append(f" (+ {', '.join(d.contributing)})")
    head.append(f": {d.reason}\n")
    head.append(where, style="dim")
    console.print(Panel(head, title=title, title_align="left"))
    if d.evidence:
        t = Table(title="Evidence", show_header=False, title_justify="left", box=None, padding=(0, 1))
        t.add_column(style="dim")
        t.add_column()
        for i, line in enumerate(d.evidence, 1):
            t.add_row(str(i), line)
        console.print(t)
    working, blocked = d.working_fixes, d.blocked_fixes
    if working:
        console.print("[bold]Fixes[/bold] (best first)")
    for rank, f in enumerate(working, 1):
        console.print(f"[bold]{rank}. {f.title}[/bold]" + (f" [dim](requires {f.requires})[/dim]" if f.requires else ""))
        console.print(f"   {f.why}", markup=False, highlight=False)
        forms = f.shell_forms()
        for shell, text in forms.items():
            console.print(f"   [dim]{shell}:[/dim]")
            for line in text.splitlines():
                console.print(f"     {line}", markup=False, highlight=False)
        if f.code:
            console.print("   [dim]python:[/dim]")
            for line in f.code.splitlines():
                console.print(f"     {line}", markup=False, highlight=False)
        if f.command:
            console.print("   check: " + f.command, markup=False, highlight=False)
    if blocked:
        console.print("[bold]Will not work here[/bold]")
        for f in blocked:
            console.print(f"  - {f.title}: {f.why}", markup=False, highlight=False)
    console.print()


def register(app: typer.Typer) -> None:
    @app.command("diagnose")
    def diagnose(
        source: Optional[str] = typer.Argument(None, metavar="[FILE|-]", help="Log or message file; '-' or nothing reads stdin."),
        json_out: bool = typer.Option(False, "--json", help="Print a JSON list of diagnoses."),
        platform: Optional[str] = typer.Option(
            None, "--platform", help="linux | windows | wsl | macos (default: guessed from paths in the text)."
        ),
        snapshot: Optional[Path] = typer.Option(
            None, "--snapshot", help="Explain an OOM from a memory snapshot written at it (alloctune run --on-oom snapshot)."
        ),
        budget: Optional[str] = typer.Option(None, "--budget", help="With --snapshot: the per-process cap the run had."),
    ) -> None:
        """Explain CUDA/HIP/XPU/MPS/NPU out-of-memory messages found in a log, with fixes for bash, PowerShell, cmd and Python."""
        if snapshot is not None:
            from alloctune.cli.report_cmd import explain_snapshot

            explain_snapshot(snapshot, budget=budget, json_out=json_out)
            return
        from alloctune.diagnose import diagnose_all

        text = read_input(source)
        results = diagnose_all(text, platform.lower() if platform else None)
        if json_out:
            print_json(results)
            return
        for i, d in enumerate(results, 1):
            render_diagnosis(d, i, len(results))
