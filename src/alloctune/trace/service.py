"""Inspect and convert recorded allocator histories: the `alloctune trace` capability.

Why a module of its own: the checks on the arguments, the loading and the conversion result are
the same for the CLI and the Python API (`alloctune.api`); the rest of `trace/` keeps the formats.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alloctune.errors import InputError
from alloctune.progress import Progress, no_progress
from alloctune.schema import schema_id

if TYPE_CHECKING:
    from alloctune.trace.summary import TraceSummary


def _check_device(device: int | None) -> None:
    if device is not None and device < 0:
        raise InputError(f"--device must be 0 or more, got {device}")


def trace_info(
    file: str | Path, device: int | None = None, *, partial: bool = False, progress: Progress = no_progress
) -> TraceSummary:
    """The `TraceSummary` of a snapshot or compact trace (requests, peaks, segment events, settings)."""
    from alloctune.trace.load import load_trace
    from alloctune.trace.summary import summarize

    _check_device(device)
    progress(f"loading {file}")
    return summarize(load_trace(file, device, partial=partial))


@dataclass(frozen=True)
class Conversion:
    """What `convert_trace` wrote."""

    source: str
    output: str
    requests: int
    segment_events: int
    input_bytes: int
    output_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": schema_id("trace-convert"),
            "source": self.source,
            "output": self.output,
            "requests": self.requests,
            "segment_events": self.segment_events,
            "input_bytes": self.input_bytes,
            "output_bytes": self.output_bytes,
        }


def convert_trace(
    file: str | Path, out: str | Path, device: int | None = None, *, progress: Progress = no_progress
) -> Conversion:
    """Save a snapshot in alloctune's compact, pickle-free format."""
    from alloctune.trace.compact import save_compact
    from alloctune.trace.load import load_trace
    from alloctune.trace.shipped import resolve_recording

    _check_device(device)
    file, out = resolve_recording(file), Path(out)
    if out.is_dir():
        raise InputError(f"{out}: is a directory; give the output file name")
    progress(f"loading {file}")
    trace = load_trace(file, device)
    progress(f"writing {out}")
    try:
        written = save_compact(trace, out)
    except OSError as exc:
        raise InputError(f"{out}: cannot write: {exc.strerror or exc}") from exc
    return Conversion(str(file), str(out), len(trace.requests), len(trace.segment_events), file.stat().st_size, written)
