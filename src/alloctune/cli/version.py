"""`alloctune version` (and `alloctune --version` in `cli/__init__.py`)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("version")
    def version(json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON.")) -> None:
        """Print the alloctune version (with --json: also Python's and the installed torch's, if any)."""
        from alloctune.api import installed_versions

        info = installed_versions()
        if json_out:
            from alloctune.cli.common import print_json

            print_json(info)
            return
        typer.echo(info["alloctune"])
