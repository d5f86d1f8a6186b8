"""Record a command's allocator history, once or at several input sizes.

Recording is the in-process agent's job (`alloctune.agent`, started by
`runner.run_trial(record=...)`): it turns on PyTorch's memory history when the program
initialises CUDA and dumps the snapshot at exit, on an uncaught exception or on SIGTERM.
Every process of the command that uses CUDA writes its own raw file into a private folder
beside the output; here the busiest one is compressed to the output, and a sidecar
`NAME.json` (the layout of the shared traces: workload, conf, cap, total_memory, torch,
outcome, stats, wall_s, plus size) records what the run was, so a capacity plan can read
the size from it later.

At several sizes the command is a template: `{size}` in any argument is replaced, and the
child also gets `ALLOCTUNE_SIZE`; each size runs in a fresh process (a warm allocator would
not be the program's own history).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from alloctune.errors import EnvironmentProblem, InputError, TraceError, WorkloadFailed

SCHEMA = 1
DEFAULT_OUT = "alloctune-trace.pickle.xz"
DEFAULT_MAX_ENTRIES = 5_000_000
RAW_NAME = "trace.{pid}.pickle"  # per process; the agent fills in {pid}
SIZE_PLACEHOLDER = "{size}"
SIZE_ENV = "ALLOCTUNE_SIZE"
_SUFFIXES = (".pickle.xz", ".pickle.gz", ".pickle")


def cuda_device_count() -> int:
    """CUDA devices torch sees here (0 = no CUDA), checked before the command starts.

    `device_count` asks the driver without creating a context, so the parent holds no GPU memory.
    """
    try:
        import torch
    except ImportError as exc:
        raise EnvironmentProblem("recording needs torch; install it (pip install 'alloctune[torch]')") from exc
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


@dataclass(frozen=True)
class Recording:
    """One recorded run: where its trace and sidecar are, and how the command ended."""

    out: str
    sidecar: str
    bytes: int
    exit_code: int | None
    outcome: str
    wall_s: float
    size: str | None
    command: tuple[str, ...]
    peak_reserved: int | None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["command"] = list(self.command)
        return d


def parse_sizes(text: str) -> list[str]:
    """'7,14,28' -> ['7', '14', '28'] (each a positive number, no repeats)."""
    from alloctune.plan.traceset import as_size

    sizes = [s.strip() for s in text.split(",") if s.strip()]
    if not sizes:
        raise InputError(f"--size {text!r}: give input sizes separated by commas, e.g. --size 7,14,28")
    values = [as_size(s) for s in sizes]
    if len(set(values)) != len(values):
        raise InputError(f"--size {text!r}: a size is repeated")
    return sizes


def out_for_size(out: Path, size: str) -> Path:
    """`rvc.pickle.xz` + 14 -> `rvc-14.pickle.xz`; a `{size}` in the name is filled in instead."""
    if SIZE_PLACEHOLDER in out.name:
        return out.with_name(out.name.replace(SIZE_PLACEHOLDER, size))
    for suffix in _SUFFIXES:
        if out.name.endswith(suffix):
            return out.with_name(f"{out.name[: -len(suffix)]}-{size}{suffix}")
    return out.with_name(f"{out.name}-{size}")


def sidecar_path(out: Path) -> Path:
    name = out.name
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return out.with_name(name[: -len(suffix)] + ".json")
    return out.with_name(name + ".json")


def command_for_size(command: Sequence[str], size: str) -> list[str]:
    return [arg.replace(SIZE_PLACEHOLDER, size) for arg in command]


def check_request(
    command: Sequence[str] | None,
    out: Path,
    max_entries: int,
    device: int | None,
    device_count: Callable[[], int] = cuda_device_count,
) -> None:
    """Refuse a bad request before anything runs (one line each, exit 2)."""
    from alloctune.run.runner import resolve_command

    if not command:
        raise InputError("no command given: put it after `--`, e.g. alloctune record -- python infer.py")
    if max_entries < 1:
        raise InputError(f"--max-entries must be at least 1, got {max_entries}")
    if device is not None and device < 0:
        raise InputError(f"--device must be a CUDA device index (0, 1, ...), got {device}")
    if not out.parent.exists():
        raise InputError(f"output directory {str(out.parent)!r} does not exist")
    resolve_command(command_for_size(command, "1"))
    count = device_count()
    if count == 0:
        raise EnvironmentProblem("CUDA is not available: recording allocator history needs a CUDA GPU")
    if device is not None and device >= count:
        raise InputError(f"--device {device}: only {count} CUDA device(s) visible (0..{count - 1})")


def record(
    command: Sequence[str],
    out: Path,
    *,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    device: int | None = None,
    conf: str | None = None,
    budget: int | None = None,
    size: str | None = None,
    workload: str | None = None,
    stacks: str | None = None,
) -> Recording:
    """Run `command` once with history on; write the busiest process's trace to `out` and its sidecar."""
    from alloctune.run.runner import run_trial

    env = None
    if size is not None:
        command = command_for_size(command, size)
        env = {**os.environ, SIZE_ENV: size}
    # A private folder beside the output (same disk, which /tmp may not have room on).
    raw_dir = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent)).resolve()
    try:
        try:
            result = run_trial(
                command,
                record=raw_dir / RAW_NAME,
                record_max_entries=max_entries,
                device=device,
                conf=conf,
                budget=budget,
                env=env,
                stacks=stacks,
            )
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
            at = f" at size {size}" if size is not None else ""
            raise TraceError(
                f"no trace was written{at}: {detail}no Python process with CUDA recorded{why} "
                "(record runs a Python program that uses torch.cuda)"
            )
        _write_compressed(raw, out)
    finally:
        shutil.rmtree(raw_dir, ignore_errors=True)
    side = sidecar_path(out)
    meta = {
        "workload": workload or _workload_name(out, size),
        "conf": result.conf or "",
        "cap": int(budget or 0),
        "total_memory": result.total_memory,
        "torch": result.torch_version,
        "outcome": result.outcome,
        "stats": dict(result.stats),
        "wall_s": result.wall_s,
        "size": size,
        "command": list(command),
        "exit_code": result.exit_code,
        "device_name": result.device_name,
        "stacks": stacks or "python",
        "autograd": result.autograd,
    }
    if result.oom_message:
        meta["oom_message"] = result.oom_message
    side.write_text(json.dumps(meta, indent=1) + "\n")
    return Recording(
        str(out),
        str(side),
        out.stat().st_size,
        result.exit_code,
        result.outcome,
        result.wall_s,
        size,
        tuple(command),
        result.peak_reserved,
    )


def record_sizes(
    command: Sequence[str],
    out: Path,
    sizes: Sequence[str],
    progress: Callable[[Recording], None] | None = None,
    **kwargs: Any,
) -> list[Recording]:
    """One fresh run per size (`{size}` filled in, `ALLOCTUNE_SIZE` set); a failed size is kept and reported."""
    done = []
    for size in sizes:
        rec = record(command, out_for_size(out, size), size=size, **kwargs)
        done.append(rec)
        if progress:
            progress(rec)
    return done


def _workload_name(out: Path, size: str | None) -> str:
    name = out.name
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    if size is not None and name.endswith(f"-{size}"):
        name = name[: -len(size) - 1]
    return name


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
