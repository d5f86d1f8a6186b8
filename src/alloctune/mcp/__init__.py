"""alloctune as an MCP server (`alloctune mcp`): its commands as tools an AI assistant calls.

`tools` holds the tools as plain functions (each returns what `alloctune <command> --json`
prints); `server` registers them with the `mcp` SDK, an optional extra imported only there,
so this package imports without it.
"""
