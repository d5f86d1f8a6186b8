"""`alloctune config check|knobs`: validate an allocator setting for a torch release, list the knobs."""

from __future__ import annotations

from typing import Optional

import typer

_SHELLS = ("bash", "powershell", "cmd", "python")


def register(app: typer.Typer) -> None:
    config_app = typer.Typer(
        help="Check PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF strings; list every allocator knob.",
        no_args_is_help=True,
    )
    app.add_typer(config_app, name="config")

    @config_app.command("check")
    def check_cmd(
        setting: str = typer.Argument(..., help='The allocator string, e.g. "expandable_segments:True" ("" = defaults).'),
        torch: str = typer.Option("2.11", "--torch", help="Target torch release (2.0–2.15), e.g. 2.11 or 2.11.0+cu130."),
        platform: str = typer.Option("linux", "--platform", help="linux or windows."),
        fraction: Optional[float] = typer.Option(
            None, "--fraction", help="Per-process memory fraction the program sets (0–1), if any."),
        card: Optional[str] = typer.Option(None, "--card", help="Device memory, e.g. 80GiB (enables size checks)."),
        largest_segment: Optional[str] = typer.Option(
            None, "--largest-segment", help="Largest segment the workload makes, e.g. 2GiB (from `trace info`)."),
        var: Optional[str] = typer.Option(
            None, "--var", help="The variable the setting goes in (PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF)."),
        shell: str = typer.Option("bash", "--shell", help="Shell for the env lines: bash, powershell, cmd, python."),
        json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    ) -> None:
        """Validate SETTING like torch would, show the effective values, inert knobs and the env lines."""
        from alloctune.config.checks import check
        from alloctune.config.model import AllocatorConfig
        from alloctune.config.versions import format_version, parse_torch_version
        from alloctune.errors import InputError
        from alloctune.units import parse_size

        version = parse_torch_version(torch)
        if fraction is not None and not 0 <= fraction <= 1:
            raise InputError(f"--fraction must be between 0 and 1, got {fraction}")
        if shell not in _SHELLS:
            raise InputError(f"unknown shell {shell!r}: use one of {', '.join(_SHELLS)}")
        card_bytes = parse_size(card) if card is not None else None
        largest = parse_size(largest_segment) if largest_segment is not None else None
        config = AllocatorConfig.parse(setting, version)  # malformed → ConfigError → one line, exit 2
        warnings = check(setting, version, platform=platform, fraction=fraction, card=card_bytes,
                         largest_segment=largest, env_var=var)
        normalized = config.normalized()
        effective = effective_values(config, version)
        env = env_lines(normalized.format(), version)
        if json_out:
            from alloctune.cli.common import print_json

            print_json({
                "schema": 1,
                "input": setting,
                "torch": format_version(version),
                "platform": platform,
                "valid": True,
                "canonical": config.format(),
                "normalized": normalized.format(),
                "config": config.to_dict(),
                "effective": effective,
                "roundup_table": list(config.roundup_table(format_version(version))),
                "warnings": [w.to_dict() for w in warnings],
                "env": env["vars"],
                "shell": env["shells"],
            })
            return
        _render_check(setting, config, normalized, effective, warnings, env, shell, format_version(version))

    @config_app.command("knobs")
    def knobs_cmd(
        torch: Optional[str] = typer.Option(None, "--torch", help="Only the knobs this torch release accepts."),
        json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    ) -> None:
        """Every allocator knob of torch 2.0–2.15: meaning, default, versions, backend, effect on allocation."""
        from alloctune.config.knobs import knobs_for
        from alloctune.config.versions import parse_torch_version

        version = parse_torch_version(torch) if torch else None
        knobs = knobs_for(version)
        if json_out:
            from alloctune.cli.common import print_json

            print_json({"schema": 1, "torch": torch, "knobs": [k.to_dict() for k in knobs]})
            return
        from alloctune.cli.render import Col, FitTable, console

        table = FitTable(Col("knob"), Col("default"), Col("torch", nowrap=True), Col("honoured\nby"),
                         Col("affects\nallocation"), Col("meaning"),
                         title="Allocator knobs" + (f" accepted by torch {torch}" if torch else " (torch 2.0–2.15)"))
        for k in knobs:
            name = k.name + "".join(f"\n(alias {a})" for a in k.aliases)
            table.add_row(name, k.default, k.versions(), k.honoured_by, "yes" if k.affects_allocation else "no",
                          k.meaning)
        console.print(table)


def effective_values(config, version) -> dict:
    """What the allocator will use for each allocation-relevant knob (bytes as ints)."""
    from alloctune.config.versions import format_version

    v = format_version(version)
    out = {
        "backend": config.backend,
        "max_split_size": config.max_split_size,
        "garbage_collection_threshold": config.garbage_collection_threshold,
        "expandable_segments": config.expandable_segments,
        "roundup_power2_divisions": list(config.roundup_table(v)),
    }
    if version >= (2, 6):
        out["max_non_split_rounding"] = config.effective_max_non_split_rounding(version)
    if version >= (2, 10):
        out["per_process_memory_fraction"] = (
            1.0 if config.per_process_memory_fraction is None else config.per_process_memory_fraction)
    if version >= (2, 11):
        out["large_segment_size"] = config.effective_large_segment_size(version)
    if version >= (2, 12):
        out["throw_on_cudamalloc_oom"] = config.throw_on_cudamalloc_oom
    return out


def env_lines(text: str, version) -> dict:
    """The variables to set and their lines per shell (the diagnose helper's `shells` when present)."""
    from alloctune.config.model import ENV_VARS

    if not text:
        return {"vars": {}, "shells": {}}
    try:
        from alloctune import shells as sh

        assignments = sh.env_assignments(text, version)
        return {"vars": dict(assignments), "shells": sh.render_all(assignments)}
    except ImportError:  # pragma: no cover - only while the shells module is missing
        variables = {var: text for var in (ENV_VARS if version >= (2, 10) else ENV_VARS[:1])}
        plain = "\n".join(f"{k}={v}" for k, v in variables.items())
        return {"vars": variables, "shells": {s: plain for s in _SHELLS}}


def _render_check(setting, config, normalized, effective, warnings, env, shell, v) -> None:
    from rich.markup import escape
    from rich.table import Table

    from alloctune.cli.common import console
    from alloctune.units import format_mib

    console.print(f"[green]valid[/green] for torch {v}: {setting!r}", soft_wrap=True)
    console.print(f"normalized: {normalized.format() or '(empty: all defaults)'}", markup=False, soft_wrap=True)

    def show(key, value):
        if value is None:
            return "unlimited" if key == "max_split_size" else "-"
        if key == "roundup_power2_divisions":
            return _roundup_text(value)
        if isinstance(value, bool):
            return str(value)
        if isinstance(value, int) and key in ("max_split_size", "max_non_split_rounding", "large_segment_size"):
            return format_mib(value)
        return str(value)

    table = Table(title="effective values")
    table.add_column("setting")
    table.add_column("value", overflow="fold")
    for key, value in effective.items():
        table.add_row(key, show(key, value))
    for key, value in config.other:
        if key != "throw_on_cudamalloc_oom":
            table.add_row(key, value)
    console.print(table)
    if warnings:
        for w in warnings:
            color = {"error": "red", "warning": "yellow"}.get(w.severity, "cyan")
            console.print(f"[{color}]{w.severity}[/{color}] {escape(f'[{w.code}] {w.message}')}", soft_wrap=True)
    else:
        console.print("no warnings")
    if env["shells"]:
        console.print(f"set it ({shell}):")
        console.print(env["shells"][shell], markup=False, soft_wrap=True)
    else:
        console.print("nothing to set: unset PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF for the defaults")


def _roundup_text(table) -> str:
    """Runs of the 16-bucket table, one per line: `0–512MiB: off`, `512MiB–1GiB: 2`, ..."""
    if not any(table):
        return "off"

    def size(i: int) -> str:
        return f"{1 << i}MiB" if i < 10 else f"{1 << (i - 10)}GiB"

    runs, start = [], 0
    for i in range(1, len(table) + 1):
        if i == len(table) or table[i] != table[start]:
            lo = "0" if start == 0 else size(start)
            hi = "∞" if i == len(table) else size(i)
            runs.append(f"{lo}–{hi}: {table[start] or 'off'}")
            start = i
    return "\n".join(runs)
