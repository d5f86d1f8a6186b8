"""`alloctune mcp`: serve alloctune's tools to an AI assistant over MCP (stdio).

The server is `alloctune.mcp.server`; this module only starts it, or lists its tools, so an
install can be checked without an assistant.
"""

from __future__ import annotations

import inspect

import typer


def _tool_rows() -> list[dict[str, object]]:
    """Name, first docstring line and whether confirm is needed, for each tool."""
    from alloctune.mcp.tools import GPU_TOOLS, TOOLS

    return [
        {
            "name": t.__name__,
            "summary": (inspect.getdoc(t) or "").split("\n\n")[0].replace("\n", " "),
            "needs_confirm": t.__name__ in GPU_TOOLS,
        }
        for t in TOOLS
    ]


def register(app: typer.Typer) -> None:
    @app.command("mcp")
    def mcp(
        list_tools: bool = typer.Option(False, "--list", help="List the tools and exit instead of serving."),
        json_out: bool = typer.Option(False, "--json", help="With --list: print the tools as JSON."),
    ) -> None:
        # help is rich markup: `\\[` prints a `[` (a bare `[mcp]` would vanish as a tag)
        """Serve diagnose, explain, simulate, plan, config check (and, with confirm, tune and run) as MCP tools on stdio.

        For an assistant such as Claude Desktop or Claude Code. Each tool answers the JSON its command prints with --json.

        Needs the extra: pip install 'alloctune\\[mcp]'

        Register it with: claude mcp add alloctune -- alloctune mcp"""
        if json_out and not list_tools:
            from alloctune.errors import InputError

            raise InputError("--json goes with --list: the server itself speaks JSON-RPC on stdout")
        if not list_tools:
            from alloctune.mcp.server import serve

            serve()
            return
        rows = _tool_rows()
        if json_out:
            from alloctune.cli.common import print_json
            from alloctune.schema import with_schema

            print_json(with_schema("mcp-tools", {"tools": rows}))
            return
        from alloctune.cli.render import Col, FitTable, console

        table = FitTable(
            Col("tool", nowrap=True), Col("confirm", nowrap=True), Col("what it answers"), title="MCP tools (alloctune mcp)"
        )
        for row in rows:
            table.add_row(str(row["name"]), "yes" if row["needs_confirm"] else "-", str(row["summary"]))
        console.print(table)
