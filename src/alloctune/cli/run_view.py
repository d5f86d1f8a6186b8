"""What `alloctune run` prints: the trial as JSON on stdout, or its summary table on stderr.

Kept apart from `cli/run_cmd.py` so the command module only parses, calls `run.runner.run_trial`
and hands the trial here. The table goes to stderr because stdout belongs to the command that ran;
with --json the command's own output is sent to stderr instead, so stdout is JSON alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alloctune.run.trial import TrialResult


def render_run(result: TrialResult, *, json_out: bool) -> None:
    """The trial (JSON or the table), then one warning per setting that did not take effect as asked."""
    from alloctune.cli.common import print_json, warn

    if json_out:
        from alloctune.run.trial import trial_json

        print_json(trial_json(result))
    else:
        render_trial(result)
    for w in result.warnings:
        warn(f"the setting did not take effect as asked: {w}")


def _fmt(n: int | None) -> str:
    from alloctune.units import format_size

    return "-" if n is None else format_size(n)


def render_trial(result: TrialResult) -> None:
    """The run summary on stderr (stdout belongs to the command): outcome, setting as applied and as
    read back, peaks, retries, and what the agent's switches (autograd, cuDNN) found."""
    from rich.text import Text

    from alloctune.cli.render import err_console, kv_table
    from alloctune.units import format_percent

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
        t.add_row("utilization", f"{format_percent(result.utilization)} (peak allocated / peak reserved)")
    t.add_row(
        "alloc retries / OOMs",
        f"{result.num_alloc_retries if result.num_alloc_retries is not None else '-'} / "
        f"{result.num_ooms if result.num_ooms is not None else '-'}",
    )
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
        t.add_row("OOM snapshot", result.oom_snapshot)
    autograd = _autograd_line(result)
    if autograd is not None:
        t.add_row("autograd", autograd)
    if result.cudnn_benchmark_set is not None:
        held = result.cudnn_benchmark == result.cudnn_benchmark_set
        t.add_row(
            "cudnn.benchmark",
            f"set to {result.cudnn_benchmark_set} by the agent (--cudnn-benchmark)"
            + ("" if held else f"; the program set it back to {result.cudnn_benchmark} itself"),
        )
    if result.processes > 1:
        t.add_row("processes", f"{result.processes} (figures from the one with the highest peak reserved)")
    err_console.print(t)
    if result.oom_snapshot:
        import shlex

        # the command to copy, outside the table (a cell would wrap it); the snapshot carries the budget,
        # so diagnosing it needs no flag
        err_console.print("[bold]next:[/bold]")
        err_console.print(
            f"  alloctune diagnose --snapshot {shlex.quote(str(result.oom_snapshot))}", markup=False, soft_wrap=True
        )


def _autograd_line(result: TrialResult) -> str | None:
    """What autograd did in the run (None when the agent did not count it): switched off by --no-grad,
    or the module calls with and without grad and the backward passes, with what no_grad would save."""
    if result.no_grad:
        return "switched off by the agent (--no-grad)"
    if result.autograd is None:
        return None
    a = result.autograd
    line = (
        f"{a.get('module_calls_with_grad', 0)} module calls with grad, "
        f"{a.get('module_calls_without_grad', 0)} without, {a.get('backward_calls', 0)} backward"
    )
    if result.inference_with_grad:
        line += (
            "; nothing ran backward, so the activations autograd kept were never needed: "
            "torch.no_grad() would free them (measure it: alloctune run --no-grad ...)"
        )
    return line
