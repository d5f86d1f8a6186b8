"""The `alloctune` command line: parses arguments, calls the core, renders with rich.

Each command lives in its own module of this package and exposes `register(app)`. Errors
are handled once, here: an `AlloctuneError` and a usage error from the argument parser both
become one line `alloctune: error: ...` on stderr with their exit code (2 bad input or usage,
1 workload failed); nothing reaches the user as a box or a traceback unless
`ALLOCTUNE_DEBUG=1` is set.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import typer

from alloctune.errors import AlloctuneError

app = typer.Typer(
    name="alloctune",
    help="End 'CUDA out of memory' caused by allocator fragmentation: diagnose, simulate, run, tune, guard.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _print_version(value: bool) -> None:
    if value:
        from alloctune import __version__

        typer.echo(f"alloctune {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version, help="Print the version and exit."),
) -> None:
    """alloctune: diagnose OOMs, simulate the caching allocator, run and tune workloads."""


# One module per command (or command group), each with `register(app)`.
_COMMAND_MODULES: tuple[str, ...] = (
    "version",
    "demo_cmd",
    "diagnose_cmd",
    "simulate_cmd",
    "trace_cmd",
    "config_cmd",
    "watch_cmd",
    "report_cmd",
    "record_cmd",
    "run_cmd",
    "tune_cmd",
    "plan_cmd",
    "explain_cmd",
    "mcp_cmd",
)

for _name in _COMMAND_MODULES:
    importlib.import_module(f"alloctune.cli.{_name}").register(app)


def _error(message: str) -> None:
    print(f"alloctune: error: {' '.join(message.split())}", file=sys.stderr)


# The parser's objects are used by duck typing: typer >= 0.2x vendors click (`typer._click`), older
# releases use `click` itself, and both spell these attributes the same way.
_TYPE_WORDS = {"integer": "N", "float": "NUMBER", "path": "PATH", "filename": "FILE"}


def _type_label(param: Any) -> str | None:
    """What help shows after an option instead of typer's Python type names (`<bool>`, `<list[str]>`):
    nothing for flags and arguments (their name says it), the metavar, else a plain word."""
    if param.param_type_name == "argument" or any(
        getattr(param, a, None) for a in ("is_flag", "count", "secondary_opts")
    ):  # --x/--no-x too
        return None
    if param.metavar:
        return param.metavar
    kind = getattr(param, "type", None)
    choices = getattr(kind, "choices", None)
    if choices:
        return "|".join(map(str, choices))
    name = getattr(kind, "name", "")
    return None if name == "boolean" else _TYPE_WORDS.get(name, "TEXT")


def _plain_help(command: Any) -> None:
    """Give every parameter of the tree (and each command's --help) the plain label above."""
    for param in command.params:
        param.display_type_rich = lambda ctx=None, _p=param: _type_label(_p)
    make_help = command.get_help_option

    def get_help_option(ctx: Any, _make: Any = make_help) -> Any:
        option = _make(ctx)
        if option is not None:
            option.display_type_rich = lambda ctx=None: None
        return option

    command.get_help_option = get_help_option
    for sub in getattr(command, "commands", {}).values():
        _plain_help(sub)


_COMMAND: Any = None


def command() -> Any:
    """The click command tree of `app`, built once, with plain type labels in help."""
    global _COMMAND
    if _COMMAND is None:
        _COMMAND = typer.main.get_command(app)
        _plain_help(_COMMAND)
    return _COMMAND


def _parser_error(exc: BaseException) -> bool:
    """A usage error raised by the argument parser (click's `ClickException` family)."""
    return callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int)


def _usage_line(exc: Any) -> str:
    """One line for a parser error: the message and where to read the usage."""
    ctx = getattr(exc, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    return f"{exc.format_message()}{hint}"


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script; never lets a box or a traceback through to the user."""
    args = sys.argv[1:] if argv is None else argv
    debug = bool(os.environ.get("ALLOCTUNE_DEBUG"))
    try:
        rv = command().main(args=args, prog_name="alloctune", standalone_mode=False)
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)
    except AlloctuneError as exc:
        if debug:
            raise
        _error(str(exc) or type(exc).__name__)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _error("interrupted")
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.exit(2)  # a group called without a command: its help is already printed
        if type(exc).__name__ == "Abort":
            _error("interrupted")
            sys.exit(130)
        if _parser_error(exc):  # bad option, missing argument, unknown command: one line, exit 2
            _error(_usage_line(exc))
            sys.exit(exc.exit_code)  # type: ignore[attr-defined]
        if debug:  # last resort: one line, not a traceback
            raise
        _error(f"internal error: {type(exc).__name__}: {exc} (set ALLOCTUNE_DEBUG=1 for the traceback)")
        sys.exit(1)
