"""What `plan` accepts: a saved trace set, or recordings each with its input size.

`FILE:SIZE` names a snapshot (torch's `_dump_snapshot` pickle, any compression, or an
alloctune compact trace) and the input size it was recorded at; a bare `FILE` works when
its sidecar `NAME.json` (written by `alloctune record --size`) holds `size`. A directory
stands for every recording in it that has such a sidecar.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from alloctune.errors import InputError
from alloctune.plan import fileformat
from alloctune.plan.traceset import TraceSet, as_size, at_size, build
from alloctune.trace.fallible import has_cpp_frames
from alloctune.trace.load import load_trace, read_sidecar
from alloctune.trace.model import FAILED_ALLOC, Trace

_TRACE_SUFFIXES = (".pickle", ".pickle.xz", ".pickle.gz", ".pickle.bz2", ".atrace", ".atrace.gz")


def parse_spec(text: str) -> tuple[Path, Any]:
    """'a.pickle:1024' -> (Path('a.pickle'), '1024'); a bare path -> (path, None)."""
    path, sep, size = text.rpartition(":")
    if sep and path and size and not size.startswith(("/", "\\")):
        as_size(size)  # refuse a non-number early, with the spec in the message
        return Path(path), size
    return Path(text), None


def program_of(side: dict[str, Any]) -> str | None:
    """The program a sized recording ran, its size left out: the sidecar's command (or workload name)
    with its size put at `{size}` (`traceset.at_size`, the rule plan's printed commands use). None: not said."""
    words = side.get("command") or str(side.get("workload") or "").split()
    if not words:
        return None
    return " ".join(at_size([str(w) for w in words], str(side.get("size")), "{size}"))


def expand(specs: Sequence[str]) -> list[tuple[Path, Any]]:
    """Specs to (file, size) pairs; directories to their recordings with a sized sidecar."""
    out: list[tuple[Path, Any]] = []
    for spec in specs:
        path, size = parse_spec(spec)
        if size is None and path.is_dir():
            found = [p for p in sorted(path.iterdir()) if p.name.endswith(_TRACE_SUFFIXES)]
            sides = [(p, read_sidecar(p)) for p in found]
            sides = [(p, side) for p, side in sides if side.get("size") is not None]
            if not sides:
                raise InputError(
                    f"{path}: no recording with a sidecar 'size' in this directory "
                    "(record with alloctune record --size, or give FILE:SIZE)"
                )
            programs = sorted({name for _, side in sides if (name := program_of(side)) is not None})
            if len(programs) > 1:
                raise InputError(
                    f"{path}: recordings of {len(programs)} different programs ({'; '.join(programs[:3])}"
                    f"{'; ...' if len(programs) > 3 else ''}): plan one program's sizes, given as "
                    "FILE:SIZE or in a directory of their own"
                )
            out.extend((p, side["size"]) for p, side in sides)
            continue
        if not path.exists():
            raise InputError(f"{spec}: no such file")
        if size is None:
            size = read_sidecar(path).get("size")
            if size is None:
                raise InputError(f"{spec}: give the input size it was recorded at as FILE:SIZE (e.g. {path}:1024)")
        out.append((path, size))
    return out


def load_recordings(specs: Sequence[str]) -> list[tuple[Any, Trace]]:
    """Load each recording; one that ran out of memory is refused (its stream stops or changes at the
    failure, so its sizes would teach the fit the wrong program) — skipped when it came from a directory."""
    named = {parse_spec(s)[0] for s in specs}
    out = []
    for path, size in expand(specs):
        trace = load_trace(path)
        if FAILED_ALLOC in trace.requests.ops or trace.meta.get("outcome") == "oom":
            if path in named:
                raise InputError(
                    f"{path}: this recording ran out of memory at size {size}; record that size "
                    "uncapped (or leave it out) — a plan needs complete runs"
                )
            continue
        out.append((size, trace))
    return out


def load_calibrations(specs: Sequence[str], inputs: Sequence[str] = ()) -> list[tuple[Any, Trace, str]]:
    """Runs of the program that teach its fallbacks: each `FILE[:SIZE]` of `specs`, a capped run whose
    requests failed or a recording with C++ stacks (the size from the sidecar when not given),
    and every recording of a directory in `inputs` that completed although some request failed (a
    capped `record --size` run whose workspaces fell back)."""
    out: list[tuple[Any, Trace, str]] = []
    for spec in specs:
        path, size = parse_spec(spec)
        if not path.is_file():
            raise InputError(f"--calibration {spec}: no such file")
        trace = load_trace(path)
        if size is None:
            size = read_sidecar(path).get("size")
        if FAILED_ALLOC not in trace.requests.ops and not has_cpp_frames(trace):
            raise InputError(
                f"--calibration {spec}: no request failed in this run and it has no C++ stacks, so it "
                "shows no fallback (run it under a smaller --budget, or record it with --stacks all)"
            )
        out.append((size, trace, str(path)))
    named = {parse_spec(s)[0] for s in inputs}
    for path, size in expand(inputs) if any(parse_spec(s)[0].is_dir() for s in inputs) else ():
        if path in named:
            continue
        trace = load_trace(path)
        if FAILED_ALLOC in trace.requests.ops and trace.meta.get("outcome") != "oom":
            out.append((size, trace, str(path)))
    return out


def traceset_from(specs: Sequence[str]) -> TraceSet:
    """One saved trace set, or recordings at two or more sizes (aligned and fitted here)."""
    if not specs:
        raise InputError("give a trace set (.atraceset) or recordings as FILE:SIZE (two or more sizes)")
    if len(specs) == 1:
        path, size = parse_spec(specs[0])
        if size is None and path.is_file() and fileformat.is_traceset(path):
            return fileformat.load(path)
    for spec in specs:
        path, _ = parse_spec(spec)
        if path.is_file() and fileformat.is_traceset(path):
            raise InputError(f"{spec}: a trace set cannot be mixed with recordings; give it alone")
    recs = load_recordings(specs)
    if len(recs) < 2:
        raise InputError("recordings at two or more input sizes are needed (FILE:SIZE FILE:SIZE ...)")
    return build(recs)


__all__ = ["parse_spec", "expand", "load_recordings", "load_calibrations", "traceset_from"]


def parse_sizes(values: Sequence[str] | None, option: str) -> list[int]:
    """Bytes of every size given to a repeatable option (`--card 4GiB,8GiB --card 16GiB`), in order.

    Why here: a card or a cap is one of the targets `plan` answers for; each value may hold several
    sizes separated by commas, and a size that does not read is an `InputError` naming `option`."""
    from alloctune.units import parse_user_size

    out: list[int] = []
    for v in values or []:
        out.extend(parse_user_size(p.strip(), option) for p in v.split(",") if p.strip())
    return out
