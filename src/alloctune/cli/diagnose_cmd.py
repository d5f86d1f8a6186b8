"""`alloctune diagnose [FILE|-]` / `--snapshot FILE`: explain an OOM and print fixes for four shells."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rich.markup import escape

from alloctune.cli.common import console, print_json

_VERDICT_STYLE = {
    "fragmentation": "bold yellow",
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
        console.print(f"[bold]{rank}. {escape(f.title)}[/bold]" + (f" [dim](requires {escape(f.requires)})[/dim]" if f.requires else ""))
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


def register(app: typer.Typer) -> None:
    @app.command("diagnose")
    def diagnose(
        source: Optional[str] = typer.Argument(None, metavar="[FILE|-]", help="Log or message file; '-' or nothing reads stdin."),
        json_out: bool = typer.Option(False, "--json", help="Print the diagnoses as JSON."),
        platform: Optional[str] = typer.Option(
            None, "--platform", metavar="OS", help="linux | windows | wsl | macos (default: guessed from paths in the text)."
        ),
        snapshot: Optional[Path] = typer.Option(
            None, "--snapshot", metavar="FILE",
            help="Explain an OOM from a memory snapshot written at it (alloctune run --on-oom snapshot).",
        ),
        budget: Optional[str] = typer.Option(
            None, "--budget", metavar="SIZE", help="With --snapshot: the per-process cap the run had, e.g. 6GiB."),
        device: Optional[int] = typer.Option(
            None, "--device", metavar="N", help="With --snapshot: the device whose history to read (default 0)."),
        oom: Optional[int] = typer.Option(
            None, "--oom", metavar="N", help="With --snapshot: which recorded OOM (0 = first, -1 = last, the default)."),
        no_what_if: bool = typer.Option(
            False, "--no-what-if", help="With --snapshot: skip replaying other settings in the simulator."),
    ) -> None:
        """Explain an out-of-memory error from a log (or --snapshot FILE) and print the fixes.

        Finds CUDA/HIP/XPU/MPS/NPU out-of-memory messages in a log, with fixes for bash,
        PowerShell, cmd and Python; with --snapshot, explains the OOM recorded in a memory snapshot."""
        from alloctune.cli.progress import progress_on_stderr
        from alloctune.diagnosis import diagnose_input

        with progress_on_stderr(quiet=json_out or snapshot is None) as progress:  # logs are read at once
            kind, result = diagnose_input(source, snapshot=snapshot, platform=platform, budget=budget, device=device,
                                          oom=oom, what_if=not no_what_if, progress=progress)
        if json_out:
            from alloctune.schema import with_schema

            print_json(result.to_dict(with_map=False) if kind == "snapshot" else with_schema("diagnose", {"diagnoses": result}))
        elif kind == "snapshot":
            from alloctune.cli.views import snapshot_view

            console.print(*snapshot_view(result))
        else:
            for i, d in enumerate(result, 1):
                render_diagnosis(d, i, len(result))

    @app.command("diagnose-snapshot", hidden=True, add_help_option=False,
                 context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    def diagnose_snapshot_retired(ctx: typer.Context) -> None:
        """Retired: use `alloctune diagnose --snapshot FILE`."""
        from alloctune.errors import InputError

        raise InputError("'diagnose-snapshot' is retired: use 'alloctune diagnose --snapshot FILE' (same options)")
