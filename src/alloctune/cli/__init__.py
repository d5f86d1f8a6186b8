"""The `alloctune` command line: parses arguments, calls the core, renders with rich.

Each command lives in its own module of this package and exposes `register(app)`. Errors
are handled once, here: an `AlloctuneError` becomes one line on stderr and its exit code
(2 bad input, 1 workload failed); a usage error exits 2; nothing reaches the user as a
traceback unless `ALLOCTUNE_DEBUG=1` is set.
"""

from __future__ import annotations

import importlib
import os
import sys

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



@app.callback()
def _root() -> None:
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
)

for _name in _COMMAND_MODULES:
    importlib.import_module(f"alloctune.cli.{_name}").register(app)


def _error(message: str) -> None:
    print(f"alloctune: error: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script; never lets a traceback through to the user.

    Usage errors are handled by typer (message + exit 2); our own errors and anything
    unexpected are caught here and printed as one line.
    """
    args = sys.argv[1:] if argv is None else argv
    debug = bool(os.environ.get("ALLOCTUNE_DEBUG"))
    try:
        app(args=args, prog_name="alloctune")
    except AlloctuneError as exc:
        if debug:
            raise
        _error(" ".join(str(exc).split()) or type(exc).__name__)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _error("interrupted")
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:  # last resort: one line, not a traceback
        if debug:
            raise
        _error(f"internal error: {type(exc).__name__}: {exc} (set ALLOCTUNE_DEBUG=1 for the traceback)")
        sys.exit(1)
