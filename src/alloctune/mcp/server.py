"""The MCP server: the functions of `alloctune.mcp.tools`, registered as tools of the SDK's server.

Why the SDK is imported here, inside functions, and nowhere else: `mcp` is an optional extra
(`pip install 'alloctune[mcp]'`), and the rest of alloctune, this package's module included,
must import without it. mcp 2 names the server `MCPServer`, mcp 1 `FastMCP`; both take the
same plain functions and read their signatures and docstrings for the tools' schemas.

Every failed call answers one line, `alloctune: error: ...`, as the CLI prints: the message of
the `AlloctuneError` behind it, or the arguments the schema refused, or (a bug) the internal
error's type and text. Never a traceback, on the wire or in the server's log.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from alloctune.errors import AlloctuneError, EnvironmentProblem
from alloctune.mcp.tools import TOOLS

NAME = "alloctune"
INSTRUCTIONS = (
    "alloctune answers PyTorch 'CUDA out of memory' errors from text and recordings, on the CPU: diagnose an "
    "OOM message or snapshot, explain where memory goes in a recording, simulate the caching allocator under "
    "other settings and budgets, plan which card fits which input size, check an allocator setting string. "
    "Every answer is the JSON of the matching `alloctune ... --json` command. tune and run start the user's "
    "program on the GPU: call them only when the user asked for it, with confirm: true."
)


def _sdk() -> tuple[type, type]:
    """(server class, its ToolError) of the installed SDK."""
    if importlib.util.find_spec("mcp") is None:
        raise EnvironmentProblem("the MCP server needs the mcp package: pip install 'alloctune[mcp]'")
    try:
        from mcp.server.mcpserver import MCPServer as Server
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:
        from mcp.server.fastmcp import FastMCP as Server  # type: ignore[no-redef,attr-defined]
        from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[no-redef,attr-defined]
    return Server, ToolError


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and the exceptions it was raised from, outermost first."""
    out = [exc]
    while (nxt := out[-1].__cause__ or out[-1].__context__) is not None and nxt not in out:
        out.append(nxt)
    return out


def error_line(exc: BaseException, tool_error: type) -> str:
    """The one line a failed call answers (see the module docstring for which)."""
    chain = _chain(exc)
    for e in chain:
        if isinstance(e, AlloctuneError):
            message = str(e) or type(e).__name__
            break
        errors = getattr(e, "errors", None)
        if type(e).__name__ == "ValidationError" and callable(errors):
            fields = [f"{'.'.join(map(str, err.get('loc', ())))}: {err.get('msg', '')}" for err in errors()]
            message = "bad arguments: " + "; ".join(fields)
            break
    else:
        root = chain[-1]
        if len(chain) == 1 and isinstance(root, tool_error):  # the SDK's own refusal, e.g. an unknown tool
            message = str(root)
        else:
            message = f"internal error: {type(root).__name__}: {root}"
    return "alloctune: error: " + " ".join(message.split())


def build_server() -> Any:
    """The server with every tool of `alloctune.mcp.tools` registered, their answers as text."""
    server_class, tool_error = _sdk()
    base: Any = server_class

    class AlloctuneServer(base):  # type: ignore[misc]
        async def call_tool(self, name: str, arguments: dict[str, Any], *rest: Any, **options: Any) -> Any:
            try:
                return await super().call_tool(name, arguments, *rest, **options)
            except Exception as exc:
                raise tool_error(error_line(exc, tool_error)) from None

    server = AlloctuneServer(NAME, instructions=INSTRUCTIONS, log_level="WARNING")
    for tool in TOOLS:
        server.add_tool(tool, structured_output=False)
    return server


def serve() -> None:
    """Answer tool calls on stdin / stdout until the client closes them."""
    build_server().run("stdio")
