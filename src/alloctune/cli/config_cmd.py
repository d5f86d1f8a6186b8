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
        platform: str = typer.Option(
            "linux", "--platform", help="linux, windows, wsl (checked as linux) or macos (no CUDA: no setting applies)."
        ),
        fraction: Optional[float] = typer.Option(
            None, "--fraction", help="Per-process memory fraction the program sets (0–1), if any."
        ),
        card: Optional[str] = typer.Option(None, "--card", help="Device memory, e.g. 80GiB (enables size checks)."),
        largest_segment: Optional[str] = typer.Option(
            None, "--largest-segment", help="Largest segment the workload makes, e.g. 2GiB (from `trace info`)."
        ),
        var: Optional[str] = typer.Option(
            None, "--var", help="The variable the setting goes in (PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF)."
        ),
        shell: str = typer.Option("bash", "--shell", help="Shell for the env lines: bash, powershell, cmd, python."),
        json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    ) -> None:
        """Validate SETTING like torch would, show the effective values, inert knobs and the env lines."""
        from alloctune.cli.config_view import render_check
        from alloctune.config.effective import check_setting
        from alloctune.errors import InputError

        if shell not in _SHELLS:
            raise InputError(f"unknown shell {shell!r}: use one of {', '.join(_SHELLS)}")
        result = check_setting(
            setting, torch, platform=platform, fraction=fraction, card=card, largest_segment=largest_segment, env_var=var
        )
        if json_out:
            from alloctune.cli.common import print_json

            print_json(result)
            return
        render_check(result, shell)

    @config_app.command("knobs")
    def knobs_cmd(
        torch: Optional[str] = typer.Option(None, "--torch", help="Only the knobs this torch release accepts."),
        json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    ) -> None:
        """Every allocator knob of torch 2.0–2.15: meaning, default, versions, backend, effect on allocation."""
        from alloctune.cli.config_view import render_knobs
        from alloctune.config.knobs import knobs_for
        from alloctune.config.versions import parse_torch_version

        version = parse_torch_version(torch) if torch else None
        knobs = knobs_for(version)
        if json_out:
            from alloctune.cli.common import print_json
            from alloctune.schema import with_schema

            print_json(with_schema("config-knobs", {"torch": torch, "knobs": [k.to_dict() for k in knobs]}))
            return
        render_knobs(knobs, torch)
