"""What `alloctune config check|knobs` print at a terminal (with --json the command prints the records).

Kept apart from `cli/config_cmd.py` so the command module only parses, calls `config` and
hands the result here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from alloctune.config.effective import SettingCheck
    from alloctune.config.knobs import Knob


def render_knobs(knobs: Sequence[Knob], torch: str | None) -> None:
    """Every knob in one table: name and aliases, default, torch versions, backend, effect, meaning."""
    from alloctune.cli.render import Col, FitTable, console

    table = FitTable(
        Col("knob"),
        Col("default"),
        Col("torch", nowrap=True),
        Col("honoured\nby"),
        Col("affects\nallocation"),
        Col("meaning"),
        title="Allocator knobs" + (f" accepted by torch {torch}" if torch else " (torch 2.0–2.15)"),
    )
    for k in knobs:
        name = k.name + "".join(f"\n(alias {a})" for a in k.aliases)
        table.add_row(name, k.default, k.versions(), k.honoured_by, "yes" if k.affects_allocation else "no", k.meaning)
    console.print(table)


def render_check(result: SettingCheck, shell: str) -> None:
    """The check as the terminal shows it: validity, effective values, warnings, the lines to set it in `shell`."""
    from rich.markup import escape

    from alloctune.cli.render import Col, FitTable, console
    from alloctune.config.effective import describe_roundup
    from alloctune.units import format_size

    console.print(f"[green]valid[/green] for torch {result.torch}: {result.input!r}", markup=True, soft_wrap=True)
    console.print(f"normalized: {result.normalized.format() or '(empty: all defaults)'}", markup=False, soft_wrap=True)

    def show(key: str, value: Any) -> str:
        if value is None:
            return "unlimited" if key == "max_split_size" else "-"
        if key == "roundup_power2_divisions":
            return describe_roundup(value)
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and key in ("max_split_size", "max_non_split_rounding", "large_segment_size")
        ):
            return format_size(value)
        return str(value)

    table = FitTable(Col("setting"), Col("value"), title="effective values")
    for key, value in result.effective.items():
        table.add_row(key, show(key, value))
    for key, value in result.config.other:
        if key != "throw_on_cudamalloc_oom":
            table.add_row(key, value)
    console.print(table)
    for w in result.warnings:
        color = {"error": "red", "warning": "yellow"}.get(w.severity, "cyan")
        console.print(f"[{color}]{w.severity}[/{color}] {escape(f'[{w.code}] {w.message}')}")
    if not result.warnings:
        console.print("no warnings")
    for knob in result.not_set:
        console.print(f"not setting {knob}: ignored on {result.platform}", markup=False)
    if result.shells:
        console.print(f"set it ({shell}):" if not result.not_set else f"set the rest ({shell}):")
        console.print(result.shells[shell], markup=False, soft_wrap=True)
    elif not result.not_set:
        console.print("nothing to set: unset PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF for the defaults")
