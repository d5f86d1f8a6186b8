"""`alloctune record -- CMD ARGS...`: run a command with allocator history on, save the trace.

Recording is the general in-process agent's job (`alloctune.agent`, started by
`runner.run_trial(record=...)`): it turns on PyTorch's memory history when the program
initialises CUDA (before its first allocation, without importing torch itself) and dumps
the snapshot at exit, on an uncaught exception or on SIGTERM. Every process of the command
that uses CUDA writes its own raw file into a private folder beside `--out`; this side
checks the request, runs the trial, and compresses the busiest process's dump to `--out`.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Optional

import typer

from alloctune.cli.common import console, print_json, warn
from alloctune.errors import EnvironmentProblem, InputError, TraceError, WorkloadFailed

RECORD_SCHEMA = 1
DEFAULT_OUT = "alloctune-trace.pickle.xz"
DEFAULT_MAX_ENTRIES = 5_000_000
RAW_NAME = "trace.{pid}.pickle"  # per process; the agent fills in {pid}


def _cuda_device_count() -> int:
    """CUDA devices torch sees here (0 = no CUDA), checked before the command starts.

    `device_count` asks the driver without creating a context, so the parent holds no GPU memory.
    """
    try:
        import torch
    except ImportError as exc:
        raise EnvironmentProblem("recording needs torch; install it (pip install 'alloctune[torch]')") from exc
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def _write_compressed(raw: Path, out: Path) -> None:
    """Copy the raw pickle to `out`, compressed by its suffix (.xz, .gz, else as is)."""
    if out.suffix == ".xz":
        import lzma

        opener = lzma.open
    elif out.suffix == ".gz":
        import gzip

        opener = gzip.open
    else:
        shutil.copyfile(raw, out)
        return
    with raw.open("rb") as src, opener(out, "wb") as dst:
        shutil.copyfileobj(src, dst, length=1 << 20)


def _largest_dump(folder: Path) -> Path | None:
    """After Ctrl-C there are no reports to pick the busiest process by: the longest history wins."""
    dumps = [p for p in folder.glob(RAW_NAME.format(pid="*")) if p.stat().st_size > 0]
    return max(dumps, key=lambda p: p.stat().st_size, default=None)


def register(app: typer.Typer) -> None:
    @app.command(
        "record",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def record(
        command: Optional[list[str]] = typer.Argument(  # noqa: UP007 - typer needs Optional here
            None, help="the command to run, after `--` (e.g. -- python infer.py --in a.wav)", show_default=False
        ),
        out: Path = typer.Option(Path(DEFAULT_OUT), "--out", "-o", help="trace file (.pickle, .pickle.gz, .pickle.xz)"),
        max_entries: int = typer.Option(
            DEFAULT_MAX_ENTRIES, "--max-entries", help="allocator events kept (oldest dropped)"
        ),
        device: Optional[int] = typer.Option(  # noqa: UP007
            None, "--device", help="CUDA device the run is measured on (default: current); the trace holds every device"
        ),
        json_out: bool = typer.Option(False, "--json", help="print the result as JSON"),
    ) -> None:
        """Run CMD with allocator history on and write the trace (a `_dump_snapshot` pickle).

        Every Python process of CMD that uses CUDA records from its CUDA start-up to its exit (or SIGTERM);
        the trace of the one that reserved the most memory is kept.
        Example: `alloctune record --out rvc.pickle.xz -- python -m alloctune.workloads.rvc --count 4`
        """
        from alloctune.runner import resolve_command, run_trial

        if not command:
            raise InputError("no command given: put it after `--`, e.g. alloctune record -- python infer.py")
        if max_entries < 1:
            raise InputError(f"--max-entries must be at least 1, got {max_entries}")
        if device is not None and device < 0:
            raise InputError(f"--device must be a CUDA device index (0, 1, ...), got {device}")
        if not out.parent.exists():
            raise InputError(f"output directory {str(out.parent)!r} does not exist")
        resolve_command(command)
        count = _cuda_device_count()
        if count == 0:
            raise EnvironmentProblem("CUDA is not available: recording allocator history needs a CUDA GPU")
        if device is not None and device >= count:
            raise InputError(f"--device {device}: only {count} CUDA device(s) visible (0..{count - 1})")

        # A private folder beside the output (same disk, which /tmp may not have room on).
        raw_dir = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent)).resolve()
        try:
            try:
                result = run_trial(command, record=raw_dir / RAW_NAME, record_max_entries=max_entries, device=device)
            except KeyboardInterrupt:
                # The runner stopped the command (SIGINT, then SIGTERM): the agent dumped on the way out.
                raw = _largest_dump(raw_dir)
                if raw is None:
                    raise
                _write_compressed(raw, out)
                raise WorkloadFailed(f"interrupted; the trace up to then is kept in {out}") from None
            raw = Path(result.snapshot) if result.snapshot else None
            if raw is None or not raw.is_file():
                code = result.exit_code
                detail = f"it exited with status {code} and " if code else ""
                why = f" ({result.error})" if result.outcome == "no-cuda" and result.error else ""
                raise TraceError(
                    f"no trace was written: {detail}no Python process with CUDA recorded{why} "
                    "(record runs a Python program that uses torch.cuda)"
                )
            _write_compressed(raw, out)
        finally:
            shutil.rmtree(raw_dir, ignore_errors=True)

        code = result.exit_code
        payload = {
            "schema": RECORD_SCHEMA,
            "out": str(out),
            "bytes": out.stat().st_size,
            "exit_code": code,
            "wall_s": result.wall_s,
            "max_entries": max_entries,
            "device": device,
            "command": list(command),
        }
        if json_out:
            print_json(payload)
        else:
            size_mib = payload["bytes"] / 2**20
            console.print(
                f"trace written to [bold]{out}[/bold] ({size_mib:.2f} MiB, command ran {result.wall_s:.1f} s)"
            )
        if code != 0:
            if not json_out:
                warn(f"the command exited with status {code}; the trace covers the run up to its exit")
            raise WorkloadFailed(f"the recorded command exited with status {code} (trace kept in {out})")
