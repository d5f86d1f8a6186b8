"""Diagnose an OOM from what a user has: a log file, stdin, or a snapshot written at the OOM.

Why a module of its own: `alloctune diagnose` takes either kind of input, and reading it
(a file, `-` for stdin, the checks on options that only apply to snapshots) is the same for
the CLI and the Python API. The diagnosis itself stays in `alloctune.diagnose`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, BinaryIO

from alloctune.errors import InputError
from alloctune.progress import Progress, no_progress


def read_log(source: str | Path | None, stdin: BinaryIO | None = None) -> str:
    """The text to diagnose: a file, or `stdin` for `-` / None (UTF-8 or UTF-16; bad bytes replaced)."""
    if source is None or str(source) == "-":
        stream = stdin if stdin is not None else getattr(sys.stdin, "buffer", None)
        if stream is None or (hasattr(stream, "isatty") and stream.isatty()):
            raise InputError("no input: give a file with the OOM message, or pipe the log into 'alloctune diagnose -'")
        data = stream.read()
    else:
        from alloctune.input_file import read_input_bytes

        data = read_input_bytes(source, expected="the log file")
    from alloctune.diagnose.text import decode_log

    return decode_log(data) if isinstance(data, bytes) else str(data)  # PowerShell writes UTF-16


def diagnose_log(source: str | Path | None, platform: str | None = None, stdin: BinaryIO | None = None) -> list:
    """One `Diagnosis` per distinct OOM message in the log at `source` (`-`/None: stdin)."""
    from alloctune.diagnose import diagnose_all

    return diagnose_all(read_log(source, stdin), platform.lower() if platform else None)


def explain_snapshot(
    snapshot: str | Path,
    *,
    budget: int | str | None = None,
    device: int = 0,
    oom: int = -1,
    what_if: bool = True,
    progress: Progress = no_progress,
    log_text: str | None = None,
) -> Any:
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
    return diagnose_snapshot(snapshot, device=device, oom=oom, budget=cap, budget_source=source,
                             candidates=STANDARD_CONFS if what_if else None)


def cap_in_text(text: str) -> int | None:
    """The per-process cap an OOM message prints ("N GiB allowed" / "PyTorch limit"), the last
    message's; None when no message names one. Rounded as printed (2 decimals of its unit)."""
    from alloctune.diagnose import diagnose_all
    from alloctune.diagnose.verdict import UNLIMITED

    caps = [d.report.cap for d in diagnose_all(text) if d.report.cap is not None and d.report.cap < UNLIMITED]
    return caps[-1] if caps else None


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
) -> tuple[str, Any]:
    """What `alloctune diagnose` does: ("log", [Diagnosis, ...]) or ("snapshot", SnapshotDiagnosis).

    Options that only mean something for a snapshot are errors without one, rather than being
    silently ignored; a log and a snapshot at once are an error too.
    """
    if snapshot is None:
        only = [name for name, v in (("--budget", budget), ("--device", device), ("--oom", oom)) if v is not None]
        if not what_if:
            only.append("--no-what-if")
        if only:
            raise InputError(f"{', '.join(only)} only apply with --snapshot FILE")
        return "log", diagnose_log(source, platform, stdin)
    if platform is not None:
        raise InputError("--platform applies to logs, not to --snapshot")
    # A log beside the snapshot is read for the cap its OOM message prints (a plain torch snapshot has none).
    text = read_log(source, stdin) if source is not None else None
    return "snapshot", explain_snapshot(snapshot, budget=budget, device=device or 0,
                                        oom=-1 if oom is None else oom, what_if=what_if, progress=progress,
                                        log_text=text)
