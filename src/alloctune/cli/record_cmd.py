"""`alloctune record -- CMD ARGS...`: run a command with allocator history on, save the trace.

The child gets a bootstrap `sitecustomize` first on its PYTHONPATH
(`alloctune/workloads/_record_boot/`), which starts PyTorch's memory history before the
program allocates and dumps `_dump_snapshot` at exit; this side only checks the request,
starts the command, waits, and compresses the dump to the requested file.
"""

from __future__ import annotations

import os
import shutil
import contextlib
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import typer

from alloctune.cli.common import console, print_json, warn
from alloctune.errors import EnvironmentProblem, InputError, TraceError, WorkloadFailed

RECORD_SCHEMA = 1
DEFAULT_OUT = "alloctune-trace.pickle.xz"
BOOT_DIR = Path(__file__).resolve().parents[1] / "workloads" / "_record_boot"


def _cuda_available() -> bool:
    """True when torch is importable here and sees a CUDA device (checked before starting)."""
    try:
        import torch
    except ImportError as exc:
        raise EnvironmentProblem("recording needs torch; install it (pip install 'alloctune[torch]')") from exc
    return bool(torch.cuda.is_available())


def _resolve_command(command: list[str]) -> str:
    """The executable that will run, or a one-line error naming what was not found."""
    program = command[0]
    found = shutil.which(program)
    if found is None:
        raise EnvironmentProblem(f"command not found: {program!r} (give a program on PATH or a path to one)")
    return found


def _child_env(boot: Path, raw: Path, max_entries: int, device: int | None) -> dict[str, str]:
    """The child's environment: the bootstrap folder first on PYTHONPATH, the recording request."""
    env = dict(os.environ)
    env["ALLOCTUNE_RECORD"] = str(raw)
    env["ALLOCTUNE_RECORD_MAX_ENTRIES"] = str(max_entries)
    if device is not None:
        env["ALLOCTUNE_RECORD_DEVICE"] = str(device)
    else:
        env.pop("ALLOCTUNE_RECORD_DEVICE", None)
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(boot) + (os.pathsep + existing if existing else "")
    return env


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


@contextlib.contextmanager
def _removing(path: Path) -> Iterator[None]:
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def _run(command: list[str], env: dict[str, str]) -> int:
    proc = subprocess.Popen(command, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()  # the bootstrap dumps the trace on SIGTERM
        try:
            return proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise


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
        max_entries: int = typer.Option(5_000_000, "--max-entries", help="allocator events kept (oldest dropped)"),
        device: Optional[int] = typer.Option(None, "--device", help="CUDA device index to record (default: current)"),  # noqa: UP007
        json_out: bool = typer.Option(False, "--json", help="print the result as JSON"),
    ) -> None:
        """Run CMD with allocator history on and write the trace (a `_dump_snapshot` pickle).

        The first Python process CMD starts records from start-up to its exit (or SIGTERM).
        Example: `alloctune record --out rvc.pickle.xz -- python -m alloctune.workloads.rvc --count 4`
        """
        if not command:
            raise InputError("no command given: put it after `--`, e.g. alloctune record -- python infer.py")
        if max_entries < 1:
            raise InputError(f"--max-entries must be at least 1, got {max_entries}")
        if device is not None and device < 0:
            raise InputError(f"--device must be a CUDA device index (0, 1, ...), got {device}")
        if not out.parent.exists():
            raise InputError(f"output directory {str(out.parent)!r} does not exist")
        _resolve_command(command)
        if not _cuda_available():
            raise EnvironmentProblem("CUDA is not available: recording allocator history needs a CUDA GPU")

        raw = (out.parent / f".{out.name}.{os.getpid()}.raw.pickle").resolve()
        raw.unlink(missing_ok=True)
        t0 = time.perf_counter()
        # A private folder holding only the bootstrap, so no other name enters the child's path.
        with tempfile.TemporaryDirectory(prefix="alloctune-record-") as boot, _removing(raw):
            shutil.copyfile(BOOT_DIR / "sitecustomize.py", Path(boot) / "sitecustomize.py")
            code = _run(command, _child_env(Path(boot), raw, max_entries, device))
            wall = time.perf_counter() - t0
            if not raw.exists():
                detail = f"it exited with status {code} and " if code else ""
                raise TraceError(
                    f"no trace was written: {detail}no Python process with CUDA recorded "
                    "(record runs a Python program that uses torch.cuda)"
                )
            _write_compressed(raw, out)

        result = {
            "schema": RECORD_SCHEMA,
            "out": str(out),
            "bytes": out.stat().st_size,
            "exit_code": code,
            "wall_s": round(wall, 3),
            "max_entries": max_entries,
            "device": device,
            "command": list(command),
        }
        if json_out:
            print_json(result)
        else:
            size_mib = result["bytes"] / 2**20
            console.print(f"trace written to [bold]{out}[/bold] ({size_mib:.2f} MiB, command ran {wall:.1f} s)")
        if code != 0:
            if not json_out:
                warn(f"the command exited with status {code}; the trace covers the run up to its exit")
            raise WorkloadFailed(f"the recorded command exited with status {code} (trace kept in {out})")
