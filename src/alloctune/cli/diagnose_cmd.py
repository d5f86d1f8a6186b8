"""`alloctune diagnose [FILE|-]` / `--snapshot FILE`: explain OOMs (one in full, many in groups) and print fixes.

Parses, calls `alloctune.diagnose.service.diagnose_input`, renders through `cli/diagnose_view.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from alloctune.cli.diagnose_view import SHOWN

__all__ = ["SHOWN", "register"]  # SHOWN: how many groups the command shows at a terminal


def register(app: typer.Typer) -> None:
    @app.command("diagnose")
    def diagnose(
        source: Optional[str] = typer.Argument(
            None,
            metavar="[FILE|-]",
            help="Log (plain or gz/xz/bz2), snapshot pickle, recording or compact trace; '-' or nothing reads stdin.",
        ),
        json_out: bool = typer.Option(False, "--json", help="Print the diagnoses as JSON."),
        show_all: bool = typer.Option(
            False, "--all", help="Every message, not only the groups (with --json: one JSON line each, then the summary)."
        ),
        platform: Optional[str] = typer.Option(
            None, "--platform", metavar="OS", help="linux | windows | wsl | macos (default: guessed from paths in the text)."
        ),
        snapshot: Optional[Path] = typer.Option(
            None,
            "--snapshot",
            metavar="FILE",
            help="Explain an OOM from a memory snapshot written at it (alloctune run --on-oom snapshot).",
        ),
        budget: Optional[str] = typer.Option(
            None, "--budget", metavar="SIZE", help="With a snapshot: the per-process cap the run had, e.g. 6GiB."
        ),
        device: Optional[int] = typer.Option(
            None, "--device", metavar="N", help="With a snapshot: the device whose history to read (default 0)."
        ),
        oom: Optional[int] = typer.Option(
            None, "--oom", metavar="N", help="With a snapshot: which recorded OOM (0 = first, -1 = last, the default)."
        ),
        no_what_if: bool = typer.Option(
            False, "--no-what-if", help="With a snapshot: skip replaying other settings in the simulator."
        ),
    ) -> None:
        """Explain out-of-memory errors from a log, a memory snapshot or a trace, and print the fixes.

        Finds CUDA/HIP/XPU/MPS/NPU out-of-memory messages anywhere in a log, with fixes for bash, PowerShell, cmd and Python.

        Many messages are summarised in groups. A snapshot (given as FILE or with --snapshot) is explained from its memory map."""
        from alloctune.cli.diagnose_view import message_sink, render_answer
        from alloctune.cli.render import err_console
        from alloctune.diagnose.service import diagnose_input
        from alloctune.progress import progress_on_stderr

        with progress_on_stderr(quiet=json_out, console=err_console, after=2.0) as progress:
            kind, result = diagnose_input(
                source,
                snapshot=snapshot,
                platform=platform,
                budget=budget,
                device=device,
                oom=oom,
                what_if=not no_what_if,
                progress=progress,
                on_message=message_sink(show_all, json_out),
            )
        render_answer(kind, result, json_out=json_out, show_all=show_all)

    @app.command(
        "diagnose-snapshot",
        hidden=True,
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    def diagnose_snapshot_retired(ctx: typer.Context) -> None:
        """Retired: use `alloctune diagnose --snapshot FILE`."""
        from alloctune.errors import InputError

        raise InputError("'diagnose-snapshot' is retired: use 'alloctune diagnose --snapshot FILE' (same options)")
