"""The one small results log: every bench script appends one line per result, with its exact command.

    from runlog import log_result          # bench scripts run as `python bench/NAME.py`, so bench/ is on the path
    log_result("replay 33/33 exact")       # -> bench/results/LOG.md

A line is `- DATE · BENCH · RESULT · `COMMAND``: the figure as the script measured it, and the command
that reproduces it (the script's own argv, environment variables that change what it does included).
Tables stay where each script writes them (`bench/results/NAME.md`; `append_section` adds a dated one,
`md_table` words one); `bench/results.py` indexes both.
`BENCH_LOG` (a path, or `-` for none) redirects the log, e.g. in tests or on the device.
"""

from __future__ import annotations

import datetime as dt
import os
import shlex
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "bench" / "results" / "LOG.md"
# Environment variables that change what a bench measures: kept in the logged command.
KNOWN_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "ALLOCTUNE_NATIVE", "OUT")


def command(argv: list[str] | None = None) -> str:
    """The exact command line of this run, as a user types it from the repository root."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve() if argv else Path("?")
    try:
        script_text = str(script.relative_to(ROOT))
    except ValueError:
        script_text = str(script)
    env = [f"{k}={shlex.quote(os.environ[k])}" for k in KNOWN_ENV if os.environ.get(k)]
    return " ".join([*env, "python", shlex.quote(script_text), *map(shlex.quote, argv[1:])])


def log_result(result: str, *, bench: str | None = None, argv: list[str] | None = None,
               folder: str | os.PathLike | None = None) -> None:
    """Append one line for one result to the log (and echo it, so the terminal shows what was logged).

    `folder`: where the script wrote its table (its `--out`): the log beside it, so a run into a
    scratch folder (a test, a device call) logs there and not into the repository's log."""
    target = os.environ.get("BENCH_LOG") or str(Path(folder) / LOG.name if folder is not None else LOG)
    name = bench or Path((argv or sys.argv)[0]).stem
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    line = f"- {stamp} · {name} · {' '.join(result.split())} · `{command(argv)}`"
    print(f"logged: {line}", flush=True)
    if target == "-":
        return
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text("# Bench results log\n\nOne line per result, appended by the bench script that measured it "
                        "(`bench/runlog.py`): date · bench · result · exact command. Tables: the other files here.\n\n")
    with path.open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def log_results(lines: list[str], **kw) -> None:
    """One line each for several results (markdown bullets as a script prints them, `- ` and `**` dropped)."""
    for line in lines:
        text = line.strip().removeprefix("- ").replace("**", "")
        if text:
            log_result(text, **kw)


def append_section(path: str | os.PathLike, title: str, command: str, body: str) -> None:
    """Append one dated section (`## DATE`, the exact command, then `body`, a table) to a results page,
    starting the page with `# title` when it is new: the benches that keep their runs in one page."""
    path = Path(path)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", encoding="utf-8") as fh:
        if new:
            fh.write(f"# {title}\n")
        fh.write(f"\n## {stamp}\n\n{command}\n\n{body}\n")


def md_table(head: Sequence[str], rows: Iterable[Iterable], rule: str = "---") -> str:
    """A markdown table: the header, its rule (`|---|` per column), one line per row (cells as `str()` gives them)."""
    lines = ["| " + " | ".join(head) + " |", "|" + f"{rule}|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows])

