"""`alloctune run -- CMD ...`: one trial of the user's command under a setting and a budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import typer

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
            None, "--timeout", metavar="SECONDS", help="Kill the command (its whole group) after S s."),
        no_grad: bool = typer.Option(
            False, "--no-grad",
            help="Run the program with autograd off (measures what torch.no_grad() would save an inference "
            "program; a program that trains will fail)."),
        cudnn_benchmark: Optional[str] = typer.Option(
            None, "--cudnn-benchmark", metavar="on|off",
            help="Set torch.backends.cudnn.benchmark at torch import (measures what the cuDNN switch changes; "
            "a program that sets it itself keeps its own)."),
        checkpointing: bool = typer.Option(
            False, "--checkpointing",
            help="Switch activation checkpointing on in the first model the program trains (transformers, timm, "
            "or torch.utils.checkpoint around repeated blocks): measures what checkpointing would save."),
        json_out: bool = typer.Option(False, "--json", help="Print the trial as JSON (the command's stdout goes to stderr)."),
    ) -> None:
        """Run a command with the agent inside: budget, optional history, a report of what the allocator did.

        Exits with the command's exit code (124 at the timeout); no CUDA in the command, a
        budget larger than the card or a missing command are one-line errors (exit 2).
        """
        from alloctune.errors import InputError
        from alloctune.run.runner import raise_for_environment, run_trial
        from alloctune.units import parse_seconds, parse_user_size

        cap = parse_user_size(budget, "--budget") if budget is not None else None
        if on_oom not in (None, "snapshot"):
            raise InputError(f"--on-oom {on_oom!r} is not known: use --on-oom snapshot")
        timeout = parse_seconds(timeout, "--timeout")
        switch = {None: None, "on": True, "off": False}.get(cudnn_benchmark.lower() if cudnn_benchmark else None, "?")
        if switch == "?":
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
            cudnn_benchmark=switch,
            checkpointing=checkpointing,
        )
        raise_for_environment(result)
        if json_out:
            from alloctune.cli.common import print_json
            from alloctune.run.trial import trial_json

            print_json(trial_json(result))
        else:
            render_trial(result)
        for w in result.warnings:
            from alloctune.cli.common import warn

            warn(f"the setting did not take effect as asked: {w}")
        if result.outcome == "timeout":
            raise typer.Exit(TIMEOUT_EXIT)
        code = result.exit_code or 0
        if code < 0:  # killed by a signal: the shell convention
            code = 128 - code
        raise typer.Exit(code)


def _fmt(n: Optional[int]) -> str:
    from alloctune.units import format_mib

    return "-" if n is None else format_mib(n)


def render_trial(result: Any) -> None:
    """The run summary on stderr (stdout belongs to the command)."""
    from rich.text import Text

    from alloctune.cli.render import err_console, kv_table

    colour = {"ok": "green", "oom": "red", "crash": "red", "timeout": "yellow"}.get(result.outcome, "white")
    t = kv_table([])
    t.add_row("outcome", Text.assemble((result.outcome, colour), f" (exit code {result.exit_code})"))
    t.add_row("setting", result.conf if result.conf else ("(default)" if result.conf == "" else "(inherited)"))
    if result.allocator_settings:
        seen = result.allocator_settings.get("PYTORCH_CUDA_ALLOC_CONF")
        t.add_row("allocator ran with", repr(seen) if seen is not None else "?")
    t.add_row("budget", _fmt(result.budget) if result.budget is not None else "whole card")
    if result.device_name:
        t.add_row("device", f"{result.device_name} ({_fmt(result.total_memory)}), torch {result.torch_version}")
    t.add_row("peak reserved", _fmt(result.peak_reserved))
    t.add_row("peak allocated", _fmt(result.peak_allocated))
    if result.utilization is not None:
        t.add_row("utilization", f"{result.utilization:.1%} (peak allocated / peak reserved)")
    t.add_row("alloc retries / OOMs", f"{result.num_alloc_retries if result.num_alloc_retries is not None else '-'} / "
              f"{result.num_ooms if result.num_ooms is not None else '-'}")
    t.add_row("wall time", f"{result.wall_s:.1f} s")
    if result.throughput is not None:
        t.add_row("throughput", f"{result.throughput:g} {result.throughput_unit or ''}".rstrip())
    if result.oom_message:
        t.add_row("OOM", result.oom_message.splitlines()[0])
    if result.outcome == "crash" and result.error:
        t.add_row("error", result.error)
    if result.snapshot:
        t.add_row("history", result.snapshot)
    if result.oom_snapshot:
        import shlex

        t.add_row("OOM snapshot", result.oom_snapshot)
        # the snapshot carries the budget: diagnosing it needs no flag
        t.add_row("next", f"alloctune diagnose --snapshot {shlex.quote(str(result.oom_snapshot))}")
    if result.no_grad:
        t.add_row("autograd", "switched off by the agent (--no-grad)")
    elif result.autograd is not None:
        a = result.autograd
        line = (f"{a.get('module_calls_with_grad', 0)} module calls with grad, "
                f"{a.get('module_calls_without_grad', 0)} without, {a.get('backward_calls', 0)} backward")
        if result.inference_with_grad:
            line += ("; nothing ran backward, so the activations autograd kept were never needed: "
                     "torch.no_grad() would free them (measure it: alloctune run --no-grad ...)")
        t.add_row("autograd", line)
    if result.cudnn_benchmark_set is not None:
        held = result.cudnn_benchmark == result.cudnn_benchmark_set
        t.add_row("cudnn.benchmark", f"set to {result.cudnn_benchmark_set} by the agent (--cudnn-benchmark)"
                  + ("" if held else f"; the program set it back to {result.cudnn_benchmark} itself"))
    if result.processes > 1:
        t.add_row("processes", f"{result.processes} (figures from the one with the highest peak reserved)")
    err_console.print(t)
