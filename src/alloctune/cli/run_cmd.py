"""`alloctune run -- CMD ...`: one trial of the user's command under a setting and a budget.

Parses, calls `alloctune.run.runner.run_trial`, renders through `cli/run_view.py`, and exits with
the command's own status.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from alloctune.cli.run_view import render_run, render_trial

if TYPE_CHECKING:
    from alloctune.run.trial import TrialResult

# render_trial: the summary table this command prints, for callers that render a finished trial
__all__ = ["TIMEOUT_EXIT", "exit_status", "register", "render_trial"]

TIMEOUT_EXIT = 124  # like coreutils `timeout`


def register(app: typer.Typer) -> None:
    @app.command(
        "run",
        context_settings={"allow_interspersed_args": False},
        no_args_is_help=True,
    )
    def run(
        command: List[str] = typer.Argument(..., help="The command to run, after `--`.", metavar="-- CMD [ARGS]..."),
        conf: Optional[str] = typer.Option(
            None, "--conf", help="Allocator setting for the command, e.g. expandable_segments:True ('' = default)."
        ),
        budget: Optional[str] = typer.Option(
            None, "--budget", metavar="SIZE", help="Per-process GPU memory cap, e.g. 6GiB (applied at CUDA init)."
        ),
        record: Optional[Path] = typer.Option(
            None, "--record", help="Record the allocator history into this snapshot file (.pickle, .gz, .xz)."
        ),
        on_oom: Optional[str] = typer.Option(
            None, "--on-oom", help="'snapshot': keep a bounded history and dump it when the allocator runs out."
        ),
        timeout: Optional[float] = typer.Option(
            None, "--timeout", metavar="SECONDS", help="Kill the command (its whole group) after S s."
        ),
        no_grad: bool = typer.Option(
            False,
            "--no-grad",
            help="Run the program with autograd off (measures what torch.no_grad() would save an inference "
            "program; a program that trains will fail).",
        ),
        cudnn_benchmark: Optional[str] = typer.Option(
            None,
            "--cudnn-benchmark",
            metavar="on|off",
            help="Set torch.backends.cudnn.benchmark at torch import (measures what the cuDNN switch changes; "
            "a program that sets it itself keeps its own).",
        ),
        checkpointing: bool = typer.Option(
            False,
            "--checkpointing",
            help="Switch activation checkpointing on in the first model the program trains (transformers, timm, "
            "or torch.utils.checkpoint around repeated blocks): measures what checkpointing would save.",
        ),
        json_out: bool = typer.Option(False, "--json", help="Print the trial as JSON (the command's stdout goes to stderr)."),
    ) -> None:
        """Run a command with the agent inside: budget, optional history, a report of what the allocator did.

        Exits with the command's exit code (124 at the timeout).

        No CUDA in the command, a budget larger than the card or a missing command are one-line errors (exit 2).
        """
        from alloctune.errors import InputError
        from alloctune.run.runner import raise_for_environment, run_trial
        from alloctune.units import parse_seconds, parse_user_size

        cap = parse_user_size(budget, "--budget") if budget is not None else None
        if on_oom not in (None, "snapshot"):
            raise InputError(f"--on-oom {on_oom!r} is not known: use --on-oom snapshot")
        timeout = parse_seconds(timeout, "--timeout")
        switches: dict[str | None, bool | None] = {None: None, "on": True, "off": False}
        asked = cudnn_benchmark.lower() if cudnn_benchmark else None
        if asked not in switches:
            raise InputError(f"--cudnn-benchmark {cudnn_benchmark!r} is not known: use on or off")
        result = run_trial(
            command,
            conf=conf,
            budget=cap,
            record=record,
            on_oom=on_oom,
            timeout=timeout,
            stdout_to_stderr=json_out,
            no_grad=no_grad,
            cudnn_benchmark=switches[asked],
            checkpointing=checkpointing,
        )
        raise_for_environment(result)
        render_run(result, json_out=json_out)
        raise typer.Exit(exit_status(result))


def exit_status(result: TrialResult) -> int:
    """The command's exit code as `alloctune run` returns it: `TIMEOUT_EXIT` at the timeout, 128 + N
    for a command killed by signal N (the shell convention), else the command's own (0 if none)."""
    if result.outcome == "timeout":
        return TIMEOUT_EXIT
    code = result.exit_code or 0
    return 128 - code if code < 0 else code
