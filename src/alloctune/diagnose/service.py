"""Diagnose an OOM from what a user has: a log file, stdin, or a snapshot written at the OOM.

Why a module of its own: `alloctune diagnose` takes either kind of input, and reading it
(a file, `-` for stdin, the checks on options that only apply to snapshots) is the same for
the CLI and the Python API. The diagnosis itself is the rest of `diagnose/`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from alloctune.errors import InputError
from alloctune.progress import Progress, no_progress

if TYPE_CHECKING:
    from alloctune.diagnose.snapshot_model import SnapshotDiagnosis


def _stdin(stdin: BinaryIO | None) -> BinaryIO:
    """The stream to read for `-`: `stdin` if given, else this process's; a terminal is no input."""
    stream = stdin if stdin is not None else getattr(sys.stdin, "buffer", None)
    if stream is None or (hasattr(stream, "isatty") and stream.isatty()):
        raise InputError("no input: give a file with the OOM message, or pipe the log into 'alloctune diagnose -'")
    return stream


def read_log(source: str | Path | None, stdin: BinaryIO | None = None) -> str:
    """The text to diagnose: a file, or `stdin` for `-` / None (UTF-8 or UTF-16; bad bytes replaced)."""
    if source is None or str(source) == "-":
        data = _stdin(stdin).read()
    else:
        from alloctune.trace.input_file import read_input_bytes

        data = read_input_bytes(source, expected="the log file")
    from alloctune.diagnose.text import decode_log

    return decode_log(data) if isinstance(data, bytes) else str(data)  # PowerShell writes UTF-16


def diagnose_log(source: str | Path | None, platform: str | None = None, stdin: BinaryIO | None = None) -> list:
    """One `Diagnosis` per distinct OOM message in the log at `source` (`-`/None: stdin)."""
    from alloctune.diagnose import diagnose_all

    return diagnose_all(read_log(source, stdin), platform.lower() if platform else None)


_EMPTY = "the input is empty: give an OOM message, a log containing one, or '-' for stdin"
_NONE = (
    "no out-of-memory message found in the input (looked for 'CUDA/HIP/XPU/NPU out of memory', "
    "'MPS backend out of memory', 'Allocation on device', 'Tried to allocate')"
)


def summarise_log(
    read: Callable[[int], bytes],
    platform: str | None = None,
    *,
    total: int | None = None,
    progress: Progress = no_progress,
    on_message: Callable[[Any, Any], None] | None = None,
) -> Any:
    """The `LogSummary` of a log read as a stream of bytes (`read(n)`), piece by piece: memory is
    bounded by the read size and the largest message, not by the log. `total` (bytes, if known)
    is for `progress`; `on_message(found, diagnosis)` sees every message as it comes.
    Raises `NoOOMFound` for an empty log or one without any OOM message."""
    from alloctune.diagnose import _check_platform
    from alloctune.diagnose.groups import summarise
    from alloctune.diagnose.scan import scan_reports
    from alloctune.diagnose.text import iter_log_text
    from alloctune.errors import NoOOMFound

    platform = platform.lower() if platform else None
    _check_platform(platform)
    done = 0
    blank = True

    def counted(n: int) -> bytes:
        nonlocal done
        data = read(n)
        done += len(data)
        return data

    def pieces() -> Iterator[str]:
        nonlocal blank
        for piece in iter_log_text(counted):
            blank = blank and piece.isspace()
            progress("reading the log", done, total)
            yield piece

    from alloctune.diagnose.parallel import summarise_parallel, workers

    n = workers() if on_message is None else 1  # --all prints in order: one pass
    if n > 1:
        summary = summarise_parallel(pieces(), platform, n)
    else:
        summary = summarise(scan_reports(pieces(), platform), platform, on_message)
    if not summary.messages:
        raise NoOOMFound(_EMPTY if blank else _NONE)
    return summary


def explain_snapshot(
    snapshot: str | Path,
    *,
    budget: int | str | None = None,
    device: int = 0,
    oom: int = -1,
    what_if: bool = True,
    progress: Progress = no_progress,
    log_text: str | None = None,
) -> SnapshotDiagnosis:
    """The `SnapshotDiagnosis` of the OOM recorded in `snapshot` (`oom`: which one, -1 = last).

    `budget`: the per-process cap the run had (bytes, or text with a unit); without it, the cap
    the OOM message in `log_text` prints, else the one recorded in the snapshot. `what_if`
    replays the standard settings in the simulator to say which one would have avoided the OOM.
    """
    from alloctune.config.standard import STANDARD_CONFS
    from alloctune.diagnose.snapshot import diagnose_snapshot
    from alloctune.units import parse_user_size

    if device < 0:
        raise InputError(f"--device must be 0 or more, got {device}")
    cap = parse_user_size(budget, "--budget") if budget is not None else None
    source = "given"
    if cap is None and log_text is not None:
        cap = cap_in_text(log_text)
        source = "the OOM message's 'allowed'"
    progress(f"reading {snapshot}" + (" and replaying the standard settings" if what_if else ""))
    return diagnose_snapshot(
        snapshot, device=device, oom=oom, budget=cap, budget_source=source, candidates=STANDARD_CONFS if what_if else None
    )


def cap_in_text(text: str) -> int | None:
    """The per-process cap an OOM message prints ("N GiB allowed" / "PyTorch limit"), the last
    message's; None when no message names one. Rounded as printed (2 decimals of its unit)."""
    from alloctune.diagnose import diagnose_all
    from alloctune.diagnose.verdict import UNLIMITED

    caps = [d.report.cap for d in diagnose_all(text) if d.report.cap is not None and d.report.cap < UNLIMITED]
    return caps[-1] if caps else None


def _open_log(source: str | Path | None, stdin: BinaryIO | None) -> tuple[Any, int | None, Callable[[], None]]:
    """(read, total bytes, close) of a log; for a FILE that holds a snapshot or a trace, its path
    instead of `read`. Anything that is neither is an `InputError` saying what it looks like."""
    from alloctune.diagnose.input_kind import open_input, read_head, sniff_bytes

    if source is None or str(source) == "-":
        head, read = read_head(_stdin(stdin).read)
        kind, what = sniff_bytes(head)
        if kind in ("snapshot", "compact"):
            raise InputError(f"stdin holds {what}: save it to a file and run 'alloctune diagnose FILE'")
        if kind == "other":
            raise InputError(f"stdin is not a log: it looks like {what}")
        return read, None, lambda: None
    if not Path(source).exists():  # a shipped trace by name, as every command that takes a recording
        from alloctune.trace.shipped import shipped_path

        source = shipped_path(str(source)) or source
    fh, compression = open_input(source, expected="a log, a snapshot or a trace file")
    try:
        head, read = read_head(fh.read)
    except BaseException:
        fh.close()
        raise
    kind, what = sniff_bytes(head)
    if kind != "text":
        fh.close()
        if kind in ("snapshot", "compact"):
            return str(source), None, lambda: None
        raise InputError(
            f"{source}: not an OOM log, a memory snapshot or a trace: it looks like "
            f"{what}{f' ({compression}-compressed)' if compression else ''}"
        )
    size = Path(source).stat().st_size if compression is None and Path(source).is_file() else None
    return read, size, fh.close


def diagnose_input(
    source: str | Path | None = None,
    *,
    snapshot: str | Path | None = None,
    platform: str | None = None,
    budget: int | str | None = None,
    device: int | None = None,
    oom: int | None = None,
    what_if: bool = True,
    stdin: BinaryIO | None = None,
    progress: Progress = no_progress,
    on_message: Callable[[Any, Any], None] | None = None,
) -> tuple[str, Any]:
    """What `alloctune diagnose` does: ("log", LogSummary) or ("snapshot", SnapshotDiagnosis).

    A FILE is recognised by its content: a pickle (a `_dump_snapshot` file, an `alloctune record`
    recording, compressed or not) or a compact trace goes where `--snapshot` goes, text is read
    as a log, anything else is one line saying what it looks like. Options that only mean
    something for a snapshot are errors without one, rather than being silently ignored. A log
    given with `--snapshot` is read for the cap its OOM message prints.
    """
    if snapshot is None:
        only = [name for name, v in (("--budget", budget), ("--device", device), ("--oom", oom)) if v is not None]
        if not what_if:
            only.append("--no-what-if")
        verb = "applies" if len(only) == 1 else "apply"
        only_error = InputError(f"{', '.join(only)} only {verb} with --snapshot FILE (or a snapshot as FILE)")
        if only and (source is None or str(source) == "-"):
            raise only_error
        read, total, close = _open_log(source, stdin)
        if isinstance(read, str):  # the file holds a snapshot or a trace: what --snapshot does
            snapshot, source = read, None
        else:
            try:
                if only:
                    raise only_error
                return "log", summarise_log(read, platform, total=total, progress=progress, on_message=on_message)
            finally:
                close()
    if platform is not None:
        raise InputError("--platform applies to logs, not to --snapshot")
    # A log beside the snapshot is read for the cap its OOM message prints (a plain torch snapshot has none).
    text = read_log(source, stdin) if source is not None else None
    return "snapshot", explain_snapshot(
        snapshot,
        budget=budget,
        device=device or 0,
        oom=-1 if oom is None else oom,
        what_if=what_if,
        progress=progress,
        log_text=text,
    )


def diagnosis_json(kind: str, result: Any) -> dict[str, Any]:
    """What `alloctune diagnose --json` prints for `diagnose_input`'s answer (and the MCP tool
    returns): a snapshot's diagnosis without its block-by-block memory map, or a log's summary
    under the `diagnose` schema."""
    if kind == "snapshot":
        data: dict[str, Any] = result.to_dict(with_map=False)
        return data
    from alloctune.schema import with_schema

    return with_schema("diagnose", result.to_dict())
